/* The per-task path of the local-scheduler capture (flowscope/sources/dask/local.py), compiled: Dask's start_state
 * and posttask callbacks, and the wrapper that measures a task on the thread that runs it.
 *
 * local.py keeps a pure-Python reference of everything here (compiled=False, FLOWSCOPE_COMPILED=0): the same
 * objects with the same attribute names, storing the same values, so that everything out of the common case (a
 * task that raised, one run in a worker process, a measured task's I/O rows, the rows themselves) is decided by
 * the same Python code on both paths.
 *
 *   ThreadState   one executing thread as its tasks see it (kept in the thread's state dictionary)
 *   MeasuredTask  a task wrapped by start_state: its first call runs the task and notes start, end (CLOCK_REALTIME,
 *                 as time.time_ns), its thread, the exception type, the result's size and -- when the call took
 *                 min_ns or more -- the thread's I/O counters (core.read(tid)), then records the task into its
 *                 graph, as local.MeasuredTask does
 *   Core          one graph's per-task state: key -> index, the threads that ran its tasks, and the tasks that ran
 *                 as C columns (index, start, end, nbytes, thread slot, flags); a Python class
 *                 (local._CompiledGraph) derives from it. take() hands the columns on as bytes, with a code for each
 *                 task's group (a tuple key's first item, or the key itself).
 *   Hook          start_state(dsk, state), once per graph: every task wrapped; or posttask(key, result, dsk, state,
 *                 worker_id), per task: a batch written when one is due, a task run in a worker process noted
 *
 * Per task, only what cannot wait is done, on the thread that ran it: the clock reads, the thread and the result's
 * size (dask.sizeof, looked up once per type); group codes are found per batch and the text of the rows is put
 * together by Arrow for a whole batch (local.py, _flush).
 *
 * Thread safety rests on the GIL: a wrapper writes its own task, its thread's state, and its graph's columns and
 * lists with no Python code run between reading their length and writing them; take(), on the thread that called
 * compute, hands them on the same way before it runs anything that could let another thread in.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static PyObject *state_key;    /* the ThreadState's key in each thread's state dictionary */
static PyObject *new_state;    /* configure(): () -> a ThreadState for the calling thread */
static PyObject *remote_type;  /* configure(): local._RemoteMeasuredTask */
static PyObject *str_spool, *str_io, *str_class, *str_cache;

static inline int64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

enum { F_NBYTES = 1, F_MEASURED = 2 };

/* ---- ThreadState ---------------------------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    long long tid;
    unsigned long ident;
    PyObject *name;
    PyObject *last;       /* the last counter reading (bytes or None) */
    long long last_ns;    /* when it was taken */
    long long pending;    /* calls since then whose I/O it does not hold */
    long long gen;        /* the graph those calls were for */
    PyObject *key;        /* the task running on this thread now, or None */
    long long slot;       /* this thread's position in its graph's threads */
} ThreadState;

static int ThreadState_traverse(ThreadState *self, visitproc visit, void *arg) {
    Py_VISIT(self->name);
    Py_VISIT(self->last);
    Py_VISIT(self->key);
    return 0;
}

static int ThreadState_clear(ThreadState *self) {
    Py_CLEAR(self->name);
    Py_CLEAR(self->last);
    Py_CLEAR(self->key);
    return 0;
}

static void ThreadState_dealloc(ThreadState *self) {
    PyObject_GC_UnTrack(self);
    ThreadState_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ThreadState_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"tid", "ident", "name", NULL};
    long long tid;
    unsigned long ident;
    PyObject *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LkO", kwlist, &tid, &ident, &name))
        return NULL;
    ThreadState *self = (ThreadState *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->tid = tid;
    self->ident = ident;
    Py_INCREF(name);
    self->name = name;
    Py_INCREF(Py_None);
    self->last = Py_None;
    Py_INCREF(Py_None);
    self->key = Py_None;
    self->gen = -1;
    return (PyObject *)self;
}

static PyMemberDef ThreadState_members[] = {
    {"tid", T_LONGLONG, offsetof(ThreadState, tid), READONLY, "native thread id"},
    {"ident", T_ULONG, offsetof(ThreadState, ident), READONLY, "pthread id (threading.get_ident)"},
    {"name", T_OBJECT, offsetof(ThreadState, name), READONLY, "thread name"},
    {"last", T_OBJECT, offsetof(ThreadState, last), 0, "the last counter reading"},
    {"last_ns", T_LONGLONG, offsetof(ThreadState, last_ns), 0, "when it was taken"},
    {"pending", T_LONGLONG, offsetof(ThreadState, pending), 0, "calls whose I/O the last reading does not hold"},
    {"gen", T_LONGLONG, offsetof(ThreadState, gen), 0, "the graph of those calls"},
    {"key", T_OBJECT, offsetof(ThreadState, key), 0, "the task running on this thread, or None"},
    {"slot", T_LONGLONG, offsetof(ThreadState, slot), 0, "position in the graph's threads"},
    {NULL}
};

static PyTypeObject ThreadStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flowscope.sources.dask._local_tasks.ThreadState",
    .tp_basicsize = sizeof(ThreadState),
    .tp_dealloc = (destructor)ThreadState_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ThreadState(tid, ident, name): one thread that runs tasks, as its tasks see it.",
    .tp_traverse = (traverseproc)ThreadState_traverse,
    .tp_clear = (inquiry)ThreadState_clear,
    .tp_members = ThreadState_members,
    .tp_new = ThreadState_new,
};

