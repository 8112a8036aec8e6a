"""The dashboard's task stream in the browser: which front-end draws a 100,000-task run fluidly.

One synthetic run of a realistic shape (seeded): 20 hosts x 4-8 worker threads, 100,000 tasks of 1 ms - 2 s
(log-normal per task group, 30 groups that follow each other in phases, a few tasks of 5-15 s), small gaps
and idle time spread so that every thread works until about the end,
10 % of the tasks fed by an incoming transfer from another thread (drawn as a line between the two threads),
and a live delta of 1,000 more tasks after the end. Every candidate gets exactly these tasks, served by a
loopback HTTP server (no CDN: every asset comes from the installed packages), in Debian's headless chromium
driven by Playwright:

* ``plotly_report`` -- the static report's stream as it is today (``flowscope.report.stream``: compact columns,
  tasks narrower than a pixel merged per row and pixel on every zoom, Plotly lines, WebGL above 30,000 points),
  its JS used verbatim except for two hooks the bench adds (read the columns; append a delta). Transfers as
  one extra line trace. It carries no task keys, as the report does not above 5,000 tasks.
* ``bokeh_dask`` -- BokehJS standalone drawing the stream the way Dask's dashboard does
  (``distributed.dashboard.components.scheduler.task_stream_figure``: one ``rect`` per task with a 3 px
  outline, string colour / name / duration-text columns, ``ColumnDataSource.stream`` for deltas), plus a
  ``segment`` glyph for the transfers.
* ``bokeh_dask_webgl`` -- the same figure with ``output_backend="webgl"`` (rect through WebGL).
* ``canvas_lod`` -- flowscope's own canvas 2D timeline (``src/flowscope/ui/static/timeline.js``).

Measured in the page (``performance.now()``), every candidate the same way:

* ``first_render_ms`` -- navigation start until the whole run is drawn and painted (two animation frames
  have begun after the draw: library load and parse, data fetch and decode, first draw);
* ``heap_mb`` -- JSHeapUsedSize (CDP ``Performance.getMetrics``) after a forced GC, once drawn; canvas and
  WebGL backing stores are not in it;
* ``append_ms`` -- a delta of 1,000 tasks handed to the page as plain arrays (as a push message would bring
  them) until it is drawn (the view shows the whole run and follows its end);
* ``zoom_ms`` -- 20 zoom steps (x0.7 each, around a fixed point, down to a 0.08 % window where 1 ms tasks are
  many pixels wide) and one pan of half the window: time from setting the range through the library's own
  API until the candidate's redraw is done and painted (two animation frames later). Median (and p90, max)
  over the steps. For ``plotly_report`` it includes the report's 30 ms debounce of zoom events.

Before timing anything, every page reports how many tasks it holds and the sum of their durations; both
must equal the generated ones (and 101,000 after the delta), and the range after every step must be the
one asked for. Candidates alternate (the order rotates every repetition), each in a fresh browser context.

Indicative only when the machine is shared: rerun on a quiet one before quoting. Without a GPU, chromium's
WebGL is SwiftShader (software), so WebGL candidates are measured at their worst.

    python bench/frontend.py                 # 100,000 tasks, 5 repetitions
    python bench/frontend.py --quick         # smoke run: 10,000 tasks, 1 repetition
    python bench/frontend.py --candidates canvas_lod,plotly_report --screenshots bench/results

Writes ``bench/results/frontend.json`` (DESIGN.md, "Benchmarks") with the chosen candidate's zoom-step median
as ``value`` and prints one summary line last.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _machine import cpu_model, git_commit, write_result

from flowscope.ui import static_dir

BENCH = "frontend"
CHOSEN = "canvas_lod"
# the peer a user would pick instead: the task stream of Dask's own dashboard (Bokeh, as Dask draws it); the
# report's plotly stream is flowscope's own older code, kept as a candidate, not as the peer
MAIN_PEER = "bokeh_dask"
CANDIDATES = ["plotly_report", "bokeh_dask", "bokeh_dask_webgl", "canvas_lod"]
TARGET_MS = 100.0  # a zoom step redrawn in a tenth of a second feels immediate
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
CHROMIUM = os.environ.get("FLOWSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1600, "height": 1000}
ROW_PX = 7
MAX_ROWS_PX = 900  # the canvas pages rows beyond this (128 rows of 7 px): the default run's 125 rows all fit
LABEL_PX = 150

GROUP_NAMES = [
    "read-parquet", "getitem", "astype", "assign", "fillna", "rename", "merge-chunk", "shuffle-split",
    "shuffle-transfer", "shuffle-barrier", "groupby-chunk", "groupby-agg", "sum-partial", "sum-aggregate",
    "normalize", "gaussian-filter", "grayscale", "segment", "label", "regionprops", "to-numpy", "concatenate",
    "rechunk-split", "rechunk-merge", "matmul", "solve", "tree-reduce", "finalize", "to-parquet", "store",
]


class BenchError(RuntimeError):
    """The benchmark could not run, or a candidate does not hold the data it was given."""


# ---- the run --------------------------------------------------------------------------------------------------

def make_run(n_tasks: int, seed: int = 15, hosts: int = 20) -> dict:
    """Tasks, transfers and a 1,000-task delta of a realistic shape (see the module docstring)."""
    import plotly.colors

    rng = np.random.default_rng(seed)
    rows = []
    for h in range(hosts):
        for t in range(int(rng.integers(4, 9))):
            rows.append(f"tcp://10.1.{h // 8}.{10 + h}:{40000 + 17 * h}/thread-{139_900 + 31 * h + t}")
    R, G = len(rows), len(GROUP_NAMES)
    palette = (plotly.colors.qualitative.Dark24 + plotly.colors.qualitative.Light24)[:G]
    median = np.exp(rng.uniform(np.log(1e-3), np.log(0.5), G))  # per group: 1 ms .. 500 ms

    def tasks_on_rows(count: int, row_of: np.ndarray, t_from: np.ndarray, phase0: float, phase1: float):
        per_row = np.bincount(row_of, minlength=R)
        start, end, row, group = [], [], [], []
        for r in range(R):
            k = per_row[r]
            if not k:
                continue
            phase = phase0 + (phase1 - phase0) * (np.arange(k) + rng.uniform(0, 1, k)) / k
            g = np.clip((phase * G + rng.normal(0, 2.5, k)).astype(int), 0, G - 1)
            d = np.clip(median[g] * rng.lognormal(0, 0.6, k), 1e-3, 2.0)
            gap = rng.exponential(2e-3, k)
            s = t_from[r] + np.cumsum(gap + np.concatenate([[0.0], d[:-1]]))
            start.append(s)
            end.append(s + d)
            row.append(np.full(k, r))
            group.append(g)
        return (np.concatenate(start), np.concatenate(end), np.concatenate(row).astype(np.int64),
                np.concatenate(group).astype(np.int64))

    weights = rng.uniform(0.7, 1.3, R)
    row_of = rng.choice(R, size=n_tasks, p=weights / weights.sum())
    s, e, r, g = tasks_on_rows(n_tasks, row_of, np.zeros(R), 0.0, 1.0)
    long_ = rng.choice(n_tasks, size=max(1, n_tasks // 7000), replace=False)  # a few long tasks
    e[long_] = s[long_] + rng.uniform(5, 15, len(long_))
    order = np.lexsort((s, r))
    s, e, r, g = s[order], e[order], r[order], g[order]
    # tasks on one thread never overlap: push each later task past a long one
    for i in range(1, len(s)):
        if r[i] == r[i - 1] and s[i] < e[i - 1]:
            shift = e[i - 1] - s[i] + 1e-4
            j = i
            while j < len(s) and r[j] == r[i]:
                s[j] += shift
                e[j] += shift
                j += 1
    # Dask keeps every thread busy until the end: spread each row's idle time up to the common end as gaps
    t_common = float(np.quantile(e, 0.999))
    for i in range(R):
        sel = np.flatnonzero(r == i)
        extra = t_common - e[sel].max() if len(sel) else 0.0
        if extra > 0:
            shift = np.sort(rng.uniform(0, extra, len(sel)))
            s[sel] += shift
            e[sel] += shift
    keys = [f"('{GROUP_NAMES[gi]}-{(i * 2654435761) & 0xFFFFFFFF:08x}', {i})" for i, gi in enumerate(g)]

    m = n_tasks // 10
    fed = rng.choice(n_tasks, size=m, replace=False)
    dst = r[fed]
    src = (dst + rng.integers(1, R, m)) % R
    xd = np.clip(rng.lognormal(np.log(5e-3), 1.0, m), 1e-4, 0.5)
    xe = s[fed]
    xs = np.maximum(0.0, xe - xd)

    d_rows = rng.choice(R, size=1000, p=weights / weights.sum())
    ds, de, dr, dg = tasks_on_rows(1000, d_rows, np.full(R, float(e.max())), 0.9, 1.0)
    dkeys = [f"('{GROUP_NAMES[gi]}-live', {n_tasks + i})" for i, gi in enumerate(dg)]
    return {"rows": rows, "groups": [{"name": n, "color": c} for n, c in zip(GROUP_NAMES, palette)],
            "start": s, "end": e, "row": r, "group": g, "key": keys,
            "xfer": {"start": xs, "end": xe, "src": src, "dst": dst},
            "delta": {"start": ds.tolist(), "end": de.tolist(), "row": dr.tolist(), "group": dg.tolist(),
                      "key": dkeys}}


def zoom_plan(t_end: float, steps: int = 20, factor: float = 0.7, focus: float = 0.37) -> list[list[float]]:
    """The ranges a user zooming in around one point and then panning by half a window goes through."""
    out, w, at = [], t_end, focus * t_end
    for _ in range(steps):
        w *= factor
        out.append([at - focus * w, at + (1 - focus) * w])
    a, b = out[-1]
    out.append([a + (b - a) / 2, b + (b - a) / 2])
    return out


# ---- the pages ------------------------------------------------------------------------------------------------

HARNESS = r"""
window.bench = (function () {
  function tick() { return new Promise(function (r) { var c = new MessageChannel(); c.port1.onmessage = r;
                                                       c.port2.postMessage(0); }); }
  function frame() { return new Promise(function (r) { requestAnimationFrame(function () { r(performance.now()); }); }); }
  async function settled(before, t0) {
    while (candidate.draws() <= before) {
      if (performance.now() - t0 > 120000) throw new Error("no redraw within 120 s");
      await tick();
    }
    await frame();          // the frame that shows the redraw begins...
    return await frame();   // ...and has been produced when the next one begins
  }
  var b = {ready: false, error: null};
  b.start = async function () {
    try {
      await candidate.load();
      await settled(0, 0);
      b.readyAt = await frame();
      b.ready = true;
    } catch (e) { b.error = String(e && e.stack || e); }
  };
  b.check = function () { return {count: candidate.count(), sum: candidate.sum(), range: candidate.range()}; };
  b.setRange = async function (a, z) {
    var before = candidate.draws(), t0 = performance.now();
    candidate.setRange(a, z);
    var t1 = await settled(before, t0);
    return t1 - t0;
  };
  b.append = async function (delta) {
    var before = candidate.draws(), t0 = performance.now();
    candidate.append(delta);
    var t1 = await settled(before, t0);
    return t1 - t0;
  };
  return b;
})();
"""

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{name}</title>
<style>body {{ margin: 0; font: 12px system-ui, sans-serif; }} #plot {{ width: {width}px; }}</style>
{head}</head><body><div id="plot"></div>
<script>{harness}</script>
<script>{script}
bench.start();</script></body></html>"""


