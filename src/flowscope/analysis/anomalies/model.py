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


class FunctionModel:
    """Per-function statistics and grid histograms, keyed by function name; merges exactly."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.count = np.zeros(0, np.int64)
        self.mean = np.zeros(0)
        self.m2 = np.zeros(0)
        self.min = np.zeros(0)
        self.max = np.zeros(0)
        self.hist = np.zeros((0, FINE_BINS), np.int64)

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"FunctionModel({len(self.names)} functions, {int(self.count.sum())} calls)"

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        return self.count, self.mean, self.m2, self.min, self.max, self.hist

    @property
    def std(self) -> np.ndarray:
        """Sample standard deviation (0 below two calls)."""
        return np.sqrt(np.where(self.count > 1, self.m2 / np.maximum(self.count - 1, 1), 0.0))

    def codes(self, names: Sequence[str]) -> np.ndarray:
        """This model's index of each name, adding the names it does not have yet."""
        new = [n for n in dict.fromkeys(names) if n not in self.index]
        if new:
            self._grow(new)
        return np.fromiter((self.index[n] for n in names), dtype=np.int64, count=len(names))

    def _grow(self, new: list[str]) -> None:
        k = len(new)
        for n in new:
            self.index[n] = len(self.names)
            self.names.append(n)
        self.count = np.concatenate([self.count, np.zeros(k, np.int64)])
        self.mean = np.concatenate([self.mean, np.zeros(k)])
        self.m2 = np.concatenate([self.m2, np.zeros(k)])
        self.min = np.concatenate([self.min, np.full(k, np.inf)])
        self.max = np.concatenate([self.max, np.full(k, -np.inf)])
        self.hist = np.concatenate([self.hist, np.zeros((k, FINE_BINS), np.int64)])

    def update(self, codes: np.ndarray, values: np.ndarray) -> None:
        """Add one batch of calls (``codes`` from ``self.codes``) to the model."""
        if len(codes) == 0:
            return
        b = batch_stats(codes, values, len(self.names))
        self.count, self.mean, self.m2, self.min, self.max, self.hist = merge_arrays(self.arrays, b)

    def merge(self, other: FunctionModel) -> FunctionModel:
        """A new model of the union of the data of ``self`` and ``other``."""
        out = self.copy()
        out.merge_in(other)
        return out

    def merge_in(self, other: FunctionModel) -> None:
        """Merge ``other`` into this model in place."""
        if not len(other):
            return
        idx = self.codes(other.names)
        aligned = []
        for mine, theirs, fill in zip(self.arrays, other.arrays, (0, 0.0, 0.0, np.inf, -np.inf, 0)):
            a = np.full_like(mine, fill)
            a[idx] = theirs
            aligned.append(a)
        self.count, self.mean, self.m2, self.min, self.max, self.hist = merge_arrays(self.arrays, tuple(aligned))

    def copy(self) -> FunctionModel:
        out = FunctionModel()
        out.names = list(self.names)
        out.index = dict(self.index)
        out.count, out.mean, out.m2 = self.count.copy(), self.mean.copy(), self.m2.copy()
        out.min, out.max, out.hist = self.min.copy(), self.max.copy(), self.hist.copy()
        return out

    @classmethod
    def of(cls, names: Sequence[str], codes: np.ndarray, values: np.ndarray) -> FunctionModel:
        """The model of calls given as codes into ``names`` and their values."""
        m = cls()
        m.codes(list(names))
        m.update(np.asarray(codes, np.int64), values)
        return m

    # ---- exchange (parameter server) ---------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-ready form; histograms as sparse (bin, count) pairs."""
        funcs = []
        for i, name in enumerate(self.names):
            nz = np.flatnonzero(self.hist[i])
            funcs.append({"name": name, "count": int(self.count[i]), "mean": float(self.mean[i]),
                          "m2": float(self.m2[i]),
                          "min": float(self.min[i]) if np.isfinite(self.min[i]) else None,
                          "max": float(self.max[i]) if np.isfinite(self.max[i]) else None,
                          "bins": nz.tolist(), "counts": self.hist[i, nz].tolist()})
        return {"grid": {"per_octave": FINE_PER_OCTAVE, "octaves": FINE_OCTAVES}, "functions": funcs}

    @classmethod
    def from_dict(cls, d: dict) -> FunctionModel:
        """Inverse of ``to_dict``; ValueError naming the field when the document does not fit."""
        grid = d.get("grid") or {}
        if grid.get("per_octave") != FINE_PER_OCTAVE or grid.get("octaves") != FINE_OCTAVES:
            raise ValueError(f"model grid {grid!r} differs from this flowscope's "
                             f"(per_octave={FINE_PER_OCTAVE}, octaves={FINE_OCTAVES})")
        m = cls()
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
    table: np.ndarray | None  # hbos: per function x grid bin, the score of a call in that bin
    nbins: np.ndarray         # hbos: bins of the function's histogram
    width: np.ndarray         # hbos: their width (ns)
    bin_count: np.ndarray | None  # hbos: per function x grid bin, calls in the call's histogram bin

    def score(self, codes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(score, flagged) of each call; ``codes`` index this scorer's model."""
        codes = np.asarray(codes, np.int64)
        v = np.asarray(values, np.float64)
        m = self.model
        if self.config.algo == "sstd":
            std = m.std[codes]
            with np.errstate(divide="ignore", invalid="ignore"):
                s = np.abs(v - m.mean[codes]) / std
            s = np.where(std > 0, s, 0.0)
        else:
            s = self.table[codes, fine_bin(v)]
        flagged = self.judged[codes] & (s >= self.threshold[codes])
        if self.config.algo == "sstd":
            flagged &= s > self.threshold[codes]  # strictly outside mean +- sigma * std
        return s, flagged

    def explain(self, code: int, value: float) -> dict:
        """The model parameters a call of function ``code`` with ``value`` was judged against."""
        m, c = self.model, self.config
        out = {"algo": c.algo, "metric": c.metric, "count": int(m.count[code]), "mean": float(m.mean[code]),
               "std": float(m.std[code]), "min": float(m.min[code]), "max": float(m.max[code]),
               "threshold": float(self.threshold[code])}
        if c.algo == "sstd":
            out.update(sigma=c.sigma, lower=float(m.mean[code] - c.sigma * m.std[code]),
                       upper=float(m.mean[code] + c.sigma * m.std[code]))
        else:
            fb = int(fine_bin(np.array([value]))[0])
            out.update(threshold_fraction=c.threshold, alpha=c.alpha, bins=int(self.nbins[code]),
                       bin_width=float(self.width[code]), bin_count=int(self.bin_count[code, fb]))
        return out


def scorer(model: FunctionModel, config: AnomalyConfig) -> Scorer:
    """Precompute, per function, what scoring a call against ``model`` needs (vectorised over functions)."""
    n = model.count
    F = len(model)
    judged = n >= max(config.min_count, 2)
    nbins = np.ones(F, np.int64)
    width = np.zeros(F)
    table = bin_count = None
    if config.algo == "sstd":
        threshold = np.full(F, float(config.sigma))
        judged &= model.std > 0
    else:  # hbos
        nf = np.maximum(n, 1).astype(np.float64)
        span = np.where(judged, model.max - model.min, 0.0)
        scott = 3.49 * model.std * nf ** (-1.0 / 3.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            want = np.where(scott > 0, np.ceil(span / scott), 1.0)
        nbins = np.clip(np.nan_to_num(want, nan=1.0, posinf=config.max_bins), 1, config.max_bins).astype(np.int64)
        width = np.where(span > 0, span / nbins, 1.0)
        lo = np.where(judged, model.min, 0.0)
        coarse = np.floor((_FINE_REP[None, :] - lo[:, None]) / width[:, None])
        coarse = np.clip(coarse, 0, (nbins - 1)[:, None]).astype(np.int64)
        flat = (np.arange(F, dtype=np.int64)[:, None] * config.max_bins + coarse)
        counts = np.bincount(flat.ravel(), weights=model.hist.ravel().astype(np.float64),
                             minlength=F * config.max_bins).reshape(F, config.max_bins)
        prob = counts / nf[:, None]
        scores = -np.log2(prob + config.alpha)
        nonempty = counts > 0
        smin = np.where(nonempty, scores, np.inf).min(axis=1) if F else np.zeros(0)
        smax = np.where(nonempty, scores, -np.inf).max(axis=1) if F else np.zeros(0)
        judged &= np.isfinite(smin) & (smax > smin)
        threshold = np.where(judged, smin + config.threshold * np.where(judged, smax - smin, 0.0), np.inf)
        table = np.take_along_axis(scores, coarse, axis=1)
        bin_count = np.take_along_axis(counts, coarse, axis=1).astype(np.int64)
    return Scorer(config, model, judged, threshold, table, nbins, width, bin_count)


def model_of(names: Iterable[str], codes: np.ndarray, values: np.ndarray) -> FunctionModel:
    """Shorthand for ``FunctionModel.of``."""
    return FunctionModel.of(list(names), codes, values)