/* The calling thread's ThreadState (borrowed), made by new_state() on its first task. */
static ThreadState *thread_state(void) {
    PyObject *tdict = PyThreadState_GetDict();
    if (tdict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no thread state dictionary");
        return NULL;
    }
    PyObject *st = PyDict_GetItemWithError(tdict, state_key);
    if (st != NULL)
        return (ThreadState *)st;
    if (PyErr_Occurred())
        return NULL;
    if (new_state == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "flowscope.sources.dask._local_tasks.configure() was not called");
        return NULL;
    }
    st = PyObject_CallNoArgs(new_state);
    if (st == NULL)
        return NULL;
    if (!PyObject_TypeCheck(st, &ThreadStateType)) {
        Py_DECREF(st);
        PyErr_SetString(PyExc_TypeError, "new_state() must return a ThreadState");
        return NULL;
    }
    int r = PyDict_SetItem(tdict, state_key, st);
    Py_DECREF(st);  /* the thread's dictionary keeps it */
    return r < 0 ? NULL : (ThreadState *)st;
}

static PyObject *current(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    PyObject *tdict = PyThreadState_GetDict();
    PyObject *st = tdict ? PyDict_GetItemWithError(tdict, state_key) : NULL;
    if (st == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(st);
    return st;
}

/* ---- Core: one graph ----------------------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    PyObject *keys, *pos, *read, *threads, *flush, *sizers, *sizer_of, *measured, *slow, *heads, *tuple_heads,
        *other_heads;
    long long gen, min_ns, flush_tasks, flush_every_ns, next_flush, pending, lost;
    unsigned long caller;
    int live, shipped;
    Py_ssize_t n, cap;
    int64_t *index, *t0, *t1, *nbytes;
    int32_t *slot;
    uint8_t *flags;
    PyObject *dict_, *weakrefs;
} Core;

#define CORE_OBJECTS(X) X(keys) X(pos) X(read) X(threads) X(flush) X(sizers) X(sizer_of) X(measured) X(slow) \
    X(heads) X(tuple_heads) X(other_heads) X(dict_)

static int Core_traverse(Core *self, visitproc visit, void *arg) {
#define V(f) Py_VISIT(self->f);
    CORE_OBJECTS(V)
#undef V
    return 0;
}

static int Core_clear(Core *self) {
#define C(f) Py_CLEAR(self->f);
    CORE_OBJECTS(C)
#undef C
    return 0;
}

static void free_columns(Core *c) {
    free(c->index); free(c->t0); free(c->t1); free(c->nbytes); free(c->slot); free(c->flags);
    c->index = c->t0 = c->t1 = c->nbytes = NULL;
    c->slot = NULL;
    c->flags = NULL;
    c->n = c->cap = 0;
}

static void Core_dealloc(Core *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Core_clear(self);
    free_columns(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Core_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Core *self = (Core *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->measured = PyList_New(0);
    self->slow = PyList_New(0);
    self->heads = PyList_New(0);
    self->tuple_heads = PyDict_New();
    self->other_heads = PyDict_New();
    self->threads = PyList_New(0);
    if (!self->measured || !self->slow || !self->heads || !self->tuple_heads || !self->other_heads || !self->threads) {
        Py_DECREF(self);
        return NULL;
    }
    self->gen = -2;
    self->flush_tasks = 4096;
    self->flush_every_ns = 1000000000LL;
    self->next_flush = now_ns(CLOCK_MONOTONIC) + self->flush_every_ns;
    return (PyObject *)self;
}

#define GROW(field, type)                                                                                          \
    do {                                                                                                           \
        type *p_ = realloc(c->field, (size_t)cap * sizeof(type));                                                  \
        if (p_ == NULL)                                                                                            \
            return -1;                                                                                             \
        c->field = p_;                                                                                             \
    } while (0)

static int grow(Core *c) {
    Py_ssize_t cap = c->cap ? c->cap * 2 : 1024;
    GROW(index, int64_t); GROW(t0, int64_t); GROW(t1, int64_t); GROW(nbytes, int64_t);
    GROW(slot, int32_t); GROW(flags, uint8_t);
    c->cap = cap;
    return 0;
}

/* The code of key's group: a tuple key's first item, or the key itself (dictionaries apart, as the two can share
   a value and not a group); a new one is appended to heads with the key that introduced it. */
static int head_code(Core *c, PyObject *key, int32_t *code) {
    PyObject *d, *hk;
    if (PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) > 0) {
        d = c->tuple_heads;
        hk = PyTuple_GET_ITEM(key, 0);
    } else {
        d = c->other_heads;
        hk = key;
    }
    PyObject *found = PyDict_GetItemWithError(d, hk);
    if (found != NULL) {
        *code = (int32_t)PyLong_AsLong(found);
        return 0;
    }
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(c->heads);
    PyObject *v = PyLong_FromSsize_t(n);
    if (v == NULL)
        return -1;
    int r = PyDict_SetItem(d, hk, v);
    Py_DECREF(v);
    if (r < 0 || PyList_Append(c->heads, key) < 0)
        return -1;
    *code = (int32_t)n;
    return 0;
}

static PyObject *bytes_of(const void *p, Py_ssize_t size) {
    return PyBytes_FromStringAndSize(size ? (const char *)p : "", size);
}

/* (n, index, start, end, nbytes, slot, head, flags, measured, slow): the columns as bytes (int64 x 4, int32 x 2,
   uint8), the measured tasks (their I/O rows) and the ones out of the common case; all emptied. The group codes
   (head) are found here, for the whole batch, after the columns are taken: finding one hashes a key, which pool
   threads recording their tasks meanwhile must not see half done. */
