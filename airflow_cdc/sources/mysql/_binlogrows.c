/*
 * Compiled decoder of binlog ROWS event row images (MySQL / MariaDB), the fast twin of
 * airflow_cdc/sources/mysql/rowcodec.py's generated readers.
 *
 * Contract: for a well-formed row image, Layout.decode returns exactly the neutral values the
 * pure-Python readers return (see rowcodec.py's docstring for the forms), one tuple per image,
 * None for NULL and for columns absent from the image.  A column type the decoder does not know
 * makes Layout() raise NotImplementedError (the caller then uses the Python reader); a row image
 * running past the end of the event raises ValueError (the caller turns it into ProtocolError).
 * MySQL binary JSON is returned as raw bytes passed through the column's json callable, as in
 * Python.  _binlogcols.c adds ``Columns``, which reads the same images into Arrow column buffers.
 */
#include "_binlogrows.h"
#include <string.h>

#define LayoutType BinlogLayoutType

#define NEED(n) do { if (*o + (Py_ssize_t)(n) > len) goto overrun; } while (0)

static PyObject *from_i128(__int128 v) {
    if (v >= INT64_MIN && v <= INT64_MAX) return PyLong_FromLongLong((long long)v);
    unsigned char buf[16];
    for (int i = 0; i < 16; i++) buf[i] = (unsigned char)((unsigned __int128)v >> (8 * i));
    return _PyLong_FromByteArray(buf, 16, 1, 1);
}

int binlog_col_size(Col *c) {
    int t = c->type, m = c->meta;
    switch (t) {
    case T_TINY: return 1;
    case T_SHORT: return 2;
    case T_INT24: return 3;
    case T_LONG: return 4;
    case T_LONGLONG: return 8;
    case T_FLOAT: return 4;
    case T_DOUBLE: return 8;
    case T_VARCHAR: case T_VAR_STRING: case T_STRING: return m < 256 ? 1 : 2;
    case T_BLOB: case T_GEOMETRY: case T_JSON: case T_TINY_BLOB: case T_MEDIUM_BLOB:
    case T_LONG_BLOB: return (m >= 1 && m <= 4) ? m : (m == 0 ? 4 : -1);
    case T_NEWDECIMAL: {
        int precision = m >> 8, scale = m & 0xFF;
        int intg = precision - scale, frac = scale;
        if (intg < 0) return -1;
        int size = (intg / 9) * 4 + DIG2BYTES[intg % 9] + (frac / 9) * 4 + DIG2BYTES[frac % 9];
        return size < 1 ? -1 : size;
    }
    case T_DATETIME2: return (m < 0 || m > 6) ? -1 : 5 + (m + 1) / 2;
    case T_TIMESTAMP2: return (m < 0 || m > 6) ? -1 : 4 + (m + 1) / 2;
    case T_TIME2: return (m < 0 || m > 6) ? -1 : 3 + (m + 1) / 2;
    case T_TIME: return 3;
    case T_YEAR: return 1;
    case T_DATE: return 3;
    case T_TIMESTAMP: return 4;
    case T_DATETIME: return 8;
    case T_ENUM: case T_SET: return (m >= 1 && m <= 8) ? m : -1;
    case T_BIT: { int n = (m + 7) / 8; return (n >= 1 && n <= 8) ? n : -1; }
    default: return -1;
    }
}

