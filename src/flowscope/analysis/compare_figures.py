"""The tables behind the figures that compare runs (the provenance paper's Figs. 4-7, and the critical paths
side by side), for any source: plain functions over a :class:`~flowscope.store.run_set.RunSet`, in the model's
vocabulary. Times are seconds since each run's start (run.json's ``start_ns``).

* :func:`transfer_costs` / :func:`transfer_fit`: every transfer's size and duration, between resources of the
  same host or of different hosts, and a least-squares line (latency, seconds per byte) per run and locality
  (Fig. 5);
* :func:`io_timeline`: every I/O record on the resource that made it (Fig. 4);
* :func:`reassignments`: tasks moved between workers while assigned (work stealing);
* :func:`task_coordinates`: one row per task -- elapsed time, group, executing resource, output size,
  duration -- for parallel coordinates (Fig. 6);
* :func:`warnings_and_long_tasks`: the warnings and errors logged, the long tasks, and how many warnings came
  while a long task ran on their host against the share of the run's time such tasks covered (Fig. 7);
* :func:`critical_paths`: each run's critical path, its length and its time per component and per group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from flowscope.store.run_set import RunSet

#: a task is *long* when it took at least LONG_FACTOR times its run's median task duration and LONG_MIN_S
LONG_FACTOR, LONG_MIN_S = 10.0, 0.1
#: locality of a transfer whose two ends are on one host, on two hosts, or where a host is not known
SAME_HOST, OTHER_HOST, UNKNOWN_HOST = "same host", "different hosts", "unknown"

# the host of a resource: its own, else its parent's (a thread's process, a worker's node)
_HOSTS = """hosts AS (SELECT r.run_id, r.resource_id, coalesce(r.host, p.host) AS host, r.name, r.kind
                      FROM resources r LEFT JOIN resources p ON p.run_id = r.run_id AND p.resource_id = r.parent_id)"""


def _run_starts(runs: RunSet) -> pd.Series:
    """run_id -> the run's start, ns (its first record's time where run.json has none)."""
    starts = runs.runs.set_index("run_id")["start_ns"]
    if starts.isna().any():
        first = runs.sql("SELECT run_id, min(start_ns) AS s FROM spans GROUP BY run_id").set_index("run_id")["s"]
        starts = starts.fillna(first)
    return starts.astype("int64")


def _since_start(df: pd.DataFrame, starts: pd.Series, *cols: str) -> None:
    """Replace each ns column ``c`` of ``df`` by ``c[:-3] + "_s"``: seconds since the row's run started."""
    base = df["run_id"].map(starts).to_numpy(np.int64)
    for c in cols:  # in integers: a time since the epoch in ns is past float64's exact range
        df[c[:-3] + "_s"] = (df[c].to_numpy(np.int64) - base) / 1e9
    df.drop(columns=list(cols), inplace=True)


def transfer_costs(runs: RunSet) -> pd.DataFrame:
    """Every transfer of every run: run_id, kind, nbytes, seconds, start_s, the hosts of its source and
    destination resources and ``locality`` (SAME_HOST, OTHER_HOST, or UNKNOWN_HOST when a host is not
    recorded)."""
    df = runs.sql(f"""WITH {_HOSTS}
        SELECT t.run_id, t.kind, t.nbytes, (t.end_ns - t.start_ns) / 1e9 AS seconds, t.start_ns,
               t.src_resource_id, t.dst_resource_id, s.host AS src_host, d.host AS dst_host
        FROM transfers t
        LEFT JOIN hosts s ON s.run_id = t.run_id AND s.resource_id = t.src_resource_id
        LEFT JOIN hosts d ON d.run_id = t.run_id AND d.resource_id = t.dst_resource_id
        ORDER BY t.run_id, t.start_ns""")
    known = df["src_host"].notna() & df["dst_host"].notna()
    df["locality"] = np.where(~known, UNKNOWN_HOST, np.where(df["src_host"] == df["dst_host"], SAME_HOST,
                                                             OTHER_HOST))
    _since_start(df, _run_starts(runs), "start_ns")
    return df


