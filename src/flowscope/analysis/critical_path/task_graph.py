"""The task graph of a run's tables: its tasks (the last execution of each key, with its worker), the dependency
edges between them and the transfer that brought each input to its dependent's worker; and the units of work a
run without tasks offers instead (:func:`work_units`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from flowscope.analysis.critical_path.tables import _attrs, _frame


@dataclass
class _TaskGraph:
    tasks: pd.DataFrame      # key, group, start_ns, end_ns, resource_id, worker, category, unit; index = vertex number
    src: np.ndarray          # dependency edges (vertex numbers)
    dst: np.ndarray
    xfer_start: np.ndarray   # per edge: the transfer that brought src's output to dst's worker (-1: none)
    xfer_end: np.ndarray

    @property
    def n(self) -> int:
        return len(self.tasks)

    @property
    def duration(self) -> np.ndarray:
        return (self.tasks["end_ns"] - self.tasks["start_ns"]).to_numpy(dtype=np.int64)

    @property
    def xfer_time(self) -> np.ndarray:
        return np.where(self.xfer_start >= 0, self.xfer_end - self.xfer_start, 0).astype(np.int64)

    @property
    def arrival(self) -> np.ndarray:
        """Per edge: when src's output was available on dst's worker."""
        end = self.tasks["end_ns"].to_numpy(dtype=np.int64)[self.src]
        return np.where(self.xfer_start >= 0, np.maximum(end, self.xfer_end), end)


def _worker_of(attrs: pd.Series) -> pd.Series:
    def one(text):
        w = _attrs(text).get("worker")
        return f"worker:{w}" if w and not str(w).startswith("worker:") else w
    return attrs.map(one)


def _task_graph(spans, dependencies, transfers=None) -> _TaskGraph:
    spans = _frame(spans, "spans", ["name", "start_ns", "end_ns", "task_key"])
    if "role" in spans.columns:  # activity rows (model/semantics.py): the tasks among them
        spans = spans[spans["role"] == "task"]
    t = spans[spans["task_key"].notna()]
    # a task that ran twice (a retry, a lost worker): its last execution is the one that counted
    t = t.sort_values("end_ns", kind="stable").drop_duplicates("task_key", keep="last")
    t = t.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    worker = _worker_of(t["attrs"]) if "attrs" in t.columns else pd.Series([None] * len(t))
    tasks = pd.DataFrame({"key": t["task_key"].astype(str), "group": t["name"].astype(str),
                          "start_ns": t["start_ns"].astype("int64"), "end_ns": t["end_ns"].astype("int64"),
                          "resource_id": t["resource_id"].astype(str) if "resource_id" in t.columns else None,
                          "worker": worker.astype(object),
                          # what the unit's time was spent on, and what kind of unit it is (:func:`work_units`);
                          # None when the caller's rows do not say
                          "category": t["category"].astype(object) if "category" in t.columns else None,
                          "unit": t["unit"].astype(object) if "unit" in t.columns else None})
    if (tasks["end_ns"] < tasks["start_ns"]).any():
        row = tasks[tasks["end_ns"] < tasks["start_ns"]].iloc[0]
        raise ValueError(f"spans: task {row['key']!r} ends before it starts")
    pos = pd.Series(np.arange(len(tasks)), index=tasks["key"])
    deps = _frame(dependencies, "dependencies", ["task_key", "depends_on"])
    deps = deps[["task_key", "depends_on"]].astype(str).drop_duplicates()
    deps = deps[deps["task_key"].isin(pos.index) & deps["depends_on"].isin(pos.index)]
    src = pos.reindex(deps["depends_on"]).to_numpy(dtype=np.int64)
    dst = pos.reindex(deps["task_key"]).to_numpy(dtype=np.int64)
    # a dependent that started before its dependency did is another execution than the one kept: drop the edge
    starts = tasks["start_ns"].to_numpy(dtype=np.int64)
    ok = starts[dst] >= starts[src]
    src, dst = src[ok], dst[ok]
    xs = np.full(len(src), -1, dtype=np.int64)
    xe = np.full(len(src), -1, dtype=np.int64)
    if transfers is not None and len(src):
        tr = _frame(transfers, "transfers", ["dst_resource_id", "start_ns", "end_ns", "keys"])
        if len(tr):
            tr = tr[["dst_resource_id", "start_ns", "end_ns", "keys"]].explode("keys").dropna(subset=["keys"])
            # the first copy of a key to reach a worker is the one its dependents used
            tr = tr.sort_values("end_ns", kind="stable").drop_duplicates(["keys", "dst_resource_id"])
            edges = pd.DataFrame({"key": tasks["key"].to_numpy()[src],
                                  "worker": tasks["worker"].to_numpy()[dst], "row": np.arange(len(src))})
            m = edges.merge(tr, left_on=["key", "worker"], right_on=["keys", "dst_resource_id"], how="inner")
            if len(m):
                rows = m["row"].to_numpy()
                xs[rows] = m["start_ns"].to_numpy(dtype=np.int64)
                xe[rows] = m["end_ns"].to_numpy(dtype=np.int64)
    return _TaskGraph(tasks, src, dst, xs, xe)


#: what :func:`work_units` returns, per kind of unit (its ``unit`` column)
TASK_UNIT = "task"
SPAN_UNIT = "span"
IO_UNIT = "io operation"

#: the I/O records that time one operation on a resource that executes work: not an aggregate (a row totalling
#: many operations, whose times are a window, docs/data-model.md), with a duration; per resource, the outermost
#: ones (an operation of a lower layer within one of a layer above, e.g. the POSIX writes of an MPI-IO write,
#: is part of it). ``prev_end``: the latest end of the resource's records that start before it (ties: longer first)
TIMED_IO_SQL = """
    WITH t AS (
        SELECT i.resource_id, i.op, i.path, i."offset", i.nbytes, i.start_ns, i.end_ns, i.attrs
        FROM io i LEFT JOIN executors e ON e.resource_id = i.resource_id
        WHERE i.resource_id IS NOT NULL AND coalesce(e.executes, TRUE) AND i.end_ns > i.start_ns
          AND NOT coalesce(TRY_CAST(json_extract_string(i.attrs, '$.aggregate') AS BOOLEAN), false)),
    o AS (
        SELECT *, max(end_ns) OVER (PARTITION BY resource_id ORDER BY start_ns, end_ns DESC, op, path, "offset", attrs
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
        FROM t)
    SELECT * EXCLUDE (prev_end) FROM o WHERE prev_end IS NULL OR end_ns > prev_end"""


def work_units(run) -> pd.DataFrame:
    """The units of work :func:`task_graph_paths` runs over for ``run``, as ``activity`` rows with a ``unit``
    column saying which kind they are: its tasks (role ``task``, named by their group; ``unit`` "task"); a run
    without tasks (an MPI or a call trace) uses the outermost busy spans of each executing resource ("span"); a run
    without busy spans either (a Darshan log with DXT) uses the outermost timed I/O operations of each executing
    resource (:data:`TIMED_IO_SQL`; "io operation", category ``io``, named by their ``op``). A unit without a task
    key is keyed ``<resource_id>#<span_id>``, an I/O operation ``<op> <path> #<n>``."""
    cols = """a.span_id, a.parent_id, a.resource_id, a.kind, a."group" AS name, a.start_ns, a.end_ns,
              coalesce(a.task_key, a.resource_id || '#' || coalesce(CAST(a.span_id AS VARCHAR),
                       CAST(row_number() OVER (ORDER BY a.resource_id, a.start_ns, a.end_ns) AS VARCHAR))) AS task_key,
              a.attrs, 'task' AS role, a.category"""
    tasks = run.sql(f"SELECT {cols}, '{TASK_UNIT}' AS unit FROM activity a WHERE a.role = 'task'")
    if len(tasks):
        return tasks
    spans = run.sql(f"""
        SELECT {cols}, '{SPAN_UNIT}' AS unit FROM activity a LEFT JOIN executors e ON e.resource_id = a.resource_id
        WHERE coalesce(e.executes, TRUE) AND a.category <> 'idle' AND a.end_ns > a.start_ns
          AND (a.parent_id IS NULL OR NOT EXISTS (SELECT 1 FROM activity p WHERE p.span_id = a.parent_id
                                                  AND p.resource_id = a.resource_id))""")
    if len(spans) or not run.counts().get("io"):
        return spans
    return run.sql(f"""
        SELECT CAST(NULL AS BIGINT) AS span_id, CAST(NULL AS BIGINT) AS parent_id, resource_id, 'io' AS kind,
               op AS name, start_ns, end_ns,
               op || ' ' || coalesce(path, '(no path)') || ' #'
                  || CAST(row_number() OVER (ORDER BY resource_id, start_ns, end_ns DESC, op, path, "offset", attrs)
                          AS VARCHAR) AS task_key,
               attrs, 'task' AS role, 'io' AS category, '{IO_UNIT}' AS unit
        FROM ({TIMED_IO_SQL}) ORDER BY resource_id, start_ns""")
