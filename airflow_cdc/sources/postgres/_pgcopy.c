/*
 * Snapshot chunk reader: ``COPY (SELECT ...) TO STDOUT`` (text format) straight into Arrow
 * string columns.
 *
 * The COPY is started by psycopg; read() then drains its CopyData messages with libpq's own
 * PQgetCopyData (the library psycopg uses, its address handed over by copyread.py) in one C loop,
 * with the GIL released, and unescapes each row's tab-separated fields into per-column Arrow
 * buffers (int32 offsets, UTF-8 bytes, validity bitmap; ``\N`` is NULL).  The values are the
 * server's text output, exactly what the CSV path and the pgoutput decoder hand to the codecs.
 *
 * Contract (see copyread.py, the only user):
 *   read(conn, getcopydata, freemem, ncols, max_bytes) -> (status, nrows, columns)
 *   - conn: the PGconn address; getcopydata/freemem: addresses of PQgetCopyData and PQfreemem of
 *     the libpq that owns conn; ncols: fields per row; max_bytes: return once this many value
 *     bytes are buffered (the caller calls again for the rest: bounds memory per piece and keeps
 *     offsets within int32).
 *   - status 1: the COPY ended (PQgetCopyData returned -1; the caller fetches the final result);
 *     0: max_bytes reached, more rows follow; -2: libpq reported an error (the caller raises
 *     with the connection's error message); -3: a row did not have ncols fields (a bug, never
 *     server data: the caller raises).
 *   - columns: one (offsets, data, validity or None) triple per column, nrows rows: read-only
 *     buffer objects that own the buffers the rows were unescaped into (no copy into bytes: that
 *     copy and the page faults of its fresh memory were ~2 % of a snapshot's client CPU).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int (*GetCopyData)(void *conn, char **buffer, int async);
typedef void (*FreeMem)(void *ptr);

typedef struct {
    char *data;
    size_t len, cap;
    int32_t *offsets; /* nrows + 1 */
    uint8_t *valid;   /* bitmap, allocated lazily at the first NULL */
    int64_t nulls;
} Column;

typedef struct {
    Column *cols;
    int ncols;
    int64_t nrows, cap_rows;
    size_t bytes;
} Columns;

/* A read-only buffer owning malloc'ed memory: hands a column buffer to Arrow (pa.py_buffer keeps
 * this object alive as long as the array) without copying it. */
typedef struct {
    PyObject_HEAD
    char *ptr;
    Py_ssize_t len;
} OwnedBuffer;

static void
owned_dealloc(OwnedBuffer *self)
{
    free(self->ptr);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
owned_getbuffer(OwnedBuffer *self, Py_buffer *view, int flags)
{
    static char empty[1];
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr ? self->ptr : empty, self->len, 1, flags);
}

static PyBufferProcs owned_as_buffer = {(getbufferproc)owned_getbuffer, NULL};

static PyTypeObject OwnedBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "airflow_cdc.sources.postgres._pgcopy.Buffer",
    .tp_basicsize = sizeof(OwnedBuffer),
    .tp_dealloc = (destructor)owned_dealloc,
    .tp_as_buffer = &owned_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A read-only buffer of a column read by read(); frees its memory when collected.",
};

/* A buffer object taking over *ptr (its first len bytes; the rest of the allocation is given
 * back); *ptr is NULL afterwards, so free_columns leaves it alone.  NULL on failure, *ptr kept. */
static PyObject *
take_buffer(void **ptr, size_t len)
{
    OwnedBuffer *b = PyObject_New(OwnedBuffer, &OwnedBufferType);
    if (b == NULL)
        return NULL;
    char *p = *ptr;
    if (p != NULL && len > 0) {
        char *shrunk = realloc(p, len); /* in place, or mremap for large blocks: no copy */
        if (shrunk != NULL)
            p = shrunk;
    }
    b->ptr = p;
    b->len = (Py_ssize_t)len;
    *ptr = NULL;
    return (PyObject *)b;
}

static int
grow_rows(Columns *c)
{
    int64_t cap = c->cap_rows ? c->cap_rows * 2 : 1024;
    for (int i = 0; i < c->ncols; i++) {
        Column *col = &c->cols[i];
        int32_t *off = realloc(col->offsets, (size_t)(cap + 1) * sizeof(int32_t));
        if (off == NULL)
            return -1;
        col->offsets = off;
        if (col->valid != NULL) {
            uint8_t *v = realloc(col->valid, (size_t)(cap + 7) / 8);
            if (v == NULL)
                return -1;
            memset(v + (c->cap_rows + 7) / 8, 0xFF, (size_t)((cap + 7) / 8 - (c->cap_rows + 7) / 8));
            col->valid = v;
        }
    }
    c->cap_rows = cap;
    return 0;
}

