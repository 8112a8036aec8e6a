"""A run's dashboard pages as one offline file (`flowscope report`), in Debian's chromium.

The file is written from real traces of other tools (StarPU's Paje trace, Score-P's OTF2 ping-pong) and opened
from disk, with no server: every page (the overview and the analysis pages) must show what the same checks as the
served dashboard's read from its cells, drawn by the dashboard's own scripts; links move between the pages of the
file, nothing is requested from anywhere, and markup in names stays text."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_dashboard import WAIT_MS, browser  # noqa: F401  (fixture)
from test_dashboard_pages import (  # noqa: F401  (fixture)
    check_anomalies_ranking,
    check_critical_path_page,
    check_logs_page,
    check_profile_page,
    imported_store,
    ui_server,
)

from flowscope.cli.main import main

PAGES = ("advisor", "critical-path", "profile", "charts", "anomalies", "logs")


def _no_markup_ran(pg) -> None:
    """As the served pages' check, except that the file's embedded document (a JSON block, never run) holds the
    names' markup as data."""
    assert pg.evaluate("() => window.pwned") is None
    assert pg.dialogs == []
    assert pg.evaluate("() => document.querySelectorAll('img').length") == 0
    assert pg.evaluate("() => Array.from(document.querySelectorAll('b')).filter(b => b.textContent === 'bold').length") == 0
    assert pg.evaluate("() => Array.from(document.scripts).filter(s => !s.type || s.type === 'text/javascript')"
                       ".every(s => !s.textContent.includes('pwned'))")


def _open(context, url: str):
    pg = context.new_page()
    pg.dialogs, pg.errors, pg.outside = [], [], []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("request", lambda r: None if r.url.startswith(("file://", "data:", "blob:")) else pg.outside.append(r.url))
    pg.goto(url, wait_until="load")
    return pg


@pytest.fixture(scope="module")
def run_dirs(imported_store, dask_run) -> dict[str, Path]:
    """The runs the files are written of: two imported traces and a real Dask run."""
    store, runs = imported_store
    return {**{source: store / run_id for source, run_id in runs.items()}, "dask": dask_run}


