/* The per-record recorder of spans: Client.span, Client.emit("spans") and the spans row writer append a record's
 * values to C column buffers, with no Python object kept per value, and a full buffer is handed to Arrow as
 * memory blocks, without a copy.
 *
 * The Python side (flowscope/client/span_recorder.py) builds the Arrow table from what take() hands out, and
 * supplies the checks that decide everything out of the common case: normalize(*values) returns the record's
 * values converted exactly as the pure-Python Packer converts them, or raises its SchemaError naming the column.
 * So both paths accept, convert and refuse the same values with the same messages.
 *
 * Buffer: one thread's spans. Columns, in the spans schema's order:
 *   span_id, parent_id      int64 + validity bitmap
 *   resource_id, kind, name int32 codes into a string dictionary per column (reset with every take)
 *   start_ns, end_ns        int64
 *   task_key, attrs         Arrow string: int32 offsets + UTF-8 bytes + validity bitmap
 * add(*values) appends one record (column order); take() hands out every record as memory blocks and starts
 * afresh. on_full(buffer) is called once the buffer holds flush_rows records (or 256 MiB of text).
 *
 * Recorder: Client.span itself, span(name, start_ns, end_ns, *, kind='call', resource_id=None, task_key=None,
 * attrs=None, span_id=None, parent_id=None), and row(*values), the spans row writer. Each call records into the
 * calling thread's Buffer, found in the thread's state dictionary (a weak reference under this recorder's key:
 * the client owns the buffers); a thread's first call gets it from first().
 *
 * Thread safety rests on the GIL: a record is converted first (which may run Python code: normalize, to_json,
 * dictionary inserts), then committed to the columns by plain C stores that cannot let another thread run; take()
 * detaches the columns the same way. A take() between the two steps (another thread running while the first step
 * released the GIL) is seen through the buffer's generation counter, and the dictionary codes are looked up again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SPAN_ID, PARENT_ID, RESOURCE_ID, KIND, NAME, START_NS, END_NS, TASK_KEY, ATTRS, NCOLS };
#define NCODED 3   /* resource_id, kind, name */
#define NTEXT 2    /* task_key, attrs */
#define FIRST_ROWS 1024
#define MAX_TEXT ((Py_ssize_t)1 << 28)  /* a batch's text bytes per column before it is handed on: int32 offsets */

static const char *COLUMN_NAMES[NCOLS] = {"span_id", "parent_id", "resource_id", "kind", "name",
                                          "start_ns", "end_ns", "task_key", "attrs"};
static PyObject *column_names[NCOLS];  /* interned */
static PyObject *default_kind;         /* "call" */
static PyObject *schema_error;         /* flowscope.model.conform.SchemaError, set by configure() */
static PyObject *table_name;           /* "spans" */

/* ---- Block: memory handed to Arrow ------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size;
} Block;

static void Block_dealloc(Block *self) {
    free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Block_getbuffer(Block *self, Py_buffer *view, int flags) {
    static char empty[1];
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? self->data : empty, self->size, 1, flags);
}

static PyBufferProcs Block_as_buffer = {(getbufferproc)Block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flowscope.client._span_recorder.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = (destructor)Block_dealloc,
    .tp_as_buffer = &Block_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes owned by C, read through the buffer protocol (pyarrow.py_buffer) and freed with the last reader.",
};

/* A Block taking ownership of data (freed here if the Block cannot be made). */
static PyObject *block_of(void *data, Py_ssize_t size) {
    Block *b = PyObject_New(Block, &BlockType);
    if (b == NULL) {
        free(data);
        return NULL;
    }
    b->data = data;
    b->size = size;
    return (PyObject *)b;
}

