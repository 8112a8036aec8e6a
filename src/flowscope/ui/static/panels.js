/* flowscope run overview: the panels computed by analyses rather than kept by the live view.
 * - The advisor's first findings: the `advisor` view (analysis.advisor.explain), brought by one WebSocket and
 *   again whenever the run changed, as the analysis pages are.
 * - Memory per worker process: the `memory` view (analysis.memory.process_memory), one WebSocket that brings it
 *   and brings it again whenever the run changed (as the analysis pages do).
 * - Forecast: one WebSocket, /v1/runs/RUN_ID/forecast/live?event=E&fraction=F[&window=N] (analysis.forecast.predict),
 *   which brings the forecast and brings it again whenever the server's answer changed (the run moved on); another
 *   event, fraction or frame size opens another; all are kept in the URL's query (?event=&fraction=&window=; no
 *   window: the server's window-size model for the event, else the default).
 * - The charts, the forecast and the memory view are drawn, asked for and computed only once scrolled into view.
 * Strings from the observed program are set as text, and escaped for plotly.js's labels. */
(function (global) {
  "use strict";
  var UI = global.flowscopeUI, el = UI.el;
  var runId = UI.route().runId;
  var P = global.flowscopePanels = {
    memory: {doc: null, updates: 0, renders: 0, socket: null, connected: false},
    advisor: {doc: null, updates: 0, renders: 0, socket: null},
    forecast: {doc: null, url: null, connects: 0, pushes: 0, renders: 0, error: null, invalid: null, pending: false,
               deferred: 0, socket: null},
    errors: []
  };
  var params = new URLSearchParams(location.search);
  function setParam(k, v) {
    if (v === "") params.delete(k); else params.set(k, String(v));
    history.replaceState(null, "", UI.withQuery(params.toString()));
  }
  var pt = UI.pt, pct = UI.pct, fmtDur = UI.fmtDur;
  // plotly.js arrives after the page's first paint (live.js loads it): a chart asked for before then is drawn
  // again once it is there; a chart out of view is drawn when scrolled to (UI.shown); only a chart actually drawn
  // counts as a render
  var inView = {}, whenShown = {};
  function plot(div, traces, layout, again) {
    if (!inView[div.id]) inView[div.id] = UI.shown(div, function () { if (whenShown[div.id]) whenShown[div.id](); });
    if (!inView[div.id]()) { whenShown[div.id] = again; return false; }
    if (!global.Plotly) {
      if (global.flowscopeLive && global.flowscopeLive.needPlotly) global.flowscopeLive.needPlotly();
      global.setTimeout(again, 200);
      return false;
    }
    if (!div.data) div.replaceChildren();
    Plotly.react(div, traces, layout, {displaylogo: false, responsive: true});
    return true;
  }

  // ---- memory per worker process -----------------------------------------------------------------
  var MIB = 1048576;
  var MEMORY_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                       "#bcbd22", "#17becf"];
  function renderMemory() {
    var doc = P.memory.doc, div = document.getElementById("memory");
    if (!doc) return;
    if (doc.failed) { div.replaceChildren(el("p", "memory: " + doc.failed, {"class": "error"})); return; }
    if (!doc.processes.length) {
      div.replaceChildren(el("p", "no per-process memory samples yet (" + doc.metric + " of a process that runs work)",
                              {"class": "muted nodata"}));
      return;
    }
    // per process: its resident size, and where the runtime samples them (Dask's workers) the data it holds in
    // memory ("managed", dashed: resident less managed is what Dask calls unmanaged) and what it spilled to disk
    // (dotted), in the process's colour
    var traces = [], parts = [["bytes", "resident", "solid"], ["managed", "managed", "dash"],
                              ["spilled", "spilled to disk", "dot"]];
    var detailed = doc.processes.some(function (p) { return p.managed || p.spilled; });
    doc.processes.forEach(function (p, i) {
      var color = MEMORY_COLORS[i % MEMORY_COLORS.length];
      parts.forEach(function (part) {
        var ys = p[part[0]];
        if (!ys) return;
        var name = pt(p.label) + (detailed ? " " + part[1] : "");
        traces.push({type: "scatter", mode: "lines", x: p.t, name: name, legendgroup: pt(p.label),
                     y: ys.map(function (b) { return b === null ? null : b / MIB; }),
                     line: {width: 1.6, color: color, dash: part[2]},
                     hovertemplate: name + " %{x:.1f} s: %{y:.1f} MiB<extra></extra>"});
      });
    });
    var drawn = plot(div, traces, {height: 260, margin: {l: 60, r: 10, t: 10, b: 40}, legend: {orientation: "h"},
         showlegend: true, xaxis: {title: {text: "seconds since the run started"}, rangemode: "tozero"},
         yaxis: {title: {text: detailed ? "memory, MiB" : "resident memory, MiB"}, rangemode: "tozero"}}, renderMemory);
    if (drawn) P.memory.renders++;
  }

  // ---- the advisor's first findings ---------------------------------------------------------------
  var FINDINGS_SHOWN = 3;
  function renderAdvisor() {
    var d = P.advisor.doc, div = document.getElementById("advisor");
    if (!d) return;
    if (d.failed) { div.replaceChildren(el("p", "advisor: " + d.failed, {"class": "error"})); return; }
    var out = [];
    var t = el("table", null, {"class": "attribution"}), head = el("tr");
    [["part"], ["seconds", 1], ["share", 1]].forEach(function (h) { head.appendChild(el("th", h[0], h[1] ? {"class": "num"} : null)); });
    var th = el("thead"); th.appendChild(head); t.appendChild(th);
    var tb = el("tbody");
    (d.attribution || []).forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", r.label));
      tr.appendChild(el("td", fmtDur(r.seconds), {"class": "num seconds", "data-value": String(r.seconds)}));
      tr.appendChild(el("td", pct(r.share), {"class": "num"}));
      tb.appendChild(tr);
    });
    t.appendChild(tb);
    var findings = el("div", null, {"class": "findings"});
    var fs = d.findings || [];
    if (!fs.length) findings.appendChild(el("p", "no finding: nothing here stands out", {"class": "muted nodata"}));
    fs.slice(0, FINDINGS_SHOWN).forEach(function (f) {
      var box = el("div", null, {"class": "finding", "data-rule": f.rule,
                                 "data-recoverable": f.recoverable_s === null ? "" : String(f.recoverable_s)});
      var h = el("h3");
      h.appendChild(el("span", f.title, {"class": "title"}));
      h.appendChild(el("span", f.recoverable_s === null ? "  (recoverable time not estimated)" :
                       "  (recoverable: about " + fmtDur(f.recoverable_s) + ")", {"class": "muted"}));
      box.appendChild(h);
      box.appendChild(el("p", f.change, {"class": "change"}));
      findings.appendChild(box);
    });
    if (fs.length > FINDINGS_SHOWN) findings.appendChild(el("p", (fs.length - FINDINGS_SHOWN) + " more on the advisor's page",
                                                            {"class": "muted"}));
    var grid = el("div", null, {"class": "grid"});
    grid.appendChild(findings); grid.appendChild(t);
    out.push(grid);
    div.replaceChildren.apply(div, out);
    P.advisor.renders++;
  }

  var backoff = {memory: 250, advisor: 250};
  /** One WebSocket that brings the view ``name`` and brings it again whenever the run changed. */
  function connectView(name, render, share) {
    var proto = location.protocol === "https:" ? "wss:" : "ws:";
    var ws = P[name].socket = new WebSocket(proto + "//" + location.host + "/v1/ui/runs/" +
                                            encodeURIComponent(runId) + "/views/" + name + "/live" +
                                            (share ? "?share=" + share : ""));
    ws.onopen = function () { backoff[name] = 250; };
    ws.onmessage = function (ev) {
      var m = JSON.parse(ev.data);
      if (m.type !== "view") return;
      P[name].doc = m.doc; P[name].updates++;
      try { render(); } catch (e) { P.errors.push(String(e.message || e)); throw e; }
    };
    ws.onclose = function () {
      if (P[name].socket === ws) P[name].socket = null;
      setTimeout(function () { connectView(name, render, share); }, backoff[name]);
      backoff[name] = Math.min(5000, backoff[name] * 2);
    };
  }

  // ---- forecast ----------------------------------------------------------------------------------
  var eventSel = document.getElementById("fc-event"), fractionIn = document.getElementById("fc-fraction"),
      windowIn = document.getElementById("fc-window-size");
  if (params.get("event")) eventSel.value = params.get("event");
  if (params.get("fraction")) fractionIn.value = params.get("fraction");
  if (params.get("window")) windowIn.value = params.get("window");

  function renderForecast() {
    var f = P.forecast, doc = f.doc, error = f.invalid || f.error;
    var facts = document.getElementById("fc-facts"), note = document.getElementById("fc-note"),
        div = document.getElementById("fc-chart");
    if (error) {
      facts.replaceChildren(el("span", error, {"class": "muted", id: "fc-error"}));
      note.textContent = "";
      return;
    }
    if (!doc) return;
    facts.replaceChildren();
    function fact(label, text, id, value) {
      var d = el("div", label + " ");
      var b = el("b", text, {id: id});
      if (value !== null && value !== undefined) b.setAttribute("data-value", String(value));
      d.appendChild(b);
      facts.appendChild(d);
    }
    fact("at least", doc.threshold + " of " + doc.resources + " resources " + doc.event, "fc-threshold", doc.threshold);
    fact("hit rate so far", doc.hit_rate === null ? "- (fewer than 2 frames)" : pct(doc.hit_rate) + " (" + doc.hits +
         " of " + doc.judged + " frames)", "fc-hit-rate", doc.hit_rate);
    fact("next frame", doc.next ? pct(doc.next.likelihood) : "-", "fc-next", doc.next ? doc.next.likelihood : null);
    fact("frame", doc.window + " samples, " + UI.fmtSeconds(doc.frame_ns / 1e9), "fc-window", doc.window);
    note.textContent = "window " + doc.window_source + ": " + doc.note;
    note.setAttribute("data-source", doc.window_source);
    var t0 = doc.signal.t0_ns, xs = doc.frames.map(function (r) { return (r.start_ns - t0) / 1e9; });
    if (!doc.frames.length) {
      div.replaceChildren(el("p", "no complete frame yet", {"class": "muted nodata"}));
      f.renders++;
      return;
    }
    var hover = "frame %{customdata}: %{y:.3f}<extra>%{fullData.name}</extra>",
        ids = doc.frames.map(function (r) { return r.frame; });
    var drawn = plot(div, [
      {type: "scatter", mode: "lines+markers", name: "predicted likelihood", x: xs, customdata: ids,
       y: doc.frames.map(function (r) { return r.likelihood; }), line: {color: "#3182bd", shape: "hv"},
       marker: {size: 4}, hovertemplate: hover},
      {type: "scatter", mode: "lines+markers", name: "observed", x: xs, customdata: ids,
       y: doc.frames.map(function (r) { return r.observed; }), line: {color: "#e6550d", shape: "hv", dash: "dot"},
       marker: {size: 4}, hovertemplate: hover}
    ], {height: 240, margin: {l: 60, r: 10, t: 10, b: 40}, legend: {orientation: "h"},
        xaxis: {title: {text: "frame start, seconds since the first activity"}, rangemode: "tozero"},
        yaxis: {title: {text: "share of the frame"}, range: [0, 1.05]}}, renderForecast);
    if (drawn) f.renders++;
  }

  // the query asked of the server: what the fields held when last committed (a change event) and found valid, not
  // what is being typed in them
  var query = {event: eventSel.value, fraction: fractionIn.value, window: windowIn.value};
  function forecastUrl() {
    return "/v1/runs/" + encodeURIComponent(runId) + "/forecast?event=" + encodeURIComponent(query.event) +
           "&fraction=" + encodeURIComponent(query.fraction) +
           (query.window ? "&window=" + encodeURIComponent(query.window) : "");
  }
  var forecastBackoff = 250, refreshed = [];
  /** The socket that brings the forecast of the committed query (a new one when the query changed; ``again``: a new
   *  one even if not). A refused query is not asked again until it changes. */
  function connectForecast(again) {
    var f = P.forecast, url = forecastUrl();
    if (f.socket && f.socketUrl === url && !again) return;
    if (f.socket) { var old = f.socket; f.socket = null; old.onclose = null; old.close(); }
    if (!again && f.refusedUrl === url) return;
    var proto = location.protocol === "https:" ? "wss:" : "ws:";
    var ws = f.socket = new WebSocket(proto + "//" + location.host + url.replace("/forecast?", "/forecast/live?"));
    f.socketUrl = url; f.refusedUrl = null; f.pending = true; f.connects++;
    ws.onopen = function () { forecastBackoff = 250; };
    ws.onmessage = function (ev) {
      if (f.socket !== ws) return;
      var m = JSON.parse(ev.data);
      f.pending = false; f.pushes++;
      var done = refreshed; refreshed = [];
      try {
        if (m.type === "refused") {
          f.refusedUrl = url; f.url = url; f.text = null; f.doc = null; f.error = m.error;
        } else {
          // the same answer as the one drawn: nothing to draw again (a plotly redraw costs a watching page more
          // than anything else it does)
          if (m.status === 200 && url === f.url && ev.data === f.text && !f.error) return;
          f.url = url; f.text = m.status === 200 ? ev.data : null;
          if (m.status === 200) { f.doc = m.doc; f.error = null; } else { f.doc = null; f.error = m.error || ("HTTP " + m.status); }
        }
        if (!f.invalid) renderForecast();  // (a field refused on the page keeps its message until it is put right)
      } finally { done.forEach(function (resolve) { resolve(); }); }
    };
    ws.onclose = function () {
      if (f.socket !== ws) return;
      f.socket = null; f.pending = false;
      if (f.refusedUrl === url) return;
      setTimeout(function () { if (!f.socket) connectForecast(); }, forecastBackoff);
      forecastBackoff = Math.min(5000, forecastBackoff * 2);
    };
  }
  /** Ask for the forecast again on a new socket; resolves once its first answer was taken (tests). */
  function refreshForecast() {
    return new Promise(function (resolve) { refreshed.push(resolve); connectForecast(true); });
  }
  // the forecast is asked of the server (which computes it) only while its panel is in view, and at once when
  // the user scrolls to it; once asked, its socket stays open and the server sends what changed
  var forecastInView = UI.shown(document.getElementById("fc-chart"), function () { tick(); });
  function tick() {
    var L = global.flowscopeLive;
    // before the first snapshot the page is empty and every panel looks in view: what is in view is known after it
    if (!L || !L.snapshots) { P.forecast.deferred++; return; }
    if (memoryInView()) connectMemory();
    if (!P.forecast.socket && !P.forecast.socketUrl && !forecastInView()) { P.forecast.deferred++; return; }
    connectForecast();
  }
  function onQuery() {
    var f = P.forecast, v = Number(fractionIn.value), w = windowIn.value;
    f.invalid = !(v >= 0 && v <= 1) ? "fraction: a number within [0, 1]" :
      w !== "" && !(/^\d+$/.test(w) && Number(w) >= 1) ?
        "window: a whole number of samples, 1 or more (empty: the model's or the default)" : null;
    if (f.invalid) { renderForecast(); return; }
    query = {event: eventSel.value, fraction: fractionIn.value, window: w};
    setParam("event", eventSel.value); setParam("fraction", fractionIn.value); setParam("window", w);
    tick();
  }
  eventSel.addEventListener("change", onQuery);
  fractionIn.addEventListener("change", onQuery);
  windowIn.addEventListener("change", onQuery);
  P.refreshForecast = refreshForecast;
  setInterval(tick, 250);
  document.getElementById("to-advisor").setAttribute("href", UI.pageHref(runId, "advisor"));
  // every open overview follows the advisor: a smaller share of a core than a page the user opened for it
  connectView("advisor", renderAdvisor, "panel");
  // the memory view is computed for the pages that show it: its socket opens when the panel first comes in view
  function connectMemory() {
    if (!P.memory.connected) { P.memory.connected = true; connectView("memory", renderMemory, "panel"); }
  }
  var memoryInView = UI.shown(document.getElementById("memory"), function () { tick(); });
})(window);
