"""The HTML report: built from a real Dask run, self-contained, and rendered by headless Chromium without errors."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS, missing_dependency, require_module, shared_browser  # noqa: F401

from distributed import Client as DaskClient
from distributed import LocalCluster

import flowscope
from flowscope.analysis.breakdown import breakdown
from flowscope.cli.main import main as cli_main
from flowscope.model import identifiers as ids
from flowscope.analysis.critical_path import task_graph_paths
from flowscope.report import write_report
from flowscope.sources.dask import observe

EXTERNAL = re.compile(r"""<(?:script|link|img|iframe|source|embed)\b[^>]*\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""",
                      re.IGNORECASE)


# ---- the work the cluster does -------------------------------------------------------------------------------

def _thread_io() -> tuple[int, int]:
    """(rchar, wchar) of the calling thread (Linux per-thread I/O accounting); (0, 0) where unavailable."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/io", "rb") as f:
            fields = dict(line.split(b":") for line in f.read().splitlines())
        return int(fields[b"rchar"]), int(fields[b"wchar"])
    except (OSError, KeyError, ValueError):
        return 0, 0


def load(i: int) -> np.ndarray:
    time.sleep(0.02)
    return np.random.default_rng(i).standard_normal(50_000 + 10_000 * i)


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    time.sleep(0.01)
    n = min(len(a), len(b))
    return a[:n] + b[:n]


def store(x: np.ndarray, path: str) -> dict:
    """Write ``x`` to ``path`` and read it back, reporting what this thread read and wrote meanwhile
    (what the proc-io source records for a task)."""
    start = time.time_ns()
    r0, w0 = _thread_io()
    np.save(path, x)
    back = np.load(path)
    r1, w1 = _thread_io()
    end = time.time_ns()
    return {"tid": threading.get_native_id(), "thread_ident": threading.get_ident(), "pid": os.getpid(),
            "host": ids.hostname(), "start_ns": start, "end_ns": end, "read": r1 - r0, "write": w1 - w0,
            "path": path, "n": int(back.size)}


def _record_io(fs, key: str, info: dict) -> None:
    """The io rows a per-task I/O source writes: bytes read and written by the thread during the task, and
    the file it opened."""
    common = {"resource_id": ids.thread_id(info["tid"], info["pid"], info["host"]), "host": info["host"],
              "pid": info["pid"], "tid": info["tid"], "thread_ident": info["thread_ident"], "task_key": key}
    for op in ("read", "write"):
        if info[op] > 0:
            fs.emit("io", source="proc-io", op=op, nbytes=info[op], start_ns=info["start_ns"],
                    end_ns=info["end_ns"], **common)
    fs.emit("io", source="audit", op="open", path=info["path"], start_ns=info["start_ns"], **common)