/* ---- Buffer: one thread's spans -------------------------------------------------------------------------- */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Text;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, cap;                 /* records, and records the columns have room for */
    int64_t *ints[4];                  /* span_id, parent_id, start_ns, end_ns */
    uint8_t *valid[4];                 /* validity bitmaps of span_id, parent_id, task_key, attrs */
    Py_ssize_t nulls[4];
    int32_t *codes[NCODED];
    int32_t *offsets[NTEXT];           /* cap + 1 each */
    Text text[NTEXT];
    PyObject *dict[NCODED];            /* value -> code (a Python int) */
    PyObject *values[NCODED];          /* code -> value */
    PyObject *last[NCODED];            /* the value looked up last, and its code: repeated values skip the dict */
    int32_t last_code[NCODED];
    uint64_t generation;               /* bumped by every take() */
    Py_ssize_t flush_rows;
    PyObject *rid;                     /* the default resource id of Recorder.__call__ */
    PyObject *on_full, *normalize, *to_json;
    PyObject *weakrefs;
    PyObject *dict_;                   /* instance __dict__ (the Python face keeps its attributes there) */
} Buffer;

enum { I_SPAN_ID, I_PARENT_ID, I_START, I_END };
enum { V_SPAN_ID, V_PARENT_ID, V_TASK_KEY, V_ATTRS };

/* A record converted, ready to commit: plain C values, dictionary codes, UTF-8 text borrowed from live str objects. */
typedef struct {
    int64_t ints[4];
    int has[2];                        /* span_id, parent_id not null */
    PyObject *coded[NCODED];           /* exact str, borrowed */
    int32_t code[NCODED];
    const char *text[NTEXT];           /* NULL: null */
    Py_ssize_t text_len[NTEXT];
} Row;

static void free_columns(Buffer *b) {
    for (int i = 0; i < 4; i++) {
        free(b->ints[i]);
        b->ints[i] = NULL;
        free(b->valid[i]);
        b->valid[i] = NULL;
        b->nulls[i] = 0;
    }
    for (int c = 0; c < NCODED; c++) {
        free(b->codes[c]);
        b->codes[c] = NULL;
    }
    for (int t = 0; t < NTEXT; t++) {
        free(b->offsets[t]);
        b->offsets[t] = NULL;
        free(b->text[t].data);
        b->text[t].data = NULL;
        b->text[t].len = b->text[t].cap = 0;
    }
    b->n = b->cap = 0;
}

static int Buffer_traverse(Buffer *self, visitproc visit, void *arg) {
    for (int c = 0; c < NCODED; c++) {
        Py_VISIT(self->dict[c]);
        Py_VISIT(self->values[c]);
        Py_VISIT(self->last[c]);
    }
    Py_VISIT(self->rid);
    Py_VISIT(self->on_full);
    Py_VISIT(self->normalize);
    Py_VISIT(self->to_json);
    Py_VISIT(self->dict_);
    return 0;
}

static int Buffer_clear(Buffer *self) {
    for (int c = 0; c < NCODED; c++) {
        Py_CLEAR(self->dict[c]);
        Py_CLEAR(self->values[c]);
        Py_CLEAR(self->last[c]);
    }
    Py_CLEAR(self->rid);
    Py_CLEAR(self->on_full);
    Py_CLEAR(self->normalize);
    Py_CLEAR(self->to_json);
    Py_CLEAR(self->dict_);
    return 0;
}

/* (a Python subclass's dealloc calls this one, then releases its type) */
static void Buffer_dealloc(Buffer *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Buffer_clear(self);
    free_columns(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int new_dictionaries(PyObject *dict[NCODED], PyObject *values[NCODED]) {
    for (int c = 0; c < NCODED; c++) {
        dict[c] = PyDict_New();
        values[c] = PyList_New(0);
        if (dict[c] == NULL || values[c] == NULL) {
            for (int j = 0; j <= c; j++) {
                Py_CLEAR(dict[j]);
                Py_CLEAR(values[j]);
            }
            return -1;
        }
    }
    return 0;
}

static int Buffer_init(Buffer *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"flush_rows", "rid", "on_full", "normalize", "to_json", NULL};
    Py_ssize_t flush_rows;
    PyObject *rid, *on_full, *normalize, *to_json;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nOOOO", kwlist, &flush_rows, &rid, &on_full, &normalize,
                                     &to_json))
        return -1;
    if (flush_rows < 1) {
        PyErr_SetString(PyExc_ValueError, "flush_rows must be at least 1");
        return -1;
    }
    if (!PyCallable_Check(normalize) || !PyCallable_Check(to_json) || (on_full != Py_None && !PyCallable_Check(on_full))) {
        PyErr_SetString(PyExc_TypeError, "normalize, to_json and on_full (or None) must be callable");
        return -1;
    }
    PyObject *dict[NCODED] = {NULL}, *values[NCODED] = {NULL};
    if (new_dictionaries(dict, values) < 0)
        return -1;
    for (int c = 0; c < NCODED; c++) {
        Py_XSETREF(self->dict[c], dict[c]);
        Py_XSETREF(self->values[c], values[c]);
        Py_CLEAR(self->last[c]);
    }
    self->flush_rows = flush_rows;
    Py_INCREF(rid);
    Py_XSETREF(self->rid, rid);
    Py_INCREF(on_full);
    Py_XSETREF(self->on_full, on_full);
    Py_INCREF(normalize);
    Py_XSETREF(self->normalize, normalize);
    Py_INCREF(to_json);
    Py_XSETREF(self->to_json, to_json);
    return 0;
}

