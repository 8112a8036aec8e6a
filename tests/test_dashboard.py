"""The live dashboard in Debian's chromium, against a real `flowscope serve` fed by a real Dask LocalCluster: the runs
list, the run overview following the workflow as it runs (the workflow is held on a file this test creates, so
what the page must show is set by the workflow's progress, never by waiting), a page that reconnects or reloads
catching up, task keys with markup shown as text, the token, and `flowscope ui` over a store read-only."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import require_module

from flowscope.service.frames import read_message

#: a bound on waits for the workflow's records to reach the page (a busy machine is slow; this is no timing test)
WAIT_MS = 180_000
#: a viewport tall enough for every chart of the overview: a chart out of view is drawn only once scrolled to
WHOLE_PAGE = {"width": 1300, "height": 3200}

#: set to a PNG path to take the screenshot of the overview in docs/ (docs/img/dashboard-overview.png)
SCREENSHOT_ENV = "FLOWSCOPE_DASHBOARD_SCREENSHOT"
# markup in task keys, hence in their groups (Dask's key_split keeps it when the key starts with a word)
IMG = "img<img src=x onerror=window.pwned=1>"
SCRIPT = "script<script>window.pwned=2</script>"
RUN_NAME = "dash <b>bold</b> " + SCRIPT


def quick(i):
    time.sleep(0.05)
    return i


def gated(i, gate):
    while not os.path.exists(gate):
        time.sleep(0.02)
    return i


@pytest.fixture
def browser(chromium):
    """The module's Chromium (tests/conftest.py); the contexts a test opens are closed when it ends."""
    return chromium


def _page(context):
    pg = context.new_page()
    pg.dialogs, pg.errors, pg.outside = [], [], []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    # every asset is served by flowscope: a request anywhere but the collector is recorded
    pg.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))
          else pg.outside.append(r.url))
    return pg


def _summary(pg) -> dict:
    return pg.evaluate("() => flowscopeLive.summary()")


def _wait(pg, condition: str) -> dict:
    """Wait until ``condition`` (a JS expression over ``s``, the page's summary) holds; returns the summary."""
    pg.wait_for_function(f"() => {{ const s = window.flowscopeLive && flowscopeLive.summary(); return s && ({condition}); }}",
                         timeout=WAIT_MS, polling=100)
    return _summary(pg)


def _shows_done(pg, n: int) -> None:
    """The page's plain-HTML facts show ``n`` tasks done (drawn on the next animation frame)."""
    pg.wait_for_function(f"() => document.getElementById('tasks-done').textContent === '{n:,}'", timeout=WAIT_MS)


def _shows_name(pg, name: str) -> None:
    pg.wait_for_function("n => document.getElementById('run-name').textContent === n", arg=name, timeout=WAIT_MS)


def _no_markup_ran(pg) -> None:
    assert pg.evaluate("() => window.pwned") is None
    assert pg.dialogs == []
    # no element was made of the markup: no image, no <b> around 'bold', no script beyond the page's own
    assert pg.evaluate("() => document.querySelectorAll('img').length") == 0
    assert pg.evaluate("() => Array.from(document.querySelectorAll('b')).filter(b => b.textContent === 'bold').length") == 0
    assert pg.evaluate("() => Array.from(document.scripts).every(s => !s.textContent.includes('pwned'))")


