"""The I/O summary of the charts page: the job summary a Darshan user expects, for any run's io rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from flowscope.analysis.io_summary import (
    SIZE_BUCKETS,
    IOSummary,
    io_summary,
    io_timeline,
)

HELP = ("What the run's I/O records add up to, as PyDarshan's job summary gives it for a Darshan log: bytes, "
        "operations and time per I/O interface (POSIX, MPI-IO, STDIO, HDF5..., or the source that recorded them), "
        "read / write against metadata time, access sizes, the largest files, the volume each rank moved and how "
        "unevenly, and the timed operations over time (Darshan DXT). Times are summed over ranks. Interfaces that "
        "sit on another (MPI-IO and HDF5 over POSIX) are shown but not added into the totals, so each byte counts "
        "once.")

TIMELINE_BINS = 200


def _fmt_bytes(n) -> str:
    from flowscope.report.formats import fmt_bytes

    return fmt_bytes(n)


def _fmt_s(x) -> str:
    return "unknown" if x is None or pd.isna(x) else f"{float(x):.3f} s"


def _cost_figure(s: IOSummary) -> go.Figure:
    df = s.by_interface
    fig = go.Figure()
    for col, name, color in (("read_s", "read", "#1f77b4"), ("write_s", "write", "#ff7f0e"),
                             ("meta_s", "metadata", "#7f7f7f")):
        fig.add_bar(x=df["interface"], y=df[col].astype(float).fillna(0), name=name, marker_color=color)
    fig.update_layout(barmode="stack", height=300, margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      title="time per interface (s, summed over ranks)", yaxis_title="seconds")
    return fig


def _sizes_figure(s: IOSummary) -> go.Figure:
    fig = go.Figure()
    for (iface, op), g in s.sizes.groupby(["interface", "op"], sort=True):
        g = g.set_index("bucket").reindex(list(SIZE_BUCKETS))["count"].fillna(0)
        fig.add_bar(x=list(SIZE_BUCKETS), y=g.to_numpy(), name=f"{iface} {op}")
    fig.update_layout(barmode="group", height=300, margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      title="access sizes (operations per size bucket, bytes)", yaxis_title="operations")
    return fig


def _ranks_figure(s: IOSummary) -> go.Figure:
    r = s.ranks
    fig = go.Figure()
    fig.add_bar(x=r["rank"], y=r["read_bytes"], name="read", marker_color="#1f77b4")
    fig.add_bar(x=r["rank"], y=r["write_bytes"], name="written", marker_color="#ff7f0e")
    if s.imbalance["mean_bytes"]:
        fig.add_hline(y=s.imbalance["mean_bytes"], line_dash="dot", annotation_text="mean")
    fig.update_layout(barmode="stack", height=300, margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      title="bytes per rank", xaxis_title="rank", yaxis_title="bytes")
    return fig


def _timeline_figure(run, interface: str, t0_ns: int) -> go.Figure | None:
    tl = io_timeline(run, bins=TIMELINE_BINS, interface=interface)
    if tl.empty:
        return None
    tl = tl.assign(rank=tl["rank"].astype("Float64").fillna(-1).astype(int))
    grid = tl.pivot_table(index="rank", columns="start_ns", values="nbytes", aggfunc="sum", fill_value=0.0)
    x = (grid.columns.to_numpy(dtype=np.int64) - t0_ns) / 1e9
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=x, y=[str(r) if r >= 0 else "no rank" for r in grid.index],
                               colorscale="Blues", colorbar={"title": "bytes"},
                               hovertemplate="t=%{x:.3f} s rank %{y}: %{z:.3s} B<extra></extra>"))
    fig.update_layout(height=min(120 + 14 * len(grid.index), 600), margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      title=f"{interface}: bytes per rank over time (each operation spread over the time it took)",
                      xaxis_title="seconds since the run's first event", yaxis_title="rank")
    return fig


def io_summary_blocks(ctx) -> tuple[str | None, list[dict]]:
    """The section's content, for the report and the dashboard's charts page alike: why the run has none (plain
    text, `backquoted` code), or its blocks in order, each ``{"kind": "facts", "facts": [(label, text)]}``,
    ``{"kind": "table", "title", "columns", "rows"}``, ``{"kind": "figures", "figures": [(id, figure)]}`` (side by
    side) or ``{"kind": "note", "text"}``."""
    s = io_summary(ctx.tables)
    if s.absent:
        return s.absent, []
    t, im = s.totals, s.imbalance
    facts = [("records", f"{s.rows:,} ({', '.join(s.sources)})"),
             ("read", f"{_fmt_bytes(t['read_bytes'])} in {t['reads']:,} operations"),
             ("written", f"{_fmt_bytes(t['write_bytes'])} in {t['writes']:,} operations"),
             ("files", f"{t['files']:,}"),
             ("data time (read + write)", _fmt_s(t["data_s"])), ("metadata time", _fmt_s(t["meta_s"]))]
    if im["ranks"]:
        facts.append(("per rank", (f"{im['ranks']} ranks, mean {_fmt_bytes(im['mean_bytes'])}, max "
                                   f"{_fmt_bytes(im['max_bytes'])} (rank {im['max_rank']}), max / mean "
                                   f"{im['max_over_mean']:.2f}, imbalance {100 * im['imbalance']:.1f} %")))
    if im["unattributed_bytes"]:
        facts.append(("not tied to a rank", (f"{_fmt_bytes(im['unattributed_bytes'])} (rows that name no rank: "
                                             "a file Darshan shared over all ranks with no DXT trace to split "
                                             "it, or a source that has no ranks)")))
    blocks: list[dict] = [{"kind": "facts", "facts": facts}]
    rows = [[i["interface"], f"{int(i['files']):,}", _fmt_bytes(i["read_bytes"]), _fmt_bytes(i["write_bytes"]),
             f"{int(i['reads']):,}", f"{int(i['writes']):,}", _fmt_s(i["read_s"]), _fmt_s(i["write_s"]),
             _fmt_s(i["meta_s"]),
             f"{int(i['read_only_files'])} / {int(i['write_only_files'])} / {int(i['read_write_files'])}",
             "yes" if i["in_totals"] else "no"]
            for i in s.by_interface.to_dict("records")]
    blocks.append({"kind": "table", "title": None, "rows": rows,
                   "columns": ["interface", "files", "read", "written", "reads", "writes", "read time", "write time",
                               "metadata time", "read-only / write-only / both", "in totals"]})
    figures = [("io-cost", _cost_figure(s))]
    if len(s.sizes):
        figures.append(("io-sizes", _sizes_figure(s)))
    blocks.append({"kind": "figures", "figures": figures, "side_by_side": True})
    if len(s.top_files):
        blocks.append({"kind": "table", "title": "Largest files",
                       "columns": ["file", "bytes", "read", "written", "data time", "metadata time", "interfaces"],
                       "rows": [[f["path"], _fmt_bytes(f["bytes"]), _fmt_bytes(f["read_bytes"]),
                                 _fmt_bytes(f["write_bytes"]), _fmt_s(f["data_s"]), _fmt_s(f["meta_s"]),
                                 f["interfaces"]] for f in s.top_files.to_dict("records")]})
    if len(s.ranks):
        blocks.append({"kind": "figures", "figures": [("io-ranks", _ranks_figure(s))]})
    for iface in s.timeline_interfaces:
        fig = _timeline_figure(ctx.tables, iface, ctx.t0)
        if fig is not None:
            blocks.append({"kind": "figures", "figures": [(f"io-timeline-{iface.lower().replace('/', '-')}", fig)]})
    if not s.timeline_interfaces:
        blocks.append({"kind": "note", "text": "No per-operation timeline: no record times each operation (Darshan's "
                                               "DXT module does: `DXT_ENABLE_IO_TRACE=1` when the job runs)."})
    return None, blocks
