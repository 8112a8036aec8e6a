"""The task graph of a run's tables: its tasks (the last execution of each key, with its worker), the dependency
edges between them and the transfer that brought each input to its dependent's worker; and the units of work a
run without tasks offers instead (:func:`work_units`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from flowscope.analysis.critical_path.tables import _frame
from flowscope.analysis.timeline import (
    BUSY_SPAN_SQL,
    IO_UNIT,
    SPAN_UNIT,
    TASK_UNIT,
    TIMED_IO_SQL,
    work_unit_kind,
)


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
    """The worker each row's attrs (JSON text) name, as a resource id (``worker:ADDRESS``); None where they name
    none or are not a JSON object. One DuckDB pass: parsing each row's JSON in Python took 5 s a build at 100,000
    tasks, and the advisor builds the graph ten times."""
    import duckdb

    text = np.array([v if isinstance(v, str) else None for v in attrs.to_numpy(dtype=object)], dtype=object)
    frame = pd.DataFrame({"i": np.arange(len(text)), "a": text})
    con = duckdb.connect()
    try:
        con.register("frame", frame)
        w = con.sql("""SELECT CASE WHEN json_valid(a) AND json_type(a) = 'OBJECT'
                                   THEN json_extract_string(a, '$.worker') END AS w
                       FROM frame ORDER BY i""").df()["w"]
    finally:
        con.close()
    w = w.astype(object).where(w.notna(), None)
    bare = w.notna() & (w != "") & ~w.fillna("").str.startswith("worker:")
    w[bare] = "worker:" + w[bare]
    return pd.Series(w.to_numpy(dtype=object), index=attrs.index)


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
    # a dependency between spans within units (work_units' ``aliases``: a flow's or a message's ends) is one between
    # the units, when the dependent unit started after the other ended (the unit as a whole waited for it); one
    # between spans of the same unit, or of units that overlap, says nothing of the order of the units
    alias = {}
    if "aliases" in t.columns:
        alias = {a: str(k) for k, al in zip(t["task_key"], t["aliases"]) if isinstance(al, list) for a in al}
    inner = deps["task_key"].isin(list(alias)) | deps["depends_on"].isin(list(alias))
    if alias:
        deps = deps.assign(task_key=deps["task_key"].map(lambda k: alias.get(k, k)),
                           depends_on=deps["depends_on"].map(lambda k: alias.get(k, k)))
    keep = deps["task_key"].isin(pos.index) & deps["depends_on"].isin(pos.index) & (deps["task_key"] != deps["depends_on"])
    deps, inner = deps[keep], inner[keep].to_numpy()
    src = pos.reindex(deps["depends_on"]).to_numpy(dtype=np.int64)
    dst = pos.reindex(deps["task_key"]).to_numpy(dtype=np.int64)
    # a dependent that started before its dependency did is another execution than the one kept: drop the edge
    starts = tasks["start_ns"].to_numpy(dtype=np.int64)
    ends = tasks["end_ns"].to_numpy(dtype=np.int64)
    # units that are a resource's own spans (work_units), not tasks: the dependent follows its dependency's end
    own = bool(len(tasks)) and tasks["unit"].notna().all() and not (tasks["unit"] == TASK_UNIT).any()
    ok = np.where(inner | own, starts[dst] >= ends[src], starts[dst] >= starts[src])
    src, dst = src[ok], dst[ok]
    if alias and len(src):  # two inner dependencies between the same two units are one edge
        pair = np.unique(np.stack([src, dst]), axis=1)
        src, dst = pair[0], pair[1]
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
    kind = work_unit_kind(run)
    if kind == TASK_UNIT:
        return run.sql(f"SELECT {cols}, '{TASK_UNIT}' AS unit FROM activity a WHERE a.role = 'task'")
    if kind == IO_UNIT:
        return run.sql(f"""
            SELECT CAST(NULL AS BIGINT) AS span_id, CAST(NULL AS BIGINT) AS parent_id, resource_id, 'io' AS kind,
                   op AS name, start_ns, end_ns,
                   op || ' ' || coalesce(path, '(no path)') || ' #'
                      || CAST(row_number() OVER (ORDER BY resource_id, start_ns, end_ns DESC, op, path, "offset", attrs)
                              AS VARCHAR) AS task_key,
                   attrs, 'task' AS role, 'io' AS category, '{IO_UNIT}' AS unit
            FROM ({TIMED_IO_SQL}) ORDER BY resource_id, start_ns""")
    # the outermost busy spans of each executing resource (none at all: an empty frame with these columns)
    units = run.sql(f"""
        SELECT {cols}, '{SPAN_UNIT}' AS unit FROM activity a LEFT JOIN executors e ON e.resource_id = a.resource_id
        WHERE {BUSY_SPAN_SQL}
          AND (a.parent_id IS NULL OR NOT EXISTS (SELECT 1 FROM activity p WHERE p.span_id = a.parent_id
                                                  AND p.resource_id = a.resource_id))""")
    if len(units) and run.counts().get("dependencies"):
        units["aliases"] = _nested_keys(run, units)
    return units


#: per span that a dependency names and that lies within another span of its resource (by ``parent_id``): its key,
#: and every span it lies within on that resource (``ancestor``, the enclosing span's ``span_id``), innermost first
_NAMED_WITHIN_SQL = """
    WITH RECURSIVE named AS (
        SELECT s.task_key AS key, s.resource_id, s.parent_id FROM spans s
        WHERE s.parent_id IS NOT NULL
          AND s.task_key IN (SELECT task_key FROM dependencies UNION SELECT depends_on FROM dependencies)),
    up(key, resource_id, ancestor) AS (
        SELECT key, resource_id, parent_id FROM named
        UNION ALL
        SELECT up.key, up.resource_id, s.parent_id FROM up JOIN spans s
            ON s.span_id = up.ancestor AND s.resource_id = up.resource_id WHERE s.parent_id IS NOT NULL)
    SELECT DISTINCT key, resource_id, ancestor FROM up"""


def _nested_keys(run, units: pd.DataFrame) -> list:
    """Per unit (outermost spans of :func:`work_units`), the keys of the spans within it that a dependency names
    (a Chrome flow binds the innermost slice at its ends, an MPI message its send and receive calls), or None: the
    dependencies of those spans are the unit's."""
    within = run.sql(_NAMED_WITHIN_SQL)
    out: list = [None] * len(units)
    if not len(within):
        return out
    row = {(r, int(sid)): i for i, (r, sid) in enumerate(zip(units["resource_id"], units["span_id"]))
           if pd.notna(sid)}
    for key, rid, anc in zip(within["key"], within["resource_id"], within["ancestor"]):
        i = row.get((rid, int(anc)))
        if i is not None:
            out[i] = (out[i] or []) + [str(key)]
    return out
