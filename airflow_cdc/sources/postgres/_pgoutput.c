/*
 * Columnar fast path of the pgoutput (protocol version 1) change decoder.
 *
 * Decodes Insert/Update/Delete messages of registered relations straight into Arrow-layout
 * buffers (string offsets + data + validity bitmaps per captured column, per row image), plus
 * the per-event envelope facts (op, position, commit timestamp, xid, change LSN, the ``sequence``
 * text).  Python turns the buffers into Arrow arrays without copying values again.
 *
 * Contract (see columnar.py, the only user):
 *   - feed(rows, start) walks a fetched batch of (lsn, data) rows from ``start`` and returns the
 *     index of the first row it did not consume.  It stops at anything it does not handle
 *     itself -- every message other than I/U/D, rows of unregistered relations, and any row that
 *     is malformed or unexpected in any way -- so that the pure-Python decoder handles (or
 *     rejects, with its ProtocolError) exactly that row.  A rejected row leaves no trace in the
 *     buffers.  It also stops right after a row that filled a relation's piece; ``full`` then
 *     names that relation until take() empties it.
 *   - Transaction facts come from Python (set_txn) and ``seq`` is shared back and forth, so both
 *     paths number the events of a transaction identically.
 *   - feed() decodes without the GIL (the buffers grow with PyMem_Raw*), so the thread fetching
 *     the next batch runs meanwhile; every other method refuses to run while it does.
 * Bounds are checked before every read: malformed input can only make feed() stop early.
 */
#include "_pgoutput.h"

/* ---------------------------------------------------------------- the decoder object */

typedef struct {
    PyObject_HEAD
    Rel **rels;
    int nrels;
    Rel *last;
    Py_ssize_t piece_rows, max_bytes;
    Txn txn;
    int64_t full;
    int feeding;  /* feed() is decoding without the GIL: no other call may touch the buffers */
} Decoder;

static Rel *
find_rel(Decoder *d, uint32_t relid)
{
    if (d->last != NULL && d->last->relid == relid)
        return d->last;
    for (int i = 0; i < d->nrels; i++)
        if (d->rels[i]->relid == relid)
            return d->last = d->rels[i];
    return NULL;
}

static int
Decoder_init(Decoder *d, PyObject *args, PyObject *kw)
{
    static char *names[] = {"piece_rows", "max_bytes", "skipped", NULL};
    Py_ssize_t piece_rows, max_bytes;
    const char *skipped = "";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "nn|s", names, &piece_rows, &max_bytes, &skipped))
        return -1;
    if (piece_rows < 1 || max_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "piece_rows and max_bytes must be positive");
        return -1;
    }
    d->piece_rows = piece_rows;
    d->max_bytes = max_bytes;
    for (int i = 0; i < 3; i++)
        d->txn.skip[i] = strchr(skipped, OPS[i]) != NULL;
    d->full = -1;
    return 0;
}

static void
Decoder_dealloc(Decoder *d)
{
    for (int i = 0; i < d->nrels; i++)
        rel_free(d->rels[i]);
    PyMem_Free(d->rels);
    Py_CLEAR(d->txn.origin);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static int
unregister_rel(Decoder *d, uint32_t relid)
{
    for (int i = 0; i < d->nrels; i++)
        if (d->rels[i]->relid == relid) {
            if (d->rels[i]->n)
                return -1;
            rel_free(d->rels[i]);
            d->rels[i] = d->rels[--d->nrels];
            d->last = NULL;
            return 1;
        }
    return 0;
}

/* The key's tuple column indexes as captured column slots (each must be captured). */
static int
register_key(Rel *r, PyObject *key)
{
    PyObject *seq = PySequence_Fast(key, "key must be a sequence of column indexes");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    r->key = PyMem_Malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (r->key == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        long idx = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, j));
        if (idx < 0 || idx >= r->need || r->map[idx] < 0) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "key column index not among the captured columns");
            return -1;
        }
        r->key[j] = r->map[idx];
    }
    r->nkey = (int)n;
    Py_DECREF(seq);
    return 0;
}