static Py_ssize_t Buffer_len(Buffer *self) { return self->n; }

/* Room for one more record in the fixed-width columns (plain C allocations: no Python code runs). */
static int grow(Buffer *b) {
    Py_ssize_t cap = b->cap ? b->cap * 2 : (b->flush_rows < FIRST_ROWS ? b->flush_rows : FIRST_ROWS);
    if (cap < b->n + 1)
        cap = b->n + 1;
    for (int i = 0; i < 4; i++) {
        int64_t *p = realloc(b->ints[i], (size_t)cap * sizeof(int64_t));
        if (p == NULL)
            return -1;
        b->ints[i] = p;
        size_t old_bytes = (size_t)(b->cap + 7) / 8, bytes = (size_t)(cap + 7) / 8;
        uint8_t *v = realloc(b->valid[i], bytes);
        if (v == NULL)
            return -1;
        memset(v + old_bytes, 0, bytes - old_bytes);
        b->valid[i] = v;
    }
    for (int c = 0; c < NCODED; c++) {
        int32_t *p = realloc(b->codes[c], (size_t)cap * sizeof(int32_t));
        if (p == NULL)
            return -1;
        b->codes[c] = p;
    }
    for (int t = 0; t < NTEXT; t++) {
        int first = b->offsets[t] == NULL;
        int32_t *p = realloc(b->offsets[t], (size_t)(cap + 1) * sizeof(int32_t));
        if (p == NULL)
            return -1;
        if (first)
            p[0] = 0;
        b->offsets[t] = p;
    }
    b->cap = cap;
    return 0;
}

static int text_room(Text *t, Py_ssize_t more) {
    if (t->len + more <= t->cap)
        return 0;
    Py_ssize_t cap = t->cap ? t->cap * 2 : 4096;
    while (cap < t->len + more)
        cap *= 2;
    char *p = realloc(t->data, (size_t)cap);
    if (p == NULL)
        return -1;
    t->data = p;
    t->cap = cap;
    return 0;
}

static PyObject *refuse(int column, const char *message) {
    PyObject *msg = PyUnicode_FromString(message);
    if (msg == NULL)
        return NULL;
    PyObject *exc = schema_error ? PyObject_CallFunctionObjArgs(schema_error, table_name, msg, column_names[column],
                                                                NULL) : NULL;
    Py_DECREF(msg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_RuntimeError, "flowscope.client._span_recorder.configure() was not called");
    }
    return NULL;
}

/* 1: an exact int within int64 (in *out); 0: anything else, decided by normalize(). */
static inline int exact_int64(PyObject *v, int64_t *out) {
    if (!PyLong_CheckExact(v))
        return 0;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow)
        return 0;
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)x;
    return 1;
}

static inline int nullable_int64(PyObject *v, int64_t *out, int *has) {
    if (v == Py_None) {
        *has = 0;
        *out = 0;
        return 1;
    }
    *has = 1;
    return exact_int64(v, out);
}

/* The values that need no conversion, as C values. 1: done; 0: a value needs normalize(). attrs that is
   neither None nor str is left for the caller (*needs_json). */
