/* One streaming detector step in a few O(n) passes over the step's calls: group the calls by function, fold
 * their moments into the detector's view and local models (Chan et al.'s pairwise update), and judge every call
 * against the updated view.
 *
 * The Python side (flowscope/analysis/anomalies/stream.py, Detector.process) owns the arrays and keeps the numpy
 * formulation beside it; this file computes the same floating-point operations in the same order, so the
 * models and verdicts are bit for bit those of the numpy path (tests/test_anomaly_kernels.py checks it). It is
 * built without floating-point contraction (pyproject.toml) so that no multiply-add is fused.
 *
 * sstd_step(F, codes, values, view, local, std, cut, scratch, touched, score, flagged, keep_rows,
 *           sigma, min_count, mature, near, keep) -> (status, index, touched_count, kept_count)
 *   F: functions in the view; every array indexed by function holds at least F entries
 *   codes: int64[n] in [0, F); values: float64[n]                                          (read)
 *   view, local: (count int64, mean, m2, min, max float64) per function                    (updated)
 *   std, cut: float64 per function: std where judged, else inf; score from which a call is kept
 *   scratch: (count int64, sum float64, m2 float64) per function, all zero; left all zero
 *   touched: int64[n], the functions of the step in order of first call                    (written)
 *   score: float64[n]; flagged: bool[n]; keep_rows: int64[n], the positions of kept calls  (written)
 *   status: 0 done; 1 call `index` has a code outside [0, F) (nothing changed)
 *   bounds (optional): int64[k + 1], 0 = b[0] <= ... <= b[k] = n: k consecutive steps, each folded in and
 *   judged in turn as k separate calls would (keep_rows then index the whole input)
 *   lt, nlt, kept, ids, first_id (optional, after bounds; see get_extras): the list of functions with local calls
 *   since the last sync, appended to; a store the kept calls are appended to (id, view code, value) instead of
 *   keep_rows (then None), each call's id being ids[i] or first_id + i
 *
 * hbos_step(F, codes, values, view, local, view_hist, cell_values, scratch, touched, keys, score, flagged,
 *           keep_rows, max_bins, alpha, threshold, min_count, mature, rare, keep[, bounds]) -> the same tuple
 *   as sstd_step for the moments; view_hist: int64[F x 6144], the view's grid histograms (each call is added to
 *   its cell); cell_values: float64[6144], a cell's representative value (model._FINE_REP); keys: int64[n],
 *   each call's flat cell code * 6144 + cell (written). Each function of the step gets its HBOS bins from the
 *   grid cells between its min and max (model.scorer); a bin's score is computed once, when a call first lands
 *   in it. The scores use the C library's log2, which may differ from numpy's in the last bit.
 *
 * sync_moments(Fv, local, to_server, Fs, server, changed, version, since, from_server, view, refresh, std, cut,
 *              sigma, min_count, mature, near) -> status
 *   One detector's sync with a parameter server in the same process, for the moments (ParameterServer.
 *   exchange_rows and Detector.sync, without building per-function arrays): every function with local calls is
 *   merged into the server's moments (Chan et al.), marked changed at `version` and reset in `local`; then every
 *   server function changed after `since` is copied into the view (and with `refresh`, its SSTD std and keep
 *   threshold recomputed, as Detector._refresh).
 *   Fv: functions in the view; local, view: moments per view code, to_server: int64 view code -> server code
 *   Fs: functions in the server; server: moments, changed: int64 (the update that last changed each function),
 *   from_server: int64 server code -> view code
 *   status: 0 done; 1 a function with local calls has no server code; 2 the two maps disagree (1 and 2: nothing
 *   changed)
 *   lt, nlt (optional): the view codes with local calls (the first nlt[0]): only those are looked at, and nlt[0]
 *   is set to 0; log (optional): (codes, versions, count), the server's change log in version order, appended to
 *   (room for nlt[0], or Fv, more): the functions changed after `since` are read from it, not from a pass over
 *   `changed`
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t *count;
    double *mean, *m2, *min, *max;
} moments;

/* Chan et al.: fold (nb, mb, m2b) into function f of m, as FunctionModel._merge_rows */
static inline void merge_row(moments *m, int64_t f, int64_t nb, double mb, double m2b) {
    int64_t na = m->count[f];
    int64_t n = na + nb;
    double nf = (double)(n > 1 ? n : 1);
    double ma = m->mean[f];
    double delta = mb - ma;
    m->mean[f] = n > 0 ? ma + delta * ((double)nb / nf) : 0.0;
    m->m2[f] = (m->m2[f] + m2b) + (delta * delta) * (((double)na * (double)nb) / nf);
    m->count[f] = n;
}