/* Refuses a call while feed() decodes in another thread without the GIL. */
static PyObject *
busy(void)
{
    PyErr_SetString(PyExc_RuntimeError, "the decoder is feeding in another thread");
    return NULL;
}

static PyObject *
Decoder_register(Decoder *d, PyObject *args)
{
    if (d->feeding)
        return busy();
    unsigned long relid;
    PyObject *select, *key = NULL;
    int ignore = 0;
    if (!PyArg_ParseTuple(args, "kO|pO", &relid, &select, &ignore, &key))
        return NULL;
    PyObject *seq = PySequence_Fast(select, "select must be a sequence of column indexes");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nsel = PySequence_Fast_GET_SIZE(seq);
    Rel *r = PyMem_Calloc(1, sizeof(Rel));
    int need = 0;
    if (r == NULL || nsel > MAX_TUPLE_COLS)
        goto nomem;
    r->relid = (uint32_t)relid;
    r->ignore = ignore;
    r->nsel = (int)nsel;
    for (Py_ssize_t j = 0; j < nsel; j++) {
        long idx = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, j));
        if (idx < 0 || idx >= MAX_TUPLE_COLS) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "column index out of range");
            goto fail;
        }
        if (idx + 1 > need)
            need = (int)idx + 1;
    }
    r->need = need;
    r->map = PyMem_Malloc(sizeof(int) * (size_t)(need ? need : 1));
    r->img[0].cols = PyMem_Calloc((size_t)(nsel ? nsel : 1), sizeof(Col));
    r->img[1].cols = PyMem_Calloc((size_t)(nsel ? nsel : 1), sizeof(Col));
    if (r->map == NULL || r->img[0].cols == NULL || r->img[1].cols == NULL)
        goto nomem;
    for (int i = 0; i < need; i++)
        r->map[i] = -1;
    for (Py_ssize_t j = 0; j < nsel; j++) {
        long idx = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, j));
        if (r->map[idx] != -1) {
            PyErr_SetString(PyExc_ValueError, "duplicate column index");
            goto fail;
        }
        r->map[idx] = (int)j;
    }
    if (key != NULL && key != Py_None && register_key(r, key) < 0)
        goto fail;
    if (unregister_rel(d, r->relid) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "relation re-registered with events not taken");
        goto fail;
    }
    Rel **rels = PyMem_Realloc(d->rels, sizeof(Rel *) * (size_t)(d->nrels + 1));
    if (rels == NULL)
        goto nomem;
    d->rels = rels;
    d->rels[d->nrels++] = r;
    Py_DECREF(seq);
    Py_RETURN_NONE;
nomem:
    PyErr_NoMemory();
fail:
    rel_free(r);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *
