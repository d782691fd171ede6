/*
 * Compiled reader of one change window over the streaming replication protocol (see walstream.py).
 *
 * It takes over the socket of a ``replication=database`` connection that libpq has opened and
 * authenticated (plain TCP or Unix socket, never TLS or GSSAPI encryption: the caller checks),
 * sends ``START_REPLICATION`` itself, and reads the CopyBoth stream in large buffers, splitting
 * the frames ('d' CopyData holding 'w' XLogData or 'k' keepalive; 'E' ErrorResponse) in C.
 * Python sees only batches of ``(lsn, payload)`` tuples, the shape the columnar decoder eats.
 *
 * Contract (mirrors ReplicationStream.batches/_messages/_status of the pure-Python reader, which
 * stays the reference; tests compare both):
 *   - the window holds every transaction whose commit record starts below ``upto``: a Begin whose
 *     final LSN is at or past it, or a non-transactional message at or past it, ends the window
 *     unread; a Commit whose end reaches it is the last message read; a keepalive whose sent
 *     position reaches it ends the window between transactions;
 *   - after a Commit or non-transactional message at which ``max_events`` messages have been
 *     read, the window ends (``bounded``);
 *   - protocol 2 streaming: a Stream Commit whose commit LSN is at or past ``upto`` ends the
 *     window unread, one whose end reaches it is the last; it ends a transaction like a Commit
 *     (also for ``max_events``); between Stream Start and Stream Stop a keepalive never ends the
 *     window and a logical message is transactional (its xid comes first);
 *   - every standby status update reports ``from_lsn`` (the committed offset) as written,
 *     flushed and applied position, never more; keepalives asking for a reply are answered at
 *     once, an idle server (nothing for ``idle_probe`` seconds) is asked for a keepalive, and an
 *     unsolicited update goes out every ``status_interval`` seconds;
 *   - a batch is handed over at ``batch_rows`` messages, or at a quarter of that when nothing
 *     more has arrived yet (Python decodes while the server catches up).
 * Bounds are checked before every read; a malformed frame raises StreamError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define PG_EPOCH_US 946684800000000LL
#define MIN_BUF (1 << 20)
/* PostgreSQL sends no message larger than 1 GB (MaxAllocSize): a longer length is damage. */
#define MAX_MESSAGE 0x40000000u

static PyObject *StreamError;

typedef struct {
    PyObject_HEAD
    int fd;
    uint64_t from_lsn, upto;
    Py_ssize_t max_events, batch_rows;
    double idle_probe, status_interval, last_status;
    unsigned char *buf;
    Py_ssize_t cap, pos, have;
    int in_txn, in_stream, done, started, bounded;
    Py_ssize_t messages, stream_messages, statuses;
    int64_t reported;
    PyObject *on_status;
} Reader;

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t
be64(const unsigned char *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static inline void
put64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)(v & 0xFF);
}

