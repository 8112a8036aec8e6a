"""The dashboard's canvas task stream (src/flowscope/ui/static/timeline.js) in Debian's chromium, loaded from a
real HTTP server on loopback: what it draws at the detail of the zoom, deltas, and task keys shown as text."""

from __future__ import annotations

import functools
import http.server
import threading

import pytest

from flowscope.ui import static_dir

PAGE = """<!doctype html><meta charset="utf-8"><title>timeline test</title>
<body style="margin:0"><div id="tl" style="width:1000px"></div>
<script src="/static/timeline.js"></script></body>"""

GROUPS = [{"name": "load", "color": "#1f77b4"}, {"name": "tiny", "color": "#2ca02c"},
          {"name": "reduce", "color": "#d62728"}, {"name": "<b>group</b>", "color": "#9467bd"}]
ROWS = ["host-a/thread-1", "host-a/thread-2", "host-b/thread-1"]
LABEL_W, ROW_H, WIDTH = 100, 20, 1000

# three rows over 10 s: a 5 s "load" then a 5 s "reduce" on row 0, 1,000 tasks of 1 ms ("tiny") spread over
# row 1, one "reduce" of 4 s on row 2, and one transfer from row 0 to row 2
TASKS = """(() => {
  const start = [0, 5], end = [5, 10], row = [0, 0], group = [0, 2], key = ["load-0", "reduce-0"];
  for (let i = 0; i < 1000; i++) { start.push(i * 0.01); end.push(i * 0.01 + 0.001); row.push(1); group.push(1);
                                   key.push("tiny-" + i); }
  start.push(6); end.push(10); row.push(2); group.push(2); key.push("reduce-1");
  return {start, end, row, group, key};
})()"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real HTTP server on 127.0.0.1 serving the test page and flowscope's ui/static folder."""
    root = tmp_path_factory.mktemp("ui")
    (root / "index.html").write_text(PAGE)
    (root / "static").symlink_to(static_dir(), target_is_directory=True)
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/index.html"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def page(server, chromium):
    """A fresh page (a context of its own) of the module's Chromium (tests/conftest.py) with the timeline drawn."""
    pg = chromium.new_page(viewport={"width": 1200, "height": 400}, device_scale_factor=1)
    try:
        pg.dialogs = []
        pg.errors = []
        pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        pg.goto(server, wait_until="load")
        pg.evaluate(f"""() => {{
            window.tl = new FlowscopeTimeline(document.getElementById('tl'),
                {{rows: {ROWS!r}, groups: {GROUPS!r}, labelWidth: {LABEL_W}, rowHeight: {ROW_H},
                  record: true}});
            tl.append({TASKS}, {{start: [1], end: [6], src: [0], dst: [2]}});
            tl.draw();
        }}""")
        yield pg
        assert pg.errors == []
    finally:
        pg.close()


def _pixel(page, x: float, y: float) -> list[int]:
    """The canvas pixel at CSS position (x, y), as [r, g, b, a]."""
    return page.evaluate(f"""() => {{
        const c = tl.canvas, r = c.width / c.clientWidth;
        return Array.from(c.getContext('2d').getImageData(Math.floor({x} * r), Math.floor({y} * r), 1, 1).data);
    }}""")


def _rgb(hex_colour: str) -> list[int]:
    return [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]


def test_whole_run_draws_wide_tasks_exactly_and_merges_subpixel_ones_per_pixel(page):
    drawn = page.evaluate("() => tl.inspect()")
    assert page.evaluate("() => tl.count") == 1003
    exact = {r["key"]: r for r in drawn["exact"]}
    # the three long tasks are drawn as they are, at their place: plot width 900 px over 10 s
    assert set(exact) == {"load-0", "reduce-0", "reduce-1"}
    px_per_s = (WIDTH - LABEL_W - page.evaluate("() => tl.options.rightPad")) / 10
    assert exact["load-0"]["x0"] == pytest.approx(LABEL_W, abs=1)
    assert exact["load-0"]["x1"] == pytest.approx(LABEL_W + 5 * px_per_s, abs=1)
    assert exact["reduce-1"]["x0"] == pytest.approx(LABEL_W + 6 * px_per_s, abs=1)
    # the 1 ms tasks are far narrower than a pixel: merged per pixel column, all 1,000 counted, none lost
    merged = drawn["merged"]
    assert merged and {m["row"] for m in merged} == {1}
    assert sum(m["tasks"] for m in merged) == 1000
    assert {m["group"] for m in merged} == {1}
    # each merged column is busy a few per cent of its pixel (1 ms in 10 ms): drawn faint, not as solid bars
    assert all(0 < m["busy"] < 0.2 for m in merged)
    # what is on the canvas is the group's colour
    y0 = exact["load-0"]["y0"] + ROW_H / 2 - 2
    assert _pixel(page, (exact["load-0"]["x0"] + exact["load-0"]["x1"]) / 2, y0)[:3] == _rgb(GROUPS[0]["color"])
    y2 = exact["reduce-1"]["y0"] + ROW_H / 2 - 2
    assert _pixel(page, exact["reduce-1"]["x1"] - 20, y2)[:3] == _rgb(GROUPS[2]["color"])
    # and the transfer is drawn as a line between the two threads
    assert drawn["transfers"] == 1