static int convert(PyObject *const *v, Row *row, int *needs_json) {
    if (!exact_int64(v[START_NS], &row->ints[I_START]) || !exact_int64(v[END_NS], &row->ints[I_END]) ||
        row->ints[I_END] < row->ints[I_START])
        return 0;
    if (!nullable_int64(v[SPAN_ID], &row->ints[I_SPAN_ID], &row->has[0]) ||
        !nullable_int64(v[PARENT_ID], &row->ints[I_PARENT_ID], &row->has[1]))
        return 0;
    if (v[TASK_KEY] != Py_None && !PyUnicode_CheckExact(v[TASK_KEY]))
        return 0;
    *needs_json = v[ATTRS] != Py_None && !PyUnicode_CheckExact(v[ATTRS]);
    for (int c = 0; c < NCODED; c++) {
        if (!PyUnicode_CheckExact(v[RESOURCE_ID + c]))
            return 0;
        row->coded[c] = v[RESOURCE_ID + c];
    }
    return 1;
}

static int utf8_of(PyObject *v, int t, Row *row) {
    int column = t == 0 ? TASK_KEY : ATTRS;
    if (v == Py_None) {
        row->text[t] = NULL;
        row->text_len[t] = 0;
        return 0;
    }
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(v, &len);
    if (s == NULL) {
        PyErr_Clear();
        refuse(column, "is not valid Unicode text (it cannot be encoded as UTF-8)");
        return -1;
    }
    if (len > MAX_TEXT) {
        refuse(column, "is longer than 256 MiB");
        return -1;
    }
    row->text[t] = s;
    row->text_len[t] = len;
    return 0;
}

/* The codes of the row's coded values, adding new values to the dictionaries. May run Python code. */
static int look_up_codes(Buffer *b, Row *row) {
    for (int c = 0; c < NCODED; c++) {
        PyObject *v = row->coded[c];
        if (v == b->last[c]) {
            row->code[c] = b->last_code[c];
            continue;
        }
        PyObject *dict = b->dict[c];
        Py_INCREF(dict);
        PyObject *found = PyDict_GetItemWithError(dict, v);
        long code;
        if (found != NULL) {
            code = PyLong_AsLong(found);
        } else if (PyErr_Occurred()) {
            Py_DECREF(dict);
            return -1;
        } else {
            PyObject *values = b->values[c];
            code = (long)PyList_GET_SIZE(values);
            PyObject *key = PyLong_FromLong(code);
            if (key == NULL || PyDict_SetItem(dict, v, key) < 0 || PyList_Append(values, v) < 0) {
                Py_XDECREF(key);
                Py_DECREF(dict);
                return -1;
            }
            Py_DECREF(key);
        }
        Py_DECREF(dict);
        row->code[c] = (int32_t)code;
        Py_INCREF(v);
        Py_XSETREF(b->last[c], v);
        b->last_code[c] = (int32_t)code;
    }
    return 0;
}

static inline void set_bit(uint8_t *bits, Py_ssize_t i) { bits[i >> 3] |= (uint8_t)(1u << (i & 7)); }

/* Store the row (plain C: no Python code runs, so no other thread sees a half-stored record). */
static int commit(Buffer *b, const Row *row) {
    if (b->n >= b->cap && grow(b) < 0)
        return -1;
    for (int t = 0; t < NTEXT; t++)
        if (row->text[t] != NULL && text_room(&b->text[t], row->text_len[t]) < 0)
            return -1;
    Py_ssize_t i = b->n;
    for (int k = 0; k < 4; k++)
        b->ints[k][i] = row->ints[k];
    for (int k = 0; k < 2; k++) {
        if (row->has[k])
            set_bit(b->valid[k], i);
        else
            b->nulls[k]++;
    }
    for (int c = 0; c < NCODED; c++)
        b->codes[c][i] = row->code[c];
    for (int t = 0; t < NTEXT; t++) {
        Text *x = &b->text[t];
        if (row->text[t] != NULL) {
            memcpy(x->data + x->len, row->text[t], (size_t)row->text_len[t]);
            x->len += row->text_len[t];
            set_bit(b->valid[2 + t], i);
        } else {
            b->nulls[2 + t]++;
        }
        b->offsets[t][i + 1] = (int32_t)x->len;
    }
    b->n = i + 1;
    return 0;
}