def test_overview_follows_a_live_dask_workflow_and_a_reconnecting_page_catches_up(collector, browser, tmp_path):
    from dask import delayed
    from distributed import Client, LocalCluster

    import flowscope
    from flowscope.sources import semantics
    from flowscope.sources.dask import register, unregister
    from flowscope.store.run import Run

    gate = str(tmp_path / "gate")
    n_quick, n_gated = 8, 6
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        fs = flowscope.Client(collector.address, name=RUN_NAME,
                              meta={"capture_level": "standard", "semantics": [semantics.DASK_DISTRIBUTED]})
        register(client, fs.address, fs.run_id)
        context = browser.new_context(viewport=WHOLE_PAGE)
        try:
            # a page open before any task ran: every row of its stream comes in a delta
            early = _page(context)
            early.goto(f"{collector.address}/ui/runs/{fs.run_id}", wait_until="load")
            early.wait_for_function("() => flowscopeLive.snapshots === 1", timeout=WAIT_MS)
            # phase 1: quick tasks whose keys carry markup
            futures = client.compute([delayed(quick, pure=True)(i, dask_key_name=f"{IMG}-{i}") for i in range(n_quick)])
            assert client.gather(futures) == list(range(n_quick))

            runs = _page(context)
            runs.goto(f"{collector.address}/ui/", wait_until="load")
            runs.wait_for_function(f"() => flowscopeRuns.runs.some(r => r.run_id === {fs.run_id!r})", timeout=WAIT_MS)
            row = runs.locator(f"tr[data-run='{fs.run_id}']")
            assert row.locator("td.name").inner_text() == RUN_NAME  # the name as text, markup and all
            assert row.locator(".status").inner_text() == "running"

            row.locator("a").click()
            runs.wait_for_url(f"**/ui/runs/{fs.run_id}")
            page = runs
            first = _wait(page, f"s.done >= {n_quick} && s.stream >= {n_quick}")
            assert first["total"] == n_quick and first["done"] == n_quick and first["stream"] == n_quick
            _shows_done(page, n_quick)  # the plain-HTML progress says so too
            assert page.locator(f"#progress tr[data-group='{IMG}'] td").first.inner_text() == IMG

            # a second page that will miss what happens next
            other = _page(context)
            other.goto(f"{collector.address}/ui/runs/{fs.run_id}", wait_until="load")
            _wait(other, f"s.done >= {n_quick} && s.stream >= {n_quick}")
            other.evaluate("() => flowscopeLive.pause()")
            missed_from = _summary(other)

            # phase 2: tasks held until this test creates the gate file: the page sees them known, not done
            held = client.compute([delayed(gated, pure=True)(i, gate, dask_key_name=f"{SCRIPT}-{i}")
                                   for i in range(n_gated)])
            mid = _wait(page, f"s.total >= {n_quick + n_gated} && s.running >= 1")
            assert mid["done"] == n_quick  # none of the held tasks can have finished
            assert mid["states"].get("processing", 0) >= 1
            if os.environ.get(SCREENSHOT_ENV):  # the docs' picture of a run while it runs
                page.wait_for_function("() => { const d = document.getElementById('hosts'); return d.data && "
                                       "d.data.length >= 2; }", timeout=WAIT_MS)
                page.set_viewport_size({"width": 1300, "height": 1100})  # the page's own height, not the viewport's
                page.screenshot(path=os.environ[SCREENSHOT_ENV], full_page=True)
                page.set_viewport_size(WHOLE_PAGE)

            Path(gate).touch()
            assert client.gather(held) == list(range(n_gated))
            n = n_quick + n_gated
            last = _wait(page, f"s.done >= {n} && s.stream >= {n}")
            assert last["done"] == n and last["total"] == n and last["stream"] == n
            assert last["done"] > mid["done"] > 0 and last["stream"] > first["stream"]
            assert last["seq"] > mid["seq"] > first["seq"]
            _shows_done(page, n)

            # the paused page reconnects with the last number it applied and gets only what it missed
            other.evaluate("() => flowscopeLive.resume()")
            caught = _wait(other, f"s.done >= {n} && s.stream >= {n}")
            assert caught["done"] == n and caught["total"] == n and caught["stream"] == n
            assert caught["seq"] > missed_from["seq"]
            assert other.evaluate("() => [flowscopeLive.snapshots, flowscopeLive.lastCatchUp, flowscopeLive.connects]") \
                == [1, "deltas", 2]

            # CPU and memory per host, drawn with the plotly.js flowscope serves
            page.wait_for_function("() => { const d = document.getElementById('hosts'); return d.data && "
                                   "d.data.length >= 2 && d.data.every(t => t.x.length >= 1); }", timeout=WAIT_MS)
        finally:
            unregister(client)
            fs.close()

        # finished: the same page, reloaded, shows the same counts from a fresh snapshot
        run = Run(Path(collector.store) / fs.run_id)
        spans = int(run.sql("SELECT count(*) AS n FROM activity WHERE role = 'task'")["n"].iloc[0])
        assert spans == n
        page.reload(wait_until="load")
        again = _wait(page, f"s.status === 'finished' && s.stream >= {n}")
        assert (again["done"], again["total"], again["stream"]) == (n, n, n)
        assert page.evaluate("() => flowscopeLive.snapshots") == 1
        assert page.locator(f"#progress tr[data-group='{SCRIPT}'] td").first.inner_text() == SCRIPT
        _shows_name(page, RUN_NAME)
        # every task's key as the run recorded it, markup and all: from a snapshot (page, reloaded) and from deltas
        # that came as one catch-up message (other); both binary messages (service/frames.py)
        keys = sorted(run.sql("SELECT task_key FROM activity WHERE role = 'task'")["task_key"])
        # each row names its resource (what ?resource= finds), alike whether it came in a snapshot or a delta
        ids = sorted(run.sql("SELECT DISTINCT resource_id FROM activity WHERE role = 'task'")["resource_id"])
        assert sorted(page.evaluate("() => flowscopeLive.state.rowIds")) == ids
        assert early.evaluate("() => [flowscopeLive.snapshots, flowscopeLive.state.rowIds]") == \
            [1, page.evaluate("() => flowscopeLive.state.rowIds")]
        assert early.evaluate("() => flowscopeLive.state.rows") == page.evaluate("() => flowscopeLive.state.rows")
        for pg in (page, other):
            assert sorted(pg.evaluate(STREAM_KEYS)) == keys
            _no_markup_ran(pg)
            assert pg.errors == [] and pg.outside == []
            assert pg.evaluate("() => flowscopeLive.errors") == []
        context.close()


