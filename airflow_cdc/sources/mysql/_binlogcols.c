/*
 * The columnar hand-over of binlog ROWS events: row images read straight into Arrow column
 * buffers (the MySQL twin of PostgreSQL's ColumnarPiece, see airflow_cdc/sources/mysql/columnar.py).
 *
 * Columns(columns, select, modes, key_index) accumulates the change events of one table structure.
 * ``columns`` is the table's layout as Layout() takes it, ``select`` the captured columns' indexes,
 * ``modes`` one (mode, divisor, zero, adjust) tuple per captured column:
 *
 *   M_OBJECT    the neutral Python value (Layout's), appended to a list: the codec converts it
 *   M_INT       integers (and BIT) as int64: signed, unsigned, or a BIGINT UNSIGNED's 64 bits
 *   M_FLOAT     FLOAT / DOUBLE as float64
 *   M_DECIMAL   DECIMAL(p<=38) as decimal128's 16-byte unscaled two's complement
 *   M_BYTES     strings / blobs as binary offsets + data
 *   M_DATETIME  DATETIME2 as types.datetime_micros floor-divided by ``divisor`` (``zero``, None for
 *               NULL, for zero and invalid dates; ``adjust``: enable.time.adjuster's two-digit years)
 *
 * add() reads every row image of one rows event and appends its events exactly as Layout.events
 * builds them (an update changing a key column becomes a d and a c carrying both images); take()
 * hands the buffers over without a copy (Chunks: bytes through the buffer protocol) and starts a
 * new piece.  A value running past the end of the
 * event, or a DECIMAL that is not one (a group above 999999999, more digits than its precision),
 * raises ValueError.  The buffers are then inconsistent: the caller drops the object.
 */
#include "_binlogrows.h"
#include <string.h>

enum { M_OBJECT = 0, M_INT = 1, M_FLOAT = 2, M_DECIMAL = 3, M_BYTES = 4, M_DATETIME = 5 };

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

typedef struct {
    Col col;           /* the column's binlog layout (index: position in the table) */
    int mode;
    long long divisor;
    int zero_null, adjust;
    long long zero;
    __int128 limit;    /* M_DECIMAL: 10**precision */
    Buf valid, data, offsets;
    PyObject *list;    /* M_OBJECT values */
    Py_ssize_t nulls;
} Builder;

typedef struct {
    PyObject_HEAD
    int ncols, nsel, nkeys;
    Col *cols;         /* every column of the table */
    int *keys;
    Builder *before, *after;
    Py_ssize_t *slots_a, *slots_b;
    Py_ssize_t n, counts[3], nbytes;
    /* events whose values each image side's builders hold: a side's absent images are appended
     * as NULLs only once a later event of the piece has one (a piece of inserts has no before
     * values at all) */
    Py_ssize_t filled_b, filled_a;
    Buf ops, present_b, present_a, positions, pos, row, info;
} Columns;

/* Buffers are malloc'd: a piece's are handed to Python as Chunks, which Arrow may release on a
 * writer thread. */