static int
reserve(Column *col, size_t extra)
{
    if (col->len + extra <= col->cap)
        return 0;
    size_t cap = col->cap ? col->cap : 4096;
    while (cap < col->len + extra)
        cap *= 2;
    char *d = realloc(col->data, cap);
    if (d == NULL)
        return -1;
    col->data = d;
    col->cap = cap;
    return 0;
}

static int
set_null(Columns *c, Column *col, int64_t row)
{
    if (col->valid == NULL) {
        col->valid = malloc((size_t)(c->cap_rows + 7) / 8);
        if (col->valid == NULL)
            return -1;
        memset(col->valid, 0xFF, (size_t)(c->cap_rows + 7) / 8);
    }
    col->valid[row / 8] &= (uint8_t) ~(1u << (row % 8));
    col->nulls++;
    return 0;
}

static int
hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Unescape one text-format field [p, end) into col (COPY FROM's rules: \b \f \n \r \t \v,
 * \digits octal, \xhex, any other escaped character stands for itself). */
static int
put_field(Column *col, const char *p, const char *end)
{
    if (reserve(col, (size_t)(end - p)) < 0)
        return -1;
    char *out = col->data + col->len;
    while (p < end) {
        const char *bs = memchr(p, '\\', (size_t)(end - p));
        const char *stop = bs ? bs : end;
        memcpy(out, p, (size_t)(stop - p));
        out += stop - p;
        p = stop;
        if (bs == NULL || p + 1 >= end) {
            if (bs != NULL)
                *out++ = *p++; /* a trailing lone backslash: keep it */
            break;
        }
        char ch = p[1];
        p += 2;
        switch (ch) {
        case 'b': *out++ = '\b'; break;
        case 'f': *out++ = '\f'; break;
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        case 'v': *out++ = '\v'; break;
        case 'x': {
            int v = p < end ? hexval(*p) : -1;
            if (v < 0) {
                *out++ = 'x';
                break;
            }
            p++;
            int w = p < end ? hexval(*p) : -1;
            if (w >= 0) {
                v = v * 16 + w;
                p++;
            }
            *out++ = (char)v;
            break;
        }
        default:
            if (ch >= '0' && ch <= '7') {
                int v = ch - '0';
                for (int k = 0; k < 2 && p < end && *p >= '0' && *p <= '7'; k++)
                    v = v * 8 + (*p++ - '0');
                *out++ = (char)(v & 0xFF);
            } else {
                *out++ = ch;
            }
        }
    }
    col->len = (size_t)(out - col->data);
    return 0;
}

/* Split one row (a CopyData message, ending in a newline) into the columns; -3: field count. */
static int
put_row(Columns *c, const char *buf, int n)
{
    if (c->nrows == c->cap_rows && grow_rows(c) < 0)
        return -1;
    const char *p = buf, *end = buf + n;
    if (end > p && end[-1] == '\n')
        end--;
    int64_t row = c->nrows;
    size_t before = 0;
    for (int i = 0; i < c->ncols; i++) {
        Column *col = &c->cols[i];
        const char *tab = memchr(p, '\t', (size_t)(end - p));
        const char *stop = tab ? tab : end;
        if ((tab == NULL) != (i == c->ncols - 1))
            return -3;
        before += col->len;
        if (stop - p == 2 && p[0] == '\\' && p[1] == 'N') {
            if (set_null(c, col, row) < 0)
                return -1;
        } else if (put_field(col, p, stop) < 0) {
            return -1;
        }
        if (col->len > INT32_MAX)
            return -1;
        col->offsets[row + 1] = (int32_t)col->len;
        p = stop + 1;
    }
    size_t after = 0;
    for (int i = 0; i < c->ncols; i++)
        after += c->cols[i].len;
    c->bytes += after - before;
    c->nrows++;
    return 0;
}

static void
free_columns(Columns *c)
{
    for (int i = 0; i < c->ncols; i++) {
        free(c->cols[i].data);
        free(c->cols[i].offsets);
        free(c->cols[i].valid);
    }
    free(c->cols);
}