class _Sampler:
    """flowscope's hardware sampler when it is there, else the same two metrics from psutil."""

    def __init__(self, fs, period: float = 0.1):
        self.fs, self.period = fs, period
        self.stop_event = threading.Event()
        self.sampler = None
        self.thread = None

    def __enter__(self):
        try:
            from flowscope.sources.hardware import HardwareSampler

            self.sampler = HardwareSampler(self.fs, period=self.period).start()
        except ImportError:
            import psutil

            rid = ids.host_id()
            self.fs.resource("host", rid, name=ids.hostname(), host=ids.hostname())

            def loop():
                psutil.cpu_percent(None)
                while not self.stop_event.wait(self.period):
                    self.fs.metric("cpu.percent", psutil.cpu_percent(None), namespace="hardware", resource_id=rid)
                    self.fs.metric("memory.used_bytes", psutil.virtual_memory().used, namespace="hardware",
                                   resource_id=rid)

            self.thread = threading.Thread(target=loop, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.sampler is not None:
            self.sampler.stop(timeout=10)
        else:
            self.stop_event.set()
            self.thread.join(10)


@pytest.fixture(scope="module")
def dask_run(tmp_path_factory):
    """A real run: 2 workers x 2 threads, loads pinned alternately to each worker so that the combines fetch
    data across workers, stores that write files, hardware samples, one logged warning."""
    tmp = tmp_path_factory.mktemp("report")
    files = tmp / "files"
    files.mkdir()
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                         worker_dashboard_address=None) as cluster, DaskClient(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        with observe(client, store=tmp / "store", name="report-test", command="pytest tests/test_report.py") as obs:
            with _Sampler(obs.client):
                loads = [client.submit(load, i, key=f"load-{i}", workers=[workers[i % 2]]) for i in range(12)]
                combs = [client.submit(combine, loads[i], loads[(i + 1) % 12], key=f"combine-{i}")
                         for i in range(12)]
                stores = [client.submit(store, combs[i], str(files / f"part-{i}.npy"), key=f"store-{i}")
                          for i in range(12)]
                infos = client.gather(stores)
                total = client.submit(sum, [c.sum() for c in client.gather(combs)], key="total").result()
                for i, info in enumerate(infos):
                    _record_io(obs.client, f"store-{i}", info)
                obs.client.log("event loop was unresponsive for 1.20s (injected by the test)", level="warning",
                               category="event-loop-unresponsive", resource_id=ids.worker_id(workers[0]))
                time.sleep(0.3)  # a few more hardware samples
        assert np.isfinite(total)
    run = obs.run
    path = write_report(run)
    return run, path


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory):
    """A run with spans only, from the plain client API (as an imported trace may be)."""
    tmp = tmp_path_factory.mktemp("sparse")
    fs = flowscope.Client("embedded", store=tmp / "store", name="sparse")
    for i in range(20):
        with fs.timed(f"step-{i % 3}", kind="task", task_key=f"k-{i}"):
            time.sleep(0.002)
    fs.close()
    run = flowscope.open_run(fs.run_dir)
    return run, write_report(run, tmp / "sparse.html")


# ---- the browser ----------------------------------------------------------------------------------------------

def _browser():
    # scripts/test.sh installs both; where they are missing outside CI, say so and skip; in CI, fail
    sync_api = require_module("playwright.sync_api", "Playwright drives the browser: pip install -e '.[test]'")
    if not Path(CHROMIUM).exists():
        missing_dependency(f"{CHROMIUM} is missing (apt-get install chromium)")
    return sync_api.sync_playwright


@contextlib.contextmanager
def open_page(path: Path, blocked: list | None = None, fragment: str = ""):
    """``path`` opened in headless Chromium (at ``#fragment`` when given: a page of the pages file): yields
    ``(page, console, errors)``, the console messages and page errors collected as they come. With ``blocked``,
    requests that would leave the file are refused and their URLs appended to it."""
    console: list = []
    errors: list = []
    # the module's browser (tests/conftest.py); the page has a context of its own, closed with it
    page = shared_browser().new_page(viewport={"width": 1400, "height": 900})
    try:
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: errors.append(str(e)))
        if blocked is not None:
            def block(route):
                blocked.append(route.request.url)
                route.abort()

            page.route(re.compile(r"^(?!file:|data:|blob:|about:).*"), block)
        page.goto(path.resolve().as_uri() + (f"#{fragment}" if fragment else ""), wait_until="load")
        yield page, console, errors
    finally:
        page.close()


@contextlib.contextmanager
def open_view(path: Path, view: str, blocked: list | None = None):
    """The analysis page ``view`` of the pages file ``path`` (``FILE#view``) in headless Chromium, once the
    dashboard's script has drawn it: yields ``(page, console, errors)`` as :func:`open_page`."""
    with open_page(path, blocked, view) as (page, console, errors):
        page.wait_for_function("v => window.flowscopeView && flowscopeView.view === v && flowscopeView.renders > 0",
                               arg=view, timeout=60_000)
        yield page, console, errors


def view_text(path: Path, view: str) -> tuple[str, list]:
    """The text the analysis page ``view`` of the pages file ``path`` shows once drawn, and its errors: console
    errors, page errors, the view script's own, and requests that would have left the file."""
    blocked: list = []
    with open_view(path, view, blocked) as (page, console, errors):
        text = page.inner_text("main")
        own = page.evaluate("() => flowscopeView.errors")
        return text, [m for m in console if m[0] == "error"] + errors + own + blocked


