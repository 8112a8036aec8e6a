"""Per-function models that merge exactly, and the scores the detectors give calls against them.

A model holds, per function: count, mean, M2 (sum of squared deviations), min and max of the scored
metric, and a histogram on a fixed logarithmic grid (``FINE_PER_OCTAVE`` bins per doubling of the
value in ns). Merging two models is the pairwise update of Chan et al. (what Chimbuko does: count-
weighted mean, ``M2 += delta**2 * nA * nB / n``, min, max) and the sum of the grid histograms. The grid
is the same for every model, so merged histograms are exactly the histogram of the union: any split
of the data merged gives the model of the whole.

HBOS (Chimbuko's default) scores a call by the rarity of its bin in a histogram of at most
``max_bins`` equal-width bins over the function's [min, max] (width by Scott's rule, as Chimbuko),
built from the grid histogram: bin score ``-log2(count / n + alpha)``; a call is flagged when its
score is at least ``min + threshold * (max - min)`` of the scores of the non-empty bins. SSTD flags a
call outside ``mean +- sigma * std``. COPOD scores the empirical tail probability of the call in the
grid histogram (``-log(min(F(x), 1 - F(x-)))``) and flags calls whose two-sided tail probability is
below ``1 - threshold``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from flowscope.analysis.anomalies.config import AnomalyConfig

FINE_PER_OCTAVE = 128                 # grid resolution: bins are 0.4-0.8 % wide
FINE_OCTAVES = 48                     # values up to 2**48 ns (3.3 days); longer ones share the last bin
FINE_BINS = FINE_PER_OCTAVE * FINE_OCTAVES
_MANTISSA_SHIFT = 52 - 7              # 7 = log2(FINE_PER_OCTAVE) mantissa bits select the bin in an octave


def _fine_edges() -> np.ndarray:
    i = np.arange(FINE_BINS + 1)
    return np.exp2(i >> 7) * (1.0 + (i & 127) / FINE_PER_OCTAVE) - 1.0


FINE_EDGES = _fine_edges()            # bin i holds values in [FINE_EDGES[i], FINE_EDGES[i + 1])
_FINE_REP = (FINE_EDGES[:-1] + FINE_EDGES[1:]) / 2  # a bin's representative value


def fine_bin(values: np.ndarray) -> np.ndarray:
    """Grid bin of each value (ns, >= 0; negative values count as 0): octave and top 7 mantissa bits of
    value + 1, read from the float's bits (a log-linear grid, like HDR histograms)."""
    v = np.asarray(values, dtype=np.float64) + 1.0
    np.maximum(v, 1.0, out=v)
    b = (v.view(np.int64) >> _MANTISSA_SHIFT) - (1023 << 7)
    np.minimum(b, FINE_BINS - 1, out=b)
    return b


_CHUNK = 1 << 18


def batch_stats(codes: np.ndarray, values: np.ndarray, nfunc: int) -> tuple[np.ndarray, ...]:
    """count, mean, M2, min, max and grid histogram per function code of one batch (vectorised)."""
    codes = np.asarray(codes, dtype=np.int64)
    if len(codes) > _CHUNK:  # in cache-sized chunks, merged pairwise
        out = batch_stats(codes[:_CHUNK], values[:_CHUNK], nfunc)
        for i in range(_CHUNK, len(codes), _CHUNK):
            out = merge_arrays(out, batch_stats(codes[i:i + _CHUNK], values[i:i + _CHUNK], nfunc))
        return out
    v = np.asarray(values, dtype=np.float64)
    count = np.bincount(codes, minlength=nfunc).astype(np.int64)
    sums = np.bincount(codes, weights=v, minlength=nfunc)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, sums / np.maximum(count, 1), 0.0)
    dev = v - mean[codes]
    m2 = np.bincount(codes, weights=dev * dev, minlength=nfunc)
    vmin = np.full(nfunc, np.inf)
    vmax = np.full(nfunc, -np.inf)
    np.minimum.at(vmin, codes, v)
    np.maximum.at(vmax, codes, v)
    hist = np.bincount(codes * FINE_BINS + fine_bin(v), minlength=nfunc * FINE_BINS).reshape(nfunc, FINE_BINS)
    return count, mean, m2, vmin, vmax, hist.astype(np.int64)