Decoder_unregister(Decoder *d, PyObject *arg)
{
    if (d->feeding)
        return busy();
    unsigned long relid = PyLong_AsUnsignedLong(arg);
    if (relid == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    int rc = unregister_rel(d, (uint32_t)relid);
    if (rc < 0) {
        PyErr_SetString(PyExc_RuntimeError, "relation unregistered with events not taken");
        return NULL;
    }
    return PyBool_FromLong(rc);
}

/* The transaction's replication origin (a str, or None: none). */
static int
set_origin(Txn *t, PyObject *origin, unsigned long long origin_lsn)
{
    const char *utf8 = NULL;
    Py_ssize_t len = 0;
    if (origin == Py_None)
        origin = NULL;
    else if (!PyUnicode_Check(origin)) {
        PyErr_SetString(PyExc_TypeError, "origin must be a str or None");
        return -1;
    }
    else if ((utf8 = PyUnicode_AsUTF8AndSize(origin, &len)) == NULL)
        return -1;
    Py_XINCREF(origin);
    Py_XSETREF(t->origin, origin);
    t->origin_utf8 = utf8;
    t->origin_len = len;
    t->origin_lsn = origin_lsn;
    return 0;
}

static PyObject *
Decoder_set_txn(Decoder *d, PyObject *args)
{
    if (d->feeding)
        return busy();
    int active;
    unsigned long long final_lsn, origin_lsn = 0;
    long long ts_us, xid, seq;
    PyObject *prev, *origin = Py_None;
    if (!PyArg_ParseTuple(args, "pKLLOL|OK", &active, &final_lsn, &ts_us, &xid, &prev, &seq, &origin,
                          &origin_lsn))
        return NULL;
    if (set_origin(&d->txn, origin, origin_lsn) < 0)
        return NULL;
    if (prev != Py_None) {
        unsigned long long v = PyLong_AsUnsignedLongLong(prev);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        d->txn.prev = v;
    }
    d->txn.has_prev = prev != Py_None;
    d->txn.active = active;
    d->txn.final_lsn = final_lsn;
    d->txn.ts_us = ts_us;
    d->txn.xid = xid;
    d->txn.seq = seq;
    Py_RETURN_NONE;
}

/* One row of a fed batch, as feed() reads it without the GIL. */
typedef struct {
    const unsigned char *buf;
    Py_ssize_t len;
    long long lsn;
    int lsn_ok;
} FedRow;

/* Decode rows[0 .. n) (see feed): returns the count consumed, or -2 - count when out of memory. */
static Py_ssize_t
feed_rows(Decoder *d, const FedRow *rows, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        const unsigned char *buf = rows[i].buf;
        Py_ssize_t len = rows[i].len;
        if (len < 1 || (buf[0] != 'I' && buf[0] != 'U' && buf[0] != 'D'))
            break;
        if (!d->txn.active)
            continue;  /* as the Python path: changes of skipped transactions are not looked at */
        if (len < 6)
            break;
        Rel *r = find_rel(d, be32(buf + 1));
        if (r == NULL)
            break;
        if (r->ignore)
            continue;
        if (!rows[i].lsn_ok)
            break;
        int rc = change_put(&d->txn, r, buf, len, rows[i].lsn);
        if (rc == -2)
            return -2 - i;
        if (rc == -1)
            break;
        if (r->n >= d->piece_rows || r->bytes >= d->max_bytes) {
            d->full = r->relid;
            i++;
            break;
        }
    }
    return i;
}

/* Rows are decoded without the GIL, so the thread fetching the next batch (psycopg builds its
 * tuples under the GIL) runs meanwhile.  The (lsn, data) facts are taken under the GIL first, up
 * to the first row that is not an (int, bytes) pair, and each bytes object is held until the
 * decode is done. */
static PyObject *
Decoder_feed(Decoder *d, PyObject *args)
{
    PyObject *rows;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &rows, &i))
        return NULL;
    if (d->full >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "a full piece must be taken before feeding more rows");
        return NULL;
    }
    if (d->feeding)
        return busy();
    Py_ssize_t n = PyList_GET_SIZE(rows);
    if (i < 0 || i >= n)
        return PyLong_FromSsize_t(i < 0 ? 0 : i);
    FedRow *fed = PyMem_RawMalloc(sizeof(FedRow) * (size_t)(n - i));
    PyObject **held = PyMem_RawMalloc(sizeof(PyObject *) * (size_t)(n - i));
    if (fed == NULL || held == NULL) {
        PyMem_RawFree(fed);
        PyMem_RawFree(held);
        return PyErr_NoMemory();
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t j = i; j < n; j++, m++) {
        PyObject *row = PyList_GET_ITEM(rows, j);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 2)
            break;
        PyObject *data = PyTuple_GET_ITEM(row, 1), *lsn = PyTuple_GET_ITEM(row, 0);
        if (!PyBytes_CheckExact(data) || !PyLong_CheckExact(lsn))
            break;
        fed[m].buf = (const unsigned char *)PyBytes_AS_STRING(data);
        fed[m].len = PyBytes_GET_SIZE(data);
        fed[m].lsn = PyLong_AsLongLong(lsn);
        fed[m].lsn_ok = !(fed[m].lsn == -1 && PyErr_Occurred());
        if (!fed[m].lsn_ok)
            PyErr_Clear();
        Py_INCREF(data);
        held[m] = data;
    }
    Py_ssize_t done;
    d->feeding = 1;
    Py_BEGIN_ALLOW_THREADS
    done = feed_rows(d, fed, m);
    Py_END_ALLOW_THREADS
    d->feeding = 0;
    for (Py_ssize_t j = 0; j < m; j++)
        Py_DECREF(held[j]);
    PyMem_RawFree(fed);
    PyMem_RawFree(held);
    if (done <= -2)
        return PyErr_NoMemory();
    return PyLong_FromSsize_t(i + done);
}

