/* Longest paths on a weighted DAG given as edge arrays: one O(V + E) topological sweep, whatever the depth.
 *
 * The Python side (flowscope/analysis/graph_kernels.py) converts and checks the arrays and turns the return
 * codes into errors; this file only does the sweep, with the GIL released.
 *
 * longest_to(n, src, dst, edge_w, vertex_w, dist, order) -> int
 *   src, dst: int64[m]; edge_w: float64[m]; vertex_w: float64[n]   (read)
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
#else
#define PREFETCH(p) ((void)0)
#endif

/* -1: out of memory */
static int64_t sweep(int64_t n, int64_t m, const int64_t *src, const int64_t *dst, const double *edge_w,
                     const double *vertex_w, double *dist, int64_t *order) {
    int64_t *offsets = calloc((size_t)n + 2, sizeof(int64_t));
    vertex_state *state = calloc((size_t)n + 1, sizeof(vertex_state));
    out_edge *adj = malloc(((size_t)m + 1) * sizeof(out_edge));
    int64_t result = -1;
    if (!offsets || !state || !adj) goto done;

    /* out-degrees (shifted by two, so the scatter below leaves offsets[v] = first out-edge of v) and
       in-degrees; endpoints checked on the way */
    for (int64_t i = 0; i < m; i++) {
        uint64_t s = (uint64_t)src[i], d = (uint64_t)dst[i];
        if (s >= (uint64_t)n || d >= (uint64_t)n) {
            result = -(i + 2);
            goto done;
        }
        offsets[s + 2]++;
        state[d].remaining++;
    }
    for (int64_t v = 2; v < n + 2; v++) offsets[v] += offsets[v - 1];
    for (int64_t i = 0; i < m; i++) {
        int64_t p = offsets[src[i] + 1]++;
        adj[p].to = (uint32_t)dst[i];
        adj[p].w = edge_w[i];
    }

    /* Kahn's algorithm: a vertex is final once its last in-edge has been seen */
    int64_t tail = 0;
    for (int64_t v = 0; v < n; v++) {
        state[v].best = -INFINITY;
        if (state[v].remaining == 0) order[tail++] = v;
    }
    for (int64_t head = 0; head < tail; head++) {
        /* the queue says which vertices come next: fetch their state and edges ahead of time (the sweep
           is bound by memory latency, since vertex numbers say nothing about the order) */
        if (head + 4 < tail) {
            PREFETCH(&offsets[order[head + 4]]);
            PREFETCH(&state[order[head + 4]]);
        }
        if (head + 2 < tail) PREFETCH(&adj[offsets[order[head + 2]]]);
        int64_t u = order[head];
        double b = state[u].best;
        double du = vertex_w[u] + (b == -INFINITY ? 0.0 : b);   /* -inf only where nothing comes in */
        dist[u] = du;
        for (int64_t k = offsets[u], end = offsets[u + 1]; k < end; k++) {
            vertex_state *t = &state[adj[k].to];
            double c = du + adj[k].w;
            if (c > t->best) t->best = c;
            if (--t->remaining == 0) order[tail++] = adj[k].to;
        }
    }
    result = tail;
done:
    free(offsets);
    free(state);
    free(adj);
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
    PyObject *o_src, *o_dst, *o_ew, *o_vw, *o_dist, *o_order;
    if (!PyArg_ParseTuple(args, "nOOOOOO", &n, &o_src, &o_dst, &o_ew, &o_vw, &o_dist, &o_order)) return NULL;
    if (n < 0 || (uint64_t)n > (uint64_t)UINT32_MAX) {
        return PyErr_Format(PyExc_ValueError, "the graph has %zd vertices; the longest path handles 0 to %lu",
                            n, (unsigned long)UINT32_MAX);
    }
    Py_buffer b[6];
    int got = 0;
    PyObject *out = NULL;
    if (PyObject_GetBuffer(o_src, &b[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    Py_ssize_t m = b[0].len / 8;
    PyBuffer_Release(&b[0]);
    if (get_array(o_src, &b[got], 0, 'i', m, "src") < 0) goto fail;
    got++;
    if (get_array(o_dst, &b[got], 0, 'i', m, "dst") < 0) goto fail;
    got++;
    if (get_array(o_ew, &b[got], 0, 'd', m, "edge weights") < 0) goto fail;
    got++;
    if (get_array(o_vw, &b[got], 0, 'd', n, "vertex weights") < 0) goto fail;
    got++;
    if (get_array(o_dist, &b[got], 1, 'd', n, "dist") < 0) goto fail;
    got++;
    if (get_array(o_order, &b[got], 1, 'i', n, "order") < 0) goto fail;
    got++;
    int64_t r;
    Py_BEGIN_ALLOW_THREADS
    r = sweep(n, m, b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf, b[5].buf);
    Py_END_ALLOW_THREADS
    if (r == -1) {
        PyErr_NoMemory();
        goto fail;
    }
    out = PyLong_FromLongLong(r);
fail:
    while (got > 0) PyBuffer_Release(&b[--got]);
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
