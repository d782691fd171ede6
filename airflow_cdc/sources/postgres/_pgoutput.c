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
 * Bounds are checked before every read: malformed input can only make feed() stop early.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_TUPLE_COLS 65536

/* ---------------------------------------------------------------- growable byte buffers */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, Py_ssize_t extra)
{
    if (extra <= b->cap - b->len)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int
buf_put(Buf *b, const void *src, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static void
buf_free(Buf *b)
{
    PyMem_Free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Set or clear bit ``row`` of an LSB-first bitmap, growing it with zero bytes. */
static int
bit_put(Buf *b, Py_ssize_t row, int on)
{
    Py_ssize_t need = row / 8 + 1;
    if (b->len < need) {
        if (buf_reserve(b, need - b->len) < 0)
            return -1;
        memset(b->p + b->len, 0, (size_t)(need - b->len));
        b->len = need;
    }
    if (on)
        b->p[row >> 3] |= (char)(1 << (row & 7));
    else
        b->p[row >> 3] &= (char)~(1 << (row & 7));
    return 0;
}

static Py_ssize_t
bits_set(const Buf *b, Py_ssize_t n)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        count += (b->p[i >> 3] >> (i & 7)) & 1;
    return count;
}

static PyObject *
buf_bytes(const Buf *b, Py_ssize_t len)
{
    return PyBytes_FromStringAndSize(len ? b->p : NULL, len);
}

static inline uint16_t
be16(const unsigned char *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* ---------------------------------------------------------------- per-relation buffers */

typedef struct {
    Buf off;    /* int32 offsets, n + 1 */
    Buf data;   /* UTF-8 text values */
    Buf valid;  /* validity bitmap */
    Buf toast;  /* unchanged-TOAST bitmap */
} Col;

typedef struct {
    Buf present;  /* bitmap: the event has this row image */
    Col *cols;
} Image;

typedef struct {
    uint32_t relid;
    int ignore;  /* a relation not captured: its changes are consumed unread, as in Python */
    int nsel, need;
    int *map;  /* tuple column index -> captured column slot, or -1; ``need`` entries */
    Py_ssize_t n, bytes;
    Py_ssize_t counts[3];  /* c, u, d */
    Image img[2];          /* before, after */
    Buf ops, pos, ts, xid, lsn, seqoff, seqdata;
} Rel;

static const char OPS[3] = {'c', 'u', 'd'};

static void
rel_free(Rel *r)
{
    if (r == NULL)
        return;
    for (int k = 0; k < 2; k++) {
        if (r->img[k].cols != NULL) {
            for (int j = 0; j < r->nsel; j++) {
                buf_free(&r->img[k].cols[j].off);
                buf_free(&r->img[k].cols[j].data);
                buf_free(&r->img[k].cols[j].valid);
                buf_free(&r->img[k].cols[j].toast);
            }
            PyMem_Free(r->img[k].cols);
        }
        buf_free(&r->img[k].present);
    }
    Buf *bufs[] = {&r->ops, &r->pos, &r->ts, &r->xid, &r->lsn, &r->seqoff, &r->seqdata};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        buf_free(bufs[i]);
    PyMem_Free(r->map);
    PyMem_Free(r);
}

/* Store one value (state 0), SQL NULL (1) or unchanged TOAST (2) as row ``row`` of a column. */
static int
col_put(Col *c, Py_ssize_t row, const unsigned char *v, uint32_t vlen, int state)
{
    if (buf_reserve(&c->off, (row + 2) * 4 - c->off.len) < 0)
        return -2;
    int32_t *off = (int32_t *)c->off.p;
    if (row == 0)
        off[0] = 0;
    int64_t end = (int64_t)off[row] + (state == 0 ? vlen : 0);
    if (end > INT32_MAX)
        return -1;  /* cannot be an Arrow string array: let the Python path take the row */
    if (state == 0 && buf_put(&c->data, v, vlen) < 0)
        return -2;
    off[row + 1] = (int32_t)end;
    c->off.len = (row + 2) * 4;
    if (bit_put(&c->valid, row, state == 0) < 0 || bit_put(&c->toast, row, state == 2) < 0)
        return -2;
    return 0;
}

/* Parse one TupleData at ``pos`` into image ``img`` as row ``row``.
 * Returns the offset after it, -1 when malformed (or unrepresentable), -2 on memory error. */
static Py_ssize_t
tuple_put(Rel *r, Image *img, const unsigned char *buf, Py_ssize_t len, Py_ssize_t pos, Py_ssize_t row)
{
    if (len - pos < 2)
        return -1;
    int ncols = be16(buf + pos);
    pos += 2;
    if (ncols < r->need)
        return -1;
    for (int i = 0; i < ncols; i++) {
        if (pos >= len)
            return -1;
        unsigned char kind = buf[pos];
        int slot = i < r->need ? r->map[i] : -1;
        int rc = 0;
        if (kind == 't' || kind == 'b') {
            if (len - pos < 5)
                return -1;
            uint32_t vlen = be32(buf + pos + 1);
            if ((Py_ssize_t)vlen > len - pos - 5)
                return -1;
            if (slot >= 0)
                rc = col_put(&img->cols[slot], row, buf + pos + 5, vlen, 0);
            pos += 5 + (Py_ssize_t)vlen;
        }
        else if (kind == 'n' || kind == 'u') {
            if (slot >= 0)
                rc = col_put(&img->cols[slot], row, NULL, 0, kind == 'n' ? 1 : 2);
            pos += 1;
        }
        else {
            return -1;
        }
        if (rc < 0)
            return rc;
    }
    if (bit_put(&img->present, row, 1) < 0)
        return -2;
    return pos;
}

/* Row ``row`` of an absent image: every column null. */
static int
image_absent(Rel *r, Image *img, Py_ssize_t row)
{
    for (int j = 0; j < r->nsel; j++)
        if (col_put(&img->cols[j], row, NULL, 0, 1) < 0)
            return -2;
    return bit_put(&img->present, row, 0) < 0 ? -2 : 0;
}

/* Forget whatever a rejected row ``row`` wrote (its bits are rewritten by the next row). */
static void
rel_rollback(Rel *r, Py_ssize_t row)
{
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < r->nsel; j++) {
            Col *c = &r->img[k].cols[j];
            c->data.len = (row == 0 || c->off.len < (row + 1) * 4) ? 0 : ((int32_t *)c->off.p)[row];
            c->off.len = row == 0 ? 0 : (row + 1) * 4;
        }
}

static char *
put_u64(char *out, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *out++ = tmp[--n];
    return out;
}

static char *
put_i64(char *out, int64_t v)
{
    if (v < 0) {
        *out++ = '-';
        return put_u64(out, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(out, (uint64_t)v);
}

/* ---------------------------------------------------------------- the decoder object */

typedef struct {
    PyObject_HEAD
    Rel **rels;
    int nrels;
    Rel *last;
    Py_ssize_t piece_rows, max_bytes;
    int skip[3];
    int active, has_prev;
    uint64_t final_lsn, prev;
    int64_t ts_us, xid, seq;
    Py_ssize_t events;
    int64_t full;
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

/* Envelope facts of an accepted event. */
static int
meta_put(Decoder *d, Rel *r, int op, int64_t change_lsn)
{
    unsigned char key[16];
    uint64_t seq = (uint64_t)d->seq;
    for (int i = 0; i < 8; i++) {
        key[i] = (unsigned char)(d->final_lsn >> (56 - 8 * i));
        key[8 + i] = (unsigned char)(seq >> (56 - 8 * i));
    }
    char text[64], *t = text;
    *t++ = '[';
    *t++ = '"';
    if (d->has_prev)
        t = put_u64(t, d->prev);
    memcpy(t, "\",\"", 3);
    t = put_i64(t + 3, change_lsn);
    *t++ = '"';
    *t++ = ']';
    if (r->n == 0) {
        int32_t zero = 0;
        if (buf_put(&r->seqoff, &zero, 4) < 0)
            return -2;
    }
    if (buf_put(&r->ops, &OPS[op], 1) < 0 || buf_put(&r->pos, key, 16) < 0
        || buf_put(&r->ts, &d->ts_us, 8) < 0 || buf_put(&r->xid, &d->xid, 8) < 0
        || buf_put(&r->lsn, &change_lsn, 8) < 0 || buf_put(&r->seqdata, text, t - text) < 0)
        return -2;
    if (r->seqdata.len > INT32_MAX)
        return -1;
    int32_t end = (int32_t)r->seqdata.len;
    return buf_put(&r->seqoff, &end, 4) < 0 ? -2 : 0;
}

/* Decode one I/U/D message into the relation's buffers.
 * Returns 1 (event added), 0 (skipped op), -1 (leave the row to Python) or -2 (error set). */
static int
change_put(Decoder *d, Rel *r, const unsigned char *buf, Py_ssize_t len, int64_t change_lsn)
{
    Py_ssize_t row = r->n, p;
    unsigned char kind = buf[0], marker = buf[5];
    int op;
    if (kind == 'I') {
        op = 0;
        p = marker == 'N' ? image_absent(r, &r->img[0], row) : -1;
        if (p == 0)
            p = tuple_put(r, &r->img[1], buf, len, 6, row);
    }
    else if (kind == 'U') {
        op = 1;
        if (marker == 'N') {
            p = image_absent(r, &r->img[0], row);
            if (p == 0)
                p = tuple_put(r, &r->img[1], buf, len, 6, row);
        }
        else if (marker == 'K' || marker == 'O') {
            p = tuple_put(r, &r->img[0], buf, len, 6, row);
            if (p >= 0)
                p = (p < len && buf[p] == 'N') ? tuple_put(r, &r->img[1], buf, len, p + 1, row) : -1;
        }
        else {
            p = -1;
        }
    }
    else {
        op = 2;
        p = (marker == 'K' || marker == 'O') ? tuple_put(r, &r->img[0], buf, len, 6, row) : -1;
        if (p >= 0)
            p = image_absent(r, &r->img[1], row);
    }
    if (p >= 0 && d->skip[op]) {
        rel_rollback(r, row);
        return 0;
    }
    if (p >= 0) {
        d->seq++;
        p = meta_put(d, r, op, change_lsn);
        if (p < 0)
            d->seq--;
    }
    if (p < 0) {
        rel_rollback(r, row);
        if (p == -1) {  /* the envelope buffers may hold part of this row: cut them back */
            r->ops.len = row;
            r->pos.len = row * 16;
            r->ts.len = r->xid.len = r->lsn.len = row * 8;
            r->seqoff.len = row ? (row + 1) * 4 : 0;
            r->seqdata.len = row ? ((int32_t *)r->seqoff.p)[row] : 0;
        }
        return (int)p;
    }
    r->n++;
    r->counts[op]++;
    r->bytes += len;
    d->events++;
    return 1;
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
        d->skip[i] = strchr(skipped, OPS[i]) != NULL;
    d->full = -1;
    return 0;
}

static void
Decoder_dealloc(Decoder *d)
{
    for (int i = 0; i < d->nrels; i++)
        rel_free(d->rels[i]);
    PyMem_Free(d->rels);
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

static PyObject *
Decoder_register(Decoder *d, PyObject *args)
{
    unsigned long relid;
    PyObject *select;
    int ignore = 0;
    if (!PyArg_ParseTuple(args, "kO|p", &relid, &select, &ignore))
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

static PyObject *
Decoder_set_txn(Decoder *d, PyObject *args)
{
    int active;
    unsigned long long final_lsn;
    long long ts_us, xid, seq;
    PyObject *prev;
    if (!PyArg_ParseTuple(args, "pKLLOL", &active, &final_lsn, &ts_us, &xid, &prev, &seq))
        return NULL;
    if (prev != Py_None) {
        unsigned long long v = PyLong_AsUnsignedLongLong(prev);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        d->prev = v;
    }
    d->has_prev = prev != Py_None;
    d->active = active;
    d->final_lsn = final_lsn;
    d->ts_us = ts_us;
    d->xid = xid;
    d->seq = seq;
    Py_RETURN_NONE;
}

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
    Py_ssize_t n = PyList_GET_SIZE(rows);
    for (; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 2)
            break;
        PyObject *data = PyTuple_GET_ITEM(row, 1), *lsn = PyTuple_GET_ITEM(row, 0);
        if (!PyBytes_CheckExact(data) || !PyLong_CheckExact(lsn))
            break;
        const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
        Py_ssize_t len = PyBytes_GET_SIZE(data);
        if (len < 1 || (buf[0] != 'I' && buf[0] != 'U' && buf[0] != 'D'))
            break;
        if (!d->active)
            continue;  /* as the Python path: changes of skipped transactions are not looked at */
        if (len < 6)
            break;
        Rel *r = find_rel(d, be32(buf + 1));
        if (r == NULL)
            break;
        if (r->ignore)
            continue;
        long long change_lsn = PyLong_AsLongLong(lsn);
        if (change_lsn == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            break;
        }
        int rc = change_put(d, r, buf, len, change_lsn);
        if (rc == -2)
            return NULL;
        if (rc == -1)
            break;
        if (r->n >= d->piece_rows || r->bytes >= d->max_bytes) {
            d->full = r->relid;
            i++;
            break;
        }
    }
    return PyLong_FromSsize_t(i);
}

static PyObject *
image_take(Rel *r, Image *img)
{
    Py_ssize_t n = r->n, bitmap = (n + 7) / 8;
    PyObject *cols = PyList_New(r->nsel);
    if (cols == NULL)
        return NULL;
    for (int j = 0; j < r->nsel; j++) {
        Col *c = &img->cols[j];
        PyObject *toast = Py_None;
        Py_INCREF(Py_None);
        if (bits_set(&c->toast, n)) {
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

static PyObject *
Decoder_take(Decoder *d, PyObject *arg)
{
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
        return NULL;
    for (Py_ssize_t i = 0; i <= n; i++) {
        ((int32_t *)steps.p)[i] = (int32_t)i;
        ((int32_t *)steps.p)[n + 1 + i] = (int32_t)(16 * i);
    }
    PyObject *out = Py_BuildValue(
        "(n{sn,sn,sn}NNNNNNNNNNN)", n, "c", r->counts[0], "u", r->counts[1], "d", r->counts[2],
        PyBytes_FromStringAndSize(steps.p, (n + 1) * 4), buf_bytes(&r->ops, n),
        PyBytes_FromStringAndSize(steps.p + (n + 1) * 4, (n + 1) * 4), buf_bytes(&r->pos, n * 16),
        buf_bytes(&r->ts, n * 8), buf_bytes(&r->xid, n * 8), buf_bytes(&r->lsn, n * 8),
        buf_bytes(&r->seqoff, (n + 1) * 4), buf_bytes(&r->seqdata, r->seqdata.len),
        image_take(r, &r->img[0]), image_take(r, &r->img[1]));
    buf_free(&steps);
    if (out == NULL)
        return NULL;
    rel_rollback(r, 0);
    r->img[0].present.len = r->img[1].present.len = 0;
    r->ops.len = r->pos.len = r->ts.len = r->xid.len = r->lsn.len = r->seqoff.len = r->seqdata.len = 0;
    r->n = r->bytes = 0;
    r->counts[0] = r->counts[1] = r->counts[2] = 0;
    return out;
}

static PyObject *
Decoder_get_seq(Decoder *d, void *closure)
{
    return PyLong_FromLongLong(d->seq);
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
    d->seq = v;
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
    return PyLong_FromSsize_t(d->events);
}

static PyMethodDef Decoder_methods[] = {
    {"register", (PyCFunction)Decoder_register, METH_VARARGS,
     "register(relid, select, ignore=False): decode this relation's changes, capturing the tuple\n"
     "columns select; with ignore, consume its changes without reading them (not captured)."},
    {"unregister", (PyCFunction)Decoder_unregister, METH_O,
     "unregister(relid): stop decoding a relation (its events must have been taken)."},
    {"set_txn", (PyCFunction)Decoder_set_txn, METH_VARARGS,
     "set_txn(active, final_lsn, ts_us, xid, prev_commit_or_None, seq): the current transaction."},
    {"feed", (PyCFunction)Decoder_feed, METH_VARARGS,
     "feed(rows, start) -> index of the first (lsn, data) row not consumed."},
    {"take", (PyCFunction)Decoder_take, METH_O,
     "take(relid) -> the relation's buffered piece as bytes buffers (None if empty); empties it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Decoder_getset[] = {
    {"seq", (getter)Decoder_get_seq, (setter)Decoder_set_seq, "sequence number of the last event", NULL},
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