/* An image's buffers (present bitmap, per column offsets, text, validity, TOAST bitmap or None),
 * or None when no row of the piece has the image (e.g. the before image of inserts): nothing
 * written, nothing copied. */
static PyObject *
image_take(Rel *r, Image *img)
{
    Py_ssize_t n = r->n, bitmap = (n + 7) / 8;
    if (img->filled == 0)  /* a row with the image sets ``filled`` past it (see Image) */
        Py_RETURN_NONE;
    if (image_fill(r, img, n) < 0)
        return NULL;
    PyObject *cols = PyList_New(r->nsel);
    if (cols == NULL)
        return NULL;
    for (int j = 0; j < r->nsel; j++) {
        Col *c = &img->cols[j];
        PyObject *toast = Py_None;
        Py_INCREF(Py_None);
        if (c->toasted && bits_set(&c->toast, n)) {
            Py_DECREF(Py_None);
            toast = buf_bytes(&c->toast, bitmap);
        }
        PyObject *t = toast ? Py_BuildValue("(NNNN)", buf_bytes(&c->off, (n + 1) * 4),
                                            buf_bytes(&c->data, ((int32_t *)c->off.p)[n]),
                                            buf_bytes(&c->valid, bitmap), toast) : NULL;
        if (t == NULL) {
            Py_DECREF(cols);
            return NULL;
        }
        PyList_SET_ITEM(cols, j, t);
    }
    return Py_BuildValue("(NN)", buf_bytes(&img->present, bitmap), cols);
}

/* The piece's ``source.origin`` buffers (offsets, UTF-8, validity, origin_lsn), or None when no
 * row of it came through a replication origin. */
static PyObject *
origin_take(Rel *r)
{
    Py_ssize_t n = r->n;
    if (!r->origins)
        Py_RETURN_NONE;
    return Py_BuildValue("(NNNN)", buf_bytes(&r->ooff, (n + 1) * 4), buf_bytes(&r->odata, r->odata.len),
                         buf_bytes(&r->ovalid, (n + 7) / 8), buf_bytes(&r->olsn, n * 8));
}

static PyObject *
Decoder_take(Decoder *d, PyObject *arg)
{
    if (d->feeding)
        return busy();
    unsigned long relid = PyLong_AsUnsignedLong(arg);
    if (relid == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    Rel *r = find_rel(d, (uint32_t)relid);
    if (d->full == (int64_t)relid)
        d->full = -1;
    if (r == NULL || r->n == 0)
        Py_RETURN_NONE;
    Py_ssize_t n = r->n;
    Buf steps = {0};
    if (buf_reserve(&steps, (n + 1) * 8) < 0)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i <= n; i++) {
        ((int32_t *)steps.p)[i] = (int32_t)i;
        ((int32_t *)steps.p)[n + 1 + i] = (int32_t)(POS_LEN * i);
    }
    PyObject *out = Py_BuildValue(
        "(n{sn,sn,sn}NNNNNNNNNNNN)", n, "c", r->counts[0], "u", r->counts[1], "d", r->counts[2],
        PyBytes_FromStringAndSize(steps.p, (n + 1) * 4), buf_bytes(&r->ops, n),
        PyBytes_FromStringAndSize(steps.p + (n + 1) * 4, (n + 1) * 4), buf_bytes(&r->pos, n * POS_LEN),
        buf_bytes(&r->ts, n * 8), buf_bytes(&r->xid, n * 8), buf_bytes(&r->lsn, n * 8),
        buf_bytes(&r->seqoff, (n + 1) * 4), buf_bytes(&r->seqdata, r->seqdata.len),
        image_take(r, &r->img[0]), image_take(r, &r->img[1]), origin_take(r));
    buf_free(&steps);
    if (out == NULL)
        return NULL;
    rel_rollback(r, 0);
    r->img[0].present.len = r->img[1].present.len = 0;
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < r->nsel; j++)
            r->img[k].cols[j].toasted = 0;
    r->ops.len = r->pos.len = r->ts.len = r->xid.len = r->lsn.len = r->seqoff.len = r->seqdata.len = 0;
    r->ooff.len = r->odata.len = r->ovalid.len = r->olsn.len = 0;
    r->origins = 0;
    r->n = r->bytes = 0;
    r->counts[0] = r->counts[1] = r->counts[2] = 0;
    return out;
}

