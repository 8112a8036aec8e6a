/* flowscope task stream: one row per worker thread, one bar per task, coloured by task group, transfers as
 * lines between threads, drawn on a 2D canvas at the level of detail the zoom allows.
 *
 * A 100,000-task run has far more bars than the plot has pixels. For the visible time range, each row draws
 *   - every task at least one pixel wide exactly as it is (snapped to whole pixels), and
 *   - the tasks narrower than a pixel merged per pixel column: one pixel-wide bar in the colour of the group
 *     that kept that pixel busiest, more opaque the larger the share of the pixel its tasks kept busy
 *     (up to 10 %, up to 50 %, more: the same levels as the static report's stream).
 * So a frame costs one pass over the visible tasks plus one rectangle per pixel column, whatever the zoom.
 * Transfers are lines between threads while at most maxTransferLines are in view, marks on the receiving
 * thread beyond that.
 * Tasks are kept per row sorted by start in growable typed arrays, so a delta appends without a rebuild.
 *
 * Plain JavaScript, no dependency, no build step. Every string that came from the observed program (task keys,
 * group names, row labels) reaches the page as text only: canvas fillText, or textContent in the tooltip.
 *
 *   const tl = new FlowscopeTimeline(div, {rows: ["host/thread", ...], groups: [{name, color: "#rrggbb"}, ...]});
 *   tl.append({start, end, row, group, key}, {start, end, src, dst});  // seconds; arrays or typed arrays;
 *                                                  // key: a list of strings or FlowscopeTimeline.Texts (UTF-8)
 *   tl.addRows(["host/thread", ...]);  // a worker that joined late
 *   tl.addGroups([{name, color}]);  tl.setRowLabel(i, "label");  // a group first seen later; a row named later
 *   tl.setView(t0, t1);  tl.view;  tl.count;  tl.draw();  tl.inspect()  // (inspect needs {record: true})
 *   tl.find("key")  // {start, end, row, group} of the task with that key (its last), or null
 *   tl.keyAt(id)    // the key of the task appended as number id (ids of inspect() and hits)
 *   tl.rowWindow    // [first, end) of the rows in view; tl.showRow(i) brings row i into view
 *   tl.highlightRow(i)  // mark row i (a band around it, its label on a tint); highlightRow(null): none;
 *                   // tl.highlighted: that row or null; tl.rowCount(i): how many tasks row i holds
 *   tl.mark("key")  // outline that task wherever it is in view (true if it is in the stream); mark(null): none;
 *                   // tl.marked: {key, row, start, end} of the task outlined, or null
 *
 * More rows than options.maxHeight holds at the smallest row height are paged: the stream shows as many as fit,
 * with a scroll bar beside them and the keys arrow up / down (a row) and page up / down (a page), and a frame
 * draws only the rows in view, so 1,000 threads cost what the rows on the screen cost.
 */
