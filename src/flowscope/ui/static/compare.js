/* flowscope: runs compared (/ui/compare?run=ID&run=ID&against=ID or ?name=NAME, and the static page of
 * `flowscope compare --html`, which carries its document in #flowscope-doc). The document is
 * report/compare_view.py's: the provenance paper's views across runs (time per phase with error bars, task groups
 * and which changed, scheduling order, placement, communication time against size by locality, I/O per thread,
 * parallel coordinates of the tasks, warnings against long tasks) and the critical paths side by side.
 * Every string from an observed program is set as text (textContent) and escaped for plotly.js's labels. */
(function (global) {
  "use strict";
  var UI = global.flowscopeUI, el = UI.el;
  var C = global.flowscopeCompare = {doc: null, renders: 0, errors: []};
  var params = new URLSearchParams(location.search);
  var PHASE_COLORS = {computation: "#3182bd", communication: "#e6550d", io: "#31a354", total: "#756bb1"};

  // ---- helpers --------------------------------------------------------------------------------------
  function setParam(k, v) {
    if (v === null || v === undefined || v === "") params.delete(k); else params.set(k, String(v));
    var q = params.toString();
    try { history.replaceState(null, "", location.pathname + (q ? "?" + q : "") + location.hash); } catch (e) { /* file:// */ }
  }
  var fmtDur = UI.fmtDur, pct = UI.pct, fmtBytes = UI.fmtBytes, numCell = UI.numCell, pt = UI.pt, table = UI.table,
      section = UI.section;
  function fmtNum(x, n) { return (x === null || x === undefined || !isFinite(x)) ? "-" : Number(x).toPrecision(n || 3); }
  function chart(into, id) { var d = el("div", null, {"class": "plot", id: id}); into.appendChild(d); return d; }
  function plot(div, traces, layout) {
    if (!global.Plotly) return;
    layout.margin = layout.margin || {l: 60, r: 10, t: 30, b: 40};
    Plotly.react(div, traces, layout, {displaylogo: false, responsive: true});
  }
  function nodata(into, text) { into.appendChild(el("p", text, {"class": "nodata muted"})); }
  function by(rows, key) {
    var out = {};
    rows.forEach(function (r) { (out[r[key]] = out[r[key]] || []).push(r); });
    return out;
  }
  /** A <select> of the runs (with "every run" when `all`), kept in the URL as `key`. */
  function runPicker(into, key, doc, all, onChange, label) {
    var lab = el("label", (label || "run") + " ");
    var s = el("select", null, {id: key + "-run", "aria-label": (label || "run") + " shown"});
    if (all) s.appendChild(el("option", "every run", {value: ""}));
    doc.runs.forEach(function (r) { s.appendChild(el("option", runLabel(r), {value: r.run_id})); });
    var want = params.get(key);
    var ids = doc.runs.map(function (r) { return r.run_id; });
    s.value = (want !== null && (ids.indexOf(want) >= 0 || (all && want === ""))) ? want : (all ? "" : ids[ids.length - 1]);
    s.addEventListener("change", function () { setParam(key, s.value); onChange(s.value); });
    lab.appendChild(s);
    into.appendChild(lab);
    return s;
  }
  var runLabels = {};
  function runLabel(r) { return runLabels[r.run_id] || r.run_id; }

  // ---- sections ---------------------------------------------------------------------------------------
  function renderRuns(root, doc) {
    var s = section(root, "cmp-runs", "Runs", "The runs compared, oldest first; the tested runs against the baseline.");
    var t = table("runs", [["run"], ["name"], ["set"], ["status"], ["wall", 1], ["host"], ["script (SHA-256)"], ["Dask"]]);
    var b = t.tBodies[0], after = new Set(doc.after), before = new Set(doc.before);
    doc.runs.forEach(function (r) {
      var tr = el("tr", null, {"data-run": r.run_id});
      var td = el("td"), a = el("a", r.run_id, {href: "/ui/runs/" + encodeURIComponent(r.run_id), "class": "key"});
      td.appendChild(a); tr.appendChild(td);
      tr.appendChild(el("td", r.name, {"class": "key name"}));
      tr.appendChild(el("td", after.has(r.run_id) ? "tested" : (before.has(r.run_id) ? "baseline" : "-"), {"class": "set"}));
      var st = el("td"); st.appendChild(UI.statusBadge(r.status)); tr.appendChild(st);
      tr.appendChild(numCell(fmtDur(r.duration_s), r.duration_s, "wall"));
      tr.appendChild(el("td", r.host, {"class": "key"}));
      tr.appendChild(el("td", r.script_sha256 ? String(r.script_sha256).slice(0, 12) : "-", {"class": "key"}));
      tr.appendChild(el("td", r.dask_version || "-"));
      b.appendChild(tr);
    });
    s.appendChild(t);
  }

  function renderPhases(root, doc) {
    var s = section(root, "cmp-phases", "Time per phase (mean and standard deviation across the runs of each name)",
                    "Computation: the executing resources' slot-time in tasks; communication: transfer time; I/O: timed I/O " +
                    "(left out where the run's I/O records carry bytes but no durations); total: wall time. The phases overlap.");
    var names = by(doc.phase_summary, "name"), traces = [];
    Object.keys(names).forEach(function (n) {
      var rows = names[n];
      traces.push({type: "bar", name: pt(n), x: rows.map(function (r) { return r.phase; }),
                   y: rows.map(function (r) { return r.mean_s; }),
                   error_y: {type: "data", array: rows.map(function (r) { return r.std_s; }), visible: true},
                   hovertemplate: "%{x}: %{y:.4f} s ± %{error_y.array:.4f}<extra>" + pt(n) + "</extra>"});
    });
    // each run as a point on its phase
    var xs = [], ys = [], texts = [];
    doc.phases.forEach(function (r) {  // one row per run, a column per phase
      ["computation", "communication", "io", "total"].forEach(function (ph) {
        var v = r[ph + "_s"];
        if (v !== null && v !== undefined && isFinite(v)) { xs.push(ph); ys.push(v); texts.push(pt(runLabel(r))); }
      });
    });
    if (xs.length) traces.push({type: "scatter", mode: "markers", name: "one run", x: xs, y: ys, text: texts,
                                marker: {color: "#222", size: 6, symbol: "circle-open"},
                                hovertemplate: "%{text}: %{y:.4f} s<extra></extra>"});
    plot(chart(s, "phases-chart"), traces, {barmode: "group", yaxis: {title: {text: "seconds"}}, height: 320});
    var t = table("phase-summary", [["name"], ["phase"], ["runs", 1], ["mean", 1], ["std", 1], ["min", 1], ["max", 1], ["CV", 1]]);
    doc.phase_summary.forEach(function (r) {
      var tr = el("tr", null, {"data-phase": r.phase});
      tr.appendChild(el("td", r.name, {"class": "key"}));
      tr.appendChild(el("td", r.phase));
      tr.appendChild(numCell(UI.fmtInt(r.runs), r.runs));
      tr.appendChild(numCell(fmtDur(r.mean_s), r.mean_s, "mean"));
      tr.appendChild(numCell(fmtDur(r.std_s), r.std_s, "std"));
      tr.appendChild(numCell(fmtDur(r.min_s), r.min_s));
      tr.appendChild(numCell(fmtDur(r.max_s), r.max_s));
      tr.appendChild(numCell(fmtNum(r.cv), r.cv, "cv"));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
  }

  function renderChanges(root, doc) {
    var s = section(root, "cmp-changes", "Task groups: what changed",
                    doc.settings.test + "; changed when the adjusted p-value is below " + doc.settings.alpha +
                    " and the median moved by at least " + pct(doc.settings.min_change) + " and " +
                    fmtDur(doc.settings.min_shift_s) + ". Changed groups first, the largest change of total time first.");
    if (!doc.changes.length) { nodata(s, "Nothing to test: one of the two sets of runs is empty."); return; }
    var t = table("changes", [["group"], ["verdict"], ["median before", 1], ["median after", 1], ["ratio", 1],
                              ["total per run, change", 1], ["tasks", 1], ["p (adjusted)", 1]]);
    doc.changes.forEach(function (r) {
      var tr = el("tr", null, {"data-group": r.group, "data-changed": r.changed ? "1" : "0"});
      tr.appendChild(el("td", r.group, {"class": "key group"}));
      tr.appendChild(el("td", r.direction || "unchanged", {"class": "verdict" + (r.changed ? " error" : "")}));
      tr.appendChild(numCell(fmtDur(r.median_before_s), r.median_before_s, "before"));
      tr.appendChild(numCell(fmtDur(r.median_after_s), r.median_after_s, "after"));
      tr.appendChild(numCell(fmtNum(r.ratio), r.ratio, "ratio"));
      tr.appendChild(numCell(fmtDur(r.delta_total_s), r.delta_total_s, "delta"));
      tr.appendChild(numCell(UI.fmtInt(r.tasks_before) + " / " + UI.fmtInt(r.tasks_after), null));
      tr.appendChild(numCell(fmtNum(r.p_adjusted, 2), r.p_adjusted, "p"));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
  }

  function renderGroups(root, doc) {
    var s = section(root, "cmp-groups", "Task durations per group and run",
                    "One box per run and group (the tasks' durations); the table gives each group's CV (std / mean) per run.");
    var traces = [], runsById = by(doc.tasks, "run_id");
    Object.keys(runsById).forEach(function (rid) {
      var rows = runsById[rid];
      traces.push({type: "box", name: pt(runLabel({run_id: rid})), x: rows.map(function (r) { return pt(r.group); }),
                   y: rows.map(function (r) { return r.duration_s; }), boxpoints: false});
    });
    if (traces.length) plot(chart(s, "groups-chart"), traces, {boxmode: "group", yaxis: {type: "log", title: {text: "seconds"}},
                                                               height: 360});
    else nodata(s, "No task recorded in these runs.");
    var t = table("groups", [["run"], ["group"], ["tasks", 1], ["total", 1], ["mean", 1], ["median", 1], ["CV", 1]]);
    doc.groups.forEach(function (r) {
      var tr = el("tr", null, {"data-run": r.run_id, "data-group": r.group});
      tr.appendChild(el("td", runLabel(r), {"class": "key"}));
      tr.appendChild(el("td", r.group, {"class": "key"}));
      tr.appendChild(numCell(UI.fmtInt(r.tasks), r.tasks, "tasks"));
      tr.appendChild(numCell(fmtDur(r.total_s), r.total_s, "total"));
      tr.appendChild(numCell(fmtDur(r.mean_s), r.mean_s));
      tr.appendChild(numCell(fmtDur(r.median_s), r.median_s));
      tr.appendChild(numCell(fmtNum(r.cv), r.cv, "cv"));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
  }

  function renderOrder(root, doc) {
    var s = section(root, "cmp-order", "Scheduling order (Kendall's tau between the start orders of the task keys two runs share)",
                    "1: the same order; 0: unrelated; -1: reversed.");
    if (!doc.order.length) { nodata(s, "Fewer than two runs."); return; }
    var ids = doc.runs.map(function (r) { return r.run_id; }), z = ids.map(function () { return ids.map(function () { return null; }); });
    ids.forEach(function (_, i) { z[i][i] = 1; });
    doc.order.forEach(function (r) {
      var a = ids.indexOf(r.run_a), b = ids.indexOf(r.run_b);
      if (a >= 0 && b >= 0) { z[a][b] = r.kendall_tau; z[b][a] = r.kendall_tau; }
    });
    var labels = ids.map(function (i) { return pt(runLabel({run_id: i})); });
    plot(chart(s, "order-chart"), [{type: "heatmap", z: z, x: labels, y: labels, zmin: -1, zmax: 1, colorscale: "RdBu",
                                    hovertemplate: "%{x} / %{y}: tau %{z:.3f}<extra></extra>"}],
         {height: Math.max(260, 60 + 40 * ids.length), margin: {l: 160, r: 10, t: 20, b: 120}});
    var t = table("order", [["run"], ["run"], ["shared tasks", 1], ["tau", 1]]);
    doc.order.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", runLabel({run_id: r.run_a}), {"class": "key"}));
      tr.appendChild(el("td", runLabel({run_id: r.run_b}), {"class": "key"}));
      tr.appendChild(numCell(UI.fmtInt(r.common_tasks), r.common_tasks));
      tr.appendChild(numCell(fmtNum(r.kendall_tau), r.kendall_tau, "tau"));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
  }

  function renderPlacement(root, doc) {
    var s = section(root, "cmp-placement", "Where tasks ran", "Tasks per worker (the executing resource's parent) in each run, " +
                    "and the tasks the scheduler moved between workers before they ran.");
    var per = {}, runs = doc.runs.map(function (r) { return r.run_id; });
    doc.placement.forEach(function (r) {
      var w = r.host ? r.worker + " @ " + r.host : r.worker;
      per[w] = per[w] || {};
      per[w][r.run_id] = (per[w][r.run_id] || 0) + r.tasks;
    });
    var traces = Object.keys(per).map(function (w) {
      return {type: "bar", name: pt(w), x: runs.map(function (i) { return pt(runLabel({run_id: i})); }),
              y: runs.map(function (i) { return per[w][i] || 0; })};
    });
    if (traces.length) plot(chart(s, "placement-chart"), traces, {barmode: "stack", yaxis: {title: {text: "tasks"}}, height: 320});
    else nodata(s, "No task recorded in these runs.");
    s.appendChild(el("h3", "Tasks moved from one worker to another while assigned (work stealing)"));
    var moved = {};
    doc.moves.forEach(function (m) { moved[m.run_id] = (moved[m.run_id] || 0) + m.tasks; });
    var t = table("moves", [["run"], ["tasks moved", 1], ["from -> to (tasks)"]]);
    runs.forEach(function (i) {
      var tr = el("tr", null, {"data-run": i});
      tr.appendChild(el("td", runLabel({run_id: i}), {"class": "key"}));
      tr.appendChild(numCell(UI.fmtInt(moved[i] || 0), moved[i] || 0, "moved"));
      tr.appendChild(el("td", doc.moves.filter(function (m) { return m.run_id === i; }).map(function (m) {
        return (m.from_worker || "?") + " -> " + (m.to_worker || "?") + " (" + m.tasks + ")"; }).join("; "), {"class": "key"}));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
  }

  function renderTransfers(root, doc) {
    var s = section(root, "cmp-transfers", "Communication time against size, same host or different hosts",
                    "Every transfer (" + UI.fmtInt(doc.transfer_count) + (doc.transfer_count > doc.transfers.length ?
                    ", the largest and a sample of the others drawn" : "") + "); the table fits time = latency + size / bandwidth per run and locality.");
    if (!doc.transfers.length) { nodata(s, "No transfer recorded in these runs."); return; }
    var groups = {};
    doc.transfers.forEach(function (r) {
      var k = r.locality + " | " + runLabel({run_id: r.run_id});
      (groups[k] = groups[k] || []).push(r);
    });
    var traces = Object.keys(groups).map(function (k) {
      var rows = groups[k];
      return {type: "scattergl", mode: "markers", name: pt(k), x: rows.map(function (r) { return r.nbytes; }),
              y: rows.map(function (r) { return r.seconds; }), marker: {size: 5, symbol: rows[0].locality === "same host" ? "circle" : "diamond"},
              hovertemplate: "%{x} B in %{y:.6f} s<extra>" + pt(k) + "</extra>"};
    });
    plot(chart(s, "transfers-chart"), traces, {xaxis: {type: "log", title: {text: "bytes"}},
                                              yaxis: {type: "log", title: {text: "seconds"}}, height: 360});
    var t = table("transfer-fit", [["run"], ["locality"], ["transfers", 1], ["bytes", 1], ["time", 1], ["latency", 1], ["bandwidth", 1]]);
    doc.transfer_fit.forEach(function (r) {
      var tr = el("tr", null, {"data-run": r.run_id, "data-locality": r.locality});
      tr.appendChild(el("td", runLabel(r), {"class": "key"}));
      tr.appendChild(el("td", r.locality));
      tr.appendChild(numCell(UI.fmtInt(r.transfers), r.transfers, "transfers"));
      tr.appendChild(numCell(fmtBytes(r.bytes), r.bytes));
      tr.appendChild(numCell(fmtDur(r.seconds), r.seconds));
      tr.appendChild(numCell(fmtDur(r.latency_s), r.latency_s, "latency"));
      tr.appendChild(numCell(r.bandwidth ? fmtBytes(r.bandwidth) + "/s" : "-", r.bandwidth, "bandwidth"));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
  }

  function renderIO(root, doc) {
    var s = section(root, "cmp-io", "I/O per thread over time",
                    "Each I/O record on the resource that made it (" + UI.fmtInt(doc.io_count) + " records" +
                    (doc.io_count > doc.io.length ? ", the largest and a sample of the others drawn" : "") + "), one row per resource.");
    if (!doc.io.length) { nodata(s, "No I/O recorded in these runs."); return; }
    var div;
    function draw(runId) {
      var rows = doc.io.filter(function (r) { return r.run_id === runId; }), ops = by(rows, "op"), traces = [];
      Object.keys(ops).forEach(function (op) {
        var xs = [], ys = [], texts = [];
        ops[op].forEach(function (r) {
          var lab = pt(r.resource), end = r.end_s > r.start_s ? r.end_s : r.start_s;
          xs.push(r.start_s, end, null); ys.push(lab, lab, null);
          var tx = pt(op + " " + (r.path || "") + " " + (r.nbytes === null ? "" : fmtBytes(r.nbytes)) + (r.task_key ? " [" + r.task_key + "]" : ""));
          texts.push(tx, tx, null);
        });
        traces.push({type: "scattergl", mode: "lines+markers", name: pt(op), x: xs, y: ys, text: texts,
                     line: {width: 8}, marker: {size: 5}, hovertemplate: "%{text}<br>%{x:.4f} s<extra></extra>"});
      });
      var rowsN = new Set(rows.map(function (r) { return r.resource; })).size;
      plot(div, traces, {xaxis: {title: {text: "seconds since the run started"}}, yaxis: {automargin: true, type: "category"},
                         height: Math.max(220, 80 + 24 * rowsN)});
      div.dataset.records = String(rows.length);
    }
    var pick = runPicker(s, "io", doc, false, draw);
    div = chart(s, "io-chart");
    draw(pick.value);
  }

  function renderCoords(root, doc) {
    var s = section(root, "cmp-coords", "Tasks in parallel coordinates: elapsed time, group, thread, output size, duration",
                    "One line per task (" + UI.fmtInt(doc.task_count) + (doc.task_count > doc.tasks.length ?
                    ", the longest and a sample of the others drawn" : "") + "), red the longest. Drag on an axis to select.");
    if (!doc.tasks.length) { nodata(s, "No task recorded in these runs."); return; }
    var div;
    function codes(values) {
      var uniq = Array.from(new Set(values)).sort(), idx = {};
      uniq.forEach(function (v, i) { idx[v] = i; });
      return {vals: values.map(function (v) { return idx[v]; }), ticks: uniq};
    }
    function draw(runId) {
      var rows = runId ? doc.tasks.filter(function (r) { return r.run_id === runId; }) : doc.tasks;
      var g = codes(rows.map(function (r) { return String(r.group); })), th = codes(rows.map(function (r) { return String(r.thread); }));
      var cut = function (t) { return t.length > 28 ? t.slice(0, 27) + "…" : t; };
      var dims = [
        {label: "elapsed (s)", values: rows.map(function (r) { return r.elapsed_s; })},
        {label: "group", values: g.vals, tickvals: g.vals.length ? g.ticks.map(function (_, i) { return i; }) : [],
         ticktext: g.ticks.map(function (t) { return pt(cut(t)); })},
        {label: "thread", values: th.vals, tickvals: th.ticks.map(function (_, i) { return i; }),
         ticktext: th.ticks.map(function (t) { return pt(cut(t)); })},
        {label: "output (MB)", values: rows.map(function (r) { return r.output_mb === null ? 0 : r.output_mb; })},
        {label: "duration (s)", values: rows.map(function (r) { return r.duration_s; })}
      ];
      plot(div, [{type: "parcoords", dimensions: dims,
                  line: {color: rows.map(function (r) { return r.duration_s; }), colorscale: [[0, "#f0f0f0"], [1, "#cb181d"]],
                         showscale: true, colorbar: {title: {text: "s"}}}}],
           {height: 420, margin: {l: 80, r: 80, t: 50, b: 30}});
      div.dataset.lines = String(rows.length);
    }
    var pick = runPicker(s, "coords", doc, true, draw);
    div = chart(s, "coords-chart");
    draw(pick.value);
  }

  function renderWarnings(root, doc) {
    var rule = doc.long_task_rule;
    var s = section(root, "cmp-warnings", "Warnings against long tasks",
                    "Warnings and errors logged over the run (bars, by category) and the long tasks running (line): a task is long " +
                    "when it took at least " + rule.factor + " times its run's median task and " + fmtDur(rule.min_s) +
                    ". The table compares the share of warnings logged while a long task ran on their host with the share " +
                    "of the run's host-time long tasks covered (what to expect if the two were unrelated).");
    var t = table("warning-summary", [["run"], ["warnings", 1], ["during long tasks", 1], ["share", 1],
                                      ["long tasks", 1], ["host-time in long tasks", 1]]);
    doc.warning_summary.forEach(function (r) {
      var tr = el("tr", null, {"data-run": r.run_id});
      tr.appendChild(el("td", runLabel(r), {"class": "key"}));
      tr.appendChild(numCell(UI.fmtInt(r.warnings), r.warnings, "warnings"));
      tr.appendChild(numCell(UI.fmtInt(r.during_long_tasks), r.during_long_tasks, "during"));
      tr.appendChild(numCell(r.warnings ? pct(r.during_long_tasks / r.warnings) : "-", r.warnings ? r.during_long_tasks / r.warnings : null));
      tr.appendChild(numCell(UI.fmtInt(r.long_tasks), r.long_tasks, "long"));
      tr.appendChild(numCell(pct(r.long_task_time_share), r.long_task_time_share, "share"));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
    if (!doc.warnings.length && !doc.long_tasks.length) { nodata(s, "No warning and no long task in these runs."); return; }
    var div;
    function draw(runId) {
      var w = doc.warnings.filter(function (r) { return r.run_id === runId; }), cats = by(w, "category"), traces = [];
      Object.keys(cats).forEach(function (c) {
        traces.push({type: "histogram", name: pt(c), x: cats[c].map(function (r) { return r.t_s; }), nbinsx: 60,
                     hovertemplate: "%{y} warnings at %{x}<extra>" + pt(c) + "</extra>"});
      });
      // how many long tasks run at each start or end
      var lt = doc.long_tasks.filter(function (r) { return r.run_id === runId; }), ev = [];
      lt.forEach(function (r) { ev.push([r.start_s, 1], [r.end_s, -1]); });
      ev.sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; });
      var xs = [], ys = [], n = 0;
      ev.forEach(function (e) { xs.push(e[0]); ys.push(n); n += e[1]; xs.push(e[0]); ys.push(n); });
      if (xs.length) traces.push({type: "scatter", mode: "lines", name: "long tasks running", x: xs, y: ys, yaxis: "y2",
                                  line: {color: "#cb181d"}, hovertemplate: "%{y} long tasks at %{x:.3f} s<extra></extra>"});
      plot(div, traces, {barmode: "stack", xaxis: {title: {text: "seconds since the run started"}},
                         yaxis: {title: {text: "warnings"}}, yaxis2: {title: {text: "long tasks"}, overlaying: "y", side: "right", rangemode: "tozero", dtick: 1},
                         height: 320, margin: {l: 60, r: 60, t: 20, b: 40}});
      div.dataset.warnings = String(w.length);
    }
    // shown first: the run with the most warnings
    var most = doc.warning_summary.reduce(function (m, r) { return r.warnings > (m ? m.warnings : 0) ? r : m; }, null);
    if (!params.get("warn") && most) params.set("warn", most.run_id);
    var pick = runPicker(s, "warn", doc, false, draw);
    div = chart(s, "warnings-chart");
    draw(pick.value);
  }

  function renderPaths(root, doc) {
    var cp = doc.critical_paths;
    var s = section(root, "cmp-paths", "The critical paths side by side",
                    "Each run's critical path (measured where the run's waits can be traced, else structural): its time per component and per task group.");
    var comps = by(cp.components, "component"), runs = cp.runs.filter(function (r) { return r.length_s !== null; });
    var traces = Object.keys(comps).map(function (c) {
      var byRun = {};
      comps[c].forEach(function (r) { byRun[r.run_id] = r.seconds; });
      return {type: "bar", orientation: "h", name: pt(c), y: runs.map(function (r) { return pt(runLabel(r)); }),
              x: runs.map(function (r) { return byRun[r.run_id] || 0; })};
    });
    if (traces.length) plot(chart(s, "paths-chart"), traces, {barmode: "stack", xaxis: {title: {text: "seconds"}},
                                                              yaxis: {automargin: true}, height: Math.max(220, 80 + 36 * runs.length)});
    var t = table("paths", [["run"], ["path"], ["length", 1], ["steps", 1], ["groups on the path (share of its length)"]]);
    var groups = by(cp.groups, "run_id");
    cp.runs.forEach(function (r) {
      var tr = el("tr", null, {"data-run": r.run_id});
      tr.appendChild(el("td", runLabel(r), {"class": "key"}));
      tr.appendChild(el("td", r.kind || ("none: " + r.missing)));
      tr.appendChild(numCell(fmtDur(r.length_s), r.length_s, "length"));
      tr.appendChild(numCell(UI.fmtInt(r.steps), r.steps));
      tr.appendChild(el("td", (groups[r.run_id] || []).slice(0, 4).map(function (g) { return g.group + " " + pct(g.share); }).join(", "),
                        {"class": "key groups"}));
      t.tBodies[0].appendChild(tr);
    });
    s.appendChild(t);
  }

  function render(doc) {
    C.doc = doc;
    var root = document.getElementById("compare");
    root.replaceChildren();
    var names = Array.from(new Set(doc.runs.map(function (r) { return r.name; })));
    doc.runs.forEach(function (r, i) { runLabels[r.run_id] = "#" + (i + 1) + " " + (r.name || "") + " (" + r.run_id.slice(-6) + ")"; });
    document.getElementById("compare-title").textContent = doc.runs.length + " runs: " + names.join(", ");
    document.title = "flowscope: compare " + names.join(", ");
    var changed = doc.changes.filter(function (r) { return r.changed; });
    document.getElementById("compare-facts").textContent = (doc.after.length ? doc.after.length + " run(s) tested against " +
      doc.before.length + "; " : "") + (changed.length ? "changed: " + changed.map(function (r) { return r.group + " " + r.direction; }).join(", ")
      : "no task group changed significantly");
    [renderRuns, renderChanges, renderPhases, renderGroups, renderPaths, renderTransfers, renderIO, renderCoords,
     renderWarnings, renderOrder, renderPlacement].forEach(function (f) {
      try { f(root, doc); } catch (e) { C.errors.push(String(e && e.stack || e)); root.appendChild(el("p", "could not draw: " + e, {"class": "error"})); }
    });
    C.renders++;
  }

  var embedded = document.getElementById("flowscope-doc"), conn = document.getElementById("conn");
  if (embedded) {
    conn.textContent = "a snapshot (flowscope compare --html)";
    document.getElementById("compare-where").textContent = "";
    render(JSON.parse(embedded.textContent));
  } else {
    UI.getJSON("/v1/ui/compare" + location.search).then(function (doc) {
      conn.textContent = "computed " + new Date().toISOString().slice(11, 19) + " UTC";
      document.getElementById("compare-where").textContent = "store " + doc.store;
      render(doc);
    }).catch(function (e) {
      conn.textContent = "failed";
      var p = el("p", String(e.message || e), {"class": "error", id: "compare-error"});
      document.getElementById("compare").replaceChildren(p);
      C.errors.push(String(e.message || e));
    });
  }
})(window);
