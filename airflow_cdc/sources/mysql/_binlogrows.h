/*
 * Shared by _binlogrows.c (row images to Python values) and _binlogcols.c (row images straight
 * into Arrow column buffers): column types, the compiled layout of one row image, and the reader
 * of one value.
 */
#ifndef AIRFLOW_CDC_BINLOGROWS_H
#define AIRFLOW_CDC_BINLOGROWS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum {
    T_TINY = 1, T_SHORT = 2, T_LONG = 3, T_FLOAT = 4, T_DOUBLE = 5, T_TIMESTAMP = 7,
    T_LONGLONG = 8, T_INT24 = 9, T_DATE = 10, T_TIME = 11, T_DATETIME = 12, T_YEAR = 13,
    T_VARCHAR = 15, T_BIT = 16, T_TIMESTAMP2 = 17, T_DATETIME2 = 18, T_TIME2 = 19,
    T_JSON = 245, T_NEWDECIMAL = 246, T_ENUM = 247, T_SET = 248, T_TINY_BLOB = 249,
    T_MEDIUM_BLOB = 250, T_LONG_BLOB = 251, T_BLOB = 252, T_VAR_STRING = 253, T_STRING = 254,
    T_GEOMETRY = 255
};

typedef struct {
    int index;      /* position in the full column list */
    int type, meta, is_unsigned;
    int size;       /* fixed size in bytes, or the length-prefix size for variable types */
    PyObject *json; /* borrowed-owned: callable applied to JSON bytes, or NULL */
} Col;

typedef struct {
    PyObject_HEAD
    int ncols;      /* columns of the table */
    int npresent;   /* columns present in the image */
    Col *cols;      /* present columns, in order */
} Layout;

/* Byte, date and fraction helpers both decoders use (static inline: one definition, inlined in each). */
static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};  /* DECIMAL: bytes of a partial group */
static const int64_t FRAC_MULT[4] = {1, 10000, 100, 1};           /* fractional-second bytes to micros */

static inline uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

static inline uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Days from a civil date to the Unix epoch (proleptic Gregorian). */
static inline int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static inline int valid_date(int64_t y, int64_t m, int64_t d) {
    static const int DIM[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 1 || y > 9999 || m < 1 || m > 12 || d < 1) return 0;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= DIM[m] + (m == 2 && leap);
}

static inline int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

extern PyTypeObject BinlogLayoutType;

/* The neutral Python value of column ``c`` at ``*o`` (advanced past it); NULL with ValueError when
 * the value runs past ``len``. */
PyObject *binlog_read_value(Col *c, const uint8_t *d, Py_ssize_t len, Py_ssize_t *o);
/* The fixed size of a column, or its length-prefix size; -1 for a type or metadata not handled. */
int binlog_col_size(Col *c);
/* Whether a variable-length column type (a length prefix of c->size bytes, then the bytes). */
int binlog_is_variable(int type);
/* Add the Columns type to the module; -1 with an exception set. */
int binlogcols_add_types(PyObject *module);

#endif