static int grow(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int put(Buf *b, const void *src, Py_ssize_t n) {
    if (grow(b, n) < 0) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

/* bit ``i`` of a bitmap (bits are appended in order: a new byte starts cleared) */
static int put_bit(Buf *b, Py_ssize_t i, int on) {
    if ((i & 7) == 0) {
        uint8_t zero = 0;
        if (put(b, &zero, 1) < 0) return -1;
    }
    if (on) b->p[i >> 3] |= (char)(1 << (i & 7));
    return 0;
}

static void buf_free(Buf *b) { free(b->p); b->p = NULL; b->len = b->cap = 0; }

/* A piece's buffer handed over without a copy: read-only bytes through the buffer protocol. */
typedef struct {
    PyObject_HEAD
    char *p;
    Py_ssize_t len;
} Chunk;

static int Chunk_getbuffer(Chunk *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->p, self->len, 1, flags);
}

static void Chunk_dealloc(Chunk *self) {
    free(self->p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t Chunk_length(Chunk *self) { return self->len; }

static PyBufferProcs Chunk_as_buffer = {(getbufferproc)Chunk_getbuffer, NULL};
static PySequenceMethods Chunk_as_sequence = {.sq_length = (lenfunc)Chunk_length};

static PyTypeObject ChunkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "airflow_cdc.sources.mysql._binlogrows.Chunk",
    .tp_basicsize = sizeof(Chunk),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One buffer of a piece (the buffer protocol gives its bytes)",
    .tp_dealloc = (destructor)Chunk_dealloc,
    .tp_as_buffer = &Chunk_as_buffer,
    .tp_as_sequence = &Chunk_as_sequence,
};

static const uint64_t POW10[10] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000,
                                   1000000000};

/* The unscaled value of a DECIMAL(p<=38) image: the number rowcodec's text of it has, without the
 * point.  -1 with ValueError when the bytes are no DECIMAL(p, s) (the text would not fit). */
static int decimal_unscaled(const uint8_t *src, const Col *c, __int128 *out) {
    int precision = c->meta >> 8, scale = c->meta & 0xFF;
    int intg = precision - scale, intg0 = intg / 9, intg0x = intg % 9, frac0 = scale / 9, frac0x = scale % 9;
    int lead = DIG2BYTES[intg0x], tail = DIG2BYTES[frac0x], p = 0;
    uint8_t b[32];
    memcpy(b, src, c->size);
    int negative = !(b[0] & 0x80);
    b[0] ^= 0x80;
    if (negative) for (int i = 0; i < c->size; i++) b[i] ^= 0xFF;
    __int128 v = 0;
    uint64_t g;
    if (lead) {
        g = be(b, lead);
        if (g >= POW10[intg0x]) goto bad;
        v = g;
        p = lead;
    }
    for (int i = 0; i < intg0 + frac0; i++, p += 4) {
        g = be(b + p, 4);
        if (g >= POW10[9]) goto bad;
        v = v * (__int128)POW10[9] + g;
    }
    if (tail) {
        g = be(b + p, tail);
        if (g >= POW10[frac0x]) goto bad;
        v = v * (__int128)POW10[frac0x] + g;
    }
    *out = negative ? -v : v;
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "column %d: DECIMAL(%d,%d) bytes out of range", c->index, precision, scale);
    return -1;
}

#define DT_YEAR ((__int128)10000000000000000LL) /* 10**16: a year in a neutral DATETIME */

/* A DATETIME2 image as the codec's value: 1 with *out set, 0 for the zero value (zero date). */
static int datetime_value(const uint8_t *p, const Builder *b, int64_t *out) {
    int nfrac = b->col.size - 5;
    int64_t packed = (int64_t)be(p, 5) - 0x8000000000LL;
    int64_t ymd = packed >> 17, hms = packed & 0x1FFFF, ym = ymd >> 5;
    int64_t q = ym / 13, r = ym % 13;
    if (r < 0) { r += 13; q -= 1; }
    int64_t frac = nfrac ? (int64_t)be(p + 5, nfrac) * FRAC_MULT[nfrac] : 0;
    if (q >= 0 && frac < 1000000) {
        /* the neutral value's digits are the fields themselves (month < 13, day, hour < 32,
         * minute, second < 64, micros): the same arithmetic without 128-bit divisions */
        int64_t year = q, month = r, day = ymd & 31;
        if (b->adjust && year < 100 && (month || day)) year += year < 70 ? 2000 : 1900;
        if (!valid_date(year, month, day)) return 0;
        int64_t secs = days_from_civil(year, month, day) * 86400 + (hms >> 12) * 3600 + (hms >> 6 & 63) * 60 + (hms & 63);
        *out = floordiv(secs * 1000000 + frac, b->divisor);
        return 1;
    }
    __int128 v = (((__int128)((q * 100 + r) * 100 + (ymd & 31))) * 1000000
                  + ((hms >> 12) * 100 + (hms >> 6 & 63)) * 100 + (hms & 63)) * 1000000 + frac;
    /* types.adjust_datetimes: a year below 100 with a month or day moves to 1970-2069 */
    if (b->adjust && v > 0 && v < 100 * DT_YEAR && (v / 1000000000000LL) % 10000) {
        int64_t year = (int64_t)(v / DT_YEAR);
        v += (year < 70 ? 2000 : 1900) * DT_YEAR;
    }
    if (v < 0) return 0; /* types.datetime_micros: a negative year is no date */
    int64_t micros = (int64_t)(v % 1000000);
    __int128 stamp = v / 1000000;
    int64_t hms6 = (int64_t)(stamp % 1000000);
    __int128 ymd8 = stamp / 1000000, year = ymd8 / 10000;
    if (year > ((__int128)1 << 40)) return 0;
    int64_t bits = (int64_t)year << 9 | (int64_t)(ymd8 / 100 % 100) << 5 | (int64_t)(ymd8 % 100);
    int64_t y = bits >> 9, m = bits >> 5 & 15, d = bits & 31;
    if (!valid_date(y, m, d)) return 0;
    int64_t secs = days_from_civil(y, m, d) * 86400 + hms6 / 10000 * 3600 + hms6 / 100 % 100 * 60 + hms6 % 100;
    *out = floordiv(secs * 1000000 + micros, b->divisor);
    return 1;
}