static PyObject *Core_take(Core *self, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t n = self->n;
    PyObject *measured = PyList_New(0), *slow = PyList_New(0);
    if (measured == NULL || slow == NULL) {
        Py_XDECREF(measured);
        Py_XDECREF(slow);
        return NULL;
    }
    PyObject *index = bytes_of(self->index, n * 8), *t0 = bytes_of(self->t0, n * 8), *t1 = bytes_of(self->t1, n * 8),
             *nbytes = bytes_of(self->nbytes, n * 8), *slot = bytes_of(self->slot, n * 4),
             *flags = bytes_of(self->flags, n), *taken_measured = self->measured, *taken_slow = self->slow;
    if (!index || !t0 || !t1 || !nbytes || !slot || !flags) {
        Py_XDECREF(index); Py_XDECREF(t0); Py_XDECREF(t1); Py_XDECREF(nbytes); Py_XDECREF(slot); Py_XDECREF(flags);
        Py_DECREF(measured);
        Py_DECREF(slow);
        return NULL;
    }
    self->measured = measured;  /* (the taken lists' references move to the result) */
    self->slow = slow;
    self->n = 0;
    self->pending = 0;
    self->next_flush = now_ns(CLOCK_MONOTONIC) + self->flush_every_ns;
    PyObject *head = PyBytes_FromStringAndSize(NULL, n * 4);
    if (head != NULL) {
        const int64_t *at = (const int64_t *)PyBytes_AS_STRING(index);
        int32_t *code = (int32_t *)PyBytes_AS_STRING(head);
        Py_ssize_t nkeys = PyList_GET_SIZE(self->keys);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (at[i] < 0 || at[i] >= nkeys) {
                PyErr_Format(PyExc_IndexError, "take(): task index %lld outside the graph's %zd keys", (long long)at[i],
                             nkeys);
                Py_CLEAR(head);
                break;
            }
            if (head_code(self, PyList_GET_ITEM(self->keys, at[i]), &code[i]) < 0) {
                Py_CLEAR(head);
                break;
            }
        }
    }
    if (head == NULL) {
        Py_DECREF(index); Py_DECREF(t0); Py_DECREF(t1); Py_DECREF(nbytes); Py_DECREF(slot); Py_DECREF(flags);
        Py_DECREF(taken_measured);
        Py_DECREF(taken_slow);
        return NULL;
    }
    return Py_BuildValue("(nNNNNNNNNN)", n, index, t0, t1, nbytes, slot, head, flags, taken_measured, taken_slow);
}

static PyMemberDef Core_members[] = {
    {"keys", T_OBJECT, offsetof(Core, keys), 0, "index -> key"},
    {"pos", T_OBJECT, offsetof(Core, pos), 0, "key -> index"},
    {"read", T_OBJECT, offsetof(Core, read), 0, "read(tid): a thread's counter reading (bytes or None)"},
    {"threads", T_OBJECT, offsetof(Core, threads), 0, "ThreadStates of the threads that ran tasks (slot order)"},
    {"flush", T_OBJECT, offsetof(Core, flush), 0, "flush(): called once flush_tasks tasks, or flush_every_ns, wait"},
    {"sizers", T_OBJECT, offsetof(Core, sizers), 0, "type -> its dask.sizeof function"},
    {"sizer_of", T_OBJECT, offsetof(Core, sizer_of), 0, "sizer_of(type): its function, cached in sizers"},
    {"measured", T_OBJECT, offsetof(Core, measured), READONLY, "measured tasks since take()"},
    {"slow", T_OBJECT, offsetof(Core, slow), READONLY, "tasks out of the common case since take()"},
    {"heads", T_OBJECT, offsetof(Core, heads), READONLY, "group code -> the key that introduced it"},
    {"gen", T_LONGLONG, offsetof(Core, gen), 0, "this graph's number"},
    {"min_ns", T_LONGLONG, offsetof(Core, min_ns), 0, "calls this long or longer have their counters read"},
    {"flush_tasks", T_LONGLONG, offsetof(Core, flush_tasks), 0, "tasks that make a batch"},
    {"flush_every_ns", T_LONGLONG, offsetof(Core, flush_every_ns), 0, "the longest wait between batches"},
    {"next_flush", T_LONGLONG, offsetof(Core, next_flush), 0, "time.monotonic_ns() at which the next batch is due"},
    {"pending", T_LONGLONG, offsetof(Core, pending), 0, "tasks done since the last take()"},
    {"caller", T_ULONG, offsetof(Core, caller), 0, "ident of the thread that called compute"},
    {"live", T_INT, offsetof(Core, live), 0, "its tasks record themselves (between start_state and finish)"},
    {"shipped", T_INT, offsetof(Core, shipped), 0, "a task was pickled: the graph runs in worker processes"},
    {"lost", T_LONGLONG, offsetof(Core, lost), 0, "tasks whose record failed (out of memory)"},
    {NULL}
};

static PyMethodDef Core_methods[] = {
    {"take", (PyCFunction)Core_take, METH_NOARGS,
     "(n, index, start_ns, end_ns, nbytes, slot, head, flags, measured, slow) of the tasks done since the last take."},
    {NULL}
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flowscope.sources.dask._local_tasks.Core",
    .tp_basicsize = sizeof(Core),
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One graph's per-task state and its done tasks as columns (see local.py).",
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_weaklistoffset = offsetof(Core, weakrefs),
    .tp_dictoffset = offsetof(Core, dict_),
    .tp_members = Core_members,
    .tp_methods = Core_methods,
    .tp_new = Core_new,
};