def plotly_page(run: dict, root: Path) -> str:
    """The report's stream figure, built from the run's columns as the one-page report (retired) built it with ``report/stream.py``."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from flowscope.report import charts
    from flowscope.report.stream import JS, StreamFigure

    (root / "static" / "plotly.min.js").write_text(get_plotlyjs())
    R = len(run["rows"])
    t_end = float(max(run["end"].max(), run["xfer"]["end"].max()))
    fig = go.Figure()
    fig.update_yaxes(tickmode="array", tickvals=list(range(R)), ticktext=run["rows"], autorange=False,
                     range=[R - 0.5, -0.5], showgrid=False, automargin=True)
    fig.update_xaxes(range=[0, t_end], title={"text": "seconds since the first event", "standoff": 6})
    charts._layout(fig, 110 + R * ROW_PX)
    fig.update_layout(uirevision="stream", width=VIEWPORT["width"] - 20)
    names = [g["name"] for g in run["groups"]]
    width = max(2.0, ROW_PX * 0.62)
    sf = StreamFigure(fig, run["start"], run["end"], run["row"].astype(np.float32), run["group"], names,
                      [g["color"] for g in run["groups"]], [width] * len(names),
                      [f"{n}<br>%{{x:.6f}} s<extra></extra>" for n in names], R)
    x = run["xfer"]
    payload = {"layout": json.loads(pio.to_json(sf.layout_figure, validate=False))["layout"], "data": sf.data(),
               "config": {"responsive": False, "displaylogo": False, "scrollZoom": True},
               "xfer": {"start": x["start"].tolist(), "end": x["end"].tolist(), "src": x["src"].tolist(),
                        "dst": x["dst"].tolist()}}
    (root / "data" / "plotly.json").write_text(json.dumps(payload, separators=(",", ":")))
    hooks = [
        ("var gd = document.getElementById(id), lastW = 0;",
         ("var gd = document.getElementById(id), lastW = 0;\n"
         "  gd.flowscopeColumns = function () { return {s: s, dur: dur, y: y, g: g, n: n}; };")),
        ("  var r = fig.layout.xaxis.range;",
         ("  gd.flowscopeAppend = function (c, x1) {  // bench hook: columns merged by the bench, redraw\n"
         "    s = c.s; dur = c.dur; y = c.y; g = c.g; n = s.length; r = [r[0], x1];\n"
         "    gd.layout.xaxis.range = r.slice(); gd._fullLayout.xaxis.range = r.slice(); return redraw();\n"
         "  };\n  var r = fig.layout.xaxis.range;")),
    ]
    js = JS
    for old, new in hooks:
        if js.count(old) != 1:
            raise BenchError(f"flowscope.report.stream.JS changed: cannot add the bench hook at {old.strip()!r}")
        js = js.replace(old, new)
    script = js + r"""