/* the moments of a step's calls per function (pass 1: count and sum; pass 2: squared deviations about the
   step's mean, and min / max beyond the view's), merged into view and local; returns the touched count */
static int64_t fold_step(int64_t n, const int64_t *codes, const double *v, moments *view, moments *local,
                         int64_t *s_cnt, double *s_sum, double *s_m2, int64_t *touched, int64_t *lt, int64_t *nlt) {
    int64_t nt = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t c = codes[i];
        if (s_cnt[c]++ == 0) touched[nt++] = c;
        s_sum[c] += v[i];
    }
    for (int64_t k = 0; k < nt; k++) {
        int64_t c = touched[k];
        s_sum[c] = s_sum[c] / (double)s_cnt[c];  /* the step's mean */
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t c = codes[i];
        double x = v[i];
        double d = x - s_sum[c];
        s_m2[c] += d * d;
        if (x > view->max[c]) {
            view->max[c] = x;
            if (x > local->max[c]) local->max[c] = x;
        }
        if (x < view->min[c]) {
            view->min[c] = x;
            if (x < local->min[c]) local->min[c] = x;
        }
    }
    for (int64_t k = 0; k < nt; k++) {
        int64_t c = touched[k];
        merge_row(view, c, s_cnt[c], s_sum[c], s_m2[c]);
        if (lt && local->count[c] == 0) lt[(*nlt)++] = c;  /* first local call since the last sync */
        merge_row(local, c, s_cnt[c], s_sum[c], s_m2[c]);
        s_cnt[c] = 0;
        s_sum[c] = 0.0;
        s_m2[c] = 0.0;
    }
    return nt;
}

/* ---- argument handling ---------------------------------------------------------------------------------- */

#define MAX_BUFS 40

typedef struct {
    Py_buffer b[MAX_BUFS];
    int n;
} held_bufs;

static void release_all(held_bufs *h) {
    for (int i = 0; i < h->n; i++) PyBuffer_Release(&h->b[i]);
    h->n = 0;
}

/* a C-contiguous buffer of at least `count` items of one kind ('i': int64, 'd': float64, '?': bool) */
static void *get(held_bufs *h, PyObject *obj, int writable, char kind, Py_ssize_t count, const char *name) {
    Py_buffer *view = &h->b[h->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return NULL;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    Py_ssize_t size = kind == '?' ? 1 : 8;
    int ok = view->itemsize == size && f[1] == '\0' &&
             (kind == 'd' ? f[0] == 'd' : kind == '?' ? f[0] == '?' : (f[0] == 'l' || f[0] == 'q'));
    if (!ok || view->len < count * size) {
        PyErr_Format(PyExc_TypeError, "%s: expected at least %zd contiguous %s, got format %s, %zd bytes", name,
                     count, kind == 'd' ? "float64" : kind == '?' ? "bool" : "int64",
                     view->format ? view->format : "B", view->len);
        PyBuffer_Release(view);
        return NULL;
    }
    h->n++;
    return view->buf;
}

static Py_ssize_t length(PyObject *obj) {
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    Py_ssize_t n = b.itemsize ? b.len / b.itemsize : 0;
    PyBuffer_Release(&b);
    return n;
}

static int get_moments(held_bufs *h, PyObject *tuple, Py_ssize_t F, moments *m, const char *name) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 5) {
        PyErr_Format(PyExc_TypeError, "%s: expected (count, mean, m2, min, max)", name);
        return -1;
    }
    if (!(m->count = get(h, PyTuple_GET_ITEM(tuple, 0), 1, 'i', F, name))) return -1;
    if (!(m->mean = get(h, PyTuple_GET_ITEM(tuple, 1), 1, 'd', F, name))) return -1;
    if (!(m->m2 = get(h, PyTuple_GET_ITEM(tuple, 2), 1, 'd', F, name))) return -1;
    if (!(m->min = get(h, PyTuple_GET_ITEM(tuple, 3), 1, 'd', F, name))) return -1;
    if (!(m->max = get(h, PyTuple_GET_ITEM(tuple, 4), 1, 'd', F, name))) return -1;
    return 0;
}

static int64_t first_bad_code(int64_t n, const int64_t *codes, int64_t F) {
    for (int64_t i = 0; i < n; i++)
        if ((uint64_t)codes[i] >= (uint64_t)F) return i;
    return -1;
}

/* the steps of one call: `o` None, one step [0, n); else int64[k + 1] bounds, 0 = b[0] <= b[1] <= ... <= b[k] = n
   (step j: calls b[j] .. b[j + 1] - 1). Returns the number of steps, -1 with an exception set. */