/* Record one row of values in column order (borrowed references). */
static int record(Buffer *b, PyObject *const *values) {
    Row row;
    int needs_json = 0;
    PyObject *normalized = NULL, *json = NULL;
    PyObject *const *v = values;
    if (b->normalize == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "span buffer used before its __init__");
        return -1;
    }
    int ok = convert(v, &row, &needs_json);
    if (!ok) {
        normalized = PyObject_Vectorcall(b->normalize, values, NCOLS, NULL);
        if (normalized == NULL)
            return -1;
        if (!PyTuple_CheckExact(normalized) || PyTuple_GET_SIZE(normalized) != NCOLS) {
            PyErr_SetString(PyExc_SystemError, "normalize() must return a tuple of the 9 span values");
            goto fail;
        }
        v = &PyTuple_GET_ITEM(normalized, 0);
        if (!convert(v, &row, &needs_json) || needs_json) {
            PyErr_SetString(PyExc_SystemError, "normalize() returned a value the recorder cannot store");
            goto fail;
        }
    }
    PyObject *attrs = v[ATTRS];
    if (needs_json) {
        json = PyObject_CallOneArg(b->to_json, attrs);
        if (json == NULL)
            goto fail;
        if (!PyUnicode_CheckExact(json)) {
            PyErr_SetString(PyExc_TypeError, "to_json() must return a str");
            goto fail;
        }
        attrs = json;
    }
    if (utf8_of(v[TASK_KEY], 0, &row) < 0 || utf8_of(attrs, 1, &row) < 0)
        goto fail;
    for (;;) {
        uint64_t generation = b->generation;
        if (look_up_codes(b, &row) < 0)
            goto fail;
        if (generation == b->generation)
            break;
        /* a take() ran meanwhile and reset the dictionaries: these codes, and the ones remembered, are stale */
        for (int c = 0; c < NCODED; c++)
            Py_CLEAR(b->last[c]);
    }
    for (int t = 0; t < NTEXT; t++)
        if (b->text[t].len + row.text_len[t] > INT32_MAX) {  /* only without on_full, which hands text on sooner */
            refuse(t == 0 ? TASK_KEY : ATTRS, "does not fit the buffer: its text would pass 2 GiB");
            goto fail;
        }
    if (commit(b, &row) < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_XDECREF(normalized);
    Py_XDECREF(json);
    if (b->on_full != Py_None &&
        (b->n >= b->flush_rows || b->text[0].len >= MAX_TEXT || b->text[1].len >= MAX_TEXT)) {
        PyObject *r = PyObject_CallOneArg(b->on_full, (PyObject *)b);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
fail:
    Py_XDECREF(normalized);
    Py_XDECREF(json);
    return -1;
}

static PyObject *Buffer_add(Buffer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != NCOLS) {
        PyErr_Format(PyExc_TypeError, "add() takes the 9 values of a span in column order (%s, ...), got %zd",
                     COLUMN_NAMES[0], nargs);
        return NULL;
    }
    Py_INCREF(self);
    int r = record(self, args);
    Py_DECREF(self);
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Every record as memory blocks, the buffer emptied and its dictionaries reset. None when empty. */
static PyObject *Buffer_take(Buffer *self, PyObject *Py_UNUSED(ignored)) {
    if (self->n == 0)
        Py_RETURN_NONE;
    PyObject *dict[NCODED] = {NULL}, *values[NCODED] = {NULL};
    if (new_dictionaries(dict, values) < 0)
        return NULL;
    /* detach: plain C from here to the end of the swap */
    Buffer old = *self;
    for (int c = 0; c < NCODED; c++) {
        self->dict[c] = dict[c];
        self->values[c] = values[c];
        self->last[c] = NULL;
    }
    for (int i = 0; i < 4; i++) {
        self->ints[i] = NULL;
        self->valid[i] = NULL;
        self->nulls[i] = 0;
    }
    for (int c = 0; c < NCODED; c++)
        self->codes[c] = NULL;
    for (int t = 0; t < NTEXT; t++) {
        self->offsets[t] = NULL;
        self->text[t].data = NULL;
        self->text[t].len = self->text[t].cap = 0;
    }
    self->n = self->cap = 0;
    self->generation++;
    /* the swap is done: what follows may run Python code */
    Py_ssize_t n = old.n;
    PyObject *out = PyTuple_New(23);
    PyObject *item;
    int k = 0;
#define PUT(expr)                                                                                                  \
    do {                                                                                                           \
        item = (expr);                                                                                             \
        if (item == NULL)                                                                                          \
            goto fail;                                                                                             \
        PyTuple_SET_ITEM(out, k++, item);                                                                          \
    } while (0)
#define BLOCK(field, size)                                                                                         \
    do {                                                                                                           \
        void *data_ = (field);                                                                                     \
        (field) = NULL;                                                                                            \
        PUT(block_of(data_, (size)));                                                                              \
    } while (0)
    if (out == NULL)
        goto fail;
    PUT(PyLong_FromSsize_t(n));
    Py_ssize_t bitmap = (n + 7) / 8;
    BLOCK(old.ints[I_SPAN_ID], n * 8);
    BLOCK(old.valid[V_SPAN_ID], bitmap);
    PUT(PyLong_FromSsize_t(old.nulls[V_SPAN_ID]));
    BLOCK(old.ints[I_PARENT_ID], n * 8);
    BLOCK(old.valid[V_PARENT_ID], bitmap);
    PUT(PyLong_FromSsize_t(old.nulls[V_PARENT_ID]));
    for (int c = 0; c < NCODED; c++) {
        BLOCK(old.codes[c], n * 4);
        item = old.values[c];
        old.values[c] = NULL;
        PyTuple_SET_ITEM(out, k++, item);
    }
    BLOCK(old.ints[I_START], n * 8);
    BLOCK(old.ints[I_END], n * 8);
    for (int t = 0; t < NTEXT; t++) {
        BLOCK(old.offsets[t], (n + 1) * 4);
        BLOCK(old.text[t].data, old.text[t].len);
        BLOCK(old.valid[2 + t], bitmap);
        PUT(PyLong_FromSsize_t(old.nulls[2 + t]));
    }
#undef PUT
#undef BLOCK
    for (int c = 0; c < NCODED; c++) {
        Py_DECREF(old.dict[c]);
        Py_XDECREF(old.last[c]);
    }
    return out;
fail:
    Py_XDECREF(out);
    for (int c = 0; c < NCODED; c++) {
        Py_DECREF(old.dict[c]);
        Py_XDECREF(old.values[c]);
        Py_XDECREF(old.last[c]);
    }
    free_columns(&old);
    return NULL;
}

static PyMethodDef Buffer_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Buffer_add, METH_FASTCALL,
     "add(span_id, parent_id, resource_id, kind, name, start_ns, end_ns, task_key, attrs): record one span into "
     "this buffer, checked as Packer.add checks it (SchemaError naming the column)."},
    {"_take", (PyCFunction)Buffer_take, METH_NOARGS,
     "Every record as memory blocks (see span_recorder.py), the buffer emptied; None when empty."},
    {NULL}
};