/* Bytes of the value at ``o`` (its length prefix included), checked against ``len``; -1: overrun. */
static Py_ssize_t value_size(const Col *c, const uint8_t *d, Py_ssize_t len, Py_ssize_t o) {
    if (o + c->size > len) return -1;
    if (!binlog_is_variable(c->type)) return c->size;
    uint64_t n = le(d + o, c->size);
    if ((uint64_t)(len - o - c->size) < n) return -1;
    return c->size + (Py_ssize_t)n;
}

/* Append one value (``o`` < 0: NULL or absent) to a builder. */
static int append(Columns *self, Builder *b, Py_ssize_t i, Py_ssize_t o, const uint8_t *d, Py_ssize_t len) {
    int valid = o >= 0;
    const uint8_t *p = valid ? d + o : NULL;
    int sz = b->col.size;
    int64_t i64 = 0;
    double f64 = 0;
    __int128 dec = 0;
    if (b->mode == M_OBJECT) {
        PyObject *v = Py_None;
        if (valid) {
            Py_ssize_t at = o;
            v = binlog_read_value(&b->col, d, len, &at);
            if (!v) return -1;
        } else {
            Py_INCREF(v);
        }
        int rc = PyList_Append(b->list, v);
        Py_DECREF(v);
        return rc;
    }
    if (valid) {
        switch (b->mode) {
        case M_INT:
            if (b->col.type == T_BIT) { i64 = (int64_t)be(p, sz); break; }
            {
                uint64_t v = le(p, sz);
                if (!b->col.is_unsigned && sz < 8 && (v >> (8 * sz - 1)) & 1) v |= ~(uint64_t)0 << (8 * sz);
                i64 = (int64_t)v;
            }
            break;
        case M_FLOAT:
            if (b->col.type == T_FLOAT) { float f; memcpy(&f, p, 4); f64 = (double)f; }
            else memcpy(&f64, p, 8);
            break;
        case M_DECIMAL:
            if (decimal_unscaled(p, &b->col, &dec) < 0) return -1;
            /* decimal128(p, s) holds at most p digits: pa.array(text).cast() refuses more */
            if (dec >= b->limit || dec <= -b->limit) goto bad_decimal;
            break;
        case M_DATETIME:
            if (!datetime_value(p, b, &i64)) {
                if (b->zero_null) valid = 0;
                else i64 = b->zero;
            }
            break;
        }
    }
    if (put_bit(&b->valid, i, valid) < 0) return -1;
    if (!valid) b->nulls++;
    switch (b->mode) {
    case M_INT: case M_DATETIME: return put(&b->data, &i64, 8);
    case M_FLOAT: return put(&b->data, &f64, 8);
    case M_DECIMAL: return put(&b->data, &dec, 16);
    case M_BYTES: {
        Py_ssize_t n = 0;
        if (valid) {
            n = (Py_ssize_t)le(p, sz);
            if (b->data.len + n > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "a piece's string column passed 2 GiB");
                return -1;
            }
            if (put(&b->data, p + sz, n) < 0) return -1;
            self->nbytes += n;
        }
        int32_t end = (int32_t)b->data.len;
        return put(&b->offsets, &end, 4);
    }
    }
    return 0;
