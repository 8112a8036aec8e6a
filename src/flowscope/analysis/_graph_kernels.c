/* Longest paths on a weighted DAG given as edge arrays: one O(V + E) topological sweep, whatever the depth.
 *
 * The Python side (flowscope/analysis/graph_kernels.py) converts the arrays and turns the status into
 * errors; this file does the checks that need a pass over the data anyway and the sweep, with the GIL
 * released.
 *
 * longest(n, src, dst, edge_w, vertex_w, dist) -> (status, index, reached, longest)
 *   src, dst: int64[m]; edge_w: float64[m]; vertex_w: float64[n] or None (zeros)   (read)
 *   dist: float64[n] or None                                                        (written)
 *   dist[v] = the longest path ending at v, vertex weights included (a path's length sums the weights of its
 *   vertices and edges; duplicate edges count with their largest weight); longest = the largest of them.
 *   reached = how many vertices the sweep reached: fewer than n means a cycle, and the vertices not reached
 *   (on a cycle or behind one) have NaN in dist.
 *   status: 0 done; 1 edge `index` has an endpoint outside [0, n); 2 edge `index` has a weight that is not
 *   finite; 3 vertex `index` has a weight that is not finite. Up to 2^32 - 2 vertices and edges.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* Per vertex, in one 16-byte line: the best arrival so far (its length once final), the in-edges not yet seen,
   and where its out-edges start in adj (out-edges of v: adj[state[v].start .. state[v + 1].start)). One array
   instead of three, because the sweep is bound by random memory accesses: vertex numbers say nothing about the
   order in which it reaches vertices. */
typedef struct {
    double best;
    uint32_t remaining;
    uint32_t start;
} vertex_state;

/* an out-edge: its head and weight (12 bytes, packed: the scatter and the sweep are bound by memory traffic) */
#if defined(__GNUC__) || defined(__clang__)
typedef struct __attribute__((packed)) {
    uint32_t to;
    double w;
} out_edge;
#else
typedef struct {
    uint32_t to;
    double w;
} out_edge;
#endif

/* Zeroed scratch memory. Large buffers are mapped with their pages populated up front (one system call)
   rather than faulted in one by one as the passes first touch them in random order: the call is often the
   first in its process, where every page is new. */
typedef struct {
    void *p;
    size_t len;
    int mapped;
} scratch;

static void *scratch_zeroed(scratch *b, size_t len) {
    b->len = len;
    b->mapped = 0;
#if defined(__linux__) && defined(MAP_POPULATE)
    if (len >= ((size_t)1 << 20)) {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p != MAP_FAILED) {
            b->mapped = 1;
            return b->p = p;
        }
    }
#endif
    return b->p = calloc(len, 1);
}

static void scratch_free(scratch *b) {
#if defined(__linux__) && defined(MAP_POPULATE)
    if (b->mapped) {
        munmap(b->p, b->len);
        return;
    }
#endif
    free(b->p);
}

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#define PREFETCH_W(p) __builtin_prefetch((p), 1)
#else
#define PREFETCH(p) ((void)0)
#define PREFETCH_W(p) ((void)0)
#endif

enum { DONE = 0, BAD_ENDPOINT = 1, BAD_EDGE_WEIGHT = 2, BAD_VERTEX_WEIGHT = 3, NO_MEMORY = -1 };

typedef struct {
    int64_t index;      /* the edge or vertex a bad status names */
    int64_t reached;
    double longest;
} sweep_result;