static int64_t get_bounds(held_bufs *h, PyObject *o, Py_ssize_t n, const int64_t **b, int64_t one[2]) {
    if (o == Py_None) {
        one[0] = 0;
        one[1] = n;
        *b = one;
        return 1;
    }
    Py_ssize_t len = length(o);
    if (len < 0) return -1;
    if (len < 1) {
        PyErr_SetString(PyExc_ValueError, "bounds: expected at least one entry (0)");
        return -1;
    }
    const int64_t *x = get(h, o, 0, 'i', len, "bounds");
    if (!x) return -1;
    for (Py_ssize_t j = 0; j < len; j++) {
        if ((j == 0 && x[0] != 0) || (j > 0 && x[j] < x[j - 1]) || (j == len - 1 && x[j] != n)) {
            PyErr_Format(PyExc_ValueError, "bounds: entry %zd (%lld) breaks 0 = b[0] <= b[1] <= ... <= b[-1] = %zd",
                         j, (long long)x[j], n);
            return -1;
        }
    }
    *b = x;
    return len - 1;
}

/* the optional streaming arguments of a step (after bounds): lt, nlt: the view codes with local calls since the
   last sync (int64[F]) and their number (int64[1]), appended to as functions get their first local call; kept:
   (ids int64, codes int64, values float64, count int64[1]), a store the kept calls are appended to (room for
   count + n more), each with its id (call_ids[i], or first_id + i) and view code; without it keep_rows gets the
   positions of the kept calls */
typedef struct {
    int64_t *lt, *nlt, *k_ids, *k_codes, *k_n;
    double *k_vals;
    const int64_t *call_ids;
    int64_t first_id;
} extras;

static int get_extras(held_bufs *h, PyObject *o_lt, PyObject *o_nlt, PyObject *o_kept, PyObject *o_ids,
                      long long first_id, Py_ssize_t F, Py_ssize_t n, extras *x) {
    memset(x, 0, sizeof *x);
    x->first_id = first_id;
    if (o_lt != Py_None) {
        if (!(x->lt = get(h, o_lt, 1, 'i', F, "local touched"))) return -1;
        if (!(x->nlt = get(h, o_nlt, 1, 'i', 1, "local touched count"))) return -1;
        if (*x->nlt < 0 || *x->nlt > F) {
            PyErr_Format(PyExc_ValueError, "local touched count %lld outside 0..%zd", (long long)*x->nlt, F);
            return -1;
        }
    }
    if (o_kept != Py_None) {
        if (!PyTuple_Check(o_kept) || PyTuple_GET_SIZE(o_kept) != 4) {
            PyErr_SetString(PyExc_TypeError, "kept: expected (ids, codes, values, count)");
            return -1;
        }
        if (!(x->k_n = get(h, PyTuple_GET_ITEM(o_kept, 3), 1, 'i', 1, "kept count"))) return -1;
        Py_ssize_t need = (Py_ssize_t)*x->k_n + n;
        if (*x->k_n < 0) {
            PyErr_SetString(PyExc_ValueError, "kept count is negative");
            return -1;
        }
        if (!(x->k_ids = get(h, PyTuple_GET_ITEM(o_kept, 0), 1, 'i', need, "kept ids"))) return -1;
        if (!(x->k_codes = get(h, PyTuple_GET_ITEM(o_kept, 1), 1, 'i', need, "kept codes"))) return -1;
        if (!(x->k_vals = get(h, PyTuple_GET_ITEM(o_kept, 2), 1, 'd', need, "kept values"))) return -1;
    }
    if (o_ids != Py_None && !(x->call_ids = get(h, o_ids, 0, 'i', n, "ids"))) return -1;
    return 0;
}

static inline void keep_call(const extras *x, int64_t *keep_rows, int64_t nk, int64_t i, int64_t c, double v) {
    if (x->k_n) {
        int64_t k = *x->k_n + nk;
        x->k_ids[k] = x->call_ids ? x->call_ids[i] : x->first_id + i;
        x->k_codes[k] = c;
        x->k_vals[k] = v;
    } else {
        keep_rows[nk] = i;
    }
}

/* ---- SSTD ----------------------------------------------------------------------------------------------- */