STREAM_KEYS = "() => { const t = flowscopeLive.timeline; return Array.from({length: t.count}, (_, i) => t.keyAt(i)); }"

# a message the collector wrote, handed to the page's reader: every delta's columns as the page will use them
READ_FRAME = """(b64) => {
  const bin = atob(b64), buf = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) buf[i] = bin.charCodeAt(i);
  const m = flowscopeLive.readMessage(buf.buffer), col = (c) => c && Array.from({length: c.length},
    (_, i) => typeof c.get === "function" ? c.get(i) : c[i]);
  return m.deltas.map(d => ({seq: d.seq, binary: d.binary === undefined,
    tasks: d.tasks ? Object.fromEntries(Object.entries(d.tasks).map(([k, c]) => [k, col(c)])) : null,
    transfers: d.transfers ? Object.fromEntries(Object.entries(d.transfers).map(([k, c]) => [k, col(c)])) : null}));
}"""


def test_a_page_reads_the_collectors_binary_messages_exactly(collector, browser):
    """The page's reader (live.js) and the collector's writer (service/frames.py) agree: float64 times to the
    bit, int32 rows, keys in any script with markup, empty for a null, several deltas in one message; the stream
    finds a task by a key that came so; a cut message is refused, not half applied."""
    import base64

    import numpy as np
    import pyarrow as pa

    from flowscope.service.frames import encode_item, message

    run_id = _open_run(collector.address, {}, "frames")
    keys = [IMG, "ключ-λ-🙂", None, "", SCRIPT + "-0"]
    tasks = {"start": np.array([0.1, 1 / 3, 2.5, 1e-9, 7.0]), "end": np.array([0.2, 0.5, 3.0, 1e-6, 9.25]),
             "row": np.array([0, 1, 1, 0, 1], np.int32), "group": np.array([0, 0, 1, 1, 0], np.int32),
             "key": pa.array(keys, pa.string())}
    transfers = {"start": np.array([0.15]), "end": np.array([0.3]), "src": np.array([0], np.int32),
                 "dst": np.array([1], np.int32)}
    frame = message('"type":"deltas","epoch":"e"', [encode_item({"seq": 1, "tasks": tasks}), encode_item({"seq": 2}),
                                                    encode_item({"seq": 3, "transfers": transfers, "tasks": tasks})],
                    "deltas")
    assert isinstance(frame, bytes)
    context = browser.new_context()
    pg = _page(context)
    pg.goto(f"{collector.address}/ui/runs/{run_id}", wait_until="load")
    _wait(pg, "s.seq !== null")
    got = pg.evaluate(READ_FRAME, base64.b64encode(frame).decode())
    want = {k: (v.to_pylist() if k == "key" else v.tolist()) for k, v in tasks.items()}
    want["key"] = [k or "" for k in want["key"]]
    assert [d["seq"] for d in got] == [1, 2, 3] and all(d["binary"] for d in got)
    assert got[0]["tasks"] == want and got[1]["tasks"] is None and got[2]["tasks"] == want
    assert got[2]["transfers"] == {k: v.tolist() for k, v in transfers.items()}
    found = pg.evaluate("""(b64) => {
      const bin = atob(b64), buf = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) buf[i] = bin.charCodeAt(i);
      const d = flowscopeLive.readMessage(buf.buffer).deltas[0], div = document.createElement("div");
      document.body.appendChild(div);
      const tl = new FlowscopeTimeline(div, {rows: ["a", "b"], groups: [{name: "g", color: "#112233"},
                                                                       {name: "h", color: "#445566"}]});
      tl.append(d.tasks);
      return [tl.find("ключ-λ-🙂"), tl.keyAt(0), tl.keyAt(2)];
    }""", base64.b64encode(frame).decode())
    assert found[0] == {"start": 1 / 3, "end": 0.5, "row": 1, "group": "g"} and found[1:] == [IMG, ""]
    cut = base64.b64encode(frame[:len(frame) - 16]).decode()
    err = pg.evaluate("(b64) => { try { flowscopeLive.readMessage(Uint8Array.from(atob(b64), c => c.charCodeAt(0))"
                      ".buffer); return null; } catch (e) { return String(e.message); } }", cut)
    assert err is not None and re.search(r"ends at byte \d+, the message at \d+", err), err
    _no_markup_ran(pg)
    assert pg.errors == [] and pg.outside == []
    context.close()