bad_decimal:
    PyErr_Format(PyExc_ValueError, "column %d: DECIMAL(%d,%d) has more digits than its precision",
                 b->col.index, b->col.meta >> 8, b->col.meta & 0xFF);
    return -1;
}

/* Read one row image's NULL bitmap and value extents: slots[column] = offset, -1 NULL or absent. */
static int parse_image(Layout *L, const uint8_t *d, Py_ssize_t len, Py_ssize_t *o, Py_ssize_t *slots, int ncols) {
    for (int i = 0; i < ncols; i++) slots[i] = -1;
    int nbytes = (L->npresent + 7) / 8;
    if (*o + nbytes > len) goto overrun;
    const uint8_t *nulls = d + *o;
    *o += nbytes;
    for (int bit = 0; bit < L->npresent; bit++) {
        if (nulls[bit >> 3] >> (bit & 7) & 1) continue;
        Col *c = &L->cols[bit];
        Py_ssize_t n = value_size(c, d, len, *o);
        if (n < 0) goto overrun;
        slots[c->index] = *o;
        *o += n;
    }
    return 0;
overrun:
    PyErr_SetString(PyExc_ValueError, "row image runs past the end of the event");
    return -1;
}

static int is_int_type(int t) {
    return t == T_TINY || t == T_SHORT || t == T_INT24 || t == T_LONG || t == T_LONGLONG;
}

/* Whether key column ``k`` differs between two images, as Python's ``before[k] != after[k]`` on
 * the neutral values: integers and strings by their bytes (one value, one encoding), other types
 * by their values.  -1 with an exception set. */
static int key_differs(Columns *self, int k, const uint8_t *d, Py_ssize_t len) {
    Py_ssize_t a = self->slots_a[k], b = self->slots_b[k];
    if (a < 0 || b < 0) return (a < 0) != (b < 0);
    Col *c = &self->cols[k];
    if (is_int_type(c->type) || (binlog_is_variable(c->type) && c->type != T_JSON)) {
        Py_ssize_t na = value_size(c, d, len, a), nb = value_size(c, d, len, b);
        return na != nb || memcmp(d + a, d + b, na) != 0;
    }
    PyObject *va = binlog_read_value(c, d, len, &a);
    if (!va) return -1;
    PyObject *vb = binlog_read_value(c, d, len, &b);
    if (!vb) { Py_DECREF(va); return -1; }
    int rc = PyObject_RichCompareBool(va, vb, Py_NE);
    Py_DECREF(va);
    Py_DECREF(vb);
    return rc;
}

/* Append NULLs to one side's builders up to event ``upto`` (exclusive). */
static int backfill(Columns *self, Builder *bs, Py_ssize_t *filled, Py_ssize_t upto) {
    for (; *filled < upto; (*filled)++)
        for (int j = 0; j < self->nsel; j++)
            if (append(self, &bs[j], *filled, -1, NULL, 0) < 0) return -1;
    return 0;
}

/* Append one image's values (``slots``) to a side's builders as event ``i``. */
static int append_image(Columns *self, Builder *bs, Py_ssize_t *filled, Py_ssize_t i, Py_ssize_t *slots,
                        const uint8_t *d, Py_ssize_t len) {
    if (backfill(self, bs, filled, i) < 0) return -1;
    for (int j = 0; j < self->nsel; j++)
        if (append(self, &bs[j], i, slots[bs[j].col.index], d, len) < 0) return -1;
    *filled = i + 1;
    return 0;
}

