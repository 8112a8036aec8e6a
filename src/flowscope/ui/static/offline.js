/* The offline file of a run's dashboard pages (report/run_pages.py): the document the server would send is
 * embedded in the file, and this script stands in for the server. It picks the page from the address's fragment
 * (#critical-path; none: the overview), puts that page's body in place and runs the page's own scripts, kept in the
 * file as inert blocks; their WebSockets get the embedded view once and then stay quiet (a finished run stops
 * changing), and the forecast panel's socket and requests are answered from the forecasts the file holds. Moving to another
 * page (a link to #PAGE) reloads the file on that page. Nothing is requested from anywhere.
 *
 * The print layout (the embedded document's "layout" is "all": `flowscope report --single-page`) shows every page
 * of the file one after another in one scrolling document: this script takes the file's own text before it changes
 * anything, and gives each page a frame of it (a blob: address, local, with the fragment #frame:PAGE), which draws
 * that one page as #PAGE does and tells this document its height as it grows. */
(function (global) {
  "use strict";
  var doc = JSON.parse(document.getElementById("flowscope-doc").textContent);
  var page = decodeURIComponent(location.hash.replace(/^#/, ""));
  var framed = page.indexOf("frame:") === 0;  // one page of the print layout, in its frame
  if (framed) page = page.slice("frame:".length);
  if (doc.pages.indexOf(page) < 0) page = "";
  var written = new Date(doc.written_ns / 1e6).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  if (doc.layout === "all" && !framed) {
    printLayout("<!doctype html>\n" + document.documentElement.outerHTML);
    return;
  }
  global.flowscopeOffline = {runId: doc.run_id, page: page, doc: doc};

  function markSnapshot() {
    var conn = document.getElementById("conn");
    if (conn) conn.textContent = "snapshot of " + written;
  }

  /** What the server's socket at ``url`` would send first: the live view, one analysis view, or a forecast. */
  function firstMessage(url) {
    var path = url.replace(/^[a-z]+:\/\/[^\/]*/, "").split("?")[0];
    var m = path.match(/\/views\/([^\/]+)\/live$/);
    if (m) {
      var v = doc.views[decodeURIComponent(m[1])];
      return v ? {type: "view", doc: v} : null;
    }
    if (/^\/v1\/runs\/[^\/]+\/forecast\/live$/.test(path)) {
      var held = heldForecast(new URL(url.replace(/^wss?:/, "http:")).searchParams);
      if (held.status === 404) return {type: "refused", status: 404, error: held.body.error};
      return held.status === 200 ? {type: "forecast", status: 200, doc: held.body} :
        {type: "forecast", status: held.status, error: held.body.error};
    }
    return /\/live$/.test(path) ? doc.live : null;
  }
  /** The forecast the file holds for a query (its event at the file's fraction, the default frame size), as the
   *  server's route would answer: {status, body}. */
  function heldForecast(q) {
    var f = doc.forecast, event = q.get("event") || "idle", fraction = q.get("fraction") || "0.25";
    var held = Number(fraction) === f.fraction && !q.get("window") ? f.by_event[event] : undefined;
    if (held) return {status: held.status, body: held.body};
    return {status: 404, body: {error: "not in this file: it holds the forecast of each state at a fraction of " +
                                       f.fraction + " with the default frame size; open the run with flowscope ui for others"}};
  }

  function OfflineSocket(url) {
    var self = this, msg = firstMessage(url);
    this.url = url;
    this.readyState = 0;
    setTimeout(function () {
      if (self.readyState !== 0) return;
      self.readyState = 1;
      if (self.onopen) self.onopen({type: "open"});
      markSnapshot();
      if (msg && self.onmessage) self.onmessage({type: "message", data: JSON.stringify(msg)});
    }, 0);
  }
  OfflineSocket.prototype.send = function () {};
  OfflineSocket.prototype.close = function () {
    var self = this;
    if (this.readyState === 3) return;
    this.readyState = 3;
    setTimeout(function () { if (self.onclose) self.onclose({type: "close", code: 1000}); }, 0);
  };
  OfflineSocket.CONNECTING = 0; OfflineSocket.OPEN = 1; OfflineSocket.CLOSING = 2; OfflineSocket.CLOSED = 3;
  global.WebSocket = OfflineSocket;

  function answer(status, body) {
    return Promise.resolve(new Response(JSON.stringify(body), {status: status,
                                                                headers: {"content-type": "application/json"}}));
  }
  /** The laid-out data-state graph the file holds (report/run_pages.py graph_groups), inflated on first use. */
  var graph = null;
  function heldGraph() {
    var held = doc.graph_groups;
    if (!held || held.omitted) return Promise.reject(new Error(held ? held.omitted : "this file holds no data-state graph to expand"));
    if (!graph) {
      var bin = atob(held.data), bytes = new Uint8Array(bin.length);
      for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      graph = new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"))).text()
        .then(JSON.parse);
    }
    return graph;
  }
  /** One group cut out of the held graph, as the server's /views/critical-path/group answers (views.graph_group_doc). */
  function groupOf(g, name) {
    var k = g.groups.indexOf(name);
    if (k < 0) return null;
    var a = g.start[k], b = g.start[k + 1], src = g.src.slice(g.estart[k], g.estart[k + 1]),
        dst = g.dst.slice(g.estart[k], g.estart[k + 1]);
    function at(arr, idx) { return idx.map(function (i) { return arr[i]; }); }
    return {group: name, groups: g.groups, locations: g.locations, x: g.x.slice(a, b), y: g.y.slice(a, b),
            ids: g.ids.slice(a, b), loc: g.loc.slice(a, b),
            inputs: {x0: at(g.x, src), y0: at(g.y, src), x1: at(g.x, dst), y1: at(g.y, dst)}};
  }

  global.fetch = function (url) {
    var u = new URL(String(url), "http://offline.invalid/");
    if (/^\/v1\/ui\/runs\/[^\/]+\/views\/critical-path\/group$/.test(u.pathname)) {
      var name = u.searchParams.get("group");
      return heldGraph().then(function (g) {
        var one = groupOf(g, name);
        return one ? answer(200, one) : answer(404, {error: "group: no group " + JSON.stringify(name) + " in the data-state graph"});
      }, function (err) { return answer(404, {error: String(err.message || err)}); });
    }
    if (/^\/v1\/runs\/[^\/]+\/forecast$/.test(u.pathname)) {
      var held = heldForecast(u.searchParams);
      return answer(held.status, held.body);
    }
    return answer(404, {error: "not in this file: " + u.pathname});
  };

  if (framed) {
    // a link to another page of the file scrolls the print layout to that page's frame; the frame's height follows
    // its content's
    document.addEventListener("click", function (e) {
      var a = e.target.closest && e.target.closest("a[href]"), href = a && a.getAttribute("href");
      if (!href || !/^[?#]/.test(href)) return;
      e.preventDefault();
      var to = decodeURIComponent((href.split("#")[1] || ""));
      global.parent.postMessage({flowscopePrint: "goto", page: doc.pages.indexOf(to) < 0 ? "" : to}, "*");
    });
    var told = -1;
    var tell = function () {
      var h = Math.ceil(document.documentElement.getBoundingClientRect().height);
      if (h === told) return;
      told = h;
      global.parent.postMessage({flowscopePrint: "height", page: page, height: h}, "*");
    };
    // (a frame out of view may not be rendered, so no resize is observed there: changes to its content ask too)
    var asked = false;
    var ask = function () {
      if (asked) return;
      asked = true;
      setTimeout(function () { asked = false; tell(); }, 50);
    };
    new global.ResizeObserver(ask).observe(document.documentElement);
    new global.MutationObserver(ask).observe(document.documentElement, {childList: true, subtree: true,
                                                                         attributes: true, characterData: true});
  } else {
    global.addEventListener("hashchange", function () { location.reload(); });
  }

  var body = document.getElementById(page ? "page-view" : "page-overview").content.cloneNode(true);
  document.body.appendChild(body);
  document.title = (doc.live.name || doc.run_id) + (page ? " · " + page : "") + " · flowscope snapshot";
  markSnapshot();
  doc.scripts[page ? "view" : "overview"].forEach(function (name) {
    var s = document.createElement("script");
    s.text = document.querySelector('script[data-asset="' + name + '"]').textContent;
    document.body.appendChild(s);
  });

  /** Every page of the file one after another, each in a frame of ``source`` (this file's text) at #frame:PAGE. */
  function printLayout(source) {
    var url = URL.createObjectURL(new Blob([source], {type: "text/html"}));
    var name = doc.live.name || doc.run_id;
    document.title = name + " · all pages · flowscope snapshot";
    document.body.classList.add("print-layout");
    while (document.body.firstChild) document.body.removeChild(document.body.firstChild);
    var header = document.createElement("header"), h1 = document.createElement("h1"),
        nav = document.createElement("nav"), main = document.createElement("main");
    h1.textContent = name;
    var note = document.createElement("span");
    note.className = "conn";
    note.textContent = "snapshot of " + written + ": every page of the run, one after another";
    nav.setAttribute("aria-label", "pages of this run");
    header.appendChild(h1);
    header.appendChild(nav);
    header.appendChild(note);
    document.body.appendChild(header);
    document.body.appendChild(main);
    var frames = {};
    doc.pages.forEach(function (p) {
      var label = p ? p.replace(/-/g, " ") : "overview", id = "print-" + (p || "overview");
      var a = document.createElement("a");
      a.href = "#" + id;
      a.textContent = label;
      nav.appendChild(a);
      nav.appendChild(document.createTextNode(" "));
      var section = document.createElement("section"), h2 = document.createElement("h2"),
          frame = document.createElement("iframe");
      section.id = id;
      section.className = "print-page";
      section.setAttribute("data-page", p);
      h2.textContent = label;
      frame.title = label;
      frame.src = url + "#frame:" + p;
      section.appendChild(h2);
      section.appendChild(frame);
      main.appendChild(section);
      frames[p] = frame;
    });
    global.addEventListener("message", function (e) {
      var m = e.data;
      if (!m || !(m.page in frames) || !Object.keys(frames).some(function (p) { return frames[p].contentWindow === e.source; }))
        return;
      if (m.flowscopePrint === "height") frames[m.page].style.height = m.height + "px";
      else if (m.flowscopePrint === "goto") {
        var id = "print-" + (m.page || "overview");
        if (location.hash === "#" + id) document.getElementById(id).scrollIntoView();
        else location.hash = "#" + id;
      }
    });
    global.flowscopePrint = {pages: doc.pages.slice(), frames: frames};
  }
})(window);
