"""The prediction phase: frame by frame over a run (finished or live), the likelihood that at least a
fraction of the resources are in a state during the next frame, read from the current frame's ECDF, then
what happened in that frame and whether the two frames' distributions agreed (the KS hit of the paper).

A frame is a window of the run's event signal (analysis/forecast/signal.py) of the model's window size;
frames are cut from the run's first sample, and only complete frames are judged. The query "at least f of
the N resources" counts k = ceil(f * N) resources. Frame i's ``likelihood`` is the share of frame i - 1's
samples with at least k resources in the state (1 - ECDF(k - 1)); its ``observed`` is the same share in
frame i itself; ``hit`` is the two-sample KS test at ``alpha`` between the two frames' samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from flowscope.analysis.forecast.calibration import calibration
from flowscope.analysis.forecast.model import WindowModel, default_window
from flowscope.analysis.forecast.signal import EventSignal, check_event, run_signal, run_tasks
from flowscope.analysis.forecast.windows import ALPHA, ks_hits

if TYPE_CHECKING:
    from flowscope.store.run import Run

FRAME_COLUMNS = ["frame", "start_ns", "end_ns", "likelihood", "observed", "ks_statistic", "hit"]


def check_fraction(fraction: float) -> float:
    """``fraction`` as a float if it lies in [0, 1]; ValueError naming the parameter otherwise."""
    try:
        f = float(fraction)
    except (TypeError, ValueError):
        raise ValueError(f"fraction: expected a number within [0, 1], got {fraction!r}") from None
    if not 0.0 <= f <= 1.0:  # NaN fails too
        raise ValueError(f"fraction: must be within [0, 1], got {fraction!r}")
    return f


@dataclass
class Prediction:
    """The prediction phase over one run (see the module's docstring)."""

    run_id: str
    event: str
    fraction: float
    threshold: int  # k: at least this many resources
    resources: int
    tasks: int
    window: int
    window_source: str  # "model", "default" or "given"
    note: str  # why this window (the model's answer, or why none fitted)
    signal: EventSignal
    frames: pd.DataFrame  # FRAME_COLUMNS, one row per complete frame
    next: dict | None = field(default=None)  # the frame after the last complete one: start_ns, end_ns, likelihood

    @property
    def hit_rate(self) -> float | None:
        """Hits / judged frames (frames after the first), None before two complete frames."""
        judged = self.frames["hit"].iloc[1:]
        return float(judged.mean()) if len(judged) else None

    @property
    def mean_abs_error(self) -> float | None:
        """Mean |likelihood - observed| over the judged frames."""
        f = self.frames.iloc[1:]
        return float((f["likelihood"] - f["observed"]).abs().mean()) if len(f) else None

    @property
    def calibration(self) -> dict:
        """The Brier score of the likelihoods against each sample of the frame they forecast, beside the
        climatological forecast's (the run-so-far frequency), and the skill score
        (:func:`~flowscope.analysis.forecast.calibration.calibration`)."""
        return calibration(self.signal.counts, self.threshold, self.window,
                           self.frames["likelihood"].to_numpy(np.float64), self.frames["observed"].to_numpy(np.float64))

    def as_dict(self) -> dict:
        """JSON-ready: everything but the signal's samples."""
        frames = [{"frame": int(r.frame), "start_ns": int(r.start_ns), "end_ns": int(r.end_ns),
                   "likelihood": None if pd.isna(r.likelihood) else float(r.likelihood),
                   "observed": float(r.observed),
                   "ks_statistic": None if pd.isna(r.ks_statistic) else float(r.ks_statistic),
                   "hit": None if pd.isna(r.hit) else bool(r.hit)} for r in self.frames.itertuples(index=False)]
        judged = [f for f in frames if f["hit"] is not None]
        return {"run_id": self.run_id, "event": self.event, "fraction": self.fraction, "threshold": self.threshold,
                "resources": self.resources, "tasks": self.tasks, "window": self.window,
                "window_source": self.window_source, "note": self.note, "signal": self.signal.as_dict(),
                "frame_ns": self.window * self.signal.period_ns, "frames": frames, "judged": len(judged),
                "hits": sum(f["hit"] for f in judged), "hit_rate": self.hit_rate,
                "mean_abs_error": self.mean_abs_error, "calibration": self.calibration, "next": self.next}


def choose_window(model: WindowModel | None, resources: int, tasks: int, n_samples: int,
                  window: int | None = None) -> tuple[int, str, str]:
    """(window, source, note): ``window`` when given, else the model's window for the run's size, else
    the documented default (:func:`~flowscope.analysis.forecast.model.default_window`) with the reason."""
    if window is not None:
        if int(window) < 1:
            raise ValueError(f"window: must be >= 1 sample, got {window}")
        return int(window), "given", f"window given: {int(window)} samples"
    if model is None:
        w = default_window(n_samples)
        return w, "default", f"no window-size model given: default window of {w} samples"
    w, why = model.window_for(resources, tasks)
    if w is None:
        d = default_window(n_samples)
        return d, "default", f"no model fits this run: {why}; default window of {d} samples"
    return w, "model", why


def predict_signal(sig: EventSignal, fraction: float, window: int, alpha: float = ALPHA) -> tuple[int, pd.DataFrame, dict | None]:
    """(threshold k, frames, next) for a signal and window size (see the module's docstring)."""
    f = check_fraction(fraction)
    k = math.ceil(f * sig.resources - 1e-9)
    m = len(sig.counts) // window
    per = (sig.counts[: m * window].reshape(m, window) >= k).mean(axis=1) if m else np.zeros(0)
    hits, stat = ks_hits(sig.counts, window, alpha) if m >= 2 else (np.zeros(0, bool), np.zeros(0))
    starts = sig.t0_ns + np.floor(np.arange(m + 1, dtype=np.float64) * window * sig.period_ns).astype(np.int64)
    frames = pd.DataFrame({
        "frame": np.arange(m, dtype=np.int64), "start_ns": starts[:m], "end_ns": starts[1:m + 1],
        "likelihood": np.concatenate([[np.nan], per[:-1]]) if m else np.zeros(0),
        "observed": per,
        "ks_statistic": np.concatenate([[np.nan], stat]) if m else np.zeros(0),
        "hit": pd.array(np.concatenate([[None], hits]) if m else [], dtype="boolean")}, columns=FRAME_COLUMNS)
    nxt = None
    if m:
        t1 = sig.t0_ns + math.floor((m + 1) * window * sig.period_ns)
        nxt = {"frame": m, "start_ns": int(starts[m]), "end_ns": t1, "likelihood": float(per[-1])}
    return k, frames, nxt


def predict(run: Run, event: str = "idle", fraction: float = 0.25, model: WindowModel | None = None, *,
            window: int | None = None, alpha: float = ALPHA) -> Prediction:
    """The prediction phase over ``run`` (finished, or live: what it holds so far): frame by frame, the
    likelihood that at least ``fraction`` of its resources are in state ``event`` in the next frame, what
    happened, and the KS hit rate. The frame size is ``window`` if given, else ``model``'s window for the
    run's size, else the documented default (the result's ``note`` says which and why)."""
    check_event(event)
    f = check_fraction(fraction)
    if model is not None and model.event != event:
        raise ValueError(f"model: built for event {model.event!r}, asked for {event!r}")
    sig = run_signal(run, event)
    tasks = run_tasks(run)
    w, source, note = choose_window(model, sig.resources, tasks, len(sig.counts), window)
    k, frames, nxt = predict_signal(sig, f, w, alpha)
    return Prediction(run_id=run.run_id, event=event, fraction=f, threshold=k, resources=sig.resources,
                      tasks=tasks, window=w, window_source=source, note=note, signal=sig, frames=frames, next=nxt)