static double
monotonic(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static PyObject *
fail(const char *sqlstate, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    /* the server's texts need not be UTF-8 (nor our quoted bytes): decoded with replacement */
    PyObject *exc = Py_BuildValue("(NN)", PyUnicode_DecodeUTF8(sqlstate, strlen(sqlstate), "replace"),
                                  PyUnicode_DecodeUTF8(text, strlen(text), "replace"));
    if (exc != NULL) {
        PyErr_SetObject(StreamError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Wait for ``events`` on the socket for at most ``seconds`` (GIL released): 1 ready, 0 timed out,
 * -1 with a Python exception set (a signal handler raised, or poll failed). */
static int
wait_fd(Reader *r, short events, double seconds)
{
    for (;;) {
        struct pollfd p = {r->fd, events, 0};
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = poll(&p, 1, (int)(seconds * 1000));
        Py_END_ALLOW_THREADS
        if (rc >= 0)
            return rc > 0;
        if (errno != EINTR) {
            fail("", "poll on the replication socket failed: %s", strerror(errno));
            return -1;
        }
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

/* Send all of ``data`` on the non-blocking socket (waits while the socket buffer is full). */
static int
send_all(Reader *r, const unsigned char *data, Py_ssize_t len)
{
    double deadline = monotonic() + 60.0;
    while (len > 0) {
        ssize_t n = send(r->fd, data, (size_t)len, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            len -= n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            fail("", "cannot send on the replication connection: %s", strerror(errno));
            return -1;
        }
        if (monotonic() > deadline) {
            fail("", "cannot send on the replication connection: the server reads nothing");
            return -1;
        }
        if (wait_fd(r, POLLOUT, 1.0) < 0)
            return -1;
    }
    return 0;
}

/* A standby status update reporting only the committed offset (never past it). */
static int
send_status(Reader *r, int reply)
{
    unsigned char m[39] = {'d', 0, 0, 0, 38, 'r'};
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    int64_t now_us = (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000 - PG_EPOCH_US;
    put64(m + 6, r->from_lsn);
    put64(m + 14, r->from_lsn);
    put64(m + 22, r->from_lsn);
    put64(m + 30, (uint64_t)now_us);
    m[38] = reply ? 1 : 0;
    if (send_all(r, m, sizeof m) < 0)
        return -1;
    r->statuses++;
    if (r->reported < (int64_t)r->from_lsn)
        r->reported = (int64_t)r->from_lsn;
    r->last_status = monotonic();
    if (r->on_status != Py_None) {
        PyObject *res = PyObject_CallFunction(r->on_status, "Ki", (unsigned long long)r->from_lsn, reply);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    return 0;
}

/* Read what the socket holds into the buffer (GIL released): 1 read, 0 nothing there, -1 error. */
static int
fill(Reader *r)
{
    if (r->pos > 0 && (r->pos == r->have || r->cap - r->have < MIN_BUF / 4)) {
        memmove(r->buf, r->buf + r->pos, (size_t)(r->have - r->pos));
        r->have -= r->pos;
        r->pos = 0;
    }
    if (r->cap - r->have < MIN_BUF / 4) {
        Py_ssize_t cap = r->cap * 2;
        unsigned char *b = PyMem_Realloc(r->buf, (size_t)cap);
        if (b == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->buf = b;
        r->cap = cap;
    }
    ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = recv(r->fd, r->buf + r->have, (size_t)(r->cap - r->have), 0);
    Py_END_ALLOW_THREADS
    if (n > 0) {
        r->have += n;
        return 1;
    }
    if (n == 0) {
        fail("", "the server closed the replication connection");
        return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return errno == EINTR && PyErr_CheckSignals() < 0 ? -1 : 0;
    fail("", "cannot read from the replication connection: %s", strerror(errno));
    return -1;
}

/* The next complete backend message in the buffer: its type, body and body length; 0 if none
 * is complete yet.  The buffer grows (in fill) with the bytes that arrive, never to the length a
 * header claims: a damaged or hostile header must not reserve gigabytes. */
static int
next_frame(Reader *r, unsigned char *type, const unsigned char **body, Py_ssize_t *len)
{
    Py_ssize_t avail = r->have - r->pos;
    if (avail < 5)
        return 0;
    const unsigned char *p = r->buf + r->pos;
    uint32_t n = be32(p + 1);
    if (n < 4 || n > MAX_MESSAGE)
        return fail("", "malformed message of length %u on the replication connection", n), -1;
    if (avail < (Py_ssize_t)n + 1) {
        if (r->pos > 0 && (Py_ssize_t)n + 1 > r->cap - r->pos) {  /* make room: compact */
            memmove(r->buf, p, (size_t)avail);
            r->have = avail;
            r->pos = 0;
        }
        return 0;
    }
    *type = p[0];
    *body = p + 5;
    *len = (Py_ssize_t)n - 4;
    r->pos += (Py_ssize_t)n + 1;
    return 1;
}

/* Raise the fields of an ErrorResponse body as StreamError(sqlstate, message). */
static PyObject *
raise_error(const unsigned char *body, Py_ssize_t len)
{
    const char *state = "", *message = "(no message)";
    Py_ssize_t i = 0;
    while (i < len && body[i] != 0) {
        unsigned char code = body[i++];
        const char *value = (const char *)body + i;
        const void *end = memchr(body + i, 0, (size_t)(len - i));
        if (end == NULL)
            break;
        if (code == 'C')
            state = value;
        else if (code == 'M')
            message = value;
        i = (const unsigned char *)end - body + 1;
    }
    return fail(state, "%s", message);
}

static int
Reader_init(Reader *r, PyObject *args, PyObject *kw)
{
    static char *names[] = {"fd", "from_lsn", "upto_lsn", "max_events", "batch_rows",
                            "idle_probe", "status_interval", "on_status", NULL};
    unsigned long long from_lsn, upto;
    PyObject *on_status = Py_None;
    r->idle_probe = 0.2;
    r->status_interval = 10.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iKKnn|ddO", names, &r->fd, &from_lsn, &upto,
                                     &r->max_events, &r->batch_rows, &r->idle_probe,
                                     &r->status_interval, &on_status))
        return -1;
    if (r->batch_rows < 1) {
        PyErr_SetString(PyExc_ValueError, "batch_rows must be positive");
        return -1;
    }
    r->from_lsn = from_lsn;
    r->upto = upto;
    r->reported = -1;
    Py_INCREF(on_status);
    Py_XSETREF(r->on_status, on_status);
    if (r->buf == NULL) {
        r->buf = PyMem_Malloc(MIN_BUF);
        if (r->buf == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->cap = MIN_BUF;
    }
    return 0;
}

static void
Reader_dealloc(Reader *r)
{
    PyMem_Free(r->buf);
    Py_XDECREF(r->on_status);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *
Reader_start(Reader *r, PyObject *arg)
{
    const char *query;
    Py_ssize_t qlen;
    if (PyBytes_AsStringAndSize(arg, (char **)&query, &qlen) < 0)
        return NULL;
    if (r->started)
        return fail("", "the replication stream is already started");
    unsigned char *m = PyMem_Malloc((size_t)qlen + 6);
    if (m == NULL)
        return PyErr_NoMemory();
    m[0] = 'Q';
    uint32_t n = (uint32_t)qlen + 5;
    m[1] = n >> 24, m[2] = n >> 16, m[3] = n >> 8, m[4] = n;
    memcpy(m + 5, query, (size_t)qlen);
    m[qlen + 5] = 0;
    int rc = send_all(r, m, qlen + 6);
    PyMem_Free(m);
    if (rc < 0)
        return NULL;
    for (;;) {
        unsigned char type;
        const unsigned char *body;
        Py_ssize_t len;
        int got = next_frame(r, &type, &body, &len);
        if (got < 0)
            return NULL;
        if (got == 0) {
            int ready = wait_fd(r, POLLIN, 1.0);
            if (ready < 0 || (ready && fill(r) < 0))
                return NULL;
            continue;
        }
        if (type == 'W')
            break;  /* CopyBothResponse: streaming starts */
        if (type == 'E')
            return raise_error(body, len);
        if (type != 'N' && type != 'S')  /* notices and parameter reports are not ours */
            return fail("", "unexpected message type '%c' in answer to START_REPLICATION", type);
    }
    r->started = 1;
    if (send_status(r, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Append one XLogData message to the batch under the window's stop rules: 1 appended and the
 * window goes on, 0 the window ended (the message may or may not have been appended), -1 error. */
static int
take_xlog(Reader *r, PyObject *batch, const unsigned char *p, Py_ssize_t len)
{
    if (len < 25)
        return fail("", "truncated XLogData message of %zd bytes", len), -1;
    uint64_t lsn = be64(p + 1);
    const unsigned char *data = p + 25;
    Py_ssize_t n = len - 25;
    unsigned char first = n > 0 ? data[0] : 0;
    /* inside a stream block every message carries its xid and is transactional */
    int nontx = first == 'M' && !r->in_stream && n >= 2 && !(data[1] & 1);
    if (n < 1 || (first == 'B' && n < 9) || (first == 'C' && n < 18) || (first == 'M' && n < 10) ||
        (first == 'S' && n < 6) || (first == 'c' && n < 30) || (first == 'A' && n < 9))
        return fail("", "truncated pgoutput message of %zd bytes at %X/%X", n,
                    (unsigned)(lsn >> 32), (unsigned)lsn), -1;
    if (first == 'B') {
        if (be64(data + 1) >= r->upto)
            return 0;  /* its commit record starts at or past the target */
        r->in_txn = 1;
    } else if (first == 'c' && be64(data + 6) >= r->upto)
        return 0;  /* a streamed transaction committing at or past the target */
    else if (nontx && be64(data + 2) >= r->upto)
        return 0;  /* a non-transactional message at or past the target */
    PyObject *row = PyTuple_New(2);
    PyObject *key = PyLong_FromUnsignedLongLong(lsn);
    PyObject *value = PyBytes_FromStringAndSize((const char *)data, n);
    if (row == NULL || key == NULL || value == NULL) {
        Py_XDECREF(row), Py_XDECREF(key), Py_XDECREF(value);
        return -1;
    }
    PyTuple_SET_ITEM(row, 0, key);
    PyTuple_SET_ITEM(row, 1, value);
    int rc = PyList_Append(batch, row);
    Py_DECREF(row);
    if (rc < 0)
        return -1;
    r->messages++;
    if (first == 'S' || first == 'E' || first == 'c' || first == 'A') {
        r->stream_messages++;
        r->in_stream = first == 'S' || (r->in_stream && first != 'E');
    }
    if (first == 'C' || first == 'c') {
        r->in_txn = 0;
        if (be64(data + (first == 'C' ? 10 : 14)) >= r->upto)
            return 0;
    }
    if ((first == 'C' || first == 'c' || nontx) && r->messages >= r->max_events) {
        r->bounded = 1;
        return 0;
    }
    return 1;
}

/* Handle one complete frame: 1 go on, 0 the window ended, -1 error. */
static int
take_frame(Reader *r, PyObject *batch, unsigned char type, const unsigned char *body, Py_ssize_t len)
{
    if (type == 'E')
        return raise_error(body, len), -1;
    if (type == 'N' || type == 'S')
        return 1;
    if (type != 'd')
        return fail("", "the server ended the replication stream early (message type '%c')", type), -1;
    if (len < 1)
        return fail("", "empty CopyData message on the replication connection"), -1;
    if (body[0] == 'w')
        return take_xlog(r, batch, body, len);
    if (body[0] != 'k')
        return fail("", "unexpected replication message type '%c'", body[0]), -1;
    if (len < 18)
        return fail("", "truncated keepalive message of %zd bytes", len), -1;
    if (body[17] && send_status(r, 0) < 0)
        return -1;
    return be64(body + 1) >= r->upto && !r->in_txn && !r->in_stream ? 0 : 1;
}

static PyObject *
Reader_next_batch(Reader *r, PyObject *unused)
{
    if (!r->started)
        return fail("", "the replication stream is not started");
    if (r->done)
        Py_RETURN_NONE;
    PyObject *batch = PyList_New(0);
    if (batch == NULL)
        return NULL;
    for (;;) {
        unsigned char type;
        const unsigned char *body;
        Py_ssize_t len;
        int got = next_frame(r, &type, &body, &len);
        if (got > 0) {
            int rc = take_frame(r, batch, type, body, len);
            if (rc < 0)
                goto error;
            if (rc == 0) {
                r->done = 1;
                break;
            }
            if (PyList_GET_SIZE(batch) >= r->batch_rows)
                return batch;
            continue;
        }
        if (got < 0)
            goto error;
        int ready = wait_fd(r, POLLIN, 0.0);
        if (ready < 0)
            goto error;
        if (!ready) {
            if (PyList_GET_SIZE(batch) >= r->batch_rows / 4 && PyList_GET_SIZE(batch) > 0)
                return batch;  /* decode while the server catches up */
            ready = wait_fd(r, POLLIN, r->idle_probe);
            if (ready < 0 || (!ready && send_status(r, 1) < 0))  /* "where are you?" */
                goto error;
        }
        if (monotonic() - r->last_status > r->status_interval && send_status(r, 0) < 0)
            goto error;
        if (fill(r) < 0)
            goto error;
    }
    if (PyList_GET_SIZE(batch) > 0)
        return batch;
    Py_DECREF(batch);
    Py_RETURN_NONE;
error:
    Py_DECREF(batch);
    return NULL;
}

static PyObject *
Reader_status(Reader *r, PyObject *arg)
{
    int reply = PyObject_IsTrue(arg);
    if (reply < 0 || send_status(r, reply) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Reader_get_reported(Reader *r, void *closure)
{
    if (r->reported < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(r->reported);
}

static PyObject *
Reader_get_messages(Reader *r, void *closure)
{
    return PyLong_FromSsize_t(r->messages);
}

static PyObject *
Reader_get_stream_messages(Reader *r, void *closure)
{
    return PyLong_FromSsize_t(r->stream_messages);
}

static PyObject *
Reader_get_bounded(Reader *r, void *closure)
{
    return PyBool_FromLong(r->bounded);
}

static PyObject *
Reader_get_statuses(Reader *r, void *closure)
{
    return PyLong_FromSsize_t(r->statuses);
}

static PyMethodDef Reader_methods[] = {
    {"start", (PyCFunction)Reader_start, METH_O,
     "start(query) -> send START_REPLICATION, wait for CopyBoth, send the first status update."},
    {"next_batch", (PyCFunction)Reader_next_batch, METH_NOARGS,
     "next_batch() -> the next list of (lsn, payload) of the window, or None when it has ended."},
    {"status", (PyCFunction)Reader_status, METH_O, "status(reply) -> send a standby status update."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Reader_getset[] = {
    {"reported", (getter)Reader_get_reported, NULL, "highest flush position ever reported", NULL},
    {"messages", (getter)Reader_get_messages, NULL, "messages read into the window", NULL},
    {"stream_messages", (getter)Reader_get_stream_messages, NULL, "Stream Start/Stop/Commit/Abort read", NULL},
    {"bounded", (getter)Reader_get_bounded, NULL, "the window stopped at max_events", NULL},
    {"statuses", (getter)Reader_get_statuses, NULL, "status updates sent", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "airflow_cdc.sources.postgres._walstream.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(fd, from_lsn, upto_lsn, max_events, batch_rows, idle_probe=0.2, "
              "status_interval=10.0, on_status=None): one window of a logical slot (module doc).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
    .tp_getset = Reader_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_walstream", "Compiled reader of the logical replication stream.", -1, NULL,
};

PyMODINIT_FUNC
PyInit__walstream(void)
{
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    StreamError = PyErr_NewExceptionWithDoc("airflow_cdc.sources.postgres._walstream.StreamError",
                                            "args: (sqlstate or '', message)", NULL, NULL);
    Py_INCREF(&ReaderType);
    if (StreamError == NULL || PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObject(m, "StreamError", StreamError) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