/* ---- MeasuredTask -------------------------------------------------------------------------------------------- */
/* Not a GC type: wrapping every task of a graph at once would otherwise start collections that scan objects which
 * live as long as the computation. A wrapper is in no reference cycle once its call has returned (its thread's
 * state lets go of it then) and its graph's take() has handed it on; a graph that is no longer live (finish)
 * takes no more of them. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *task;
    Core *graph;
    Py_ssize_t index;
    long long submitted, t0, t1, calls, seen, slot;
    int recorded;
    PyObject *st, *before, *after, *error, *nbytes, *worker;
} MeasuredTask;

#define TASK_OBJECTS(X) X(task) X(graph) X(st) X(before) X(after) X(error) X(nbytes) X(worker)

static void MeasuredTask_dealloc(MeasuredTask *self) {
#define C(f) Py_CLEAR(self->f);
    TASK_OBJECTS(C)
#undef C
    PyObject_Free(self);
}

static PyTypeObject MeasuredTaskType;

/* A counter reading of thread tid (None when the graph reads none or the read failed: the task matters more). */
static PyObject *reading(Core *g, long long tid) {
    if (g->read == NULL || g->read == Py_None)
        Py_RETURN_NONE;
    PyObject *t = PyLong_FromLongLong(tid);
    PyObject *r = t ? PyObject_CallOneArg(g->read, t) : NULL;
    Py_XDECREF(t);
    if (r == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return r;
}

static PyObject *size_of(Core *g, PyObject *result);

/* The task's size as an int64 (*nb; *sized: it is one), from nbytes (an int, or None when Dask cannot size it). */
static int int64_size(PyObject *nbytes, long long *nb) {
    if (!PyLong_CheckExact(nbytes))
        return 0;
    int overflow;
    *nb = PyLong_AsLongLongAndOverflow(nbytes, &overflow);
    int sized = !overflow && !(*nb == -1 && PyErr_Occurred());
    PyErr_Clear();
    if (!sized)
        *nb = 0;
    return sized;
}

/* A task that ran here, into its graph: the columns when it returned a result of a size the columns hold, else the
 * graph's slow list. No Python code runs between reading the columns' length and writing them (pool threads record
 * at once, under the GIL); -1 with an error set when out of memory. */
static int record(MeasuredTask *self, Core *g, PyObject *nbytes) {
    long long nb = 0;
    int sized = int64_size(nbytes, &nb);
    if (!g->live)
        return 0;  /* the graph ended (finish) while the task ran */
    if (self->error != Py_None || !(sized || nbytes == Py_None)) {
        Py_INCREF(nbytes);
        Py_XSETREF(self->nbytes, nbytes);
        return PyList_Append(g->slow, (PyObject *)self);
    }
    if (g->n >= g->cap && grow(g) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    int measured = self->before != NULL && self->before != Py_None && self->after != NULL && self->after != Py_None;
    if (measured && PyList_Append(g->measured, (PyObject *)self) < 0)
        return -1;
    Py_ssize_t i = g->n++;
    g->index[i] = self->index;
    g->t0[i] = self->t0;
    g->t1[i] = self->t1;
    g->nbytes[i] = nb;
    g->slot[i] = (int32_t)self->slot;
    g->flags[i] = (uint8_t)((sized ? F_NBYTES : 0) | (measured ? F_MEASURED : 0));
    return 0;
}

static PyObject *MeasuredTask_vectorcall(MeasuredTask *self, PyObject *const *args, size_t nargsf,
                                         PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Core *g = self->graph;
    /* a task is measured once, by its first call (Dask reruns a task that raised, with rerun_exceptions_locally) */
    ThreadState *st = self->recorded || !g->live ? NULL : thread_state();
    if (st != NULL && st->gen != g->gen) {  /* this thread's first task of this graph: its counters before it */
        if (PyList_Append(g->threads, (PyObject *)st) < 0) {
            st = NULL;
        } else {
            /* the slot before the reading: reading calls Python, where another thread may append its own state */
            st->slot = PyList_GET_SIZE(g->threads) - 1;
            st->gen = g->gen;
            PyObject *before = reading(g, st->tid);
            Py_SETREF(st->last, before);
            st->last_ns = now_ns(CLOCK_REALTIME);
            st->pending = 0;
        }
    }
    if (st == NULL) {  /* not measured (run before, or out of memory): the task runs all the same */
        if (PyErr_Occurred()) {
            PyErr_Clear();
            g->lost++;
        }
        return PyObject_Vectorcall(self->task, args, nargs, kwnames);
    }
    self->recorded = 1;
    Py_INCREF(g);
    Py_INCREF(st);
    self->slot = st->slot;
    Py_INCREF(self);
    Py_SETREF(st->key, (PyObject *)self);
    int64_t t0 = now_ns(CLOCK_REALTIME);
    PyObject *result;
    if (nargs == 0 && kwnames == NULL) {
        PyObject *empty = PyTuple_New(0);
        result = empty ? PyObject_CallOneArg(self->task, empty) : NULL;
        Py_XDECREF(empty);
    } else {
        result = PyObject_Vectorcall(self->task, args, nargs, kwnames);
    }
    int64_t t1 = now_ns(CLOCK_REALTIME);
    PyObject *et = NULL, *ev = NULL, *tb = NULL;
    if (result == NULL) {
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *name = et ? PyType_GetName((PyTypeObject *)et) : NULL;
        if (name == NULL)
            PyErr_Clear();
        Py_XSETREF(self->error, name);
    }
    self->t1 = t1;
    self->t0 = t0;
    Py_INCREF(Py_None);
    Py_SETREF(st->key, Py_None);
    Py_INCREF(st);
    Py_XSETREF(self->st, (PyObject *)st);
    if (t1 - t0 >= g->min_ns) {  /* measured: its I/O and that of the calls since the last reading */
        Py_INCREF(st->last);
        Py_XSETREF(self->before, st->last);
        self->calls = st->pending + 1;
        PyObject *after = reading(g, st->tid);
        Py_INCREF(after);
        Py_XSETREF(self->after, after);
        Py_SETREF(st->last, after);
        st->last_ns = t1;
        st->pending = 0;
    } else {  /* a shorter call: its I/O goes into the thread's next reading */
        Py_INCREF(Py_None);
        Py_XSETREF(self->before, Py_None);
        st->pending++;
    }
    Py_DECREF(st);
    /* its size as dask.sizeof gives it, here rather than in the scheduler's loop */
    PyObject *nbytes = result != NULL ? size_of(g, result) : Py_NewRef(Py_None);
    if (nbytes == NULL || record(self, g, nbytes) < 0) {  /* out of memory: the task's result matters more */
        PyErr_Clear();
        g->lost++;
    }
    Py_XDECREF(nbytes);
    Py_DECREF(g);
    if (result == NULL)
        PyErr_Restore(et, ev, tb);
    return result;
}

static PyObject *MeasuredTask_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

/* Attributes the wrapper lacks are the task's (key, dependencies, ...), and so is its __class__: isinstance() then
 * sees the task's class, as Dask's own code does when it meets the wrapper in the graph (get_dependencies, when it
 * reruns a task that raised); type() still tells the wrapper. */
static PyObject *MeasuredTask_getattro(MeasuredTask *self, PyObject *name) {
    if (name == str_class || (PyUnicode_Check(name) && PyUnicode_Compare(name, str_class) == 0))
        return Py_NewRef((PyObject *)Py_TYPE(self->task));
    PyObject *r = PyObject_GenericGetAttr((PyObject *)self, name);
    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return r;
    PyErr_Clear();
    return PyObject_GetAttr(self->task, name);  /* key, dependencies, ...: the task's */
}

static PyObject *MeasuredTask_repr(MeasuredTask *self) { return PyObject_Repr(self->task); }

/* Pickled (the processes scheduler), it becomes local._RemoteMeasuredTask, which measures in the worker process;
 * its graph then runs in worker processes (posttask has their tasks to note). */
static PyObject *MeasuredTask_reduce(MeasuredTask *self, PyObject *Py_UNUSED(ignored)) {
    self->graph->shipped = 1;
    self->submitted = now_ns(CLOCK_REALTIME);
    if (remote_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "flowscope.sources.dask._local_tasks.configure() was not called");
        return NULL;
    }
    PyObject *spool = PyObject_GetAttr((PyObject *)self->graph, str_spool);
    PyObject *io = spool ? PyObject_GetAttr((PyObject *)self->graph, str_io) : NULL;
    if (io == NULL) {
        Py_XDECREF(spool);
        return NULL;
    }
    return Py_BuildValue("(O(OnNN))", remote_type, self->task, self->index, spool, io);
}

static PyMemberDef MeasuredTask_members[] = {
    {"task", T_OBJECT, offsetof(MeasuredTask, task), READONLY, "the task"},
    {"graph", T_OBJECT, offsetof(MeasuredTask, graph), READONLY, "its graph"},
    {"index", T_PYSSIZET, offsetof(MeasuredTask, index), READONLY, "its key's index in the graph"},
    {"submitted", T_LONGLONG, offsetof(MeasuredTask, submitted), READONLY, "when it was pickled for a worker process"},
    {"recorded", T_INT, offsetof(MeasuredTask, recorded), READONLY, "its measurement is in its graph"},
    {"t0", T_LONGLONG, offsetof(MeasuredTask, t0), READONLY, "start (0: not run in this process)"},
    {"t1", T_LONGLONG, offsetof(MeasuredTask, t1), READONLY, "end"},
    {"calls", T_LONGLONG, offsetof(MeasuredTask, calls), READONLY, "task calls its counter reading holds"},
    {"seen", T_LONGLONG, offsetof(MeasuredTask, seen), 0, "when the scheduler saw it done"},
    {"slot", T_LONGLONG, offsetof(MeasuredTask, slot), READONLY, "its thread's position in the graph's threads"},
    {"st", T_OBJECT, offsetof(MeasuredTask, st), READONLY, "the ThreadState that ran it"},
    {"before", T_OBJECT, offsetof(MeasuredTask, before), READONLY, "counter reading before (None: not measured)"},
    {"after", T_OBJECT, offsetof(MeasuredTask, after), READONLY, "counter reading after"},
    {"error", T_OBJECT, offsetof(MeasuredTask, error), READONLY, "the type name of what it raised, or None"},
    {"nbytes", T_OBJECT, offsetof(MeasuredTask, nbytes), 0, "its result's size"},
    {"worker", T_OBJECT, offsetof(MeasuredTask, worker), 0, "the worker id Dask reported"},
    {NULL}
};

static PyMethodDef MeasuredTask_methods[] = {
    {"__reduce__", (PyCFunction)MeasuredTask_reduce, METH_NOARGS, "pickled as a _RemoteMeasuredTask"},
    {NULL}
};

static PyTypeObject MeasuredTaskType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flowscope.sources.dask._local_tasks.MeasuredTask",
    .tp_basicsize = sizeof(MeasuredTask),
    .tp_dealloc = (destructor)MeasuredTask_dealloc,
    .tp_vectorcall_offset = offsetof(MeasuredTask, vectorcall),
    .tp_call = MeasuredTask_call,
    .tp_repr = (reprfunc)MeasuredTask_repr,
    .tp_getattro = (getattrofunc)MeasuredTask_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A task wrapped to be measured where it runs (local.MeasuredTask, compiled).",
    .tp_members = MeasuredTask_members,
    .tp_methods = MeasuredTask_methods,
};