static PyMemberDef Buffer_members[] = {
    {"rid", T_OBJECT, offsetof(Buffer, rid), 0, "the default resource id of the recorder's span()"},
    {"flush_rows", T_PYSSIZET, offsetof(Buffer, flush_rows), READONLY, "records that make a batch"},
    {NULL}
};

static PySequenceMethods Buffer_as_sequence = {.sq_length = (lenfunc)Buffer_len};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flowscope.client._span_recorder.Buffer",
    .tp_basicsize = sizeof(Buffer),
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_as_sequence = &Buffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One thread's spans in C column buffers (see flowscope.client.span_recorder).",
    .tp_traverse = (traverseproc)Buffer_traverse,
    .tp_clear = (inquiry)Buffer_clear,
    .tp_weaklistoffset = offsetof(Buffer, weakrefs),
    .tp_dictoffset = offsetof(Buffer, dict_),
    .tp_methods = Buffer_methods,
    .tp_members = Buffer_members,
    .tp_init = (initproc)Buffer_init,
    .tp_new = PyType_GenericNew,
};

/* ---- Recorder: Client.span and the spans row writer -------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *key;     /* this recorder's key in each thread's state dict */
    PyObject *first;   /* first(): the calling thread's Buffer, made on its first record */
} Recorder;

static unsigned long long recorders_made;

