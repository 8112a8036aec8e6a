/* The quick walk of a record set into a namespace (model/namespaces.py, common_leaves): the same leaves as its
 * pure-Python reference, in one call, for the shapes a program sets every step.
 *
 * walk(path, value) -> list of (leaf path, values, single) | None. A dict with str keys is walked, its keys
 * extending the path; a leaf is a float (or a float subclass such as numpy's float64), an int within +-2**53, a bool, a str of at most max_text characters (each
 * one value), or a list or numpy array (sequence(path, value) converts it, or raises NamespaceError, as the general
 * walk does). A leaf's path must be in valid_paths (checked once by the general walk). Anything else -- an empty
 * dict, a key not a str, a dict nested deeper than max_depth, another type -- hands the whole value back (None),
 * for the general walk to judge. configure() gives the Python side's objects once.
 *
 * A key's joined path is kept per parent path (at most max_joined, then forgotten and made again), so a record set
 * every step builds no string. Lists of numbers and 1-D numeric arrays of a few thousand items at most are converted
 * here (arrays through the buffer protocol), others by sequence(). The value's own objects are held while sequence()
 * runs Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

/* arrays and lists longer than this go to sequence() (numpy converts long ones faster) */
#define MAX_QUICK_ITEMS 4096

static PyObject *valid_paths;   /* set of checked paths (model.namespaces.VALID_PATHS) */
static PyObject *sequence_fn;   /* model.namespaces._sequence(path, value) -> list */
static PyObject *ndarray_type;  /* numpy.ndarray */
static long long max_exact_int;
static Py_ssize_t max_text, max_depth, max_joined;
static PyObject *joined;        /* parent path -> {key -> joined path} */
static Py_ssize_t joined_count;
static PyObject *separator;     /* "/" */

enum { HANDED_BACK = 0, WALKED = 1, FAILED = -1 };

static PyObject *joined_path(PyObject *path, PyObject *key) {
    PyObject *below = PyDict_GetItemWithError(joined, path);
    if (below == NULL) {
        if (PyErr_Occurred())
            return NULL;
        if (joined_count >= max_joined) {
            PyDict_Clear(joined);
            joined_count = 0;
        }
        below = PyDict_New();
        if (below == NULL || PyDict_SetItem(joined, path, below) < 0) {
            Py_XDECREF(below);
            return NULL;
        }
        Py_DECREF(below);  /* joined holds it */
    }
    PyObject *p = PyDict_GetItemWithError(below, key);
    if (p != NULL)
        return Py_NewRef(p);
    if (PyErr_Occurred())
        return NULL;
    if (PyUnicode_GET_LENGTH(path) == 0) {
        p = Py_NewRef(key);
    } else {
        PyObject *head = PyUnicode_Concat(path, separator);
        p = head ? PyUnicode_Concat(head, key) : NULL;
        Py_XDECREF(head);
        if (p == NULL)
            return NULL;
    }
    if (PyDict_SetItem(below, key, p) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    joined_count++;
    return p;
}

static int add_leaf(PyObject *out, PyObject *path, PyObject *values, int single) {
    if (values == NULL)
        return FAILED;
    PyObject *t = PyTuple_Pack(3, path, values, single ? Py_True : Py_False);
    Py_DECREF(values);
    if (t == NULL)
        return FAILED;
    int r = PyList_Append(out, t);
    Py_DECREF(t);
    return r < 0 ? FAILED : WALKED;
}

static PyObject *one(PyObject *v) {  /* [v], v a new reference (or NULL) */
    if (v == NULL)
        return NULL;
    PyObject *l = PyList_New(1);
    if (l == NULL) {
        Py_DECREF(v);
        return NULL;
    }
    PyList_SET_ITEM(l, 0, v);
    return l;
}

/* A list of floats and ints within +-2**53 as floats (what sequence() makes of it); NULL, no error set, for any
 * other list (sequence() judges it). */
static PyObject *list_numbers(PyObject *list) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n > MAX_QUICK_ITEMS)
        return NULL;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(list, i), *f;
        if (Py_IS_TYPE(v, &PyFloat_Type)) {
            f = Py_NewRef(v);
        } else if (Py_IS_TYPE(v, &PyLong_Type)) {
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if ((x == -1 && PyErr_Occurred()) || overflow || x > max_exact_int || x < -max_exact_int) {
                PyErr_Clear();
                Py_DECREF(out);
                return NULL;
            }
            f = PyFloat_FromDouble((double)x);
        } else {
            Py_DECREF(out);
            return NULL;
        }
        if (f == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, f);
    }
    return out;
}

/* A 1-D numpy array of booleans, integers within +-2**53 or floats (32 or 64 bits) in this machine's byte order,
 * as floats, read through the buffer protocol (what sequence() makes of it: astype(float64) is exact for these);
 * NULL, no error set, for any other array (sequence() judges it). */
