"""How computation, communication and I/O add up in a run, and per-task-group statistics."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from flowscope.store.run import Run


# Said wherever I/O time is unknown (``Breakdown.io_s is None``).
IO_TIME_UNKNOWN = ("I/O time unknown: the run's I/O records carry bytes and file names, not durations (the "
                   "per-task /proc counters count bytes; the open audit hook notes when a file is opened). "
                   "I/O time comes from records that time each operation: Darshan DXT traces "
                   "(`flowscope import job.darshan --run RUN`), Dask's spill spans, or an I/O tracer's timed "
                   "events (Chrome/Perfetto, OTF2).")


@dataclass
class Breakdown:
    """Totals per category. Seconds are summed over resources (a busy 4-thread worker for 1 s counts 4 s);
    ``makespan_s`` is the observed wall-clock extent of the tasks. ``io_s`` is None when I/O was recorded
    but no record carries the time it took (see ``IO_TIME_UNKNOWN``)."""

    compute_s: float
    communication_s: float
    communication_bytes: int
    io_s: float | None          # timed I/O: spill (disk-read/write spans) and I/O records with a duration
    io_read_bytes: int
    io_write_bytes: int
    tasks: int
    transfers: int
    makespan_s: float
    io_untimed: int = 0         # read/write records with bytes but no duration (per-task counters)

    def to_frame(self) -> pd.DataFrame:
        """One row per category (compute, communication, io) with seconds, bytes and count."""
        return pd.DataFrame([
            {"category": "compute", "seconds": self.compute_s, "bytes": None, "count": self.tasks},
            {"category": "communication", "seconds": self.communication_s, "bytes": self.communication_bytes,
             "count": self.transfers},
            {"category": "io", "seconds": self.io_s, "bytes": self.io_read_bytes + self.io_write_bytes,
             "count": None},
        ])


def breakdown(run: Run) -> Breakdown:
    """Computation (task spans), communication (transfers) and I/O (spill spans, io records) of ``run``; the
    I/O time is None when the run has I/O records but none with a duration (bytes only)."""
    row = run.sql("""
        WITH t AS (SELECT count(*) AS n, coalesce(sum(end_ns - start_ns), 0) AS d,
                          min(start_ns) AS t0, max(end_ns) AS t1 FROM spans WHERE kind = 'task'),
             x AS (SELECT count(*) AS n, coalesce(sum(end_ns - start_ns), 0) AS d,
                          coalesce(sum(nbytes), 0) AS b FROM transfers),
             s AS (SELECT count(*) AS n, coalesce(sum(end_ns - start_ns), 0) AS d FROM spans
                   WHERE kind IN ('disk-read', 'disk-write', 'io')),
             i AS (SELECT coalesce(sum(CASE WHEN op = 'read' THEN nbytes END), 0) AS r,
                          coalesce(sum(CASE WHEN op = 'write' THEN nbytes END), 0) AS w,
                          count(*) FILTER (WHERE op IN ('read', 'write') AND end_ns IS NOT NULL
                                           AND source <> 'proc-io') AS timed,
                          count(*) AS n,
                          count(*) FILTER (WHERE op IN ('read', 'write') AND (end_ns IS NULL
                                           OR source = 'proc-io')) AS untimed,
                          coalesce(sum(CASE WHEN op IN ('read', 'write') AND end_ns IS NOT NULL
                                            AND source <> 'proc-io' THEN end_ns - start_ns END), 0) AS d
                   FROM io)
        SELECT t.n AS tasks, t.d AS compute_ns, t.t0, t.t1, x.n AS transfers, x.d AS comm_ns, x.b AS comm_bytes,
               s.d + i.d AS io_ns, s.n + i.timed AS io_timed, i.n AS io_records, i.untimed, i.r AS read_bytes,
               i.w AS write_bytes
        FROM t, x, s, i""").iloc[0]
    makespan = (int(row["t1"]) - int(row["t0"])) / 1e9 if pd.notna(row["t0"]) else 0.0
    # I/O was recorded, but none of it with the time it took: unknown, not zero
    io_s = None if int(row["io_records"]) and not int(row["io_timed"]) else int(row["io_ns"]) / 1e9
    return Breakdown(
        compute_s=int(row["compute_ns"]) / 1e9, communication_s=int(row["comm_ns"]) / 1e9,
        communication_bytes=int(row["comm_bytes"]), io_s=io_s,
        io_read_bytes=int(row["read_bytes"]), io_write_bytes=int(row["write_bytes"]),
        tasks=int(row["tasks"]), transfers=int(row["transfers"]), makespan_s=makespan,
        io_untimed=int(row["untimed"]))


def task_groups(run: Run, kind: str = "task") -> pd.DataFrame:
    """Per span name (a Dask task prefix): count, total, mean, std, coefficient of variation, max, in seconds;
    sorted by total time, largest first."""
    df = run.sql("""
        SELECT name AS "group", count(*) AS count, sum(end_ns - start_ns) / 1e9 AS total_s,
               avg(end_ns - start_ns) / 1e9 AS mean_s, coalesce(stddev_samp(end_ns - start_ns), 0) / 1e9 AS std_s,
               max(end_ns - start_ns) / 1e9 AS max_s
        FROM spans WHERE kind = ? GROUP BY name ORDER BY total_s DESC""", [kind])
    df["cv"] = (df["std_s"] / df["mean_s"]).where(df["mean_s"] > 0, 0.0)
    return df