(function (global) {
  "use strict";

  var LEVELS = [0.10, 0.50, 1.0];      // busy share of a merged pixel: up to 10 %, up to 50 %, more
  // following a live run, the whole-run view ends this share of the run's length past its end, so that its scale
  // stays put while deltas fill the headroom and a draw redraws only the columns they changed
  var HEADROOM = 0.1;
  // a run that grows by a large share of its own length between draws (a young one) gets more: the headroom its
  // growth per draw since the last rescale would fill in RESCALE_DRAWS draws, at most MAX_HEADROOM
  var RESCALE_DRAWS = 10, MAX_HEADROOM = 1.0;
  var OPACITIES = [0.3, 0.6, 1.0];
  var DEFAULTS = {
    rowHeight: 0,          // px per row; 0: fit the rows into maxHeight (between 4 and 24 px)
    maxHeight: 900,        // px of rows at most; more rows than fit at minRowHeight are paged
    minRowHeight: 4,
    labelWidth: 140,       // px of row labels on the left
    rightPad: 8,
    axisHeight: 22,        // px of time axis on top
    transferColor: "#d62728",
    transferAlpha: 0.35,
    maxTransferLines: 1000, // more transfers in view than this: marks on the receiving thread, not lines
    record: false,         // keep what the last draw drew, for inspect() (tests)
    follow: true,          // a view that shows the end of the run extends as deltas arrive
    drawShare: 0.1,        // redraws for new data keep to this share of the page's time (a user's zoom is at once)
    maxDataWaitMs: 250,    // ... but new data never waits longer than this for its draw (a slow draw: a larger share)
    wheelZoom: 0.0015,     // zoom factor per wheel delta unit: exp(-deltaY * wheelZoom)
    onView: null,          // called with [t0, t1] when the view is set (zoom, pan), null for the whole run
  };

  function GrowRow() {
    this.n = 0;
    this.start = new Float64Array(16);
    this.end = new Float64Array(16);
    this.group = new Uint16Array(16);
    this.id = new Int32Array(16);
    this.maxDur = 0;
  }
  GrowRow.prototype.reserve = function (extra) {
    var need = this.n + extra;
    if (need <= this.start.length) return;
    var cap = Math.max(need, this.start.length * 2);
    var grow = function (a, T) { var b = new T(cap); b.set(a.subarray(0, this.n)); return b; }.bind(this);
    this.start = grow(this.start, Float64Array);
    this.end = grow(this.end, Float64Array);
    this.group = grow(this.group, Uint16Array);
    this.id = grow(this.id, Int32Array);
  };
  // first index whose start is >= t
  GrowRow.prototype.lowerBound = function (t) {
    var lo = 0, hi = this.n, s = this.start;
    while (lo < hi) { var mid = (lo + hi) >>> 1; if (s[mid] < t) lo = mid + 1; else hi = mid; }
    return lo;
  };
  GrowRow.prototype.insert = function (s, e, g, id) {
    this.reserve(1);
    var i = this.n;
    if (i > 0 && this.start[i - 1] > s) {  // out of order: keep the row sorted by start
      i = this.lowerBound(s);
      while (i < this.n && this.start[i] === s) i++;
      this.start.copyWithin(i + 1, i, this.n);
      this.end.copyWithin(i + 1, i, this.n);
      this.group.copyWithin(i + 1, i, this.n);
      this.id.copyWithin(i + 1, i, this.n);
    }
    this.start[i] = s; this.end[i] = e; this.group[i] = g; this.id[i] = id;
    this.n++;
    if (e - s > this.maxDur) this.maxDur = e - s;
  };

  var UTF8 = typeof TextDecoder !== "undefined" ? new TextDecoder() : null;
  var UTF8_OUT = typeof TextEncoder !== "undefined" ? new TextEncoder() : null;

  /** A column of strings as Arrow keeps them: UTF-8 ``bytes`` and ``length + 1`` offsets into them (the live
   *  channel's binary messages carry task keys so). A string is decoded only when asked for. */
  function Texts(offsets, bytes) {
    if (!(offsets instanceof Int32Array) || !(bytes instanceof Uint8Array) || offsets.length < 1) {
      throw new Error("Texts: Int32Array offsets (length + 1) and Uint8Array bytes");
    }
    var n = offsets.length - 1;
    if (offsets[0] < 0 || offsets[n] > bytes.length) {
      throw new Error("Texts: offsets run from " + offsets[0] + " to " + offsets[n] + ", there are " + bytes.length + " bytes");
    }
    this.offsets = offsets; this.bytes = bytes; this.length = n;
  }
  Texts.prototype.get = function (i) {
    return UTF8.decode(this.bytes.subarray(this.offsets[i], this.offsets[i + 1]));
  };
  /** The same strings in buffers of their own (a view into a whole message would keep the message alive). */
  Texts.prototype.own = function () {
    var o = this.offsets, lo = o[0];
    return new Texts(lo ? o.map(function (v) { return v - lo; }) : o.slice(), this.bytes.slice(lo, o[this.length]));
  };
  /** The last index holding ``text``, or -1. */
  Texts.prototype.lastIndexOf = function (text) {
    var want = UTF8_OUT.encode(text), o = this.offsets, b = this.bytes, m = want.length;
    for (var i = this.length - 1; i >= 0; i--) {
      if (o[i + 1] - o[i] !== m) continue;
      var j = 0, at = o[i];
      while (j < m && b[at + j] === want[j]) j++;
      if (j === m) return i;
    }
    return -1;
  };

  /** The keys of the tasks appended, by task id: the parts as they came (lists of strings, or Texts). */
  function Keys() { this.parts = []; this.firsts = []; this.n = 0; }
  Keys.prototype.add = function (part, n) {
    this.parts.push(part instanceof Texts ? part.own() : (part ? Array.prototype.slice.call(part) : null));
    this.firsts.push(this.n);
    this.n += n;
  };
  Keys.prototype.get = function (id) {
    var f = this.firsts, lo = 0, hi = f.length - 1;
    if (!(id >= 0 && id < this.n)) return "";
    while (lo < hi) { var mid = (lo + hi + 1) >>> 1; if (f[mid] <= id) lo = mid; else hi = mid - 1; }
    var part = this.parts[lo], i = id - f[lo];
    if (part === null) return "";
    if (part instanceof Texts) return part.get(i);
    var v = part[i];
    return v == null ? "" : String(v);
  };
  Keys.prototype.lastIndexOf = function (key) {
    for (var p = this.parts.length - 1; p >= 0; p--) {
      var part = this.parts[p], i = -1;
      if (part instanceof Texts) i = part.lastIndexOf(key);
      else if (part) for (i = part.length - 1; i >= 0 && String(part[i]) !== key; i--) {}
      if (i >= 0) return this.firsts[p] + i;
    }
    return -1;
  };

  function parseColor(c) {
    var m = /^#([0-9a-f]{6})$/i.exec(String(c));
    if (!m) throw new Error("group colour " + JSON.stringify(c) + " is not of the form #rrggbb");
    return c;
  }

  function niceStep(span, target) {
    var raw = span / Math.max(1, target), p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }

  function fmtSeconds(t, step) {
    var digits = Math.max(0, Math.min(9, -Math.floor(Math.log10(step) + 1e-9)));
    return t.toFixed(digits) + " s";
  }

  function fmtDuration(d) {
    if (d >= 1) return d.toFixed(3) + " s";
    if (d >= 1e-3) return (d * 1e3).toFixed(3) + " ms";
    return (d * 1e6).toFixed(1) + " µs";
  }

  function FlowscopeTimeline(container, options) {
    options = options || {};
    var o = {};
    for (var k in DEFAULTS) o[k] = DEFAULTS[k];
    for (k in options) o[k] = options[k];
    if (!Array.isArray(o.rows) || !o.rows.length) throw new Error("options.rows: a non-empty list of row labels");
    if (!Array.isArray(o.groups)) throw new Error("options.groups: a list (empty for a stream of transfers alone)");
    if (o.groups.length > 65535) throw new Error("options.groups: at most 65,535 groups");
    this.options = o;
    this.rowLabels = o.rows.map(String);
    this.groups = o.groups.map(function (g) { return {name: String(g.name), color: parseColor(g.color)}; });
    this._packed = this._packColours(this.groups);
    var tc = parseColor(o.transferColor);
    this._transferWord = ((255 << 24) | (parseInt(tc.slice(5, 7), 16) << 16) | (parseInt(tc.slice(3, 5), 16) << 8) |
                          parseInt(tc.slice(1, 3), 16)) >>> 0;
    this._fitRows = !o.rowHeight;
    this._rowFirst = 0;          // the first row in view (rows are paged when they do not all fit)
    this._marked = null;         // {id, row, start, end} of the task mark() outlines  // no height given: the rows share maxHeight, as many as there are
    if (this._fitRows) o.rowHeight = this._fittedRowHeight();
    this.container = container;
    this.rows = this.rowLabels.map(function () { return new GrowRow(); });
    this.keys = new Keys();
    this.count = 0;
    this.extent = [Infinity, -Infinity];
    this._dirtyFrom = Infinity;  // the earliest start appended since the last draw
    this._drawnState = null;     // what the pixel buffer holds: view, sizes, rows, groups (null: nothing reusable)
    this._followEnd = -Infinity; // the whole-run view's end while a live run is followed (HEADROOM)
    this._rescaled = null;       // {draws, end}: drawCount and the run's end at the last rescale
    this._view = null;          // [t0, t1] seconds; null: the whole run
    this.xfer = {n: 0, start: new Float64Array(16), end: new Float64Array(16),
                 src: new Int32Array(16), dst: new Int32Array(16)};
    this.drawCount = 0;
    this.lastDrawMs = 0;
    this._recorded = null;
    this._pending = 0;
    this._scratch = {acc: new Float64Array(0), accStamp: new Int32Array(0), colStamp: new Int32Array(0),
                     colCount: new Int32Array(0), colBusy: new Float64Array(0), colBest: new Int32Array(0),
                     colBestV: new Float64Array(0), pass: 0};

    container.style.position = container.style.position || "relative";
    this.canvas = document.createElement("canvas");
    this.canvas.style.display = "block";
    this.canvas.style.width = "100%";
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", "task stream: one row per worker thread");
    // the canvas keeps to the top of a scroller whose content is as tall as every row: its scroll bar (shown only
    // when the rows do not all fit) pages the rows, and a draw draws only those in view
    this.canvas.style.position = "sticky";
    this.canvas.style.top = "0";
    this.scroller = document.createElement("div");
    this.scroller.className = "flowscope-rows";
    this.scroller.style.overflowX = "hidden";
    this.scroller.style.overflowY = "auto";
    this.spacer = document.createElement("div");
    this.scroller.appendChild(this.canvas);
    this.scroller.appendChild(this.spacer);
    container.appendChild(this.scroller);
    this.tooltip = document.createElement("div");
    this.tooltip.className = "flowscope-tooltip";
    this.tooltip.setAttribute("role", "tooltip");
    var ts = this.tooltip.style;
    ts.position = "absolute"; ts.display = "none"; ts.pointerEvents = "none"; ts.zIndex = "10";
    ts.background = "rgba(255,255,255,0.96)"; ts.border = "1px solid #999"; ts.borderRadius = "3px";
    ts.padding = "4px 6px"; ts.font = "12px system-ui, sans-serif"; ts.color = "#222"; ts.whiteSpace = "pre";
    ts.maxWidth = "480px"; ts.overflow = "hidden";
    container.appendChild(this.tooltip);
    if (!container.hasAttribute("tabindex")) container.setAttribute("tabindex", "0");
    this._bind();
    this.resize();
  }

  var P = FlowscopeTimeline.prototype;

  Object.defineProperty(P, "view", {
    get: function () { var v = this._currentView(); return [v[0], v[1]]; },
  });

  P._currentView = function () {
    if (this._view) return this._view;
    if (this.extent[0] <= this.extent[1] && this.extent[1] > this.extent[0]) {
      return this._followEnd > this.extent[1] ? [this.extent[0], this._followEnd] : this.extent;
    }
    if (this.extent[0] === this.extent[1]) return [this.extent[0] - 0.5, this.extent[0] + 0.5];
    return [0, 1];
  };

  P._fittedRowHeight = function () {
    var o = this.options;
    return Math.max(o.minRowHeight, Math.min(24, Math.floor(o.maxHeight / this.rowLabels.length)));
  };

  /** How many rows are in view at once: all of them, or as many as options.maxHeight holds. */
  P._rowsShown = function () {
    return Math.min(this.rowLabels.length, Math.max(1, Math.floor(this.options.maxHeight / this.options.rowHeight)));
  };

  Object.defineProperty(P, "rowWindow", {
    get: function () { return [this._rowFirst, this._rowFirst + this._rowsShown()]; },
  });

  /** Show the rows from ``first`` on (kept within the rows there are). */
  P.setRowFirst = function (first, quiet) {
    if (this._sizeDue && !quiet) this._size();  // rows added since the last draw: page over all of them
    var last = this.rowLabels.length - this._rowsShown();
    first = Math.max(0, Math.min(last, Math.round(first) || 0));
    if (Math.round(this.scroller.scrollTop / this.options.rowHeight) !== first) {
      this.scroller.scrollTop = first * this.options.rowHeight;
    }
    if (first === this._rowFirst) return;
    this._rowFirst = first;
    this._showTooltip(null);
    if (!quiet) this.requestDraw();
  };

  /** Bring row ``i`` into view (in the middle of the rows shown, if it was out of view). */
  P.showRow = function (i) {
    var w = this.rowWindow;
    if (i < w[0] || i >= w[1]) this.setRowFirst(i - Math.floor((w[1] - w[0]) / 2));
  };

  /** Mark row ``i`` (null: none): a band around it and its label on a tint, labelled whatever the row height. */
  P.highlightRow = function (i) {
    this._highlight = i === null || i === undefined || i < 0 || i >= this.rowLabels.length ? null : i;
    this._drawnState = null;  // the band may leave columns a partial draw would keep
    this.requestDraw();
  };
  Object.defineProperty(P, "highlighted", {get: function () { return this._highlight === undefined ? null : this._highlight; }});
  /** The tasks row ``i`` holds (0 for a row without any, or out of range). */
  P.rowCount = function (i) {
    var row = this.rows[i];
    return row ? row.n : 0;
  };

  /** Fit the canvas to the container and the rows, and draw at once (the page's size changed). */
  P.resize = function () {
    this._size();
    this.requestDraw();
  };

  // the canvas's size for the rows and the scroller's width; a size assigned again reallocates the canvas even
  // when it is the same, so only what changed is assigned
  P._size = function () {
    var o = this.options, dpr = global.devicePixelRatio || 1, shown = this._rowsShown();
    var h = o.axisHeight + shown * o.rowHeight + 2;
    this._sizeDue = false;
    this.scroller.style.height = h + "px";
    this.spacer.style.height = (this.rowLabels.length - shown) * o.rowHeight + "px";
    // (read after the spacer's height is set: the scroll bar, when the rows are paged, takes its width)
    var w = Math.max(o.labelWidth + o.rightPad + 50, this.scroller.clientWidth || 800);
    this.cssWidth = w; this.cssHeight = h; this.dpr = dpr;
    var Wd = Math.round(w * dpr), Hd = Math.round(h * dpr);
    if (this.canvas.width !== Wd) this.canvas.width = Wd;
    if (this.canvas.height !== Hd) this.canvas.height = Hd;
    this.canvas.style.height = h + "px";
    this.plotLeft = o.labelWidth;
    this.plotWidth = Math.max(1, Math.floor(w - o.labelWidth - o.rightPad));
    var first = this._rowFirst;
    this._rowFirst = -1;
    this.setRowFirst(first, true);
  };

  function column(obj, name, n) {
    var a = obj[name];
    if (a == null) throw new Error("tasks." + name + " is missing");
    if (a.length !== n) {
      throw new Error("tasks." + name + " has " + a.length + " values, tasks.start has " + n);
    }
    return a;
  }

  /** Add tasks (and transfers): columns of equal length; times in seconds on the run's clock. */
  P.append = function (tasks, transfers) {
    var n = tasks.start ? tasks.start.length : 0;
    var start = column(tasks, "start", n), end = column(tasks, "end", n), row = column(tasks, "row", n),
        group = column(tasks, "group", n), key = tasks.key == null ? null : column(tasks, "key", n);
    var R = this.rows.length, G = this.groups.length, i;
    // check everything before changing anything: a refused delta leaves the timeline as it was
    for (i = 0; i < n; i++) {
      var s = start[i], e = end[i], r = row[i], g = group[i];
      if (!(isFinite(s) && isFinite(e))) throw new Error("tasks.start/end at index " + i + " is not a number");
      if (e < s) throw new Error("tasks.end at index " + i + " (" + e + ") is before its start (" + s + ")");
      if (!(r >= 0 && r < R && r === Math.floor(r))) {
        throw new Error("tasks.row at index " + i + " is " + r + "; rows are 0.." + (R - 1));
      }
      if (!(g >= 0 && g < G && g === Math.floor(g))) {
        throw new Error("tasks.group at index " + i + " is " + g + "; groups are 0.." + (G - 1));
      }
    }
    if (key !== null && !(key instanceof Texts) && !Array.isArray(key)) {
      throw new Error("tasks.key: a list of strings or FlowscopeTimeline.Texts");
    }
    var m = 0, x = null;
    if (transfers) {
      m = transfers.start ? transfers.start.length : 0;
      x = {start: column(transfers, "start", m), end: column(transfers, "end", m),
           src: column(transfers, "src", m), dst: column(transfers, "dst", m)};
      for (i = 0; i < m; i++) {
        if (!(x.src[i] >= 0 && x.src[i] < R && x.dst[i] >= 0 && x.dst[i] < R)) {
          throw new Error("transfers.src/dst at index " + i + " is not a row 0.." + (R - 1));
        }
        if (!(isFinite(x.start[i]) && isFinite(x.end[i]) && x.end[i] >= x.start[i])) {
          throw new Error("transfers.start/end at index " + i + " is not an interval");
        }
      }
    }
    var v = this._currentView(), following = this._view === null ||
      (this.options.follow && this._view[1] >= this.extent[1] && this.extent[1] > -Infinity);
    var lo = this.extent[0], hi = this.extent[1], first = Infinity;
    if (n) this.keys.add(key, n);
    for (i = 0; i < n; i++) {
      if (start[i] < first) first = start[i];
      var id = this.count++;
      this.rows[row[i]].insert(start[i], end[i], group[i], id);
      if (start[i] < lo) lo = start[i];
      if (end[i] > hi) hi = end[i];
    }
    if (m) {
      var X = this.xfer;
      if (X.n + m > X.start.length) {
        var cap = Math.max(X.n + m, X.start.length * 2);
        ["start", "end"].forEach(function (f) { var b = new Float64Array(cap); b.set(X[f].subarray(0, X.n)); X[f] = b; });
        ["src", "dst"].forEach(function (f) { var b = new Int32Array(cap); b.set(X[f].subarray(0, X.n)); X[f] = b; });
      }
      for (i = 0; i < m; i++) {
        X.start[X.n] = x.start[i]; X.end[X.n] = x.end[i]; X.src[X.n] = x.src[i]; X.dst[X.n] = x.dst[i]; X.n++;
        if (x.start[i] < lo) lo = x.start[i];
        if (x.end[i] > hi) hi = x.end[i];
      }
    }
    // the whole-run view of a run that grows past what was drawn gets headroom (a run shown whole for the first
    // time, or that did not grow, is shown exactly)
    if (this.drawCount && (lo < this.extent[0] || hi > Math.max(this.extent[1], this._followEnd))) {
      var last = this._rescaled, len = hi - lo, share = HEADROOM;
      if (last && len > 0 && hi > last.end) {  // the run's growth per draw since then, as a share of its length
        var perDraw = (hi - last.end) / len / Math.max(1, this.drawCount - last.draws);
        share = Math.min(MAX_HEADROOM, Math.max(HEADROOM, perDraw * RESCALE_DRAWS));
      }
      this._rescaled = {draws: this.drawCount, end: hi};
      this._followEnd = lo + len * (1 + share);
    }
    this.extent = [lo, hi];
    if (first < this._dirtyFrom) this._dirtyFrom = first;
    if (this._view && following) this._view = [v[0], hi];
    this.requestDraw(true);
    return this.count;
  };

  /** Add rows at the bottom (a worker that joined late); returns the number of rows. */
  P.addRows = function (labels) {
    if (!Array.isArray(labels)) throw new Error("addRows: a list of row labels");
    for (var i = 0; i < labels.length; i++) { this.rowLabels.push(String(labels[i])); this.rows.push(new GrowRow()); }
    if (this._fitRows) this.options.rowHeight = this._fittedRowHeight();
    // new data, like new tasks: sized and drawn (a full draw, every row's height may have changed) at the data's
    // pace, once for the rows of several deltas
    this._sizeDue = true;
    this.requestDraw(true);
    return this.rows.length;
  };

  /** Add task groups after the last one (a group first seen in a delta); returns the number of groups. */
  P.addGroups = function (groups) {
    if (!Array.isArray(groups)) throw new Error("addGroups: a list of {name, color}");
    var add = groups.map(function (g) { return {name: String(g.name), color: parseColor(g.color)}; });
    if (this.groups.length + add.length > 65535) throw new Error("addGroups: at most 65,535 groups");
    this.groups = this.groups.concat(add);
    // the colours of the groups before are unchanged: what the last draw drew with them can be kept
    Array.prototype.push.apply(this._packed, this._packColours(add));
    this.requestDraw(true);
    return this.groups.length;
  };

  /** Change row ``i``'s label (its resource was declared after its first task arrived). */
  P.setRowLabel = function (i, label) {
    if (!(i >= 0 && i < this.rowLabels.length && i === Math.floor(i))) {
      throw new Error("setRowLabel: row " + i + " is not one of 0.." + (this.rowLabels.length - 1));
    }
    this.rowLabels[i] = String(label);
    this.requestDraw(true);
  };

  /** Show [t0, t1] seconds; with no argument, the whole run (and follow it). */
  P.setView = function (t0, t1) {
    if (t0 === undefined) {
      this._view = null;
    } else {
      if (!(isFinite(t0) && isFinite(t1) && t1 > t0)) throw new Error("setView: need t0 < t1, got " + t0 + ", " + t1);
      this._view = [t0, t1];
    }
    this.requestDraw();
    if (this.options.onView) this.options.onView(this._view ? [t0, t1] : null);
  };

  /** The task whose key is ``key`` (the last appended, when several attempts share it): {start, end, row, group},
   *  or null. A scan of every row: for a link, not for a frame. */
  P.find = function (key) {
    var t = this._locate(key);
    return t && {start: t.start, end: t.end, row: t.row, group: this.groups[t.group].name};
  };

  /** {id, row, start, end, group} of the last task appended with key ``key``, or null (a scan of every row). */
  P._locate = function (key) {
    var id = this.keys.lastIndexOf(String(key));
    for (var r = 0; id >= 0 && r < this.rows.length; r++) {
      var row = this.rows[r];
      for (var i = 0; i < row.n; i++) {
        if (row.id[i] === id) return {id: id, row: r, start: row.start[i], end: row.end[i], group: row.group[i]};
      }
    }
    return null;
  };

  /** Outline the task whose key is ``key`` (its last attempt) in every draw that shows it; ``null``: no task.
   *  Returns whether the stream holds that task. */
  P.mark = function (key) {
    this._marked = key === null || key === undefined ? null : this._locate(key);
    this._drawnState = null;  // the outline may leave columns a partial draw would keep
    this.requestDraw();
    return this._marked !== null;
  };

  Object.defineProperty(P, "marked", {
    get: function () {
      var m = this._marked;
      return m && {key: this.keys.get(m.id), row: m.row, start: m.start, end: m.end};
    },
  });

  /** The key of the task with id ``id`` (its place in the order of appending), "" for none. */
  P.keyAt = function (id) { return this.keys.get(id); };

  /** Draw at the next animation frame; for new data (``data``), no sooner than drawing keeps to
   *  options.drawShare of the page's time: a draw that took d ms is followed by the next d / drawShare ms after
   *  it began, so that a run streaming 100,000 tasks a second does not spend the page's time redrawing; and no
   *  later than options.maxDataWaitMs after it began, so that what arrives is shown within that much even when a
   *  draw is slow (a full one over a large run, or pages sharing a busy machine). */
  P.requestDraw = function (data) {
    if (this._pending) return;
    var self = this, share = this.options.drawShare;
    if (data && share > 0 && this._drawnAt !== undefined) {
      var wait = this._drawnAt + Math.min(this.options.maxDataWaitMs, this.lastDrawMs / share) - global.performance.now();
      if (wait > 1) {
        if (!this._timer) this._timer = global.setTimeout(function () { self._timer = 0; self.requestDraw(); }, wait);
        return;
      }
    }
    this._pending = global.requestAnimationFrame(function () { self._pending = 0; self.draw(true); });
  };

  // one opaque word per group and level (RGBA bytes read as a little-endian Uint32, as on every browser's CPU): the group's colour at that opacity over white (merged columns are
  // the bottom layer), and the full colour last (exact bars)
  P._packColours = function (groups) {
    var out = [], NL = LEVELS.length;
    groups.forEach(function (g) {
      var rgb = [1, 3, 5].map(function (i) { return parseInt(g.color.slice(i, i + 2), 16); });
      for (var l = 0; l <= NL; l++) {
        var a = l < NL ? OPACITIES[l] : 1;
        var c = rgb.map(function (v) { return Math.round(v * a + 255 * (1 - a)); });
        out.push(((255 << 24) | (c[2] << 16) | (c[1] << 8) | c[0]) >>> 0);
      }
    });
    return out;
  };

  P._pixels = function (Wd, Hd) {
    if (!this._image || this._image.width !== Wd || this._image.height !== Hd) {
      this._image = this.canvas.getContext("2d").createImageData(Wd, Hd);
      this._words = new Uint32Array(this._image.data.buffer);
    }
    this._words.fill(0);
    return this._words;
  };

  P._scratchFor = function (W, G) {
    var S = this._scratch;
    if (S.acc.length < W * G) { S.acc = new Float64Array(W * G); S.accStamp = new Int32Array(W * G); }
    if (S.colStamp.length < W) {
      S.colStamp = new Int32Array(W); S.colCount = new Int32Array(W); S.colBusy = new Float64Array(W);
      S.colBest = new Int32Array(W); S.colBestV = new Float64Array(W);
    }
    return S;
  };

  /** Draw now, all of it; returns {exact, merged, transfers, ms}. ``partial`` (the page's own frames): when only
   *  new tasks changed since the last draw, redraw only the columns they reach, and count only those. */
  P.draw = function (partial) {
    var t0 = this._drawnAt = global.performance.now();
    if (this._pending) { global.cancelAnimationFrame(this._pending); this._pending = 0; }
    if (this._timer) { global.clearTimeout(this._timer); this._timer = 0; }
    if (this._sizeDue) this._size();
    var o = this.options, ctx = this.canvas.getContext("2d"), dpr = this.dpr;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    var v = this._currentView(), v0 = v[0], v1 = v[1], W = this.plotWidth, L0 = this.plotLeft;
    var scale = W / (v1 - v0), pxDur = 1 / scale, G = this.groups.length, rh = o.rowHeight;
    var barH = Math.max(1, rh - (rh >= 8 ? 4 : 1)), barOff = (rh - barH) / 2, top = o.axisHeight;
    var S = this._scratchFor(W, G), NL = LEVELS.length, packed = this._packed, li;
    var rec = o.record ? {exact: [], merged: [], transfers: 0, view: [v0, v1]} : null;
    var nExact = 0, nMerged = 0, touched = [], bars = [];
    // the bars are written straight into one pixel buffer (axis-aligned, whole pixels): per row, one pixel line
    // gets its merged columns, then its exact bars over them, and is copied down to the bar's height. Far
    // cheaper than rasterising tens of thousands of canvas paths.
    // A run followed live: when nothing but new tasks changed since the last draw (same view, sizes, rows and
    // colours), only the plot columns from the earliest new task's start on are redrawn; the columns before
    // keep their pixels. Every task that reaches those columns is in a suffix of its row (sorted by start), so
    // they are recomputed whole, and the exact bars of that suffix are drawn again in order (the same pixels
    // where they reach back before it); transfer marks are drawn again, all of them.
    var Wd = this.canvas.width, Hd = this.canvas.height, R = this.rows.length, prev = this._drawnState;
    var first = this._rowFirst, past = Math.min(R, first + this._rowsShown());
    if (rec) rec.rows = [first, past];
    var incremental = partial === true && !rec && prev !== null && this._image && this._image.width === Wd &&
      this._image.height === Hd && prev.v0 === v0 && prev.v1 === v1 && prev.W === W && prev.L0 === L0 &&
      prev.dpr === dpr && prev.rh === rh && prev.R === R && prev.packed === packed && prev.first === first;
    var ca = incremental ? (this._dirtyFrom === Infinity ? W :
                            Math.max(0, Math.min(W, Math.floor((this._dirtyFrom - v0) * scale)))) : 0;
    var from = v0 + ca * pxDur, clearAt = Math.round((L0 + ca) * dpr);
    var buf = incremental ? this._words : this._pixels(Wd, Hd);
    var dirtyDa = incremental ? Wd : 0;  // the leftmost device pixel column the buffer changed in
    var put = function (line, x0, x1, colour) {
      var da = Math.round((L0 + x0) * dpr), db = Math.min(Wd, Math.round((L0 + x1) * dpr));
      buf.fill(colour, line + da, line + (db > da ? db : da + 1));
      if (da < dirtyDa) dirtyDa = da;
    };

    for (var r = first; r < past; r++) {
      var row = this.rows[r];
      if (!row.n) continue;
      var y = top + (r - first) * rh + barOff, pass = ++S.pass;
      var yd0 = Math.round(y * dpr), yd1 = Math.min(Hd, Math.max(yd0 + 1, Math.round((y + barH) * dpr)));
      if (yd0 >= Hd) break;
      var line = yd0 * Wd;
      if (ca >= W) continue;
      var i = row.lowerBound((incremental ? from - pxDur : v0) - row.maxDur), s = row.start, e = row.end,
          g = row.group, n = row.n;
      touched.length = 0;
      bars.length = 0;
      var sorted = true, lastCol = -1;
      for (; i < n && s[i] <= v1; i++) {
        var a = s[i], b = e[i];
        if (b < v0) continue;
        var x0 = (a - v0) * scale, x1 = (b - v0) * scale;
        if (x1 - x0 >= 1) {
          var p0 = Math.max(0, Math.round(x0)), p1 = Math.min(W, Math.round(x1));
          if (p1 <= p0) p1 = Math.min(W, p0 + 1);
          if (p1 <= p0) continue;
          bars.push(p0, p1, g[i]);
          nExact++;
          if (rec) rec.exact.push({id: row.id[i], key: this.keys.get(row.id[i]), row: r, group: g[i],
                                   x0: L0 + p0, x1: L0 + p1, y0: y, y1: y + barH});
        } else {
          var c = Math.floor((x0 + x1) / 2);
          c = c < 0 ? 0 : (c >= W ? W - 1 : c);
          if (c < ca) continue;  // a column kept from the last draw
          var d = b - a, k = c * G + g[i];
          if (S.colStamp[c] !== pass) {
            S.colStamp[c] = pass; S.colCount[c] = 0; S.colBusy[c] = 0; S.colBestV[c] = -1;
            touched.push(c);
            if (c < lastCol) sorted = false;
            lastCol = c;
          }
          if (S.accStamp[k] !== pass) { S.accStamp[k] = pass; S.acc[k] = 0; }
          S.acc[k] += d;
          S.colCount[c]++; S.colBusy[c] += d;
          if (S.acc[k] > S.colBestV[c]) { S.colBestV[c] = S.acc[k]; S.colBest[c] = g[i]; }
        }
      }
      if (!touched.length && !bars.length) continue;
      if (incremental) { buf.fill(0, line + clearAt, line + Wd); if (clearAt < dirtyDa) dirtyDa = clearAt; }
      if (!sorted) touched.sort(function (p, q) { return p - q; });
      // merged columns: adjacent ones of the same group and level are filled as one run
      var runStart = -1, runEnd = -1, runStyle = -1;
      for (var t = 0; t < touched.length; t++) {
        var col = touched[t], f = Math.min(1, S.colBusy[col] / pxDur);
        for (li = 0; li < NL - 1 && f > LEVELS[li]; li++);
        var style = S.colBest[col] * (NL + 1) + li;
        if (rec) rec.merged.push({row: r, column: col, group: S.colBest[col], tasks: S.colCount[col], busy: f,
                                  x0: L0 + col, x1: L0 + col + 1, y0: y, y1: y + barH});
        nMerged++;
        if (style === runStyle && col === runEnd) { runEnd = col + 1; continue; }
        if (runStyle >= 0) put(line, runStart, runEnd, packed[runStyle]);
        runStart = col; runEnd = col + 1; runStyle = style;
      }
      if (runStyle >= 0) put(line, runStart, runEnd, packed[runStyle]);
      for (var j = 0; j < bars.length; j += 3) put(line, bars[j], bars[j + 1], packed[bars[j + 2] * (NL + 1) + NL]);
      for (var yd = yd0 + 1; yd < yd1; yd++) buf.copyWithin(yd * Wd, line, line + Wd);
    }
    // transfers: a line from the sending thread at the start to the receiving thread at the end while few are in
    // view; beyond maxTransferLines, lines would hide the tasks: a mark on the receiving thread instead (the
    // lower third of its bar, from start to end, at least a pixel), as Dask's and the report's streams show them
    var X = this.xfer, inView = 0, j;
    for (j = 0; j < X.n; j++) if (!(X.end[j] < v0 || X.start[j] > v1)) inView++;
    var asLines = inView <= o.maxTransferLines, nMarks = 0;
    if (rec) rec.marks = [];
    if (!asLines) {
      var red = this._transferWord, markH = Math.max(1, Math.round(barH / 3));
      for (j = 0; j < X.n; j++) {
        if (X.end[j] < v0 || X.start[j] > v1 || X.dst[j] < first || X.dst[j] >= past) continue;
        var m0 = Math.max(0, Math.round((X.start[j] - v0) * scale)), m1 = Math.min(W, Math.round((X.end[j] - v0) * scale));
        if (m1 <= m0) { m0 = Math.min(m0, W - 1); m1 = m0 + 1; }
        var my1 = top + (X.dst[j] - first) * rh + barOff + barH, my0 = my1 - markH;
        var md0 = Math.round(my0 * dpr), md1 = Math.min(Hd, Math.max(md0 + 1, Math.round(my1 * dpr)));
        for (var md = md0; md < md1; md++) put(md * Wd, m0, m1, red);
        nMarks++;
        if (rec) rec.marks.push({row: X.dst[j], x0: L0 + m0, x1: L0 + m1, y0: my0, y1: my1});
      }
    }
    // only what changed goes to the canvas (transfer lines are drawn over it with transparency: then all of it)
    if (!incremental || (asLines && inView)) ctx.putImageData(this._image, 0, 0);
    else if (dirtyDa < Wd) ctx.putImageData(this._image, 0, 0, dirtyDa, 0, Wd - dirtyDa, Hd);

    var nx = 0;
    if (asLines && inView) {
      ctx.save();
      ctx.beginPath();
      ctx.rect(L0, top, W, this.cssHeight - top);
      ctx.clip();
      ctx.beginPath();
      for (j = 0; j < X.n; j++) {
        if (X.end[j] < v0 || X.start[j] > v1) continue;
        ctx.moveTo(L0 + (X.start[j] - v0) * scale, top + (X.src[j] - first + 0.5) * rh);
        ctx.lineTo(L0 + (X.end[j] - v0) * scale, top + (X.dst[j] - first + 0.5) * rh);
        nx++;
      }
      ctx.globalAlpha = o.transferAlpha;
      ctx.strokeStyle = o.transferColor;
      ctx.lineWidth = 1;
      ctx.stroke();
      ctx.restore();
    }
    var mk = this._marked, outline = null;
    if (mk && mk.row >= first && mk.row < past && mk.end >= v0 && mk.start <= v1) {
      var ox0 = Math.max(0, Math.round((mk.start - v0) * scale)), ox1 = Math.min(W, Math.round((mk.end - v0) * scale));
      if (ox1 <= ox0) ox1 = ox0 + 1;
      var oy = top + (mk.row - first) * rh + barOff;
      outline = {x0: L0 + ox0 - 2, x1: L0 + ox1 + 2, y0: oy - 2, y1: oy + barH + 2};
      ctx.save();
      ctx.globalAlpha = 1;
      ctx.strokeStyle = "#000";
      ctx.lineWidth = 2;
      ctx.strokeRect(outline.x0 + 1, outline.y0 + 1, outline.x1 - outline.x0 - 2, outline.y1 - outline.y0 - 2);
      ctx.restore();
    }
    var hl = this.highlighted, band = null;
    if (hl !== null && hl >= first && hl < past) {
      band = {row: hl, x0: L0, x1: L0 + W, y0: top + (hl - first) * rh, y1: top + (hl - first + 1) * rh};
      ctx.save();
      ctx.globalAlpha = 1;
      ctx.strokeStyle = "#000";
      ctx.lineWidth = 1;
      ctx.setLineDash([4, 3]);
      ctx.strokeRect(band.x0 + 0.5, band.y0 + 0.5, band.x1 - band.x0 - 1, Math.max(1, band.y1 - band.y0 - 1));
      ctx.restore();
    }
    this._drawAxes(ctx, v0, v1, scale);
    if (rec) rec.highlight = band;
    if (rec) { rec.marked = outline; rec.transfers = nx; rec.transfer_marks = nMarks; this._recorded = rec; }
    // (an outline is drawn again by every draw, over what the buffer put back: a partial draw keeps it right)
    this._drawnState = rec ? null :
      {v0: v0, v1: v1, W: W, L0: L0, dpr: dpr, rh: rh, R: R, packed: packed, first: first};
    this._dirtyFrom = Infinity;
    this.lastDrawKind = incremental ? "incremental" : "full";
    this.drawCount++;
    this.lastDrawMs = global.performance.now() - t0;
    return {exact: nExact, merged: nMerged, transfers: nx, transferMarks: nMarks, ms: this.lastDrawMs};
  };

  P._drawAxes = function (ctx, v0, v1, scale) {
    var o = this.options, L0 = this.plotLeft, W = this.plotWidth, top = o.axisHeight, rh = o.rowHeight;
    ctx.globalAlpha = 1;
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, this.cssWidth, top - 1);
    ctx.fillRect(0, top, L0 - 1, this.cssHeight - top);
    ctx.fillStyle = "#222";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    var step = niceStep(v1 - v0, W / 110), first = Math.ceil(v0 / step) * step;
    ctx.strokeStyle = "#999";
    ctx.beginPath();
    ctx.moveTo(L0, top - 0.5); ctx.lineTo(L0 + W, top - 0.5);
    for (var t = first; t <= v1 + step * 1e-9; t += step) {
      var x = Math.round(L0 + (t - v0) * scale) + 0.5;
      ctx.moveTo(x, top - 5); ctx.lineTo(x, top);
      ctx.fillText(fmtSeconds(t, step), x + 2, top / 2 - 2);
    }
    ctx.stroke();
    // rows too thin for a label each: label every k-th row (the tooltip names every row)
    var every = Math.max(1, Math.ceil(12 / rh)), w = this.rowWindow;
    ctx.font = Math.max(9, Math.min(12, rh - 2)) + "px system-ui, sans-serif";
    for (var r = w[0]; r < w[1]; r += every) {
      ctx.fillText(this._fit(ctx, this.rowLabels[r], L0 - 6), 2, top + (r - w[0] + 0.5) * rh);
    }
    var hl = this.highlighted;  // the marked row is labelled on a tint, whatever the rows' height
    if (hl !== null && hl >= w[0] && hl < w[1]) {
      var y = top + (hl - w[0] + 0.5) * rh, lh = Math.max(rh, 14);
      ctx.fillStyle = "#fff3b0";
      ctx.fillRect(0, y - lh / 2, L0 - 1, lh);
      ctx.fillStyle = "#000";
      ctx.font = "bold 11px system-ui, sans-serif";
      ctx.fillText(this._fit(ctx, this.rowLabels[hl], L0 - 6), 2, y);
    }
  };

  // a label fitted to a width in a font: kept, since every draw labels every row again (measuring 80 labels took a
  // fifth of a live page's draws)
  P._fit = function (ctx, text, width) {
    var cache = this._fitted || (this._fitted = new Map()), k = ctx.font + "|" + width + "|" + text;
    var hit = cache.get(k);
    if (hit !== undefined) return hit;
    if (cache.size > 10000) cache.clear();
    hit = this._fitText(ctx, text, width);
    cache.set(k, hit);
    return hit;
  };

  P._fitText = function (ctx, text, width) {
    if (ctx.measureText(text).width <= width) return text;
    var lo = 0, hi = text.length;
    while (lo < hi) {
      var mid = (lo + hi + 1) >>> 1;
      if (ctx.measureText("…" + text.slice(text.length - mid)).width <= width) lo = mid; else hi = mid - 1;
    }
    return "…" + text.slice(text.length - lo);
  };

  /** What the last draw drew (with options.record): exact bars, merged pixel columns, transfer lines. */
  P.inspect = function () {
    if (!this.options.record) throw new Error("inspect() needs the timeline created with {record: true}");
    return this._recorded;
  };

  /** The task (or merged pixel column) under CSS pixel (x, y) of the canvas, or null. */
  P.hit = function (x, y) {
    var o = this.options, w = this.rowWindow, r = w[0] + Math.floor((y - o.axisHeight) / o.rowHeight);
    if (y < o.axisHeight || r >= w[1] || x < this.plotLeft || x >= this.plotLeft + this.plotWidth) return null;
    var v = this._currentView(), scale = this.plotWidth / (v[1] - v[0]);
    var col = Math.floor(x - this.plotLeft), c0 = v[0] + col / scale, c1 = v[0] + (col + 1) / scale;
    var row = this.rows[r], i = row.lowerBound(c0 - row.maxDur), best = null, count = 0, busy = 0;
    var acc = {}, top = -1, topG = 0;
    for (; i < row.n && row.start[i] <= c1; i++) {
      var a = row.start[i], b = row.end[i];
      if (b < c0) continue;
      var x0 = (a - v[0]) * scale, x1 = (b - v[0]) * scale;
      if (x1 - x0 >= 1) { best = i; continue; }
      var c = Math.floor((x0 + x1) / 2);
      if (c !== col) continue;
      count++; busy += b - a;
      var g = row.group[i];
      acc[g] = (acc[g] || 0) + b - a;
      if (acc[g] > top) { top = acc[g]; topG = g; }
    }
    if (best !== null) {
      return {kind: "task", row: r, id: row.id[best], key: this.keys.get(row.id[best]), group: row.group[best],
              start: row.start[best], end: row.end[best]};
    }
    if (count) return {kind: "merged", row: r, group: topG, tasks: count, busy: Math.min(1, busy * scale), t0: c0, t1: c1};
    return null;
  };

  P._showTooltip = function (h, x, y) {
    var tip = this.tooltip;
    if (!h) { tip.style.display = "none"; return; }
    var lines;
    if (h.kind === "task") {
      lines = [h.key || "(no key)", this.groups[h.group].name,
               fmtDuration(h.end - h.start) + " from " + h.start.toFixed(6) + " s", this.rowLabels[h.row]];
    } else {
      lines = [h.tasks + " tasks narrower than a pixel", "mostly " + this.groups[h.group].name,
               "busy " + Math.round(h.busy * 100) + " % of " + fmtDuration(h.t1 - h.t0) + " at " +
               h.t0.toFixed(6) + " s", this.rowLabels[h.row]];
    }
    tip.textContent = lines.join("\n");  // text only: keys and names come from the observed program
    tip.style.display = "block";
    var left = Math.min(x + 12, Math.max(0, this.cssWidth - tip.offsetWidth - 4));
    tip.style.left = left + "px";
    tip.style.top = (y + 14) + "px";
  };

  P._zoomAt = function (x, factor) {
    var v = this._currentView(), frac = Math.min(1, Math.max(0, (x - this.plotLeft) / this.plotWidth));
    var at = v[0] + frac * (v[1] - v[0]), width = (v[1] - v[0]) * factor;
    width = Math.max(width, 1e-9);
    this.setView(at - frac * width, at + (1 - frac) * width);
  };

  P._pan = function (dxPx) {
    var v = this._currentView(), dt = dxPx * (v[1] - v[0]) / this.plotWidth;
    this.setView(v[0] + dt, v[1] + dt);
  };

  P._bind = function () {
    var self = this, c = this.canvas, dragging = null;
    function pos(ev) { var b = c.getBoundingClientRect(); return [ev.clientX - b.left, ev.clientY - b.top]; }
    c.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var dy = ev.deltaMode === 1 ? ev.deltaY * 16 : ev.deltaY;
      self._zoomAt(pos(ev)[0], Math.exp(dy * self.options.wheelZoom));
    }, {passive: false});
    c.addEventListener("mousedown", function (ev) { dragging = pos(ev)[0]; });
    global.addEventListener("mouseup", function () { dragging = null; });
    c.addEventListener("mousemove", function (ev) {
      var p = pos(ev);
      if (dragging !== null) { self._pan(dragging - p[0]); dragging = p[0]; self._showTooltip(null); return; }
      self._showTooltip(self.hit(p[0], p[1]), p[0], p[1]);
    });
    c.addEventListener("mouseleave", function () { self._showTooltip(null); });
    c.addEventListener("dblclick", function () { self.setView(); });
    this.container.addEventListener("keydown", function (ev) {
      var mid = self.plotLeft + self.plotWidth / 2, w = self.plotWidth;
      if (ev.key === "+" || ev.key === "=") self._zoomAt(mid, 0.8);
      else if (ev.key === "-") self._zoomAt(mid, 1.25);
      else if (ev.key === "ArrowLeft") self._pan(-w / 10);
      else if (ev.key === "ArrowRight") self._pan(w / 10);
      else if (ev.key === "0" || ev.key === "Home") self.setView();
      else if (ev.key === "ArrowUp" || ev.key === "ArrowDown") self.setRowFirst(self._rowFirst + (ev.key === "ArrowUp" ? -1 : 1));
      else if (ev.key === "PageUp" || ev.key === "PageDown") {
        var page = self._rowsShown();
        self.setRowFirst(self._rowFirst + (ev.key === "PageUp" ? -page : page));
      } else return;
      ev.preventDefault();
    });
    this.scroller.addEventListener("scroll", function () {
      self.setRowFirst(self.scroller.scrollTop / self.options.rowHeight);
    });
    if (global.ResizeObserver) {
      new global.ResizeObserver(function () {
        if (Math.max(self.options.labelWidth + self.options.rightPad + 50, self.scroller.clientWidth) !== self.cssWidth) {
          self.resize();
        }
      }).observe(this.scroller);
    }
  };

  FlowscopeTimeline.LEVELS = LEVELS;
  FlowscopeTimeline.Texts = Texts;
  FlowscopeTimeline.OPACITIES = OPACITIES;
  global.FlowscopeTimeline = FlowscopeTimeline;
})(typeof window !== "undefined" ? window : this);