static int emit(Columns *self, char op, Py_ssize_t *before, Py_ssize_t *after, const uint8_t *d,
                Py_ssize_t len, uint64_t file_key, uint32_t pos, int32_t row, uint32_t ordinal, int32_t info) {
    Py_ssize_t i = self->n;
    if (before && append_image(self, self->before, &self->filled_b, i, before, d, len) < 0) return -1;
    if (after && append_image(self, self->after, &self->filled_a, i, after, d, len) < 0) return -1;
    uint8_t key[16];
    for (int s = 0; s < 8; s++) key[s] = (uint8_t)(file_key >> (56 - 8 * s));
    for (int s = 0; s < 4; s++) key[8 + s] = (uint8_t)(pos >> (24 - 8 * s));
    for (int s = 0; s < 4; s++) key[12 + s] = (uint8_t)(ordinal >> (24 - 8 * s));
    int64_t pos64 = pos;
    if (put(&self->ops, &op, 1) < 0 || put_bit(&self->present_b, i, before != NULL) < 0
        || put_bit(&self->present_a, i, after != NULL) < 0 || put(&self->positions, key, 16) < 0
        || put(&self->pos, &pos64, 8) < 0 || put(&self->row, &row, 4) < 0 || put(&self->info, &info, 4) < 0)
        return -1;
    self->counts[op == 'c' ? 0 : op == 'u' ? 1 : 2]++;
    self->n++;
    return 0;
}

static Layout *as_layout(PyObject *o, Columns *self) {
    if (!PyObject_TypeCheck(o, &BinlogLayoutType)) {
        PyErr_SetString(PyExc_TypeError, "a Layout is required");
        return NULL;
    }
    if (((Layout *)o)->ncols != self->ncols) {
        PyErr_SetString(PyExc_ValueError, "the Layout is of another table structure");
        return NULL;
    }
    return (Layout *)o;
}

/* add(body, offset, op, layout, after_layout, pos, info, file_key) -> events appended */
static PyObject *Columns_add(Columns *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t o;
    int op, info;
    unsigned int pos;
    unsigned long long file_key;
    PyObject *first, *second;
    if (!PyArg_ParseTuple(args, "y*nCOOIiK", &buf, &o, &op, &first, &second, &pos, &info, &file_key))
        return NULL;
    Layout *la = as_layout(first, self), *lb = NULL;
    Py_ssize_t start = self->n;
    if (!la) goto fail;
    if (op == 'u' && !(lb = as_layout(second == Py_None ? first : second, self))) goto fail;
    if (op != 'c' && op != 'u' && op != 'd') { PyErr_SetString(PyExc_ValueError, "op must be c, u or d"); goto fail; }
    if (o < 0) { PyErr_SetString(PyExc_ValueError, "negative offset"); goto fail; }
    const uint8_t *d = buf.buf;
    Py_ssize_t len = buf.len;
    int32_t row = 0;
    uint32_t n = 0;
    while (o < len) {
        if (parse_image(la, d, len, &o, self->slots_a, self->ncols) < 0) goto fail;
        if (op == 'c') {
            if (emit(self, 'c', NULL, self->slots_a, d, len, file_key, pos, row, n++, info) < 0) goto fail;
        } else if (op == 'd') {
            if (emit(self, 'd', self->slots_a, NULL, d, len, file_key, pos, row, n++, info) < 0) goto fail;
        } else {
            if (parse_image(lb, d, len, &o, self->slots_b, self->ncols) < 0) goto fail;
            int changed = 0;
            for (int k = 0; k < self->nkeys && !changed; k++) {
                changed = key_differs(self, self->keys[k], d, len);
                if (changed < 0) goto fail;
            }
            if (changed) {
                if (emit(self, 'd', self->slots_a, NULL, d, len, file_key, pos, row, n, info) < 0) goto fail;
                if (emit(self, 'c', self->slots_a, self->slots_b, d, len, file_key, pos, row, n + 1, info) < 0)
                    goto fail;
                n += 2;
            } else if (emit(self, 'u', self->slots_a, self->slots_b, d, len, file_key, pos, row, n++, info) < 0) {
                goto fail;
            }
        }
        row++;
    }
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(self->n - start);
fail:
    PyBuffer_Release(&buf);
    return NULL;
}