def _open_run(address: str, headers: dict, name: str) -> str:
    r = httpx.post(f"{address}/v1/runs", json={"name": name}, headers=headers, timeout=30)
    r.raise_for_status()
    return r.json()["run_id"]


def test_with_a_token_pages_and_websocket_need_it(collector_factory, browser):
    websockets_sync = require_module("websockets.sync.client", "uvicorn[standard] brings it")
    token = "tok-" + "x" * 30
    c = collector_factory("--token", token)
    auth = {"Authorization": f"Bearer {token}"}
    run_id = _open_run(c.address, auth, IMG)
    # a token the user gave is never printed, not even in the dashboard's URL
    log = c.log_path.read_text()
    assert f"flowscope dashboard: {c.address}/ui/ (open" in log and token not in log

    assert httpx.get(f"{c.address}/ui/", timeout=30).status_code == 401
    assert httpx.get(f"{c.address}/ui/?token=wrong", timeout=30).status_code == 401
    assert httpx.get(f"{c.address}/v1/ui/runs", timeout=30).status_code == 401
    assert httpx.get(f"{c.address}/ui/static/timeline.js", timeout=30).status_code == 401
    ws_url = c.address.replace("http://", "ws://") + f"/v1/ui/runs/{run_id}/live"
    refused = require_module("websockets.exceptions", "uvicorn[standard] brings it").InvalidStatus
    with pytest.raises(refused, match="403"):  # no token: refused at the handshake
        websockets_sync.connect(ws_url, open_timeout=30, proxy=None)
    # the header lets a program in; a page of another origin may not open the socket, whatever it carries
    with pytest.raises(refused, match="403"):
        websockets_sync.connect(ws_url, additional_headers=auth, origin="http://evil.example", open_timeout=30,
                                proxy=None)
    with websockets_sync.connect(ws_url, additional_headers=auth, open_timeout=30, proxy=None) as ws:
        first = read_message(ws.recv(timeout=60))
        assert first["type"] == "snapshot" and first["name"] == IMG

    context = browser.new_context()
    pg = _page(context)
    # the URL `flowscope serve` prints: the token once, in the query; then a cookie, and a URL without it
    pg.goto(f"{c.address}/ui/?token={token}", wait_until="load")
    assert "token" not in pg.url
    pg.wait_for_function(f"() => flowscopeRuns.runs.some(r => r.run_id === {run_id!r})", timeout=WAIT_MS)
    pg.goto(f"{c.address}/ui/runs/{run_id}", wait_until="load")
    _wait(pg, "s.seq !== null")
    _shows_name(pg, IMG)
    _no_markup_ran(pg)
    # writing still needs the header: the cookie is for reading
    r = pg.request.post(f"{c.address}/v1/runs", data={"name": "from the browser"})
    assert r.status == 401
    assert pg.errors == [] and pg.outside == []
    context.close()