@pytest.fixture(scope="module")
def written(run_dirs, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("offline")
    files = {}
    for source, run_dir in run_dirs.items():
        files[source] = out / f"{source}.html"
        assert main(["report", str(run_dir), "-o", str(files[source])]) == 0
    return files


@pytest.mark.parametrize("source", ["starpu", "otf2"])
def test_the_analysis_pages_of_the_offline_file_show_the_figures_of_the_analyses(source, imported_store, written,
                                                                                 browser):  # noqa: F811
    store, runs = imported_store
    run_dir = store / runs[source]
    uri = written[source].as_uri()
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pages = {}
    for page in ("critical-path", "profile", "anomalies", "logs"):
        pages[page] = pg = _open(context, f"{uri}#{page}")
        pg.wait_for_function("() => window.flowscopeView && flowscopeView.doc", timeout=WAIT_MS)
        assert pg.evaluate("() => flowscopeView.view") == page
    check_critical_path_page(pages["critical-path"], run_dir)
    check_profile_page(pages["profile"], run_dir)
    check_anomalies_ranking(pages["anomalies"], run_dir)
    check_logs_page(pages["logs"], run_dir)
    cp = pages["critical-path"]
    # the pages link to each other inside the file, and a link opens its page
    hrefs = cp.evaluate("() => Array.from(document.querySelectorAll('#run-nav a')).map(a => a.getAttribute('href'))")
    assert hrefs == ["#"] + [f"#{p}" for p in PAGES]
    cp.locator("#run-nav a", has_text="profile").click()
    cp.wait_for_function("() => window.flowscopeView && flowscopeView.view === 'profile' && flowscopeView.renders > 0",
                         timeout=WAIT_MS)
    check_profile_page(cp, run_dir)
    assert "snapshot" in cp.locator("#conn").inner_text()
    for pg in pages.values():
        _no_markup_ran(pg)
        assert pg.errors == [] and pg.outside == [] and pg.evaluate("() => flowscopeView.errors") == []
    context.close()


@pytest.mark.parametrize("source", ["starpu", "otf2"])
def test_the_overview_of_the_offline_file_shows_the_finished_run(source, imported_store, written, browser):  # noqa: F811
    """The overview: every task in the stream, the run's final status, the advisor's first findings and the forecast
    panel with what the analyses compute (the forecast for every state at the default fraction is in the file; another
    fraction says it is not)."""
    from flowscope.analysis.advisor import explain
    from flowscope.analysis.forecast import predict
    from flowscope.store.run import open_run

    store, runs = imported_store
    run = open_run(store / runs[source])
    # the stream draws tasks and calls (an MPI trace's are calls): every one of them
    tasks = int(run.sql("SELECT count(*) AS n FROM activity WHERE role IN ('task', 'call')")["n"].iloc[0])
    assert tasks > 0
    findings = explain(run).to_dict()["findings"]
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _open(context, written[source].as_uri())
    status = run.meta["status"]  # an imported trace's run is "imported": over, as a finished one
    pg.wait_for_function(f"() => {{ const s = window.flowscopeLive && flowscopeLive.summary(); return s && "
                         f"s.status === '{status}' && s.stream >= {tasks}; }}", timeout=WAIT_MS)
    assert pg.evaluate("() => flowscopeLive.summary().stream") == tasks
    pg.wait_for_function("() => window.flowscopePanels && flowscopePanels.advisor.renders > 0", timeout=WAIT_MS)
    got = pg.evaluate("() => Array.from(document.querySelectorAll('#advisor-panel .finding .title')).map(t => t.textContent)")
    assert got == [f["title"] for f in findings[:3]]
    assert pg.locator("#advisor-panel a.to-advisor").get_attribute("href") == "#advisor"
    for event in ("idle", "compute"):
        pg.select_option("#fc-event", event)
        pg.wait_for_function("e => flowscopePanels.forecast.doc && flowscopePanels.forecast.doc.event === e", arg=event,
                             timeout=WAIT_MS)
        want = predict(run, event, 0.25, None).as_dict()
        shown = pg.evaluate("() => flowscopePanels.forecast.doc")
        assert shown["frames"] == want["frames"] and shown["hit_rate"] == want["hit_rate"]
    pg.fill("#fc-fraction", "0.5")
    pg.dispatch_event("#fc-fraction", "change")
    pg.wait_for_function("() => flowscopePanels.forecast.error", timeout=WAIT_MS)
    assert "not in this file" in pg.locator("#fc-facts").inner_text()
    assert "snapshot" in pg.locator("#conn").inner_text()
    _no_markup_ran(pg)
    assert pg.errors == [] and pg.outside == [] and pg.evaluate("() => flowscopePanels.errors") == []
    context.close()
    run.close()


@pytest.fixture(scope="module")
def printed(imported_store, tmp_path_factory) -> dict:
    """The print layout of the imported traces' pages (`flowscope report --single-page`)."""
    store, runs = imported_store
    out = tmp_path_factory.mktemp("print")
    files = {}
    for source in ("starpu", "otf2"):
        files[source] = out / f"{source}.html"
        assert main(["report", str(store / runs[source]), "--single-page", "-o", str(files[source])]) == 0
    return files


def _frame_of(pg, page: str):
    """The frame of the print layout's section that shows ``page`` ("": the overview)."""
    return pg.locator(f'section.print-page[data-page="{page}"] iframe').element_handle().content_frame()


@pytest.mark.parametrize("source", ["starpu", "otf2"])
def test_the_print_layout_shows_every_page_of_the_file_one_after_another(source, imported_store, printed,
                                                                         browser):  # noqa: F811
    """The print layout: one scrolling document with a heading and the drawn page for the overview and each
    analysis page, in the file's order; each page shows what the same checks as the served pages' read from it
    (the critical path's steps, the profile's tables, the anomaly ranking, the logs, every task in the stream),
    each frame is as tall as its page (nothing cut off), nothing is requested from anywhere and no error."""
    from flowscope.store.run import open_run

    store, runs = imported_store
    run_dir = store / runs[source]
    run = open_run(run_dir)
    tasks = int(run.sql("SELECT count(*) AS n FROM activity WHERE role IN ('task', 'call')")["n"].iloc[0])
    run.close()
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _open(context, printed[source].as_uri())
    pg.wait_for_function("() => window.flowscopePrint", timeout=WAIT_MS)
    order = pg.evaluate("() => Array.from(document.querySelectorAll('section.print-page')).map(s => "
                        "[s.dataset.page, s.querySelector('h2').textContent])")
    assert order == [["", "overview"]] + [[p, p.replace("-", " ")] for p in PAGES]
    frames = {p: _frame_of(pg, p) for p in ("", *PAGES)}
    for p in PAGES:
        frames[p].wait_for_function("p => window.flowscopeView && flowscopeView.view === p && flowscopeView.renders > 0",
                                    arg=p, timeout=WAIT_MS)
    check_critical_path_page(frames["critical-path"], run_dir)
    check_profile_page(frames["profile"], run_dir)
    check_anomalies_ranking(frames["anomalies"], run_dir)
    check_logs_page(frames["logs"], run_dir)
    frames["advisor"].wait_for_function("() => document.querySelectorAll('#view .finding').length > 0", timeout=WAIT_MS)
    frames["charts"].wait_for_function("() => document.querySelectorAll('#view section').length > 0", timeout=WAIT_MS)
    overview = frames[""]
    overview.wait_for_function(f"() => {{ const s = window.flowscopeLive && flowscopeLive.summary(); return s && "
                               f"s.stream >= {tasks}; }}", timeout=WAIT_MS)
    assert overview.evaluate("() => flowscopeLive.summary().stream") == tasks
    overview.wait_for_function("() => window.flowscopePanels && flowscopePanels.advisor.renders > 0", timeout=WAIT_MS)
    # each frame as tall as the page it draws: the whole page is in the document
    for p, frame in frames.items():
        height = frame.evaluate("() => Math.ceil(document.documentElement.getBoundingClientRect().height)")
        assert height > 200, p
        pg.wait_for_function("([p, h]) => document.querySelector(`section.print-page[data-page=\"${p}\"] iframe`)"
                             ".getBoundingClientRect().height === h", arg=[p, height], timeout=WAIT_MS)
        assert "snapshot" in frame.locator("#conn").inner_text()
        assert frame.evaluate("() => window.pwned") is None
        assert frame.evaluate("() => document.querySelectorAll('img').length") == 0
    for p in PAGES:
        assert frames[p].evaluate("() => flowscopeView.errors") == [], p
    assert overview.evaluate("() => flowscopePanels.errors") == []
    # a link between pages scrolls the document to that page's frame
    frames["critical-path"].evaluate("() => document.querySelector('#run-nav a[data-page=\"profile\"]').click()")
    pg.wait_for_function("() => location.hash === '#print-profile'", timeout=WAIT_MS)
    assert pg.evaluate("() => window.scrollY") > 0
    assert pg.errors == [] and pg.outside == [] and pg.dialogs == []
    context.close()


def test_the_served_pages_link_to_the_file_and_it_is_the_same_file(imported_store, ui_server, browser, tmp_path):  # noqa: F811
    """The dashboard's pages offer the file: the link of a page saves the run's pages, which then open offline."""
    import httpx

    store, runs = imported_store
    context = browser.new_context(viewport={"width": 1300, "height": 1000}, accept_downloads=True)
    pg = context.new_page()
    pg.goto(f"{ui_server}/ui/runs/{runs['otf2']}/logs", wait_until="load")
    pg.wait_for_function("() => window.flowscopeView && flowscopeView.renders > 0", timeout=WAIT_MS)
    link = pg.locator("#save-offline")
    assert link.get_attribute("href") == f"/ui/runs/{runs['otf2']}/offline"
    with pg.expect_download(timeout=WAIT_MS) as got:
        link.click()
    saved = tmp_path / got.value.suggested_filename
    got.value.save_as(saved)
    assert saved.name == f"flowscope-{runs['otf2']}.html"
    off = _open(context, saved.as_uri() + "#logs")
    off.wait_for_function("() => window.flowscopeView && flowscopeView.renders > 0", timeout=WAIT_MS)
    check_logs_page(off, store / runs["otf2"])
    assert off.locator("#save-offline").count() == 0  # no link to save the file inside the file
    assert off.errors == [] and off.outside == []
    r = httpx.get(f"{ui_server}/ui/runs/20000101-000000-000000/offline", timeout=30)
    assert r.status_code == 404 and "20000101-000000-000000" in r.json()["error"]
    context.close()


def test_a_run_that_cannot_be_read_is_refused_naming_it(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    assert main(["report", str(missing)]) != 0
    assert "nothing-here" in capsys.readouterr().err
    assert not Path(missing / "report.html").exists()


def test_the_task_stream_keeps_its_time_range_and_a_task_in_the_address(imported_store, written, browser):  # noqa: F811
    """Deep links into the overview's task stream: ``?from=S&to=S`` (seconds since the run started) opens it on
    that range, zooming and panning keep the range in the address (which reopens the same view), and
    ``?task=KEY`` opens it on that task, named beside the stream."""
    from urllib.parse import parse_qs, urlsplit

    from flowscope.store.run import open_run

    store, runs = imported_store
    run = open_run(store / runs["starpu"])
    t0 = int(run.meta["start_ns"])
    task = run.sql("SELECT task_key, start_ns, end_ns FROM activity WHERE role = 'task' ORDER BY end_ns - start_ns "
                   "DESC, task_key LIMIT 1").iloc[0]
    run.close()
    uri = written["starpu"].as_uri()
    context = browser.new_context(viewport={"width": 1300, "height": 1000})

    def stream_view(pg) -> list[float]:
        pg.wait_for_function("() => window.flowscopeLive && flowscopeLive.timeline && flowscopeLive.timeline.count > 0",
                             timeout=WAIT_MS)
        return pg.evaluate("() => flowscopeLive.timeline.view")

    pg = _open(context, f"{uri}?from=0.1&to=0.2")
    assert stream_view(pg) == [0.1, 0.2]
    pg.locator("#stream").focus()  # the stream takes the keys: + - arrows 0
    pg.keyboard.press("+")  # zoom in around the middle
    pg.wait_for_function("() => new URLSearchParams(location.search).get('from') !== '0.1'", timeout=WAIT_MS)
    zoomed = stream_view(pg)
    q = parse_qs(urlsplit(pg.url).query)
    assert [float(q["from"][0]), float(q["to"][0])] == pytest.approx(zoomed, abs=1e-6)
    assert 0.1 < zoomed[0] < zoomed[1] < 0.2
    again = _open(context, pg.url)
    assert stream_view(again) == pytest.approx(zoomed, abs=1e-6)
    pg.keyboard.press("0")  # the whole run: the range leaves the address
    pg.wait_for_function("() => !new URLSearchParams(location.search).has('from')", timeout=WAIT_MS)

    from urllib.parse import quote

    tp = _open(context, f"{uri}?task={quote(task.task_key)}")
    # the page names the task once it has set the stream's view on it (at its next render after the snapshot: on
    # a busy machine the stream may hold the tasks a while before that)
    stream_view(tp)
    tp.wait_for_function("() => document.getElementById('stream-task').dataset.key", timeout=WAIT_MS)
    assert tp.locator("#stream-task").get_attribute("data-key") == task.task_key
    view = stream_view(tp)
    start, end = (task.start_ns - t0) / 1e9, (task.end_ns - t0) / 1e9
    assert view[0] < start and end < view[1] and view[1] - view[0] < 4 * (end - start)
    assert task.task_key in tp.locator("#stream-task").inner_text()
    # and outlines it, its row in view
    marked = tp.evaluate("() => { const tl = flowscopeLive.timeline; return {m: tl.marked, rows: tl.rowWindow}; }")
    assert marked["m"]["key"] == task.task_key
    assert marked["rows"][0] <= marked["m"]["row"] < marked["rows"][1]
    # a task step of the critical path links to the task in the overview's stream
    cp = _open(context, f"{uri}#critical-path")
    first = cp.locator("table.steps td.id a").first
    first.wait_for(timeout=WAIT_MS)
    key = first.inner_text()
    first.click()
    cp.wait_for_function("k => { const e = document.getElementById('stream-task'); return e && e.dataset.key === k; }",
                         arg=key, timeout=WAIT_MS)
    for p in (pg, again, tp, cp):
        assert p.errors == [] and p.outside == []
    missing = _open(context, f"{uri}?task=no-such-task")
    stream_view(missing)
    missing.wait_for_function("() => document.getElementById('stream-task').textContent", timeout=WAIT_MS)
    assert "no-such-task" in missing.locator("#stream-task").inner_text()
    context.close()


def test_a_resource_in_the_address_opens_the_task_stream_on_its_row(imported_store, written, browser):  # noqa: F811
    """``?resource=ID`` opens the overview's task stream with that resource's row in view and marked, named beside
    the stream with its tasks; a resource the stream has no row for is said so once the run is whole. The anomalies
    page links its selected resource there."""
    from urllib.parse import quote

    from flowscope.store.run import open_run

    store, runs = imported_store
    run = open_run(store / runs["starpu"])
    per = run.sql("""SELECT resource_id, count(*) AS n FROM activity WHERE role = 'task'
                     GROUP BY resource_id ORDER BY n, resource_id""")
    run.close()
    assert len(per) >= 2
    rid, tasks = per.iloc[0]["resource_id"], int(per.iloc[0]["n"])  # the worker with the fewer tasks
    uri = written["starpu"].as_uri()
    context = browser.new_context(viewport={"width": 1300, "height": 700})
    pg = _open(context, f"{uri}?resource={quote(rid)}")
    pg.wait_for_function("r => { const e = document.getElementById('stream-resource'); return e && e.dataset.resource"
                         " === r; }", arg=rid, timeout=WAIT_MS)
    got = pg.evaluate("""() => { const tl = flowscopeLive.timeline, S = flowscopeLive.state;
                                 return {row: tl.highlighted, ids: S.rowIds, labels: S.rows, window: tl.rowWindow,
                                         count: tl.rowCount(tl.highlighted)}; }""")
    row = got["ids"].index(rid)
    assert got["row"] == row and got["window"][0] <= row < got["window"][1]
    assert got["count"] == tasks
    text = pg.locator("#stream-resource").inner_text()
    assert got["labels"][row] in text and f"{tasks:,} tasks" in text

    missing = _open(context, f"{uri}?resource=no-such-resource")
    missing.wait_for_function("() => document.getElementById('stream-resource').textContent", timeout=WAIT_MS)
    assert "no-such-resource" in missing.locator("#stream-resource").inner_text()
    assert missing.evaluate("() => flowscopeLive.timeline.highlighted") is None

    # the anomalies page: the selected resource's link opens the overview on it
    an = _open(context, f"{uri}?resource={quote(rid)}#anomalies")
    link = an.locator("a.stream-of-resource")
    link.wait_for(timeout=WAIT_MS)
    link.click()
    an.wait_for_function("r => { const e = document.getElementById('stream-resource'); return e && e.dataset.resource"
                         " === r; }", arg=rid, timeout=WAIT_MS)
    for p in (pg, missing, an):
        assert p.errors == [] and p.outside == []
    context.close()


def _sleepy(i):
    import time

    time.sleep(0.01)
    return i


@pytest.fixture(scope="module")
def dask_run(tmp_path_factory) -> Path:
    """A real Dask run (a LocalCluster of one worker process, two threads) with the hardware sampled."""
    from distributed import Client, LocalCluster

    from flowscope import observe

    store = tmp_path_factory.mktemp("dask-store")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        with observe(client, store=store, name="offline-dask", hardware_period=0.2) as obs:
            assert sum(client.gather(client.map(_sleepy, range(120)))) == sum(range(120))
    return obs.run_dir


def test_the_overview_says_where_and_with_what_the_run_ran(dask_run, written, browser):  # noqa: F811
    """The run's facts from run.json (its command, host, CPU, cores, memory, Python and the versions of Dask and
    flowscope) are on the overview, as the report's summary had them."""
    from flowscope.store.run import open_run

    run = open_run(dask_run)
    meta, prov = run.meta, run.meta["provenance"]
    run.close()
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _open(context, written["dask"].as_uri())
    pg.wait_for_function("() => document.querySelectorAll('#run-facts dt').length > 0", timeout=WAIT_MS)
    facts = pg.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll('#run-facts dt'))
                                 .map(dt => [dt.textContent, dt.nextElementSibling.textContent]))""")
    assert facts["host"] == prov["hostname"]
    assert facts["Python"] == prov["python"]
    assert facts["CPU"] == prov["cpu_model"]
    assert facts["cores"].startswith(f"{prov['cpu_logical']} logical")
    assert facts["dask / distributed"] == f"{prov['packages']['dask']} / {prov['packages']['distributed']}"
    assert facts["flowscope"] == prov["packages"]["flowscope"]
    if meta.get("command"):
        assert facts["command"] == meta["command"]
    assert pg.errors == [] and pg.outside == []
    context.close()


def test_the_host_charts_mark_the_task_starts(dask_run, browser, tmp_path):  # noqa: F811
    """Under the CPU, memory, network and disk per host: the tasks (and calls) started per second, as the run's
    activity has them, on the same time axis."""
    from flowscope.store.run import open_run

    run = open_run(dask_run)
    t0 = int(run.meta["start_ns"])
    per = run.sql("SELECT (start_ns - ?) // 1000000000 AS s, count(*) AS n FROM activity WHERE role IN ('task', 'call') "
                  "GROUP BY s ORDER BY s", [t0])
    run.close()
    assert per["n"].sum() == 120
    out = tmp_path / "dask.html"
    assert main(["report", str(dask_run), "-o", str(out)]) == 0
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _open(context, out.as_uri())
    pg.wait_for_function("() => { const d = document.getElementById('hosts'); return d && d.data && "
                         "d.data.some(t => t.name === 'task starts'); }", timeout=WAIT_MS)
    starts = pg.evaluate("() => { const d = document.getElementById('hosts'); const t = d.data.find(t => t.name === "
                         "'task starts'); return [t.x, t.y, t.yaxis, d.layout.xaxis.anchor]; }")
    assert starts[0] == [int(s) + 0.5 for s in per["s"]] and starts[1] == [int(n) for n in per["n"]]
    layout = pg.evaluate("() => document.getElementById('hosts').layout")
    # the bottom panel, under the host panels, on their time axis
    axes = sorted(k for k in layout if k.startswith("yaxis"))
    assert starts[2] == "y" + str(len(axes)) and layout[f"yaxis{len(axes)}"]["title"]["text"] == "task starts / s"
    assert pg.errors == [] and pg.outside == []
    context.close()


CHART_SECTIONS = ("task-states", "io", "communication", "warnings")


def _report_figures(run_dir: Path) -> dict:
    """The report's own figures of the run (report/charts.py), as plotly's JSON: what the charts page must draw."""
    import json

    from flowscope.report import charts
    from flowscope.report.context import Context
    from flowscope.store.run import open_run

    run = open_run(run_dir)
    try:
        ctx = Context.of(run)
        figs = {"task-states": charts.task_phases(ctx), "io": charts.io_over_time(ctx),
                "communication": charts.communication(ctx), "warnings": charts.warnings(ctx)}
        return {k: (json.loads(f.to_json()) if f is not None else None) for k, f in figs.items()}
    finally:
        run.close()


def _points(trace: dict) -> int:
    """How many points plotly draws of ``trace`` (its x, a base64 typed array or a list)."""
    import base64

    import numpy as np

    x = trace.get("x")
    if isinstance(x, dict):
        return len(np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"])))
    return len(x) if x is not None else len(trace.get("y") or [])


@pytest.mark.parametrize("source", ["starpu", "otf2", "dask"])
def test_the_charts_page_draws_the_reports_figures(source, run_dirs, written, browser):  # noqa: F811
    """The charts page (task states, I/O over time, communication, warnings): the report's own figures, trace by
    trace, and for a section without one the reason the report gives."""
    run_dir, out = run_dirs[source], written[source]
    want = _report_figures(run_dir)
    # what each run has: a Dask run its tasks' I/O counters and its scheduler's task states; MPI messages with
    # sizes (OTF2) are communication; StarPU's Paje links record no size, so its page gives every reason instead
    has = {"dask": {"io", "task-states"}, "otf2": {"communication"}, "starpu": set()}[source]
    assert {k for k, f in want.items() if f is not None} >= has
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _open(context, f"{out.as_uri()}#charts")
    pg.wait_for_function("() => window.flowscopeView && flowscopeView.renders > 0", timeout=WAIT_MS)
    for sid in CHART_SECTIONS:
        section = pg.locator(f"#ch-{sid}")
        assert section.count() == 1, sid
        if want[sid] is None:
            assert section.locator(".nodata").count() == 1 and pg.locator(f"#ch-{sid}-chart").count() == 0, sid
            continue
        pg.wait_for_function("id => { const d = document.getElementById(id); return d && d.data; }",
                             arg=f"ch-{sid}-chart", timeout=WAIT_MS)
        # the report's traces as they are (plotly's JSON: numbers as base64 typed arrays), every point drawn
        drawn = pg.evaluate("id => { const d = document.getElementById(id); const a = v => v && v.bdata ? "
                            "{dtype: v.dtype, bdata: v.bdata} : (v || null); return d.data.map((t, i) => "
                            "[t.type || 'scatter', t.name || null, a(t.x), a(t.y), d.calcdata[i].length]); }",
                            f"ch-{sid}-chart")
        assert drawn == [[t.get("type", "scatter"), t.get("name"), t.get("x"), t.get("y"), _points(t)]
                         for t in want[sid]["data"]], sid
    # the I/O summary: the report's facts, tables and figures, or why the run has none
    from flowscope.report.context import Context
    from flowscope.report.io_summary import io_summary_blocks
    from flowscope.store.run import open_run

    run = open_run(run_dir)
    absent, blocks = io_summary_blocks(Context.of(run))
    run.close()
    assert (absent is None) == (source == "dask")  # its tasks' own I/O counters; the traces have no io rows
    summary = pg.locator("#ch-io-summary")
    if absent:
        assert summary.locator(".nodata").inner_text() == "No data: " + absent.replace("`", "")
    else:
        facts = pg.evaluate("() => Array.from(document.querySelectorAll('#ch-io-summary dl.facts > div')).map(d => "
                            "[d.querySelector('dt').textContent, d.querySelector('dd').textContent])")
        assert facts == [list(f) for b in blocks if b["kind"] == "facts" for f in b["facts"]]
        tables = pg.evaluate("() => Array.from(document.querySelectorAll('#ch-io-summary table')).map(t => "
                             "Array.from(t.tBodies[0].rows).map(tr => Array.from(tr.cells).map(td => td.textContent)))")
        assert tables == [b["rows"] for b in blocks if b["kind"] == "table"]
        ids = [i for b in blocks if b["kind"] == "figures" for i, _ in b["figures"]]
        assert ids
        for i in ids:
            pg.wait_for_function("id => { const d = document.getElementById(id); return d && d.calcdata; }",
                                 arg=f"ch-{i}", timeout=WAIT_MS)
    assert pg.errors == [] and pg.outside == [] and pg.evaluate("() => flowscopeView.errors") == []
    _no_markup_ran(pg)
    context.close()


@pytest.mark.parametrize("source", ["otf2", "dask"])
def test_the_profile_page_has_the_reports_flame_graph_and_utilisation_table(source, run_dirs, written,
                                                                         browser):  # noqa: F811
    """The profile page draws the report's flame graph of the call tree (every box) and lists the utilisation of
    each executing resource as the report's table does."""
    import json

    from flowscope.analysis.call_tree import run_call_tree
    from flowscope.report.chart_sections import utilisation_table
    from flowscope.report.context import Context
    from flowscope.report.profile import flame_graph
    from flowscope.store.run import open_run

    run_dir, out = run_dirs[source], written[source]
    run = open_run(run_dir)
    ctx = Context.of(run)
    tree = run_call_tree(run)
    lab = ctx.rows(tree.resources)
    flame = json.loads(flame_graph(tree, dict(zip(lab["resource_id"], lab["label"]))).to_json())
    util = utilisation_table(ctx)
    run.close()
    assert util is not None and util[2]
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _open(context, f"{out.as_uri()}#profile")
    pg.wait_for_function("() => { const d = document.getElementById('pf-flame-chart'); return d && d.calcdata; }",
                         timeout=WAIT_MS)
    drawn = pg.evaluate("() => document.getElementById('pf-flame-chart').data.map(t => [t.type, t.ids, t.parents])")
    assert drawn == [[t["type"], t.get("ids"), t.get("parents")] for t in flame["data"]]
    rows = pg.evaluate("() => Array.from(document.querySelectorAll('table.utilisation tbody tr')).map(tr => "
                       "Array.from(tr.cells).map(td => td.textContent))")
    assert rows == [[str(v) for v in r] for r in util[2]]
    assert pg.errors == [] and pg.outside == []
    _no_markup_ran(pg)
    context.close()


def test_an_overview_with_nothing_to_draw_says_why(tmp_path, browser):  # noqa: F811
    """A finished run whose overview has nothing to draw (a program that published metrics only: no task, no call,
    no hardware sample) says so where the stream and the host charts would be, and what would give them."""
    import flowscope
    from flowscope.report import write_report

    fs = flowscope.Client("embedded", store=tmp_path / "store", name="metrics only")
    for step in range(3):
        fs.metric("energy", float(step), namespace="application")
    fs.close()
    out = write_report(fs.run_dir)
    context = browser.new_context(viewport={"width": 1300, "height": 3200})
    pg = _open(context, out.as_uri())
    pg.wait_for_function("() => window.flowscopeLive && flowscopeLive.snapshots > 0", timeout=WAIT_MS)
    stream = pg.locator("#stream").inner_text()
    assert "no span in this run" in stream and "profile" in stream, stream
    hosts = pg.locator("#hosts").inner_text()
    assert "no hardware samples in this run" in hosts and "sampler" in hosts, hosts
    assert pg.errors == [] and pg.outside == []
    context.close()
