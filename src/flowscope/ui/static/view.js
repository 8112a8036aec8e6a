/* flowscope analysis pages of a run (/ui/runs/RUN_ID/PAGE): the critical path, the profile and breakdown, the
 * anomalies (Chimbuko's views) and the logs. One WebSocket per page brings the view, computed by the collector
 * with the analysis functions the report uses, and brings it again whenever the run changed (at most once a
 * second). Selections live in the URL's query, so every page and selection has a link that reopens it.
 * Every string from the observed program is set as text (textContent), and escaped for plotly.js's labels. */
(function (global) {
  "use strict";
  var UI = global.flowscopeUI, el = UI.el;
  var here = UI.route(), runId = here.runId, view = here.page;
  var V = global.flowscopeView = {runId: runId, view: view, doc: null, updates: 0, connects: 0, renders: 0,
                                  errors: [], socket: null, paused: false};
  var params = new URLSearchParams(location.search);
  var TITLES = {"advisor": "Advisor: where the time went, and what to change", "critical-path": "Critical path", "profile": "Profile and breakdown", "anomalies": "Anomalies",
                "logs": "Logs and warnings", "charts": "Charts: task states, I/O, communication and warnings over time"};

  // ---- small helpers -----------------------------------------------------------------------------
  function param(k, dflt) { var v = params.get(k); return v === null ? dflt : v; }
  /** Keep a selection in the URL (replaceState: the link reopens the page as it is). */
  function setParam(k, v) {
    if (v === null || v === undefined || v === "") params.delete(k); else params.set(k, String(v));
    var q = params.toString();
    history.replaceState(null, "", UI.withQuery(q));
  }
  var fmtDur = UI.fmtDur, pct = UI.pct, fmtBytes = UI.fmtBytes, numCell = UI.numCell, pt = UI.pt, table = UI.table,
      section = UI.section;
  function fx(v, n) { return (v === null || v === undefined) ? "-" : v.toFixed(n); }
  // what a person did on the page drawn before (render() replaces it): the charts' zoom, by the chart's id
  var zoomed = {};
  function plot(div, traces, layout) {
    if (!global.Plotly) return;
    layout.margin = layout.margin || {l: 60, r: 10, t: 30, b: 40};
    var z = div.id && zoomed[div.id];
    if (z) Object.keys(z).forEach(function (ax) { layout[ax] = Object.assign({}, layout[ax], {range: z[ax], autorange: false}); });
    Plotly.react(div, traces, layout, {displaylogo: false, responsive: true});
  }
  function nodata(text) { return el("p", text, {"class": "nodata muted"}); }

  // ---- critical path -----------------------------------------------------------------------------
  function attributionTable(rows, what) {
    var t = table("attribution " + what, [[what], ["time", 1], ["share", 1], ["steps", 1]]), b = t.tBodies[0];
    rows.forEach(function (r) {
      var tr = el("tr", null, {"data-name": r.name === null ? "" : r.name});
      tr.appendChild(el("td", r.name === null ? "(none)" : r.name, {"class": "key name"}));
      tr.appendChild(numCell(fmtDur(r.seconds), r.seconds, "seconds"));
      tr.appendChild(numCell(pct(r.share), r.share, "share"));
      tr.appendChild(numCell(UI.fmtInt(r.steps), r.steps, "steps"));
      b.appendChild(tr);
    });
    return t;
  }

  function renderPath(into, p, id) {
    var chart = el("div", null, {"class": "plot", id: id + "-chart"});
    into.appendChild(chart);
    var traces = [];
    [["component", p.components], ["application", p.applications], ["location", p.locations]].forEach(function (a) {
      var rows = a[1].filter(function (r) { return r.seconds > 0; });
      traces.push({type: "bar", orientation: "h", name: a[0], x: rows.map(function (r) { return r.seconds; }),
                   y: rows.map(function (r) { return pt(a[0] + ": " + (r.name === null ? "(none)" : r.name)); }),
                   text: rows.map(function (r) { return pct(r.share); }), hovertemplate: "%{y}: %{x:.6f} s<extra></extra>"});
    });
    var n = traces.reduce(function (k, t) { return k + t.x.length; }, 0);
    plot(chart, traces, {title: {text: "Where the critical path's time goes"}, xaxis: {title: {text: "seconds"}},
                         yaxis: {autorange: "reversed", automargin: true}, height: Math.max(220, 60 + 22 * n)});
    var grid = el("div", null, {"class": "grid3"});
    grid.appendChild(attributionTable(p.components, "component"));
    grid.appendChild(attributionTable(p.applications, "application"));
    grid.appendChild(attributionTable(p.locations, "location"));
    into.appendChild(grid);
    into.appendChild(el("h3", "Steps (" + UI.fmtInt(p.steps_total) + ")"));
    var t = table("steps", [["task / state"], ["kind"], ["component"], ["group / application"], ["location"],
                            ["starts", 1], ["time", 1], ["share", 1]]), b = t.tBodies[0];
    p.steps.forEach(function (s) {
      var tr = el("tr", null, {"data-id": s.id === null ? "" : s.id});
      var idCell = el("td", s.kind === "task" ? null : s.id, {"class": "key id"});
      if (s.kind === "task") {  // the task in the overview's stream
        idCell.appendChild(el("a", s.id, {href: UI.pageHref(runId, "", "task=" + encodeURIComponent(s.id))}));
      }
      tr.appendChild(idCell);
      tr.appendChild(el("td", s.kind));
      tr.appendChild(el("td", s.component, {"class": "component"}));
      tr.appendChild(el("td", s.application, {"class": "key"}));
      tr.appendChild(el("td", s.location, {"class": "key"}));
      tr.appendChild(numCell(fmtDur(s.start_s), s.start_s, "start"));
      tr.appendChild(numCell(fmtDur(s.seconds), s.seconds, "seconds"));
      tr.appendChild(numCell(pct(s.share), s.share, "share"));
      b.appendChild(tr);
    });
    into.appendChild(t);
    if (p.steps_total > p.steps.length)
      into.appendChild(el("p", UI.fmtInt(p.steps_total - p.steps.length) + " more steps not listed (the attribution counts them).", {"class": "muted"}));
  }

  function pathFacts(p, id) {
    return el("p", null, {"class": "path-facts", id: id});
  }

  // ---- the data-state graph's groups, expanded on demand (the page's address keeps which: ?expand=GROUP...)
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
                 "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"];
  var MAX_INPUTS = 30000;  // mutations drawn into one expanded group; beyond, evenly sampled
  var groupDetail = {};  // group -> {segments: the view's tables when fetched, promise: its states in full}
  function expandedGroups() { return params.getAll("expand"); }
  function setExpanded(groups) {
    params.delete("expand");
    groups.forEach(function (g) { params.append("expand", g); });
    history.replaceState(null, "", UI.withQuery(params.toString()));
  }
  /** One group's states and the mutations ending there (the server's /views/critical-path/group), fetched once per
   * state of the run's tables. */
  function fetchGroup(group) {
    var seg = JSON.stringify(V.doc && V.doc.segments), hit = groupDetail[group];
    if (hit && hit.segments === seg) return hit.promise;
    var p = UI.getJSON("/v1/ui/runs/" + encodeURIComponent(runId) + "/views/critical-path/group?group=" +
                       encodeURIComponent(group));
    groupDetail[group] = {segments: seg, promise: p};
    p.catch(function () { if (groupDetail[group] && groupDetail[group].promise === p) delete groupDetail[group]; });
    return p;
  }
  /** The traces of an expanded group ``e`` on the lanes of ``g`` (its lanes may have been computed from fewer
   * groups than the page's: each y is moved to its group's lane here). */
  function groupTraces(e, g) {
    var lane = {};
    g.groups.forEach(function (name, k) { lane[name] = k; });
    function y(v) { var k = Math.floor(v), to = lane[e.groups[k]]; return (to === undefined ? k : to) + (v - k); }
    var colour = e.loc.map(function (c) {
      var k = g.locations.indexOf(e.locations[c]);
      return PALETTE[(k < 0 ? c : k) % PALETTE.length];
    });
    // SVG lines: WebGL lines with gaps took about 9 s for 21,000 segments, SVG about 1 s (docs/critical-path.md)
    var ix = [], iy = [], inp = e.inputs, step = Math.max(1, Math.ceil(inp.x0.length / MAX_INPUTS));
    for (var i = 0; i < inp.x0.length; i += step) { ix.push(inp.x0[i], inp.x1[i], null); iy.push(y(inp.y0[i]), y(inp.y1[i]), null); }
    return [
      {type: "scatter", mode: "lines", name: pt(e.group) + ": inputs" + (step > 1 ? " (1 in " + step + " drawn)" : ""),
       x: ix, y: iy, hoverinfo: "skip", line: {color: "#999", width: 1}},
      {type: "scattergl", mode: "markers", name: pt(e.group) + " (" + UI.fmtInt(e.x.length) + " states)", x: e.x,
       y: e.y.map(y), text: e.ids.map(pt), hoverinfo: "text+x", marker: {size: 6, color: colour}}];
  }
  /** The group control of a graph drawn collapsed: pick a group, expand it into its states or collapse it. */
  function groupControls(div, g) {
    var p = el("p", null, {"class": "controls", id: "cp-graph-controls"});
    var l = el("label", "group "), s = el("select", null, {id: "cp-graph-group"});
    g.groups.forEach(function (name, k) { s.appendChild(el("option", name + " (" + UI.fmtInt(g.counts[k]) + " states)", {value: name})); });
    var open = expandedGroups();
    if (open.length) s.value = open[open.length - 1];
    l.appendChild(s);
    p.appendChild(l);
    var ex = el("button", "expand", {type: "button", id: "cp-graph-expand"}),
        co = el("button", "collapse", {type: "button", id: "cp-graph-collapse"});
    ex.addEventListener("click", function () {
      var now = expandedGroups();
      if (now.indexOf(s.value) < 0) { setExpanded(now.concat([s.value])); renderGraph(div, g); }
    });
    co.addEventListener("click", function () {
      setExpanded(expandedGroups().filter(function (n) { return n !== s.value; }));
      renderGraph(div, g);
    });
    p.appendChild(document.createTextNode(" "));
    p.appendChild(ex);
    p.appendChild(document.createTextNode(" "));
    p.appendChild(co);
    p.appendChild(el("span", " draws a group's states (coloured by location) and the mutations ending there in place " +
                     "of its mark; collapse takes them away", {"class": "muted"}));
    var status = el("span", "", {id: "cp-graph-status", "class": "muted", role: "status"});
    p.appendChild(status);
    return p;
  }

  function renderGraph(div, g) {
    var traces = [], expanded = [];
    if (g.mode === "states") {
      var xs = [], ys = [];
      for (var i = 0; i < g.src.length; i++) {
        xs.push(g.x[g.src[i]], g.x[g.dst[i]], null); ys.push(g.y[g.src[i]], g.y[g.dst[i]], null);
      }
      traces.push({type: "scatter", mode: "lines", x: xs, y: ys, name: "mutations", hoverinfo: "skip",
                   line: {color: "#bbb", width: 1}});
      g.locations.forEach(function (loc, code) {
        var idx = [];
        for (var k = 0; k < g.loc.length; k++) if (g.loc[k] === code) idx.push(k);
        traces.push({type: "scattergl", mode: "markers", name: pt(loc), x: idx.map(function (k) { return g.x[k]; }),
                     y: idx.map(function (k) { return g.y[k]; }), text: idx.map(function (k) { return pt(g.ids[k]); }),
                     hoverinfo: "text+x", marker: {size: 7}});
      });
    } else {
      var ex = [], ey = [];
      for (var e = 0; e < g.edges.src.length; e++) {
        ex.push(g.last[g.edges.src[e]], g.first[g.edges.dst[e]], null); ey.push(g.edges.src[e], g.edges.dst[e], null);
      }
      traces.push({type: "scatter", mode: "lines", x: ex, y: ey, name: "mutations between groups", hoverinfo: "skip",
                   line: {color: "#bbb", width: 1}});
      traces.push({type: "scatter", mode: "markers", name: "groups (collapsed)",
                   x: g.first.map(function (f, k) { return (f + g.last[k]) / 2; }), y: g.groups.map(function (_, k) { return k; }),
                   text: g.groups.map(function (n, k) { return pt(n) + ": " + UI.fmtInt(g.counts[k]) + " states"; }),
                   hoverinfo: "text", marker: {size: g.counts.map(function (c) { return Math.min(40, 6 + 3 * Math.log2(Math.max(c, 1))); })}});
    }
    var path = {type: "scattergl", mode: "lines+markers", name: "critical path", x: g.path.x, y: g.path.y,
                text: g.path.ids.map(pt), hoverinfo: "text+x", line: {color: "crimson", width: 3},
                marker: {color: "crimson", size: 9}};
    var layout = {height: Math.max(360, Math.min(800, 80 + 28 * g.groups.length)), showlegend: true,
                  xaxis: {title: {text: "seconds since the first state"}},
                  yaxis: {tickvals: g.groups.map(function (_, k) { return k; }), ticktext: g.groups.map(pt),
                          automargin: true}};
    plot(div, traces.concat([path]), layout);
    if (g.mode !== "groups") return;
    var open = expandedGroups().filter(function (n) { return g.groups.indexOf(n) >= 0; }), status = document.getElementById("cp-graph-status");
    if (!open.length) return;
    var token = div.flowscopeExpanding = {};  // a later drawing of this graph supersedes this one
    if (status) status.textContent = " expanding " + open.join(", ") + "...";
    Promise.all(open.map(fetchGroup)).then(function (docs) {
      if (div.flowscopeExpanding !== token || !document.body.contains(div)) return;
      docs.forEach(function (e) { expanded = expanded.concat(groupTraces(e, g)); });
      plot(div, traces.concat(expanded, [path]), layout);  // the path stays on top
      if (status) status.textContent = "";
    }, function (err) {  // said beside the control (the file or the server says why), not a fault of the page
      var st = document.getElementById("cp-graph-status");
      if (st && div.flowscopeExpanding === token) st.textContent = " could not expand: " + String(err.message || err);
    });
  }

  function renderCriticalPath(d, root) {
    d.errors.forEach(function (e) { root.appendChild(el("p", "could not be computed: " + e, {"class": "error"})); });
    if (d.reason) {  // no path of any kind: why, and what would supply one
      var why = section(root, "cp-none", "No critical path", "");
      var r = nodata(d.reason);
      r.id = "cp-reason";
      why.appendChild(r);
    }
    var s = section(root, "cp-task", "Task graph",
      "Measured: traced back from the last task to finish through the input that arrived last (with the transfer " +
      "that brought it) or the wait for a thread. Structural: the longest path through the task graph with the " +
      "tasks' durations (unlimited workers). Recomputed from the run's tables as it grows.");
    if (!d.task_path) s.appendChild(nodata("No tasks with dependencies in this run (yet)."));
    else {
      var p = d.task_path, f = pathFacts(p, "cp-task-facts");
      f.appendChild(document.createTextNode(p.kind === "measured" ? "Measured critical path " : "Structural critical path (task times derived) "));
      f.appendChild(el("b", fmtDur(p.length_s), {"data-value": String(p.length_s), id: "cp-task-length"}));
      var through = " through " + UI.fmtInt(p.tasks) + " " + (p.units || "tasks");
      if (p.units === "I/O operations" && p.end_location)  // a Darshan log's: one rank's own I/O, end to end
        through += ": the I/O timeline of " + p.end_location + ", the resource whose I/O ended last";
      f.appendChild(document.createTextNode(through + "; structural (unlimited workers) "));
      f.appendChild(el("b", fmtDur(p.structural_s), {"data-value": String(p.structural_s), id: "cp-task-structural"}));
      if (p.difference_s !== null) f.appendChild(document.createTextNode("; scheduling and contention cost " + fmtDur(p.difference_s)));
      f.setAttribute("data-tasks", String(p.tasks));
      s.appendChild(f);
      renderPath(s, p, "cp-task");
    }
    if (d.message_path) {
      var m = d.message_path, ms = section(root, "cp-messages", "Through messages",
        "The chain of work and messages that bounds the run, walked back from the resource that finished last; " +
        "wait states after Scalasca (late sender, late receiver).");
      var mf = pathFacts(m, "cp-messages-facts");
      mf.appendChild(document.createTextNode("Critical path through messages "));
      mf.appendChild(el("b", fmtDur(m.length_s), {"data-value": String(m.length_s), id: "cp-messages-length"}));
      mf.appendChild(document.createTextNode(" over " + UI.fmtInt(m.messages) + " messages between " + UI.fmtInt(m.resources) +
        " resources; " + UI.fmtInt(m.waits) + " wait states: late sender " + fmtDur(m.late_sender_s) + ", late receiver " +
        fmtDur(m.late_receiver_s) + "."));
      ms.appendChild(mf);
      renderPath(ms, m, "cp-messages");
      if (m.waits_by_resource.length) {
        var wt = table("waits", [["waiting resource"], ["wait state"], ["count", 1], ["time waited", 1]]);
        m.waits_by_resource.forEach(function (r) {
          var tr = el("tr"); tr.appendChild(el("td", r.resource, {"class": "key"})); tr.appendChild(el("td", r.kind));
          tr.appendChild(numCell(UI.fmtInt(r.count), r.count)); tr.appendChild(numCell(fmtDur(r.seconds), r.seconds));
          wt.tBodies[0].appendChild(tr);
        });
        ms.appendChild(wt);
      }
    }
    var ds = section(root, "cp-data", "Data-state graph",
      "States (task outputs, transfers, files) and the mutations between them, laid out by time and by group; " +
      "the critical path in red: traced back from the final state through the input that arrived last.");
    if (!d.data_states) ds.appendChild(nodata("No data states in this run (yet): they come from flowscope.data_states, " +
                                               "a WfCommons instance's files, or are derived from a task graph's outputs."));
    else {
      var x = d.data_states, df = pathFacts(x.path, "cp-data-facts");
      df.appendChild(document.createTextNode(UI.fmtInt(x.states) + " states, " + UI.fmtInt(x.mutations) + " mutations" +
        (x.derived ? " (derived from the tasks)" : "") + "; the path passes " + UI.fmtInt(x.path.vertices) + " states over "));
      df.appendChild(el("b", fmtDur(x.path.length_s), {"data-value": String(x.path.length_s), id: "cp-data-length"}));
      df.setAttribute("data-states", String(x.states));
      ds.appendChild(df);
      var gd = el("div", null, {"class": "plot", id: "cp-graph"});
      if (x.graph.mode === "groups") ds.appendChild(groupControls(gd, x.graph));
      ds.appendChild(gd);
      renderGraph(gd, x.graph);
      if (!d.task_path) renderPath(ds, x.path, "cp-data");
    }
  }

  // ---- profile and breakdown --------------------------------------------------------------------
  function renderProfile(d, root) {
    d.errors.forEach(function (e) { root.appendChild(el("p", "could not be computed: " + e, {"class": "error"})); });
    var s = section(root, "pf-breakdown", "Where the time went",
      "Slot-time over the executing resources, by category of the semantic vocabulary (the innermost span wins); " +
      "as flowscope show and the report give it.");
    var f = el("p", null, {id: "pf-facts"});
    f.appendChild(document.createTextNode("makespan "));
    f.appendChild(el("b", fmtDur(d.makespan_s), {"data-value": String(d.makespan_s), id: "pf-makespan"}));
    f.appendChild(document.createTextNode(", " + UI.fmtInt(d.tasks) + " tasks, " + UI.fmtInt(d.transfers) +
      " transfers, " + UI.fmtInt(d.executors) + " executing resources"));
    s.appendChild(f);
    if (d.run_utilisation) {  // busy slot-time / (slots x makespan), or why it is unknown
      var ru = d.run_utilisation, uf = el("p", null, {id: "pf-utilisation-run", "data-value": ru.value === null ? "" : String(ru.value)});
      if (ru.value === null) uf.textContent = "utilisation: unknown: " + ru.reason;
      else uf.textContent = "utilisation: task time / (slots × " + (ru.over === "run" ? "the run's recorded duration" : "the makespan") +
        ") " + (100 * ru.value).toFixed(1) + " % (" + fmtDur(ru.busy_s) + " / (" + UI.fmtInt(ru.slots) + " × " + fmtDur(ru.makespan_s) + "))";
      s.appendChild(uf);
    }
    var total = 0;
    d.breakdown.forEach(function (r) { total += r.seconds || 0; });
    var known = d.breakdown.filter(function (r) { return r.seconds; });
    if (!known.length && !d.transfers && !(d.breakdown.some(function (r) { return r.bytes; })))
      s.appendChild(nodata("No data: no spans on resources that execute work, no transfers and no I/O records in this " +
        "run (yet): a source's spans become busy time once its mapping says what they are (flowscope semantics)."));
    else if (known.length) {
      var chart = el("div", null, {"class": "plot", id: "pf-chart"});
      s.appendChild(chart);
      plot(chart, [{type: "bar", orientation: "h", x: known.map(function (r) { return r.seconds; }),
                    y: known.map(function (r) { return r.category; }), hovertemplate: "%{y}: %{x:.6f} s<extra></extra>"}],
           {height: 60 + 30 * known.length, yaxis: {autorange: "reversed"}, xaxis: {title: {text: "seconds"}}});
    }
    var t = table("breakdown", [["category"], ["time", 1], ["share", 1], ["bytes", 1], ["count", 1]]);
    d.breakdown.forEach(function (r) {
      var tr = el("tr", null, {"data-category": r.category});
      tr.appendChild(el("td", r.category));
      tr.appendChild(numCell(r.seconds === null ? "unknown" : fmtDur(r.seconds), r.seconds, "seconds"));
      tr.appendChild(numCell(r.seconds === null || !total ? "-" : pct(r.seconds / total), null));
      tr.appendChild(numCell(fmtBytes(r.bytes), r.bytes, "bytes"));
      tr.appendChild(numCell(UI.fmtInt(r.count), r.count, "count"));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
    if (d.io_note) s.appendChild(el("p", d.io_note, {"class": "muted"}));

    var g = section(root, "pf-groups", "Per group",
      "Spans grouped by their group (a Dask task prefix, a StarPU codelet, an MPI function), largest total first. " +
      "CV: standard deviation / mean of the durations.");
    var gt = table("groups", [["group"], ["role"], ["category"], ["count", 1], ["total", 1], ["mean", 1], ["CV", 1], ["max", 1]]);
    d.groups.forEach(function (r) {
      var tr = el("tr", null, {"data-group": r.group === null ? "" : r.group});
      tr.appendChild(el("td", r.group, {"class": "key name"}));
      tr.appendChild(el("td", r.role)); tr.appendChild(el("td", r.category));
      tr.appendChild(numCell(UI.fmtInt(r.count), r.count, "count"));
      tr.appendChild(numCell(fmtDur(r.total_s), r.total_s, "total"));
      tr.appendChild(numCell(fmtDur(r.mean_s), r.mean_s, "mean"));
      tr.appendChild(numCell(r.cv === null ? "-" : r.cv.toFixed(2), r.cv, "cv"));
      tr.appendChild(numCell(fmtDur(r.max_s), r.max_s, "max"));
      gt.tBodies[0].appendChild(tr);
    });
    g.appendChild(d.groups.length ? gt : nodata("No spans in this run (yet). Groups come from spans: Dask tasks (by " +
      "prefix), StarPU codelets and other Paje states, OTF2 regions, Chrome / Perfetto slices, WfCommons tasks (by category)."));

    var h = section(root, "pf-hot", "Call paths with the most exclusive time",
      "The call tree of the spans that nest (OTF2 regions, Chrome slices, traced functions), merged across resources.");
    var ht = table("hot-paths", [["call path"], ["calls", 1], ["exclusive", 1], ["inclusive", 1], ["exclusive mean / resource", 1],
                                 ["exclusive max / resource", 1], ["imbalance", 1]]);
    d.hot_paths.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", r.call_path.join(" > "), {"class": "key"}));
      tr.appendChild(numCell(UI.fmtInt(r.calls), r.calls, "calls"));
      tr.appendChild(numCell(fmtDur(r.exclusive_s), r.exclusive_s, "exclusive"));
      tr.appendChild(numCell(fmtDur(r.inclusive_s), r.inclusive_s, "inclusive"));
      tr.appendChild(numCell(fmtDur(r.exclusive_mean_s), r.exclusive_mean_s));
      tr.appendChild(numCell(fmtDur(r.exclusive_max_s), r.exclusive_max_s));
      tr.appendChild(numCell(pct(r.imbalance), r.imbalance));
      ht.tBodies[0].appendChild(tr);
    });
    h.appendChild(d.hot_paths.length ? ht : nodata("No spans in this run (yet). A call profile is built from spans that " +
      "nest on a resource: OTF2 enter/leave regions, Chrome / Perfetto slices, functions traced with @flowscope.trace, " +
      "Client.spans with parent_id."));

    if (d.flame) {  // the report's flame graph (report/profile.py); its labels were escaped for plotly.js there
      var f = section(root, "pf-flame", "Call tree as a flame graph",
        "Each box is a call path, as wide as its inclusive time, its callers below it; merged across resources " +
        "(hover for calls, exclusive time and the imbalance over resources; the menu shows one resource). Click a box to zoom into it.");
      var fc = el("div", null, {"class": "plot", id: "pf-flame-chart"});
      f.appendChild(fc);
      plot(fc, d.flame.data, d.flame.layout);
      var nest = d.nesting || {}, res = function (n) { return UI.fmtInt(n) + (n === 1 ? " resource" : " resources"); };
      if (nest.flat)
        f.appendChild(el("p", (nest.flat === 1 ? "1 resource has" : res(nest.flat) + " have") + " spans that overlap " +
          "without nesting: " + (nest.flat === 1 ? "its" : "their") + " spans are drawn flat, each a root.", {"class": "note muted", id: "pf-flat"}));
      if (nest.derived)
        f.appendChild(el("p", "On " + res(nest.derived) + " the span times were placed by a rule, not observed: " +
          "their spans are drawn flat, each a root.", {"class": "note muted", id: "pf-derived"}));
      if (nest.nested === false)
        f.appendChild(el("p", "No span of this run nests in another: the flame graph is a flat profile, each span a " +
          "root. Nested spans (OTF2 enter/leave regions, Chrome / Perfetto slices, functions traced with " +
          "@flowscope.trace, Client.spans with parent_id) give call paths.", {"class": "note muted", id: "pf-no-nesting"}));
    }
    if (d.utilisation) {
      var u = section(root, "pf-utilisation", "Utilisation per executing resource",
        "Busiest first: its slots (threads, cores), the share of its slot-time busy, and the share in each category.");
      var ut = table("utilisation", d.utilisation.columns.map(function (c, i) { return [c, i > 0]; }));
      d.utilisation.rows.forEach(function (r) {
        var tr = el("tr");
        r.forEach(function (v, i) { tr.appendChild(el("td", v === null ? "-" : v, i ? {"class": "num"} : {"class": "key"})); });
        ut.tBodies[0].appendChild(tr);
      });
      u.appendChild(ut);
      if (d.utilisation.more) u.appendChild(el("p", UI.fmtInt(d.utilisation.more) + " more resources not shown.", {"class": "muted"}));
    }
  }

  // ---- anomalies (Chimbuko's views) ------------------------------------------------------------
  var STATS = ["mean", "std", "max", "min", "total"];
  var AXES = ["entry", "exit", "inclusive", "exclusive", "function", "label", "children", "messages"];
  var AXIS_TITLES = {entry: "entry (s)", exit: "exit (s)", inclusive: "inclusive (ms)", exclusive: "exclusive (ms)",
                     "function": "function", label: "anomaly or normal", children: "children",
                     messages: "messages (transfers)"};
  var CATEGORICAL = {"function": 1, label: 1};

  function select(id, label, options, value, onchange) {
    var l = el("label", label + " "), s = el("select", null, {id: id});
    options.forEach(function (o) { var op = el("option", o[1], {value: o[0]}); if (o[0] === value) op.selected = true; s.appendChild(op); });
    s.addEventListener("change", function () { onchange(s.value); });
    l.appendChild(s);
    return l;
  }

  /** The ranking as the page shows it: sorted by the statistic (ties by total), top or bottom N. */
  function ranked(d) {
    var stat = param("stat", "mean"), side = param("side", "top"), n = Math.max(1, parseInt(param("n", "10"), 10) || 10);
    var r = d.ranking.slice();
    r.sort(function (a, b) {
      var k = side === "top" ? (b[stat] - a[stat]) || (b.total - a.total) : (a[stat] - b[stat]) || (a.total - b.total);
      return k;
    });
    return r.slice(0, n);
  }

  function renderAnomalies(d, root) {
    var head = el("p", null, {id: "an-facts"});
    if (!d.anomalies) {
      root.appendChild(nodata(d.source === "recorded" ? "The anomalies table of this run is empty." :
        "No anomalies found (yet) among the run's calls (the offline detector, Chimbuko's defaults)."));
      return;
    }
    head.textContent = UI.fmtInt(d.anomalies) + " anomalies (" + d.config + ", " +
      (d.source === "recorded" ? "the run's anomalies table" : "detected over the calls recorded so far") + ") on " +
      UI.fmtInt(d.ranking.length) + " resources over " + UI.fmtInt(d.steps) + " step(s)" +
      (d.step_s ? " of " + d.step_s + " s" : "") + ".";
    head.setAttribute("data-anomalies", String(d.anomalies));
    root.appendChild(head);

    // 1. resources ranked by anomalies per step
    var rs = section(root, "an-ranking", "Resources ranked by anomalies per step",
      "Per resource, statistics of its anomalies per step (steps without any count 0). Click a bar or a row to see " +
      "that resource's anomalies per step.");
    var controls = el("p");
    controls.appendChild(select("an-stat", "statistic", STATS.map(function (s) { return [s, s]; }), param("stat", "mean"),
                                function (v) { setParam("stat", v); render(); }));
    controls.appendChild(select("an-side", "ranked from the", [["top", "top"], ["bottom", "bottom"]], param("side", "top"),
                                function (v) { setParam("side", v); render(); }));
    var nl = el("label", " N "), ni = el("input", null, {id: "an-n", type: "number", min: "1", value: param("n", "10"), style: "width:5em"});
    ni.addEventListener("change", function () { setParam("n", ni.value); render(); });
    nl.appendChild(ni); controls.appendChild(nl);
    rs.appendChild(controls);
    var top = ranked(d), stat = param("stat", "mean");
    var chart = el("div", null, {"class": "plot", id: "an-ranking-chart"});
    rs.appendChild(chart);
    plot(chart, [{type: "bar", x: top.map(function (r) { return pt(r.resource); }), y: top.map(function (r) { return r[stat]; }),
                  customdata: top.map(function (r) { return r.resource; }), hovertemplate: "%{x}: %{y}<extra></extra>"}],
         {height: 320, xaxis: {title: {text: "resource"}, type: "category", automargin: true},
          yaxis: {title: {text: "anomalies per step: " + stat}}});
    if (chart.on) chart.on("plotly_click", function (ev) { selectResource(ev.points[0].customdata); });
    var rt = table("ranking", [["resource"]].concat(STATS.map(function (s) { return [s, 1]; })));
    top.forEach(function (r) {
      var tr = el("tr", null, {"data-resource": r.resource, tabindex: "0", "class": "pick" + (r.resource === param("resource") ? " picked" : "")});
      tr.appendChild(el("td", r.resource, {"class": "key name"}));
      STATS.forEach(function (s) { tr.appendChild(numCell(s === "mean" || s === "std" ? fx(r[s], 3) : UI.fmtInt(r[s]), r[s], s)); });
      tr.addEventListener("click", function () { selectResource(r.resource); });
      tr.addEventListener("keydown", function (e) { if (e.key === "Enter") selectResource(r.resource); });
      rt.tBodies[0].appendChild(tr);
    });
    rs.appendChild(rt);

    // 2. anomalies per step of the selected resources (default: the first of the ranking)
    var sel = param("resource", top.length ? top[0].resource : null);
    var ss = section(root, "an-steps", "Anomalies per step", "Click a step to list its anomalies on the resource.");
    var sc = el("div", null, {"class": "plot", id: "an-steps-chart"});
    ss.appendChild(sc);
    var steps = []; for (var k = 0; k < Math.max(d.steps, 1); k++) steps.push(k);
    var shown = [sel].concat(top.map(function (r) { return r.resource; }).filter(function (r) { return r !== sel; }).slice(0, 4));
    plot(sc, shown.filter(function (r) { return r !== null; }).map(function (rid, i) {
      var per = d.per_step[rid] || {};
      return {type: "scatter", mode: "lines+markers", name: pt(rid), x: steps, y: steps.map(function (s) { return per[s] || 0; }),
              customdata: steps.map(function () { return rid; }), visible: i === 0 ? true : "legendonly"};
    }), {height: 300, xaxis: {title: {text: "step"}}, yaxis: {title: {text: "anomalies"}}});
    if (sc.on) sc.on("plotly_click", function (ev) { selectStep(ev.points[0].customdata, ev.points[0].x); });
    var stepList = el("p", null, {id: "an-step-links"});
    if (sel !== null) {
      ss.appendChild(el("p", null, {"class": "muted"})).appendChild(
        el("a", "the task stream of " + sel, {"class": "stream-of-resource",
                                              href: UI.pageHref(runId, "", "resource=" + encodeURIComponent(sel))}));
      stepList.appendChild(document.createTextNode("steps with anomalies on "));
      stepList.appendChild(el("b", sel, {"class": "key"}));
      stepList.appendChild(document.createTextNode(": "));
      Object.keys(d.per_step[sel] || {}).map(Number).sort(function (a, b) { return a - b; }).forEach(function (s) {
        var a = el("a", "step " + s + " (" + d.per_step[sel][s] + ")", {href: "#", "data-step": String(s), "data-count": String(d.per_step[sel][s])});
        a.addEventListener("click", function (e) { e.preventDefault(); selectStep(sel, s); });
        stepList.appendChild(a); stepList.appendChild(document.createTextNode(" "));
      });
    }
    ss.appendChild(stepList);
    var step = param("step", null);
    if (sel !== null && step !== null) {
      var inStep = d.list.filter(function (a) { return a.resource === sel && String(a.step) === step; });
      var lt = table("step-anomalies", [["anomaly"], ["function"], ["task"], ["entry", 1], ["exclusive", 1], ["inclusive", 1], ["score", 1]]);
      inStep.forEach(function (a) {
        var tr = el("tr", null, {"data-call": String(a.call_id), tabindex: "0", "class": "pick" + (String(a.call_id) === param("call") ? " picked" : "")});
        tr.appendChild(el("td", "#" + a.anomaly_id)); tr.appendChild(el("td", a["function"], {"class": "key"}));
        tr.appendChild(el("td", a.task_key, {"class": "key"}));
        tr.appendChild(numCell(fmtDur(a.entry_s), a.entry_s)); tr.appendChild(numCell(fx(a.exclusive_ms, 3) + " ms", a.exclusive_ms));
        tr.appendChild(numCell(fx(a.inclusive_ms, 3) + " ms", a.inclusive_ms)); tr.appendChild(numCell(fx(a.score, 2), a.score));
        tr.addEventListener("click", function () { selectCall(a.call_id); });
        tr.addEventListener("keydown", function (e) { if (e.key === "Enter") selectCall(a.call_id); });
        lt.tBodies[0].appendChild(tr);
      });
      ss.appendChild(el("h3", "Anomalies of step " + step + " on " + sel));
      ss.appendChild(lt);
    }

    // 3. the call: its stack and the calls around it on its resource
    var call = param("call", null);
    var picked = call === null ? null : d.list.filter(function (a) { return String(a.call_id) === call; })[0];
    var cs = section(root, "an-call", "The call", "Its call stack and the calls before and after it on its resource (rows are nesting depths).");
    if (!picked) cs.appendChild(nodata(call === null ? "Pick an anomaly above (rank, then step, then call)." : "Call " + call + " is not among the anomalies listed."));
    else {
      var facts = el("p", null, {id: "an-call-facts", "data-call": String(picked.call_id)});
      facts.textContent = "#" + picked.anomaly_id + " " + picked["function"] + " on " + picked.resource + ", step " + picked.step +
        ": exclusive " + fx(picked.exclusive_ms, 3) + " ms, inclusive " + fx(picked.inclusive_ms, 3) + " ms, " +
        picked.children + " children, " + picked.messages + " message(s), severity " + fx(picked.severity_ms, 3) + " ms" +
        (picked.task_key ? ", task " + picked.task_key : "");
      cs.appendChild(facts);
      cs.appendChild(el("p", "call stack: " + picked.call_stack.join(" > "), {"class": "key", id: "an-call-stack"}));
      var wc = el("div", null, {"class": "plot", id: "an-window-chart"});
      cs.appendChild(wc);
      var w = picked.window;
      plot(wc, [{type: "bar", orientation: "h", base: w.map(function (c) { return c.entry_s; }), x: w.map(function (c) { return c.seconds; }),
                 y: w.map(function (c) { return "depth " + c.depth; }), text: w.map(function (c) { return pt(c["function"]); }),
                 marker: {color: w.map(function (c) { return c.call_id === picked.call_id ? "#d62728" : "#9ecae1"; })},
                 hovertemplate: "%{text}<br>entry %{base:.6f} s, %{x:.6f} s<extra></extra>"}],
           {height: 240, yaxis: {autorange: "reversed"}, xaxis: {title: {text: "seconds"}}, barmode: "overlay"});
    }

    // 4. the function scatter with selectable axes
    var fs = section(root, "an-functions", "Function view", "The calls of the selected resource in the selected step " +
      "(all calls until a step is selected): each anomaly (red) and the normal calls (grey); choose the axes; " +
      "click an anomaly for its call stack." +
      (d.points.normal_thinned ? " Normal calls thinned to " + UI.fmtInt(d.points.normal.entry.length) + " of " +
                                 UI.fmtInt(d.points.normal_total) + "." : ""));
    var fc = el("p");
    fc.appendChild(select("an-x", "x", AXES.map(function (a) { return [a, a]; }), param("x", "entry"), function (v) { setParam("x", v); render(); }));
    fc.appendChild(select("an-y", " y", AXES.map(function (a) { return [a, a]; }), param("y", "exclusive"), function (v) { setParam("y", v); render(); }));
    fs.appendChild(fc);
    var fd = el("div", null, {"class": "plot", id: "an-functions-chart"});
    fs.appendChild(fd);
    var ax = param("x", "entry"), ay = param("y", "exclusive");
    var cat = function (a) { return CATEGORICAL[a] ? "category" : "linear"; };
    var inFrame = function (p, i) { return sel === null || step === null || (p.resource[i] === sel && String(p.step[i]) === step); };
    plot(fd, [["normal", "#7f7f7f", 5], ["anomaly", "#d62728", 7]].map(function (spec) {
      var p = d.points[spec[0]], idx = [];
      for (var i = 0; i < p.call_id.length; i++) if (inFrame(p, i)) idx.push(i);
      var conv = function (a) { return idx.map(function (i) { return CATEGORICAL[a] ? pt(p[a][i]) : p[a][i]; }); };
      return {type: "scattergl", mode: "markers", name: spec[0], x: conv(ax), y: conv(ay), marker: {color: spec[1], size: spec[2]},
              customdata: idx.map(function (i) { return p.call_id[i]; }),
              text: idx.map(function (i) { return pt(p["function"][i] + " on " + p.resource[i]); }),
              hovertemplate: "%{text}<br>x %{x}<br>y %{y}<extra>" + spec[0] + "</extra>"};
    }), {height: 420, xaxis: {title: {text: AXIS_TITLES[ax]}, type: cat(ax)}, yaxis: {title: {text: AXIS_TITLES[ay]}, type: cat(ay)}});
    if (fd.on) fd.on("plotly_click", function (ev) {
      var pnt = ev.points[0];
      if (pnt.data.name === "anomaly") {
        var a = d.list.filter(function (x) { return x.call_id === pnt.customdata; })[0];
        if (a) { setParam("resource", a.resource); setParam("step", a.step); selectCall(a.call_id); }
      }
    });
  }

  function selectResource(rid) { setParam("resource", rid); setParam("step", null); setParam("call", null); render(); }
  function selectStep(rid, s) { setParam("resource", rid); setParam("step", s); setParam("call", null); render(); }
  function selectCall(c) { setParam("call", c); render(); }

  // ---- logs ------------------------------------------------------------------------------------
  // ---- charts: the report's own figures (report/chart_sections.py) -------------------------------------------
  /** Plain text with `backquoted` code, as elements (never markup). */
  function codeText(text) {
    var p = el("p");
    String(text).split("`").forEach(function (part, i) {
      if (part) p.appendChild(i % 2 ? el("code", part) : document.createTextNode(part));
    });
    return p;
  }
  function renderCharts(d, root) {
    d.sections.forEach(function (c) {
      var s = section(root, "ch-" + c.id, c.title);
      var help = codeText(c.help); help.className = "muted"; s.appendChild(help);
      if (c.figure) {
        var chart = el("div", null, {"class": "plot", id: "ch-" + c.id + "-chart"});
        s.appendChild(chart);
        // the report's figure: its labels were escaped for plotly.js where they were made (report/charts.py)
        plot(chart, c.figure.data, c.figure.layout);
      } else if (c.table) {
        var why = codeText(c.no_chart); why.className = "muted"; s.appendChild(why);
      } else {
        var none = codeText("No data: " + c.nodata); none.className = "nodata muted"; s.appendChild(none);
      }
      if (c.table) {
        var text = {};
        c.table.text.forEach(function (i) { text[i] = true; });
        var t = table("chart-table", c.table.columns.map(function (h, i) { return [h, !text[i]]; })), b = t.tBodies[0];
        c.table.rows.forEach(function (r) {
          var tr = el("tr");
          r.forEach(function (v, i) { tr.appendChild(el("td", v === null ? "-" : v, text[i] ? null : {"class": "num"})); });
          b.appendChild(tr);
        });
        s.appendChild(t);
      }
    });
    var io = d.io_summary, is = section(root, "ch-io-summary", io.title, io.help);
    if (io.absent) {
      var none = codeText("No data: " + io.absent); none.className = "nodata muted"; is.appendChild(none);
      return;
    }
    io.blocks.forEach(function (b) {
      if (b.kind === "facts") {
        var dl = el("dl", null, {"class": "facts"});
        b.facts.forEach(function (f) {
          var div = el("div"); div.appendChild(el("dt", f[0])); div.appendChild(el("dd", f[1])); dl.appendChild(div);
        });
        is.appendChild(dl);
      } else if (b.kind === "table") {
        if (b.title) is.appendChild(el("h3", b.title));
        var t = table("io-table", b.columns.map(function (c, i) { return [c, i > 0]; }));
        b.rows.forEach(function (r) {
          var tr = el("tr");
          r.forEach(function (v, i) { tr.appendChild(el("td", v === null ? "-" : v, i ? {"class": "num"} : {"class": "key"})); });
          t.tBodies[0].appendChild(tr);
        });
        is.appendChild(t);
      } else if (b.kind === "figures") {
        var holder = el("div", null, b.side_by_side ? {"class": "grid"} : null);
        is.appendChild(holder);
        b.figures.forEach(function (f) {
          var c = el("div", null, {"class": "plot", id: "ch-" + f.id});
          holder.appendChild(c);
          plot(c, f.figure.data, f.figure.layout);
        });
      } else {
        var note = codeText(b.text); note.className = "muted"; is.appendChild(note);
      }
    });
  }

  function renderLogs(d, root) {
    var s = section(root, "lg-logs", "Log records, latest first",
      "Every record the run logged (warnings and errors of the program, of the runtime, of flowscope), each with the task " +
      "it names: its group, where it ran, when it started and how long it took.");
    var counts = el("p", null, {id: "lg-counts", "data-total": String(d.total)});
    counts.textContent = UI.fmtInt(d.total) + " records: " + Object.keys(d.counts).map(function (k) { return k + " " + UI.fmtInt(d.counts[k]); }).join(", ");
    s.appendChild(counts);
    var controls = el("p");
    controls.appendChild(select("lg-level", "level", [["", "any"]].concat(Object.keys(d.counts).map(function (k) { return [k, k]; })),
                                param("level", ""), function (v) { setParam("level", v); render(); }));
    var tl = el("label", " task "), ti = el("input", null, {id: "lg-task", type: "search", value: param("task", ""), placeholder: "task key"});
    ti.addEventListener("change", function () { setParam("task", ti.value); render(); });
    tl.appendChild(ti); controls.appendChild(tl);
    s.appendChild(controls);
    var level = param("level", ""), task = param("task", "");
    var rows = d.records.filter(function (r) { return (!level || r.level === level) && (!task || (r.task_key || "").indexOf(task) >= 0); });
    var t = table("logs", [["at", 1], ["level"], ["category"], ["message"], ["task"], ["task group"], ["task ran on"], ["task start", 1], ["task time", 1]]);
    rows.forEach(function (r) {
      var tr = el("tr", null, {"class": "log-row level-" + String(r.level).replace(/[^a-z]/g, "")});
      tr.appendChild(numCell(fmtDur(r.t), r.t, "t"));
      tr.appendChild(el("td", r.level, {"class": "level"}));
      tr.appendChild(el("td", r.category, {"class": "category"}));
      tr.appendChild(el("td", r.message, {"class": "key message"}));
      var td = el("td", null, {"class": "key task"});
      if (r.task_key) {
        var a = el("a", r.task_key, {href: "?task=" + encodeURIComponent(r.task_key) + location.hash});
        a.addEventListener("click", function (e) { e.preventDefault(); setParam("task", r.task_key); render(); });
        td.appendChild(a);
      }
      tr.appendChild(td);
      var k = r.task || {};
      tr.appendChild(el("td", r.task ? k.group : "", {"class": "key"}));
      tr.appendChild(el("td", r.task ? k.resource : (r.resource || ""), {"class": "key"}));
      tr.appendChild(numCell(r.task ? fmtDur(k.start_s) : "", r.task ? k.start_s : null, "task-start"));
      tr.appendChild(numCell(r.task ? fmtDur(k.seconds) : "", r.task ? k.seconds : null, "task-seconds"));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(rows.length ? t : nodata(d.total ? "No record matches the filter." : "No log records in this run (yet)."));
    if (d.total > d.records.length) s.appendChild(el("p", "The latest " + UI.fmtInt(d.records.length) + " records are listed.", {"class": "muted"}));
  }

  // ---- page --------------------------------------------------------------------------------------
  /** The advisor (flowscope explain): the makespan's attribution, then the findings ranked by recoverable time. */
  function renderAdvisor(d, root) {
    if ((d.nothing_observed || []).length) {
      // a run that recorded no work: why, and what to do (flowscope.analysis.nothing_observed)
      var no = section(root, "adv-nothing", "No work was recorded in this run", "");
      no.classList.add("nothing-observed");
      d.nothing_observed.forEach(function (r) {
        var p = codeText(" " + r.what_to_do), why = el("b");
        codeText(r.why).childNodes.forEach(function (n) { why.appendChild(n.cloneNode(true)); });
        p.insertBefore(why, p.firstChild);
        p.className = "why";
        p.setAttribute("data-code", r.code);
        no.appendChild(p);
      });
    }
    root.appendChild(el("p", "wall time " + fmtDur(d.wall_s) + ", task phase " + fmtDur(d.task_phase_s) + ", " +
                     UI.fmtInt(d.tasks) + " tasks on " + UI.fmtInt(d.slots) + " slots", {"class": "facts"}));
    var at = section(root, "adv-where", "Where the makespan went",
                     "Each part measured (or estimated, as its status says) over the run's wall time.");
    var t = table("adv-attribution", [["part"], ["seconds", true], ["share", true], ["status"], ["how"]]);
    t.id = "adv-attribution";
    (d.attribution || []).forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", r.label));
      tr.appendChild(numCell(fmtDur(r.seconds), r.seconds));
      tr.appendChild(numCell(pct(r.share), r.share));
      tr.appendChild(el("td", r.status));
      tr.appendChild(el("td", r.note || "", {"class": "muted"}));
      t.tBodies[0].appendChild(tr);
    });
    at.appendChild(t);
    var fs = section(root, "adv-findings", "Findings, most recoverable time first",
                     "Each with the change it suggests and the rows it rests on.");
    if (!(d.findings || []).length) fs.appendChild(nodata("no finding: nothing here stands out"));
    (d.findings || []).forEach(function (f, i) {
      var box = el("div", null, {"class": "finding", "data-rule": f.rule,
                                 "data-recoverable": f.recoverable_s === null ? "" : String(f.recoverable_s)});
      box.appendChild(el("h3", f.title));
      box.appendChild(el("p", (f.recoverable_s === null ? "recoverable time not estimated" :
                               "recoverable: about " + fmtDur(f.recoverable_s)) + " (" + f.rule + ", " + f.kind + ")",
                         {"class": "facts"}));
      box.appendChild(el("p", f.change, {"class": "change"}));
      if (f.method) box.appendChild(el("p", "estimate: " + f.method, {"class": "muted"}));
      var ev = f.evidence || [];
      if (ev.length) {
        var cols = Object.keys(ev[0]);
        var et = table("adv-evidence", cols.map(function (c) { return [c]; }));
        ev.forEach(function (row) {
          var tr = el("tr");
          cols.forEach(function (c) { var v = row[c]; tr.appendChild(el("td", v === null || v === undefined ? "" :
                                                                              (typeof v === "object" ? JSON.stringify(v) : String(v)))); });
          et.tBodies[0].appendChild(tr);
        });
        box.appendChild(et);
        if (f.evidence_rows > ev.length) box.appendChild(el("p", "first " + ev.length + " of " +
                                                            UI.fmtInt(f.evidence_rows) + " rows", {"class": "muted"}));
      }
      fs.appendChild(box);
    });
    (d.notes || []).forEach(function (n) { root.appendChild(el("p", n, {"class": "muted"})); });
  }

  var RENDER = {"advisor": renderAdvisor, "critical-path": renderCriticalPath, "profile": renderProfile,
                "charts": renderCharts, "anomalies": renderAnomalies, "logs": renderLogs};

  /** The charts of ``root`` zoomed by hand (an axis not autoranged): chart id -> axis -> range. */
  function zoomOf(root) {
    var out = {};
    root.querySelectorAll(".js-plotly-plot[id]").forEach(function (gd) {
      var lay = gd.layout || {};
      Object.keys(lay).forEach(function (ax) {
        if (/^[xy]axis\d*$/.test(ax) && lay[ax] && lay[ax].autorange === false && lay[ax].range)
          (out[gd.id] = out[gd.id] || {})[ax] = lay[ax].range.slice();
      });
    });
    return out;
  }
  var KEYS = ["data-resource", "data-call", "data-id", "data-name"];  // what names a row or a cell on these pages
  /** Where the keyboard focus is in ``root``: the element's id, the key of the row or cell it names, its place, and
   * the text being typed in it. */
  function focusOf(root) {
    var a = document.activeElement;
    if (!a || a === document.body || !root.contains(a) || a === root) return null;
    var f = {tag: a.tagName, id: a.id || null, key: null, path: [], value: null, sel: null};
    for (var n = a; n && n !== root; n = n.parentElement) {
      if (!f.key) KEYS.some(function (k) { return n.hasAttribute(k) && (f.key = [k, n.getAttribute(k), n === a]); });
      f.path.unshift(Array.prototype.indexOf.call(n.parentElement.children, n));
    }
    if (a.tagName === "INPUT" || a.tagName === "TEXTAREA") {
      f.value = a.value;
      try { f.sel = [a.selectionStart, a.selectionEnd]; } catch (e) { f.sel = null; }
    }
    return f;
  }
  function refocus(root, f) {
    var t = f.id ? document.getElementById(f.id) : null;
    if (!t && f.key) {
      var row = root.querySelector("[" + f.key[0] + '="' + CSS.escape(f.key[1]) + '"]');
      if (row) t = f.key[2] ? row : row.querySelector(f.tag.toLowerCase()) ;
      if (t && !f.key[2]) {  // the element inside the keyed row, at its place there
        var inside = row;
        var depth = 0;
        for (var n = row; n && n !== root; n = n.parentElement) depth++;
        f.path.slice(depth).forEach(function (i) { inside = inside && inside.children[i]; });
        if (inside) t = inside;
      }
    }
    if (!t) {
      t = root;
      f.path.forEach(function (i) { t = t && t.children[i]; });
    }
    if (!t || t.tagName !== f.tag) return;
    if (f.value !== null && t.value !== f.value) t.value = f.value;
    t.focus({preventScroll: true});
    if (f.sel) try { t.setSelectionRange(f.sel[0], f.sel[1]); } catch (e) { /* not a text field */ }
  }

  // A field being typed in commits on change, which Chromium fires when render() removes the field: that change is
  // the page's own doing, not the person's, and is dropped (the text typed is put back in the new field).
  var rendering = false;
  document.addEventListener("change", function (e) { if (rendering) e.stopImmediatePropagation(); }, true);

  function render() {
    if (rendering) return;
    rendering = true;
    try { draw(); } finally { rendering = false; }
  }

  function draw() {
    var d = V.doc, root = document.getElementById("view");
    document.title = "flowscope: " + (TITLES[view] || view) + " of " + runId;
    document.getElementById("view-title").textContent = TITLES[view] || view;
    document.getElementById("run-where").textContent = "run " + runId;
    if (!d) return;
    document.getElementById("view-facts").textContent = "status " + (d.status || "unknown") + "; computed from " +
      Object.keys(d.segments).map(function (t) { return d.segments[t] + " " + t + " segment(s)"; }).join(", ");
    var scroll = global.scrollY, focus = focusOf(root);
    zoomed = zoomOf(root);
    var fresh = el("div", null, {id: "view"});
    root.replaceWith(fresh);
    if (d.failed) fresh.appendChild(el("p", "This view could not be computed: " + d.failed, {"class": "error"}));
    else RENDER[view](d, fresh);
    if (focus) refocus(fresh, focus);
    global.scrollTo(0, scroll);
    V.renders++;
  }

  document.querySelectorAll("#run-nav a").forEach(function (a) {
    var page = a.getAttribute("data-page");
    a.setAttribute("href", UI.pageHref(runId, page));
    if (page === view) a.setAttribute("aria-current", "page");
  });
  UI.offlineLink(runId);

  var backoff = 250;
  function connect() {
    if (V.paused) return;
    var proto = location.protocol === "https:" ? "wss:" : "ws:";
    var ws = V.socket = new WebSocket(proto + "//" + location.host + "/v1/ui/runs/" + encodeURIComponent(runId) +
                                      "/views/" + encodeURIComponent(view) + "/live");
    var conn = document.getElementById("conn");
    V.connects++;
    ws.onopen = function () { conn.textContent = "live"; backoff = 250; };
    ws.onmessage = function (ev) {
      var m = JSON.parse(ev.data);
      if (m.type !== "view") return;
      V.doc = m.doc; V.updates++;
      try { render(); } catch (e) { V.errors.push(String(e.message || e)); throw e; }
    };
    ws.onclose = function () {
      if (V.socket === ws) V.socket = null;
      conn.textContent = V.paused ? "paused" : "reconnecting";
      if (!V.paused) { setTimeout(connect, backoff); backoff = Math.min(5000, backoff * 2); }
    };
  }
  V.render = render;
  V.pause = function () { V.paused = true; if (V.socket) V.socket.close(); };
  V.resume = function () { V.paused = false; if (!V.socket) connect(); };
  render();
  connect();
})(window);