static PyObject *sstd_step(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t F, min_count, mature;
    PyObject *o_codes, *o_values, *o_view, *o_local, *o_std, *o_cut, *o_s[3], *o_touched, *o_score, *o_flagged,
        *o_keep, *o_bounds = Py_None, *o_lt = Py_None, *o_nlt = Py_None, *o_kept = Py_None, *o_ids = Py_None;
    double sigma, near;
    int keep;
    long long first_id = 0;
    if (!PyArg_ParseTuple(args, "nOOOOOO(OOO)OOOOdnndp|OOOOOL", &F, &o_codes, &o_values, &o_view, &o_local, &o_std,
                          &o_cut, &o_s[0], &o_s[1], &o_s[2], &o_touched, &o_score, &o_flagged, &o_keep, &sigma,
                          &min_count, &mature, &near, &keep, &o_bounds, &o_lt, &o_nlt, &o_kept, &o_ids, &first_id))
        return NULL;
    Py_ssize_t n = length(o_codes);
    if (n < 0) return NULL;
    held_bufs h = {.n = 0};
    PyObject *out = NULL;
    moments view, local;
    const int64_t *codes = get(&h, o_codes, 0, 'i', n, "codes");
    const double *v = codes ? get(&h, o_values, 0, 'd', n, "values") : NULL;
    if (!v || get_moments(&h, o_view, F, &view, "view") < 0 || get_moments(&h, o_local, F, &local, "local") < 0)
        goto fail;
    double *std = get(&h, o_std, 1, 'd', F, "std");
    double *cut = std ? get(&h, o_cut, 1, 'd', F, "cut") : NULL;
    int64_t *s_cnt = cut ? get(&h, o_s[0], 1, 'i', F, "scratch count") : NULL;
    double *s_sum = s_cnt ? get(&h, o_s[1], 1, 'd', F, "scratch sum") : NULL;
    double *s_m2 = s_sum ? get(&h, o_s[2], 1, 'd', F, "scratch m2") : NULL;
    int64_t *touched = s_m2 ? get(&h, o_touched, 1, 'i', n, "touched") : NULL;
    double *score = touched ? get(&h, o_score, 1, 'd', n, "score") : NULL;
    char *flagged = score ? get(&h, o_flagged, 1, '?', n, "flagged") : NULL;
    if (!flagged) goto fail;
    extras ex;
    if (get_extras(&h, o_lt, o_nlt, o_kept, o_ids, first_id, F, n, &ex) < 0) goto fail;
    int64_t *keep_rows = NULL;
    if (keep && !ex.k_n && !(keep_rows = get(&h, o_keep, 1, 'i', n, "keep_rows"))) goto fail;
    const int64_t *bounds;
    int64_t one[2];
    int64_t steps = get_bounds(&h, o_bounds, n, &bounds, one);
    if (steps < 0) goto fail;

    int64_t bad, nt = 0, nk = 0;
    Py_BEGIN_ALLOW_THREADS
    bad = first_bad_code(n, codes, F);
    for (int64_t st = 0; bad < 0 && st < steps; st++) {  /* each step updated, then judged */
        int64_t lo = bounds[st], hi = bounds[st + 1];
        nt = fold_step(hi - lo, codes + lo, v + lo, &view, &local, s_cnt, s_sum, s_m2, touched, ex.lt, ex.nlt);
        int64_t judge_from = min_count > 2 ? min_count : 2;
        double near_cut = near * sigma;
        for (int64_t k = 0; k < nt; k++) {  /* as Detector._refresh */
            int64_t c = touched[k];
            int64_t cn = view.count[c];
            double s = sqrt(cn > 1 ? view.m2[c] / (double)(cn - 1 > 1 ? cn - 1 : 1) : 0.0);
            int judged = cn >= judge_from && s > 0;
            std[c] = s > 0 ? s : INFINITY;
            cut[c] = cn < mature ? -INFINITY : (judged ? near_cut : INFINITY);
        }
        for (int64_t i = lo; i < hi; i++) {
            int64_t c = codes[i];
            double s = fabs(v[i] - view.mean[c]) / std[c];
            score[i] = s;
            int f = s > sigma;
            if (min_count > 2) f = f && view.count[c] >= min_count;
            flagged[i] = (char)f;
            if (keep && s >= cut[c]) keep_call(&ex, keep_rows, nk++, i, c, v[i]);
        }
    }
    if (ex.k_n) *ex.k_n += nk;
    Py_END_ALLOW_THREADS
    out = Py_BuildValue("iLLL", bad < 0 ? 0 : 1, (long long)bad, (long long)nt, (long long)nk);
fail:
    release_all(&h);
    return out;
}

/* ---- HBOS ----------------------------------------------------------------------------------------------- */

enum { FINE_PER_OCTAVE = 128, FINE_BINS = 128 * 48, MANTISSA_SHIFT = 52 - 7 };

/* the grid cell of a value (ns), as model.fine_bin: octave and top 7 mantissa bits of value + 1 */
static inline int64_t fine_bin(double v) {
    double x = v + 1.0;
    if (x < 1.0) x = 1.0;
    int64_t bits;
    memcpy(&bits, &x, sizeof bits);
    int64_t b = (bits >> MANTISSA_SHIFT) - ((int64_t)1023 << 7);
    return b < FINE_BINS - 1 ? b : FINE_BINS - 1;
}

typedef struct {       /* one touched function's histogram verdict, as model.scorer computes it */
    double lo, width, nf, threshold, cut;
    int64_t nbins, first;  /* its bins, and where they start in the step's counts */
    int judged;
} hbos_row;

