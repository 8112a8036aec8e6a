/* Longest paths on a weighted DAG given as edge arrays: one O(V + E) topological sweep, whatever the depth.
 *
 * The Python side (flowscope/analysis/graph_kernels.py) converts and checks the arrays and turns the return
 * codes into errors; this file only does the sweep, with the GIL released.
 *
 * longest_to(n, src, dst, edge_w, vertex_w, dist, order) -> int
 *   src, dst: int64[m]; edge_w: float64[m]; vertex_w: float64[n] or None (zeros)   (read)
 *   dist: float64[n]; order: int64[n]                               (written)
 *   dist[v] = the longest path ending at v, vertex weights included (a path's length sums the weights of its
 *   vertices and edges; duplicate edges count with their largest weight); order = the vertices in the
 *   topological order they were reached. Returns how many vertices were reached: fewer than n means a cycle
 *   (the vertices not in order[:k] are on one or behind one). -(i + 2) means edge i has an endpoint outside
 *   [0, n); the sweep itself returns -1 when memory runs out (MemoryError here).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

/* the best arrival and the in-edges still unseen, side by side: one cache line per edge visited */
typedef struct {
    double best;
    int64_t remaining;
} vertex_state;

/* an out-edge: its head and weight in one cache line */
typedef struct {
    uint32_t to;
    double w;
} out_edge;

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#define PREFETCH_W(p) __builtin_prefetch((p), 1)
#else
#define PREFETCH(p) ((void)0)
#define PREFETCH_W(p) ((void)0)
#endif

/* Zeroed scratch memory. Every access of the sweep lands on a random vertex, so on Linux the buffers ask for
   transparent huge pages: with 4 KB pages nearly every access would also miss the TLB (and, in a virtual
   machine, walk two page tables), and the first touch of each page faults. */
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define HUGE_PAGES 1
#endif

static void *scratch(size_t bytes) {
#ifdef HUGE_PAGES
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);   /* advice only: without it the buffer still works */
    return p;
#else
    return calloc(1, bytes);
#endif
}

static void release(void *p, size_t bytes) {
    if (!p) return;
#ifdef HUGE_PAGES
    munmap(p, bytes);
#else
    (void)bytes;
    free(p);
#endif
}

/* -1: out of memory. vertex_w may be NULL (all zeros). */
static int64_t sweep(int64_t n, int64_t m, const int64_t *src, const int64_t *dst, const double *edge_w,
                     const double *vertex_w, double *dist, int64_t *order) {
    size_t offsets_bytes = ((size_t)n + 2) * sizeof(int64_t);
    size_t state_bytes = ((size_t)n + 1) * sizeof(vertex_state);
    size_t adj_bytes = ((size_t)m + 1) * sizeof(out_edge);
    int64_t *offsets = scratch(offsets_bytes);
    vertex_state *state = scratch(state_bytes);
    out_edge *adj = scratch(adj_bytes);
    int64_t result = -1;
    const int64_t ahead = 16;   /* how far the edge passes fetch ahead */
    if (!offsets || !state || !adj) goto done;

    /* out-degrees (shifted by two, so the scatter below leaves offsets[v] = first out-edge of v) and
       in-degrees; endpoints checked on the way */
    for (int64_t i = 0; i < m; i++) {
        uint64_t s = (uint64_t)src[i], d = (uint64_t)dst[i];
        if (s >= (uint64_t)n || d >= (uint64_t)n) {
            result = -(i + 2);
            goto done;
        }
        if (i + ahead < m && (uint64_t)src[i + ahead] < (uint64_t)n && (uint64_t)dst[i + ahead] < (uint64_t)n) {
            PREFETCH_W(&offsets[src[i + ahead] + 2]);
            PREFETCH_W(&state[dst[i + ahead]]);
        }
        offsets[s + 2]++;
        state[d].remaining++;
    }
    for (int64_t v = 2; v < n + 2; v++) offsets[v] += offsets[v - 1];
    for (int64_t i = 0; i < m; i++) {
        if (i + ahead < m) PREFETCH_W(&offsets[src[i + ahead] + 1]);
        int64_t p = offsets[src[i] + 1]++;
        adj[p].to = (uint32_t)dst[i];
        adj[p].w = edge_w[i];
    }

    /* Kahn's algorithm: a vertex is final once its last in-edge has been seen; its length then replaces its
       best arrival in state, and dist is filled in order at the end */
    int64_t tail = 0;
    for (int64_t v = 0; v < n; v++) {
        state[v].best = -INFINITY;
        if (state[v].remaining == 0) order[tail++] = v;
    }
    for (int64_t head = 0; head < tail; head++) {
        /* the queue says which vertices come next: fetch their state and edges ahead of time (the sweep
           is bound by memory latency, since vertex numbers say nothing about the order) */
        if (head + 4 < tail) {
            int64_t x = order[head + 4];
            PREFETCH(&offsets[x]);
            PREFETCH(&state[x]);
            if (vertex_w) PREFETCH(&vertex_w[x]);
        }
        if (head + 2 < tail) PREFETCH(&adj[offsets[order[head + 2]]]);
        int64_t u = order[head];
        double b = state[u].best;
        double du = b == -INFINITY ? 0.0 : b;   /* -inf only where nothing comes in */
        if (vertex_w) du += vertex_w[u];
        state[u].best = du;
        for (int64_t k = offsets[u], end = offsets[u + 1]; k < end; k++) {
            vertex_state *t = &state[adj[k].to];
            double c = du + adj[k].w;
            if (c > t->best) t->best = c;
            if (--t->remaining == 0) order[tail++] = adj[k].to;
        }
    }
    for (int64_t v = 0; v < n; v++) dist[v] = state[v].best;   /* unreached vertices (a cycle): -inf or a bound */
    result = tail;
done:
    release(offsets, offsets_bytes);
    release(state, state_bytes);
    release(adj, adj_bytes);
    return result;
}