var P = {};
var candidate = {
  load: async function () {
    P = await (await fetch('/data/plotly.json')).json();
    var X = P.xfer;
    // transfers: one more line trace, drawn with every redraw of the stream for the range shown
    function withTransfers(gd, data) {
      var fl = gd._fullLayout, rg = fl && fl.xaxis ? fl.xaxis.range : P.layout.xaxis.range;
      var x = [], y = [], points = 0;
      for (var i = 0; i < X.start.length; i++) {
        if (X.end[i] < rg[0] || X.start[i] > rg[1]) continue;
        x.push(X.start[i], X.end[i], null); y.push(X.src[i], X.dst[i], null);
      }
      data.forEach(function (t) { points += t.x.length; });
      return data.concat([{type: points + x.length > P.data.webgl_points ? "scattergl" : "scatter",
                           mode: "lines", x: x, y: y, line: {color: "#d62728", width: 1}, opacity: 0.35,
                           hoverinfo: "skip", showlegend: false, name: "transfers"}]);
    }
    var react = Plotly.react, newPlot = Plotly.newPlot;
    Plotly.react = function (gd, data, layout, config) { return react(gd, withTransfers(gd, data), layout, config); };
    Plotly.newPlot = function (gd, data, layout, config) { return newPlot(gd, withTransfers(gd, data), layout, config); };
    flowscopeStream("plot", {layout: P.layout}, P.data, P.config);
  },
  draws: function () { return document.getElementById("plot").flowscopeDraws || 0; },
  count: function () { return document.getElementById("plot").flowscopeColumns().n; },
  sum: function () { var c = document.getElementById("plot").flowscopeColumns(), t = 0;
                     for (var i = 0; i < c.n; i++) t += c.dur[i]; return t; },
  range: function () { return document.getElementById("plot")._fullLayout.xaxis.range.slice(); },
  setRange: function (a, z) { Plotly.relayout("plot", {"xaxis.range": [a, z]}); },
  append: function (d) {
    // keep the columns sorted by row, then start, as the stream's pass needs: a new task goes to its row's end
    var gd = document.getElementById("plot"), c = gd.flowscopeColumns(), m = d.start.length, n = c.n;
    var order = Array.from({length: m}, function (_, i) { return i; });
    order.sort(function (p, q) { return d.row[p] - d.row[q] || d.start[p] - d.start[q]; });
    var s = new Float64Array(n + m), dur = new Float32Array(n + m), y = new Float32Array(n + m),
        g = new Uint8Array(n + m), i = 0, j = 0, k = 0, x1 = gd._fullLayout.xaxis.range[1];
    while (i < n || j < m) {
      if (j >= m || (i < n && c.y[i] <= d.row[order[j]])) {
        s[k] = c.s[i]; dur[k] = c.dur[i]; y[k] = c.y[i]; g[k] = c.g[i]; i++;
      } else {
        var q = order[j++];
        s[k] = d.start[q]; dur[k] = d.end[q] - d.start[q]; y[k] = d.row[q]; g[k] = d.group[q];
        if (d.end[q] > x1) x1 = d.end[q];
      }
      k++;
    }
    gd.flowscopeAppend({s: s, dur: dur, y: y, g: g}, x1);
  },
};"""
    return PAGE.format(name="plotly_report", width=VIEWPORT["width"] - 20,
                       head='<script src="/static/plotly.min.js"></script>', harness=HARNESS, script=script)


def bokeh_page(run: dict, root: Path, webgl: bool) -> str:
    """Dask's task stream figure (``task_stream_figure``), fed the whole run at once."""
    from bokeh.embed import json_item
    from bokeh.models import (
        ColumnDataSource,
        DataRange1d,
        HoverTool,
        PanTool,
        ResetTool,
        WheelZoomTool,
    )
    from bokeh.plotting import figure

    js_dir = Path(__import__("bokeh").__file__).parent / "server" / "static" / "js"
    for f in ("bokeh.min.js", "bokeh-gl.min.js"):
        (root / "static" / f).write_bytes((js_dir / f).read_bytes())
    s, e = run["start"], run["end"]
    d = e - s
    colors = np.array([g["color"] for g in run["groups"]], dtype=object)
    names = np.array([g["name"] for g in run["groups"]], dtype=object)
    source = ColumnDataSource(data={
        "start": (s + e) / 2, "duration": d, "key": run["key"], "name": names[run["group"]].tolist(),
        "color": colors[run["group"]].tolist(), "duration_text": [f"{x * 1e3:.1f} ms" for x in d],
        "y": run["row"].astype(np.float64), "alpha": np.full(len(s), 1.0)})
    x = run["xfer"]
    xsource = ColumnDataSource(data={"x0": x["start"], "x1": x["end"], "y0": x["src"].astype(np.float64),
                                         "y1": x["dst"].astype(np.float64)})
    R = len(run["rows"])
    root_fig = figure(name="task_stream", title="Task Stream", x_range=DataRange1d(range_padding=0),
                      y_range=DataRange1d(range_padding=0), toolbar_location="above", tools="",
                      min_border_bottom=50, width=VIEWPORT["width"] - 20, height=110 + R * ROW_PX,
                      output_backend="webgl" if webgl else "canvas")
    rect = root_fig.rect(source=source, x="start", y="y", width="duration", height=0.4, fill_color="color",
                         line_color="color", line_alpha=0.6, fill_alpha="alpha", line_width=3)
    rect.nonselection_glyph = None
    root_fig.segment(source=xsource, x0="x0", y0="y0", x1="x1", y1="y1", line_color="#d62728", line_alpha=0.35)
    root_fig.yaxis.major_label_text_alpha = 0
    root_fig.xgrid.visible = False
    root_fig.add_tools(HoverTool(renderers=[rect], point_policy="follow_mouse",
                                 tooltips="<div><b>@name:</b>&nbsp;@duration_text</div>"),
                       ResetTool(), PanTool(dimensions="width"), WheelZoomTool(dimensions="width"))
    name = "bokeh_dask_webgl" if webgl else "bokeh_dask"
    (root / "data" / f"{name}.json").write_text(json.dumps(json_item(root_fig, "plot")))
    script = f"""
var groups = {json.dumps(run["groups"])};
var item, view, src;
window.benchPaints = 0;
var candidate = {{
  load: async function () {{
    item = await (await fetch('/data/{name}.json')).json();
    // count every paint of the plot, the first one included: hook the class before the figure is built
    var PV = Bokeh.require("models/plots/plot").PlotView, paint = PV.prototype.paint;
    PV.prototype.paint = function () {{ var r = paint.call(this); window.benchPaints++; return r; }};
    await Bokeh.embed.embed_item(item, "plot");
    view = Bokeh.index[item.root_id];
    src = view.model.renderers[0].data_source;
  }},
  draws: function () {{ return window.benchPaints; }},
  count: function () {{ return src.get_length(); }},
  sum: function () {{ var d = src.data.duration, t = 0; for (var i = 0; i < d.length; i++) t += d[i]; return t; }},
  range: function () {{ return [view.model.x_range.start, view.model.x_range.end]; }},
  setRange: function (a, z) {{ view.model.x_range.setv({{start: a, end: z}}); }},
  append: function (d) {{
    var m = d.start.length, c = {{start: [], duration: [], key: [], name: [], color: [], duration_text: [],
                                  y: [], alpha: []}};
    for (var i = 0; i < m; i++) {{
      var du = d.end[i] - d.start[i];
      c.start.push((d.start[i] + d.end[i]) / 2); c.duration.push(du); c.key.push(d.key[i]);
      c.name.push(groups[d.group[i]].name); c.color.push(groups[d.group[i]].color);
      c.duration_text.push((du * 1e3).toFixed(1) + " ms"); c.y.push(d.row[i]); c.alpha.push(1);
    }}
    src.stream(c);
  }},
}};"""
    head = '<script src="/static/bokeh.min.js"></script><script src="/static/bokeh-gl.min.js"></script>'
    return PAGE.format(name=name, width=VIEWPORT["width"] - 20, head=head, harness=HARNESS, script=script)


