"""The report's Plotly figures, one small function each, built from the canonical tables.

Every function returns a ``plotly.graph_objects.Figure``, or ``None`` when the run has no rows for it.
Aggregation happens in DuckDB (SQL over the run's views); per-row work is vectorised with numpy. Times are seconds since
the run's first event, rounded to microseconds. Above ``HOVER_TEXT_UP_TO`` points a chart drops per-point
hover text, above ``WEBGL_ABOVE`` it is drawn with WebGL (``Scattergl``), so a 100,000-task run stays small and
interactive. The dashboard's charts page draws them (``report/chart_sections.py``).
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from flowscope.report.context import Context

WEBGL_ABOVE = 10_000      # points beyond which a trace is drawn with WebGL
HOVER_TEXT_UP_TO = 5_000  # per-point hover text (task key, path...) only up to this many points
MAX_SCATTER = 50_000      # points in the communication scatter; more are sampled
FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif'

TEMPLATE = go.layout.Template(layout=dict(
    font=dict(family=FONT, size=12, color="#222"),
    paper_bgcolor="white", plot_bgcolor="white",
    xaxis=dict(gridcolor="#ececec", linecolor="#999", zeroline=False, ticks="outside", tickcolor="#999",
               automargin=True),
    yaxis=dict(gridcolor="#ececec", linecolor="#999", zeroline=False, ticks="outside", tickcolor="#999",
               automargin=True),
    hoverlabel=dict(font=dict(family=FONT)),
    colorway=["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"],
))


def _layout(fig: go.Figure, height: int, **kw) -> go.Figure:
    opts = dict(template=TEMPLATE, height=height, margin=dict(l=10, r=10, t=36, b=44),
                legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, xanchor="left"), hovermode="closest")
    opts.update(kw)
    fig.update_layout(**opts)
    return fig


def _time_axis(ctx: Context) -> dict:
    when = pd.Timestamp(ctx.t0, unit="ns", tz="UTC").strftime("%Y-%m-%d %H:%M:%S UTC") if ctx.t0_ns else "start"
    return dict(title=dict(text=f"seconds since the first event ({when})", standoff=6), range=ctx.x_range())


def _scatter(n_points: int):
    return go.Scattergl if n_points > WEBGL_ABOVE else go.Scatter


def _seconds(us: np.ndarray) -> np.ndarray:
    return np.asarray(us, dtype=np.float64) / 1e6


def _esc(text: str) -> str:
    return html.escape(str(text), quote=False)


# ---- I/O ----------------------------------------------------------------------------------------------------

IO_BINS = 600  # time bins per thread when there are too many I/O records to draw one mark each


def io_over_time(ctx: Context) -> go.Figure | None:
    """Reads and writes per thread over time: one mark per I/O record at the middle of its interval, its
    opacity growing with the bytes moved (log scale); file opens as small grey dots. Beyond ``WEBGL_ABOVE``
    records, one mark per thread, operation and time bin (``IO_BINS`` over the run) with the bin's totals."""
    if not ctx.counts.get("io"):
        return None
    t0 = ctx.t0
    attributed = """
        WITH th AS (SELECT resource_id, host, pid, tid FROM resources WHERE kind = 'thread' AND tid IS NOT NULL),
        x AS (SELECT io.*, coalesce(io.resource_id,
                     (SELECT any_value(th.resource_id) FROM th WHERE th.pid = io.pid AND th.tid = io.tid
                      AND (io.host IS NULL OR th.host = io.host)),
                     'unattributed') AS rid,
                     (start_ns + coalesce(end_ns, start_ns)) // 2 - %d AS mid_ns
              FROM io WHERE op IN ('read', 'write', 'open'))""" % t0
    n = int(ctx.sql(attributed + " SELECT count(*) AS n FROM x")["n"].iloc[0])
    if n == 0:
        return None
    small = n <= HOVER_TEXT_UP_TO
    binned = n > WEBGL_ABOVE
    if binned:
        width_ns = max(1000, int(ctx.extent_s * 1e9 / IO_BINS) + 1)
        df = ctx.sql(attributed + f"""
            SELECT rid, op, count(*) AS n, coalesce(sum(nbytes), 0) AS nbytes,
                   (mid_ns // {width_ns}) * {width_ns // 1000} + {width_ns // 2000} AS t
            FROM x GROUP BY rid, op, mid_ns // {width_ns} ORDER BY rid, op, t""")
    else:
        df = ctx.sql(attributed + f"""
            SELECT rid, op, 1 AS n, coalesce(nbytes, 0) AS nbytes, mid_ns // 1000 AS t
                   {", task_key, path" if small else ""}
            FROM x ORDER BY rid, t, op, nbytes{", task_key, path" if small else ""}""")
    rows = ctx.rows(df["rid"])
    index = pd.Index(rows["resource_id"])
    row = index.get_indexer(df["rid"]).astype(np.float32)
    t = _seconds(df["t"].to_numpy())
    nbytes = df["nbytes"].to_numpy(np.float64)
    count = df["n"].to_numpy(np.float64)
    op = df["op"].astype(object).to_numpy()
    Scatter = _scatter(len(df))
    fig = go.Figure()
    rw = np.isin(op, ("read", "write"))
    top = np.log1p(nbytes[rw].max()) if rw.any() else 1.0
    for name, symbol, color, dy in (("read", "triangle-down", "#1f77b4", -0.18),
                                    ("write", "triangle-up", "#ff7f0e", 0.18)):
        sel = op == name
        if not sel.any():
            continue
        opacity = 0.12 + 0.88 * np.log1p(nbytes[sel]) / (top or 1.0)
        if binned:
            kw = dict(customdata=np.stack([nbytes[sel], count[sel]], axis=1),
                      hovertemplate=f"%{{customdata[1]}} {name}s, %{{customdata[0]:.3s}}B around %{{x:.3f}} s"
                                    "<extra></extra>")
        elif small:
            keys = df["task_key"].astype(object).to_numpy()[sel]
            kw = dict(customdata=nbytes[sel], text=[_esc(k) if isinstance(k, str) else "" for k in keys],
                      hovertemplate=f"{name} %{{customdata:.3s}}B<br>%{{text}}<br>%{{x:.6f}} s<extra></extra>")
        else:
            kw = dict(customdata=nbytes[sel], hovertemplate=f"{name} %{{customdata:.3s}}B at %{{x:.6f}} s"
                                                            "<extra></extra>")
        fig.add_trace(Scatter(x=t[sel], y=row[sel] + dy, mode="markers", name=f"{name}s",
                              marker=dict(symbol=symbol, size=9, color=color, opacity=opacity.astype(np.float32),
                                          line=dict(width=0)), **kw))
    sel = op == "open"
    if sel.any():
        if binned:
            kw = dict(customdata=count[sel], hovertemplate="%{customdata} opens around %{x:.3f} s<extra></extra>")
        elif small:
            paths = df["path"].astype(object).to_numpy()[sel]
            kw = dict(text=[_esc(p) if isinstance(p, str) else "" for p in paths],
                      hovertemplate="open %{text}<br>%{x:.6f} s<extra></extra>")
        else:
            kw = dict(hovertemplate="open at %{x:.6f} s<extra></extra>")
        fig.add_trace(Scatter(x=t[sel], y=row[sel], mode="markers", name="file opens",
                              marker=dict(size=4, color="#888", opacity=0.6), **kw))
    nrows = len(rows)
    row_px = int(min(30, max(8, 700 / max(nrows, 1))))
    fig.update_yaxes(tickmode="array", tickvals=list(range(nrows)), ticktext=[_esc(t) for t in rows["label"]],
                     autorange=False, range=[nrows - 0.5, -0.5], showgrid=False, automargin=True)
    fig.update_xaxes(**_time_axis(ctx))
    return _layout(fig, int(min(1200, max(240, 110 + nrows * row_px))))


