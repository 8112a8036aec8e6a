"""The report's charts over time and size (tasks by state, I/O per thread, communication, warnings): for each, its
figure, its table, its help and why it may be missing, in one place, so that the HTML report and the dashboard's
charts page show the same thing. Texts are plain, with `backquoted` code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from flowscope.analysis.io_summary import IO_ABSENT
from flowscope.report import charts
from flowscope.report.context import Context
from flowscope.report.formats import fmt_bytes, fmt_duration, fmt_s

#: a table under a chart: (column names, the number of leading text columns or their indices, rows of cells)
Table = tuple[list[str], "int | set[int]", list[list]]


def io_table(ctx: Context) -> Table | None:
    """I/O records by source and operation."""
    if not ctx.counts.get("io"):
        return None
    df = ctx.sql("""SELECT source, op, count(*) AS n, sum(nbytes) AS bytes, count(DISTINCT path) AS paths
                        FROM io GROUP BY source, op ORDER BY source, op""")
    rows = [[r.source, r.op, f"{int(r.n):,}", fmt_bytes(r.bytes) if pd.notna(r.bytes) else "-",
             f"{int(r.paths):,}" if r.paths else "-"] for r in df.itertuples()]
    return ["source", "operation", "records", "bytes", "distinct paths"], 2, rows


def communication_table(ctx: Context) -> Table | None:
    """Transfers by locality (same host or not): count, bytes, time, bandwidth."""
    if not ctx.counts.get("transfers"):
        return None
    df = charts.transfers_frame(ctx, False)
    if df.empty:
        return None
    g = df.groupby("locality").agg(n=("ms", "size"), bytes=("nbytes", "sum"), ms=("ms", "sum"),
                                   median_ms=("ms", "median"))
    rows = []
    for loc, r in g.iterrows():
        bw = r["bytes"] / (r["ms"] / 1e3) if r["ms"] > 0 and r["bytes"] > 0 else None
        rows.append([loc, f"{int(r['n']):,}", fmt_bytes(r["bytes"]), fmt_s(r["ms"] / 1e3),
                     fmt_duration(r["median_ms"] / 1e3), f"{fmt_bytes(bw)}/s" if bw else "-"])
    return ["transfers", "count", "bytes", "total time", "median time", "bytes / time"], 1, rows


def warnings_table(ctx: Context) -> Table | None:
    """Warnings and errors by category: how many, the first one's time and message."""
    if not ctx.counts.get("logs"):
        return None
    df = ctx.sql("""SELECT category, level, count(*) AS n, min(ts_ns) AS first, arg_min(message, ts_ns) AS msg
                        FROM logs WHERE level IN ('warning', 'error') GROUP BY category, level
                        ORDER BY n DESC""")
    if df.empty:  # logs, but none a warning or an error
        return None
    rows = [[r.category, r.level, f"{int(r.n):,}",
             fmt_duration((int(r.first) - ctx.t0) / 1e9) if pd.notna(r.first) else "-",
             (r.msg[:160] + "…") if isinstance(r.msg, str) and len(r.msg) > 160 else (r.msg or "")]
            for r in df.itertuples()]
    return ["category", "level", "count", "first at", "first message"], {0, 1, 4}, rows


