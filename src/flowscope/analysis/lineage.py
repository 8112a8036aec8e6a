"""Everything a run recorded about one task (a unit of work, whatever the source): the provenance paper's task
summary (its Fig. 8).

A task's lineage gathers, by its key, its executions (``activity`` rows), every transition with where and when
it happened, the tasks it depends on and those that depend on it (with their group and where they ran), the
data movements that carried its output or its inputs, its I/O records, the logs about it or on its resource
while it ran, the anomaly detector's verdict on it, and its place on the critical paths.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from flowscope.store.run import Run

#: the log levels reported as warnings during a task
WARNING_LEVELS = ("warning", "error", "critical")


class UnknownTask(KeyError):
    """The run has no task with that key."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class TaskLineage:
    """One task's lineage in ``run``: tables (DataFrames) and a few facts. ``key`` is the task's key;
    ``group`` its group in the model's vocabulary (a Dask prefix, a StarPU codelet, a WfCommons category)."""

    run_id: str
    key: str
    group: str | None
    executions: pd.DataFrame   # activity rows of the task: resource, start/end, category, role
    transitions: pd.DataFrame  # every state change, time order: ts_ns, from/to, observer (where), worker
    dependencies: pd.DataFrame  # the tasks it needs: key, group, where each ran, when each ended
    dependants: pd.DataFrame   # the tasks that need it, likewise
    transfers: pd.DataFrame    # data movements carrying its key (its output) between resources
    io: pd.DataFrame           # I/O records attributed to it
    logs: pd.DataFrame         # logs naming it, and warnings on its resources while it ran
    anomaly: dict | None       # the detector's verdict on its execution(s); None if it has no execution
    critical_path: dict = field(default_factory=dict)  # on_measured, on_structural, slack_ns (or error)

    def to_dict(self) -> dict:
        """JSON-ready."""
        def rows(df: pd.DataFrame) -> list[dict]:
            return json.loads(df.to_json(orient="records", double_precision=15)) if len(df) else []

        return {"run_id": self.run_id, "key": self.key, "group": self.group,
                "executions": rows(self.executions), "transitions": rows(self.transitions),
                "dependencies": rows(self.dependencies), "dependants": rows(self.dependants),
                "transfers": rows(self.transfers), "io": rows(self.io), "logs": rows(self.logs),
                "anomaly": self.anomaly, "critical_path": self.critical_path}


def task_keys(run: Run) -> list[str]:
    """Every task key the run knows of (spans, transitions, dependencies), sorted."""
    return list(run.sql("""SELECT DISTINCT task_key FROM (
                               SELECT task_key FROM spans UNION ALL SELECT task_key FROM transitions
                               UNION ALL SELECT task_key FROM dependencies UNION ALL SELECT depends_on FROM dependencies)
                           WHERE task_key IS NOT NULL ORDER BY 1""")["task_key"])