def canvas_page(run: dict, root: Path) -> str:
    """flowscope's canvas timeline, fed binary columns."""
    (root / "static" / "timeline.js").write_bytes((static_dir() / "timeline.js").read_bytes())
    x = run["xfer"]
    n, m = len(run["start"]), len(x["start"])
    blob = b"".join([run["start"].astype("<f8").tobytes(), run["end"].astype("<f8").tobytes(),
                     x["start"].astype("<f8").tobytes(), x["end"].astype("<f8").tobytes(),
                     run["row"].astype("<u2").tobytes(), run["group"].astype("<u2").tobytes(),
                     x["src"].astype("<u2").tobytes(), x["dst"].astype("<u2").tobytes()])
    (root / "data" / "canvas.bin").write_bytes(blob)
    meta = {"n": n, "m": m, "rows": run["rows"], "groups": run["groups"], "key": run["key"]}
    (root / "data" / "canvas.json").write_text(json.dumps(meta, separators=(",", ":")))
    script = f"""
var tl;
var candidate = {{
  load: async function () {{
    var got = await Promise.all([fetch('/data/canvas.json').then(function (r) {{ return r.json(); }}),
                                 fetch('/data/canvas.bin').then(function (r) {{ return r.arrayBuffer(); }})]);
    var meta = got[0], buf = got[1], n = meta.n, m = meta.m, o = 0;
    function take(T, k) {{ var a = new T(buf, o, k); o += k * T.BYTES_PER_ELEMENT; return a; }}
    var s = take(Float64Array, n), e = take(Float64Array, n), xs = take(Float64Array, m), xe = take(Float64Array, m),
        r = take(Uint16Array, n), g = take(Uint16Array, n), src = take(Uint16Array, m), dst = take(Uint16Array, m);
    tl = new FlowscopeTimeline(document.getElementById("plot"), {{rows: meta.rows, groups: meta.groups,
                                                                  rowHeight: {ROW_PX}, labelWidth: {LABEL_PX},
                                                                  maxHeight: {MAX_ROWS_PX}}});
    tl.append({{start: s, end: e, row: r, group: g, key: meta.key}}, {{start: xs, end: xe, src: src, dst: dst}});
  }},
  draws: function () {{ return tl ? tl.drawCount : 0; }},
  count: function () {{ return tl.count; }},
  sum: function () {{ var t = 0; tl.rows.forEach(function (w) {{ for (var i = 0; i < w.n; i++) t += w.end[i] - w.start[i]; }});
                     return t; }},
  range: function () {{ return tl.view; }},
  setRange: function (a, z) {{ tl.setView(a, z); }},
  append: function (d) {{ tl.append(d); }},
}};"""
    return PAGE.format(name="canvas_lod", width=VIEWPORT["width"] - 20,
                       head='<script src="/static/timeline.js"></script>', harness=HARNESS, script=script)


