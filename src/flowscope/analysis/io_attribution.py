"""Attribute I/O rows to the tasks that did them, by host, process, thread and time.

I/O rows are in the clock of the process that recorded them. A task span may be in another: Dask stamps
task times with the worker's estimate of its offset to the scheduler's clock, which moves with each
heartbeat, so two tasks that ran one after the other on a thread can overlap in it. Such spans carry the
offset added (``attrs.clock_offset_ns``); :data:`TASK_SPANS_SQL` subtracts it, so that the join is on one
clock, the local one.
"""

from __future__ import annotations

import duckdb
import pandas as pd

IO_COLUMNS = ("host", "pid", "tid", "thread_ident", "start_ns", "end_ns")
TASK_COLUMNS = ("task_key", "host", "pid", "tid", "thread_ident", "start_ns", "end_ns")
#: a run's task spans as :func:`attribute_io` takes them: joined to their resources, on the local clock
TASK_SPANS_SQL = """
    WITH t AS (SELECT s.*, coalesce(TRY_CAST(json_extract(s.attrs, '$.clock_offset_ns') AS BIGINT), 0) AS off
               FROM activity s WHERE s.role = 'task')
    SELECT t.start_ns - t.off AS start_ns, t.end_ns - t.off AS end_ns, t.task_key, r.host, r.pid, r.tid,
           r.thread_ident
    FROM t JOIN resources r USING (resource_id)"""

_QUERY = """
WITH cand AS (
    SELECT i.row, t.task_key, t.start_ns AS t_start,
           (i.tid IS NOT NULL OR i.thread_ident IS NOT NULL) AS by_thread,
           least(coalesce(i.end_ns, i.start_ns), t.end_ns) - greatest(i.start_ns, t.start_ns) AS overlap,
           (t.start_ns <= i.start_ns AND coalesce(i.end_ns, i.start_ns) <= t.end_ns) AS contains
    FROM io i JOIN tasks t
      ON i.host = t.host
     AND (i.pid IS NULL OR t.pid = i.pid)
     AND (i.tid IS NULL OR t.tid = i.tid)
     AND (i.thread_ident IS NULL OR t.thread_ident = i.thread_ident)
     AND t.start_ns <= coalesce(i.end_ns, i.start_ns) AND i.start_ns <= t.end_ns
),
thread_pick AS (      -- the thread is known: the task on it that overlaps the interval most
    SELECT row, task_key FROM cand WHERE by_thread
    QUALIFY row_number() OVER (PARTITION BY row ORDER BY overlap DESC, t_start, task_key) = 1
),
host_pick AS (        -- only host (and process) known: a task only when it alone contains the interval
    SELECT row, any_value(task_key) AS task_key FROM cand
    WHERE NOT by_thread AND contains GROUP BY row HAVING count(*) = 1
)
SELECT row, task_key FROM thread_pick UNION ALL SELECT row, task_key FROM host_pick
"""


def attribute_io(io: pd.DataFrame, tasks: pd.DataFrame) -> pd.Series:
    """The task each I/O row belongs to (None where no task can be named), aligned with ``io``'s index.

    ``io`` needs host and start_ns, and may have pid, tid, thread_ident, end_ns (the ``io`` table's columns;
    missing or null means unknown); ``tasks`` needs task_key, host, pid, tid, thread_ident, start_ns, end_ns: the
    task spans joined to their resources, on the I/O rows' clock (what :data:`TASK_SPANS_SQL` selects). A row that names its thread (tid or thread_ident) goes to the
    task on that thread whose span overlaps it most; a row that names only its host (and maybe its process),
    as Darshan DXT segments do, goes to a task only when exactly one task span on that host contains it."""
    missing = [c for c in ("host", "start_ns") if c not in io.columns] + \
              [f"tasks.{c}" for c in TASK_COLUMNS if c not in tasks.columns]
    if missing:
        raise KeyError(f"attribute_io needs columns {', '.join(missing)}")
    out = pd.Series([None] * len(io), index=io.index, dtype=object)
    if io.empty or tasks.empty:
        return out
    left = pd.DataFrame({c: io[c].astype(object) if c == "host" else
                         _ints(io[c] if c in io.columns else pd.Series([None] * len(io), index=io.index))
                         for c in IO_COLUMNS})
    left.insert(0, "row", range(len(io)))
    right = pd.DataFrame({c: _ints(tasks[c]) if c not in ("host", "task_key") else tasks[c].astype(object)
                          for c in TASK_COLUMNS})

    con = duckdb.connect(":memory:")
    try:
        con.register("io", left)
        con.register("tasks", right)
        picked = con.sql(_QUERY).df()
    finally:
        con.close()
    values = out.to_numpy(copy=True)
    values[picked["row"].to_numpy()] = picked["task_key"].to_numpy()
    return pd.Series(values, index=io.index, dtype=object)


def _ints(col: pd.Series) -> pd.Series:
    return pd.array(pd.to_numeric(col.astype(object).where(col.notna(), None)), dtype="Int64")