/* ---- Hook: Dask's start_state and posttask ------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *graphs;  /* id(dsk) -> Core */
    PyObject *failed;  /* failed(exc): a hook call failed (the computation goes on) */
    int post;
} Hook;

static PyObject *hook_failed(Hook *self) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (ev != NULL && tb != NULL)
        PyException_SetTraceback(ev, tb);
    PyObject *r = PyObject_CallOneArg(self->failed, ev ? ev : Py_None);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
    Py_RETURN_NONE;
}

/* The Core of graph dsk (borrowed), NULL when it has none (an error set if the lookup failed). */
static Core *graph_of(Hook *self, PyObject *dsk) {
    PyObject *id = PyLong_FromVoidPtr(dsk);
    if (id == NULL)
        return NULL;
    PyObject *g = PyDict_GetItemWithError(self->graphs, id);
    Py_DECREF(id);
    if (g == NULL || !PyObject_TypeCheck(g, &CoreType))
        return NULL;
    return (Core *)g;
}

/* A wrapper of task, the index-th key of graph g (a new reference). */
static PyObject *wrap(Core *g, PyObject *task, Py_ssize_t index) {
    MeasuredTask *m = PyObject_New(MeasuredTask, &MeasuredTaskType);
    if (m == NULL)
        return NULL;
    m->vectorcall = (vectorcallfunc)MeasuredTask_vectorcall;
    m->task = Py_NewRef(task);
    m->graph = (Core *)Py_NewRef((PyObject *)g);
    m->index = index;
    m->submitted = m->t0 = m->t1 = m->calls = m->seen = m->slot = 0;
    m->recorded = 0;
    m->st = m->before = m->after = m->nbytes = m->worker = NULL;
    m->error = Py_NewRef(Py_None);
    return (PyObject *)m;
}