BUILDERS = {
    "plotly_report": plotly_page,
    "bokeh_dask": functools.partial(bokeh_page, webgl=False),
    "bokeh_dask_webgl": functools.partial(bokeh_page, webgl=True),
    "canvas_lod": canvas_page,
}


# ---- serving and measuring ------------------------------------------------------------------------------------

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def measure(browser, url: str, name: str, run: dict, plan: list, shots: Path | None) -> dict:
    """One candidate, once, in a fresh browser context."""
    ctx = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        blocked: list[str] = []
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(url)
                   else (blocked.append(route.request.url), route.abort()))
        cdp = ctx.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.goto(f"{url}/{name}.html", wait_until="load")
        page.wait_for_function("() => window.bench && (window.bench.ready || window.bench.error)", timeout=300_000)
        if err := page.evaluate("() => bench.error"):
            raise BenchError(f"{name}: {err}")
        first = page.evaluate("() => bench.readyAt")
        got = page.evaluate("() => bench.check()")
        n, total = len(run["start"]), float((run["end"] - run["start"]).sum())
        if got["count"] != n or abs(got["sum"] - total) > 1e-5 * total:
            raise BenchError(f"{name} holds {got['count']} tasks of {got['sum']:.6f} s, not {n} of {total:.6f} s")
        cdp.send("HeapProfiler.enable")
        cdp.send("HeapProfiler.collectGarbage")
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        heap_mb = metrics["JSHeapUsedSize"] / 2**20
        if shots:
            page.screenshot(path=str(shots / f"frontend-{name}.png"))
        page.wait_for_timeout(1000)  # let the forced GC and the screenshot settle before timing the delta
        append_ms = page.evaluate("d => bench.append(d)", run["delta"])
        got = page.evaluate("() => bench.check()")
        total += float(np.sum(np.subtract(run["delta"]["end"], run["delta"]["start"])))
        if got["count"] != n + 1000 or abs(got["sum"] - total) > 1e-5 * total:
            raise BenchError(f"{name} after the delta holds {got['count']} tasks of {got['sum']:.6f} s, "
                             f"not {n + 1000} of {total:.6f} s")
        t_new = float(max(run["delta"]["end"]))
        if got["range"][1] < t_new * (1 - 1e-6):  # Bokeh's rect bounds pad by half the widest bar: >=, not ==
            raise BenchError(f"{name} does not show the delta: its range ends at {got['range'][1]}, before {t_new}")
        steps = []
        for a, b in plan:
            steps.append(page.evaluate("([a, b]) => bench.setRange(a, b)", [a, b]))
            r0, r1 = page.evaluate("() => bench.check().range")
            if abs(r0 - a) > 1e-6 * (b - a) or abs(r1 - b) > 1e-6 * (b - a):
                raise BenchError(f"{name} shows [{r0}, {r1}] after asking for [{a}, {b}]")
        if shots:
            page.screenshot(path=str(shots / f"frontend-{name}-zoomed.png"))
        if errors or blocked:
            raise BenchError(f"{name}: page errors {errors[:3]}, requests that left loopback {blocked[:3]}")
        return {"first_render_ms": first, "heap_mb": heap_mb, "append_ms": append_ms, "zoom_steps_ms": steps}
    finally:
        ctx.close()


