"""How well the prediction phase's likelihoods are calibrated: the Brier score of the frame-by-frame
forecasts against what each sample of the next frame showed, beside that of the climatological forecast
(the run-so-far frequency), and the reliability table (forecast bins against observed frequencies).

The event forecast for each sample of frame i (i >= 1) is "at least k resources are in the state": the
prediction phase says it happens with probability ``likelihood`` (its frequency in frame i - 1); the
climatological forecast says the frequency over all samples before frame i. Each sample's outcome is 0 or 1,
so a frame whose observed frequency is f contributes ``(p - f)**2 + f * (1 - f)`` per sample to the Brier
score (the mean squared error over samples); frames weigh equally (they have equally many samples).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: forecast bins of the reliability table
BINS = 10


def climatology(counts: np.ndarray, threshold: int, window: int) -> np.ndarray:
    """Per complete frame of ``window`` samples: the frequency of ``counts >= threshold`` over every sample
    before the frame (NaN for frame 0)."""
    m = len(counts) // window
    if not m:
        return np.zeros(0)
    per = (np.asarray(counts)[: m * window].reshape(m, window) >= threshold).mean(axis=1)
    so_far = np.cumsum(per) / np.arange(1, m + 1)
    return np.concatenate([[np.nan], so_far[:-1]])


def brier(forecast: np.ndarray, observed: np.ndarray) -> float | None:
    """Mean Brier score over samples of frames with forecast p and observed frequency f (NaN forecasts left
    out); None without a frame."""
    p, f = np.asarray(forecast, np.float64), np.asarray(observed, np.float64)
    ok = ~np.isnan(p) & ~np.isnan(f)
    if not ok.any():
        return None
    p, f = p[ok], f[ok]
    return float(np.mean((p - f) ** 2 + f * (1 - f)))


def reliability(forecast: np.ndarray, observed: np.ndarray, bins: int = BINS) -> pd.DataFrame:
    """Per forecast bin [i / bins, (i + 1) / bins) (the last one closed): ``frames``, ``mean_forecast`` and
    ``observed_frequency`` (the mean observed frequency of its frames: a calibrated forecast has both equal)."""
    p, f = np.asarray(forecast, np.float64), np.asarray(observed, np.float64)
    ok = ~np.isnan(p) & ~np.isnan(f)
    p, f = p[ok], f[ok]
    b = np.minimum((p * bins).astype(np.int64), bins - 1)
    n = np.bincount(b, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mp = np.bincount(b, p, minlength=bins) / n
        mf = np.bincount(b, f, minlength=bins) / n
    return pd.DataFrame({"bin_low": np.arange(bins) / bins, "bin_high": np.arange(1, bins + 1) / bins,
                         "frames": n, "mean_forecast": mp, "observed_frequency": mf})


def calibration(counts: np.ndarray, threshold: int, window: int, likelihood: np.ndarray,
                observed: np.ndarray) -> dict:
    """The Brier scores of the prediction (``likelihood`` per frame) and of the climatological forecast, the
    Brier skill score (1 - ours / climatology's: above 0 when ours is better) and the number of frames
    judged (those with both forecasts)."""
    clim = climatology(counts, threshold, window)
    ok = ~np.isnan(np.asarray(likelihood, np.float64)) & ~np.isnan(clim)
    ours, theirs = brier(np.asarray(likelihood)[ok], np.asarray(observed)[ok]), brier(clim[ok], np.asarray(observed)[ok])
    skill = None if ours is None or not theirs else 1 - ours / theirs
    return {"frames": int(ok.sum()), "brier": ours, "brier_climatology": theirs, "brier_skill": skill}