/* The position of key among g's keys: i when the i-th key is key itself (the graph's own order, as setup listed
 * it), else from pos; a key pos lacks is appended. -1 with an error set on failure. */
static Py_ssize_t index_of(Core *g, PyObject *key, Py_ssize_t i) {
    if (i < PyList_GET_SIZE(g->keys) && PyList_GET_ITEM(g->keys, i) == key)
        return i;
    PyObject *found = PyDict_GetItemWithError(g->pos, key);
    if (found != NULL)
        return PyLong_AsSsize_t(found);
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t index = PyList_GET_SIZE(g->keys);
    PyObject *v = PyLong_FromSsize_t(index);
    int r = v ? PyDict_SetItem(g->pos, key, v) : -1;
    Py_XDECREF(v);
    if (r < 0 || PyList_Append(g->keys, key) < 0)
        return -1;
    return index;
}

/* start_state(dsk, state): every task of the graph (a key not in state["cache"]) replaced in the scheduler's graph by
 * a MeasuredTask, once, before the scheduler's loop hands any to the pool. */
static PyObject *start_state(Hook *self, PyObject *dsk, PyObject *state) {
    Core *g = graph_of(self, dsk);
    if (g == NULL) {
        if (PyErr_Occurred())
            return hook_failed(self);
        Py_RETURN_NONE;
    }
    Py_INCREF(g);
    PyObject *cache = PyDict_Check(state) ? PyDict_GetItemWithError(state, str_cache) : NULL;
    if (cache != NULL && !PyDict_Check(cache))
        cache = NULL;
    PyObject *keys = NULL;
    if (PyErr_Occurred())
        goto fail;
    Py_XINCREF(cache);
    if (PyDict_CheckExact(dsk)) {  /* the graph get_async made: its values replaced in place, its keys unchanged */
        Py_ssize_t at = 0, i = 0;
        PyObject *key, *task;
        while (PyDict_Next(dsk, &at, &key, &task)) {
            Py_ssize_t index = index_of(g, key, i++);
            if (index < 0)
                goto fail;
            int data = cache != NULL ? PyDict_Contains(cache, key) : 0;
            if (data < 0)
                goto fail;
            if (data || Py_TYPE(task) == &MeasuredTaskType)
                continue;
            PyObject *m = wrap(g, task, index);
            if (m == NULL || PyDict_SetItem(dsk, key, m) < 0) {
                Py_XDECREF(m);
                goto fail;
            }
            Py_DECREF(m);
        }
    } else {  /* another mapping */
        keys = PySequence_List(dsk);
        if (keys == NULL)
            goto fail;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
            PyObject *key = PyList_GET_ITEM(keys, i);
            Py_ssize_t index = index_of(g, key, i);
            int data = index < 0 ? -1 : cache != NULL ? PyDict_Contains(cache, key) : 0;
            if (data < 0)
                goto fail;
            if (data)
                continue;
            PyObject *task = PyObject_GetItem(dsk, key);
            PyObject *m = task && Py_TYPE(task) != &MeasuredTaskType ? wrap(g, task, index) : NULL;
            Py_XDECREF(task);
            if (m == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                continue;
            }
            int r = PyObject_SetItem(dsk, key, m);
            Py_DECREF(m);
            if (r < 0)
                goto fail;
        }
    }
    Py_XDECREF(keys);
    Py_XDECREF(cache);
    Py_DECREF(g);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(keys);
    Py_XDECREF(cache);
    Py_DECREF(g);
    return hook_failed(self);
}

/* The size of result as dask.sizeof gives it (a new reference; None when it cannot be sized). */
static PyObject *size_of(Core *g, PyObject *result) {
    PyObject *cls = (PyObject *)Py_TYPE(result);
    PyObject *f = g->sizers ? PyDict_GetItemWithError(g->sizers, cls) : NULL;
    PyObject *r;
    if (f != NULL) {
        r = PyObject_CallOneArg(f, result);
    } else if (PyErr_Occurred() || g->sizer_of == NULL) {
        r = NULL;
    } else {
        PyObject *fn = PyObject_CallOneArg(g->sizer_of, cls);
        r = fn ? PyObject_CallOneArg(fn, result) : NULL;
        Py_XDECREF(fn);
    }
    if (r == NULL) {  /* a result Dask cannot size */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return r;
}

/* posttask(key, result, dsk, state, worker_id): a task's result reached the scheduler's loop. A task run in this
 * process has recorded itself; one run in a worker process (the graph was shipped) is noted here: its size, its
 * worker, and when the loop saw it, in case no measurement comes from its worker. Then a batch of rows is written
 * if one is due. */
static PyObject *posttask(Hook *self, PyObject *key, PyObject *result, PyObject *dsk, PyObject *worker) {
    Core *g = graph_of(self, dsk);
    if (g == NULL) {
        if (PyErr_Occurred())
            return hook_failed(self);
        Py_RETURN_NONE;
    }
    Py_INCREF(g);
    if (g->shipped) {
        PyObject *m_ = PyObject_GetItem(dsk, key);
        if (m_ == NULL)
            goto fail;
        MeasuredTask *m = (MeasuredTask *)m_;
        if (Py_TYPE(m_) == &MeasuredTaskType && m->graph == g && !m->recorded) {
            m->recorded = 1;
            PyObject *nbytes = size_of(g, result);
            Py_XSETREF(m->nbytes, nbytes);
            Py_XSETREF(m->worker, Py_NewRef(worker));
            m->seen = now_ns(CLOCK_REALTIME);
            if (nbytes == NULL || PyList_Append(g->slow, m_) < 0) {
                Py_DECREF(m_);
                goto fail;
            }
        }
        Py_DECREF(m_);
    }
    g->pending++;
    if (g->flush != NULL && g->flush != Py_None &&
        (g->pending >= g->flush_tasks || now_ns(CLOCK_MONOTONIC) >= g->next_flush)) {
        PyObject *r = PyObject_CallNoArgs(g->flush);  /* so that a live run trails by a second at most */
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(g);
    Py_RETURN_NONE;
fail:
    Py_DECREF(g);
    return hook_failed(self);
}

static PyObject *Hook_vectorcall(Hook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != (self->post ? 5 : 2)) {
        PyErr_Format(PyExc_TypeError, self->post ? "posttask(key, result, dsk, state, worker_id) takes 5 arguments"
                                                 : "start_state(dsk, state) takes 2 arguments");
        return NULL;
    }
    return self->post ? posttask(self, args[0], args[1], args[2], args[4]) : start_state(self, args[0], args[1]);
}

static PyObject *Hook_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

static PyObject *Hook_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"graphs", "failed", "post", NULL};
    PyObject *graphs, *failed;
    int post;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!Op", kwlist, &PyDict_Type, &graphs, &failed, &post))
        return NULL;
    Hook *self = (Hook *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)Hook_vectorcall;
    Py_INCREF(graphs);
    self->graphs = graphs;
    Py_INCREF(failed);
    self->failed = failed;
    self->post = post;
    return (PyObject *)self;
}