def test_zooming_in_shows_individual_tasks(page):
    page.evaluate("() => { tl.setView(0, 0.05); tl.draw(); }")
    drawn = page.evaluate("() => tl.inspect()")
    tiny = [r for r in drawn["exact"] if r["row"] == 1]
    # 0.05 s over 892 px: each 1 ms task is 18 px wide, drawn exactly, none merged (tiny-5 starts at the right edge)
    assert sorted(r["key"] for r in tiny) == [f"tiny-{i}" for i in range(5)]
    assert drawn["merged"] == []
    assert all(r["x1"] - r["x0"] == pytest.approx(18, abs=1.5) for r in tiny)
    t = tiny[2]
    assert _pixel(page, (t["x0"] + t["x1"]) / 2, t["y0"] + ROW_H / 2 - 2)[:3] == _rgb(GROUPS[1]["color"])


def test_the_wheel_zooms_around_the_pointer_and_changes_the_level_of_detail(page):
    before = page.evaluate("() => tl.inspect()")
    box = page.locator("#tl canvas").bounding_box()
    x = box["x"] + LABEL_W + 45  # 0.5 s into the run
    y = box["y"] + page.evaluate("() => tl.options.axisHeight") + 1.5 * ROW_H
    page.mouse.move(x, y)
    for _ in range(12):
        page.mouse.wheel(0, -200)
    page.wait_for_function("() => tl.view[1] - tl.view[0] < 0.5")
    page.evaluate("() => tl.draw()")
    v0, v1 = page.evaluate("() => tl.view")
    assert v0 < 0.5 < v1  # the time under the pointer stays in view
    after = page.evaluate("() => tl.inspect()")
    exact_tiny = [r for r in after["exact"] if r["row"] == 1]
    assert len([r for r in before["exact"] if r["row"] == 1]) == 0
    assert exact_tiny, "no 1 ms task is drawn on its own after zooming in"


def test_a_delta_appends_and_the_live_view_follows_it(page):
    page.evaluate("""() => {
        const start = [], end = [], row = [], group = [], key = [];
        for (let i = 0; i < 10; i++) { start.push(10 + i); end.push(10.5 + i); row.push(i % 3); group.push(0);
                                       key.push("late-" + i); }
        tl.append({start, end, row, group, key});
        tl.draw();
    }""")
    assert page.evaluate("() => tl.count") == 1013
    # the view showed the end of the run: it follows, with a tenth of the run's length as headroom past its end
    assert page.evaluate("() => tl.view") == pytest.approx([0, 19.5 * 1.1])
    exact = {r["key"]: r for r in page.evaluate("() => tl.inspect()")["exact"]}
    assert {f"late-{i}" for i in range(10)} <= set(exact)
    r = exact["late-9"]
    assert _pixel(page, (r["x0"] + r["x1"]) / 2, r["y0"] + ROW_H / 2 - 2)[:3] == _rgb(GROUPS[0]["color"])


def test_a_zoomed_view_stays_put_when_a_delta_arrives(page):
    page.evaluate("() => { tl.setView(2, 3); tl.append({start: [11], end: [12], row: [0], group: [0]}); }")
    assert page.evaluate("() => tl.view") == [2, 3]
    assert page.evaluate("() => tl.count") == 1004


def test_task_keys_with_markup_are_shown_as_text_in_the_tooltip(page):
    key = "<img src=x onerror=\"window.__xss=1;alert(1)\">"
    page.evaluate("""k => { tl.append({start: [10], end: [20], row: [2], group: [3], key: [k]});
                          tl.setView(0, 20); tl.draw(); }""", key)
    r = next(r for r in page.evaluate("() => tl.inspect()")["exact"] if r["key"] == key)
    box = page.locator("#tl canvas").bounding_box()
    page.mouse.move(box["x"] + (r["x0"] + r["x1"]) / 2, box["y"] + r["y0"] + 2)
    tip = page.locator("#tl .flowscope-tooltip")
    tip.wait_for(state="visible")
    assert key in tip.inner_text()
    assert "<b>group</b>" in tip.inner_text()  # the group name, also user text, as text too
    assert tip.locator("img, b").count() == 0
    page.wait_for_timeout(200)
    assert page.evaluate("() => window.__xss") is None
    assert page.dialogs == []