def render(path: Path, screenshot: Path | None = None) -> dict:
    """Open ``path`` in headless Chromium, offline: returns console messages, page errors, requests that
    left the file, and what Plotly drew."""
    out = {"external": []}
    with open_page(path, blocked=out["external"]) as (page, console, errors):
        out["console"], out["errors"] = console, errors
        page.wait_for_function("() => window.Plotly === undefined || "
                               "document.querySelectorAll('.plot').length === "
                               "document.querySelectorAll('.js-plotly-plot').length", timeout=30_000)
        page.wait_for_timeout(300)
        out["plots"] = page.evaluate("""() => Object.fromEntries(
            Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => [d.id, d.data.length]))""")
        out["drawn"] = page.evaluate("""() => Object.fromEntries(
            Array.from(document.querySelectorAll('.js-plotly-plot')).map(
                d => [d.id, d.querySelectorAll('.trace, canvas').length]))""")
        out["sections"] = page.evaluate("() => Array.from(document.querySelectorAll('section')).map(s => s.id)")
        out["text"] = {s: page.inner_text(f"section#{s}") for s in out["sections"]}
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
    return out


def _errors(result: dict) -> list:
    return [m for m in result["console"] if m[0] == "error"] + result["errors"]


# ---- tests ----------------------------------------------------------------------------------------------------

#: the analysis pages of the pages file (its overview is the page "")
PAGES = ("advisor", "critical-path", "profile", "charts", "anomalies", "logs")


def overview(path: Path, blocked: list | None = None, query: str = "") -> dict:
    """What the overview of the pages file ``path`` shows once every task is in its stream: the live view's summary,
    the stream's rows and groups, the host charts' traces, the run's name and id, and the errors."""
    from flowscope.report.run_pages import run_pages_doc  # noqa: F401  (the document the overview draws)

    out: dict = {}
    with open_page(Path(str(path) + query) if query else path, blocked) as (page, console, errors):
        page.wait_for_function("() => { const s = window.flowscopeLive && flowscopeLive.summary(); return s && "
                               "s.status === flowscopeOffline.doc.live.status && s.stream === s.total; }",
                               timeout=60_000)
        out["summary"] = page.evaluate("() => flowscopeLive.summary()")
        out["rows"] = page.evaluate("() => flowscopeLive.timeline ? flowscopeLive.timeline.rowLabels : []")
        out["groups"] = page.evaluate("() => flowscopeLive.timeline ? flowscopeLive.timeline.groups.map(g => g.name) : []")
        out["hosts"] = page.evaluate("() => { const d = document.getElementById('hosts'); return d && d.data ? "
                                     "d.data.map(t => t.name) : []; }")
        out["text"] = page.inner_text("body")
        out["errors"] = [m for m in console if m[0] == "error"] + errors
    return out


def test_the_report_is_one_self_contained_file_with_every_page(dask_run):
    from flowscope.report.snapshot import DOC_ID

    run, path = dask_run
    assert path == run.path / "report.html" and path.is_file()
    text = path.read_text()
    assert not EXTERNAL.findall(text), "the report must load nothing from the network"
    assert text.count('data-asset="plotly.min.js"') == 1, "plotly.js is embedded once"
    doc = json.loads(text.split(f'id="{DOC_ID}">', 1)[1].split("</script>", 1)[0])
    assert doc["pages"] == ["", *PAGES] and set(PAGES) - {"advisor"} <= set(doc["views"])
    assert all("failed" not in v for v in doc["views"].values()), {k: v.get("failed") for k, v in doc["views"].items()}
    # the run's name and id, as the overview shows them
    assert doc["run_id"] == run.meta["run_id"] and doc["live"]["name"] == "report-test"
    size = path.stat().st_size
    assert size < 8 * 2**20, f"{size} bytes for a small run"