def transfer_fit(costs: pd.DataFrame) -> pd.DataFrame:
    """Per run and locality of :func:`transfer_costs`: transfers, bytes, seconds, and the least-squares line
    ``seconds = latency_s + seconds_per_byte * nbytes`` with its bandwidth (bytes/s, 1 / slope when the slope is
    positive). With fewer than two distinct sizes there is no slope: NaN, and the latency is the mean time."""
    rows = []
    for (run_id, loc), part in costs.groupby(["run_id", "locality"], sort=False):
        x = part["nbytes"].to_numpy(np.float64)
        y = part["seconds"].to_numpy(np.float64)
        ok = ~np.isnan(x)
        slope = np.nan
        if len(np.unique(x[ok])) >= 2:
            slope, latency = np.polyfit(x[ok], y[ok], 1)
        else:
            latency = float(y.mean()) if len(y) else np.nan
        rows.append({"run_id": run_id, "locality": loc, "transfers": len(part), "bytes": float(np.nansum(x)),
                     "seconds": float(y.sum()), "latency_s": float(latency), "seconds_per_byte": float(slope),
                     "bandwidth": float(1 / slope) if slope > 0 else np.nan})
    return pd.DataFrame(rows, columns=["run_id", "locality", "transfers", "bytes", "seconds", "latency_s",
                                       "seconds_per_byte", "bandwidth"])


def reassignments(runs: RunSet) -> pd.DataFrame:
    """Tasks moved from one worker to another while assigned (Dask's work stealing): every scheduler transition
    that keeps a task queued or running (its phase and its previous transition's, under the run's mappings:
    ``model.semantics``) on another worker than the one its previous transitions named -- run_id, task_key, group,
    t_s, from_worker and to_worker, as resource ids. For Dask, its ``processing -> processing`` transitions."""
    df = runs.sql(f"""
        WITH t AS (SELECT run_id, task_key, "group", ts_ns, worker, {runs.phase_sql("t")} AS phase
                   FROM transitions t WHERE observer = 'scheduler'),
        s AS (SELECT *, lag(worker IGNORE NULLS) OVER w AS before, lag(phase) OVER w AS before_phase
              FROM t WINDOW w AS (PARTITION BY run_id, task_key ORDER BY ts_ns))
        SELECT run_id, task_key, "group", ts_ns, before AS from_worker, worker AS to_worker FROM s
        WHERE phase IN ('queued', 'running') AND before_phase IN ('queued', 'running')
          AND worker IS NOT NULL AND before IS NOT NULL AND worker <> before ORDER BY run_id, ts_ns""")
    _since_start(df, _run_starts(runs), "ts_ns")
    return df.rename(columns={"ts_s": "t_s"})[["run_id", "task_key", "group", "t_s", "from_worker", "to_worker"]]


def io_timeline(runs: RunSet) -> pd.DataFrame:
    """Every I/O record of every run, on the resource that made it: run_id, resource_id, its label (``name``,
    else the id), host, source, op, path, nbytes, task_key, start_s and end_s (an instantaneous record, such as
    an open, ends where it starts)."""
    df = runs.sql(f"""WITH {_HOSTS}
        SELECT i.run_id, i.resource_id, coalesce(h.name, i.resource_id) AS resource, coalesce(i.host, h.host) AS host,
               i.source, i.op, i.path, i.nbytes, i.task_key, i.start_ns, coalesce(i.end_ns, i.start_ns) AS end_ns
        FROM io i LEFT JOIN hosts h ON h.run_id = i.run_id AND h.resource_id = i.resource_id
        ORDER BY i.run_id, i.resource_id, i.start_ns""")
    _since_start(df, _run_starts(runs), "start_ns", "end_ns")
    return df


def task_coordinates(runs: RunSet) -> pd.DataFrame:
    """One row per task of every run (``activity`` rows of role task): run_id, task_key, group, the executing
    resource (``thread``: its name, else its id) and host, elapsed_s (its start since the run's), output_mb (the
    span's ``nbytes``: its output's size, when the source records it) and duration_s."""
    df = runs.sql(f"""WITH {_HOSTS}
        SELECT a.run_id, a.task_key, a."group", coalesce(h.name, a.resource_id) AS thread, h.host,
               a.start_ns, (a.end_ns - a.start_ns) / 1e9 AS duration_s,
               TRY_CAST(json_extract(a.attrs, '$.nbytes') AS DOUBLE) / 1e6 AS output_mb
        FROM activity a LEFT JOIN hosts h ON h.run_id = a.run_id AND h.resource_id = a.resource_id
        WHERE a.role = 'task' ORDER BY a.run_id, a.start_ns""")
    df.insert(5, "elapsed_s", 0.0)
    _since_start(df, _run_starts(runs), "start_ns")
    df["elapsed_s"] = df.pop("start_s")
    return df