/* The calling thread's buffer, a new reference. */
static Buffer *thread_buffer(Recorder *self) {
    PyObject *tdict = PyThreadState_GetDict();
    if (tdict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no thread state dictionary");
        return NULL;
    }
    PyObject *ref = PyDict_GetItemWithError(tdict, self->key);
    if (ref != NULL) {
#if PY_VERSION_HEX >= 0x030D0000
        PyObject *obj;
        if (PyWeakref_GetRef(ref, &obj) < 0)
            return NULL;
        if (obj != NULL)
            return (Buffer *)obj;
#else
        PyObject *obj = PyWeakref_GetObject(ref);
        if (obj == NULL)
            return NULL;
        if (obj != Py_None) {
            Py_INCREF(obj);
            return (Buffer *)obj;
        }
#endif
    } else if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *obj = PyObject_CallNoArgs(self->first);
    if (obj == NULL)
        return NULL;
    if (!PyObject_TypeCheck(obj, &BufferType)) {
        PyErr_SetString(PyExc_TypeError, "first() must return a span_recorder Buffer");
        Py_DECREF(obj);
        return NULL;
    }
    PyObject *wr = PyWeakref_NewRef(obj, NULL);
    if (wr == NULL || PyDict_SetItem(tdict, self->key, wr) < 0) {
        Py_XDECREF(wr);
        Py_DECREF(obj);
        return NULL;
    }
    Py_DECREF(wr);
    return (Buffer *)obj;
}

static int keyword_index(PyObject *name) {
    for (int i = 0; i < NCOLS; i++)
        if (name == column_names[i])
            return i;
    for (int i = 0; i < NCOLS; i++) {
        int eq = PyUnicode_Compare(name, column_names[i]);
        if (eq == 0)
            return i;
        if (eq == -1 && PyErr_Occurred())
            PyErr_Clear();
    }
    return -1;
}

static const int POSITIONAL[3] = {NAME, START_NS, END_NS};

static PyObject *Recorder_vectorcall(Recorder *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *v[NCOLS] = {NULL};
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "span() takes from 1 to 3 positional arguments but %zd were given", nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        v[POSITIONAL[i]] = args[i];
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t j = 0; j < nkw; j++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, j);
            int i = keyword_index(name);
            if (i < 0) {
                PyErr_Format(PyExc_TypeError, "span() got an unexpected keyword argument '%U'", name);
                return NULL;
            }
            if (v[i] != NULL) {
                PyErr_Format(PyExc_TypeError, "span() got multiple values for argument '%U'", name);
                return NULL;
            }
            v[i] = args[nargs + j];
        }
    }
    for (int k = 0; k < 3; k++)
        if (v[POSITIONAL[k]] == NULL) {
            PyErr_Format(PyExc_TypeError, "span() missing required argument '%s'", COLUMN_NAMES[POSITIONAL[k]]);
            return NULL;
        }
    if (v[KIND] == NULL)
        v[KIND] = default_kind;
    for (int i = 0; i < NCOLS; i++)
        if (v[i] == NULL)
            v[i] = Py_None;
    Buffer *b = thread_buffer(self);
    if (b == NULL)
        return NULL;
    /* resource_id = resource_id or the thread's resource id */
    PyObject *r = v[RESOURCE_ID];
    int truthy = r == Py_None ? 0 : PyUnicode_CheckExact(r) ? PyUnicode_GET_LENGTH(r) > 0 : PyObject_IsTrue(r);
    if (truthy < 0) {
        Py_DECREF(b);
        return NULL;
    }
    PyObject *rid = NULL;
    if (!truthy) {
        rid = b->rid;
        Py_INCREF(rid);
        v[RESOURCE_ID] = rid;
    }
    int status = record(b, v);
    Py_XDECREF(rid);
    Py_DECREF(b);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Recorder_row(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != NCOLS) {
        PyErr_Format(PyExc_TypeError, "row() takes the 9 values of a span in column order (%s, ...), got %zd",
                     COLUMN_NAMES[0], nargs);
        return NULL;
    }
    Buffer *b = thread_buffer(self);
    if (b == NULL)
        return NULL;
    int status = record(b, args);
    Py_DECREF(b);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Recorder_buffer(Recorder *self, PyObject *Py_UNUSED(ignored)) {
    return (PyObject *)thread_buffer(self);
}

