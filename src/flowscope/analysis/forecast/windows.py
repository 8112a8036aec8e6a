"""Windowed ECDFs of an event-occurrence signal and the two-sample Kolmogorov-Smirnov test between
successive non-overlapping windows, for many window sizes over a whole signal.

A window of size w is w consecutive samples; the signal is cut into windows 0, 1, ... from its first
sample (a last, incomplete window is left out) and each window i >= 1 is compared with window i - 1. The
pair is a *hit* when the two-sample KS test does not reject, at level ``alpha`` (5 %), that both windows
come from one distribution: the p-value is ``>= alpha``.

The signal takes few distinct values (counts of resources), so each window's ECDF is a cumulative
histogram over those values and the KS statistic of a pair is ``d / w`` with ``d`` the largest difference
of two cumulative counts, an integer. The test's p-value depends only on (d, w, w), so for each window size
the decision is one comparison, ``d < critical_d(w)``, with ``critical_d`` taken from
``scipy.stats.ks_2samp`` itself (its default method: exact up to 10,000 samples per side, asymptotic
beyond): every pair gets scipy's decision without one scipy call per pair. At 5 % and up to 50,000-sample
windows those critical values are read from a table scipy computed (``ks_critical.json``, written by
scripts/ks_critical_table.py and checked against the installed scipy by tests/test_forecast_bench.py), so the
curve needs no scipy call at all there.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

ALPHA = 0.05
#: :func:`critical_d` at ALPHA for window sizes up to a largest, as scipy computed them (scripts/ks_critical_table.py)
TABLE_FILE = Path(__file__).with_name("ks_critical.json")
_CELLS = 1 << 22  # windows x distinct values held at once (bounds memory for small windows)


def _pvalue(d: int, w: int) -> float:
    """scipy's two-sided ks_2samp p-value for two samples of w values at statistic d / w."""
    from scipy.stats import ks_2samp

    a = np.zeros(w)
    b = np.concatenate([np.zeros(w - d), np.ones(d)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(ks_2samp(a, b).pvalue)


def _installed_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def critical_table() -> np.ndarray | None:
    """:func:`critical_d` at :data:`ALPHA` for every window size 0 .. the table's largest (index = window size),
    as computed by :func:`scipy_critical_d` and shipped in :data:`TABLE_FILE`; None when the installed scipy is
    not the version the table was computed with, or the table is missing (critical_d then asks scipy, as for
    sizes beyond the table)."""
    try:
        doc = json.loads(TABLE_FILE.read_text())
    except FileNotFoundError:  # a source tree whose table was never written
        return None
    if doc["alpha"] != ALPHA or doc["scipy"] != _installed_version("scipy"):
        return None
    starts, values = np.asarray(doc["starts"], np.int64), np.asarray(doc["values"], np.int64)
    return np.repeat(values, np.diff(np.append(starts, doc["largest"] + 1)))


def write_critical_table(largest: int, path: Path | None = None,
                         progress: Callable[[int, int], None] | None = None) -> Path:
    """Compute :func:`scipy_critical_d` at :data:`ALPHA` for window sizes 0 .. ``largest`` and write them to
    ``path`` (default :data:`TABLE_FILE`), run-length encoded, with the scipy version that computed them."""
    from scipy import __version__ as scipy_version

    values = [0]  # window size 0: never used (critical_d refuses it)
    for w in range(1, largest + 1):
        values.append(scipy_critical_d(w, ALPHA, guess=values[-1] if w > 1 else None))
        if progress is not None and (w % 1000 == 0 or w == largest):
            progress(w, largest)
    v = np.asarray(values, np.int64)
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]])
    path = Path(path or TABLE_FILE)
    path.write_text(json.dumps({"what": "critical_d(w) of flowscope.analysis.forecast.windows: the smallest KS "
                                        "statistic times w that scipy.stats.ks_2samp rejects at alpha for two "
                                        "samples of w values; run-length encoded (value i holds from window size "
                                        "starts[i] up to the next start)",
                                "alpha": ALPHA, "scipy": scipy_version, "largest": largest,
                                "starts": starts.tolist(), "values": v[starts].tolist()}, separators=(",", ":")))
    return path


@lru_cache(maxsize=4096)
def critical_d(w: int, alpha: float = ALPHA) -> int:
    """The smallest d such that scipy's ks_2samp rejects (p < ``alpha``) two samples of ``w`` values whose
    ECDFs differ by at most d / w; ``w + 1`` when no d in 0..w is rejected.

    At :data:`ALPHA` and up to the largest window of :func:`critical_table`, read from that table (scipy's
    answers, shipped with flowscope: no scipy call, no scipy import); otherwise :func:`scipy_critical_d`."""
    if w < 1:
        raise ValueError(f"window size must be >= 1, got {w}")
    if alpha == ALPHA:
        table = critical_table()
        if table is not None and w < len(table):
            return int(table[w])
    return scipy_critical_d(w, alpha)