/* printf("%0*llu", width, v) without printf (a DECIMAL has up to 9 groups per value) */
static int put_uint(char *out, uint64_t v, int width) {
    char tmp[24];
    int k = 0, n = 0;
    do { tmp[k++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n < width - k) out[n++] = '0';
    while (k) out[n++] = tmp[--k];
    return n;
}

static PyObject *read_decimal(const uint8_t *src, Col *c) {
    int precision = c->meta >> 8, scale = c->meta & 0xFF;
    int intg = precision - scale, frac = scale;
    int intg0 = intg / 9, intg0x = intg % 9, frac0 = frac / 9, frac0x = frac % 9;
    int lead = DIG2BYTES[intg0x], tail = DIG2BYTES[frac0x];
    uint8_t b[64];
    char out[160];
    int size = c->size, p = 0, n = 0;
    memcpy(b, src, size);
    int negative = !(b[0] & 0x80);
    b[0] ^= 0x80;
    if (negative) for (int i = 0; i < size; i++) b[i] ^= 0xFF;
    char ibuf[100];
    int ni = 0;
    if (lead) { ni += put_uint(ibuf + ni, be(b, lead), 0); p = lead; }
    for (int i = 0; i < intg0; i++, p += 4) ni += put_uint(ibuf + ni, be(b + p, 4), ni ? 9 : 0);
    /* str(int): no leading zeros, "0" for zero */
    int s = 0;
    while (s < ni && ibuf[s] == '0') s++;
    if (negative) out[n++] = '-';
    if (s == ni) out[n++] = '0';
    else { memcpy(out + n, ibuf + s, ni - s); n += ni - s; }
    if (frac) {
        out[n++] = '.';
        for (int i = 0; i < frac0; i++, p += 4) n += put_uint(out + n, be(b + p, 4), 9);
        if (tail) n += put_uint(out + n, be(b + p, tail), frac0x);
    }
    return PyUnicode_FromStringAndSize(out, n);
}


static PyObject *read_time2(const uint8_t *d, int fsp) {
    int nfrac = (fsp + 1) / 2;
    int64_t packed;
    if (nfrac == 3) {
        packed = (int64_t)be(d, 6) - 0x800000000000LL;
    } else {
        int64_t intpart = (int64_t)be(d, 3) - 0x800000;
        int64_t frac = nfrac ? (int64_t)be(d + 3, nfrac) : 0;
        if (intpart < 0 && frac) {
            intpart += 1;
            frac -= nfrac == 1 ? 0x100 : 0x10000;
        }
        packed = intpart * (1 << 24) + frac * (nfrac == 1 ? 10000 : nfrac == 2 ? 100 : 1);
    }
    int negative = packed < 0;
    if (negative) packed = -packed;
    int64_t hms = packed >> 24, frac = packed & 0xFFFFFF;
    int64_t micros = (((hms >> 12 & 0x3FF) * 60 + (hms >> 6 & 63)) * 60 + (hms & 63)) * 1000000 + frac;
    return PyLong_FromLongLong(negative ? -micros : micros);
}

int binlog_is_variable(int type) {
    switch (type) {
    case T_VARCHAR: case T_VAR_STRING: case T_STRING: case T_BLOB: case T_GEOMETRY: case T_JSON:
    case T_TINY_BLOB: case T_MEDIUM_BLOB: case T_LONG_BLOB: return 1;
    default: return 0;
    }
}

PyObject *binlog_read_value(Col *c, const uint8_t *d, Py_ssize_t len, Py_ssize_t *o) {
    const uint8_t *p = d + *o;
    int sz = c->size;
    switch (c->type) {
    case T_TINY: case T_SHORT: case T_INT24: case T_LONG: case T_LONGLONG: {
        NEED(sz);
        uint64_t v = le(p, sz);
        *o += sz;
        if (c->is_unsigned) return PyLong_FromUnsignedLongLong(v);
        if (sz < 8 && (v >> (8 * sz - 1)) & 1) v |= ~(uint64_t)0 << (8 * sz);
        return PyLong_FromLongLong((long long)(int64_t)v);
    }
    case T_FLOAT: {
        NEED(4);
        float f; memcpy(&f, p, 4); *o += 4;
        return PyFloat_FromDouble((double)f);
    }
    case T_DOUBLE: {
        NEED(8);
        double f; memcpy(&f, p, 8); *o += 8;
        return PyFloat_FromDouble(f);
    }
    case T_VARCHAR: case T_VAR_STRING: case T_STRING:
    case T_BLOB: case T_GEOMETRY: case T_JSON: case T_TINY_BLOB: case T_MEDIUM_BLOB: case T_LONG_BLOB: {
        NEED(sz);
        uint64_t n = le(p, sz);
        if ((uint64_t)(len - *o - sz) < n) goto overrun;
        PyObject *v = PyBytes_FromStringAndSize((const char *)p + sz, (Py_ssize_t)n);
        *o += sz + (Py_ssize_t)n;
        if (v && c->json) {
            PyObject *j = PyObject_CallOneArg(c->json, v);
            Py_DECREF(v);
            return j;
        }
        return v;
    }
    case T_NEWDECIMAL: NEED(sz); *o += sz; return read_decimal(p, c);
    case T_DATETIME2: {
        NEED(sz);
        int nfrac = sz - 5;
        int64_t packed = (int64_t)be(p, 5) - 0x8000000000LL;
        int64_t ymd = packed >> 17, hms = packed & 0x1FFFF, ym = ymd >> 5;
        /* Python floor division / modulo on a possibly negative ym (malformed input only) */
        int64_t q = ym / 13, r = ym % 13;
        if (r < 0) { r += 13; q -= 1; }
        int64_t frac = nfrac ? (int64_t)be(p + 5, nfrac) * FRAC_MULT[nfrac] : 0;
        __int128 stamp = ((__int128)((q * 100 + r) * 100 + (ymd & 31))) * 1000000
            + ((hms >> 12) * 100 + (hms >> 6 & 63)) * 100 + (hms & 63);
        *o += sz;
        return from_i128(stamp * 1000000 + frac);
    }
    case T_TIMESTAMP2: {
        NEED(sz);
        int nfrac = sz - 4;
        int64_t frac = nfrac ? (int64_t)be(p + 4, nfrac) * FRAC_MULT[nfrac] : 0;
        *o += sz;
        return PyLong_FromLongLong((int64_t)be(p, 4) * 1000000 + frac);
    }
    case T_TIME2: NEED(sz); *o += sz; return read_time2(p, c->meta);
    case T_TIME: {
        NEED(3);
        int64_t v = (int64_t)le(p, 3);
        if (v & 0x800000) v -= 0x1000000;
        int64_t sign = v < 0 ? -1 : 1;
        if (v < 0) v = -v;
        *o += 3;
        return PyLong_FromLongLong(sign * ((v / 10000 * 60 + v / 100 % 100) * 60 + v % 100) * 1000000);
    }
    case T_YEAR: NEED(1); *o += 1; return PyLong_FromLong(p[0] ? 1900 + p[0] : 0);
    case T_DATE: NEED(3); *o += 3; return PyLong_FromUnsignedLongLong(le(p, 3));
    case T_TIMESTAMP: NEED(4); *o += 4; return PyLong_FromLongLong((int64_t)le(p, 4) * 1000000);
    case T_DATETIME: NEED(8); *o += 8; return from_i128((__int128)le(p, 8) * 1000000);
    case T_ENUM: case T_SET: NEED(sz); *o += sz; return PyLong_FromUnsignedLongLong(le(p, sz));
    case T_BIT: NEED(sz); *o += sz; return PyLong_FromUnsignedLongLong(be(p, sz));
    }
    PyErr_Format(PyExc_NotImplementedError, "binlog column type %d is not supported", c->type);
    return NULL;
overrun:
    PyErr_Format(PyExc_ValueError, "row image runs past the end of the event (column %d, type %d)",
                 c->index, c->type);
    return NULL;
}

static PyObject *read_row(Layout *L, const uint8_t *d, Py_ssize_t len, Py_ssize_t *o) {
    int nbytes = (L->npresent + 7) / 8;
    if (*o + nbytes > len) {
        PyErr_SetString(PyExc_ValueError, "row image runs past the end of the event (NULL bitmap)");
        return NULL;
    }
    const uint8_t *nulls = d + *o;
    *o += nbytes;
    PyObject *row = PyTuple_New(L->ncols);
    if (!row) return NULL;
    for (int i = 0; i < L->ncols; i++) { Py_INCREF(Py_None); PyTuple_SET_ITEM(row, i, Py_None); }
    for (int bit = 0; bit < L->npresent; bit++) {
        if (nulls[bit >> 3] >> (bit & 7) & 1) continue;
        Col *c = &L->cols[bit];
        PyObject *v = binlog_read_value(c, d, len, o);
        if (!v) { Py_DECREF(row); return NULL; }
        Py_DECREF(Py_None);
        PyTuple_SET_ITEM(row, c->index, v);
    }
    return row;
}

static void Layout_dealloc(Layout *self) {
    if (self->cols) {
        for (int i = 0; i < self->npresent; i++) Py_XDECREF(self->cols[i].json);
        PyMem_Free(self->cols);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Layout(columns, present): columns a sequence of (type, meta, unsigned, json-callable-or-None). */
static int Layout_init(Layout *self, PyObject *args, PyObject *kw) {
    PyObject *columns, *present;
    if (!PyArg_ParseTuple(args, "OO", &columns, &present)) return -1;
    PyObject *cs = PySequence_Fast(columns, "columns must be a sequence");
    if (!cs) return -1;
    PyObject *ps = PySequence_Fast(present, "present must be a sequence");
    if (!ps) { Py_DECREF(cs); return -1; }
    if (self->cols) {  /* __init__ called again */
        for (int i = 0; i < self->npresent; i++) Py_XDECREF(self->cols[i].json);
        PyMem_Free(self->cols);
        self->cols = NULL;
        self->npresent = 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(cs);
    if (PySequence_Fast_GET_SIZE(ps) != n) {
        PyErr_SetString(PyExc_ValueError, "columns and present differ in length");
        goto fail;
    }
    self->cols = PyMem_Calloc(n ? n : 1, sizeof(Col));
    if (!self->cols) { PyErr_NoMemory(); goto fail; }
    self->ncols = (int)n;
    self->npresent = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int is_present = PyObject_IsTrue(PySequence_Fast_GET_ITEM(ps, i));
        if (is_present < 0) goto fail;
        if (!is_present) continue;
        Col *c = &self->cols[self->npresent];
        PyObject *json = Py_None;
        int uns = 0;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(cs, i), "ii|pO", &c->type, &c->meta, &uns, &json))
            goto fail;
        c->index = (int)i;
        c->is_unsigned = uns;
        c->size = binlog_col_size(c);
        if (c->size < 0) {
            PyErr_Format(PyExc_NotImplementedError, "binlog column type %d (metadata %d) is not supported",
                         c->type, c->meta);
            goto fail;
        }
        if (c->type == T_NEWDECIMAL && c->size > 64) {
            PyErr_SetString(PyExc_NotImplementedError, "DECIMAL wider than 65 digits");
            goto fail;
        }
        if (c->type == T_JSON && json != Py_None) { Py_INCREF(json); c->json = json; }
        self->npresent++;
    }
    Py_DECREF(cs); Py_DECREF(ps);
    return 0;
fail:
    Py_DECREF(cs); Py_DECREF(ps);
    return -1;
}

/* The arguments decode() and events() share: an update's after-image layout (``after``: a Layout,
 * or None for this one) into *second, and a non-negative offset.  -1 with an exception set. */
static int check_call(Layout *self, int op, PyObject *after, Py_ssize_t o, Layout **second) {
    if (op == 'u') {
        if (after == Py_None) *second = self;
        else if (PyObject_TypeCheck(after, &LayoutType)) *second = (Layout *)after;
        else { PyErr_SetString(PyExc_TypeError, "after must be a Layout"); return -1; }
    }
    if (o < 0) { PyErr_SetString(PyExc_ValueError, "negative offset"); return -1; }
    return 0;
}

/* decode(body, offset, op, after=None) -> list of (before, after) pairs for op 'c', 'd' or 'u'
 * (for 'u' self reads the before image and ``after`` the after image). */
static PyObject *Layout_decode(Layout *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t o;
    int op;
    PyObject *after = Py_None;
    if (!PyArg_ParseTuple(args, "y*nC|O", &buf, &o, &op, &after)) return NULL;
    Layout *second = NULL;
    if (check_call(self, op, after, o, &second) < 0) { PyBuffer_Release(&buf); return NULL; }
    const uint8_t *d = buf.buf;
    Py_ssize_t len = buf.len;
    PyObject *out = PyList_New(0);
    if (!out) goto done;
    while (o < len) {
        PyObject *a = read_row(self, d, len, &o), *pair = NULL;
        if (!a) goto fail;
        if (op == 'u') {
            PyObject *b = read_row(second, d, len, &o);
            if (!b) { Py_DECREF(a); goto fail; }
            pair = PyTuple_Pack(2, a, b);
            Py_DECREF(b);
        } else if (op == 'c') {
            pair = PyTuple_Pack(2, Py_None, a);
        } else {
            pair = PyTuple_Pack(2, a, Py_None);
        }
        Py_DECREF(a);
        if (!pair) goto fail;
        int rc = PyList_Append(out, pair);
        Py_DECREF(pair);
        if (rc < 0) goto fail;
    }
done:
    PyBuffer_Release(&buf);
    return out;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}


static PyObject *S_c, *S_u, *S_d;

/* One event tuple (op, before, after, info, pos, row, None, ordinal): the form the stream's sink
 * buffers (stream.py's expand_events reads it). Steals nothing. */
static PyObject *event_tuple(PyObject *op, PyObject *before, PyObject *after, PyObject *info,
                             PyObject *pos, Py_ssize_t row, Py_ssize_t ordinal) {
    PyObject *t = PyTuple_New(8);
    if (!t) return NULL;
    PyObject *r = PyLong_FromSsize_t(row), *n = PyLong_FromSsize_t(ordinal);
    if (!r || !n) { Py_XDECREF(r); Py_XDECREF(n); Py_DECREF(t); return NULL; }
    Py_INCREF(op); PyTuple_SET_ITEM(t, 0, op);
    Py_INCREF(before); PyTuple_SET_ITEM(t, 1, before);
    Py_INCREF(after); PyTuple_SET_ITEM(t, 2, after);
    Py_INCREF(info); PyTuple_SET_ITEM(t, 3, info);
    Py_INCREF(pos); PyTuple_SET_ITEM(t, 4, pos);
    PyTuple_SET_ITEM(t, 5, r);
    Py_INCREF(Py_None); PyTuple_SET_ITEM(t, 6, Py_None);
    PyTuple_SET_ITEM(t, 7, n);
    return t;
}

static int append_event(PyObject *out, PyObject *op, PyObject *before, PyObject *after, PyObject *info,
                        PyObject *pos, Py_ssize_t row, Py_ssize_t ordinal) {
    PyObject *t = event_tuple(op, before, after, info, pos, row, ordinal);
    if (!t) return -1;
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

/* events(body, offset, op, after, key_index, info, pos) -> list of event tuples
 * (op, before, after, info, pos, row, None, ordinal) for every row image of a rows event: what
 * decode() returns, turned into the stream's events in one pass.  An update whose key columns
 * (``key_index``, indexes into the full column list) differ between its images becomes a ``d`` of
 * the old image and a ``c`` carrying both images, as Debezium emits a primary-key change;
 * ``ordinal`` numbers the events, ``row`` the row images. */
static PyObject *Layout_events(Layout *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t o;
    int op;
    PyObject *after = Py_None, *keys, *info, *pos;
    if (!PyArg_ParseTuple(args, "y*nCOOOO", &buf, &o, &op, &after, &keys, &info, &pos)) return NULL;
    Layout *second = NULL;
    PyObject *ks = NULL, *out = NULL;
    Py_ssize_t nkeys = 0, key[64];
    if (check_call(self, op, after, o, &second) < 0) goto fail;
    if (op != 'c' && op != 'u' && op != 'd') {
        PyErr_SetString(PyExc_ValueError, "op must be 'c', 'u' or 'd'");
        goto fail;
    }
    ks = PySequence_Fast(keys, "key_index must be a sequence");
    if (!ks) goto fail;
    nkeys = PySequence_Fast_GET_SIZE(ks);
    if (nkeys > 64) { PyErr_SetString(PyExc_ValueError, "more than 64 key columns"); goto fail; }
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        key[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(ks, i));
        if (key[i] == -1 && PyErr_Occurred()) goto fail;
        if (key[i] < 0 || key[i] >= self->ncols || (second && key[i] >= second->ncols)) {
            PyErr_SetString(PyExc_IndexError, "key column index out of range");
            goto fail;
        }
    }
    const uint8_t *d = buf.buf;
    Py_ssize_t len = buf.len, row = 0, n = 0;
    out = PyList_New(0);
    if (!out) goto fail;
    while (o < len) {
        PyObject *a = read_row(self, d, len, &o);
        if (!a) goto fail;
        int rc;
        if (op == 'c') {
            rc = append_event(out, S_c, Py_None, a, info, pos, row, n++);
        } else if (op == 'd') {
            rc = append_event(out, S_d, a, Py_None, info, pos, row, n++);
        } else {
            PyObject *b = read_row(second, d, len, &o);
            if (!b) { Py_DECREF(a); goto fail; }
            int changed = 0;
            for (Py_ssize_t i = 0; i < nkeys && !changed; i++) {
                changed = PyObject_RichCompareBool(PyTuple_GET_ITEM(a, key[i]), PyTuple_GET_ITEM(b, key[i]), Py_NE);
                if (changed < 0) break;
            }
            if (changed < 0) rc = -1;
            else if (changed) {
                rc = append_event(out, S_d, a, Py_None, info, pos, row, n);
                if (rc == 0) rc = append_event(out, S_c, a, b, info, pos, row, n + 1);
                n += 2;
            } else {
                rc = append_event(out, S_u, a, b, info, pos, row, n++);
            }
            Py_DECREF(b);
        }
        Py_DECREF(a);
        if (rc < 0) goto fail;
        row++;
    }
    Py_DECREF(ks);
    PyBuffer_Release(&buf);
    return out;
fail:
    Py_XDECREF(ks);
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}

/* read(data, offset) -> (row, next_offset): one image, the Python reader's signature. */
static PyObject *Layout_call(Layout *self, PyObject *args, PyObject *kw) {
    Py_buffer buf;
    Py_ssize_t o;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &o)) return NULL;
    if (o < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "negative offset");
        return NULL;
    }
    PyObject *row = read_row(self, buf.buf, buf.len, &o);
    PyBuffer_Release(&buf);
    if (!row) return NULL;
    PyObject *res = Py_BuildValue("(Nn)", row, o);
    return res;
}