static PyObject *
build_result(int status, Columns *c)
{
    PyObject *cols = PyList_New(c->ncols);
    if (cols == NULL)
        return NULL;
    for (int i = 0; i < c->ncols; i++) {
        Column *col = &c->cols[i];
        PyObject *valid = Py_None;
        Py_INCREF(Py_None);
        if (col->nulls > 0) {
            Py_DECREF(Py_None);
            valid = take_buffer((void **)&col->valid, (size_t)(c->nrows + 7) / 8);
        }
        PyObject *offsets = take_buffer((void **)&col->offsets, (size_t)(c->nrows + 1) * sizeof(int32_t));
        PyObject *data = take_buffer((void **)&col->data, col->len);
        PyObject *item = NULL;
        if (valid != NULL && offsets != NULL && data != NULL)
            item = PyTuple_Pack(3, offsets, data, valid);
        Py_XDECREF(valid);
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        if (item == NULL) {
            Py_DECREF(cols);
            return NULL;
        }
        PyList_SET_ITEM(cols, i, item);
    }
    return Py_BuildValue("(iLN)", status, (long long)c->nrows, cols);
}

static PyObject *
pgcopy_read(PyObject *self, PyObject *args)
{
    unsigned long long conn_addr, get_addr, free_addr;
    int ncols;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "KKKin", &conn_addr, &get_addr, &free_addr, &ncols, &max_bytes))
        return NULL;
    if (conn_addr == 0 || get_addr == 0 || free_addr == 0 || ncols < 1 || max_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "read(): null address, no columns or max_bytes < 1");
        return NULL;
    }
    void *conn = (void *)(uintptr_t)conn_addr;
    GetCopyData get = (GetCopyData)(uintptr_t)get_addr;
    FreeMem freemem = (FreeMem)(uintptr_t)free_addr;
    Columns c = {0};
    c.ncols = ncols;
    c.cols = calloc((size_t)ncols, sizeof(Column));
    if (c.cols == NULL || grow_rows(&c) < 0) {
        free_columns(&c);
        return PyErr_NoMemory();
    }
    for (int i = 0; i < ncols; i++)
        c.cols[i].offsets[0] = 0;
    int status = 0, failed = 0;
    Py_BEGIN_ALLOW_THREADS
    while ((size_t)max_bytes > c.bytes) {
        char *buf = NULL;
        int n = get(conn, &buf, 0);
        if (n == -1) {
            status = 1;
            break;
        }
        if (n < 0) {
            status = -2;
            break;
        }
        int rc = put_row(&c, buf, n);
        freemem(buf);
        if (rc == -3) {
            status = -3;
            break;
        }
        if (rc < 0) {
            failed = 1;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        free_columns(&c);
        PyErr_SetString(PyExc_MemoryError, "COPY chunk: out of memory or a column above 2 GiB");
        return NULL;
    }
    PyObject *res = build_result(status, &c);
    free_columns(&c);
    return res;
}


/*
 * pairs(conn, getcopydata, freemem, max_rows, header) -> (status, rows): the change window's
 * ``COPY (SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(...)) TO STDOUT (FORMAT
 * binary)`` as the list of (lsn, data) tuples the pgoutput decoder is fed -- what a binary cursor's
 * fetchmany() returns, without psycopg's per-row machinery and without a FETCH round trip per
 * batch.  The server sends one CopyData message per row (the first one led by the binary COPY
 * header, which ``header`` says to expect; the last message is the -1 trailer).  The messages are
 * collected with the GIL released, then turned into objects.  Status as read(); -3: a message
 * that is not a (bigint, non-NULL bytea) row, the header or the trailer.
 */
typedef struct {
    char *msg;  /* libpq's buffer, freed with freemem */
    const char *data;
    int64_t lsn;
    int32_t len;
} Pair;

static int64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static int32_t
be32s(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

static const unsigned char COPY_SIGNATURE[11] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xff, '\r', '\n', 0};

/* Parse one message into *pair: 1 a row, 0 the trailer, -3 anything else. */
static int
parse_pair(char *msg, int n, int *header, Pair *pair)
{
    const unsigned char *p = (const unsigned char *)msg, *end = p + n;
    if (*header) {
        if (n < 19 || memcmp(p, COPY_SIGNATURE, 11) != 0)
            return -3;
        int32_t ext = be32s(p + 15);
        if (ext < 0 || ext > n - 19)
            return -3;
        p += 19 + ext;
        *header = 0;
    }
    if (end - p < 2)
        return -3;
    int16_t fields = (int16_t)((p[0] << 8) | p[1]);
    p += 2;
    if (fields == -1)
        return p == end ? 0 : -3;
    if (fields != 2 || end - p < 4 + 8 + 4 || be32s(p) != 8)
        return -3;
    pair->lsn = be64(p + 4);
    p += 12;
    int32_t len = be32s(p);
    p += 4;
    if (len < 0 || len != end - p)
        return -3;
    pair->msg = msg;
    pair->data = (const char *)p;
    pair->len = len;
    return 1;
}

