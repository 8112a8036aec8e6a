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

  function fmtInt(n) { return (n === null || n === undefined) ? "-" : Number(n).toLocaleString("en-US"); }

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

  global.flowscopeUI = {el: el, fmtSeconds: fmtSeconds, fmtWhen: fmtWhen, fmtInt: fmtInt, statusBadge: statusBadge,
                        getJSON: getJSON, runsPage: runsPage};
})(window);