/* Hand a buffer's bytes over as a Chunk and start it again, as large as it grew (no copy). */
static PyObject *bytes_of(Buf *b) {
    if (!b->p && grow(b, 1) < 0) return NULL;
    char *fresh = malloc(b->cap);
    if (!fresh) return PyErr_NoMemory();
    Chunk *c = PyObject_New(Chunk, &ChunkType);
    if (!c) { free(fresh); return NULL; }
    c->p = b->p;
    c->len = b->len;
    b->p = fresh;
    b->len = 0;
    return (PyObject *)c;
}

static void builder_reset(Builder *b) {
    b->valid.len = b->data.len = b->offsets.len = 0;
    b->nulls = 0;
    if (b->mode == M_BYTES) { int32_t z = 0; put(&b->offsets, &z, 4); } /* capacity kept: cannot fail */
}

/* One image side: (present bitmap, [(validity or None, data bytes or list, offsets or None), ...]),
 * or (present bitmap, None) when no event of the piece has this image. */
static PyObject *take_image(Columns *self, Builder *bs, Buf *present, Py_ssize_t *filled) {
    if (*filled == 0) {
        PyObject *out = Py_BuildValue("(NO)", bytes_of(present), Py_None);
        present->len = 0;
        return out;
    }
    if (backfill(self, bs, filled, self->n) < 0) return NULL;
    *filled = 0;
    PyObject *cols = PyList_New(self->nsel);
    if (!cols) return NULL;
    for (int j = 0; j < self->nsel; j++) {
        Builder *b = &bs[j];
        PyObject *t;
        if (b->mode == M_OBJECT) {
            PyObject *fresh = PyList_New(0);
            if (!fresh) { Py_DECREF(cols); return NULL; }
            t = Py_BuildValue("(OOO)", Py_None, b->list, Py_None);
            Py_DECREF(b->list);
            b->list = fresh;
        } else {
            PyObject *valid = b->nulls ? bytes_of(&b->valid) : (Py_INCREF(Py_None), Py_None);
            PyObject *offsets = b->mode == M_BYTES ? bytes_of(&b->offsets) : (Py_INCREF(Py_None), Py_None);
            t = Py_BuildValue("(NNN)", valid, bytes_of(&b->data), offsets);
            builder_reset(b);
        }
        if (!t) { Py_DECREF(cols); return NULL; }
        PyList_SET_ITEM(cols, j, t);
    }
    PyObject *out = Py_BuildValue("(NN)", bytes_of(present), cols);
    present->len = 0;
    return out;
}

/* take() -> (n, {op: count}, ops, positions, pos, row, info, before, after): the piece's buffers
 * (ops one byte each; positions 16 bytes each; pos int64, row and info int32), then a new piece. */
static PyObject *Columns_take(Columns *self, PyObject *unused) {
    PyObject *counts = Py_BuildValue("{sn,sn,sn}", "c", self->counts[0], "u", self->counts[1], "d", self->counts[2]);
    if (!counts) return NULL;
    PyObject *before = take_image(self, self->before, &self->present_b, &self->filled_b);
    PyObject *after = before ? take_image(self, self->after, &self->present_a, &self->filled_a) : NULL;
    if (!after) { Py_DECREF(counts); Py_XDECREF(before); return NULL; }
    PyObject *out = Py_BuildValue("(nNNNNNNNN)", self->n, counts, bytes_of(&self->ops), bytes_of(&self->positions),
                                  bytes_of(&self->pos), bytes_of(&self->row), bytes_of(&self->info), before, after);
    self->n = self->nbytes = 0;
    self->counts[0] = self->counts[1] = self->counts[2] = 0;
    self->ops.len = self->positions.len = self->pos.len = self->row.len = self->info.len = 0;
    return out;
}

static void free_builders(Builder *bs, int n) {
    if (!bs) return;
    for (int j = 0; j < n; j++) {
        Py_XDECREF(bs[j].list);
        buf_free(&bs[j].valid); buf_free(&bs[j].data); buf_free(&bs[j].offsets);
    }
    PyMem_Free(bs);
}

