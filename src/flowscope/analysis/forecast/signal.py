"""Event-occurrence signals: how many of a run's N executing resources are in one state (idle, computing,
communicating, doing I/O...) at each sample of the run's span.

The resources are the slots of the resource-state timeline (analysis/timeline.py: one lane per
(resource, slot) that ran something), plus the declared slots of a resource that never ran anything at
once (those are idle all along). The signal is sampled at the rate of Pallipuram et al. (frequency
analysis of DAG workflows): twice the inverse of the shortest time between two successive changes of the
signal, i.e. a period of half that time. Two caps keep a pathological trace (two changes 1 ns apart) from
asking for billions of samples: the rate never exceeds :data:`MAX_RATE_HZ` and the run's span never holds
more than :data:`MAX_SAMPLES` samples; the signal says which cap, if any, set its period.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from flowscope.analysis.timeline import BUSY_CATEGORIES, memoised, resource_states
from flowscope.model.semantics import IDLE

if TYPE_CHECKING:
    from flowscope.store.run import Run

#: the event kinds a signal can count: a resource is idle, or busy in one category of the vocabulary
EVENTS = (IDLE, *BUSY_CATEGORIES)
#: the highest sampling rate used whatever the trace's shortest gap (1 sample per microsecond)
MAX_RATE_HZ = 1e6
#: the most samples one signal holds over the run's span
MAX_SAMPLES = 2_000_000


def check_event(event: str) -> str:
    """``event`` if it is one of :data:`EVENTS`; ValueError naming the known ones otherwise."""
    if event not in EVENTS:
        raise ValueError(f"event: unknown event kind {event!r}; known: {', '.join(EVENTS)}")
    return event


@dataclass
class EventSignal:
    """How many of ``resources`` resources were in state ``event`` at each sample instant
    ``t0_ns + floor(k * period_ns)``, k = 0 .. len(counts) - 1."""

    event: str
    counts: np.ndarray  # int64, one per sample
    t0_ns: int
    t1_ns: int  # end of the span sampled (exclusive)
    period_ns: float  # the period used
    nyquist_period_ns: float  # half the shortest gap between two changes: the paper's period, before the caps
    min_gap_ns: int  # the shortest time between two successive changes of the count
    resources: int
    capped_by: str | None  # None, "max_rate_hz" or "max_samples"

    @property
    def times_ns(self) -> np.ndarray:
        """The sample instants (int64 ns)."""
        return sample_times(self.t0_ns, self.period_ns, len(self.counts))

    @property
    def rate_hz(self) -> float:
        return 1e9 / self.period_ns if self.period_ns > 0 else float("inf")

    def as_dict(self) -> dict:
        """The signal's description (not its samples), JSON-ready."""
        return {"event": self.event, "samples": len(self.counts), "t0_ns": self.t0_ns, "t1_ns": self.t1_ns,
                "period_ns": self.period_ns, "rate_hz": self.rate_hz, "nyquist_period_ns": self.nyquist_period_ns,
                "min_gap_ns": self.min_gap_ns, "resources": self.resources, "capped_by": self.capped_by}


def sample_times(t0_ns: int, period_ns: float, n: int) -> np.ndarray:
    """``t0_ns + floor(k * period_ns)`` for k = 0 .. n - 1 (offsets computed as float64 from t0, exact
    below 2**53 ns)."""
    return np.int64(t0_ns) + np.floor(np.arange(n, dtype=np.float64) * period_ns).astype(np.int64)