# ---- communication ----------------------------------------------------------------------------------------

COMM_COLORS = {"intra-host": "#1f77b4", "inter-host": "#d62728", "unknown": "#7f7f7f"}


def transfers_frame(ctx: Context, with_text: bool) -> pd.DataFrame:
    """Transfers with their duration, size and whether they crossed hosts (the source's ``inter_host``
    attribute, else the two resources' hosts)."""
    extra = ", t.src_resource_id AS src, t.dst_resource_id AS dst, len(t.keys) AS n_keys" if with_text else ""
    return ctx.sql(f"""
        SELECT t.nbytes, (t.end_ns - t.start_ns) / 1e6 AS ms,
               CASE coalesce(TRY_CAST(json_extract_string(t.attrs, '$.inter_host') AS BOOLEAN),
                             CASE WHEN s.host IS NULL OR d.host IS NULL THEN NULL ELSE s.host <> d.host END)
                    WHEN true THEN 'inter-host' WHEN false THEN 'intra-host' ELSE 'unknown' END AS locality{extra}
        FROM transfers t
        LEFT JOIN resources s ON s.resource_id = t.src_resource_id
        LEFT JOIN resources d ON d.resource_id = t.dst_resource_id
        ORDER BY t.start_ns, t.end_ns, t.src_resource_id, t.dst_resource_id, t.nbytes""")