def _stats(values: list[float]) -> dict:
    v = sorted(values)
    return {"median": statistics.median(v), "min": v[0], "max": v[-1],
            "p90": v[min(len(v) - 1, round(0.9 * (len(v) - 1)))]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=20,
                    help="hosts of 4-8 threads each (default 20: 125 rows; 160: about 1,000 rows, which the canvas "
                         "pages: it draws the 128 rows in view, the others every row)")
    ap.add_argument("--quick", action="store_true", help="10,000 tasks, 1 repetition")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--screenshots", type=Path, help="save a screenshot of each candidate (whole run, zoomed)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.reps = 10_000, 1
    names = [c for c in args.candidates.split(",") if c]
    if unknown := [c for c in names if c not in BUILDERS]:
        ap.error(f"--candidates: unknown {unknown}; known: {', '.join(BUILDERS)}")
    if not Path(CHROMIUM).exists():
        raise BenchError(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    t0 = time.perf_counter()
    run = make_run(args.tasks, hosts=args.hosts)
    t_end = float(max(run["end"].max(), run["xfer"]["end"].max(), max(run["delta"]["end"])))
    plan = zoom_plan(t_end)
    print(f"run: {len(run['start']):,} tasks on {len(run['rows'])} threads of {args.hosts} hosts, {len(run['groups'])} groups, "
          f"{len(run['xfer']['start']):,} transfers, {run['end'].max():.1f} s; built in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    samples: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="flowscope-frontend-") as tmp:
        root = Path(tmp)
        (root / "static").mkdir()
        (root / "data").mkdir()
        sizes = {}
        for n in names:
            (root / f"{n}.html").write_text(BUILDERS[n](run, root))
        for f in (root / "data").iterdir():
            sizes[f.name] = f.stat().st_size
        httpd, url = serve(root)
        try:
            with sync_playwright() as p:
                for rep in range(args.reps):
                    order = names[rep % len(names):] + names[:rep % len(names)]
                    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                    try:
                        for n in order:
                            shots = args.screenshots if args.screenshots and rep == 0 else None
                            m = measure(browser, url, n, run, plan, shots)
                            samples[n].append(m)
                            z = _stats(m["zoom_steps_ms"])
                            print(f"rep {rep + 1}/{args.reps} {n:18s} first {m['first_render_ms']:8.0f} ms  "
                                  f"heap {m['heap_mb']:6.1f} MB  append {m['append_ms']:7.1f} ms  "
                                  f"zoom median {z['median']:7.1f} ms max {z['max']:7.1f} ms", file=sys.stderr)
                    finally:
                        browser.close()
        finally:
            httpd.shutdown()
            httpd.server_close()

    summary = {}
    for n, ms in samples.items():
        zoom_medians = [statistics.median(m["zoom_steps_ms"]) for m in ms]
        all_steps = [s for m in ms for s in m["zoom_steps_ms"]]
        summary[n] = {
            "first_render_ms": _stats([m["first_render_ms"] for m in ms]),
            "heap_mb": _stats([m["heap_mb"] for m in ms]),
            "append_ms": _stats([m["append_ms"] for m in ms]),
            "zoom_step_ms": {**_stats(all_steps), "median_of_rep_medians": statistics.median(zoom_medians),
                             "rep_medians": zoom_medians},
        }
    chosen = CHOSEN if CHOSEN in summary else names[0]
    value = summary[chosen]["zoom_step_ms"]["median"]
    peers = {n: {"value": s["zoom_step_ms"]["median"], "unit": "ms"} for n, s in summary.items() if n != chosen}
    peer = MAIN_PEER if MAIN_PEER in peers else next(iter(peers), None)
    result = {
        "benchmark": BENCH, "metric": "zoom_step_ms_median", "value": value, "unit": "ms", "chosen": chosen,
        "target": TARGET_MS, "meets_target": value <= TARGET_MS,
        "peers": peers, "ratio_vs_peer": value / peers[peer]["value"] if peer else None, "main_peer": peer,
        "candidates": summary,
        "params": {"tasks": len(run["start"]), "threads": len(run["rows"]), "hosts": 20, "groups": len(run["groups"]),
                   "transfers": len(run["xfer"]["start"]), "delta_tasks": 1000, "run_s": t_end,
                   "zoom_steps": len(plan), "reps": args.reps, "viewport": VIEWPORT, "row_px": ROW_PX,
                   "data_bytes": sizes, "chromium": CHROMIUM, "chromium_args": CHROMIUM_ARGS,
                   "webgl": "SwiftShader (software; no GPU)",
                   "os_load_1min": os.getloadavg()[0], "cpu_model": cpu_model(), "commit": git_commit()},
    }
    write_result(result, args.out)
    line = " | ".join(f"{n}: first {s['first_render_ms']['median']:.0f} ms, zoom {s['zoom_step_ms']['median']:.0f} ms, "
                      f"append {s['append_ms']['median']:.0f} ms, heap {s['heap_mb']['median']:.0f} MB"
                      for n, s in summary.items())
    print(f"frontend ({len(run['start']):,} tasks, {args.reps} reps, medians): {line}; chosen {chosen}: "
          f"zoom step {value:.0f} ms" + (f" ({value / peers[peer]['value']:.2f} x {peer})" if peer else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