/* vertex_w and dist may be NULL. n and m below 2^32 - 1 (checked by the caller). */
static int sweep(int64_t n, int64_t m, const int64_t *src, const int64_t *dst, const double *edge_w,
                 const double *vertex_w, double *dist, sweep_result *r) {
    scratch b_state, b_adj, b_queue;
    vertex_state *state = scratch_zeroed(&b_state, ((size_t)n + 1) * sizeof(vertex_state));
    out_edge *adj = scratch_zeroed(&b_adj, ((size_t)m + 1) * sizeof(out_edge));
    uint32_t *queue = scratch_zeroed(&b_queue, ((size_t)n + 1) * sizeof(uint32_t));
    int status = NO_MEMORY;
    const int64_t ahead = 16;   /* how far the edge passes fetch ahead */
    if (!state || !adj || !queue) goto done;

    /* out-degrees (in start) and in-degrees; endpoints and weights checked on the way */
    for (int64_t i = 0; i < m; i++) {
        uint64_t s = (uint64_t)src[i], d = (uint64_t)dst[i];
        if (s >= (uint64_t)n || d >= (uint64_t)n) {
            status = BAD_ENDPOINT;
            r->index = i;
            goto done;
        }
        if (!isfinite(edge_w[i])) {
            status = BAD_EDGE_WEIGHT;
            r->index = i;
            goto done;
        }
        if (i + ahead < m && (uint64_t)src[i + ahead] < (uint64_t)n && (uint64_t)dst[i + ahead] < (uint64_t)n) {
            PREFETCH_W(&state[src[i + ahead]]);
            PREFETCH_W(&state[dst[i + ahead]]);
        }
        state[s].start++;
        state[d].remaining++;
    }
    /* in one pass over the vertices: start = the end of the vertex's out-edges (the scatter, taking the edges
       backwards, moves it down to their first), best = nothing arrived yet, the vertices with no in-edge queued */
    uint32_t total = 0;
    int64_t tail = 0;
    for (int64_t v = 0; v < n; v++) {
        if (vertex_w && !isfinite(vertex_w[v])) {
            status = BAD_VERTEX_WEIGHT;
            r->index = v;
            goto done;
        }
        total += state[v].start;
        state[v].start = total;
        state[v].best = -INFINITY;
        if (state[v].remaining == 0) queue[tail++] = (uint32_t)v;
    }
    state[n].start = total;
    for (int64_t i = m - 1; i >= 0; i--) {   /* backwards: each vertex's out-edges keep the input's order */
        /* two stages ahead: the source's state, then (its state in cache by then) about where its edge goes */
        if (i >= 2 * ahead) PREFETCH_W(&state[src[i - 2 * ahead]]);
        if (i >= ahead) {
            uint32_t at = state[src[i - ahead]].start;
            PREFETCH_W(&adj[at ? at - 1 : 0]);
        }
        uint32_t p = --state[src[i]].start;
        adj[p].to = (uint32_t)dst[i];
        adj[p].w = edge_w[i];
    }

    /* Kahn's algorithm: a vertex is final once its last in-edge has been seen */
    double longest = -INFINITY;
    for (int64_t head = 0; head < tail; head++) {
        /* the queue says which vertices come next: fetch their state, then (in cache by then) their edges, then
           (those in cache by then) the states of their edges' heads, ahead of time */
        if (head + 8 < tail) {
            uint32_t x = queue[head + 8];
            PREFETCH(&state[x]);
            PREFETCH(&state[x + 1]);
            if (vertex_w) PREFETCH(&vertex_w[x]);
        }
        if (head + 4 < tail) PREFETCH(&adj[state[queue[head + 4]].start]);
        if (head + 2 < tail) {
            uint32_t x = queue[head + 2];
            for (uint32_t k = state[x].start, end = state[x + 1].start; k < end; k++) PREFETCH_W(&state[adj[k].to]);
        }
        uint32_t u = queue[head];
        double b = state[u].best;
        double du = b == -INFINITY ? 0.0 : b;   /* -inf only where nothing comes in */
        if (vertex_w) du += vertex_w[u];
        state[u].best = du;
        if (du > longest) longest = du;
        for (uint32_t k = state[u].start, end = state[u + 1].start; k < end; k++) {
            vertex_state *t = &state[adj[k].to];
            double c = du + adj[k].w;
            if (c > t->best) t->best = c;
            if (--t->remaining == 0) queue[tail++] = adj[k].to;
        }
    }
    if (dist)
        for (int64_t v = 0; v < n; v++) dist[v] = state[v].remaining ? NAN : state[v].best;
    r->reached = tail;
    r->longest = longest;
    status = DONE;
done:
    scratch_free(&b_state);
    scratch_free(&b_adj);
    scratch_free(&b_queue);
    return status;
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

static PyObject *longest(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t n;
    PyObject *o[5];   /* src, dst, edge_w, vertex_w (or None), dist (or None) */
    if (!PyArg_ParseTuple(args, "nOOOOO", &n, &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    if (n < 0 || (uint64_t)n >= (uint64_t)UINT32_MAX) {
        return PyErr_Format(PyExc_ValueError, "the graph has %zd vertices; the longest path handles 0 to %lu",
                            n, (unsigned long)UINT32_MAX - 1);
    }
    Py_buffer b[5];
    int held[5] = {0, 0, 0, 0, 0};
    PyObject *out = NULL;
    if (PyObject_GetBuffer(o[0], &b[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    Py_ssize_t m = b[0].len / 8;
    PyBuffer_Release(&b[0]);
    if ((uint64_t)m >= (uint64_t)UINT32_MAX) {
        return PyErr_Format(PyExc_ValueError, "the graph has %zd edges; the longest path handles 0 to %lu",
                            m, (unsigned long)UINT32_MAX - 1);
    }
    static const char *names[5] = {"src", "dst", "edge weights", "vertex weights", "dist"};
    const char kinds[5] = {'i', 'i', 'd', 'd', 'd'};
    for (int i = 0; i < 5; i++) {
        if (i >= 3 && o[i] == Py_None) continue;
        if (get_array(o[i], &b[i], i == 4, kinds[i], i >= 3 ? n : m, names[i]) < 0) goto fail;
        held[i] = 1;
    }
    sweep_result r = {0, 0, -INFINITY};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = sweep(n, m, b[0].buf, b[1].buf, b[2].buf, held[3] ? b[3].buf : NULL, held[4] ? b[4].buf : NULL, &r);
    Py_END_ALLOW_THREADS
    if (status == NO_MEMORY) {
        PyErr_NoMemory();
        goto fail;
    }
    out = Py_BuildValue("iLLd", status, (long long)r.index, (long long)r.reached, r.longest);
fail:
    for (int i = 0; i < 5; i++)
        if (held[i]) PyBuffer_Release(&b[i]);
    return out;
}

static PyMethodDef methods[] = {
    {"longest", longest, METH_VARARGS,
     "longest(n, src, dst, edge_w, vertex_w, dist) -> (status, index, reached, longest); see graph_kernels.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_graph_kernels", "Compiled sweeps over weighted DAGs given as edge arrays.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__graph_kernels(void) { return PyModule_Create(&module); }