static PyObject *
Decoder_get_seq(Decoder *d, void *closure)
{
    return PyLong_FromLongLong(d->txn.seq);
}

static int
Decoder_set_seq(Decoder *d, PyObject *value, void *closure)
{
    long long v = value ? PyLong_AsLongLong(value) : -1;
    if (value == NULL || (v == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "seq must be an int");
        return -1;
    }
    d->txn.seq = v;
    return 0;
}

static PyObject *
Decoder_get_epoch(Decoder *d, void *closure)
{
    return PyLong_FromUnsignedLong(d->txn.epoch);
}

static int
Decoder_set_epoch(Decoder *d, PyObject *value, void *closure)
{
    unsigned long v = value ? PyLong_AsUnsignedLong(value) : 0;
    if (value == NULL || (v == (unsigned long)-1 && PyErr_Occurred()) || v > 0xFFFFFFFFUL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "epoch must be an int in [0, 2**32)");
        return -1;
    }
    d->txn.epoch = (uint32_t)v;
    return 0;
}

static PyObject *
Decoder_get_full(Decoder *d, void *closure)
{
    if (d->full < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(d->full);
}

static PyObject *
Decoder_get_events(Decoder *d, void *closure)
{
    return PyLong_FromSsize_t(d->txn.events);
}

static PyMethodDef Decoder_methods[] = {
    {"register", (PyCFunction)Decoder_register, METH_VARARGS,
     "register(relid, select, ignore=False, key=None): decode this relation's changes, capturing\n"
     "the tuple columns select; with ignore, consume its changes without reading them (not\n"
     "captured); an update that changes the key columns becomes a d + c pair."},
    {"unregister", (PyCFunction)Decoder_unregister, METH_O,
     "unregister(relid): stop decoding a relation (its events must have been taken)."},
    {"set_txn", (PyCFunction)Decoder_set_txn, METH_VARARGS,
     "set_txn(active, final_lsn, ts_us, xid, prev_commit_or_None, seq, origin=None, origin_lsn=0):\n"
     "the current transaction (origin: its replication origin's name, None without)."},
    {"feed", (PyCFunction)Decoder_feed, METH_VARARGS,
     "feed(rows, start) -> index of the first (lsn, data) row not consumed."},
    {"take", (PyCFunction)Decoder_take, METH_O,
     "take(relid) -> the relation's buffered piece as bytes buffers (None if empty); empties it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Decoder_getset[] = {
    {"seq", (getter)Decoder_get_seq, (setter)Decoder_set_seq, "sequence number of the last event", NULL},
    {"epoch", (getter)Decoder_get_epoch, (setter)Decoder_set_epoch, "position epoch of every event", NULL},
    {"full", (getter)Decoder_get_full, NULL, "relid of a full piece to take, or None", NULL},
    {"events", (getter)Decoder_get_events, NULL, "events decoded so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "airflow_cdc.sources.postgres._pgoutput.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Columnar decoder of pgoutput Insert/Update/Delete messages (see module doc).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_methods = Decoder_methods,
    .tp_getset = Decoder_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pgoutput", "Columnar fast path of the pgoutput change decoder.", -1, NULL,
};

PyMODINIT_FUNC
PyInit__pgoutput(void)
{
    if (PyType_Ready(&DecoderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
