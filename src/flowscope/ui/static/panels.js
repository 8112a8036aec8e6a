/* flowscope run overview: the panels computed by analyses rather than kept by the live view.
 * - The advisor's first findings: the `advisor` view (analysis.advisor.explain), brought by one WebSocket and
 *   again whenever the run changed, as the analysis pages are.
 * - Memory per worker process: the `memory` view (analysis.memory.process_memory), one WebSocket that brings it
 *   and brings it again whenever the run changed (as the analysis pages do).
 * - Forecast: GET /v1/runs/RUN_ID/forecast?event=E&fraction=F[&window=N]&max_age=auto (analysis.forecast.predict),
 *   fetched again when the live view moved on (a new delta or status; at most once a second) or the event, fraction
 *   or frame size changed; all are kept in the URL's query (?event=&fraction=&window=; no window: the server's
 *   window-size model for the event, else the default).
 * - The charts, the forecast and the memory view are drawn, asked for and computed only once scrolled into view.
 * Strings from the observed program are set as text, and escaped for plotly.js's labels. */
(function (global) {
  "use strict";
  var UI = global.flowscopeUI, el = UI.el;
  var runId = UI.route().runId;
  var P = global.flowscopePanels = {
    memory: {doc: null, updates: 0, renders: 0, socket: null, connected: false},
    advisor: {doc: null, updates: 0, renders: 0, socket: null},
    forecast: {doc: null, url: null, fetches: 0, renders: 0, error: null, pending: false, deferred: 0},
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
    var f = P.forecast, doc = f.doc;
    var facts = document.getElementById("fc-facts"), note = document.getElementById("fc-note"),
        div = document.getElementById("fc-chart");
    if (f.error) {
      facts.replaceChildren(el("span", f.error, {"class": "muted", id: "fc-error"}));
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
  var seen = null, lastFetch = 0;
  function fetchForecast() {
    var f = P.forecast, url = forecastUrl();
    f.pending = true; lastFetch = Date.now(); f.fetches++;
    // max_age=auto: the collector may answer with a prediction a little older than the run, so that however
    // many pages watch, recomputing it keeps to a small share of a core (service/forecast_routes.py)
    return fetch(url + "&max_age=auto", {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      return r.text().then(function (text) {
        if (url !== forecastUrl()) return;  // the query changed meanwhile: its own fetch follows
        // the same answer as the one drawn (the run moved on, the prediction did not): nothing to draw again
        if (r.ok && url === f.url && text === f.text && !f.error) return;
        var body = JSON.parse(text);
        f.url = url; f.text = r.ok ? text : null;
        if (r.ok) { f.doc = body; f.error = null; } else { f.doc = null; f.error = body.error || ("HTTP " + r.status); }
        renderForecast();
      });
    }).catch(function (e) { f.error = String(e.message || e); renderForecast(); })
      .then(function () { f.pending = false; });
  }
  function changed() {  // the live view's position: a new delta, snapshot or status means new records
    var L = global.flowscopeLive, s = L && L.state;
    return s ? s.epoch + "/" + s.seq + "/" + s.status : null;
  }
  // the forecast is asked of the server (which computes it) only while its panel is in view, and at once when
  // the user scrolls to it
  var forecastInView = UI.shown(document.getElementById("fc-chart"), function () { tick(); });
  function tick() {
    var now = changed(), L = global.flowscopeLive;
    // before the first snapshot the page is empty and every panel looks in view: what is in view is known after it
    if (!L || !L.snapshots) { P.forecast.deferred++; return; }
    if (memoryInView()) connectMemory();
    if (!forecastInView()) { P.forecast.deferred++; return; }
    if (P.forecast.pending || Date.now() - lastFetch < 1000) return;
    if (now !== seen || (P.forecast.url !== forecastUrl())) { seen = now; fetchForecast(); }
  }
  function onQuery() {
    var v = Number(fractionIn.value);
    if (!(v >= 0 && v <= 1)) { P.forecast.error = "fraction: a number within [0, 1]"; renderForecast(); return; }
    var w = windowIn.value;
    if (w !== "" && !(/^\d+$/.test(w) && Number(w) >= 1)) {
      P.forecast.error = "window: a whole number of samples, 1 or more (empty: the model's or the default)";
      renderForecast();
      return;
    }
    query = {event: eventSel.value, fraction: fractionIn.value, window: w};
    setParam("event", eventSel.value); setParam("fraction", fractionIn.value); setParam("window", w);
    lastFetch = 0; tick();
  }
  eventSel.addEventListener("change", onQuery);
  fractionIn.addEventListener("change", onQuery);
  windowIn.addEventListener("change", onQuery);
  P.refreshForecast = fetchForecast;
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