/* a C-contiguous buffer of `count` items of one kind ('i': 8-byte signed integers, 'd': doubles) */
static int get_array(PyObject *obj, Py_buffer *view, int writable, char kind, Py_ssize_t count, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = view->itemsize == 8 && f[1] == '\0' &&
             (kind == 'd' ? f[0] == 'd' : (f[0] == 'l' || f[0] == 'q'));
    if (!ok || view->len != count * 8) {
        PyErr_Format(PyExc_TypeError, "%s: expected %zd contiguous %s, got format %s, %zd bytes", name, count,
                     kind == 'd' ? "float64" : "int64", view->format ? view->format : "B", view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *longest_to(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t n;
    PyObject *o[6];   /* src, dst, edge_w, vertex_w (or None), dist, order */
    if (!PyArg_ParseTuple(args, "nOOOOOO", &n, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    if (n < 0 || (uint64_t)n > (uint64_t)UINT32_MAX) {
        return PyErr_Format(PyExc_ValueError, "the graph has %zd vertices; the longest path handles 0 to %lu",
                            n, (unsigned long)UINT32_MAX);
    }
    Py_buffer b[6];
    int held[6] = {0, 0, 0, 0, 0, 0};
    PyObject *out = NULL;
    if (PyObject_GetBuffer(o[0], &b[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    Py_ssize_t m = b[0].len / 8;
    PyBuffer_Release(&b[0]);
    static const char *names[6] = {"src", "dst", "edge weights", "vertex weights", "dist", "order"};
    const char kinds[6] = {'i', 'i', 'd', 'd', 'd', 'i'};
    for (int i = 0; i < 6; i++) {
        if (i == 3 && o[i] == Py_None) continue;
        if (get_array(o[i], &b[i], i >= 4, kinds[i], i == 3 || i >= 4 ? n : m, names[i]) < 0) goto fail;
        held[i] = 1;
    }
    int64_t r;
    Py_BEGIN_ALLOW_THREADS
    r = sweep(n, m, b[0].buf, b[1].buf, b[2].buf, held[3] ? b[3].buf : NULL, b[4].buf, b[5].buf);
    Py_END_ALLOW_THREADS
    if (r == -1) {
        PyErr_NoMemory();
        goto fail;
    }
    out = PyLong_FromLongLong(r);
fail:
    for (int i = 0; i < 6; i++)
        if (held[i]) PyBuffer_Release(&b[i]);
    return out;
}

static PyMethodDef methods[] = {
    {"longest_to", longest_to, METH_VARARGS,
     "longest_to(n, src, dst, edge_w, vertex_w, dist, order) -> vertices reached (see graph_kernels.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_graph_kernels", "Compiled sweeps over weighted DAGs given as edge arrays.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__graph_kernels(void) { return PyModule_Create(&module); }