def test_the_run_has_what_the_report_shows(dask_run):
    run, _ = dask_run
    counts = run.counts()
    assert counts["transfers"] > 0 and counts["io"] > 0 and counts["metrics"] > 0
    assert int(run.sql("SELECT count(*) AS n FROM logs WHERE level = 'warning'")["n"][0]) >= 1


def test_the_report_renders_in_headless_chromium(dask_run, tmp_path):
    """The pages of the Dask run's report, each drawn by the dashboard's scripts: the overview's stream with every
    task by group on rows per worker thread and the hosts' CPU and memory; the profile page's breakdown with the
    analysis' numbers and its groups; the charts page's task states, I/O, communication and warnings drawn; the
    critical-path page's measured and structural lengths with its charts drawn."""
    from test_dashboard_pages import check_critical_path_page, check_profile_page

    run, path = dask_run
    blocked: list = []
    ov = overview(path, blocked)
    assert not ov["errors"], ov["errors"]
    tasks = int(run.sql("SELECT count(*) AS n FROM activity WHERE role = 'task'")["n"].iloc[0])
    assert ov["summary"]["stream"] == tasks == ov["summary"]["done"] and ov["summary"]["warnings"] >= 1
    for label in ("load", "combine", "store"):
        assert label in ov["groups"], (label, ov["groups"])
    assert any(re.search(r"worker|tid|\d", r) for r in ov["rows"]), ov["rows"]
    assert ov["hosts"], "CPU and memory per host drawn"
    assert "report-test" in ov["text"] and run.meta["run_id"] in ov["text"]
    with open_view(path, "profile", blocked) as (page, console, errors):
        exp = check_profile_page(page, run.path)  # the breakdown's and the groups' numbers, cell by cell
        b = exp["breakdown"]
        facts = page.locator("#pf-facts").inner_text()
        assert f"{b.tasks:,} tasks" in facts and f"{b.transfers:,} transfers" in facts
        groups = page.evaluate("() => Array.from(document.querySelectorAll('table.groups tbody tr')).map(tr => "
                               "tr.dataset.group)")
        assert {"load", "combine", "store"} <= set(groups) and "CV" in page.inner_text("#pf-groups")
        page.wait_for_function("() => { const d = document.getElementById('pf-chart'); return d && d.calcdata; }")
        assert not [m for m in console if m[0] == "error"] and not errors
    with open_view(path, "charts", blocked) as (page, console, errors):
        for sid in ("task-states", "io", "communication", "warnings"):
            page.wait_for_function("id => { const d = document.getElementById(id); return d && d.calcdata && "
                                   "d.querySelectorAll('.trace, canvas').length > 0; }", arg=f"ch-{sid}-chart")
        assert "event-loop-unresponsive" in page.inner_text("#ch-warnings")
        assert not [m for m in console if m[0] == "error"] and not errors
    with open_view(path, "critical-path", blocked) as (page, console, errors):
        check_critical_path_page(page, run.path)
        tp = task_graph_paths(run.table("spans").query("kind == 'task'"), run.table("dependencies"),
                              run.table("transfers"))
        assert page.locator("#cp-task-facts").inner_text().startswith("Measured critical path")
        assert float(page.locator("#cp-task-length").get_attribute("data-value")) == tp.measured.length_ns / 1e9
        assert float(page.locator("#cp-task-structural").get_attribute("data-value")) == tp.structural.length_ns / 1e9
        for chart in ("cp-task-chart", "cp-graph"):
            page.wait_for_function("id => { const d = document.getElementById(id); return d && d.calcdata; }", arg=chart)
        shot = Path(os.environ.get("FLOWSCOPE_REPORT_SCREENSHOT") or tmp_path / "report.png")
        page.screenshot(path=str(shot), full_page=True)
        assert not [m for m in console if m[0] == "error"] and not errors
    assert shot.stat().st_size > 10_000
    assert not blocked, blocked