def warnings_and_long_tasks(runs: RunSet, *, long_factor: float = LONG_FACTOR,
                            long_min_s: float = LONG_MIN_S) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(warnings, long tasks, summary) of every run.

    ``warnings``: the logs of level warning or error -- run_id, t_s, level, category, message, resource_id, host,
    and ``during_long_task`` (a long task of the run was running on that host then; on any host when the
    warning's host is unknown). ``long tasks``: the tasks that took at least ``long_factor`` times their run's
    median task duration and ``long_min_s`` -- run_id, task_key, group, host, start_s, end_s, duration_s.
    ``summary``, per run: warnings, during_long_tasks, long_tasks, and ``long_task_time_share``: the share of the
    run's host-time (its span times its hosts) during which a long task ran, the share of warnings to expect
    during long tasks if warnings and long tasks were unrelated."""
    starts = _run_starts(runs)
    warns = runs.sql(f"""WITH {_HOSTS}
        SELECT l.run_id, l.ts_ns, l.level, l.category, l.message, l.resource_id, h.host
        FROM logs l LEFT JOIN hosts h ON h.run_id = l.run_id AND h.resource_id = l.resource_id
        WHERE l.level IN ('warning', 'error') ORDER BY l.run_id, l.ts_ns""")
    _since_start(warns, starts, "ts_ns")
    warns = warns.rename(columns={"ts_s": "t_s"})
    # each run's tasks once: its extent and hosts (the summary's host-time), and those long against its median
    tasks = runs.sql(f"""WITH {_HOSTS}
        SELECT a.run_id, a.task_key, a."group", h.host, a.start_ns, a.end_ns, a.end_ns - a.start_ns AS d
        FROM activity a LEFT JOIN hosts h ON h.run_id = a.run_id AND h.resource_id = a.resource_id
        WHERE a.role = 'task' ORDER BY a.run_id, a.start_ns""")
    by_run = tasks.groupby("run_id", sort=False)
    spans = pd.DataFrame({"first_ns": by_run["start_ns"].min(), "last_ns": by_run["end_ns"].max(),
                          "hosts": by_run["host"].nunique().clip(lower=1)})
    threshold = np.maximum(by_run["d"].transform("median").to_numpy(np.float64) * float(long_factor),
                           float(long_min_s) * 1e9)
    tasks = tasks[tasks["d"].to_numpy(np.float64) >= threshold]
    long_tasks = tasks[["run_id", "task_key", "group", "host", "start_ns", "end_ns"]].copy()
    long_tasks["duration_s"] = (long_tasks["end_ns"] - long_tasks["start_ns"]) / 1e9
    _since_start(long_tasks, starts, "start_ns", "end_ns")

    during = np.zeros(len(warns), dtype=bool)
    for run_id, idx in warns.groupby("run_id", sort=False).groups.items():
        lt = long_tasks[long_tasks["run_id"] == run_id]
        if lt.empty:
            continue
        t = warns.loc[idx, "t_s"].to_numpy()[:, None]
        inside = (lt["start_s"].to_numpy()[None, :] <= t) & (t <= lt["end_s"].to_numpy()[None, :])
        host = warns.loc[idx, "host"].to_numpy(object)[:, None]
        same = (host == lt["host"].to_numpy(object)[None, :]) | pd.isna(host)
        during[warns.index.get_indexer(idx)] = (inside & same).any(axis=1)
    warns["during_long_task"] = during

    rows = []
    for run_id in runs.run_ids:
        lt = long_tasks[long_tasks["run_id"] == run_id]
        w = warns[warns["run_id"] == run_id]
        share = 0.0
        if run_id in spans.index and not lt.empty:
            s = spans.loc[run_id]
            total = (float(s["last_ns"]) - float(s["first_ns"])) / 1e9 * int(s["hosts"])
            covered = sum(_union_length(part[["start_s", "end_s"]].to_numpy())
                          for _, part in lt.groupby(lt["host"].fillna(""), sort=False))
            share = min(covered / total, 1.0) if total > 0 else 0.0
        rows.append({"run_id": run_id, "warnings": len(w), "during_long_tasks": int(w["during_long_task"].sum()),
                     "long_tasks": len(lt), "long_task_time_share": share})
    return warns.reset_index(drop=True), long_tasks.reset_index(drop=True), pd.DataFrame(rows)


def _union_length(intervals: np.ndarray) -> float:
    """The length of the union of [start, end] intervals (rows of ``intervals``)."""
    if not len(intervals):
        return 0.0
    iv = intervals[np.argsort(intervals[:, 0], kind="stable")]
    ends = np.maximum.accumulate(iv[:, 1])
    # a new block starts where an interval begins after every earlier one ended
    starts = np.flatnonzero(np.r_[True, iv[1:, 0] > ends[:-1]])
    first = iv[starts, 0]
    last = np.maximum.reduceat(iv[:, 1], starts)
    return float((last - first).sum())


@dataclass
class CriticalPaths:
    """Each run's critical path side by side: ``runs`` (run_id, kind: measured or structural, length_s,
    steps, or ``missing``: why a run has none), ``components`` (run_id, component, seconds, share) and ``groups``
    (run_id, group, seconds, share: the path's time in each group's tasks)."""

    runs: pd.DataFrame
    components: pd.DataFrame
    groups: pd.DataFrame

    def to_dict(self) -> dict:
        def rows(df: pd.DataFrame) -> list[dict]:
            return json.loads(df.to_json(orient="records", double_precision=15)) if len(df) else []

        return {"runs": rows(self.runs), "components": rows(self.components), "groups": rows(self.groups)}


def critical_paths(runs: RunSet) -> CriticalPaths:
    """The critical path of each run's task graph (measured where the run's waits can be traced, else the
    structural one; :func:`flowscope.analysis.critical_path.task_graph_paths`), side by side."""
    from flowscope.analysis.critical_path import missing_path_reason, task_graph_paths, work_units

    heads, comps, groups = [], [], []
    for run_id in runs.run_ids:
        run = runs.run(run_id)
        try:
            units = work_units(run)
            path = None
            if units["task_key"].notna().any():
                try:
                    tp = task_graph_paths(units, run.table("dependencies"), run.table("transfers"))
                    path, kind = (tp.measured, "measured") if tp.measured is not None else (tp.structural, "structural")
                except ValueError as exc:
                    why = str(exc)
            else:
                why = missing_path_reason(run)
            if path is None:
                heads.append({"run_id": run_id, "kind": None, "length_s": None, "steps": 0, "missing": why})
                continue
            heads.append({"run_id": run_id, "kind": kind, "length_s": path.length_ns / 1e9, "steps": len(path.steps),
                          "missing": None})
            for r in path.by_component().itertuples(index=False):
                comps.append({"run_id": run_id, "component": r.component, "seconds": r.duration_ns / 1e9,
                              "share": float(r.share)})
            # the path's time in each group's own work (its compute and I/O steps: not the waits, queues and
            # transfers before them, which carry the group they lead to)
            st = path.steps
            steps = st[st["component"].isin(("compute", "io")) & st["application"].notna() & (st["duration_ns"] > 0)]
            for g, part in steps.groupby("application", sort=False):
                ns = int(part["duration_ns"].sum())
                groups.append({"run_id": run_id, "group": g, "seconds": ns / 1e9,
                               "share": ns / path.length_ns if path.length_ns else 0.0})
        finally:
            run.close()
    groups_df = pd.DataFrame(groups, columns=["run_id", "group", "seconds", "share"])
    if len(groups_df):
        groups_df = groups_df.sort_values(["run_id", "seconds"], ascending=[True, False], kind="stable")
    return CriticalPaths(pd.DataFrame(heads, columns=["run_id", "kind", "length_s", "steps", "missing"]),
                         pd.DataFrame(comps, columns=["run_id", "component", "seconds", "share"]),
                         groups_df.reset_index(drop=True))