def _change_times(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The sorted instants at which the number of intervals [start, end) that contain them changes."""
    t = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.argsort(t, kind="stable")
    t, delta = t[order], delta[order]
    if not len(t):
        return t
    first = np.flatnonzero(np.concatenate([[True], t[1:] != t[:-1]]))
    net = np.add.reduceat(delta, first)
    return t[first][net != 0]


def choose_period(t0_ns: int, t1_ns: int, change_ns: np.ndarray, max_rate_hz: float = MAX_RATE_HZ,
                  max_samples: int = MAX_SAMPLES) -> tuple[float, float, int, str | None]:
    """(period, Nyquist period, shortest gap, cap that set the period or None) for a signal over
    [t0, t1) whose value changes at ``change_ns``: the period is half the shortest gap between successive
    changes (the span's ends count as changes), raised to ``1e9 / max_rate_hz`` and to
    ``span / max_samples`` when shorter."""
    if max_rate_hz <= 0 or max_samples < 1:
        raise ValueError("max_rate_hz must be > 0 and max_samples >= 1")
    span = t1_ns - t0_ns
    if span <= 0:
        raise ValueError(f"the run's span is empty ({t0_ns} .. {t1_ns}): nothing to sample")
    points = np.unique(np.concatenate([[t0_ns, t1_ns], change_ns[(change_ns > t0_ns) & (change_ns < t1_ns)]]))
    gaps = np.diff(points)
    min_gap = int(gaps.min())
    nyquist = min_gap / 2.0
    period, capped = nyquist, None
    if 1e9 / max_rate_hz > period:
        period, capped = 1e9 / max_rate_hz, "max_rate_hz"
    if span / max_samples > period:
        period, capped = span / max_samples, "max_samples"
    return period, nyquist, min_gap, capped


def event_signal(states: pd.DataFrame, event: str, *, always_idle: int = 0, max_rate_hz: float = MAX_RATE_HZ,
                 max_samples: int = MAX_SAMPLES, period_ns: float | None = None) -> EventSignal:
    """The occurrence signal of ``event`` over a resource-state timeline (the rows of
    :func:`~flowscope.analysis.timeline.resource_states`: one lane per (resource_id, slot), rows that do not
    overlap within a lane). ``always_idle`` resources more, idle all along, are counted as resources (and
    as idle). ``period_ns`` forces the period (e.g. to compare runs at one rate); otherwise the paper's
    rate with the caps (:func:`choose_period`)."""
    check_event(event)
    if not len(states):
        raise ValueError("the run has no executing resource with activity: no event signal to sample")
    t0, t1 = int(states["start_ns"].min()), int(states["end_ns"].max())
    lanes = int(states[["resource_id", "slot"]].drop_duplicates().shape[0])
    m = (states["state"] == event).to_numpy()
    starts = np.sort(states["start_ns"].to_numpy(np.int64)[m])
    ends = np.sort(states["end_ns"].to_numpy(np.int64)[m])
    changes = _change_times(starts, ends)
    if period_ns is None:
        period, nyquist, min_gap, capped = choose_period(t0, t1, changes, max_rate_hz, max_samples)
    else:
        if not period_ns > 0:
            raise ValueError(f"period_ns must be > 0, got {period_ns}")
        _, nyquist, min_gap, _ = choose_period(t0, t1, changes, float("inf"), 2**62)
        period, capped = float(period_ns), None
    n = max(1, math.ceil((t1 - t0) / period))
    t = sample_times(t0, period, n)
    n = int(np.searchsorted(t, t1, side="left"))  # float rounding must not put a sample at t1
    t = t[:n]
    counts = np.searchsorted(starts, t, side="right") - np.searchsorted(ends, t, side="right")
    if event == IDLE and always_idle:
        counts = counts + always_idle
    return EventSignal(event=event, counts=counts.astype(np.int64), t0_ns=t0, t1_ns=t1, period_ns=period,
                       nyquist_period_ns=nyquist, min_gap_ns=min_gap, resources=lanes + int(always_idle),
                       capped_by=capped)


def _paint(base: pd.DataFrame, over: pd.DataFrame) -> pd.DataFrame:
    """The rows of one lane (``base``: they cover the run's span, none overlapping) with the busy rows of another
    (``over``) painted over them: the state of ``over`` where it has a row, ``base``'s elsewhere."""
    bs, be = base["start_ns"].to_numpy(np.int64), base["end_ns"].to_numpy(np.int64)
    os_, oe = over["start_ns"].to_numpy(np.int64), over["end_ns"].to_numpy(np.int64)
    cuts = np.unique(np.concatenate([bs, be, os_, oe]))
    inside = (cuts[:-1] >= bs[0]) & (cuts[1:] <= be[-1])
    lo, hi = cuts[:-1][inside], cuts[1:][inside]
    oi = np.searchsorted(os_, lo, side="right") - 1
    covered = (oi >= 0) & (oe[np.maximum(oi, 0)] > lo)
    bi = np.searchsorted(bs, lo, side="right") - 1
    rows = base.iloc[bi].reset_index(drop=True)
    top = over.iloc[oi[covered]].reset_index(drop=True)
    for c in ("state", "group", "role"):
        col = rows[c].to_numpy(object)
        col[covered] = top[c].to_numpy(object)
        rows[c] = col
    rows["start_ns"], rows["end_ns"] = lo, hi
    return rows


def fold_extra_lanes(states: pd.DataFrame, slots: dict[str, int]) -> pd.DataFrame:
    """``states`` with each resource held to its declared ``slots``: the timeline gives spans that overlap beyond a
    resource's slots (a thread's two tasks stamped by different clocks) lanes of their own, to keep their time; a
    resource still runs at most ``slots`` things at once, so those lanes' busy rows are painted over its last slot
    and the lanes dropped. Resources without declared slots are kept as they are."""
    lanes = states.groupby("resource_id")["slot"].max() + 1
    over = [r for r, n in lanes.items() if r in slots and n > slots[r] >= 1]
    if not over:
        return states
    mine = states["resource_id"].isin(over)
    parts = [states[~mine]]
    for r, g in states[mine].groupby("resource_id", sort=False):
        k = slots[r]
        parts.append(g[g["slot"] < k - 1])
        lane = g[g["slot"] == k - 1].sort_values("start_ns")
        for extra in range(k, int(g["slot"].max()) + 1):
            busy = g[(g["slot"] == extra) & (g["state"] != IDLE)].sort_values("start_ns")
            if len(busy):
                lane = _paint(lane, busy)
        parts.append(lane)
    return pd.concat(parts, ignore_index=True)


def declared_slots(run: Run) -> dict[str, int]:
    """The slots each executing resource of ``run`` declares (resources with none declared are left out)."""
    d = run.sql("SELECT resource_id, slots FROM executors WHERE executes AND slots IS NOT NULL")
    return {str(r): int(n) for r, n in zip(d["resource_id"], d["slots"])}


def unused_slots(run: Run, states: pd.DataFrame) -> int:
    """Declared slots of the run's executing resources beyond the lanes the timeline has for them (slots
    that never ran anything: idle all along)."""
    if not len(states):
        return 0
    declared = memoised(run, "declared_active_slots", lambda: run.sql(
        """SELECT DISTINCT a.resource_id, e.slots FROM activity a JOIN executors e
           ON e.resource_id = a.resource_id WHERE e.executes AND e.slots IS NOT NULL AND a.end_ns > a.start_ns"""))
    if not len(declared):
        return 0
    used = states.groupby("resource_id")["slot"].nunique()
    return int(sum(max(int(s) - int(used.get(r, 0)), 0) for r, s in zip(declared["resource_id"], declared["slots"])))


def run_signal(run: Run, event: str, *, max_rate_hz: float = MAX_RATE_HZ, max_samples: int = MAX_SAMPLES,
               period_ns: float | None = None, states: pd.DataFrame | None = None) -> EventSignal:
    """The occurrence signal of ``event`` over ``run``'s executing resources (see :func:`event_signal`), each
    counted at most as many times as it has slots (:func:`fold_extra_lanes`)."""
    check_event(event)
    if states is None:
        st = _held_states(run)
    else:
        st = fold_extra_lanes(states, declared_slots(run)) if len(states) else states
    return event_signal(st, event, always_idle=unused_slots(run, st), max_rate_hz=max_rate_hz,
                        max_samples=max_samples, period_ns=period_ns)


def _held_states(run: Run) -> pd.DataFrame:
    """The run's :func:`resource_states` held to each resource's declared slots (:func:`fold_extra_lanes`), once per
    state of the run (``Run.memo``): the signals of every state are drawn from it. Shared: not to be changed."""
    def held() -> pd.DataFrame:
        st = resource_states(run)
        return fold_extra_lanes(st, declared_slots(run)) if len(st) else st

    return memoised(run, "held_resource_states", held)


def run_tasks(run: Run) -> int:
    """The number of task executions of ``run`` (spans whose role is ``task``): the DAG's size."""
    return memoised(run, "task_count",
                    lambda: int(run.sql("SELECT count(*) AS n FROM activity WHERE role = 'task'")["n"].iloc[0]))