def _ticks_125(lo: float, hi: float) -> list[float]:
    """1-2-5 tick values covering [lo, hi] (positive), for a log axis labelled with plain numbers."""
    out = []
    for exp in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1):
        out += [m * 10.0 ** exp for m in (1, 2, 5)]
    inside = [t for t in out if lo / 2 <= t <= hi * 2]
    return [round(t, 12) for t in (inside or out)]


def communication(ctx: Context) -> go.Figure | None:
    """Each transfer's duration against its size, log-log, intra-host vs inter-host."""
    n = ctx.counts.get("transfers", 0)
    if not n:
        return None
    small = n <= HOVER_TEXT_UP_TO
    df = transfers_frame(ctx, small)
    df = df[(df["nbytes"].fillna(0) > 0) & (df["ms"] > 0)]
    if df.empty:
        return None
    title = None
    if len(df) > MAX_SCATTER:  # a uniform random sample keeps the shape of the cloud and the file small
        title = f"{MAX_SCATTER:,} of {len(df):,} transfers (a uniform random sample)"
        df = df.sample(MAX_SCATTER, random_state=0)
    Scatter = _scatter(len(df))
    fig = go.Figure()
    for loc, part in df.groupby("locality", sort=True):
        kw = {}
        if small:
            kw = dict(text=[_esc(f"{ctx.rid_label(s)} → {ctx.rid_label(d)}, {k} keys")
                            for s, d, k in zip(part["src"], part["dst"], part["n_keys"])],
                      hovertemplate=f"{loc}: %{{text}}<br>%{{x:.3s}}B in %{{y:.3f}} ms<extra></extra>")
        else:
            kw = dict(hovertemplate=f"{loc}<br>%{{x:.3s}}B in %{{y:.3f}} ms<extra></extra>")
        fig.add_trace(Scatter(x=part["nbytes"].to_numpy(np.float64), y=part["ms"].to_numpy(np.float64),
                              mode="markers", name=f"{loc} ({len(part):,})",
                              marker=dict(color=COMM_COLORS.get(loc, "#7f7f7f"), size=7, opacity=0.65), **kw))
    fig.update_xaxes(type="log", title=dict(text="bytes moved", standoff=6), exponentformat="SI")
    ticks = _ticks_125(float(df["ms"].min()), float(df["ms"].max()))
    fig.update_yaxes(type="log", title=dict(text="duration, ms", standoff=6), tickmode="array", tickvals=ticks,
                     ticktext=[f"{t:g}" for t in ticks])
    if title:
        fig.update_layout(title=dict(text=title, font=dict(size=12), x=1, xanchor="right", y=0.98))
    return _layout(fig, 380, showlegend=True)


# ---- warnings ---------------------------------------------------------------------------------------------

LEVEL_COLORS = {"warning": "#ff7f0e", "error": "#d62728"}


