/* flowscope dashboard: helpers shared by the pages. Every string that came from an observed program (run names,
 * task keys, group names, resource labels, log messages) is set with textContent: never parsed as HTML. */
(function (global) {
  "use strict";

  /** A new element with text (as text only) and plain attributes. */
  function el(tag, text, attrs) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }

  function fmtSeconds(s) {
    if (s === null || s === undefined || !isFinite(s)) return "-";
    if (s < 1) return (s * 1e3).toFixed(0) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    var m = Math.floor(s / 60);
    if (m < 120) return m + " min " + Math.round(s - 60 * m) + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " min";
  }

  function fmtWhen(ns) {
    if (!ns) return "-";
    return new Date(ns / 1e6).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  var INT = new Intl.NumberFormat("en-US");  // one formatter: toLocaleString builds one per call
  function fmtInt(n) { return (n === null || n === undefined) ? "-" : INT.format(Number(n)); }

  /** A duration in seconds, with the unit that suits it (µs, ms, s, then minutes). */
  function fmtDur(s) {
    if (s === null || s === undefined || !isFinite(s)) return "-";
    var a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a < 1e-3) return (s * 1e6).toFixed(1) + " µs";
    if (a < 1) return (s * 1e3).toFixed(2) + " ms";
    if (a < 120) return s.toFixed(3) + " s";
    return fmtSeconds(s);
  }
  function pct(x) { return (x === null || x === undefined || !isFinite(x)) ? "-" : (100 * x).toFixed(1) + " %"; }
  function fmtBytes(n) {
    if (n === null || n === undefined || !isFinite(n)) return "-";
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(Math.round(n))) + " " + u[i];
  }
  /** A table cell showing `text` for the number `value` (kept exactly in data-value). */
  function numCell(text, value, cls) {
    var a = {"class": "num" + (cls ? " " + cls : "")};
    if (value !== null && value !== undefined) a["data-value"] = String(value);
    return el("td", text, a);
  }
  /** Text for plotly.js, which reads a few HTML tags in labels: shown literally. */
  function pt(s) {
    return String(s === null || s === undefined ? "" : s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  /** A table with its header (`heads`: [label, numeric?]) and an empty body. */
  function table(cls, heads) {
    var t = el("table", null, {"class": cls}), tr = el("tr");
    heads.forEach(function (h) { tr.appendChild(el("th", h[0], h[1] ? {"class": "num"} : null)); });
    var th = el("thead"); th.appendChild(tr); t.appendChild(th);
    t.appendChild(el("tbody"));
    return t;
  }
  /** A new section of the page, appended to `root` at once (plotly.js sizes a chart by its place on the page). */
  function section(root, id, title, help) {
    var s = el("section", null, {id: id, "aria-labelledby": id + "-h"});
    s.appendChild(el("h2", title, {id: id + "-h"}));
    if (help) s.appendChild(el("p", help, {"class": "muted"}));
    root.appendChild(s);
    return s;
  }

  function statusBadge(status) {
    var s = String(status || "unknown");
    return el("span", s, {"class": "status status-" + s.replace(/[^a-z]/g, "")});
  }

  function getJSON(url) {
    return fetch(url, {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (!r.ok) return r.text().then(function (t) { throw new Error(url + ": HTTP " + r.status + " " + t); });
      return r.json();
    });
  }

  /** The runs list: refreshed every `period` ms (the list itself is small; each run's counts are kept by the
   * collector, not recomputed). */
  function runsPage(period) {
    var body = document.querySelector("#runs tbody"), filter = document.getElementById("filter"),
        statusFilter = document.getElementById("status-filter"), store = document.getElementById("store");
    var last = null, picked = new Set(), link = document.getElementById("compare-selected");
    global.flowscopeRuns = {refreshes: 0, runs: []};
    /** The link to the compare page of the runs ticked (two or more), oldest first as the store lists them. */
    function pickedLink() {
      var ids = (last ? last.runs : []).map(function (r) { return r.run_id; }).filter(function (i) { return picked.has(i); });
      ids.reverse();
      link.hidden = ids.length < 2;
      link.setAttribute("aria-disabled", ids.length < 2 ? "true" : "false");
      link.href = "/ui/compare?" + ids.map(function (i) { return "run=" + encodeURIComponent(i); }).join("&");
      link.textContent = "compare the " + ids.length + " selected runs";
    }
    function render() {
      if (!last) return;
      var q = filter.value.toLowerCase(), st = statusFilter.value;
      body.replaceChildren();
      last.runs.forEach(function (r) {
        var hay = [r.name, r.run_id, r.command].join(" ").toLowerCase();
        if (q && hay.indexOf(q) < 0) return;
        if (st && r.status !== st) return;
        var tr = el("tr", null, {"class": "run-row", "data-run": r.run_id});
        var tdPick = el("td"), box = el("input", null, {type: "checkbox", "class": "pick-run",
                                                          "aria-label": "compare run " + r.run_id});
        box.checked = picked.has(r.run_id);
        box.addEventListener("change", function () {
          if (box.checked) picked.add(r.run_id); else picked.delete(r.run_id);
          pickedLink();
        });
        tdPick.appendChild(box); tr.appendChild(tdPick);
        var tdStatus = el("td"); tdStatus.appendChild(statusBadge(r.status)); tr.appendChild(tdStatus);
        var tdName = el("td", null, {"class": "name"}), a = el("a", r.name || r.run_id, {href: "/ui/runs/" + encodeURIComponent(r.run_id)});
        tdName.appendChild(a); tr.appendChild(tdName);
        tr.appendChild(el("td", r.run_id, {"class": "muted key"}));
        tr.appendChild(el("td", fmtWhen(r.start_ns)));
        tr.appendChild(el("td", fmtSeconds(r.duration_s), {"class": "num"}));
        tr.appendChild(el("td", r.tasks === undefined ? "-" : fmtInt(r.done) + " / " + fmtInt(r.tasks),
                          {"class": "num tasks"}));
        tr.appendChild(el("td", r.error ? r.error : fmtInt(r.warnings), {"class": "num warnings"}));
        var f = r.findings === undefined ? "" : (r.findings === null ? "…" : r.findings.slice(0, 2).join("; "));
        tr.appendChild(el("td", f, {"class": "findings"}));
        body.appendChild(tr);
      });
    }
    function refresh() {
      return getJSON("/v1/ui/runs").then(function (doc) {
        last = doc;
        store.textContent = "store " + doc.store;
        global.flowscopeRuns.runs = doc.runs;
        global.flowscopeRuns.refreshes++;
        render();
      }).catch(function (e) { store.textContent = String(e.message || e); });
    }
    filter.addEventListener("input", render);
    statusFilter.addEventListener("change", render);
    refresh();
    setInterval(refresh, period || 2000);
  }

  /** The run and page this document shows: from its path (/ui/runs/RUN_ID[/PAGE]), or, in the offline file of a
   * run's pages (report/run_pages.py), from that file. */
  function route() {
    var off = global.flowscopeOffline;
    if (off) return {runId: off.runId, page: off.page};
    var parts = location.pathname.split("/").filter(Boolean);  // ui, runs, RUN_ID, PAGE
    return {runId: decodeURIComponent(parts[2] || ""), page: parts[3] || ""};
  }
  /** The link to ``page`` of the run ("": its overview), with ``query`` (text after "?") when given. */
  function pageHref(runId, page, query) {
    var q = query ? "?" + query : "";
    if (global.flowscopeOffline) return q + "#" + (page || "");
    return "/ui/runs/" + encodeURIComponent(runId) + (page ? "/" + page : "") + q;
  }
  /** The link that saves the run's pages as one offline file (none inside that file). */
  function offlineLink(runId) {
    var a = document.getElementById("save-offline");
    if (!a) return;
    if (global.flowscopeOffline) a.remove();
    else a.setAttribute("href", "/ui/runs/" + encodeURIComponent(runId) + "/offline");
  }
  /** Whether ``node`` is within ``margin`` px (default 200) of the viewport, as a function to ask; ``onShow`` is
   *  called each time it comes in. A chart or panel below the fold is not drawn or computed until the user scrolls
   *  to it. In the offline file every node counts as shown: nothing streams there, and a saved file is printed or
   *  captured whole. */
  function shown(node, onShow, margin) {
    var state = {in: !!global.flowscopeOffline || typeof global.IntersectionObserver === "undefined"};
    if (!state.in) {
      new global.IntersectionObserver(function (entries) {
        var was = state.in;
        state.in = entries[entries.length - 1].isIntersecting;
        if (state.in && !was && onShow) onShow();
      }, {rootMargin: (margin === undefined ? 200 : margin) + "px 0px"}).observe(node);
    }
    return function () { return state.in; };
  }

  /** The document's address with ``query`` (a URLSearchParams' text) in place of its own, its fragment kept. */
  function withQuery(query) {
    return location.pathname + (query ? "?" + query : "") + location.hash;
  }

  global.flowscopeUI = {route: route, pageHref: pageHref, shown: shown, offlineLink: offlineLink, withQuery: withQuery, el: el, fmtSeconds: fmtSeconds, fmtWhen: fmtWhen, fmtInt: fmtInt, statusBadge: statusBadge,
                        getJSON: getJSON, runsPage: runsPage, fmtDur: fmtDur, pct: pct, fmtBytes: fmtBytes,
                        numCell: numCell, pt: pt, table: table, section: section};
})(window);