def test_the_tooltip_of_a_merged_column_says_how_many_tasks_it_holds(page):
    merged = page.evaluate("() => tl.inspect()")["merged"]
    m = max(merged, key=lambda m: m["tasks"])
    box = page.locator("#tl canvas").bounding_box()
    page.mouse.move(box["x"] + m["x0"] + 0.5, box["y"] + m["y0"] + 2)
    tip = page.locator("#tl .flowscope-tooltip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    assert f"{m['tasks']} tasks" in text and "tiny" in text


def test_bad_input_is_refused_naming_the_field_and_keeps_what_was_there(page):
    err = page.evaluate("""() => { try { tl.append({start: [1, 2], end: [2], row: [0, 0], group: [0, 0]}); }
                                   catch (e) { return e.message; } }""")
    assert "end" in err and "2" in err and "1" in err
    err = page.evaluate("""() => { try { tl.append({start: [1], end: [2], row: [7], group: [0]}); }
                                   catch (e) { return e.message; } }""")
    assert "row" in err and "7" in err
    err = page.evaluate("""() => { try { tl.append({start: [3], end: [2], row: [0], group: [0]}); }
                                   catch (e) { return e.message; } }""")
    assert "end" in err and "index 0" in err
    assert page.evaluate("() => tl.count") == 1003


def test_transfers_too_many_for_lines_become_marks_on_the_receiving_thread(page):
    # 40 transfers into row 2 within 0.3 .. 5.5 s, more than the 10 lines allowed: marks on row 2 at the whole run
    page.evaluate("""() => {
        tl.options.maxTransferLines = 10;
        const start = [], end = [], src = [], dst = [];
        for (let i = 0; i < 40; i++) { start.push(0.3 + i * 0.13); end.push(0.35 + i * 0.13); src.push(0); dst.push(2); }
        tl.append({start: [], end: [], row: [], group: []}, {start, end, src, dst});
        tl.draw();
    }""")
    drawn = page.evaluate("() => tl.inspect()")
    assert drawn["transfers"] == 0
    assert drawn["transfer_marks"] == 41  # the first transfer (1 .. 6 s) is in view too
    mark = next(m for m in drawn["marks"] if m["row"] == 2 and m["x0"] < 140)
    assert _pixel(page, mark["x0"], mark["y1"] - 1)[:3] == _rgb("#d62728")
    # zoomed in until at most 10 are in view: lines between the threads again
    page.evaluate("() => { tl.setView(0.3, 1.0); tl.draw(); }")
    drawn = page.evaluate("() => tl.inspect()")
    assert 0 < drawn["transfers"] <= 10 and drawn["transfer_marks"] == 0


def test_a_worker_that_joins_late_gets_its_rows(page):
    assert page.evaluate("() => tl.addRows(['host-c/thread-1', '<i>host-c</i>/thread-2'])") == 5
    page.evaluate("() => { tl.append({start: [1], end: [9], row: [4], group: [0], key: ['late-worker']}); tl.draw(); }")
    r = next(r for r in page.evaluate("() => tl.inspect()")["exact"] if r["key"] == "late-worker")
    assert r["row"] == 4
    assert page.evaluate("() => tl.canvas.clientHeight") >= r["y1"]
    assert _pixel(page, (r["x0"] + r["x1"]) / 2, r["y0"] + ROW_H / 2 - 2)[:3] == _rgb(GROUPS[0]["color"])
    box = page.locator("#tl canvas").bounding_box()
    page.mouse.move(box["x"] + (r["x0"] + r["x1"]) / 2, box["y"] + r["y0"] + 2)
    tip = page.locator("#tl .flowscope-tooltip")
    tip.wait_for(state="visible")
    assert "<i>host-c</i>/thread-2" in tip.inner_text() and tip.locator("i").count() == 0


def test_a_group_added_later_draws_in_its_colour_and_a_renamed_row_keeps_text_only(page):
    late = "late<img src=x onerror=\"window.__xss=2\">"
    page.evaluate("""g => { tl.addGroups([{name: g, color: "#17becf"}]);
                          tl.setRowLabel(2, "renamed <b>row</b>");
                          tl.append({start: [2], end: [4], row: [2], group: [4], key: ["late-0"]});
                          tl.setView(0, 10); tl.draw(); }""", late)
    r = next(r for r in page.evaluate("() => tl.inspect()")["exact"] if r["key"] == "late-0")
    assert r["group"] == 4 and r["row"] == 2
    assert _pixel(page, (r["x0"] + r["x1"]) / 2, r["y0"] + ROW_H / 2 - 2)[:3] == _rgb("#17becf")
    box = page.locator("#tl canvas").bounding_box()
    page.mouse.move(box["x"] + (r["x0"] + r["x1"]) / 2, box["y"] + r["y0"] + 2)
    tip = page.locator("#tl .flowscope-tooltip")
    tip.wait_for(state="visible")
    assert late in tip.inner_text() and "renamed <b>row</b>" in tip.inner_text()
    assert tip.locator("img, b").count() == 0
    # a refused group (a colour not #rrggbb) or row changes nothing
    with pytest.raises(Exception, match="not of the form"):
        page.evaluate("() => tl.addGroups([{name: 'x', color: 'red'}])")
    with pytest.raises(Exception, match="setRowLabel"):
        page.evaluate("() => tl.setRowLabel(3, 'no such row')")
    assert page.evaluate("() => [tl.groups.length, tl.rowLabels.length]") == [5, 3]
    assert page.evaluate("() => window.__xss") is None
    assert page.dialogs == []


# the page's clock, frame and timer functions replaced by counting ones (nothing waits): performance.now() advances
# by __clock.step at each call; frames and timers asked for are noted in __clock.frames and __clock.timers (ms)
COUNTING_CLOCK = """(step) => {
    const c = window.__clock = {now: 1000, step, frames: [], timers: []};
    performance.now = () => (c.now += c.step);
    window.requestAnimationFrame = (f) => c.frames.push(f);
    window.cancelAnimationFrame = () => {};
    window.setTimeout = (f, ms) => c.timers.push(ms);
    window.clearTimeout = () => {};
}"""


def test_new_data_is_drawn_within_the_draw_share_of_the_page_and_a_users_zoom_at_once(page):
    """A draw that took d ms is followed, for new data, by the next no sooner than d / drawShare ms after it
    began (a timer, not the next frame); a zoom is drawn at the next frame whatever the last draw cost. The
    page's clock and its frame and timer functions are replaced by counting ones: nothing here waits."""
    page.evaluate(COUNTING_CLOCK, 20)
    got = page.evaluate("""() => {
        const c = window.__clock, frames = c.frames, timers = c.timers;
        tl.draw();  // took 20 ms on this clock
        const d = {start: [10.5], end: [10.6], row: [0], group: [1], key: ["late-0"]};
        tl.append(d);
        const afterData = {frames: frames.length, timers: timers.slice()};
        tl.setView(0, 5);
        const afterZoom = frames.length;
        c.step = 0; c.now += 10000;  // long after the last draw began
        frames.length = 0; timers.length = 0; tl._pending = 0;
        tl.append({start: [10.7], end: [10.8], row: [0], group: [1], key: ["late-1"]});
        return {afterData, afterZoom, later: {frames: frames.length, timers: timers.length},
                share: tl.options.drawShare, lastDrawMs: tl.lastDrawMs};
    }""")
    assert got["lastDrawMs"] == 20 and 0 < got["share"] < 1
    assert got["afterData"]["frames"] == 0 and len(got["afterData"]["timers"]) == 1
    assert 0 < got["afterData"]["timers"][0] <= 20 / got["share"]
    assert got["afterZoom"] == 1  # the zoom: the next frame
    assert got["later"] == {"frames": 1, "timers": 0}



def test_new_data_waits_no_longer_than_max_data_wait_however_slow_the_last_draw(page):
    """The draw share spaces redraws for new data by ten times the last draw, but never by more than
    options.maxDataWaitMs: after a draw of 100 ms (a full one over a large run, or pages sharing a busy machine)
    the next comes 250 ms after it began, not a second. Counting clock, frames and timers, as above."""
    page.evaluate(COUNTING_CLOCK, 100)
    got = page.evaluate("""() => {
        const c = window.__clock, frames = c.frames, timers = c.timers;
        tl.draw();  // took 100 ms on this clock
        c.step = 0;
        tl.append({start: [10.5], end: [10.6], row: [0], group: [1], key: ["late-0"]});
        return {frames: frames.length, timers, lastDrawMs: tl.lastDrawMs, cap: tl.options.maxDataWaitMs,
                share: tl.options.drawShare};
    }""")
    assert got["lastDrawMs"] == 100 and got["lastDrawMs"] / got["share"] > got["cap"] > 0
    assert got["frames"] == 0 and len(got["timers"]) == 1
    assert 0 < got["timers"][0] <= got["cap"] - got["lastDrawMs"] + 1  # counted from when the draw began


def test_rows_groups_and_labels_from_deltas_are_drawn_at_the_datas_pace_and_resize_the_canvas_once(page):
    """A live run's workers join one delta after another: their rows (which change every row's height, so the next
    draw is a full one), their groups and their labels are new data like their tasks, drawn within the draw share,
    and the rows added between two draws size the canvas once, at that draw. The page's clock and its frame and
    timer functions are replaced by counting ones, and the canvas's size is counted where it is set."""
    page.evaluate(COUNTING_CLOCK, 20)
    got = page.evaluate("""() => {
        const c = window.__clock, frames = c.frames, timers = c.timers;
        const sized = [];
        for (const dim of ["width", "height"]) {
            const d = Object.getOwnPropertyDescriptor(HTMLCanvasElement.prototype, dim);
            Object.defineProperty(tl.canvas, dim, {get() { return d.get.call(this); },
                                                   set(v) { sized.push(dim); d.set.call(this, v); }});
        }
        tl.draw();  // took 20 ms on this clock
        c.step = 0;
        tl.addRows(["host-c/thread-1", "host-c/thread-2"]);
        tl.addGroups([{name: "late", color: "#17becf"}]);
        tl.setRowLabel(0, "host-a/thread-1 (renamed)");
        tl.addRows(["host-d/thread-1"]);
        tl.append({start: [1], end: [9], row: [5], group: [4], key: ["late-worker"]});
        const before = {frames: frames.length, timers: timers.slice(), sized: sized.length,
                        height: tl.canvas.height};
        tl.draw();
        const row = tl.inspect().exact.find(r => r.key === "late-worker");
        return {before, sized: sized.slice(), height: tl.canvas.height, cssHeight: tl.canvas.clientHeight,
                row, rowHeight: tl.options.rowHeight, axis: tl.options.axisHeight, share: tl.options.drawShare};
    }""")
    assert got["before"]["frames"] == 0, got  # nothing drawn at the next frame: a timer, at the data's pace
    assert got["before"]["timers"] and max(got["before"]["timers"]) <= 20 / got["share"]
    assert got["before"]["sized"] == 0 and got["before"]["height"] == 22 + 3 * ROW_H + 2
    assert got["sized"] == ["height"]  # once, at the draw; the width did not change and was not set again
    assert got["height"] == got["cssHeight"] == got["axis"] + 6 * got["rowHeight"] + 2
    assert got["row"]["row"] == 5 and got["row"]["y1"] <= got["cssHeight"]

@pytest.mark.parametrize(("transfers", "mark"), [(0, False), (50, False), (5000, False), (50, True)],
                         ids=["no-transfers", "transfer-lines", "transfer-marks", "a-marked-task"])
def test_a_followed_run_draws_only_what_a_delta_changed_and_the_pixels_equal_a_full_draw(server, chromium, transfers,
                                                                                         mark):
    """Following a live run, a delta redraws only the pixel columns from its earliest task on (the view keeps
    headroom, so its scale stays put between rescales): after each of 40 deltas of tasks and transfers, some out
    of order, sub-pixel and wide, over 12 rows, the canvas holds exactly what a full draw of the same view
    draws; also with a task outlined (``mark``, a ``?task=`` link)."""
    pg = chromium.new_page(viewport={"width": 1200, "height": 600}, device_scale_factor=1)
    try:
        pg.goto(server, wait_until="load")
        got = pg.evaluate("""([nx, mark]) => {
            let seed = 7;
            const rnd = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
            const rows = Array.from({length: 12}, (_, i) => "row-" + i);
            const groups = [{name: "a", color: "#1f77b4"}, {name: "b", color: "#ff7f0e"}, {name: "c", color: "#2ca02c"}];
            const tl = new FlowscopeTimeline(document.getElementById("tl"), {rows, groups, rowHeight: 12});
            const kinds = {}, mismatches = [];
            let t = 0;
            for (let d = 0; d < 40; d++) {
                const task = {start: [], end: [], row: [], group: [], key: []}, x = {start: [], end: [], src: [], dst: []};
                for (let i = 0; i < 400; i++) {
                    const s = Math.max(0, t - rnd() * 2) + rnd() * 0.5, dur = rnd() < 0.9 ? rnd() * 0.01 : rnd() * 3;
                    task.start.push(s); task.end.push(s + dur); task.row.push(Math.floor(rnd() * 12));
                    task.group.push(Math.floor(rnd() * 3)); task.key.push("k" + d + "-" + i);
                }
                for (let i = 0; i < nx / 40; i++) {
                    const s = Math.max(0, t - rnd()) + rnd() * 0.5;
                    x.start.push(s); x.end.push(s + rnd() * 0.2); x.src.push(Math.floor(rnd() * 12)); x.dst.push(Math.floor(rnd() * 12));
                }
                t += 0.5;
                tl.append(task, x);
                if (mark && d === 0) { tl.mark("k0-7"); tl.draw(); continue; }
                tl.draw(true);  // as the page's next frame draws it
                kinds[tl.lastDrawKind] = (kinds[tl.lastDrawKind] || 0) + 1;
                const ctx = tl.canvas.getContext("2d");
                const seen = ctx.getImageData(0, 0, tl.canvas.width, tl.canvas.height).data.slice();
                tl.draw();  // a draw asked for from outside: all of it
                if (tl.lastDrawKind !== "full") return {error: "the forced draw was " + tl.lastDrawKind};
                const full = ctx.getImageData(0, 0, tl.canvas.width, tl.canvas.height).data;
                let diff = 0;
                for (let i = 0; i < full.length; i++) if (full[i] !== seen[i]) diff++;
                if (diff) mismatches.push([d, diff]);
            }
            return {kinds, mismatches, count: tl.count, view: tl.view, extent: tl.extent, marked: tl.marked};
        }""", [transfers, mark])
        assert "error" not in got, got
        assert got["count"] == 40 * 400
        assert got["mismatches"] == []
        assert got["kinds"].get("incremental", 0) >= 20, got["kinds"]  # most deltas fell within the headroom
        assert got["view"][0] == got["extent"][0] and got["view"][1] >= got["extent"][1]
        assert (got["marked"] or {}).get("key") == ("k0-7" if mark else None)
    finally:
        pg.close()


def test_a_young_run_that_outgrows_its_headroom_at_every_draw_gets_more_then_a_tenth_again(server, chromium):
    """A run followed live from its first second grows by a large share of its own length between draws: with a
    fixed tenth of headroom almost every draw would rescale the view and redraw all of it. A run that outgrows its
    headroom within a few draws of the last rescale gets twice as much (never more than its own length); one that
    stayed inside it for many draws gets half, down to a tenth again."""
    pg = chromium.new_page(viewport={"width": 1200, "height": 400}, device_scale_factor=1)
    try:
        pg.goto(server, wait_until="load")
        got = pg.evaluate("""() => {
            const tl = new FlowscopeTimeline(document.getElementById("tl"),
                {rows: ["a", "b"], groups: [{name: "g", color: "#1f77b4"}], rowHeight: 12});
            let t = 1, k = 0, widest = 0;
            const step = (grow) => {
                tl.append({start: [t - grow, t - grow / 2], end: [t, t], row: [0, 1], group: [0, 0], key: ["k" + k++, "k" + k++]});
                tl.draw(true);  // as the page's next frame draws it
                t += grow;
                const v = tl.view, len = tl.extent[1] - tl.extent[0];
                widest = Math.max(widest, (v[1] - v[0]) / len);
                return tl.lastDrawKind;
            };
            tl.append({start: [0], end: [1], row: [0], group: [0], key: ["first"]});
            tl.draw();
            const young = {full: 0, incremental: 0}, old = {full: 0, incremental: 0};
            for (let i = 0; i < 70; i++) young[step(0.1)]++;   // 1 s -> 8 s of run
            for (let i = 0; i < 400; i++) old[step(0.1)]++;    // 8 s -> 48 s
            const v = tl.view, len = tl.extent[1] - tl.extent[0];
            return {young, old, widest, last: (v[1] - v[0]) / len};
        }""")
        # a tenth of headroom would rescale at every tenth of growth: about 22 full draws from 1 s to 8 s
        assert got["young"]["full"] <= 8, got  # one full draw in about RESCALE_DRAWS (10)
        assert got["widest"] <= 2.0 + 1e-9, got  # never more headroom than the run's own length
        assert got["last"] <= 1.1 + 1e-9, got    # back to a tenth once the run grows slowly against its length
    finally:
        pg.close()


def test_rows_added_later_are_fitted_into_the_streams_height_as_the_first_ones_were(server, chromium):
    """With no row height given, the rows share options.maxHeight (4 to 24 px each): a stream that began with
    four threads and grew to eighty keeps to that height instead of growing twenty times taller."""
    pg = chromium.new_page(viewport={"width": 1200, "height": 400}, device_scale_factor=1)
    try:
        pg.goto(server, wait_until="load")
        got = pg.evaluate("""() => {
            const tl = new FlowscopeTimeline(document.getElementById("tl"),
                {rows: ["t0", "t1", "t2", "t3"], groups: [{name: "g", color: "#1f77b4"}], maxHeight: 480, record: true});
            const before = tl.options.rowHeight;
            tl.addRows(Array.from({length: 76}, (_, i) => "t" + (i + 4)));
            tl.append({start: [0, 0], end: [10, 10], row: [0, 79], group: [0, 0], key: ["top", "bottom"]});
            tl.draw();
            const exact = tl.inspect().exact;
            return {before, after: tl.options.rowHeight, height: tl.canvas.clientHeight, axis: tl.options.axisHeight,
                    bottom: exact.find(r => r.key === "bottom")};
        }""")
        assert got["before"] == 24
        assert got["after"] == 6  # 480 px / 80 rows
        assert got["height"] <= 480 + got["axis"] + 2
        assert got["bottom"]["y0"] >= got["axis"] + 79 * 6 and got["bottom"]["y1"] <= got["axis"] + 80 * 6
        # a row height given by the caller is kept
        kept = pg.evaluate("""() => {
            const tl = new FlowscopeTimeline(document.getElementById("tl"),
                {rows: ["t0"], groups: [{name: "g", color: "#1f77b4"}], rowHeight: 20});
            tl.addRows(Array.from({length: 79}, (_, i) => "t" + (i + 1)));
            return tl.options.rowHeight;
        }""")
        assert kept == 20
    finally:
        pg.close()


def test_a_group_first_seen_in_a_delta_keeps_the_next_draw_partial_and_its_pixels_right(server, chromium):
    """A live run's groups arrive as its stages start: a new group adds a colour without changing the others', so
    the draw after it still redraws only what the delta reached, and the canvas equals a full draw's."""
    pg = chromium.new_page(viewport={"width": 1200, "height": 400}, device_scale_factor=1)
    try:
        pg.goto(server, wait_until="load")
        got = pg.evaluate("""() => {
            const tl = new FlowscopeTimeline(document.getElementById("tl"),
                {rows: ["a", "b", "c"], groups: [{name: "g0", color: "#1f77b4"}], rowHeight: 12});
            tl.append({start: [0, 0.5, 1], end: [9, 10, 9.5], row: [0, 1, 2], group: [0, 0, 0], key: ["x", "y", "z"]});
            tl.draw();
            tl.append({start: [9.5], end: [10.5], row: [0], group: [0], key: ["w"]});  // the view gets its headroom
            tl.draw(true);
            const kinds = [];
            for (let g = 1; g <= 5; g++) {
                tl.addGroups([{name: "g" + g, color: ["#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"][g - 1]}]);
                const s = 10 + g * 0.1;
                tl.append({start: [s, s], end: [s + 0.05, s + 0.002], row: [g % 3, (g + 1) % 3], group: [g, g],
                           key: ["n" + g, "m" + g]});
                tl.draw(true);
                kinds.push(tl.lastDrawKind);
            }
            const ctx = tl.canvas.getContext("2d");
            const seen = ctx.getImageData(0, 0, tl.canvas.width, tl.canvas.height).data.slice();
            tl.draw();
            const full = ctx.getImageData(0, 0, tl.canvas.width, tl.canvas.height).data;
            let diff = 0;
            for (let i = 0; i < full.length; i++) if (full[i] !== seen[i]) diff++;
            return {kinds, diff};
        }""")
        assert got["kinds"] == ["incremental"] * 5, got
        assert got["diff"] == 0
    finally:
        pg.close()


def test_more_rows_than_the_height_holds_are_paged_and_only_the_rows_in_view_are_drawn(server, chromium):
    """A run of 1,000 threads (an MPI job's ranks, a cluster of 20 hosts) does not make the stream a canvas
    thousands of pixels tall: the rows keep the smallest height and the stream shows as many as options.maxHeight
    holds, paged by its scroll bar and the keys (arrow up / down a row, page up / down a page); only the rows in
    view are drawn, and the pointer names the row it is over."""
    pg = chromium.new_page(viewport={"width": 1200, "height": 800}, device_scale_factor=1)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        pg.goto(server, wait_until="load")
        got = pg.evaluate("""() => {
            const R = 1000, rows = Array.from({length: R}, (_, i) => "rank-" + i);
            const start = [], end = [], row = [], group = [], key = [];
            for (let r = 0; r < R; r++) { start.push(r * 0.001); end.push(5 + r * 0.001); row.push(r); group.push(0);
                                          key.push("task-" + r); }
            window.tl = new FlowscopeTimeline(document.getElementById("tl"),
                {rows, groups: [{name: "g", color: "#1f77b4"}], maxHeight: 400, record: true});
            tl.append({start, end, row, group, key});
            tl.draw();
            const first = tl.inspect();
            return {rh: tl.options.rowHeight, height: tl.canvas.clientHeight, axis: tl.options.axisHeight,
                    window: tl.rowWindow, drawn: first.exact.map(b => b.row)};
        }""")
        assert got["rh"] == 4
        assert got["height"] <= 400 + got["axis"] + 2
        assert got["window"] == [0, 100]  # 400 px of 4 px rows
        assert got["drawn"] == list(range(100))
        # the keys page the rows
        pg.locator("#tl").focus()
        pg.keyboard.press("PageDown")
        pg.keyboard.press("ArrowDown")
        pg.keyboard.press("ArrowDown")
        after = pg.evaluate("() => { tl.draw(); return {window: tl.rowWindow, rows: tl.inspect().exact.map(b => b.row),"
                            " y: tl.inspect().exact[0].y0}; }")
        assert after["window"] == [102, 202]
        assert after["rows"] == list(range(102, 202))
        assert after["y"] >= got["axis"] and after["y"] < got["axis"] + got["rh"]  # the first row in view on top
        pg.keyboard.press("PageUp")
        pg.keyboard.press("PageUp")  # not before the first row
        assert pg.evaluate("() => tl.rowWindow") == [0, 100]
        for _ in range(12):  # not past the last row
            pg.keyboard.press("PageDown")
        assert pg.evaluate("() => tl.rowWindow") == [900, 1000]
        # the scroll bar pages them too, and the pointer's tooltip names the row under it
        pg.evaluate("() => { tl.scroller.scrollTop = 500 * tl.options.rowHeight; }")
        pg.wait_for_function("() => tl.rowWindow[0] === 500", timeout=5000)
        box = pg.locator("#tl canvas").bounding_box()
        pg.mouse.move(box["x"] + 600, box["y"] + got["axis"] + 10 * got["rh"] + 2)
        tip = pg.locator(".flowscope-tooltip").inner_text()
        assert "task-510" in tip and "rank-510" in tip
        # a task asked for by its key brings its row into view
        pg.evaluate("() => { const t = tl.find('task-7'); tl.showRow(t.row); }")
        lo, hi = pg.evaluate("() => tl.rowWindow")
        assert lo <= 7 < hi
        assert errors == []
    finally:
        pg.close()


def test_a_marked_task_is_outlined_wherever_its_row_and_time_are_in_view(server, chromium):
    """``mark(key)`` outlines a task (the one a ``?task=`` link opened): the outline is drawn around its bar while
    it is in view, follows it when the rows are paged, and goes with ``mark(null)``."""
    pg = chromium.new_page(viewport={"width": 1200, "height": 800}, device_scale_factor=1)
    try:
        pg.goto(server, wait_until="load")
        got = pg.evaluate("""() => {
            const R = 300, rows = Array.from({length: R}, (_, i) => "t" + i);
            const start = [], end = [], row = [], group = [], key = [];
            for (let r = 0; r < R; r++) { start.push(1); end.push(2); row.push(r); group.push(0); key.push("k" + r); }
            window.tl = new FlowscopeTimeline(document.getElementById("tl"),
                {rows, groups: [{name: "g", color: "#1f77b4"}], maxHeight: 400, record: true});
            tl.append({start, end, row, group, key});
            const out = {unknown: tl.mark("no-such-key")};
            out.known = tl.mark("k250");
            tl.draw();
            out.hidden = tl.inspect().marked;   // row 250 is not in the first page
            tl.showRow(250);
            tl.draw();
            out.shown = tl.inspect().marked;
            out.bar = tl.inspect().exact.find(b => b.key === "k250");
            tl.mark(null);
            tl.draw();
            out.cleared = tl.inspect().marked;
            return out;
        }""")
        assert got["unknown"] is False and got["known"] is True
        assert got["hidden"] is None
        m, bar = got["shown"], got["bar"]
        assert m["x0"] <= bar["x0"] and m["x1"] >= bar["x1"] and m["y0"] <= bar["y0"] and m["y1"] >= bar["y1"]
        assert got["cleared"] is None
    finally:
        pg.close()