def test_a_run_with_only_spans_says_no_data_and_renders_cleanly(sparse_run):
    """The charts page says "No data" (and what would supply it) for I/O, communication and warnings; the overview
    draws the spans' stream; the profile page counts the 20 tasks."""
    _, path = sparse_run
    text = path.read_text()
    assert not EXTERNAL.findall(text)
    blocked: list = []
    with open_view(path, "charts", blocked) as (page, console, errors):
        for sid in ("io", "communication", "warnings", "task-states"):
            nodata = page.locator(f"#ch-{sid} .nodata").inner_text()
            assert nodata.startswith("No data"), (sid, nodata)
            assert page.locator(f"#ch-{sid}-chart").count() == 0, sid
        assert "No data" in page.inner_text("#ch-io-summary")
        assert not [m for m in console if m[0] == "error"] and not errors
    ov = overview(path, blocked)
    assert not ov["errors"], ov["errors"]
    assert ov["summary"]["stream"] == 20 and "step-0" in ov["groups"]
    assert ov["hosts"] == [] and "no hardware samples" in ov["text"]
    body, errors = view_text(path, "profile")
    assert not errors, errors
    assert "20 tasks" in body
    assert not blocked


def test_an_empty_run_renders_with_no_data_everywhere(tmp_path):
    fs = flowscope.Client("embedded", store=tmp_path / "store", name="empty")
    fs.close()
    path = write_report(fs.run_dir)
    for view in PAGES:
        blocked: list = []
        with open_view(path, view, blocked) as (page, console, errors):
            assert page.evaluate("() => document.querySelectorAll('#view .js-plotly-plot').length") == 0, view
            assert page.locator("#view .nodata").count() >= 1, view
            assert not [m for m in console if m[0] == "error"] and not errors and not blocked, view
            assert page.evaluate("() => flowscopeView.errors") == [], view


