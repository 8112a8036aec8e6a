/* The offline file of a run's dashboard pages (report/run_pages.py): the document the server would send is
 * embedded in the file, and this script stands in for the server. It picks the page from the address's fragment
 * (#critical-path; none: the overview), puts that page's body in place and runs the page's own scripts, kept in the
 * file as inert blocks; their WebSockets get the embedded view once and then stay quiet (a finished run stops
 * changing), and the forecast panel's requests are answered from the forecasts the file holds. Moving to another
 * page (a link to #PAGE) reloads the file on that page. Nothing is requested from anywhere. */
(function (global) {
  "use strict";
  var doc = JSON.parse(document.getElementById("flowscope-doc").textContent);
  var page = decodeURIComponent(location.hash.replace(/^#/, ""));
  if (doc.pages.indexOf(page) < 0) page = "";
  global.flowscopeOffline = {runId: doc.run_id, page: page, doc: doc};

  var written = new Date(doc.written_ns / 1e6).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  function markSnapshot() {
    var conn = document.getElementById("conn");
    if (conn) conn.textContent = "snapshot of " + written;
  }

  /** What the server's socket at ``url`` would send first: the live view, or one analysis view. */
  function firstMessage(url) {
    var path = url.replace(/^[a-z]+:\/\/[^\/]*/, "").split("?")[0];
    var m = path.match(/\/views\/([^\/]+)\/live$/);
    if (m) {
      var v = doc.views[decodeURIComponent(m[1])];
      return v ? {type: "view", doc: v} : null;
    }
    return /\/live$/.test(path) ? doc.live : null;
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
  global.fetch = function (url) {
    var u = new URL(String(url), "http://offline.invalid/");
    if (/^\/v1\/runs\/[^\/]+\/forecast$/.test(u.pathname)) {
      var f = doc.forecast, event = u.searchParams.get("event") || "idle",
          fraction = u.searchParams.get("fraction") || "0.25";
      var held = Number(fraction) === f.fraction ? f.by_event[event] : undefined;
      if (held) return answer(held.status, held.body);
      return answer(404, {error: "not in this file: it holds the forecast of each state at a fraction of " + f.fraction +
                                 "; open the run with flowscope ui for others"});
    }
    return answer(404, {error: "not in this file: " + u.pathname});
  };

  global.addEventListener("hashchange", function () { location.reload(); });

  var body = document.getElementById(page ? "page-view" : "page-overview").content.cloneNode(true);
  document.body.appendChild(body);
  document.title = (doc.live.name || doc.run_id) + (page ? " · " + page : "") + " · flowscope snapshot";
  markSnapshot();
  doc.scripts[page ? "view" : "overview"].forEach(function (name) {
    var s = document.createElement("script");
    s.text = document.querySelector('script[data-asset="' + name + '"]').textContent;
    document.body.appendChild(s);
  });
})(window);