def merge_arrays(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Pairwise merge of two aligned (count, mean, M2, min, max, hist) tuples."""
    na, ma, m2a, mina, maxa, ha = a
    nb, mb, m2b, minb, maxb, hb = b
    n = na + nb
    nf = np.maximum(n, 1).astype(np.float64)
    delta = mb - ma
    mean = np.where(n > 0, ma + delta * (nb / nf), 0.0)
    m2 = m2a + m2b + delta * delta * (na.astype(np.float64) * nb / nf)
    return n, mean, m2, np.minimum(mina, minb), np.maximum(maxa, maxb), ha + hb


def batch_moments(codes: np.ndarray, v: np.ndarray, nfunc: int, minmax: bool = True) -> tuple[np.ndarray, ...]:
    """The functions a batch touches (codes < ``nfunc``) and, for each, its count, mean, M2 (and with
    ``minmax`` its min and max) in the batch; the work is in proportion to the batch, plus one pass over
    ``nfunc`` counters."""
    cnt = np.bincount(codes, minlength=nfunc)
    touched = np.flatnonzero(cnt)
    t = len(touched)
    if 2 * t >= len(cnt):  # most functions: per-function arrays over all of them
        local, t, nb = codes, len(cnt), cnt
    else:
        pos = np.empty(len(cnt), np.int64)
        pos[touched] = np.arange(t)
        local = pos[codes]  # the batch's functions numbered 0..t-1
        nb = cnt[touched]
    with np.errstate(invalid="ignore", divide="ignore"):
        mb = np.bincount(local, weights=v, minlength=t) / nb
    dev = np.subtract(v, mb[local])
    dev *= dev
    m2b = np.bincount(local, weights=dev, minlength=t)
    if t == len(cnt) and t != len(touched):  # back to the touched functions only
        nb, mb, m2b = nb[touched], mb[touched], m2b[touched]
    if not minmax:
        return touched, nb, mb, m2b
    lo = np.full(len(touched), np.inf)
    hi = np.full(len(touched), -np.inf)
    if t == len(touched):
        np.minimum.at(lo, local, v)
        np.maximum.at(hi, local, v)
    else:
        full_lo, full_hi = np.full(t, np.inf), np.full(t, -np.inf)
        np.minimum.at(full_lo, local, v)
        np.maximum.at(full_hi, local, v)
        lo, hi = full_lo[touched], full_hi[touched]
    return touched, nb, mb, m2b, lo, hi


class FunctionModel:
    """Per-function statistics and grid histograms, keyed by function name; merges exactly.

    ``histograms=False`` keeps the moments (count, mean, M2, min, max) only: what SSTD needs, at a fraction
    of the cost; ``hist`` is then an array with no columns. A model without histograms never merges into a
    non-empty one with them (the union's histogram would be wrong), nor HBOS judges with it.

    Storage grows by doubling, and ``update`` / ``merge_in`` touch only the functions of their calls, so a
    model of many functions fed small batches costs in proportion to the batches.
    """

    def __init__(self, histograms: bool = True) -> None:
        self.histograms = bool(histograms)
        self.names: list[str] = []
        self._index: dict[str, int] = {}   # names[:len(_index)] -> their codes; the rest added when looked up
        self._count = np.zeros(0, np.int64)
        self._mean = np.zeros(0)
        self._m2 = np.zeros(0)
        self._min = np.zeros(0)
        self._max = np.zeros(0)
        self._hist = np.zeros((0, FINE_BINS if self.histograms else 0), np.int64)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def index(self) -> dict[str, int]:
        """Each name's code (built when first looked up: a model that only mirrors another's names never is)."""
        d, names = self._index, self.names
        if len(d) < len(names):
            d.update(zip(names[len(d):], range(len(d), len(names))))
        return d

    @index.setter
    def index(self, d: dict[str, int]) -> None:
        self._index = d

    def __repr__(self) -> str:
        return f"FunctionModel({len(self.names)} functions, {int(self.count.sum())} calls)"

    # the per-function arrays, one entry per name (views of the storage; assigning replaces it)
    count = property(lambda self: self._count[:len(self.names)],
                     lambda self, a: setattr(self, "_count", np.asarray(a, np.int64)))
    mean = property(lambda self: self._mean[:len(self.names)],
                    lambda self, a: setattr(self, "_mean", np.asarray(a, np.float64)))
    m2 = property(lambda self: self._m2[:len(self.names)],
                  lambda self, a: setattr(self, "_m2", np.asarray(a, np.float64)))
    min = property(lambda self: self._min[:len(self.names)],
                   lambda self, a: setattr(self, "_min", np.asarray(a, np.float64)))
    max = property(lambda self: self._max[:len(self.names)],
                   lambda self, a: setattr(self, "_max", np.asarray(a, np.float64)))
    hist = property(lambda self: self._hist[:len(self.names)],
                    lambda self, a: setattr(self, "_hist", np.asarray(a, np.int64)))

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        return self.count, self.mean, self.m2, self.min, self.max, self.hist

    @property
    def std(self) -> np.ndarray:
        """Sample standard deviation (0 below two calls)."""
        return np.sqrt(np.where(self.count > 1, self.m2 / np.maximum(self.count - 1, 1), 0.0))

    def codes(self, names: Sequence[str]) -> np.ndarray:
        """This model's index of each name, adding the names it does not have yet."""
        if not len(names):
            return np.zeros(0, np.int64)
        if not self.names:  # a first numbering: the names' own order when they do not repeat
            d = dict(zip(names, range(len(names))))
            if len(d) == len(names):
                self._grow(list(names))
                self._index = d
                return np.arange(len(names), dtype=np.int64)
        index = self.index
        try:
            return np.fromiter(map(index.__getitem__, names), np.int64, len(names))
        except KeyError:
            self._grow([n for n in dict.fromkeys(names) if n not in index])
            index = self.index
            return np.fromiter(map(index.__getitem__, names), np.int64, len(names))

    def _grow(self, new: list[str]) -> None:
        self.names.extend(new)  # (the index follows when looked up)
        need = len(self.names)
        for attr, fill in (("_count", 0), ("_mean", 0.0), ("_m2", 0.0), ("_min", np.inf), ("_max", -np.inf),
                           ("_hist", 0)):
            a = getattr(self, attr)
            if len(a) < need:
                shape = (max(need, 2 * len(a), 8),) + a.shape[1:]
                b = np.zeros(shape, a.dtype) if fill == 0 else np.full(shape, fill, a.dtype)  # zeros: lazy pages
                b[:len(a)] = a
                setattr(self, attr, b)
            else:  # storage set shorter by hand or left over: the new entries start empty
                a[need - len(new):need] = fill

    def update(self, codes: np.ndarray, values: np.ndarray) -> None:
        """Add one batch of calls (``codes`` from ``self.codes``) to the model."""
        codes = np.asarray(codes, dtype=np.int64)
        if len(codes) == 0:
            return
        v = np.asarray(values, dtype=np.float64)
        self._merge_rows(*batch_moments(codes, v, len(self.names)))
        if self.histograms:
            np.add.at(self._hist.reshape(-1), codes * FINE_BINS + fine_bin(v), 1)

    def _merge_rows(self, rows: np.ndarray, nb: np.ndarray, mb: np.ndarray, m2b: np.ndarray,
                    lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> None:
        """Chan et al.'s pairwise update of the functions at ``rows`` with the statistics of other calls."""
        na = self._count[rows]
        n = na + nb
        nf = np.maximum(n, 1).astype(np.float64)
        ma = self._mean[rows]
        delta = mb - ma
        self._mean[rows] = np.where(n > 0, ma + delta * (nb / nf), 0.0)
        self._m2[rows] = self._m2[rows] + m2b + delta * delta * (na.astype(np.float64) * nb / nf)
        self._count[rows] = n
        if lo is not None:
            self._min[rows] = np.minimum(self._min[rows], lo)
            self._max[rows] = np.maximum(self._max[rows], hi)

    def _check_merge(self, other: FunctionModel) -> None:
        if other.histograms == self.histograms:
            return
        if not self.count.any():  # nothing here yet: take the other's kind
            self.histograms = other.histograms
            self._hist = np.zeros((len(self._count), FINE_BINS if self.histograms else 0), np.int64)
            return
        have, lack = ("this model", "the other") if self.histograms else ("the other", "this model")
        raise ValueError(f"cannot merge models with and without histograms: {have} has histograms, {lack} has "
                         f"none (HBOS detectors keep them, SSTD detectors do not; use one algorithm per run)")

    def merge(self, other: FunctionModel) -> FunctionModel:
        """A new model of the union of the data of ``self`` and ``other``."""
        out = self.copy()
        out.merge_in(other)
        return out

    def merge_in(self, other: FunctionModel) -> None:
        """Merge ``other`` into this model in place."""
        if not len(other):
            return
        self._check_merge(other)
        idx = self.codes(other.names)
        self._merge_rows(idx, other.count, other.mean, other.m2, other.min, other.max)
        if self.histograms:
            self._hist[idx] += other.hist

    def assign(self, other: FunctionModel) -> None:
        """Take ``other``'s statistics for its functions, replacing this model's (what a parameter server's
        reply of the functions that changed does to a detector's view)."""
        if not len(other):
            return
        self._check_merge(other)
        idx = self.codes(other.names)
        for attr in ("_count", "_mean", "_m2", "_min", "_max"):
            getattr(self, attr)[idx] = getattr(other, attr)[:len(other)]
        if self.histograms:
            self._hist[idx] = other.hist

    def subset(self, rows: np.ndarray) -> FunctionModel:
        """A new model of the functions at ``rows`` only."""
        rows = np.asarray(rows, np.int64)
        out = FunctionModel(self.histograms)
        out.names = [self.names[i] for i in rows.tolist()]
        out.index = {}
        out.count, out.mean, out.m2 = self.count[rows], self.mean[rows], self.m2[rows]
        out.min, out.max, out.hist = self.min[rows], self.max[rows], self.hist[rows]
        return out

    def copy(self) -> FunctionModel:
        out = FunctionModel(self.histograms)
        out.names = list(self.names)
        out.index = dict(self._index)
        out.count, out.mean, out.m2 = self.count.copy(), self.mean.copy(), self.m2.copy()
        out.min, out.max, out.hist = self.min.copy(), self.max.copy(), self.hist.copy()
        return out

    @classmethod
    def of(cls, names: Sequence[str], codes: np.ndarray, values: np.ndarray, histograms: bool = True
           ) -> FunctionModel:
        """The model of calls given as codes into ``names`` and their values."""
        m = cls(histograms)
        m.codes(list(names))
        m.update(np.asarray(codes, np.int64), values)
        return m

    # ---- exchange (parameter server) ---------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-ready form; histograms as sparse (bin, count) pairs (``"histograms": false`` and no pairs for a
        model without them)."""
        funcs = []
        for i, name in enumerate(self.names):
            f = {"name": name, "count": int(self.count[i]), "mean": float(self.mean[i]), "m2": float(self.m2[i]),
                 "min": float(self.min[i]) if np.isfinite(self.min[i]) else None,
                 "max": float(self.max[i]) if np.isfinite(self.max[i]) else None}
            if self.histograms:
                nz = np.flatnonzero(self.hist[i])
                f.update(bins=nz.tolist(), counts=self.hist[i, nz].tolist())
            funcs.append(f)
        return {"grid": {"per_octave": FINE_PER_OCTAVE, "octaves": FINE_OCTAVES}, "histograms": self.histograms,
                "functions": funcs}

    @classmethod
    def from_dict(cls, d: dict) -> FunctionModel:
        """Inverse of ``to_dict``; ValueError naming the field when the document does not fit."""
        grid = d.get("grid") or {}
        if grid.get("per_octave") != FINE_PER_OCTAVE or grid.get("octaves") != FINE_OCTAVES:
            raise ValueError(f"model grid {grid!r} differs from this flowscope's "
                             f"(per_octave={FINE_PER_OCTAVE}, octaves={FINE_OCTAVES})")
        histograms = d.get("histograms", True)
        if not isinstance(histograms, bool):
            raise ValueError(f"model: 'histograms' must be true or false, not {histograms!r}")
        m = cls(histograms)
        funcs = d.get("functions")
        if not isinstance(funcs, list):
            raise ValueError("model: 'functions' must be a list")
        m.codes([f["name"] for f in funcs])
        for i, f in enumerate(funcs):
            try:
                m.count[i] = int(f["count"])
                m.mean[i], m.m2[i] = float(f["mean"]), float(f["m2"])
                m.min[i] = np.inf if f["min"] is None else float(f["min"])
                m.max[i] = -np.inf if f["max"] is None else float(f["max"])
                if histograms:
                    bins = np.asarray(f["bins"], np.int64)
                    if len(bins) and (bins.min() < 0 or bins.max() >= FINE_BINS):
                        raise ValueError(f"bin out of range 0..{FINE_BINS - 1}")
                    m.hist[i, bins] = np.asarray(f["counts"], np.int64)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"model: function {i} ({f.get('name')!r}): {exc}") from None
        return m

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


@dataclass
class Scorer:
    """A model's verdict per function, ready to score calls in bulk."""

    config: AnomalyConfig
    model: FunctionModel
    judged: np.ndarray        # per function: enough data to flag anything
    threshold: np.ndarray     # per function: score from which a call is flagged
    scores: np.ndarray | None  # hbos: per function x histogram bin, the score of a call in that bin
    nbins: np.ndarray         # hbos: bins of the function's histogram
    width: np.ndarray         # hbos: their width (ns)
    counts: np.ndarray | None  # hbos: per function x histogram bin, its calls
    pos: np.ndarray | None = None  # when built for some functions only: model code -> row of the arrays above
    mean: np.ndarray | None = None  # sstd: per function, mean and standard deviation (0 below two calls)
    std: np.ndarray | None = None
    lo: np.ndarray | None = None    # hbos: per function, where its first bin starts

    def _bin(self, p: np.ndarray, v: np.ndarray) -> np.ndarray:
        """hbos: the histogram bin of calls of the functions at rows ``p`` with values ``v`` (by grid cell)."""
        b = np.floor((_FINE_REP[fine_bin(v)] - self.lo[p]) / self.width[p])
        return np.clip(b, 0, self.nbins[p] - 1).astype(np.int64)

    def _at(self, codes: np.ndarray) -> np.ndarray:
        return codes if self.pos is None else self.pos[codes]

    def score(self, codes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(score, flagged) of each call; ``codes`` index this scorer's model (and, for a scorer built for
        some functions only, name one of them)."""
        codes = np.asarray(codes, np.int64)
        v = np.asarray(values, np.float64)
        p = self._at(codes)
        if self.config.algo == "sstd":
            std = self.std[p]
            with np.errstate(divide="ignore", invalid="ignore"):
                s = np.abs(v - self.mean[p]) / std
            s = np.where(std > 0, s, 0.0)
        else:
            s = self.scores[p, self._bin(p, v)] if len(p) else np.zeros(0)
        threshold = self.threshold[p]
        flagged = self.judged[p] & (s >= threshold)
        if self.config.algo == "sstd":
            flagged &= s > threshold  # strictly outside mean +- sigma * std
        return s, flagged

    def explain(self, code: int, value: float) -> dict:
        """The model parameters a call of function ``code`` with ``value`` was judged against."""
        m, c = self.model, self.config
        p = int(self._at(np.asarray([code]))[0])
        out = {"algo": c.algo, "metric": c.metric, "count": int(m.count[code]), "mean": float(m.mean[code]),
               "std": float(m.std[code]), "min": float(m.min[code]), "max": float(m.max[code]),
               "threshold": float(self.threshold[p])}
        if c.algo == "sstd":
            out.update(sigma=c.sigma, lower=float(m.mean[code] - c.sigma * m.std[code]),
                       upper=float(m.mean[code] + c.sigma * m.std[code]))
        else:
            b = int(self._bin(np.array([p]), np.array([value], np.float64))[0])
            out.update(threshold_fraction=c.threshold, alpha=c.alpha, bins=int(self.nbins[p]),
                       bin_width=float(self.width[p]), bin_count=int(self.counts[p, b]))
        return out


def scorer(model: FunctionModel, config: AnomalyConfig, rows: np.ndarray | None = None) -> Scorer:
    """Precompute, per function, what scoring a call against ``model`` needs (vectorised over functions);
    with ``rows``, for the functions at those codes only (what judging a batch needs)."""
    pos = None
    if rows is None:
        n, mean, m2, vmin, vmax = model.count, model.mean, model.m2, model.min, model.max
    else:
        rows = np.asarray(rows, np.int64)
        pos = np.full(len(model), -1, np.int64)
        pos[rows] = np.arange(len(rows))
        n, mean, m2, vmin, vmax = model.count[rows], model.mean[rows], model.m2[rows], model.min[rows], model.max[rows]
    F = len(n)
    std = np.sqrt(np.where(n > 1, m2 / np.maximum(n - 1, 1), 0.0))
    judged = n >= max(config.min_count, 2)
    nbins = np.ones(F, np.int64)
    width = np.zeros(F)
    table = bin_count = lo = None
    if config.algo == "sstd":
        threshold = np.full(F, float(config.sigma))
        judged &= std > 0
    else:  # hbos
        if not model.histograms:
            raise ValueError("HBOS needs a model with histograms; this one keeps moments only "
                             "(FunctionModel(histograms=False), as SSTD detectors build)")
        codes = np.arange(len(model), dtype=np.int64) if rows is None else rows
        nf = np.maximum(n, 1).astype(np.float64)
        span = np.where(judged, vmax - vmin, 0.0)
        scott = 3.49 * std * nf ** (-1.0 / 3.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            want = np.where(scott > 0, np.ceil(span / scott), 1.0)
        nbins = np.clip(np.nan_to_num(want, nan=1.0, posinf=config.max_bins), 1, config.max_bins).astype(np.int64)
        width = np.where(span > 0, span / nbins, 1.0)
        lo = np.where(judged, vmin, 0.0)
        # each function's calls lie in the grid cells from its min's to its max's: bin only those
        c0 = fine_bin(np.where(n > 0, vmin, 0.0))
        ncell = np.where(n > 0, fine_bin(np.where(n > 0, vmax, 0.0)) - c0 + 1, 0)
        f = np.repeat(np.arange(F, dtype=np.int64), ncell)
        cell = np.arange(len(f), dtype=np.int64) - np.repeat(np.cumsum(ncell) - ncell, ncell) + c0[f]
        coarse = np.clip(np.floor((_FINE_REP[cell] - lo[f]) / width[f]), 0, nbins[f] - 1).astype(np.int64)
        counts = np.bincount(f * config.max_bins + coarse,
                             weights=model._hist.reshape(-1)[codes[f] * FINE_BINS + cell].astype(np.float64),
                             minlength=F * config.max_bins).reshape(F, config.max_bins)
        prob = counts / nf[:, None]
        scores = -np.log2(prob + config.alpha)
        nonempty = counts > 0
        smin = np.where(nonempty, scores, np.inf).min(axis=1) if F else np.zeros(0)
        smax = np.where(nonempty, scores, -np.inf).max(axis=1) if F else np.zeros(0)
        judged &= np.isfinite(smin) & (smax > smin)
        threshold = np.where(judged, smin + config.threshold * np.where(judged, smax - smin, 0.0), np.inf)
        table = scores
        bin_count = counts.astype(np.int64)
    return Scorer(config, model, judged, threshold, table, nbins, width, bin_count, pos, mean, std,
                  lo if config.algo == "hbos" else None)


def model_of(names: Iterable[str], codes: np.ndarray, values: np.ndarray) -> FunctionModel:
    """Shorthand for ``FunctionModel.of``."""
    return FunctionModel.of(list(names), codes, values)