def _unknown(run: Run, key: str) -> UnknownTask:
    near = difflib.get_close_matches(key, task_keys(run), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return UnknownTask(f"run {run.run_id} has no task {key!r}{hint}")


_NEIGHBOURS = """
    SELECT d.{other} AS key, any_value(a."group") AS "group", any_value(a.resource_id) AS resource_id,
           any_value(r.host) AS host, min(a.start_ns) AS start_ns, max(a.end_ns) AS end_ns,
           count(DISTINCT d.graph_id) AS graphs
    FROM dependencies d
    LEFT JOIN activity a ON a.task_key = d.{other} AND a.role = 'task'
    LEFT JOIN resources r ON r.resource_id = a.resource_id
    WHERE d.{this} = ? GROUP BY d.{other} ORDER BY min(a.end_ns) NULLS LAST, d.{other}"""


def anomaly_verdict(run: Run, key: str) -> dict | None:
    """The anomaly detector's verdict (HBOS, Chimbuko's defaults; analysis/anomalies) on the task's executions:
    ``flagged`` (any of them), and per execution its score, the threshold and the time lost; None when the task
    has no execution to judge."""
    from flowscope.analysis.anomalies.detect import detect_run

    det = detect_run(run)
    calls = det.calls
    if not len(calls) or "task_key" not in calls.table.column_names:
        return None
    mine = np.flatnonzero(pc.fill_null(pc.equal(calls.table["task_key"], key), False).to_numpy(zero_copy_only=False))
    if not len(mine):
        return None
    flagged_rows = set(det.rows.tolist())
    anomalies = det.anomalies.to_pylist()
    by_row = dict(zip(det.rows.tolist(), anomalies))
    out = []
    for r in mine:
        entry = {"resource_id": calls.resources[calls.resource[r]], "function": calls.functions[calls.func[r]],
                 "start_ns": int(calls.start[r]), "duration_ns": int(calls.inclusive[r]),
                 "score": float(det.score[r]), "flagged": bool(det.flagged[r])}
        if r in flagged_rows:
            a = by_row[r]
            entry.update(threshold=a["threshold"], severity_ns=a["severity_ns"], algo=a["algo"])
        out.append(entry)
    return {"flagged": any(e["flagged"] for e in out), "algo": det.config.algo, "executions": out}


def critical_path_place(run: Run, key: str) -> dict:
    """Whether the task is on the run's measured and structural critical paths, and its slack (how much longer
    it could have taken without lengthening the structural path)."""
    from flowscope.analysis.critical_path import slack, task_graph_paths, work_units

    spans = work_units(run)
    if not len(spans):
        return {"error": "the run has no units of work"}
    deps, transfers = run.table("dependencies"), run.table("transfers")
    try:
        tp = task_graph_paths(spans, deps, transfers)
        sl = slack(spans, deps, transfers)
    except ValueError as exc:
        return {"error": str(exc)}
    mine = sl[sl["key"] == key]
    return {"task_times": tp.timeline,
            "on_measured": (key in tp.measured.ids) if tp.measured is not None else None,
            "on_structural": key in tp.structural.ids,
            "slack_ns": int(mine["slack_ns"].iloc[0]) if len(mine) else None}


def lineage(run: Run, key: str) -> TaskLineage:
    """Everything ``run`` recorded about the task ``key`` (:class:`TaskLineage`); :class:`UnknownTask` naming
    the closest keys when there is none."""
    executions = run.sql("""
        SELECT a.span_id, a.resource_id, r.kind AS resource_kind, r.name AS resource_name, r.host, a.kind, a.name,
               a."group", a.category, a.role, a.start_ns, a.end_ns, a.end_ns - a.start_ns AS duration_ns, a.attrs
        FROM activity a LEFT JOIN resources r ON r.resource_id = a.resource_id
        WHERE a.task_key = ? ORDER BY a.start_ns, a.end_ns""", [key])
    transitions = run.sql("""SELECT ts_ns, from_state, to_state, observer, worker, "group", prefix, stimulus_id, attrs
                             FROM transitions WHERE task_key = ? ORDER BY ts_ns""", [key])
    dependencies = run.sql(_NEIGHBOURS.format(this="task_key", other="depends_on"), [key])
    dependants = run.sql(_NEIGHBOURS.format(this="depends_on", other="task_key"), [key])
    if not (len(executions) or len(transitions) or len(dependencies) or len(dependants)):
        raise _unknown(run, key)
    transfers = run.sql("""
        SELECT t.transfer_id, t.kind, t.src_resource_id, s.host AS src_host, t.dst_resource_id, d.host AS dst_host,
               t.nbytes, t.start_ns, t.end_ns, t.end_ns - t.start_ns AS duration_ns, len(t.keys) AS keys, t.attrs
        FROM transfers t LEFT JOIN resources s ON s.resource_id = t.src_resource_id
        LEFT JOIN resources d ON d.resource_id = t.dst_resource_id
        WHERE list_contains(t.keys, ?) ORDER BY t.start_ns""", [key])
    io = run.sql("""SELECT resource_id, host, source, op, path, "offset", nbytes, start_ns, end_ns, attrs
                    FROM io WHERE task_key = ? ORDER BY start_ns, op""", [key])
    # its own logs, and warnings on the resources it ran on (the thread, its worker process, its host) while it ran
    logs = run.sql(f"""
        WITH ex AS (SELECT e.start_ns, e.end_ns, e.resource_id AS r0, r1.parent_id AS r1, r2.parent_id AS r2
                    FROM activity e LEFT JOIN resources r1 ON r1.resource_id = e.resource_id
                    LEFT JOIN resources r2 ON r2.resource_id = r1.parent_id
                    WHERE e.task_key = ? AND e.role = 'task')
        SELECT DISTINCT l.ts_ns, l.resource_id, l.level, l.category, l.message, l.task_key, l.attrs,
               l.task_key IS NOT DISTINCT FROM ? AS about_it
        FROM logs l LEFT JOIN ex ON l.ts_ns BETWEEN ex.start_ns AND ex.end_ns
                               AND l.resource_id IN (ex.r0, ex.r1, ex.r2)
        WHERE l.task_key = ? OR (ex.start_ns IS NOT NULL AND lower(l.level) IN
                                 ({", ".join(repr(v) for v in WARNING_LEVELS)}))
        ORDER BY l.ts_ns""", [key, key, key])
    groups = [g for g in executions["group"].dropna()] or [g for g in transitions["group"].dropna()]
    return TaskLineage(run_id=run.run_id, key=key, group=groups[0] if groups else None, executions=executions,
                       transitions=transitions, dependencies=dependencies, dependants=dependants,
                       transfers=transfers, io=io, logs=logs,
                       anomaly=anomaly_verdict(run, key) if len(executions) else None,
                       critical_path=critical_path_place(run, key))
