"""How computation, communication, I/O, waiting, runtime overhead and idleness add up in a run, and per-group
statistics, for any source (the semantic vocabulary, model/semantics.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from flowscope.analysis.io_summary import IO_TOTALS_SQL
from flowscope.analysis.timeline import (
    BUSY_CATEGORIES,
    IO_UNIT,
    resource_states,
    utilisation_by_resource,
    work_unit_kind,
)
from flowscope.store.run import Run

# Said wherever I/O time is unknown (``Breakdown.io_s is None``).
IO_TIME_UNKNOWN = ("I/O time unknown: the run's I/O records carry bytes and file names, not durations (the "
                   "per-task /proc counters count bytes; the open audit hook notes when a file is opened). "
                   "I/O time comes from records that time each operation: Darshan DXT traces "
                   "(`flowscope import job.darshan --run RUN`), Dask's spill spans, or an I/O tracer's timed "
                   "events (Chrome/Perfetto, OTF2).")


@dataclass
class Breakdown:
    """Where the run's time went, by category of the semantic vocabulary (model/semantics.py).

    Seconds are slot-time summed over the executing resources (a busy 4-thread worker for 1 s counts 4 s),
    taken from their state timeline (:func:`flowscope.analysis.timeline.resource_states`: the innermost span
    wins, so nested calls are not counted twice). ``communication_s`` is the executors' communication time;
    a run whose executors record none (Dask fetches data on the worker's event loop, not on the threads that
    run tasks) counts its transfers' durations instead. ``io_s`` adds the I/O spans of resources that do not
    execute (a Dask worker's spill) and the I/O records that carry a duration; it is None when I/O was recorded
    but no record carries the time it took (see ``IO_TIME_UNKNOWN``). ``idle_s`` is capacity unused: gaps,
    idle states and unused slots. ``makespan_s`` is the extent of the executing resources' timed work: their spans,
    or in a run whose only timed work is I/O operations (a Darshan log with DXT), those, from the first to the
    last; ``io_s`` then counts the I/O records (each byte and second once, as above: a Darshan log's per-file
    counters), not the timeline's I/O state, which is the same operations; ``idle_s`` is the ranks' capacity
    outside their operations (per resource, the union of its operations)."""

    compute_s: float
    communication_s: float
    communication_bytes: int
    io_s: float | None          # timed I/O: I/O states and spans, and I/O records with a duration
    io_read_bytes: int
    io_write_bytes: int
    tasks: int
    transfers: int
    makespan_s: float
    io_untimed: int = 0         # read/write records with bytes but no duration (per-task counters)
    wait_s: float = 0.0
    runtime_s: float = 0.0
    other_s: float = 0.0
    idle_s: float = 0.0
    transfer_s: float = 0.0     # the transfers' durations (data in flight), whatever communication_s counts
    executors: int = 0          # executing resources with activity
    categories: dict[str, float] = field(default_factory=dict)  # seconds per category, non-zero ones

    def to_frame(self) -> pd.DataFrame:
        """One row per category (compute, communication, io, then wait, runtime, other, idle when the run has
        them) with seconds, bytes and count."""
        rows = [
            {"category": "compute", "seconds": self.compute_s, "bytes": None, "count": self.tasks},
            {"category": "communication", "seconds": self.communication_s, "bytes": self.communication_bytes,
             "count": self.transfers},
            {"category": "io", "seconds": self.io_s, "bytes": self.io_read_bytes + self.io_write_bytes,
             "count": None},
        ]
        for c in ("wait", "runtime", "other", "idle"):
            if getattr(self, f"{c}_s"):
                rows.append({"category": c, "seconds": getattr(self, f"{c}_s"), "bytes": None, "count": None})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        return asdict(self)


def breakdown(run: Run) -> Breakdown:
    """Compute, communication, I/O, wait, runtime overhead and idle time of ``run`` (see :class:`Breakdown`). I/O
    counts each byte once: rows that other rows already count (``attrs.in_totals = false``) are left out, and an
    aggregate row counts the time its operations took (``attrs.busy_ns``), not its window
    (``io_summary.IO_TOTALS_SQL``)."""
    states = resource_states(run)
    window_ns = int(states["end_ns"].max() - states["start_ns"].min()) if len(states) else 0
    return breakdown_of(run, utilisation_by_resource(run, states), window_ns,
                        int((states["state"] == "io").sum()) if len(states) else 0)


def breakdown_of(run: Run, util: pd.DataFrame, window_ns: int, io_states: int) -> Breakdown:
    """:func:`breakdown` from the executing resources' timeline, summed up: ``util``
    (:func:`~flowscope.analysis.timeline.utilisation_by_resource`), the timeline's extent ``window_ns`` and its
    number of ``io`` state rows; the rest is read from ``run``'s tables."""
    slot_ns = {c: int(util[f"{c}_ns"].sum()) if len(util) else 0 for c in (*BUSY_CATEGORIES, "idle")}
    row = run.sql(f"""
        WITH t AS (SELECT count(*) AS n FROM activity WHERE role = 'task'),
             x AS (SELECT count(*) AS n, coalesce(sum(end_ns - start_ns), 0) AS d,
                          coalesce(sum(nbytes), 0) AS b FROM transfers),
             s AS (SELECT count(*) AS n, coalesce(sum(a.end_ns - a.start_ns), 0) AS d FROM activity a
                   LEFT JOIN executors e ON e.resource_id = a.resource_id
                   WHERE a.category = 'io' AND e.executes IS NOT DISTINCT FROM FALSE),
             i AS (SELECT coalesce(sum(CASE WHEN op = 'read' THEN nbytes END), 0) AS r,
                          coalesce(sum(CASE WHEN op = 'write' THEN nbytes END), 0) AS w,
                          count(*) FILTER (WHERE op IN ('read', 'write') AND end_ns IS NOT NULL
                                           AND source <> 'proc-io') AS timed,
                          count(*) AS n,
                          count(*) FILTER (WHERE op IN ('read', 'write') AND (end_ns IS NULL
                                           OR source = 'proc-io')) AS untimed,
                          coalesce(sum(CASE WHEN op IN ('read', 'write') AND end_ns IS NOT NULL
                                            AND source <> 'proc-io' THEN end_ns - start_ns END), 0) AS d
                   FROM ({IO_TOTALS_SQL}))
        SELECT t.n AS tasks, x.n AS transfers, x.d AS comm_ns, x.b AS comm_bytes,
               s.d + i.d AS io_ns, s.n + i.timed AS io_timed, i.n AS io_records, i.untimed, i.r AS read_bytes,
               i.w AS write_bytes
        FROM t, x, s, i""").iloc[0]
    io_ns = int(row["io_ns"]) + slot_ns["io"]
    io_timed = int(row["io_timed"]) + io_states
    if work_unit_kind(run) == IO_UNIT:
        # the timeline is the I/O records themselves: I/O time is what the records count (each byte and second
        # once, IO_TOTALS_SQL), not that again as the timeline's I/O state
        io_ns = int(row["io_ns"])
    # I/O was recorded, but none of it with the time it took: unknown, not zero
    io_s = None if int(row["io_records"]) and not io_timed else io_ns / 1e9
    comm_ns = slot_ns["communication"] or int(row["comm_ns"])
    b = Breakdown(
        compute_s=slot_ns["compute"] / 1e9, communication_s=comm_ns / 1e9,
        communication_bytes=int(row["comm_bytes"]), io_s=io_s,
        io_read_bytes=int(row["read_bytes"]), io_write_bytes=int(row["write_bytes"]),
        tasks=int(row["tasks"]), transfers=int(row["transfers"]), makespan_s=window_ns / 1e9,
        io_untimed=int(row["untimed"]), wait_s=slot_ns["wait"] / 1e9, runtime_s=slot_ns["runtime"] / 1e9,
        other_s=slot_ns["other"] / 1e9, idle_s=slot_ns["idle"] / 1e9, transfer_s=int(row["comm_ns"]) / 1e9,
        executors=len(util))
    b.categories = {c: v for c, v in (("compute", b.compute_s), ("communication", b.communication_s),
                                      ("io", b.io_s or 0.0), ("wait", b.wait_s), ("runtime", b.runtime_s),
                                      ("other", b.other_s), ("idle", b.idle_s)) if v}
    return b


#: the roles whose spans :func:`task_groups` groups when it is not told which, in this order of preference (a run
#: whose spans are all ``other``, e.g. a Chrome trace of async slices only, still gets its groups)
GROUPED_ROLES = ("task", "call", "state", "other")


def task_groups(run: Run, role: str | None = None) -> pd.DataFrame:
    """Per group (a Dask task prefix, a StarPU codelet, an MPI function) of the spans with ``role`` (default:
    the first of :data:`GROUPED_ROLES` the run has): its role and category, count, total, mean, std,
    coefficient of variation and max in seconds; sorted by total time, largest first."""
    if role is None:
        have = set(run.sql("SELECT DISTINCT role FROM activity")["role"])
        role = next((r for r in GROUPED_ROLES if r in have), "task")
    df = run.sql("""
        SELECT "group", any_value(role) AS role, mode(category) AS category, count(*) AS count,
               sum(end_ns - start_ns) / 1e9 AS total_s, avg(end_ns - start_ns) / 1e9 AS mean_s,
               coalesce(stddev_samp(end_ns - start_ns), 0) / 1e9 AS std_s, max(end_ns - start_ns) / 1e9 AS max_s
        FROM activity WHERE role = ? GROUP BY "group" ORDER BY total_s DESC, "group"
    """, [role])
    df["cv"] = (df["std_s"] / df["mean_s"]).where(df["mean_s"] > 0, 0.0)
    return df