def test_pages_messages_are_compressed_beyond_loopback_only(collector_factory):
    """On loopback (the default) the live socket does not deflate what it sends (the collector's CPU; the bytes
    cost nothing there); bound beyond loopback it agrees to permessage-deflate when the browser offers it."""
    websockets_sync = require_module("websockets.sync.client", "uvicorn[standard] brings it")
    token = "tok-" + "y" * 30
    auth = {"Authorization": f"Bearer {token}"}
    for host, deflate in (("127.0.0.1", False), ("0.0.0.0", True)):
        c = collector_factory("--host", host, "--token", token)
        run_id = _open_run(c.address, auth, "compression")
        ws_url = c.address.replace("http://", "ws://") + f"/v1/ui/runs/{run_id}/live"
        with websockets_sync.connect(ws_url, additional_headers=auth, open_timeout=30, proxy=None) as ws:
            assert read_message(ws.recv(timeout=60))["type"] == "snapshot"
            offered = ws.request.headers.get("Sec-WebSocket-Extensions") or ""
            agreed = ws.response.headers.get("Sec-WebSocket-Extensions") or ""
        assert "permessage-deflate" in offered
        assert ("permessage-deflate" in agreed) is deflate, (host, agreed)


def test_flowscope_serve_prints_the_dashboard_url(collector):
    log = collector.log_path.read_text()
    assert f"flowscope dashboard: {collector.address}/ui/" in log
    assert httpx.get(f"{collector.address}/ui/static/plotly.min.js", timeout=30).status_code == 200


def _spans(fs, names, t0):
    for i, name in enumerate(names):
        fs.span(name, t0 + i * 1_000_000, t0 + (i + 1) * 1_000_000, kind="task", task_key=f"{name}-{i}")
    fs.flush()


# prepended to plotly.js as the page receives it: what the page showed when plotly.js began to run
AT_PLOTLY = ("window.__atPlotly = window.flowscopeLive && flowscopeLive.timeline ? {count: flowscopeLive.timeline.count, "
             "draws: flowscopeLive.timeline.drawCount, name: document.getElementById('run-name').textContent} : null;\n")


