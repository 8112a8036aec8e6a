/* flowscope run overview, live: one WebSocket per page brings the run's view (a snapshot) and then every change
 * (deltas, numbered); a page that loses the connection reconnects with the last number it applied and gets
 * what it missed. A finished run is the same page with nothing more arriving.
 * Every string from the observed program is set as text (textContent, canvas fillText), never as HTML. */
(function (global) {
  "use strict";
  var UI = global.flowscopeUI, el = UI.el;
  var runId = UI.route().runId;

  var S = {  // what the page holds of the run
    epoch: null, seq: null, name: "", status: null, lastS: 0, endS: null,
    progress: {}, states: {}, rows: [], rowIds: [], groups: [], warnings: [], warningCount: 0,
    metrics: {names: {}, series: {}},          // panel -> resource -> {label, t, v}
    diagnostics: {},                           // "namespace:name" -> resource -> {label, t, v}
    throughput: {},                            // second since the start -> task spans that ended in it
    starts: {},                                // second since the start -> tasks and calls of the stream started in it
    pendingTasks: [], pendingTransfers: []     // before the stream exists (no rows or groups yet)
  };
  var live = global.flowscopeLive = {
    runId: runId, snapshots: 0, deltas: 0, lastCatchUp: null, connects: 0, socket: null, paused: false,
    timeline: null, state: S, errors: []
  };

  // ---- applying what the server sends ------------------------------------------------------------
  function ensureTimeline() {
    if (live.timeline || !S.rows.length) return;  // (rows without groups: a run of transfers alone)
    var div = document.getElementById("stream");
    div.replaceChildren();  // (a note that the run had nothing to draw, if it said so before its tasks came)
    live.timeline = new FlowscopeTimeline(div, {rows: S.rows.slice(), groups: S.groups.slice(), maxHeight: 480,
                                                labelWidth: 240, onView: keepView});
    S.pendingTasks.concat(S.pendingTransfers).forEach(function (p) { live.timeline.append(p[0], p[1]); });
    S.pendingTasks = []; S.pendingTransfers = [];
    var from = Number(params.get("from")), to = Number(params.get("to"));
    if (params.has("from") && params.has("to") && isFinite(from) && isFinite(to) && to > from) {
      live.timeline.setView(from, to);
    }
  }

  // ---- deep links into the stream: ?from=S&to=S (seconds since the run started), ?task=KEY, ?resource=ID -----
  var params = new URLSearchParams(location.search);
  var keepTimer = 0;
  /** Keep the stream's range in the address (replaceState, a quarter of a second after the last change). */
  function keepView(v) {
    if (v) { params.set("from", String(+v[0].toFixed(6))); params.set("to", String(+v[1].toFixed(6))); }
    else { params.delete("from"); params.delete("to"); }
    clearTimeout(keepTimer);
    keepTimer = setTimeout(function () { history.replaceState(null, "", UI.withQuery(params.toString())); }, 250);
  }
  var wantedTask = params.get("task");
  /** Open the stream on ``?task=KEY`` once the task is in it (a live run may not have run it yet), and name it. */
  function showWantedTask() {
    if (wantedTask === null || !live.timeline) return;
    var out = document.getElementById("stream-task"), t = live.timeline.find(wantedTask);
    if (!t) {
      if (S.endS !== null && S.endS !== undefined) {
        out.textContent = "no task " + wantedTask + " in this run's stream";
        wantedTask = null;
      }
      return;
    }
    var d = t.end - t.start, pad = Math.max(d, 1e-6);
    live.timeline.setView(t.start - pad, t.end + pad);
    live.timeline.showRow(t.row);
    live.timeline.mark(wantedTask);
    out.textContent = "task " + wantedTask + " (" + t.group + ", row " + S.rows[t.row] + "): from " +
      UI.fmtSeconds(t.start) + ", " + UI.fmtDur(d);
    out.dataset.key = wantedTask;
    wantedTask = null;
  }

  var wantedResource = params.get("resource");
  /** Mark the row of ``?resource=ID`` in the stream and bring it into view, once it is there (a live run's worker
   *  may join later), and name it with the tasks it holds; again on a new stream (a snapshot replaces it). */
  function showWantedResource() {
    if (wantedResource === null || !live.timeline) return;
    var out = document.getElementById("stream-resource"), tl = live.timeline, row = S.rowIds.indexOf(wantedResource);
    if (row < 0) {
      if (S.endS !== null && S.endS !== undefined && out.dataset.missing !== wantedResource) {
        out.textContent = "no resource " + wantedResource + " in this run's stream";
        out.dataset.missing = wantedResource;
      }
      return;
    }
    var n = tl.rowCount(row);
    if (tl.highlighted !== row) { tl.highlightRow(row); tl.showRow(row); }
    if (out.dataset.resource === wantedResource && +out.dataset.tasks === n) return;
    out.textContent = "resource " + S.rows[row] + " (" + wantedResource + "), row " + (row + 1) + " of " +
      S.rows.length + ": " + UI.fmtInt(n) + " " + (n === 1 ? "task" : "tasks") + " in the stream";
    out.dataset.resource = wantedResource;
    out.dataset.tasks = String(n);
  }

  function addTasks(tasks, transfers) {
    var empty = {start: [], end: [], row: [], group: [], key: []};
    var t = tasks || empty, x = transfers || null;
    if (tasks && tasks.start.length && S.drawn === "work") {  // tasks and calls are marked under the host charts
      for (var i = 0; i < tasks.start.length; i++) {
        var sec = Math.floor(tasks.start[i]);
        S.starts[sec] = (S.starts[sec] || 0) + 1;
      }
      charts.hosts = true;
    }
    if (live.timeline) live.timeline.append(t, x);
    else (tasks ? S.pendingTasks : S.pendingTransfers).push([t, x]);
  }

  function addSeries(series, to) {
    var target = to || S.metrics.series;
    for (var panel in series) {
      var into = target[panel] = target[panel] || {};
      for (var rid in series[panel]) {
        var p = series[panel][rid], s = into[rid] = into[rid] || {label: p.label, t: [], v: []};
        s.label = p.label;
        Array.prototype.push.apply(s.t, p.t);
        Array.prototype.push.apply(s.v, p.v);
      }
    }
  }

  function applySnapshot(m) {
    if (live.timeline) { document.getElementById("stream").replaceChildren(); live.timeline = null; }
    S.epoch = m.epoch; S.seq = m.seq; S.name = m.name; S.status = m.status; S.lastS = m.last_s; S.endS = m.end_s;
    showFacts(m.facts || []);
    S.drawn = m.drawn;
    S.progress = m.progress; S.states = m.states; S.rows = m.rows.slice(); S.groups = m.groups.slice();
    S.rowIds = (m.row_ids || []).slice();
    S.warnings = m.warnings.slice(); S.warningCount = m.warning_count;
    S.throughput = Object.assign({}, m.throughput || {});
    S.starts = {};
    S.metrics = {names: m.metrics.names, series: {}};
    S.pendingTasks = []; S.pendingTransfers = [];
    addSeries(m.metrics.series);
    S.diagnostics = {};
    addSeries(m.diagnostics || {}, S.diagnostics);
    charts.hosts = charts.throughput = charts.diagnostics = true;
    ensureTimeline();
    addTasks(m.tasks, null);
    if (m.transfers.start.length) addTasks(null, m.transfers);
    live.snapshots++;
  }

  function applyDelta(d) {
    if (d.seq !== S.seq + 1) throw new Error("delta " + d.seq + " does not follow " + S.seq);
    if (d.rows) {
      Array.prototype.push.apply(S.rows, d.rows);
      Array.prototype.push.apply(S.rowIds, d.row_ids || []);
      if (live.timeline) live.timeline.addRows(d.rows);
    }
    if (d.groups) {
      Array.prototype.push.apply(S.groups, d.groups);
      if (live.timeline) live.timeline.addGroups(d.groups);
    }
    ensureTimeline();
    if (d.relabel) for (var i in d.relabel) {
      S.rows[+i] = d.relabel[i];
      if (live.timeline) live.timeline.setRowLabel(+i, d.relabel[i]);
    }
    if (d.drawn !== undefined) S.drawn = d.drawn;
    if (d.tasks) addTasks(d.tasks, null);
    if (d.transfers) addTasks(null, d.transfers);
    if (d.progress) for (var g in d.progress) S.progress[g] = d.progress[g];
    if (d.states) S.states = d.states;
    if (d.metrics) { S.metrics.names = d.metrics.names; addSeries(d.metrics.series); charts.hosts = true; }
    if (d.diagnostics) { addSeries(d.diagnostics, S.diagnostics); charts.diagnostics = true; }
    if (d.warnings) { S.warnings = S.warnings.concat(d.warnings).slice(-200); S.warningCount = d.warning_count; }
    if (d.throughput) { for (var sec in d.throughput) S.throughput[sec] = d.throughput[sec]; charts.throughput = true; }
    if (d.status !== undefined) { S.status = d.status; S.endS = d.end_s; }
    if (d.last_s !== undefined) S.lastS = d.last_s;
    S.seq = d.seq;
    live.deltas++;
  }

  // ---- drawing (at most once per animation frame) -------------------------------------------------
  // the plotly charts are redrawn only when their data changed, at most once per minMs, and no sooner than keeps
  // their drawing to `share` of the page's time: a plotly redraw costs far more than the stream's (incremental)
  // one (on five pages sharing two cores, 0.1-0.2 s each), and per-second charts gain nothing from more
  var charts = {hosts: false, throughput: false, diagnostics: false, last: -Infinity, timer: 0, cost: 0,
                minMs: 1000, share: 0.05};
  live.charts = charts;
  // a chart out of view keeps its data and is drawn when scrolled to (UI.shown); before the first snapshot the
  // page is empty and every chart looks in view: nothing is drawn (nor plotly.js loaded) for that
  var inView = {};
  ["hosts", "throughput", "diagnostics"].forEach(function (id) {
    inView[id] = UI.shown(document.getElementById(id), function () { if (live.snapshots) requestRender(); });
  });
  function renderCharts() {
    if (!charts.hosts && !charts.throughput && !charts.diagnostics) return;
    var now = global.performance.now();
    var wait = charts.last + Math.max(charts.minMs, charts.cost / charts.share) - now;
    if (wait > 0) {
      if (!charts.timer) charts.timer = global.setTimeout(function () { charts.timer = 0; requestRender(); }, wait);
      return;
    }
    var drewHosts = charts.hosts && inView.hosts() && renderHosts();
    var drewThroughput = charts.throughput && inView.throughput() && renderThroughput();
    var drewDiagnostics = charts.diagnostics && inView.diagnostics() && renderDiagnostics();
    if (drewHosts) charts.hosts = false;
    if (drewThroughput) charts.throughput = false;
    if (drewDiagnostics) charts.diagnostics = false;
    if (drewHosts || drewThroughput || drewDiagnostics) {
      charts.last = global.performance.now();
      charts.cost = charts.last - now;
    }
  }

  // the counters, tables and warnings are rebuilt at most once per RENDER_MS while deltas stream in (the task
  // stream keeps its own pace, timeline.js drawShare): a person reads them no faster, and 20 deltas a second
  // would otherwise rebuild them 20 times
  var RENDER_MS = 250, drawPending = false, lastRender = -Infinity;
  function requestRender() {
    if (drawPending) return;
    drawPending = true;
    var wait = lastRender + RENDER_MS - global.performance.now();
    var frame = function () { global.requestAnimationFrame(function () { drawPending = false; lastRender = global.performance.now(); render(); }); };
    if (wait > 0) global.setTimeout(frame, wait); else frame();
  }

  function totals() {
    var t = {total: 0, done: 0, running: 0, erred: 0};
    for (var g in S.progress) for (var k in t) t[k] += S.progress[g][k] || 0;
    return t;
  }

  function colourOf(group) {
    for (var i = 0; i < S.groups.length; i++) if (S.groups[i].name === group) return S.groups[i].color;
    return "#7f7f7f";
  }

  /** The run's facts from run.json ([label, text] pairs: its command, host, versions), as text. */
  function showFacts(facts) {
    var dl = document.getElementById("run-facts");
    if (!dl) return;
    var items = [];
    facts.forEach(function (f) {
      var dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = f[0]; dd.textContent = f[1];
      items.push(dt, dd);
    });
    dl.replaceChildren.apply(dl, items);
    document.getElementById("run-facts-box").hidden = !items.length;
  }

  /** Whether the run stopped changing (finished, failed, imported): what is not there now will not come. */
  function runOver() { return S.endS !== null && S.endS !== undefined; }

  // what the stream's marks are, by what it draws (analysis/live.py STREAM_CLASSES)
  var STREAM_UNITS = {work: "tasks", state: "states", other: "spans"};

  function render() {
    document.title = "flowscope: " + S.name;
    if (runOver() && !live.timeline && !S.rows.length) {
      document.getElementById("stream").replaceChildren(el("p", "no span in this run: the stream draws the spans " +
        "whose role is task or call; in a run with neither, its states; with none of those, its other spans (as their " +
        "source's mapping says, docs/data-model.md); the profile page " +
        "shows every span, the charts page the run's other records", {"class": "muted"}));
    }
    document.getElementById("run-name").textContent = S.name;
    document.getElementById("run-id").textContent = runId;
    document.getElementById("run-status").replaceChildren(UI.statusBadge(S.status));
    document.getElementById("run-elapsed").textContent = UI.fmtSeconds(S.endS !== null && S.endS !== undefined ? S.endS : S.lastS);
    var t = totals();
    document.getElementById("tasks-done").textContent = UI.fmtInt(t.done);
    document.getElementById("tasks-total").textContent = UI.fmtInt(t.total);
    document.getElementById("tasks-running").textContent = UI.fmtInt(t.running);
    document.getElementById("warning-count").textContent = UI.fmtInt(S.warningCount);

    var body = document.querySelector("#progress tbody");
    body.replaceChildren();
    Object.keys(S.progress).sort().forEach(function (g) {
      var p = S.progress[g], tr = el("tr", null, {"data-group": g});
      tr.appendChild(el("td", g, {"class": "key"}));
      var bar = el("div", null, {"class": "bar", role: "progressbar", "aria-valuemin": "0",
                                 "aria-valuemax": String(p.total), "aria-valuenow": String(p.done),
                                 "aria-label": g + ": tasks done"});
      var done = el("div"), run = el("div", null, {"class": "running"}), c = colourOf(g);
      var frac = p.total ? p.done / p.total : 0, rfrac = p.total ? p.running / p.total : 0;
      done.style.width = (100 * frac) + "%"; done.style.background = c;
      run.style.left = (100 * frac) + "%"; run.style.width = (100 * rfrac) + "%"; run.style.background = c;
      bar.appendChild(done); bar.appendChild(run);
      var td = el("td"); td.appendChild(bar); tr.appendChild(td);
      tr.appendChild(el("td", UI.fmtInt(p.done) + " / " + UI.fmtInt(p.total), {"class": "num"}));
      tr.appendChild(el("td", UI.fmtInt(p.running), {"class": "num"}));
      tr.appendChild(el("td", UI.fmtInt(p.erred), {"class": "num"}));
      body.appendChild(tr);
    });

    var sb = document.querySelector("#states tbody");
    sb.replaceChildren();
    Object.keys(S.states).sort().forEach(function (s) {
      var tr = el("tr", null, {"data-state": s});
      tr.appendChild(el("td", s));
      tr.appendChild(el("td", UI.fmtInt(S.states[s]), {"class": "num"}));
      sb.appendChild(tr);
    });

    document.getElementById("stream-count").textContent =
      !live.timeline ? "(no tasks yet)" :
      !live.timeline.count && live.timeline.xfer && live.timeline.xfer.n ?  // a run of transfers alone
        "(" + UI.fmtInt(live.timeline.xfer.n) + " transfers)" :
        "(" + UI.fmtInt(live.timeline.count) + " " + (STREAM_UNITS[S.drawn] || "tasks") + ")";

    var wl = document.getElementById("warnings");
    wl.replaceChildren();
    S.warnings.slice(-50).reverse().forEach(function (w) {
      var text = "[" + UI.fmtSeconds(w.t) + "] " + w.level + " " + w.category + ": " + w.message +
                 (w.task_key ? " (task " + w.task_key + ")" : "") + (w.resource ? " on " + w.resource : "");
      wl.appendChild(el("li", text));
    });
    renderCharts();
    showWantedTask();
    showWantedResource();
    needPlotly();  // loaded once the page is painted, charts or not yet: not later, in the middle of a live run
    live.renders = (live.renders || 0) + 1;
  }

  // plotly.js (4.8 MB) draws the throughput and host charts only: it is loaded after the stream and the tables
  // were first painted, so that parsing it never delays them (the first render of a finished run), and then at
  // once, so that a live run's first charts do not stall the page while records stream in
  var plotly = {state: global.Plotly ? "loaded" : "none"};
  live.plotly = plotly;
  live.needPlotly = function () { return needPlotly(); };  // panels.js asks for it too
  function needPlotly() {
    if (plotly.state !== "none") return plotly.state === "loaded";
    plotly.state = "waiting";
    // two frames: the one that paints what render() just set, then load
    global.requestAnimationFrame(function () { global.requestAnimationFrame(function () {
      var s = document.createElement("script");
      s.src = "/ui/static/plotly.min.js";
      s.async = true;
      s.onload = function () { plotly.state = "loaded"; requestRender(); };
      s.onerror = function () { plotly.state = "failed"; };
      plotly.state = "loading";
      document.head.appendChild(s);
    }); });
    return false;
  }

  var PANELS = {cpu: {"cpu.percent": ["CPU busy, % of all cores", 1], "process.cpu.percent": ["process CPU, % of one core", 1]},
                memory: {"memory.used_bytes": ["memory in use, GiB", 1 / 1073741824],
                         "process.memory.rss_bytes": ["process memory (RSS), GiB", 1 / 1073741824]},
                net_rx: {"net.rx_bytes_per_s": ["network received, MiB/s", 1 / 1048576]},
                net_tx: {"net.tx_bytes_per_s": ["network sent, MiB/s", 1 / 1048576]},
                disk_read: {"disk.read_bytes_per_s": ["disk read, MiB/s", 1 / 1048576]},
                disk_write: {"disk.write_bytes_per_s": ["disk written, MiB/s", 1 / 1048576]}};
  var PANEL_ORDER = ["cpu", "memory", "net_rx", "net_tx", "disk_read", "disk_write"];
  var COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
  function renderHosts() {
    var panels = PANEL_ORDER.filter(function (p) { return S.metrics.series[p]; });
    var div = document.getElementById("hosts");
    if (!panels.length) {
      if (runOver()) {
        div.replaceChildren(el("p", "no hardware samples in this run: flowscope's hardware sampler records them while a " +
                                    "run is observed (observe(), flowscope run, flowscope monitor); an imported trace " +
                                    "has them only if its tool recorded any", {"class": "muted"}));
      }
      return true;
    }
    if (!needPlotly()) return false;
    if (!live.hostsPlotted) div.replaceChildren();
    var starts = Object.keys(S.starts).map(Number).sort(function (a, b) { return a - b; });
    var n = panels.length + (starts.length ? 1 : 0);
    var traces = [], layout = {height: 150 * n + 60, margin: {l: 50, r: 10, t: 24, b: 36},
                               legend: {orientation: "h"}, showlegend: true, annotations: []};
    var seen = {}, hostColour = {};
    panels.forEach(function (p, i) {
      var name = S.metrics.names[p], spec = PANELS[p][name] || [name, 1];
      var axis = i ? "y" + (i + 1) : "y";
      var dom = [1 - (i + 1) / n + 0.08, 1 - i / n];
      layout[i ? "yaxis" + (i + 1) : "yaxis"] = {domain: dom, rangemode: "tozero", title: {text: spec[0], font: {size: 11}}};
      Object.keys(S.metrics.series[p]).sort().forEach(function (rid) {
        var s = S.metrics.series[p][rid];
        if (!(rid in hostColour)) hostColour[rid] = COLOURS[Object.keys(hostColour).length % COLOURS.length];
        traces.push({type: "scatter", mode: "lines", x: s.t, y: s.v.map(function (v) { return v * spec[1]; }),
                     yaxis: axis, name: s.label, legendgroup: rid, showlegend: !seen[rid],
                     line: {color: hostColour[rid], width: 1.6},
                     hovertemplate: "%{x:.1f} s: %{y:.3~f}<extra></extra>"});
        seen[rid] = true;
      });
    });
    if (starts.length) {  // the tasks started per second, under the hosts: busy hosts while tasks start, or not
      traces.push({type: "bar", name: "task starts", x: starts.map(function (s) { return s + 0.5; }),
                   y: starts.map(function (s) { return S.starts[s]; }), width: 1, yaxis: "y" + n,
                   marker: {color: "#555"}, hovertemplate: "%{x:.0f} s: %{y} started<extra></extra>"});
      layout["yaxis" + n] = {domain: [0, 1 / n - 0.08], rangemode: "tozero", title: {text: "task starts / s", font: {size: 11}}};
    }
    layout.xaxis = {title: {text: "seconds since the run started"}, anchor: n > 1 ? "y" + n : "y"};
    Plotly.react(div, traces, layout, {displaylogo: false, responsive: true});
    live.hostsPlotted = true;
    return true;
  }

  /** The program's own published numbers, one panel per series (a logarithmic axis where a positive series
   *  spans more than three decades, as an instability's does). */
  function renderDiagnostics() {
    var panels = Object.keys(S.diagnostics).sort();
    var div = document.getElementById("diagnostics");
    if (!panels.length) return true;
    if (!needPlotly()) return false;
    if (!live.diagnosticsPlotted) div.replaceChildren();
    var traces = [], layout = {height: 140 * panels.length + 60, margin: {l: 60, r: 10, t: 24, b: 36},
                               legend: {orientation: "h"}, showlegend: true};
    panels.forEach(function (p, i) {
      var axis = i ? "y" + (i + 1) : "y", lo = Infinity, hi = -Infinity;
      Object.keys(S.diagnostics[p]).sort().forEach(function (rid, j) {
        var s = S.diagnostics[p][rid];
        s.v.forEach(function (v) { lo = Math.min(lo, v); hi = Math.max(hi, v); });
        traces.push({type: "scatter", mode: "lines", x: s.t, y: s.v, yaxis: axis,
                     name: p.replace(":", " ") + (j ? " (" + s.label + ")" : ""),
                     line: {color: COLOURS[(i + j) % COLOURS.length], width: 1.6},
                     hovertemplate: "%{x:.2f} s: %{y:.4~g}<extra></extra>"});
      });
      var log = lo > 0 && hi / lo > 1e3;
      layout[i ? "yaxis" + (i + 1) : "yaxis"] = {domain: [1 - (i + 1) / panels.length + 0.06, 1 - i / panels.length],
                                                type: log ? "log" : "linear", exponentformat: "e",
                                                title: {text: p.split(":").pop(), font: {size: 10}}};
    });
    layout.xaxis = {title: {text: "seconds since the run started"}, anchor: panels.length > 1 ? "y" + panels.length : "y"};
    Plotly.react(div, traces, layout, {displaylogo: false, responsive: true});
    live.diagnosticsPlotted = true;
    return true;
  }

  /** Tasks finished per second (task spans by the second they ended in), as bars. */
  function renderThroughput() {
    var div = document.getElementById("throughput");
    var secs = Object.keys(S.throughput).map(Number).sort(function (a, b) { return a - b; });
    // a live run's empty chart is drawn as soon as plotly.js is there: a chart's first drawing costs several of
    // its redraws (0.2-0.4 s on five pages sharing two cores), better paid before the first tasks than among them
    if (!secs.length && (runOver() || live.throughputPlotted)) return true;
    if (!needPlotly()) return false;
    if (!live.throughputPlotted) div.replaceChildren();
    Plotly.react(div, [{type: "bar", x: secs.map(function (s) { return s + 0.5; }),
                        y: secs.map(function (s) { return S.throughput[s]; }), width: 1, marker: {color: "#3182bd"},
                        hovertemplate: "%{x:.0f} s: %{y} tasks<extra></extra>"}],
                 {height: 200, margin: {l: 50, r: 10, t: 10, b: 36}, bargap: 0.05,
                  xaxis: {title: {text: "seconds since the run started"}, rangemode: "tozero"},
                  yaxis: {title: {text: "tasks finished / s"}, rangemode: "tozero"}},
                 {displaylogo: false, responsive: true});
    live.throughputPlotted = true;
    return true;
  }

  // ---- the channel's messages: text, or a binary frame with the stream's columns (service/frames.py) ------------
  var UTF8 = new TextDecoder();
  /** A message as an object; a binary frame's column sets become typed arrays over the frame (keys: Texts). */
  function readMessage(data) {
    if (typeof data === "string") return JSON.parse(data);
    var h = new DataView(data).getUint32(0, true);
    var m = JSON.parse(UTF8.decode(new Uint8Array(data, 4, h)));
    var items = m.type === "deltas" ? m.deltas : [m], base = (4 + h + 7) & ~7;
    if (!Array.isArray(m.body) || m.body.length !== items.length) {
      throw new Error("a binary message without one body length per item");
    }
    items.forEach(function (it, i) {
      if (base + m.body[i] > data.byteLength) {
        throw new Error("a part of the message ends at byte " + (base + m.body[i]) + ", the message at " + data.byteLength);
      }
      (it.binary || []).forEach(function (k) { it[k] = columnsOf(k, it[k], data, base, base + m.body[i]); });
      delete it.binary;
      base += m.body[i];
    });
    return m;
  }
  function columnsOf(what, v, buf, base, end) {
    if (!v || typeof v.n !== "number" || !v.columns) throw new Error(what + ": no column set in the message");
    var out = {}, n = v.n;
    for (var name in v.columns) {
      var c = v.columns[name], size = c[0] === "f64" ? 8 : 4;
      if (base + c[1] + size * (c[0] === "utf8" ? n + 1 : n) > end || (c[0] === "utf8" && base + c[2] + c[3] > end)) {
        throw new Error(what + "." + name + " lies outside its part of the message");
      }
      if (c[0] === "f64") out[name] = new Float64Array(buf, base + c[1], n);
      else if (c[0] === "i32") out[name] = new Int32Array(buf, base + c[1], n);
      else if (c[0] === "utf8") {
        out[name] = new FlowscopeTimeline.Texts(new Int32Array(buf, base + c[1], n + 1), new Uint8Array(buf, base + c[2], c[3]));
      } else throw new Error(what + "." + name + ": unknown column type " + c[0]);
    }
    return out;
  }
  live.readMessage = readMessage;

  // ---- the connection ---------------------------------------------------------------------------
  var backoff = 250;
  function connect() {
    if (live.paused) return;
    var proto = location.protocol === "https:" ? "wss:" : "ws:";
    var q = S.epoch !== null ? "?epoch=" + encodeURIComponent(S.epoch) + "&since=" + S.seq : "";
    var ws = live.socket = new WebSocket(proto + "//" + location.host + "/v1/ui/runs/" + encodeURIComponent(runId) + "/live" + q);
    ws.binaryType = "arraybuffer";
    var conn = document.getElementById("conn");
    var first = true;
    live.connects++;
    ws.onopen = function () { conn.textContent = "live"; backoff = 250; };
    ws.onmessage = function (ev) {
      var m;
      try {
        m = readMessage(ev.data);
        if (m.type === "snapshot") applySnapshot(m);
        else if (m.epoch !== S.epoch) throw new Error("deltas of another epoch");
        else m.deltas.forEach(applyDelta);
      } catch (e) {  // out of step: start again from a snapshot
        live.errors.push(String(e.message || e));
        S.epoch = null;
        ws.close();
        return;
      }
      if (first) { live.lastCatchUp = m.type; first = false; }
      requestRender();
    };
    ws.onclose = function () {
      if (live.socket === ws) live.socket = null;
      conn.textContent = live.paused ? "paused" : "reconnecting";
      if (!live.paused) { setTimeout(connect, backoff); backoff = Math.min(5000, backoff * 2); }
    };
  }
  /** Close the connection and stay away until resume() (tests use it to miss deltas). */
  live.pause = function () { live.paused = true; if (live.socket) live.socket.close(); };
  live.resume = function () { live.paused = false; if (!live.socket) connect(); };
  /** Render at the next frame the counters, tables and charts allow (their own paces). */
  live.requestRender = function () { requestRender(); };
  /** What the page shows, for tests: totals of the progress table, tasks in the stream, states, seq. */
  live.summary = function () {
    var t = totals();
    return {seq: S.seq, epoch: S.epoch, total: t.total, done: t.done, running: t.running,
            stream: live.timeline ? live.timeline.count : 0, states: S.states, status: S.status,
            rows: S.rows.length, groups: S.groups.length, warnings: S.warningCount,
            shown_done: document.getElementById("tasks-done").textContent};
  };
  document.querySelectorAll("#run-nav a").forEach(function (a) {
    var page = a.getAttribute("data-page");
    a.setAttribute("href", UI.pageHref(runId, page));
    if (!page) a.setAttribute("aria-current", "page");
  });
  UI.offlineLink(runId);
  connect();
})(window);
