"""Tasks by phase over time, against the slots that run them: the resource-utilisation view of the SOMA
dissertation (cores scheduling, running and idle over time), for any run whose workflow system reports task
states (``transitions``: Dask's scheduler, Parsl's DataFlowKernel).

A task is in the phase of its latest state (``model.semantics.phase_sql``: waiting, queued, running, done,
erred) from that transition until its next one; its last state lasts until the end of the transitions' extent
unless it is done or erred. Only the scheduler's transitions count when the run has any (a Dask worker reports
the same task's states again from its side).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flowscope.analysis.timeline import BUSY_CATEGORIES, _integral, _slot_table, resource_states
from flowscope.model.semantics import phase_sql
from flowscope.store.run import Run

#: the phases drawn over time (done and erred are where a task ends, not where it spends time)
PHASES_OVER_TIME = ("waiting", "queued", "running")
COLUMNS = ["start_ns", "end_ns", *PHASES_OVER_TIME, "busy", "slots"]


def phases_over_time(run: Run, bins: int = 200) -> pd.DataFrame:
    """The extent of the run's task transitions cut in ``bins`` equal intervals; per interval ``start_ns``,
    ``end_ns``, the mean number of tasks ``waiting``, ``queued`` and ``running``, the mean number of slots
    ``busy`` on the executing resources (the resource-state timeline), and ``slots``, all of them (None when a
    resource's slots are unknown). Empty when the run has no transitions."""
    t = run.sql(f"""SELECT task_key, ts_ns, {phase_sql(run.mappings(), "t")} AS phase FROM transitions t
                    WHERE observer = 'scheduler' OR NOT EXISTS (SELECT 1 FROM transitions WHERE observer = 'scheduler')
                    ORDER BY task_key, ts_ns""")
    if not len(t) or bins < 1:
        return pd.DataFrame(columns=COLUMNS)
    ts = t["ts_ns"].to_numpy(np.int64)
    t0, t1 = int(ts.min()), int(ts.max())
    phase = t["phase"].to_numpy(object)
    key = t["task_key"].to_numpy(object)
    last = np.ones(len(t), dtype=bool)
    last[:-1] = key[:-1] != key[1:]
    end = np.empty_like(ts)
    end[:-1] = ts[1:]
    end[last] = t1  # a task's latest state lasts to the end, unless it is where the task ended (below)
    edges = np.linspace(0, t1 - t0, bins + 1)  # relative to t0: ns since the epoch lose precision as floats
    width = np.where(np.diff(edges) > 0, np.diff(edges), 1)
    out = pd.DataFrame({"start_ns": t0 + edges[:-1].astype(np.int64), "end_ns": t0 + edges[1:].astype(np.int64)})
    for p in PHASES_OVER_TIME:
        m = phase == p
        f = _integral((ts[m] - t0).astype(np.float64), (end[m] - t0).astype(np.float64), edges)
        out[p] = np.diff(f) / width
    st = resource_states(run)
    busy = np.zeros(bins)
    if len(st):
        b = st[st["state"].isin(BUSY_CATEGORIES)]
        f = _integral((b["start_ns"] - t0).to_numpy(np.float64), (b["end_ns"] - t0).to_numpy(np.float64), edges)
        busy = np.diff(f) / width
    out["busy"] = busy
    slots = _slot_table(run)["slots"] if len(st) else pd.Series(dtype="Int64")
    out["slots"] = None if not len(slots) or slots.isna().any() else int(slots.sum())
    return out[COLUMNS]