static PyMethodDef Layout_methods[] = {
    {"decode", (PyCFunction)Layout_decode, METH_VARARGS,
     "decode(body, offset, op, after=None) -> list of (before, after) row image pairs"},
    {"events", (PyCFunction)Layout_events, METH_VARARGS,
     "events(body, offset, op, after, key_index, info, pos) -> list of stream event tuples"},
    {NULL, NULL, 0, NULL}
};

PyTypeObject BinlogLayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "airflow_cdc.sources.mysql._binlogrows.Layout",
    .tp_basicsize = sizeof(Layout),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Compiled row-image reader for one table layout and present-column bitmap",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Layout_init,
    .tp_dealloc = (destructor)Layout_dealloc,
    .tp_call = (ternaryfunc)Layout_call,
    .tp_methods = Layout_methods,
};


/* datetime_epoch(values, divisor, zero) -> (data, validity) or None
 *
 * types.datetime_micros over a column of neutral DATETIME values (YYYYMMDDhhmmss * 10**6 +
 * micros, Python ints, None for NULL), floor-divided by ``divisor`` (1: micros, 1000: millis);
 * a zero or invalid date becomes ``zero`` (an int, or None for NULL).  Returns the int64 values and
 * the validity bitmap (None when nothing is NULL) as bytes for pyarrow's Array.from_buffers, or
 * None when a value is not a non-negative int below 2**127 (the caller then converts in Python). */