static int Hook_traverse(Hook *self, visitproc visit, void *arg) {
    Py_VISIT(self->graphs);
    Py_VISIT(self->failed);
    return 0;
}

static int Hook_clear(Hook *self) {
    Py_CLEAR(self->graphs);
    Py_CLEAR(self->failed);
    return 0;
}

static void Hook_dealloc(Hook *self) {
    PyObject_GC_UnTrack(self);
    Hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flowscope.sources.dask._local_tasks.Hook",
    .tp_basicsize = sizeof(Hook),
    .tp_dealloc = (destructor)Hook_dealloc,
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_call = Hook_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Hook(graphs, failed, post): Dask's start_state (post=False) or posttask (post=True) callback.",
    .tp_traverse = (traverseproc)Hook_traverse,
    .tp_clear = (inquiry)Hook_clear,
    .tp_new = Hook_new,
};

/* ---- a graph's keys and edges, once per computation (start) --------------------------------------------------- */
static PyObject *str_dependencies;

/* str(key) for a tuple of ASCII strs and ints, written as Python writes it (tuple and str repr: 'x' in single
 * quotes, items joined by ", ", a 1-tuple's trailing comma) without a call per item; NULL with no error set when the
 * key holds anything else (a str with a quote, a backslash, a control or non-ASCII character; an int beyond 64
 * bits; any other type): the caller then asks PyObject_Str. tests/test_dask_local_compiled.py checks both ways. */
static PyObject *tuple_text(PyObject *key) {
    Py_ssize_t n = PyTuple_GET_SIZE(key);
    char buf[256];
    size_t len = 0;
    if (n == 0 || n > 16)
        return NULL;
    buf[len++] = '(';
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(key, i);
        if (i) {
            buf[len++] = ',';
            buf[len++] = ' ';
        }
        if (PyUnicode_CheckExact(item)) {
            if (!PyUnicode_IS_ASCII(item))
                return NULL;
            Py_ssize_t m = PyUnicode_GET_LENGTH(item);
            if (len + (size_t)m + 8 > sizeof buf)
                return NULL;
            const unsigned char *c = PyUnicode_1BYTE_DATA(item);
            for (Py_ssize_t j = 0; j < m; j++)
                if (c[j] < 0x20 || c[j] > 0x7e || c[j] == '\'' || c[j] == '\\')
                    return NULL;
            buf[len++] = '\'';
            memcpy(buf + len, c, (size_t)m);
            len += (size_t)m;
            buf[len++] = '\'';
        } else if (PyLong_CheckExact(item)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow || (v == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return NULL;
            }
            if (len + 32 > sizeof buf)
                return NULL;
            len += (size_t)snprintf(buf + len, 24, "%lld", v);
        } else {
            return NULL;
        }
    }
    if (n == 1)
        buf[len++] = ',';
    buf[len++] = ')';
    return PyUnicode_DecodeASCII(buf, (Py_ssize_t)len, NULL);
}