static PyObject *hbos_step(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t F, min_count, mature, rare, max_bins;
    PyObject *o_codes, *o_values, *o_view, *o_local, *o_hist, *o_rep, *o_s[3], *o_touched, *o_keys, *o_score,
        *o_flagged, *o_keep, *o_bounds = Py_None, *o_lt = Py_None, *o_nlt = Py_None, *o_kept = Py_None,
        *o_ids = Py_None;
    double alpha, threshold;
    int keep;
    long long first_id = 0;
    if (!PyArg_ParseTuple(args, "nOOOOOO(OOO)OOOOOnddnnnp|OOOOOL", &F, &o_codes, &o_values, &o_view, &o_local,
                          &o_hist, &o_rep, &o_s[0], &o_s[1], &o_s[2], &o_touched, &o_keys, &o_score, &o_flagged,
                          &o_keep, &max_bins, &alpha, &threshold, &min_count, &mature, &rare, &keep, &o_bounds,
                          &o_lt, &o_nlt, &o_kept, &o_ids, &first_id))
        return NULL;
    Py_ssize_t n = length(o_codes);
    if (n < 0) return NULL;
    if (max_bins < 1) return PyErr_Format(PyExc_ValueError, "max_bins must be >= 1, not %zd", max_bins);
    held_bufs h = {.n = 0};
    PyObject *out = NULL;
    moments view, local;
    const int64_t *codes = get(&h, o_codes, 0, 'i', n, "codes");
    const double *v = codes ? get(&h, o_values, 0, 'd', n, "values") : NULL;
    if (!v || get_moments(&h, o_view, F, &view, "view") < 0 || get_moments(&h, o_local, F, &local, "local") < 0)
        goto fail;
    int64_t *hist = get(&h, o_hist, 1, 'i', F * FINE_BINS, "view histogram");
    const double *rep = hist ? get(&h, o_rep, 0, 'd', FINE_BINS, "cell values") : NULL;
    int64_t *s_cnt = rep ? get(&h, o_s[0], 1, 'i', F, "scratch count") : NULL;
    double *s_sum = s_cnt ? get(&h, o_s[1], 1, 'd', F, "scratch sum") : NULL;
    double *s_m2 = s_sum ? get(&h, o_s[2], 1, 'd', F, "scratch m2") : NULL;
    int64_t *touched = s_m2 ? get(&h, o_touched, 1, 'i', n, "touched") : NULL;
    int64_t *keys = touched ? get(&h, o_keys, 1, 'i', n, "keys") : NULL;
    double *score = keys ? get(&h, o_score, 1, 'd', n, "score") : NULL;
    char *flagged = score ? get(&h, o_flagged, 1, '?', n, "flagged") : NULL;
    if (!flagged) goto fail;
    extras ex;
    if (get_extras(&h, o_lt, o_nlt, o_kept, o_ids, first_id, F, n, &ex) < 0) goto fail;
    int64_t *keep_rows = NULL;
    if (keep && !ex.k_n && !(keep_rows = get(&h, o_keep, 1, 'i', n, "keep_rows"))) goto fail;
    const int64_t *bounds;
    int64_t one[2];
    int64_t steps = get_bounds(&h, o_bounds, n, &bounds, one);
    if (steps < 0) goto fail;

    int64_t bad = first_bad_code(n, codes, F), nt = 0, nk = 0;
    int no_memory = 0;
    if (bad >= 0) goto done;
    /* per touched function: its verdict, its bins' counts, and a cache of their scores (NaN: not computed) */
    hbos_row *rows = NULL;
    int64_t *counts = NULL;
    double *cache = NULL;
    Py_BEGIN_ALLOW_THREADS
    rows = malloc((size_t)(n ? n : 1) * sizeof *rows);  /* a step touches at most as many functions as it has calls */
    if (!rows) no_memory = 1;
    for (int64_t st = 0; !no_memory && st < steps; st++) {  /* each step updated, then judged */
        int64_t lo = bounds[st], hi = bounds[st + 1];
        nt = fold_step(hi - lo, codes + lo, v + lo, &view, &local, s_cnt, s_sum, s_m2, touched, ex.lt, ex.nlt);
        for (int64_t i = lo; i < hi; i++) {
            keys[i] = codes[i] * FINE_BINS + fine_bin(v[i]);
            hist[keys[i]] += 1;
        }
        int64_t judge_from = min_count > 2 ? min_count : 2, total_bins = 0;
        for (int64_t k = 0; k < nt; k++) {  /* each function's bins, as model.scorer */
            int64_t c = touched[k];
            s_cnt[c] = k;  /* the scratch count, zeroed below, numbers the touched functions meanwhile */
            hbos_row *r = &rows[k];
            int64_t cn = view.count[c];
            double std = sqrt(cn > 1 ? view.m2[c] / (double)(cn - 1 > 1 ? cn - 1 : 1) : 0.0);
            r->judged = cn >= judge_from;
            r->nf = (double)(cn > 1 ? cn : 1);
            double span = r->judged ? view.max[c] - view.min[c] : 0.0;
            double scott = 3.49 * std * pow(r->nf, -1.0 / 3.0);
            double want = scott > 0 ? ceil(span / scott) : 1.0;
            if (isnan(want)) want = 1.0;
            if (want > (double)max_bins) want = (double)max_bins;
            if (want < 1.0) want = 1.0;
            r->nbins = (int64_t)want;
            r->width = span > 0 ? span / (double)r->nbins : 1.0;
            r->lo = r->judged ? view.min[c] : 0.0;
            r->first = total_bins;
            total_bins += r->nbins;
        }
        counts = calloc((size_t)(total_bins ? total_bins : 1), sizeof *counts);
        cache = malloc((size_t)(total_bins ? total_bins : 1) * sizeof *cache);
        if (!counts || !cache) {
            no_memory = 1;
        } else {
            for (int64_t b = 0; b < total_bins; b++) cache[b] = NAN;  /* a bin's score: not computed yet */
            for (int64_t k = 0; k < nt; k++) {
                int64_t c = touched[k];
                hbos_row *r = &rows[k];
                int64_t *cnt = &counts[r->first];
                const int64_t *hrow = &hist[c * FINE_BINS];
                /* each function's calls lie in the grid cells from its min's to its max's */
                for (int64_t cell = fine_bin(view.min[c]), last = fine_bin(view.max[c]); cell <= last; cell++) {
                    if (!hrow[cell]) continue;
                    double b = floor((rep[cell] - r->lo) / r->width);
                    if (b > (double)(r->nbins - 1)) b = (double)(r->nbins - 1);
                    if (b < 0) b = 0;
                    cnt[(int64_t)b] += hrow[cell];
                }
                /* the scores of the non-empty bins range from that of the fullest bin to that of the emptiest */
                int64_t most = 0, fewest = INT64_MAX;
                for (int64_t b = 0; b < r->nbins; b++) {
                    if (cnt[b] > most) most = cnt[b];
                    if (cnt[b] > 0 && cnt[b] < fewest) fewest = cnt[b];
                }
                if (most > 0) {
                    double smin = -log2((double)most / r->nf + alpha), smax = -log2((double)fewest / r->nf + alpha);
                    r->judged = r->judged && isfinite(smin) && smax > smin;
                    r->threshold = r->judged ? smin + threshold * (smax - smin) : INFINITY;
                } else {
                    r->judged = 0;
                    r->threshold = INFINITY;
                }
                r->cut = view.count[c] < mature ? -INFINITY : (r->judged ? r->threshold - 3.0 : INFINITY);
            }
            for (int64_t i = lo; i < hi; i++) {
                const hbos_row *r = &rows[s_cnt[codes[i]]];
                double b = floor((rep[fine_bin(v[i])] - r->lo) / r->width);
                if (b > (double)(r->nbins - 1)) b = (double)(r->nbins - 1);
                if (b < 0) b = 0;
                int64_t at = r->first + (int64_t)b;
                if (isnan(cache[at])) cache[at] = -log2((double)counts[at] / r->nf + alpha);
                double s = cache[at];
                score[i] = s;
                flagged[i] = (char)(r->judged && s >= r->threshold);
                if (keep && (s >= r->cut || hist[keys[i]] <= rare)) keep_call(&ex, keep_rows, nk++, i, codes[i], v[i]);
            }
        }
        for (int64_t k = 0; k < nt; k++) s_cnt[touched[k]] = 0;
        free(counts);
        free(cache);
        counts = NULL;
        cache = NULL;
    }
    if (ex.k_n && !no_memory) *ex.k_n += nk;
    Py_END_ALLOW_THREADS
    free(rows);
    if (no_memory) {
        PyErr_NoMemory();
        goto fail;
    }
done:
    out = Py_BuildValue("iLLL", bad < 0 ? 0 : 1, (long long)bad, (long long)nt, (long long)nk);
fail:
    release_all(&h);
    return out;
}