def utilisation_table(ctx: Context, limit: int = 50) -> tuple[list[str], int, list[list], int] | None:
    """Per executing resource, busiest first (the first ``limit``): its label, slots, utilisation and the share of
    its slot-time in each category; and how many more resources there are."""
    from flowscope.analysis.timeline import BUSY_CATEGORIES, utilisation_by_resource

    u = utilisation_by_resource(ctx.tables)
    if u.empty:
        return None
    u = u.sort_values("busy_ns", ascending=False)
    cats = [c for c in (*BUSY_CATEGORIES, "idle") if u[f"{c}_ns"].sum() > 0]
    rows = []
    for r in u.head(limit).to_dict("records"):
        # (more ran than its slots hold over the window: no share of a capacity that was not it, its seconds)
        cap = (r["slots"] or 0) * r["window_ns"] if not r["over_capacity"] else 0
        shares = [f"{100 * r[f'{c}_ns'] / cap:.1f} %" if cap else fmt_s(r[f"{c}_ns"] / 1e9) for c in cats]
        util = "over its slots" if r["over_capacity"] else \
            f"{100 * r['utilisation']:.1f} %" if r["utilisation"] is not None else "unknown"
        rows.append([ctx.rid_label(r["resource_id"]), r["slots"] if r["slots"] is not None else "?", util, *shares])
    return ["resource", "slots", "utilisation", *cats], 1, rows, max(0, len(u) - limit)


@dataclass(frozen=True)
class ChartSection:
    """One chart: its title, help, the reason given when the run has no data for it (``nodata``), the one given
    when it has rows but none can be drawn (``no_chart``), and how to make its figure and table."""

    title: str
    help: str
    nodata: str
    figure: Callable[[Context], go.Figure | None]
    table: Callable[[Context], Table | None] = lambda ctx: None
    no_chart: str = ""


CHART_SECTIONS: dict[str, ChartSection] = {
    "task-states": ChartSection(
        "Tasks by state over time",
        "How many tasks were waiting for their inputs, queued (ready, waiting for a worker) and running at each "
        "moment, stacked, from the workflow system's own task states; the blue line is the slots of the executing "
        "resources busy, the dashed one all of them (the SOMA dissertation's resource-utilisation view): "
        "queued tasks above idle slots mean the scheduler, not the capacity, held the work back. Running is as the "
        "scheduler reports it: Dask's processing means assigned to a worker, which may hold more tasks than it has "
        "threads, so it can exceed the slots; the blue line is what the slots ran.",
        "no task states in this run. They come from the workflow system's scheduler: Dask's (recorded by "
        "`flowscope run` and `observe()` on a distributed cluster) and Parsl's DataFlowKernel (`flowscope import "
        "monitoring.db`); traces of other tools carry none.",
        charts.task_phases),
    "io": ChartSection(
        "I/O per thread",
        "File-system reads (▼) and writes (▲) of each thread over time, one mark per I/O record placed at the "
        "middle of its interval (for per-task counters: of the task), darker for more bytes (log scale). "
        "Grey dots are files opened. Rows are the threads of the task stream. With more than 10,000 records, "
        "one mark per thread, operation and time bin (600 over the run) carries the bin's count and bytes.",
        IO_ABSENT, charts.io_over_time, io_table,
        "None of the I/O records is a read, a write or a file open: the table below counts them."),
    "communication": ChartSection(
        "Communication: time vs size",
        "Each transfer between workers: its duration against its size, on log axes. Points on one diagonal move "
        "data at the same bandwidth; points high above the others at small sizes are latency-bound. Red: the two "
        "workers were on different hosts; blue: the same host.",
        "no transfers in this run. They come from data moved between Dask workers, MPI messages in an OTF2 "
        "trace, Paje links (StarPU's data transfers, SimGrid's communications) and Chrome / Perfetto flows.",
        charts.communication, communication_table,
        "No transfer has both a size and a duration, so none can be placed on the chart: Chrome / Perfetto "
        "flows and Paje links record that one piece of work led to another, not the bytes moved; "
        "MPI messages (OTF2) and Dask's transfers carry both."),
    "warnings": ChartSection(
        "Warnings over time",
        "Warnings and errors the run logged (event loop unresponsive, long garbage collections, memory pauses, "
        "task errors...), one row per category, at the time they happened.",
        "no warnings or errors in this run. They come from what a Dask run logs (event loop unresponsive, "
        "garbage collection, memory pauses, task errors) and from `Client.log(..., level=\"warning\")`.",
        charts.warnings, warnings_table),
}