/* key_texts(dsk) -> {key: the key as text}: the key itself when it is a str, else str(key) */
static PyObject *key_texts(PyObject *Py_UNUSED(module), PyObject *dsk) {
    if (!PyDict_Check(dsk)) {
        PyErr_Format(PyExc_TypeError, "key_texts() takes the graph as a dict, not %.100s", Py_TYPE(dsk)->tp_name);
        return NULL;
    }
    PyObject *out = _PyDict_NewPresized(PyDict_GET_SIZE(dsk));
    if (out == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    PyObject *key, *node;
    while (PyDict_Next(dsk, &pos, &key, &node)) {
        PyObject *text;
        if (PyUnicode_CheckExact(key)) {
            text = Py_NewRef(key);
        } else {
            text = PyTuple_CheckExact(key) ? tuple_text(key) : NULL;
            if (text == NULL && !PyErr_Occurred())
                text = PyObject_Str(key);
        }
        if (text == NULL || PyDict_SetItem(out, key, text) < 0) {
            Py_XDECREF(text);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(text);
    }
    return out;
}

/* A growing int32 column. */
typedef struct {
    int32_t *v;
    Py_ssize_t n, cap;
} Column32;

static int column_push(Column32 *c, Py_ssize_t value) {
    if (c->n == c->cap) {
        Py_ssize_t cap = c->cap ? 2 * c->cap : 1024;
        int32_t *v = PyMem_Realloc(c->v, (size_t)cap * sizeof(int32_t));
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = (int32_t)value;
    return 0;
}

/* the position pos gives key, or -1 with an error set (KeyError when pos lacks it, as the reference's pos[key]) */
static Py_ssize_t position_of(PyObject *pos, PyObject *key, int missing_is_error) {
    PyObject *at = PyDict_GetItemWithError(pos, key);
    if (at == NULL) {
        if (!PyErr_Occurred() && missing_is_error)
            PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    return PyLong_AsSsize_t(at);
}

/* graph_edges(dsk, pos, data_type) -> (src, dst, outside, data_nodes): one (task, dependency) pair per dependency of
 * every node, in the graph's order and each node's dependencies' iteration order, as int32 columns (bytes) of
 * positions: pos[task], and pos[dependency] or, for a dependency pos lacks, len(pos) + its place in outside (the
 * list of str() of those, one per pair); data_nodes counts the nodes that are data_type instances */
static PyObject *graph_edges(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *dsk, *pos, *data_type;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyDict_Type, &dsk, &PyDict_Type, &pos, &data_type))
        return NULL;
    Column32 src = {0}, dst = {0};
    PyObject *outside = PyList_New(0), *result = NULL;
    Py_ssize_t data_nodes = 0, n = PyDict_GET_SIZE(pos);
    if (outside == NULL)
        goto done;
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "graph_edges(): a graph of more than 2**31 - 1 keys");
        goto done;
    }
    Py_ssize_t it_pos = 0;
    PyObject *key, *node;
    while (PyDict_Next(dsk, &it_pos, &key, &node)) {
        int is_data = PyObject_IsInstance(node, data_type);
        if (is_data < 0)
            goto done;
        data_nodes += is_data;
        PyObject *deps = PyObject_GetAttr(node, str_dependencies);
        if (deps == NULL)
            goto done;
        Py_ssize_t i = position_of(pos, key, 1);
        if (i < 0) {
            Py_DECREF(deps);
            goto done;
        }
        PyObject *it = PyObject_GetIter(deps);
        Py_DECREF(deps);
        if (it == NULL)
            goto done;
        PyObject *dep;
        while ((dep = PyIter_Next(it)) != NULL) {
            Py_ssize_t j = position_of(pos, dep, 0);
            if (j < 0 && !PyErr_Occurred()) {  /* outside the graph: named by str() */
                PyObject *text = PyObject_Str(dep);
                j = n + PyList_GET_SIZE(outside);
                if (text == NULL || PyList_Append(outside, text) < 0 || j > INT32_MAX) {
                    if (text != NULL && j > INT32_MAX)
                        PyErr_SetString(PyExc_OverflowError, "graph_edges(): too many dependencies outside the graph");
                    j = -1;
                }
                Py_XDECREF(text);
            }
            Py_DECREF(dep);
            if (j < 0 || column_push(&src, i) < 0 || column_push(&dst, j) < 0) {
                Py_DECREF(it);
                goto done;
            }
        }
        Py_DECREF(it);
        if (PyErr_Occurred())
            goto done;
    }
    /* (bytes built here: Py_BuildValue's y# makes None of an empty column's NULL pointer) */
    PyObject *src_b = PyBytes_FromStringAndSize(src.v ? (const char *)src.v : "", src.n * (Py_ssize_t)sizeof(int32_t));
    PyObject *dst_b = PyBytes_FromStringAndSize(dst.v ? (const char *)dst.v : "", dst.n * (Py_ssize_t)sizeof(int32_t));
    if (src_b != NULL && dst_b != NULL)
        result = Py_BuildValue("(OOOn)", src_b, dst_b, outside, data_nodes);
    Py_XDECREF(src_b);
    Py_XDECREF(dst_b);
done:
    PyMem_Free(src.v);
    PyMem_Free(dst.v);
    Py_XDECREF(outside);
    return result;
}

/* ---- module ------------------------------------------------------------------------------------------------ */
static PyObject *configure(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *factory, *remote;
    if (!PyArg_ParseTuple(args, "OO", &factory, &remote))
        return NULL;
    Py_INCREF(factory);
    Py_XSETREF(new_state, factory);
    Py_INCREF(remote);
    Py_XSETREF(remote_type, remote);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(new_state, remote_type): the maker of a thread's ThreadState, and what a task pickles to."},
    {"current", current, METH_NOARGS, "The calling thread's ThreadState, or None."},
    {"key_texts", key_texts, METH_O, "key_texts(dsk) -> {key: the key as text (itself if a str, else str(key))}"},
    {"graph_edges", graph_edges, METH_VARARGS,
     "graph_edges(dsk, pos, data_type) -> (src, dst, outside, data_nodes): the graph's (task, dependency) pairs as "
     "int32 positions"},
    {NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_local_tasks",
    "The compiled per-task path of the local-scheduler capture (flowscope.sources.dask.local).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__local_tasks(void) {
    state_key = PyUnicode_InternFromString("flowscope.local_tasks.state");
    str_spool = PyUnicode_InternFromString("spool");
    str_io = PyUnicode_InternFromString("io");
    str_class = PyUnicode_InternFromString("__class__");
    str_cache = PyUnicode_InternFromString("cache");
    str_dependencies = PyUnicode_InternFromString("dependencies");
    if (state_key == NULL || str_spool == NULL || str_io == NULL || str_class == NULL || str_cache == NULL ||
        str_dependencies == NULL)
        return NULL;
    if (PyType_Ready(&ThreadStateType) < 0 || PyType_Ready(&CoreType) < 0 || PyType_Ready(&MeasuredTaskType) < 0 ||
        PyType_Ready(&HookType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    PyTypeObject *types[] = {&ThreadStateType, &CoreType, &MeasuredTaskType, &HookType};
    const char *names[] = {"ThreadState", "Core", "MeasuredTask", "Hook"};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