def test_the_overview_paints_before_plotly_loads_and_a_watched_run_is_sent_sooner(collector, browser):
    """The stream and the tables are painted before plotly.js (1.8 MB, the charts only) is even run, and plotly.js
    is served gzipped with an ETag; a client learns from the acknowledgements that a page follows its run and then
    sends within its live_flush_interval (here 0.1 s against a flush_interval of an hour)."""
    import flowscope
    from flowscope.ui import static_dir

    r = httpx.get(f"{collector.address}/ui/static/plotly.min.js", headers={"accept-encoding": "gzip"}, timeout=60)
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    assert r.content == (static_dir() / "plotly.min.js").read_bytes() and int(r.headers["content-length"]) < len(r.content) / 2
    again = httpx.get(f"{collector.address}/ui/static/plotly.min.js", headers={"if-none-match": r.headers["etag"]},
                      timeout=60)
    assert again.status_code == 304 and again.content == b""
    assert httpx.get(f"{collector.address}/ui/static/plotly.min.js", headers={"accept-encoding": "identity"},
                     timeout=60).headers.get("content-encoding") is None

    fs = flowscope.Client(collector.address, name="first paint", flush_interval=3600, live_flush_interval=0.1)
    t0 = flowscope.now_ns()
    for i, v in enumerate((20.0, 60.0, 40.0)):
        fs.metric("cpu.percent", v, namespace="hardware", resource_id="host:h1", ts_ns=t0 + i * 1_000_000)
    _spans(fs, ["load", "work", "work", "save"], t0)
    assert fs.watched is False  # nobody watches yet: the acknowledgements said so

    context = browser.new_context(viewport=WHOLE_PAGE)

    def plotly_after_the_page(route):
        resp = route.fetch()
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-encoding", "content-length")}
        route.fulfill(status=resp.status, headers=headers, body=AT_PLOTLY.encode() + resp.body())

    context.route("**/ui/static/plotly.min.js", plotly_after_the_page)
    pg = _page(context)
    pg.goto(f"{collector.address}/ui/runs/{fs.run_id}", wait_until="load")
    pg.wait_for_function("() => window.__atPlotly !== undefined", timeout=WAIT_MS)
    at = pg.evaluate("() => window.__atPlotly")
    assert at is not None and at["count"] == 4 and at["draws"] >= 1 and at["name"] == "first paint"
    # then the charts, once it ran
    pg.wait_for_function("() => ['throughput', 'hosts'].every(id => { const d = document.getElementById(id); "
                         "return d.data && d.data.length >= 1; })", timeout=WAIT_MS)
    assert pg.evaluate("() => document.getElementById('hosts').data[0].y") == [20.0, 60.0, 40.0]
    # a chart is redrawn only when its own data changed: new host samples redraw the hosts, not the throughput
    pg.evaluate("() => { window.__reacts = {}; const react = Plotly.react; Plotly.react = function (div) { "
                "window.__reacts[div.id] = (window.__reacts[div.id] || 0) + 1; return react.apply(this, arguments); }; }")
    fs.metric("cpu.percent", 80.0, namespace="hardware", resource_id="host:h1", ts_ns=t0 + 3_000_000)
    fs.flush()
    pg.wait_for_function("() => document.getElementById('hosts').data[0].y.length === 4", timeout=WAIT_MS)
    assert pg.evaluate("() => window.__reacts") == {"hosts": 1}

    # the page watches: the next acknowledgement says so, and from then on records go out within 0.1 s
    _spans(fs, ["later"], t0 + 10_000_000)
    assert fs.watched is True
    fs.span("sooner", t0 + 20_000_000, t0 + 21_000_000, kind="task", task_key="sooner-0")  # no flush
    got = _wait(pg, "s.stream >= 6")
    assert got["stream"] == 6 and got["groups"] == 5
    assert pg.errors == [] and pg.outside == []
    context.close()

    # nobody watches any more: the acknowledgements say so once the server has seen the page go
    for i in range(600):
        _spans(fs, ["after"], t0 + 30_000_000 + i * 1_000_000)
        if not fs.watched:
            break
        time.sleep(0.1)
    assert fs.watched is False
    fs.close()