static PyObject *
pgcopy_pairs(PyObject *self, PyObject *args)
{
    unsigned long long conn_addr, get_addr, free_addr;
    Py_ssize_t max_rows;
    int header;
    if (!PyArg_ParseTuple(args, "KKKnp", &conn_addr, &get_addr, &free_addr, &max_rows, &header))
        return NULL;
    if (conn_addr == 0 || get_addr == 0 || free_addr == 0 || max_rows < 1) {
        PyErr_SetString(PyExc_ValueError, "pairs(): null address or max_rows < 1");
        return NULL;
    }
    void *conn = (void *)(uintptr_t)conn_addr;
    GetCopyData get = (GetCopyData)(uintptr_t)get_addr;
    FreeMem freemem = (FreeMem)(uintptr_t)free_addr;
    Pair *pairs = malloc(sizeof(Pair) * (size_t)max_rows);
    if (pairs == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = 0;
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    while (n < max_rows) {
        char *buf = NULL;
        int len = get(conn, &buf, 0);
        if (len == -1) {
            status = 1;
            break;
        }
        if (len < 0) {
            status = -2;
            break;
        }
        int rc = parse_pair(buf, len, &header, &pairs[n]);
        if (rc == 1) {
            n++;
            continue;
        }
        freemem(buf);
        if (rc < 0) {
            status = -3;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (list != NULL) {
            PyObject *lsn = PyLong_FromLongLong(pairs[i].lsn);
            PyObject *data = PyBytes_FromStringAndSize(pairs[i].data, pairs[i].len);
            PyObject *row = (lsn && data) ? PyTuple_Pack(2, lsn, data) : NULL;
            Py_XDECREF(lsn);
            Py_XDECREF(data);
            if (row == NULL)
                Py_CLEAR(list);
            else
                PyList_SET_ITEM(list, i, row);
        }
        freemem(pairs[i].msg);
    }
    free(pairs);
    if (list == NULL)
        return NULL;
    return Py_BuildValue("(iN)", status, list);
}

/*
 * zoned_iso(offsets, data, valid, offset, n, precision) -> (offsets, data, valid): the
 * ``timestamptz`` text output in its common shape, ``YYYY-MM-DD HH:MM:SS[.f{1,6}]+00``, as
 * Debezium's ZonedTimestamp string ``YYYY-MM-DDTHH:MM:SS[.f{precision}]Z`` (exactly
 * ``precision`` fraction digits, none when 0).  The input is an Arrow string array's buffers
 * (``offset``: the array's offset, ``n`` its length, ``valid`` None when it has no nulls); every
 * row not in that shape (NULL, infinity, BC, other offsets) is NULL in the result, for the
 * row-by-row path of types_temporal.py.  The same result as that module's string kernels,
 * in one pass with the GIL released.
 */
static int
is_digits(const char *p, int n)
{
    for (int i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return 1;
}

/* Length of the ZonedTimestamp written to out (room for 27 bytes), or 0: not the common shape. */
static int
zoned_one(const char *s, int32_t len, int digits, char *out)
{
    /* "YYYY-MM-DD HH:MM:SS" (19) [".f{1,6}"] "+00" */
    if (len < 22 || s[len - 3] != '+' || s[len - 2] != '0' || s[len - 1] != '0')
        return 0;
    if (!is_digits(s, 4) || s[4] != '-' || !is_digits(s + 5, 2) || s[7] != '-' || !is_digits(s + 8, 2)
        || s[10] != ' ' || !is_digits(s + 11, 2) || s[13] != ':' || !is_digits(s + 14, 2) || s[16] != ':'
        || !is_digits(s + 17, 2))
        return 0;
    int frac = len - 3 - 19; /* ".f..." or nothing */
    if (frac != 0 && (frac < 2 || frac > 7 || s[19] != '.' || !is_digits(s + 20, frac - 1)))
        return 0;
    memcpy(out, s, 19);
    out[10] = 'T';
    int k = 19;
    if (digits > 0) {
        out[k++] = '.';
        for (int i = 0; i < digits; i++)
            out[k++] = i < frac - 1 ? s[20 + i] : '0';
    }
    out[k++] = 'Z';
    return k;
}

static PyObject *
pgcopy_zoned_iso(PyObject *self, PyObject *args)
{
    Py_buffer offs, data, valid = {0};
    PyObject *valid_obj;
    Py_ssize_t offset, n;
    int precision;
    if (!PyArg_ParseTuple(args, "y*y*Onni", &offs, &data, &valid_obj, &offset, &n, &precision))
        return NULL;
    PyObject *res = NULL;
    int has_valid = valid_obj != Py_None;
    if (has_valid && PyObject_GetBuffer(valid_obj, &valid, PyBUF_SIMPLE) < 0)
        goto done;
    if (offset < 0 || n < 0 || offs.len < (offset + n + 1) * (Py_ssize_t)sizeof(int32_t)
        || (has_valid && valid.len * 8 < offset + n)) {
        PyErr_SetString(PyExc_ValueError, "zoned_iso(): buffers shorter than the array");
        goto done;
    }
    const int32_t *in_off = (const int32_t *)offs.buf + offset;
    if (n > 0 && (in_off[0] < 0 || in_off[n] > data.len || in_off[n] < in_off[0])) {
        PyErr_SetString(PyExc_ValueError, "zoned_iso(): offsets outside the data buffer");
        goto done;
    }
    int digits = precision <= 0 ? 0 : (precision > 6 ? 6 : precision);
    size_t width = (size_t)(20 + (digits ? digits + 1 : 0));
    if ((size_t)n > (size_t)INT32_MAX / width) {
        PyErr_SetString(PyExc_ValueError, "zoned_iso(): array too long");
        goto done;
    }
    PyObject *o = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *d = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * width));
    PyObject *v = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (o == NULL || d == NULL || v == NULL) {
        Py_XDECREF(o);
        Py_XDECREF(d);
        Py_XDECREF(v);
        goto done;
    }
    int32_t *out_off = (int32_t *)PyBytes_AS_STRING(o);
    char *out = PyBytes_AS_STRING(d);
    uint8_t *out_valid = (uint8_t *)PyBytes_AS_STRING(v);
    const uint8_t *in_valid = has_valid ? (const uint8_t *)valid.buf : NULL;
    const char *in = (const char *)data.buf;
    Py_ssize_t nulls = 0;
    Py_BEGIN_ALLOW_THREADS
    memset(out_valid, 0, (size_t)(n + 7) / 8);
    int32_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        out_off[i] = pos;
        Py_ssize_t bit = offset + i;
        int k = 0;
        if (in_valid == NULL || (in_valid[bit >> 3] >> (bit & 7)) & 1) {
            int32_t start = in_off[i], end = in_off[i + 1];
            if (end >= start)
                k = zoned_one(in + start, end - start, digits, out + pos);
        }
        if (k > 0) {
            out_valid[i >> 3] |= (uint8_t)(1u << (i & 7));
            pos += k;
        } else {
            nulls++;
        }
    }
    out_off[n] = pos;
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("(NNNn)", o, d, v, nulls);
done:
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    if (has_valid && valid.obj != NULL)
        PyBuffer_Release(&valid);
    return res;
}

static PyMethodDef methods[] = {
    {"read", pgcopy_read, METH_VARARGS,
     "read(conn, getcopydata, freemem, ncols, max_bytes) -> (status, nrows, columns): drain a\n"
     "text-format COPY TO STDOUT into Arrow string buffers (see the module comment)."},
    {"pairs", pgcopy_pairs, METH_VARARGS,
     "pairs(conn, getcopydata, freemem, max_rows, header) -> (status, rows): a binary COPY of\n"
     "(bigint, bytea) rows as a list of (int, bytes) tuples (see the comment above it)."},
    {"zoned_iso", pgcopy_zoned_iso, METH_VARARGS,
     "zoned_iso(offsets, data, valid, offset, n, precision) -> (offsets, data, valid, nulls):\n"
     "timestamptz text output (+00) as ZonedTimestamp strings, NULL where not in the common shape."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pgcopy", "COPY TO STDOUT (text format) straight into Arrow string columns.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__pgcopy(void)
{
    if (PyType_Ready(&OwnedBufferType) < 0)
        return NULL;
    return PyModule_Create(&module);
}