/* ---- sync with a parameter server in the same process ---------------------------------------------------- */

/* SSTD: a function's std where judged (else inf) and the score from which its calls are kept, as
   Detector._refresh and sstd_step */
static inline void sstd_refresh(const moments *view, int64_t c, double *std, double *cut, int64_t judge_from,
                                int64_t mature, double near_cut) {
    int64_t cn = view->count[c];
    double s = sqrt(cn > 1 ? view->m2[c] / (double)(cn - 1 > 1 ? cn - 1 : 1) : 0.0);
    int judged = cn >= judge_from && s > 0;
    std[c] = s > 0 ? s : INFINITY;
    cut[c] = cn < mature ? -INFINITY : (judged ? near_cut : INFINITY);
}

static PyObject *sync_moments(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t Fv, Fs, min_count, mature;
    long long version, since;
    PyObject *o_local, *o_to, *o_server, *o_changed, *o_from, *o_view, *o_std, *o_cut, *o_lt = Py_None,
        *o_nlt = Py_None, *o_log = Py_None;
    double sigma, near;
    int refresh;
    if (!PyArg_ParseTuple(args, "nOOnOOLLOOpOOdnnd|OOO", &Fv, &o_local, &o_to, &Fs, &o_server, &o_changed, &version,
                          &since, &o_from, &o_view, &refresh, &o_std, &o_cut, &sigma, &min_count, &mature, &near,
                          &o_lt, &o_nlt, &o_log))
        return NULL;
    if (Fv < 0 || Fs < 0) return PyErr_Format(PyExc_ValueError, "negative sizes %zd, %zd", Fv, Fs);
    held_bufs h = {.n = 0};
    PyObject *out = NULL;
    moments local, server, view;
    if (get_moments(&h, o_local, Fv, &local, "local") < 0 || get_moments(&h, o_server, Fs, &server, "server") < 0 ||
        get_moments(&h, o_view, Fv, &view, "view") < 0)
        goto fail;
    const int64_t *to = get(&h, o_to, 0, 'i', Fv, "to_server");
    int64_t *changed = to ? get(&h, o_changed, 1, 'i', Fs, "changed") : NULL;
    const int64_t *from = changed ? get(&h, o_from, 0, 'i', Fs, "from_server") : NULL;
    double *std = NULL, *cut = NULL;
    if (!from) goto fail;
    if (refresh && (!(std = get(&h, o_std, 1, 'd', Fv, "std")) || !(cut = get(&h, o_cut, 1, 'd', Fv, "cut"))))
        goto fail;
    extras ex;  /* only lt, nlt */
    if (get_extras(&h, o_lt, o_nlt, Py_None, Py_None, 0, Fv, 0, &ex) < 0) goto fail;
    int64_t *log_codes = NULL, *log_ver = NULL, *log_n = NULL;
    if (o_log != Py_None) {  /* (codes, versions, count): every (server code, version) of a change, in version order */
        if (!PyTuple_Check(o_log) || PyTuple_GET_SIZE(o_log) != 3) {
            PyErr_SetString(PyExc_TypeError, "log: expected (codes, versions, count)");
            goto fail;
        }
        if (!(log_n = get(&h, PyTuple_GET_ITEM(o_log, 2), 1, 'i', 1, "log count"))) goto fail;
        Py_ssize_t need = (Py_ssize_t)*log_n + (ex.lt ? (Py_ssize_t)*ex.nlt : Fv);
        if (!(log_codes = get(&h, PyTuple_GET_ITEM(o_log, 0), 1, 'i', need, "log codes")) ||
            !(log_ver = get(&h, PyTuple_GET_ITEM(o_log, 1), 1, 'i', need, "log versions")))
            goto fail;
    }
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t nrows = ex.lt ? *ex.nlt : Fv, start = 0, end = log_n ? *log_n : 0;
#define LOCAL_ROW(k) (ex.lt ? ex.lt[k] : (k))
    if (log_n) {  /* the first entry after `since` */
        int64_t a = 0, b = end;
        while (a < b) {
            int64_t m = a + (b - a) / 2;
            if (log_ver[m] > since) b = m; else a = m + 1;
        }
        start = a;
    }
    /* the log, unless it holds more entries since `since` than there are functions (then one pass over `changed`) */
    int use_log = log_n && end - start <= (int64_t)Fs + nrows;
    /* checks first, so that a refusal changes nothing */
    for (int64_t k = 0; k < nrows && !status; k++) {
        int64_t r = LOCAL_ROW(k);
        if ((uint64_t)r >= (uint64_t)Fv) status = 2;
        else if (local.count[r]) {
            if ((uint64_t)to[r] >= (uint64_t)Fs) status = 1;
            else if (from[to[r]] != r) status = 2;
        }
    }
    if (use_log) {
        for (int64_t j = start; j < end && !status; j++)
            if ((uint64_t)log_codes[j] >= (uint64_t)Fs || (uint64_t)from[log_codes[j]] >= (uint64_t)Fv) status = 2;
    } else {
        for (int64_t s = 0; s < Fs && !status; s++)
            if (changed[s] > since && (uint64_t)from[s] >= (uint64_t)Fv) status = 2;
    }
    for (int64_t k = 0; k < nrows && !status; k++) {
        int64_t r = LOCAL_ROW(k);
        int64_t nb = local.count[r];
        if (!nb) continue;
        int64_t s = to[r];  /* as ParameterServer.exchange_rows: FunctionModel._merge_rows, then min and max */
        merge_row(&server, s, nb, local.mean[r], local.m2[r]);
        if (local.min[r] < server.min[s] || isnan(local.min[r])) server.min[s] = local.min[r];
        if (local.max[r] > server.max[s] || isnan(local.max[r])) server.max[s] = local.max[r];
        changed[s] = version;
        if (log_n) {
            log_codes[*log_n] = s;
            log_ver[(*log_n)++] = version;
        }
        local.count[r] = 0;  /* as Detector._reset_local */
        local.mean[r] = 0.0;
        local.m2[r] = 0.0;
        local.min[r] = INFINITY;
        local.max[r] = -INFINITY;
    }
#undef LOCAL_ROW
    if (!status) {
        int64_t judge_from = min_count > 2 ? min_count : 2;
        if (ex.lt) *ex.nlt = 0;
        /* every function changed since the detector's last sync (from the log: the same functions, some more
           than once, which copies the same values again) */
        int64_t last = use_log ? *log_n : Fs;
        for (int64_t j = use_log ? start : 0; j < last; j++) {
            int64_t s = use_log ? log_codes[j] : j;
            if (!use_log && changed[s] <= since) continue;
            int64_t c = from[s];
            view.count[c] = server.count[s];
            view.mean[c] = server.mean[s];
            view.m2[c] = server.m2[s];
            view.min[c] = server.min[s];
            view.max[c] = server.max[s];
            if (refresh) sstd_refresh(&view, c, std, cut, judge_from, mature, near * sigma);
        }
    }
    Py_END_ALLOW_THREADS
    out = PyLong_FromLong(status);
fail:
    release_all(&h);
    return out;
}

