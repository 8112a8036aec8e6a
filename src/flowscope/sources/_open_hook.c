/* The process's audit hook for file opens (sources/thread_io.py), at the C level.
 *
 * Python calls every audit hook for every audit event of the process, and some are frequent: Dask's local
 * scheduler alone raises about 130,000 "builtins.id" events on a 20,000-task graph. A hook added with
 * sys.addaudithook is a Python call per event (~95 ns measured here); this one compares the event's name in C
 * and calls Python only for "open" events, which are rare. Audit hooks cannot be removed: install() adds it
 * once per process; later calls only replace the callable. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *on_open = NULL;  /* called with the event's args tuple: (path, mode, flags) */
static int added = 0;

static int
open_hook(const char *event, PyObject *args, void *data)
{
    (void)data;
    if (on_open == NULL || event[0] != 'o' || strcmp(event, "open") != 0)
        return 0;
    PyObject *callable = on_open;
    Py_INCREF(callable);  /* install() may replace it while the call runs */
    PyObject *res = PyObject_CallOneArg(callable, args);
    Py_DECREF(callable);
    if (res == NULL) {
        /* the recorder must never make the caller's open fail: report, go on */
        PyErr_WriteUnraisable(NULL);
        return 0;
    }
    Py_DECREF(res);
    return 0;
}

static PyObject *
install(PyObject *module, PyObject *callable)
{
    (void)module;
    if (callable != Py_None && !PyCallable_Check(callable)) {
        PyErr_SetString(PyExc_TypeError, "install(on_open): on_open must be callable or None");
        return NULL;
    }
    if (!added) {
        if (PySys_AddAuditHook(open_hook, NULL) < 0)
            return NULL;  /* another hook refused "sys.addaudithook" */
        added = 1;
    }
    PyObject *old = on_open;
    if (callable == Py_None) {
        on_open = NULL;
    } else {
        Py_INCREF(callable);
        on_open = callable;
    }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *
installed(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(added);
}

static PyMethodDef methods[] = {
    {"install", install, METH_O,
     "install(on_open): call on_open(args) for each 'open' audit event of the process (None: for none)."},
    {"installed", installed, METH_NOARGS, "Whether the hook has been added to this process."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_open_hook", "The open audit hook in C (sources/thread_io.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__open_hook(void)
{
    return PyModule_Create(&module_def);
}
