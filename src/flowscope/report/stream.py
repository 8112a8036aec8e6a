"""The task stream at scale: every bar travels in compact columns and the browser draws them at the level of
detail the current zoom allows.

A 100,000-task run has far more bars than a plot has pixels. Drawing them all (SVG or WebGL) takes seconds
per frame without a GPU and shows nothing more. So the page keeps every bar (start, duration, row, group:
17 bytes each, base64) and, for the visible time range, draws

* each bar at least one pixel bin wide exactly as it is, and
* the bars narrower than a bin merged per (row, bin): one bar as wide as the bin, in the colour of the group
  that was busiest in it, more opaque the larger the share of the bin its bars kept busy (up to 10 %, up to
  50 %, more: ``LEVELS``; the hover says the share),

where a bin is one pixel of the plot's width (fewer when there are many rows, so that at most ``max_bins``
bins are drawn). Zooming in redraws from the full columns, so individual tasks appear as soon as they are a
pixel wide. A thread that ran many tiny tasks but was mostly idle shows as a faint band.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

MAX_BINS = 60_000     # bins drawn over all rows at once
WEBGL_POINTS = 30_000  # the redrawn traces switch to WebGL beyond this many points
# a merged bin is drawn one bin wide, more opaque the busier it was: busy fraction up to 10 %, up to 50 %, more
LEVELS = (0.10, 0.50, 1.0)
OPACITIES = (0.3, 0.6, 1.0)

# flowscopeStream(id, figure, data, config): draw the stream in div ``id`` and redraw it on every zoom.
JS = r"""
function flowscopeStream(id, fig, d, config) {
  function dec(b64, T) {
    var bin = atob(b64), u8 = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) u8[i] = bin.charCodeAt(i);
    return new T(u8.buffer);
  }
  var s = dec(d.s, Float64Array), dur = dec(d.d, Float32Array), y = dec(d.y, Float32Array),
      g = dec(d.g, Uint8Array), n = s.length, G = d.names.length, L = d.levels.length;
  var gd = document.getElementById(id), lastW = 0;
  function bins() {
    var px = (gd._fullLayout && gd._fullLayout.xaxis && gd._fullLayout.xaxis._length) || gd.clientWidth || 1200;
    return Math.max(50, Math.min(Math.round(px), Math.floor(d.max_bins / Math.max(1, d.rows))));
  }
  function traces(x0, x1) {
    var W = lastW = bins();
    var bw = (x1 - x0) / W;
    if (!(bw > 0)) bw = 1e-9;
    // per group: exact bars (x, y), and merged bins per busy level (x, y, busy fraction)
    var ex = [], ey = [], mx = [], my = [], mc = [], j, k, l;
    for (j = 0; j < G; j++) {
      ex.push([]); ey.push([]);
      for (l = 0; l < L; l++) { mx.push([]); my.push([]); mc.push([]); }
    }
    var acc = new Float64Array(W * G), stamp = new Int32Array(W).fill(-1), touched = [], cur = NaN, pass = 0;
    function flush() {
      for (var t = 0; t < touched.length; t++) {
        var b = touched[t], best = 0, most = -1, total = 0;
        for (j = 0; j < G; j++) {
          var v = acc[b * G + j];
          if (v > 0) { total += v; if (v > most) { most = v; best = j; } acc[b * G + j] = 0; }
        }
        var f = Math.min(1, total / bw);
        for (l = 0; l < L - 1 && f > d.levels[l]; l++);
        var q = best * L + l, a = x0 + b * bw;
        mx[q].push(a, a + bw, NaN); my[q].push(cur, cur, NaN); mc[q].push(f, f, NaN);
      }
      touched.length = 0;
      pass++;
    }
    for (var i = 0; i < n; i++) {
      var a = s[i], e = a + dur[i];
      if (e < x0 || a > x1) continue;
      if (y[i] !== cur) { flush(); cur = y[i]; }
      if (dur[i] >= bw) {
        ex[g[i]].push(a, e, NaN);
        ey[g[i]].push(cur, cur, NaN);
      } else {
        k = Math.floor((a - x0) / bw);
        k = k < 0 ? 0 : (k >= W ? W - 1 : k);
        if (stamp[k] !== pass) { stamp[k] = pass; touched.push(k); }
        acc[k * G + g[i]] += dur[i];
      }
    }
    flush();
    var points = 0;
    for (j = 0; j < G; j++) points += ex[j].length;
    for (j = 0; j < G * L; j++) points += mx[j].length;
    var type = points > d.webgl_points ? "scattergl" : "scatter", out = [];
    for (j = 0; j < G; j++) {
      var name = d.names[j], line = {color: d.colors[j], width: d.widths[j]};
      if (!ex[j].length) { ex[j] = [NaN]; ey[j] = [NaN]; }  // keeps the group in the legend at every zoom
      out.push({type: type, mode: "lines", name: name, legendgroup: name, x: ex[j], y: ey[j], line: line,
                connectgaps: false, hovertemplate: d.hovers[j], showlegend: true});
      for (l = 0; l < L; l++) {
        q = j * L + l;
        out.push({type: type, mode: "lines", name: name, legendgroup: name, x: mx[q], y: my[q], line: line,
                  opacity: d.opacities[l], customdata: mc[q], connectgaps: false, showlegend: false,
                  hovertemplate: d.merged_hovers[j]});
      }
    }
    return out;
  }
  var r = fig.layout.xaxis.range;
  var pending = null;
  gd.flowscopeDraws = 0;  // completed draws, and whether the first one is done (tests wait on these)
  gd.flowscopeReady = false;
  function drawn() { gd.flowscopeDraws++; }
  function redraw() {
    pending = null;
    var range = gd._fullLayout.xaxis.range;
    return Plotly.react(gd, traces(range[0], range[1]), gd.layout, config).then(drawn);
  }
  Plotly.newPlot(gd, traces(r[0], r[1]), fig.layout, config).then(function () {
    drawn();
    gd.on("plotly_relayout", function (ev) {
      ev = ev || {};
      if (ev["xaxis.autorange"]) {  // autoscale would fit the bars drawn for the zoom: show the whole run
        Plotly.relayout(gd, {"xaxis.range": r.slice()});
        return;
      }
      if (!Object.keys(ev).some(function (k) { return k.indexOf("xaxis.range") === 0; })) return;
      if (pending) clearTimeout(pending);
      pending = setTimeout(redraw, 30);
    });
    // the first pass guessed the plot's width in pixels: draw again if the bins differ
    return bins() !== lastW ? redraw() : null;
  }).then(function () { gd.flowscopeReady = true; });
}
"""


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


@dataclass
class StreamFigure:
    """A task stream drawn in the browser from compact columns (see the module's docstring)."""

    layout_figure: go.Figure   # layout only: axes, rows, legend
    start_s: np.ndarray
    end_s: np.ndarray
    row: np.ndarray
    group: np.ndarray
    names: list[str]
    colors: list[str]
    widths: list[float]
    hovers: list[str]
    rows: int

    def __post_init__(self) -> None:
        if len(self.names) > 255:
            raise ValueError("at most 255 groups in a stream figure")
        order = np.lexsort((self.start_s, self.row))  # by row, then start: what the browser's pass expects
        self.start_s, self.end_s = self.start_s[order], self.end_s[order]
        self.row, self.group = self.row[order], self.group[order]

    @property
    def bars(self) -> int:
        return len(self.start_s)

    def data(self) -> dict:
        return {
            "s": _b64(self.start_s.astype("<f8")),
            "d": _b64(np.maximum(self.end_s - self.start_s, 0).astype("<f4")),
            "y": _b64(self.row.astype("<f4")),
            "g": _b64(self.group.astype(np.uint8)),
            "names": self.names, "colors": self.colors, "widths": self.widths, "hovers": self.hovers,
            "merged_hovers": [h.replace("<extra>", "<br>busy %{customdata:.0%} of this pixel<extra>", 1)
                              if "<extra>" in h else h for h in self.hovers],
            "levels": list(LEVELS), "opacities": list(OPACITIES),
            "rows": self.rows, "max_bins": MAX_BINS, "webgl_points": WEBGL_POINTS,
        }

    def script(self, div: str, config: dict) -> str:
        """The call that draws the stream into ``div`` (the page includes ``JS`` once before it)."""
        fig = pio.to_json(self.layout_figure, validate=False)
        data = json.dumps(self.data(), separators=(",", ":"))
        return (f"flowscopeStream({json.dumps(div)},{fig},{data},{json.dumps(config)});").replace("</", "<\\/")