/* ---- histogram increments ------------------------------------------------------------------------------- */

/* hist_add(hist, keys, counts) -> index: hist[keys[i]] += counts[i] (counts None: 1 each), as np.add.at; index
   is -1, or the first key outside hist, and then nothing was added */
static PyObject *hist_add(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o_hist, *o_keys, *o_counts;
    if (!PyArg_ParseTuple(args, "OOO", &o_hist, &o_keys, &o_counts)) return NULL;
    Py_ssize_t size = length(o_hist), n = length(o_keys);
    if (size < 0 || n < 0) return NULL;
    held_bufs h = {.n = 0};
    PyObject *out = NULL;
    int64_t *hist = get(&h, o_hist, 1, 'i', size, "hist");
    const int64_t *keys = hist ? get(&h, o_keys, 0, 'i', n, "keys") : NULL;
    const int64_t *counts = NULL;
    if (!keys || (o_counts != Py_None && !(counts = get(&h, o_counts, 0, 'i', n, "counts")))) goto fail;
    int64_t bad;
    Py_BEGIN_ALLOW_THREADS
    bad = first_bad_code(n, keys, size);
    if (bad < 0) {
        if (counts)
            for (int64_t i = 0; i < n; i++) hist[keys[i]] += counts[i];
        else
            for (int64_t i = 0; i < n; i++) hist[keys[i]] += 1;
    }
    Py_END_ALLOW_THREADS
    out = PyLong_FromLongLong(bad);
fail:
    release_all(&h);
    return out;
}

static PyMethodDef methods[] = {
    {"sstd_step", sstd_step, METH_VARARGS,
     "sstd_step(F, codes, values, view, local, std, cut, scratch, touched, score, flagged, keep_rows, sigma, "
     "min_count, mature, near, keep[, bounds]) -> (status, index, touched, kept); see the file's header"},
    {"hbos_step", hbos_step, METH_VARARGS,
     "hbos_step(F, codes, values, view, local, view_hist, cell_values, scratch, touched, keys, score, flagged, "
     "keep_rows, max_bins, alpha, threshold, min_count, mature, rare, keep[, bounds]) -> (status, index, touched, "
     "kept); see "
     "the file's header"},
    {"sync_moments", sync_moments, METH_VARARGS,
     "sync_moments(Fv, local, to_server, Fs, server, changed, version, since, from_server, view, refresh, std, cut, "
     "sigma, min_count, mature, near) -> status; see the file's header"},
    {"hist_add", hist_add, METH_VARARGS,
     "hist_add(hist, keys, counts) -> -1 or the first key outside hist: hist[keys] += counts (None: 1), as "
     "np.add.at"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_step_kernels", "One streaming anomaly-detector step, compiled.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__step_kernels(void) { return PyModule_Create(&module); }