def warnings(ctx: Context) -> go.Figure | None:
    """Warnings and errors over time, one row per category; binned counts when there are many."""
    if not ctx.counts.get("logs"):
        return None
    t0 = ctx.t0
    n = int(ctx.sql("SELECT count(*) AS n FROM logs WHERE level IN ('warning', 'error')")["n"].iloc[0])
    if n == 0:
        return None
    fig = go.Figure()
    if n <= HOVER_TEXT_UP_TO:
        df = ctx.sql(f"""SELECT (ts_ns - {t0}) // 1000 AS t, level, category, message, resource_id
                         FROM logs WHERE level IN ('warning', 'error') ORDER BY ts_ns""")
        cats = sorted(df["category"].astype(str).unique(), key=str)
        for level, part in df.groupby("level", sort=True):
            text = [_esc(f"{m[:200] if isinstance(m, str) else ''} ({ctx.rid_label(r) if isinstance(r, str) else '?'})")
                    for m, r in zip(part["message"], part["resource_id"])]
            fig.add_trace(go.Scatter(x=_seconds(part["t"].to_numpy()), y=part["category"].astype(str).tolist(),
                                     mode="markers", name=level, text=text,
                                     marker=dict(color=LEVEL_COLORS.get(level, "#555"), size=10,
                                                 symbol="x" if level == "error" else "diamond", opacity=0.8),
                                     hovertemplate=f"{level}: %{{y}}<br>%{{text}}<br>%{{x:.3f}} s<extra></extra>"))
    else:
        width_ns = max(1000, int(ctx.extent_s * 1e9 / 200) + 1)
        df = ctx.sql(f"""SELECT category, level, (ts_ns - {t0}) // {width_ns} AS b, count(*) AS n
                         FROM logs WHERE level IN ('warning', 'error') GROUP BY ALL ORDER BY b""")
        cats = sorted(df["category"].astype(str).unique(), key=str)
        w = width_ns / 1e9
        for (level, cat), part in df.groupby(["level", "category"], sort=True):
            fig.add_trace(go.Bar(x=(part["b"].to_numpy(np.float64) + 0.5) * w, y=part["n"].to_numpy(np.float64),
                                 width=w, name=f"{cat} ({level})",
                                 hovertemplate=f"{_esc(cat)} ({level})<br>%{{x:.3f}} s: %{{y}}<extra></extra>"))
        fig.update_layout(barmode="stack", bargap=0)
        fig.update_yaxes(title=dict(text="events per bin", standoff=6))
        cats = []
    if cats:
        fig.update_yaxes(type="category", categoryorder="array", categoryarray=cats, automargin=True)
    fig.update_xaxes(**_time_axis(ctx))
    height = 200 + 28 * len(cats) if cats else 320
    return _layout(fig, int(min(700, height)), showlegend=True)


PHASE_COLORS = {"running": "#2ca02c", "queued": "#ff7f0e", "waiting": "#9e9e9e"}


def task_phases(ctx: Context) -> go.Figure | None:
    """Tasks waiting, queued and running over time (the workflow system's states, by their phase), with the
    executing resources' busy slots and all their slots: the SOMA dissertation's resource-utilisation view."""
    if not ctx.counts.get("transitions"):
        return None
    from flowscope.analysis.task_phases import PHASES_OVER_TIME, phases_over_time

    df = phases_over_time(ctx.run, bins=300)
    if not len(df):
        return None
    x = ((df["start_ns"].to_numpy(np.int64) + df["end_ns"].to_numpy(np.int64)) / 2 - ctx.t0) / 1e9
    fig = go.Figure()
    for p in reversed(PHASES_OVER_TIME):  # running at the bottom of the stack
        fig.add_trace(go.Scatter(x=x, y=df[p].to_numpy(np.float64), name=f"tasks {p}", mode="lines",
                                 stackgroup="tasks", line=dict(width=0.5, color=PHASE_COLORS[p]),
                                 hovertemplate=f"%{{x:.3f}} s: %{{y:.2f}} tasks {p}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=df["busy"].to_numpy(np.float64), name="slots busy", mode="lines",
                             line=dict(color="#1f77b4", width=1.5),
                             hovertemplate="%{x:.3f} s: %{y:.2f} slots busy<extra></extra>"))
    slots = df["slots"].iloc[0]
    if slots is not None and not pd.isna(slots):
        fig.add_trace(go.Scatter(x=[x[0], x[-1]], y=[float(slots)] * 2, name=f"slots ({int(slots)})", mode="lines",
                                 line=dict(color="#222", dash="dash", width=1),
                                 hovertemplate=f"{int(slots)} slots<extra></extra>"))
    fig.update_xaxes(**_time_axis(ctx))
    fig.update_yaxes(title=dict(text="tasks / slots (mean per bin)", standoff=6), rangemode="tozero")
    return _layout(fig, 320, showlegend=True, hovermode="x unified")