def test_a_live_runs_throughput_chart_is_drawn_before_its_first_task_and_a_finished_empty_run_says_so(collector,
                                                                                                          browser):
    """A chart's first drawing costs several of its redraws: a live run's throughput chart is drawn, empty, once
    plotly.js is there, not among the first tasks; their bar is added to it. A finished run without a task keeps
    the sentence that says so instead of empty axes."""
    import flowscope

    fs = flowscope.Client(collector.address, name="no task yet", flush_interval=3600, live_flush_interval=0.1)
    context = browser.new_context(viewport=WHOLE_PAGE)
    pg = _page(context)
    pg.goto(f"{collector.address}/ui/runs/{fs.run_id}", wait_until="load")
    pg.wait_for_function("() => { const d = document.getElementById('throughput'); return !!(d.data && d.data.length); }",
                         timeout=WAIT_MS)
    assert pg.evaluate("() => document.getElementById('throughput').data[0].y") == []
    assert pg.evaluate("() => flowscopeLive.timeline ? flowscopeLive.timeline.count : 0") == 0
    _spans(fs, ["load", "work"], flowscope.now_ns())
    pg.wait_for_function("() => document.getElementById('throughput').data[0].y.reduce((a, b) => a + b, 0) === 2",
                         timeout=WAIT_MS)
    assert pg.errors == [] and pg.outside == []
    fs.close()

    empty = flowscope.Client(collector.address, name="never a task")
    empty.close()
    pg.goto(f"{collector.address}/ui/runs/{empty.run_id}", wait_until="load")
    pg.wait_for_function("() => flowscopeLive.snapshots >= 1 && flowscopeLive.renders >= 2 && "
                         "['loaded', 'failed', 'none'].includes(flowscopeLive.plotly.state)", timeout=WAIT_MS)
    shown = pg.evaluate("() => { const d = document.getElementById('throughput'); "
                        "return {text: d.textContent, plotted: !!d.data}; }")
    assert shown == {"text": "no task finished yet", "plotted": False}
    assert pg.errors == [] and pg.outside == []
    context.close()


@contextlib.contextmanager
def flowscope_ui(store, *options: str):
    """A real `flowscope ui STORE [OPTIONS]` process on a free port: its base address (http://HOST:PORT) while it
    runs."""
    proc = subprocess.Popen([sys.executable, "-m", "flowscope", "ui", str(store), "--port", "0", "--no-open", *options],
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # the URL it prints
            found = re.search(r"dashboard \(read-only\) over .*: (http://\S+)/ui/", line)
            if found:
                break
        else:
            pytest.fail("flowscope ui printed no URL")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


def test_flowscope_ui_serves_a_store_read_only_and_follows_a_run_written_by_another_process(tmp_path, browser):
    import flowscope

    store = tmp_path / "store"
    fs = flowscope.Client(store=store, name="written " + IMG)
    t0 = flowscope.now_ns()
    _spans(fs, ["load", SCRIPT, "load"], t0)
    with flowscope_ui(store) as address:
        url = f"{address}/ui/"
        assert httpx.post(f"{address}/v1/runs", json={"name": "x"}, timeout=30).status_code in (404, 405)
        context = browser.new_context(viewport=WHOLE_PAGE)
        pg = _page(context)
        pg.goto(url, wait_until="load")
        pg.wait_for_function(f"() => flowscopeRuns.runs.some(r => r.run_id === {fs.run_id!r} && r.tasks === 3)",
                             timeout=WAIT_MS)
        pg.goto(f"{address}/ui/runs/{fs.run_id}", wait_until="load")
        first = _wait(pg, "s.stream >= 3")
        assert first["stream"] == 3 and first["done"] == 3
        # the run goes on in this process, written by its own embedded collector: the page follows from disk
        _spans(fs, ["more", "more"], t0 + 10_000_000)
        later = _wait(pg, "s.stream >= 5")
        assert later["stream"] == 5 and later["done"] == 5 and later["groups"] == 3
        assert pg.evaluate("() => flowscopeLive.snapshots") == 1
        fs.close()
        _wait(pg, "s.status === 'finished'")
        _no_markup_ran(pg)
        # the list gives a finished run the summary's findings (computed once, in the background)
        pg.goto(url, wait_until="load")
        pg.wait_for_function(f"() => flowscopeRuns.runs.some(r => r.run_id === {fs.run_id!r} && r.findings)",
                             timeout=WAIT_MS)
        cell = pg.locator(f"tr[data-run='{fs.run_id}'] td.findings")
        cell.filter(has_text="of the time recorded").wait_for(timeout=WAIT_MS)
        _no_markup_ran(pg)
        assert pg.errors == [] and pg.outside == []
        context.close()


def test_the_runs_list_gives_a_running_run_its_findings_and_follows_them(tmp_path):
    """A run still running has its findings in the list too, recomputed as it grows (kept a few seconds between
    computations, so that a growing run does not keep the list's thread busy)."""
    import flowscope

    store = tmp_path / "store"
    fs = flowscope.Client(store=store, name="growing")
    t0 = flowscope.now_ns()
    _spans(fs, ["load", "load", "load"], t0)

    def findings_when(pred) -> list[str]:
        deadline = time.monotonic() + WAIT_MS / 1000
        while True:
            row = next(r for r in httpx.get(f"{address}/v1/ui/runs", timeout=60).json()["runs"]
                       if r["run_id"] == fs.run_id)
            assert row["status"] == "running"
            if row.get("findings") and pred(row["findings"]):
                return row["findings"]
            assert time.monotonic() < deadline, f"the list never gave the running run such findings: {row}"
            time.sleep(0.2)

    try:
        with flowscope_ui(store) as address:
            first = findings_when(lambda f: any(m.startswith("load (") for m in f))
            # the run grows: a new group takes most of the time, and the findings say so
            for i in range(3):
                fs.span("longer", t0 + (10 + i) * 1_000_000_000, t0 + (11 + i) * 1_000_000_000, kind="task",
                        task_key=f"longer-{i}")
            fs.flush()
            later = findings_when(lambda f: any(m.startswith("longer (") for m in f))
            assert later != first
    finally:
        fs.close()


def test_flowscope_run_serves_the_dashboard_of_its_run_while_the_command_runs(tmp_path):
    """The command itself reads the page and the run's live view from the URL `flowscope run` prints."""
    child = ("import json, os, urllib.request\n"
             "base, run = os.environ['FLOWSCOPE_ADDRESS'], os.environ['FLOWSCOPE_RUN']\n"
             "page = urllib.request.urlopen(f'{base}/ui/runs/{run}', timeout=60)\n"
             "snap = json.load(urllib.request.urlopen(f'{base}/v1/ui/runs/{run}/snapshot', timeout=60))\n"
             "print(page.status, 'live.js' in page.read().decode(), snap['run_id'] == run, snap['status'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSCOPE_", "DASK_"))}
    res = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(tmp_path / "store"), "--no-report",
                          "--quiet", "--sample-period", "0", "--", sys.executable, "-c", child],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert "200 True True running" in res.stdout
    assert re.search(r"^flowscope dashboard: http://127\.0\.0\.1:\d+/ui/runs/\S+$", res.stderr, re.MULTILINE), res.stderr