static void Columns_clear(Columns *self) {
    if (self->cols) {
        for (int i = 0; i < self->ncols; i++) Py_XDECREF(self->cols[i].json);
        PyMem_Free(self->cols);
    }
    free_builders(self->before, self->nsel);
    free_builders(self->after, self->nsel);
    PyMem_Free(self->keys); PyMem_Free(self->slots_a); PyMem_Free(self->slots_b);
    buf_free(&self->ops); buf_free(&self->present_b); buf_free(&self->present_a);
    buf_free(&self->positions); buf_free(&self->pos); buf_free(&self->row); buf_free(&self->info);
    self->cols = NULL; self->before = self->after = NULL; self->keys = NULL;
    self->slots_a = self->slots_b = NULL;
    self->ncols = self->nsel = self->nkeys = 0;
}

static void Columns_dealloc(Columns *self) {
    Columns_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int valid_mode(const Col *c, int mode) {
    switch (mode) {
    case M_OBJECT: return 1;
    case M_INT: return is_int_type(c->type) || c->type == T_BIT;
    case M_FLOAT: return c->type == T_FLOAT || c->type == T_DOUBLE;
    case M_DECIMAL: return c->type == T_NEWDECIMAL && (c->meta >> 8) <= 38 && c->size <= 32;
    case M_BYTES: return binlog_is_variable(c->type) && !c->json;
    case M_DATETIME: return c->type == T_DATETIME2;
    }
    return 0;
}

static int init_builder(Builder *b, const Col *c, PyObject *spec) {
    PyObject *zero = Py_None;
    int adjust = 0;
    b->col = *c; /* its json callable is borrowed from the Columns' own column */
    b->divisor = 1;
    if (!PyArg_ParseTuple(spec, "i|LOp", &b->mode, &b->divisor, &zero, &adjust)) return -1;
    if (!valid_mode(c, b->mode)) {
        PyErr_Format(PyExc_NotImplementedError, "column %d (type %d): mode %d does not apply", c->index, c->type, b->mode);
        return -1;
    }
    if (b->divisor < 1) { PyErr_SetString(PyExc_ValueError, "divisor must be positive"); return -1; }
    b->adjust = adjust;
    b->limit = 1;
    for (int k = 0; b->mode == M_DECIMAL && k < (c->meta >> 8); k++) b->limit *= 10;
    b->zero_null = zero == Py_None;
    if (!b->zero_null) {
        b->zero = PyLong_AsLongLong(zero);
        if (b->zero == -1 && PyErr_Occurred()) return -1;
    }
    if (b->mode == M_OBJECT && !(b->list = PyList_New(0))) return -1;
    builder_reset(b);
    return PyErr_Occurred() ? -1 : 0;
}

/* Columns(columns, select, modes, key_index); NotImplementedError for a column type or mode it
 * does not handle (the caller then builds events as tuples). */
static int Columns_init(Columns *self, PyObject *args, PyObject *kw) {
    PyObject *columns, *select, *modes, *keys;
    if (!PyArg_ParseTuple(args, "OOOO", &columns, &select, &modes, &keys)) return -1;
    Columns_clear(self);
    PyObject *cs = PySequence_Fast(columns, "columns must be a sequence");
    PyObject *ss = cs ? PySequence_Fast(select, "select must be a sequence") : NULL;
    PyObject *ms = ss ? PySequence_Fast(modes, "modes must be a sequence") : NULL;
    PyObject *ks = ms ? PySequence_Fast(keys, "key_index must be a sequence") : NULL;
    if (!ks) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(cs), nsel = PySequence_Fast_GET_SIZE(ss);
    Py_ssize_t nkeys = PySequence_Fast_GET_SIZE(ks);
    if (PySequence_Fast_GET_SIZE(ms) != nsel) { PyErr_SetString(PyExc_ValueError, "one mode per selected column"); goto fail; }
    self->cols = PyMem_Calloc(n ? n : 1, sizeof(Col));
    self->before = PyMem_Calloc(nsel ? nsel : 1, sizeof(Builder));
    self->after = PyMem_Calloc(nsel ? nsel : 1, sizeof(Builder));
    self->keys = PyMem_Calloc(nkeys ? nkeys : 1, sizeof(int));
    self->slots_a = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    self->slots_b = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    if (!self->cols || !self->before || !self->after || !self->keys || !self->slots_a || !self->slots_b) {
        PyErr_NoMemory();
        goto fail;
    }
    self->ncols = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        Col *c = &self->cols[i];
        PyObject *json = Py_None;
        int uns = 0;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(cs, i), "ii|pO", &c->type, &c->meta, &uns, &json)) goto fail;
        c->index = (int)i;
        c->is_unsigned = uns;
        if (c->type == T_JSON && json != Py_None) { Py_INCREF(json); c->json = json; }
        c->size = binlog_col_size(c);
        if (c->size < 0 || (c->type == T_NEWDECIMAL && c->size > 64)) {
            PyErr_Format(PyExc_NotImplementedError, "binlog column type %d (metadata %d) is not supported",
                         c->type, c->meta);
            goto fail;
        }
    }
    self->nsel = (int)nsel;
    for (Py_ssize_t j = 0; j < nsel; j++) {
        Py_ssize_t k = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(ss, j));
        if (k == -1 && PyErr_Occurred()) goto fail;
        if (k < 0 || k >= n) { PyErr_SetString(PyExc_IndexError, "selected column out of range"); goto fail; }
        PyObject *spec = PySequence_Fast_GET_ITEM(ms, j);
        if (init_builder(&self->before[j], &self->cols[k], spec) < 0) goto fail;
        if (init_builder(&self->after[j], &self->cols[k], spec) < 0) goto fail;
    }
    self->nkeys = (int)nkeys;
    for (Py_ssize_t j = 0; j < nkeys; j++) {
        Py_ssize_t k = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(ks, j));
        if (k == -1 && PyErr_Occurred()) goto fail;
        if (k < 0 || k >= n) { PyErr_SetString(PyExc_IndexError, "key column index out of range"); goto fail; }
        self->keys[j] = (int)k;
    }
    Py_DECREF(cs); Py_DECREF(ss); Py_DECREF(ms); Py_DECREF(ks);
    return 0;
