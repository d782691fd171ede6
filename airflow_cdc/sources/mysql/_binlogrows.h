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
