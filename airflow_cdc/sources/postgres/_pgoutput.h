/*
 * Shared declarations of the compiled pgoutput decoder (see _pgoutput.c for the contract):
 * growable buffers, the per-relation column buffers and the row decoding of _pgoutput_rows.c.
 */
#ifndef AIRFLOW_CDC_PGOUTPUT_H
#define AIRFLOW_CDC_PGOUTPUT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_TUPLE_COLS 65536

/* __position bytes: epoch (4), commit LSN (8), sequence in the transaction (8), big-endian */
#define POS_LEN 20

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

typedef struct {
    Buf off;    /* int32 offsets, n + 1 */
    Buf data;   /* UTF-8 text values */
    Buf valid;  /* validity bitmap */
    Buf toast;  /* unchanged-TOAST bitmap: kept only once a value of the piece was not sent */
    int toasted;
} Col;

/* An image's rows below ``filled`` are in its buffers; the rows from there to the relation's
 * ``n`` are absent (every column null) and written in one go by image_fill when a later row has
 * the image or the piece is taken: an insert's before image costs nothing per event. */
typedef struct {
    Buf present;  /* bitmap: the event has this row image */
    Col *cols;
    Py_ssize_t filled;
} Image;

typedef struct {
    uint32_t relid;
    int ignore;  /* a relation not captured: its changes are consumed unread, as in Python */
    int nsel, need;
    int *map;  /* tuple column index -> captured column slot, or -1; ``need`` entries */
    int nkey;
    int *key;  /* captured column slots of the key: an update that changes them is a d + c pair */
    Py_ssize_t n, bytes;
    Py_ssize_t counts[3];  /* c, u, d */
    Image img[2];          /* before, after */
    Buf ops, pos, ts, xid, lsn, seqoff, seqdata;
    /* source.origin / origin_lsn: kept only once a row of the piece came through a replication
     * origin (rare), the piece's earlier rows then null; without, take() hands over None */
    int origins;
    Buf ooff, odata, ovalid, olsn;
} Rel;

/* The current transaction, as the Python decoder last described it, and the window's options. */
typedef struct {
    int skip[3];  /* c, u, d not emitted */
    int active, has_prev;
    uint64_t final_lsn, prev;
    uint32_t epoch; /* position epoch: prefixes every position (see sources/postgres/position.py) */
    int64_t ts_us, xid, seq;
    Py_ssize_t events;
    PyObject *origin;        /* the transaction's replication origin name (str), or NULL */
    const char *origin_utf8; /* its UTF-8 text (owned by ``origin``) */
    Py_ssize_t origin_len;
    uint64_t origin_lsn;     /* the commit LSN on the origin server */
} Txn;

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

int buf_reserve(Buf *b, Py_ssize_t extra);
int bit_put(Buf *b, Py_ssize_t row, int on);
Py_ssize_t bits_set(const Buf *b, Py_ssize_t n);
PyObject *buf_bytes(const Buf *b, Py_ssize_t len);
void buf_free(Buf *b);
void rel_free(Rel *r);
void rel_rollback(Rel *r, Py_ssize_t row);
int image_fill(const Rel *r, Image *img, Py_ssize_t upto);
int change_put(Txn *t, Rel *r, const unsigned char *buf, Py_ssize_t len, int64_t change_lsn);

extern const char OPS[3];

#endif