static PyObject *Recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"first", NULL};
    PyObject *first;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &first))
        return NULL;
    if (!PyCallable_Check(first)) {
        PyErr_SetString(PyExc_TypeError, "first must be callable");
        return NULL;
    }
    Recorder *self = (Recorder *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)Recorder_vectorcall;
    self->key = PyUnicode_FromFormat("flowscope.span_recorder.%llu", ++recorders_made);
    if (self->key == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyUnicode_InternInPlace(&self->key);
    Py_INCREF(first);
    self->first = first;
    return (PyObject *)self;
}

static int Recorder_traverse(Recorder *self, visitproc visit, void *arg) {
    Py_VISIT(self->first);
    return 0;
}

static int Recorder_clear(Recorder *self) {
    Py_CLEAR(self->first);
    return 0;
}

static void Recorder_dealloc(Recorder *self) {
    PyObject_GC_UnTrack(self);
    Recorder_clear(self);
    Py_CLEAR(self->key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Recorder_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

static PyMethodDef Recorder_methods[] = {
    {"row", (PyCFunction)(void (*)(void))Recorder_row, METH_FASTCALL,
     "row(span_id, parent_id, resource_id, kind, name, start_ns, end_ns, task_key, attrs): record one span into "
     "the calling thread's buffer (the spans row writer)."},
    {"buffer", (PyCFunction)Recorder_buffer, METH_NOARGS, "The calling thread's buffer (made if it has none)."},
    {NULL}
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flowscope.client._span_recorder.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_dealloc = (destructor)Recorder_dealloc,
    .tp_vectorcall_offset = offsetof(Recorder, vectorcall),
    .tp_call = Recorder_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Recorder(first): called as span(name, start_ns, end_ns, *, kind='call', resource_id=None, "
              "task_key=None, attrs=None, span_id=None, parent_id=None), records an interval [start_ns, end_ns] "
              "on a resource (default: the calling thread) into the calling thread's buffer, which first() makes.",
    .tp_traverse = (traverseproc)Recorder_traverse,
    .tp_clear = (inquiry)Recorder_clear,
    .tp_methods = Recorder_methods,
    .tp_new = Recorder_new,
};

/* ---- module ------------------------------------------------------------------------------------------------ */
static PyObject *configure(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *error;
    if (!PyArg_ParseTuple(args, "O", &error))
        return NULL;
    Py_INCREF(error);
    Py_XSETREF(schema_error, error);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, "configure(SchemaError): the exception class of refusals made in C."},
    {NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_span_recorder",
    "Per-record span recording into C column buffers (flowscope.client.span_recorder is its Python face).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__span_recorder(void) {
    for (int i = 0; i < NCOLS; i++) {
        column_names[i] = PyUnicode_InternFromString(COLUMN_NAMES[i]);
        if (column_names[i] == NULL)
            return NULL;
    }
    default_kind = PyUnicode_InternFromString("call");
    table_name = PyUnicode_InternFromString("spans");
    if (default_kind == NULL || table_name == NULL)
        return NULL;
    if (PyType_Ready(&BlockType) < 0 || PyType_Ready(&BufferType) < 0 || PyType_Ready(&RecorderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&BufferType);
    Py_INCREF(&RecorderType);
    Py_INCREF(&BlockType);
    if (PyModule_AddObject(m, "Buffer", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObject(m, "Recorder", (PyObject *)&RecorderType) < 0 ||
        PyModule_AddObject(m, "Block", (PyObject *)&BlockType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
