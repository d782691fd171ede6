/*
 * Row images -> columns for the table sinks (airflow_cdc/core/table_sink.py), the compiled twin of
 * its Python transposition.
 *
 * columns(rows, select) -> list of lists: for each index of ``select``, the values of that column
 * of every row, None where the row itself is None (an event without that image).  A row shorter
 * than an index raises IndexError naming the index.  Rows are walked once, each row's values
 * written to every column list in turn (the Python zip(*rows) walks every row once per column).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *columns(PyObject *mod, PyObject *args) {
    PyObject *rows, *select;
    if (!PyArg_ParseTuple(args, "OO", &rows, &select)) return NULL;
    PyObject *rs = PySequence_Fast(rows, "rows must be a sequence");
    if (!rs) return NULL;
    PyObject *ss = PySequence_Fast(select, "select must be a sequence");
    if (!ss) { Py_DECREF(rs); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(rs), k = PySequence_Fast_GET_SIZE(ss);
    Py_ssize_t *idx = PyMem_Malloc((k ? k : 1) * sizeof(Py_ssize_t));
    PyObject *out = PyList_New(k);
    if (!idx || !out) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t j = 0; j < k; j++) {
        idx[j] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(ss, j));
        if (idx[j] == -1 && PyErr_Occurred()) goto fail;
        if (idx[j] < 0) { PyErr_SetString(PyExc_ValueError, "negative column index"); goto fail; }
        PyObject *col = PyList_New(n);
        if (!col) goto fail;
        PyList_SET_ITEM(out, j, col);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(rs, i);
        if (row == Py_None) {
            for (Py_ssize_t j = 0; j < k; j++) {
                Py_INCREF(Py_None);
                PyList_SET_ITEM(PyList_GET_ITEM(out, j), i, Py_None);
            }
            continue;
        }
        if (PyTuple_CheckExact(row)) {
            Py_ssize_t width = PyTuple_GET_SIZE(row);
            for (Py_ssize_t j = 0; j < k; j++) {
                if (idx[j] >= width) {
                    PyErr_Format(PyExc_IndexError, "column index %zd", idx[j]);
                    goto fail;
                }
                PyObject *v = PyTuple_GET_ITEM(row, idx[j]);
                Py_INCREF(v);
                PyList_SET_ITEM(PyList_GET_ITEM(out, j), i, v);
            }
            continue;
        }
        Py_ssize_t width = PySequence_Size(row);  /* lists and other sequences */
        if (width < 0) goto fail;
        for (Py_ssize_t j = 0; j < k; j++) {
            if (idx[j] >= width) {
                PyErr_Format(PyExc_IndexError, "column index %zd", idx[j]);
                goto fail;
            }
            PyObject *v = PySequence_GetItem(row, idx[j]);
            if (!v) goto fail;
            PyList_SET_ITEM(PyList_GET_ITEM(out, j), i, v);
        }
    }
    PyMem_Free(idx);
    Py_DECREF(rs); Py_DECREF(ss);
    return out;
fail:  /* a column list's unset (NULL) items are skipped when it is freed */
    PyMem_Free(idx);
    Py_XDECREF(out);
    Py_DECREF(rs); Py_DECREF(ss);
    return NULL;
}

static PyMethodDef methods[] = {
    {"columns", columns, METH_VARARGS, "columns(rows, select) -> one list of values per selected column"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns", "Row images to columns for the table sinks", -1, methods
};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