static PyObject *datetime_epoch(PyObject *mod, PyObject *args) {
    PyObject *values, *zero;
    long long divisor;
    if (!PyArg_ParseTuple(args, "OLO", &values, &divisor, &zero)) return NULL;
    if (divisor < 1) { PyErr_SetString(PyExc_ValueError, "divisor must be positive"); return NULL; }
    int zero_null = zero == Py_None;
    long long zero_value = 0;
    if (!zero_null) {
        zero_value = PyLong_AsLongLong(zero);
        if (zero_value == -1 && PyErr_Occurred()) return NULL;
    }
    PyObject *seq = PySequence_Fast(values, "values must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), nulls = 0;
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *valid = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (!data || !valid) goto fail;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(data);
    uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(valid);
    memset(bits, 0xFF, (n + 7) / 8);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(seq, i);
        int is_null = 0;
        int64_t result = 0;
        if (v == Py_None) {
            is_null = 1;
        } else {
            if (!PyLong_CheckExact(v)) goto python;
            unsigned __int128 x;
            int overflow = 0;
            long long small = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (small == -1 && PyErr_Occurred()) goto fail;
            if (!overflow) {
                if (small < 0) goto python;
                x = (unsigned __int128)small;
            } else {
                unsigned char b[16];
                if (overflow < 0) goto python;
                if (_PyLong_AsByteArray((PyLongObject *)v, b, 16, 1, 1) < 0) { PyErr_Clear(); goto python; }
                x = 0;
                for (int k = 15; k >= 0; k--) x = x << 8 | b[k];
                if (x >> 127) goto python;
            }
            int64_t micros = (int64_t)(x % 1000000);
            unsigned __int128 stamp = x / 1000000;
            int64_t hms = (int64_t)(stamp % 1000000);
            unsigned __int128 ymd = stamp / 1000000;
            /* as types.datetime_micros: the fields are packed year << 9 | month << 5 | day (the
             * pure-Python path's epoch_days key), then unpacked and validated as a date */
            unsigned __int128 year = ymd / 10000;
            if (year > ((unsigned __int128)1 << 40)) { is_null = 1; }
            else {
                int64_t packed = (int64_t)year << 9 | (int64_t)(ymd / 100 % 100) << 5 | (int64_t)(ymd % 100);
                int64_t y = packed >> 9, m = packed >> 5 & 15, d = packed & 31;
                if (!valid_date(y, m, d)) is_null = 1;
                else {
                    int64_t secs = days_from_civil(y, m, d) * 86400
                        + hms / 10000 * 3600 + hms / 100 % 100 * 60 + hms % 100;
                    result = floordiv(secs * 1000000 + micros, divisor);
                }
            }
            if (is_null && !zero_null) { is_null = 0; result = zero_value; }
        }
        if (is_null) { bits[i >> 3] &= (uint8_t)~(1u << (i & 7)); nulls++; }
        out[i] = result;
    }
    Py_DECREF(seq);
    if (!nulls) { Py_DECREF(valid); valid = Py_None; Py_INCREF(valid); }
    return Py_BuildValue("(NN)", data, valid);
python:
    Py_DECREF(seq); Py_XDECREF(data); Py_XDECREF(valid);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq); Py_XDECREF(data); Py_XDECREF(valid);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"datetime_epoch", datetime_epoch, METH_VARARGS,
     "datetime_epoch(values, divisor, zero) -> (int64 bytes, validity bytes or None) or None"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_binlogrows", "Compiled binlog ROWS event row-image decoder", -1, module_methods
};

PyMODINIT_FUNC PyInit__binlogrows(void) {
    if (PyType_Ready(&LayoutType) < 0) return NULL;
    S_c = PyUnicode_InternFromString("c");
    S_u = PyUnicode_InternFromString("u");
    S_d = PyUnicode_InternFromString("d");
    if (!S_c || !S_u || !S_d) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&LayoutType);
    if (PyModule_AddObject(m, "Layout", (PyObject *)&LayoutType) < 0) {
        Py_DECREF(&LayoutType);
        Py_DECREF(m);
        return NULL;
    }
    if (binlogcols_add_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