fail:
    Py_XDECREF(cs); Py_XDECREF(ss); Py_XDECREF(ms); Py_XDECREF(ks);
    Columns_clear(self);
    return -1;
}

static PyObject *Columns_len(Columns *self, void *unused) { return PyLong_FromSsize_t(self->n); }
static PyObject *Columns_nbytes(Columns *self, void *unused) { return PyLong_FromSsize_t(self->nbytes); }

static PyGetSetDef Columns_getset[] = {
    {"events", (getter)Columns_len, NULL, "events buffered", NULL},
    {"text_bytes", (getter)Columns_nbytes, NULL, "string and blob bytes buffered", NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PyMethodDef Columns_methods[] = {
    {"add", (PyCFunction)Columns_add, METH_VARARGS,
     "add(body, offset, op, layout, after_layout, pos, info, file_key) -> events appended"},
    {"take", (PyCFunction)Columns_take, METH_NOARGS,
     "take() -> (n, counts, ops, positions, pos, row, info, before, after); starts a new piece"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject ColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "airflow_cdc.sources.mysql._binlogrows.Columns",
    .tp_basicsize = sizeof(Columns),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Change events of one table structure read into Arrow column buffers",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Columns_init,
    .tp_dealloc = (destructor)Columns_dealloc,
    .tp_methods = Columns_methods,
    .tp_getset = Columns_getset,
};

int binlogcols_add_types(PyObject *m) {
    if (PyType_Ready(&ChunkType) < 0 || PyType_Ready(&ColumnsType) < 0) return -1;
    Py_INCREF(&ColumnsType);
    if (PyModule_AddObject(m, "Columns", (PyObject *)&ColumnsType) < 0) {
        Py_DECREF(&ColumnsType);
        return -1;
    }
    return 0;
}