static PyObject *array_numbers(PyObject *array) {
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *out = NULL;
    const char *fmt = view.format ? view.format : "B";
    if (*fmt == '@' || *fmt == '=')
        fmt++;
    char code = fmt[0];
    if (view.ndim != 1 || fmt[1] != '\0' || view.shape[0] > MAX_QUICK_ITEMS || strchr("?bBhHiIlLqQfd", code) == NULL)
        goto done;
    Py_ssize_t n = view.shape[0], stride = view.strides[0];
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *at = (const char *)view.buf + i * stride;
        double d;
        long long x = 0;
        unsigned long long u = 0;
        int is_int = 1, is_unsigned = 0;
        switch (code) {
        case '?': x = *(const unsigned char *)at != 0; break;
        case 'b': x = *(const signed char *)at; break;
        case 'B': x = *(const unsigned char *)at; break;
        case 'h': { short v; memcpy(&v, at, sizeof v); x = v; } break;
        case 'H': { unsigned short v; memcpy(&v, at, sizeof v); x = v; } break;
        case 'i': { int v; memcpy(&v, at, sizeof v); x = v; } break;
        case 'I': { unsigned int v; memcpy(&v, at, sizeof v); x = v; } break;
        case 'l': { long v; memcpy(&v, at, sizeof v); x = v; } break;
        case 'L': { unsigned long v; memcpy(&v, at, sizeof v); u = v; is_unsigned = 1; } break;
        case 'q': { long long v; memcpy(&v, at, sizeof v); x = v; } break;
        case 'Q': { unsigned long long v; memcpy(&v, at, sizeof v); u = v; is_unsigned = 1; } break;
        case 'f': { float v; memcpy(&v, at, sizeof v); d = v; is_int = 0; } break;
        default: { double v; memcpy(&v, at, sizeof v); d = v; is_int = 0; } break;
        }
        if (is_int) {
            if (is_unsigned ? u > (unsigned long long)max_exact_int : (x > max_exact_int || x < -max_exact_int)) {
                Py_CLEAR(out);  /* sequence() says the value is too large to be stored exactly */
                goto done;
            }
            d = is_unsigned ? (double)u : (double)x;
        }
        PyObject *f = PyFloat_FromDouble(d);
        if (f == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, f);
    }
done:
    PyBuffer_Release(&view);
    return out;
}

static int walk(PyObject *path, PyObject *value, Py_ssize_t depth, PyObject *out) {
    PyTypeObject *cls = Py_TYPE(value);
    if (cls == &PyDict_Type) {
        if (PyDict_GET_SIZE(value) == 0 || depth > max_depth)
            return HANDED_BACK;
        Py_ssize_t pos = 0;
        PyObject *key, *sub;
        while (PyDict_Next(value, &pos, &key, &sub)) {
            if (!PyUnicode_CheckExact(key))
                return HANDED_BACK;
            Py_INCREF(key);
            Py_INCREF(sub);
            PyObject *p = joined_path(path, key);
            int r = p ? walk(p, sub, depth + 1, out) : FAILED;
            Py_XDECREF(p);
            Py_DECREF(key);
            Py_DECREF(sub);
            if (r != WALKED)
                return r;
        }
        return WALKED;
    }
    int checked = PySet_Contains(valid_paths, path);
    if (checked <= 0)
        return checked < 0 ? FAILED : HANDED_BACK;
    if (cls == &PyFloat_Type)
        return add_leaf(out, path, one(Py_NewRef(value)), 1);
    if (PyFloat_Check(value))  /* numpy's float64 (a reduction's result) and other float subclasses: float(value) */
        return add_leaf(out, path, one(PyNumber_Float(value)), 1);
    if (cls == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred())
            return FAILED;
        if (overflow || v > max_exact_int || v < -max_exact_int)
            return HANDED_BACK;
        return add_leaf(out, path, one(PyFloat_FromDouble((double)v)), 1);
    }
    if (cls == &PyBool_Type)
        return add_leaf(out, path, one(PyFloat_FromDouble(value == Py_True ? 1.0 : 0.0)), 1);
    if (cls == &PyUnicode_Type) {
        if (PyUnicode_GET_LENGTH(value) > max_text)
            return HANDED_BACK;
        return add_leaf(out, path, one(Py_NewRef(value)), 1);
    }
    if (cls == &PyList_Type || (PyObject *)cls == ndarray_type) {
        PyObject *values = cls == &PyList_Type ? list_numbers(value) : array_numbers(value);
        if (values == NULL && PyErr_Occurred())
            return FAILED;
        if (values == NULL)  /* not numbers this walk converts alone: sequence() converts it, or says what is wrong */
            values = PyObject_CallFunctionObjArgs(sequence_fn, path, value, NULL);
        return add_leaf(out, path, values, 0);
    }
    return HANDED_BACK;
}

static PyObject *record_walk(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "walk(path: str, value)");
        return NULL;
    }
    if (valid_paths == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "flowscope.model._record_walk.configure() was not called");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    int r = walk(args[0], args[1], 0, out);
    if (r == WALKED)
        return out;
    Py_DECREF(out);
    if (r == FAILED)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *configure(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *valid, *seq, *nd;
    long long max_int;
    Py_ssize_t text, depth, joins;
    if (!PyArg_ParseTuple(args, "O!OOLnnn", &PySet_Type, &valid, &seq, &nd, &max_int, &text, &depth, &joins))
        return NULL;
    Py_XSETREF(valid_paths, Py_NewRef(valid));
    Py_XSETREF(sequence_fn, Py_NewRef(seq));
    Py_XSETREF(ndarray_type, Py_NewRef(nd));
    max_exact_int = max_int;
    max_text = text;
    max_depth = depth;
    max_joined = joins;
    PyDict_Clear(joined);
    joined_count = 0;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))record_walk, METH_FASTCALL,
     "walk(path, value) -> [(leaf path, values, single)], or None to hand the value to the general walk"},
    {"configure", configure, METH_VARARGS,
     "configure(valid_paths, sequence, ndarray, max_exact_int, max_text_chars, max_depth, max_joined_paths)"},
    {NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "flowscope.model._record_walk",
                                    "The quick walk of a namespace record (model/namespaces.py).", -1, methods};

PyMODINIT_FUNC PyInit__record_walk(void) {
    joined = PyDict_New();
    separator = PyUnicode_InternFromString("/");
    if (joined == NULL || separator == NULL)
        return NULL;
    return PyModule_Create(&module);
}