def test_a_programs_diagnostics_are_drawn_live_and_its_instability_is_flagged_before_the_crash(collector, browser):
    """The stencil mini-app, made unstable, publishes its diagnostics every step through a real collector; the run's
    page draws the series as they arrive and shows the instability detector's warning while the solver is still
    running: it stops at step 40 here, about 600 steps before it would crash."""
    import flowscope
    from flowscope.workflows.stencil import run_stencil

    fs = flowscope.Client(collector.address, name="stencil live", live_flush_interval=0.1)
    context = browser.new_context(viewport=WHOLE_PAGE)
    pg = _page(context)
    pg.goto(f"{collector.address}/ui/runs/{fs.run_id}", wait_until="load")
    seen: list[float] = []
    with fs.namespace("application", publish_every=1, blocking=True) as ns:
        out = run_stencil(n=64, steps=40, threads=2, unstable=True, namespace=ns,
                          on_step=lambda step, d: seen.append(d["energy"]))
    assert out["diagnostics"]["nan_count"] == 0  # no crash: the mesh is still finite
    pg.wait_for_function("() => { const d = document.getElementById('diagnostics'); return d.data && "
                         "d.data.some(t => t.name.includes('diagnostics/energy') && t.y.length === 40); }",
                         timeout=WAIT_MS)
    energy = pg.evaluate("() => document.getElementById('diagnostics').data"
                         ".find(t => t.name.includes('diagnostics/energy')).y")
    assert energy == pytest.approx(seen, rel=1e-12) and energy[-1] > 1e6 * energy[0]  # what the solver computed
    pg.wait_for_function("() => Array.from(document.querySelectorAll('#warnings li'))"
                         ".some(li => li.textContent.includes('application diagnostics/energy grew'))", timeout=WAIT_MS)
    assert pg.errors == [] and pg.outside == []
    context.close()
    fs.close()