def scipy_critical_d(w: int, alpha: float = ALPHA, guess: int | None = None) -> int:
    """:func:`critical_d` asked of scipy's ks_2samp. The p-value falls as d grows, so the answer is bracketed
    by a galloping search that starts from ``guess`` (default: the asymptotic critical value, Kolmogorov's
    c(alpha) * sqrt(2 / w) * w), usually one or two scipy calls away, and then bisected: a few exact
    evaluations instead of a bisection over 0..w."""
    if w < 1:
        raise ValueError(f"window size must be >= 1, got {w}")
    memo: dict[int, bool] = {}

    def rejects(d: int) -> bool:
        if d > w:
            return True  # the sentinel "never": above every possible d
        if d not in memo:
            memo[d] = _pvalue(d, w) < alpha
        return memo[d]

    if rejects(0):
        return 0
    if guess is None:
        guess = math.ceil(math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt(2 * w))
    guess = min(max(1, guess), w + 1)
    step = 1
    if rejects(guess):  # the answer is at most guess: gallop down to a d that is not rejected
        hi, lo = guess, guess - 1
        while lo > 0 and rejects(lo):
            hi, lo, step = lo, max(0, lo - 2 * step), 2 * step
    else:  # the answer is above guess: gallop up to a rejected d (or past w)
        lo, hi = guess, guess + 1
        while not rejects(hi):
            lo, hi, step = hi, min(w + 1, hi + 2 * step), 2 * step
    while hi - lo > 1:  # rejects(hi) and not rejects(lo)
        mid = (lo + hi) // 2
        if rejects(mid):
            hi = mid
        else:
            lo = mid
    return hi


def value_codes(counts: np.ndarray) -> tuple[np.ndarray, int]:
    """(code of each sample: the rank of its value among the signal's distinct values, number of distinct
    values)."""
    a = np.asarray(counts).ravel()
    if a.size and a.dtype.kind in "iu":
        lo, hi = int(a.min()), int(a.max())
        span = hi - lo + 1
        # a signal's values are counts of resources: few, close together. Counting them is linear where sorting
        # 10^6 samples took 0.13 s a signal (three signals a report)
        if span <= max(1 << 16, 4 * a.size):
            # the offsets from the smallest value fit in int64 (span is small), the type's own arithmetic may not
            if a.dtype == np.uint64:
                shifted = a - np.uint64(lo)
            else:
                shifted = (a if a.dtype == np.int64 else a.astype(np.int64)) - lo
            shifted = shifted.astype(np.intp, copy=False)
            present = np.bincount(shifted, minlength=span) > 0
            rank = np.cumsum(present, dtype=np.int64) - 1
            return rank[shifted], int(np.count_nonzero(present))
    values, codes = np.unique(a, return_inverse=True)
    return codes.astype(np.int64).ravel(), len(values)


def window_cdfs(codes: np.ndarray, n_values: int, w: int, first: int = 0, last: int | None = None) -> np.ndarray:
    """Cumulative counts (windows x values) of windows ``first`` .. ``last`` - 1 of size ``w``: row i,
    column v = how many samples of the window have a code <= v."""
    m = len(codes) // w if last is None else last
    k = m - first
    if k <= 0:
        return np.zeros((0, n_values), np.int64)
    block = codes[first * w: m * w].reshape(k, w) + (np.arange(k, dtype=np.int64) * n_values)[:, None]
    hist = np.bincount(block.ravel(), minlength=k * n_values).reshape(k, n_values)
    return np.cumsum(hist, axis=1)


def pair_statistics(codes: np.ndarray, n_values: int, w: int) -> np.ndarray:
    """For each pair of successive windows (i - 1, i) of size ``w``, i = 1 .. m - 1: the KS statistic times
    w (an int64 ``d``)."""
    m = len(codes) // w
    if m < 2:
        return np.zeros(0, np.int64)
    out = np.empty(m - 1, np.int64)
    step = max(2, _CELLS // max(n_values, 1))
    for a in range(0, m - 1, step):  # windows a .. b compared pairwise: pairs a+1 .. b
        b = min(a + step, m - 1)
        cdf = window_cdfs(codes, n_values, w, a, b + 1)
        out[a:b] = np.abs(np.diff(cdf, axis=0)).max(axis=1)
    return out


def ks_hits(counts: np.ndarray, w: int, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """(hit per pair of successive windows of size ``w``, KS statistic per pair)."""
    codes, nv = value_codes(counts)
    d = pair_statistics(codes, nv, w)
    return d < critical_d(w, alpha), d / w


def hit_rates(counts: np.ndarray, windows: Sequence[int], alpha: float = ALPHA,
              progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Per window size: ``window``, ``pairs`` (successive window pairs), ``hits`` and ``hit_rate`` (hits /
    pairs, NaN without a pair) over the whole signal."""
    codes, nv = value_codes(counts)
    rows = []
    for i, w in enumerate(windows):
        w = int(w)
        d = pair_statistics(codes, nv, w)
        hits = int((d < critical_d(w, alpha)).sum()) if len(d) else 0
        rows.append((w, len(d), hits, hits / len(d) if len(d) else np.nan))
        if progress is not None:
            progress(i + 1, len(windows))
    return pd.DataFrame(rows, columns=["window", "pairs", "hits", "hit_rate"])


def candidate_windows(n_samples: int, count: int = 50, smallest: int = 10, largest: int | None = None,
                      min_pairs: int = 3) -> list[int]:
    """``count`` window sizes in geometric progression from ``smallest`` to ``largest`` (default: the largest
    size that still leaves ``min_pairs`` pairs of windows in ``n_samples`` samples), distinct integers."""
    top = n_samples // (min_pairs + 1) if largest is None else largest
    if top < smallest:
        return []
    return sorted({int(round(x)) for x in np.geomspace(smallest, top, count)})