def _large_run(tmp_path: Path, n: int, threads: int, io_rows: int) -> Path:
    """``n`` task spans of 30 groups on ``threads`` threads, 1 ms apart on each, and ``io_rows`` reads."""
    import pyarrow as pa

    from flowscope.model.schemas import schema

    fs = flowscope.Client("embedded", store=tmp_path / "store", name="large")
    for t in range(threads):
        fs.resource("thread", f"thread:h:1:{100 + t}", name=f"w-{t}", host="h", pid=1, tid=100 + t)
    base = time.time_ns()
    i = np.arange(n)
    start = base + (i // threads) * 1_000_000
    cols = {"resource_id": [f"thread:h:1:{100 + t}" for t in i % threads],
            "kind": ["task"] * n, "name": [f"group-{g}" for g in i % 30],
            "start_ns": start, "end_ns": start + 600_000, "task_key": [f"key-{k}" for k in i]}

    def table(name: str, cols: dict, rows: int) -> pa.Table:
        sch = schema(name)
        return pa.table({f.name: pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(rows, f.type)
                         for f in sch}, schema=sch)

    fs.write("spans", table("spans", cols, n))
    j = np.arange(io_rows)
    fs.write("io", table("io", {"pid": [1] * io_rows, "tid": (100 + j % threads).tolist(), "host": ["h"] * io_rows,
                                "source": ["proc-io"] * io_rows, "op": ["read"] * io_rows,
                                "nbytes": (1 + j * 1000).tolist(), "start_ns": start[:io_rows],
                                "end_ns": start[:io_rows] + 600_000}, io_rows))
    fs.close()
    return fs.run_dir


def test_a_large_run_is_drawn_whole_and_zooms_and_stays_small(tmp_path):
    """30,000 task spans on 8 threads and 20,000 I/O records: the overview's stream holds every task in its 30
    groups and opens on a time range given in the address; the charts page bins the I/O records into one trace;
    the file stays far under the 20 MB budget."""
    n = 30_000
    run_dir = _large_run(tmp_path, n, 8, 20_000)
    t0 = time.perf_counter()
    path = write_report(run_dir)
    took = time.perf_counter() - t0
    print(f"report of {n:,} task spans written in {took:.1f} s")
    size = path.stat().st_size
    assert size < 6 * 2**20 + 60 * n, f"{size} bytes: plotly.js and the pages' scripts plus about 60 bytes per task"
    blocked: list = []
    ov = overview(path, blocked)
    assert not ov["errors"], ov["errors"]
    assert ov["summary"]["stream"] == n and len(ov["groups"]) == 30 and len(ov["rows"]) == 8
    with open_page(path, blocked) as (page, console, errors):  # a time range in the address: the stream opens on it
        page.goto(path.resolve().as_uri() + "?from=1.0&to=1.02", wait_until="load")
        page.wait_for_function("() => window.flowscopeLive && flowscopeLive.timeline && "
                               "flowscopeLive.timeline.count === 30000", timeout=60_000)
        assert page.evaluate("() => flowscopeLive.timeline.view") == [1.0, 1.02]
        assert not errors
    with open_view(path, "charts", blocked) as (page, console, errors):
        page.wait_for_function("() => { const d = document.getElementById('ch-io-chart'); return d && d.calcdata; }")
        assert page.evaluate("() => document.getElementById('ch-io-chart').data.length") == 1, "binned I/O"
        assert not errors
    assert not blocked


def test_flowscope_report_command(dask_run, tmp_path, capsys):
    """`flowscope report` writes the run's dashboard pages (the report is a snapshot of the dashboard's views);
    `--single-page` the print layout of the same file (every page one after another)."""
    from flowscope.report.snapshot import DOC_ID

    def embedded(text: str) -> dict:
        return json.loads(text.split(f'id="{DOC_ID}">', 1)[1].split("</script>", 1)[0])

    run, _ = dask_run
    out = tmp_path / "r.html"
    assert cli_main(["report", str(run.path), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    pages = out.read_text()
    assert f'id="{DOC_ID}"' in pages and '<template id="page-view">' in pages
    assert embedded(pages)["layout"] == "pages"
    one = tmp_path / "one.html"
    assert cli_main(["report", str(run.path), "--single-page", "-o", str(one)]) == 0
    assert capsys.readouterr().out.strip() == str(one)
    single = one.read_text()
    # the same file, the same views, in the print layout
    doc, same = embedded(single), embedded(pages)
    assert doc["layout"] == "all" and doc["pages"] == same["pages"] and set(doc["views"]) == set(same["views"])
    assert '<template id="page-view">' in single and not EXTERNAL.findall(single)
    # a directory as the output: report.html in it (report-single-page.html for the one page)
    outdir = tmp_path / "out"
    outdir.mkdir()
    assert cli_main(["report", str(run.path), "-o", str(outdir)]) == 0
    assert capsys.readouterr().out.strip() == str(outdir / "report.html")
    assert cli_main(["report", str(run.path), "--single-page", "-o", str(outdir)]) == 0
    assert capsys.readouterr().out.strip() == str(outdir / "report-single-page.html")
    # by run id in a store, to the default place
    shutil.copytree(run.path, tmp_path / "store" / run.run_id)
    assert cli_main(["report", run.run_id, "--store", str(tmp_path / "store")]) == 0
    assert DOC_ID in (tmp_path / "store" / run.run_id / "report.html").read_text()
    capsys.readouterr()  # a slow report shows a progress bar, whose end leaves a newline on stderr
    assert cli_main(["report", "nosuch", "--store", str(tmp_path / "store")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("flowscope report: error: nosuch") and err.count("\n") == 1


def test_write_report_accepts_a_path_and_replaces_the_file_atomically(sparse_run, tmp_path):
    run, _ = sparse_run
    target = tmp_path / "sub" / "x.html"
    target.parent.mkdir()
    target.write_text("old")
    seen = []
    p = write_report(str(run.path), target, progress=lambda what, done, total: seen.append((what, done, total)))
    assert p == target and target.read_text().startswith("<!doctype html>")
    assert [s[0] for s in seen][:2] == ["live view", "critical-path"] and seen[-1][0] == "done"
    assert not [f for f in target.parent.iterdir() if f.name.startswith(".")], "no temp file left"
    json.dumps(seen)
