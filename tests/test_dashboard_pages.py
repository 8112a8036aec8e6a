"""The dashboard's analysis pages (critical path, profile and breakdown, anomalies, logs) in Debian's chromium.

Against a real `flowscope serve` fed by a real Dask LocalCluster whose second part is held on a file this test
creates (so what a page must show is set by the workflow's progress, never by waiting), and against `flowscope ui`
over real traces of other tools (StarPU's Paje trace, Score-P's OTF2 ping-pong): each page shows the figures the
analysis functions compute on the same tables (numbers compared, read from the page's cells), follows the run as
it grows, keeps its selections in its URL, and shows markup in names as text."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from conftest import alone_in_hbos_bin
from test_dashboard import (  # noqa: F401  (fixture)
    IMG,
    RUN_NAME,
    SCRIPT,
    WAIT_MS,
    _no_markup_ran,
    _page,
    browser,
    flowscope_ui,
)

WAIT_S = WAIT_MS / 1000
PROCESS_MEMORY = "process.memory.rss_bytes"
#: set to a folder to take the docs' screenshots of the pages (docs/img)
SCREENSHOTS_ENV = "FLOWSCOPE_DASHBOARD_SCREENSHOTS"

#: a viewport tall enough for every chart of the overview: a chart out of view is drawn only once scrolled to
WHOLE_PAGE = {"width": 1300, "height": 3200}


#: calls of one function in the first part of the Dask run, and those slowed down on one worker (anomalies): each
#: by a different amount, 1.5 times the last, so that each has a histogram bin of its own (HBOS flags the rarest
#: bins; with 200 calls a bin is about 35 ms wide, docs/anomalies.md)
N_PARTS = 200
SLOWED = {5: 0.12, 31: 0.18, 57: 0.27, 83: 0.40, 109: 0.60}
SLOW = 5  # the one a log message names


def work(i):
    time.sleep(SLOWED.get(i, 0.01 + 0.002 * ((i * 7919) % 5)))
    return i


def total(*xs):
    time.sleep(0.01)
    return sum(xs)


def gated(x, gate):
    while not os.path.exists(gate):
        time.sleep(0.02)
    return x


# ---- what the analyses compute on the run's tables now ----------------------------------------------------

def _segments(run_dir: Path, view: str) -> dict:
    from flowscope.report.views import VIEWS
    from flowscope.store.layout import segment_files

    return {t: len(segment_files(run_dir, t)) for t in VIEWS[view][1]}


def _on_disk(run_dir: Path, keys: set[str]) -> None:
    """Wait until the task spans of ``keys`` are in the run's segments on disk."""
    from flowscope.store.run import Run

    deadline = time.monotonic() + WAIT_S
    while True:
        run = Run(run_dir)
        try:
            found = set(run.sql("SELECT DISTINCT task_key FROM spans WHERE kind = 'task'")["task_key"])
        finally:
            run.close()
        if keys <= found:
            return
        assert time.monotonic() < deadline, f"the spans of {sorted(keys - found)} never reached the disk"
        time.sleep(0.2)


def _at_rest(pg, run_dir: Path, view: str, expect):
    """Wait until the page shows the view of the run's segments as they are on disk, then return ``expect(run)``
    computed over those same segments (retried when a segment arrived meanwhile)."""
    from flowscope.store.run import Run

    deadline = time.monotonic() + WAIT_S
    while True:
        disk = _segments(run_dir, view)
        shown = pg.evaluate("() => window.flowscopeView && flowscopeView.doc && flowscopeView.doc.segments")
        if shown == disk:
            run = Run(run_dir)
            try:
                out = expect(run)
            finally:
                run.close()
            if _segments(run_dir, view) == disk:
                pg.wait_for_function("n => flowscopeView.renders >= n", arg=1, timeout=WAIT_MS)
                return out
        assert time.monotonic() < deadline, f"the {view} page never showed segments {disk} (shows {shown})"
        pg.wait_for_timeout(200)


def _cells(pg, rows: str, *cols: str) -> list[list]:
    """Per row matched by ``rows``: its data-* key (the first col, an attribute name) and the numbers of the cells
    with the other classes (their data-value)."""
    return pg.evaluate("""([rows, key, cols]) => Array.from(document.querySelectorAll(rows)).map(tr =>
        [tr.getAttribute(key)].concat(cols.map(c => { const td = tr.querySelector('td.' + c);
            return td && td.dataset.value !== undefined ? Number(td.dataset.value) : null; })))""",
                       [rows, cols[0], list(cols[1:])])


def _value(pg, selector: str) -> float:
    return float(pg.locator(selector).get_attribute("data-value"))


def expected_critical_path(run) -> dict:
    from flowscope.analysis.critical_path import (
        data_state_path,
        task_graph_paths,
        work_units,
    )
    from flowscope.analysis.dataflow import data_states_from_tasks
    from flowscope.analysis.message_path import message_path

    out = {"task": None, "data": None, "messages": None}
    units = work_units(run)
    tasks = int(units["task_key"].notna().sum())
    if tasks:
        tp = task_graph_paths(units, run.table("dependencies"), run.table("transfers"))
        out["task"] = tp.measured if tp.measured is not None else tp.structural
        out["structural"] = tp.structural
    states, mutations = run.table("data_states"), run.table("mutations")
    if states.empty and tasks:
        states, mutations = data_states_from_tasks(run)
    if len(states) and len(mutations):
        out["data"] = (len(states), data_state_path(states, mutations))
    transfers = run.sql("SELECT * FROM transfers WHERE attrs LIKE '%\"dst_call\"%'")
    if len(transfers):
        mp = message_path(run.table("spans"), transfers)
        out["messages"] = mp.path if mp is not None else None
    return out


def _check_path(pg, prefix: str, path) -> None:
    """The page's path ``prefix`` shows ``path``'s length, attribution and steps."""
    assert _value(pg, f"#{prefix}-length") == path.length_ns / 1e9
    for what, df in (("component", path.by_component()), ("application", path.by_application()),
                     ("location", path.by_location())):
        shown = _cells(pg, f"#{prefix} table.attribution.{what} tbody tr", "data-name", "seconds", "share", "steps")
        want = [[str(r[what]) if r[what] is not None else "", r["duration_ns"] / 1e9, float(r["share"]), int(r["steps"])]
                for r in df.to_dict("records")]
        assert shown == want, what
    ids = pg.evaluate(f"() => Array.from(document.querySelectorAll('#{prefix} table.steps tbody tr td.id'))"
                      ".map(td => td.textContent)")
    assert ids == [str(i) for i in path.steps["id"].head(500)]
    secs = _cells(pg, f"#{prefix} table.steps tbody tr", "data-id", "seconds")
    assert [s[1] for s in secs] == (path.steps["duration_ns"].head(500) / 1e9).tolist()


def check_critical_path_page(pg, run_dir: Path) -> dict:
    exp = _at_rest(pg, run_dir, "critical-path", expected_critical_path)
    if exp["task"] is not None:
        _check_path(pg, "cp-task", exp["task"])
        assert _value(pg, "#cp-task-structural") == exp["structural"].length_ns / 1e9
    else:
        assert pg.locator("#cp-task .nodata").count() == 1
    if exp["data"] is not None:
        n, dpath = exp["data"]
        assert _value(pg, "#cp-data-length") == dpath.length_ns / 1e9
        assert pg.locator("#cp-data-facts").get_attribute("data-states") == str(n)
        # the data-state graph is drawn, its path with every state of the analysis' path
        pg.wait_for_function("() => { const d = document.getElementById('cp-graph'); return d && d.data; }",
                             timeout=WAIT_MS)
        drawn = pg.evaluate("() => document.getElementById('cp-graph').data.find(t => t.name === 'critical path').x.length")
        assert drawn == len(dpath.ids)
    if exp["messages"] is not None:
        _check_path(pg, "cp-messages", exp["messages"])
    else:
        assert pg.locator("#cp-messages").count() == 0
    return exp


def expected_profile(run) -> dict:
    from flowscope.analysis.breakdown import breakdown, task_groups

    b = breakdown(run)
    return {"breakdown": b, "groups": task_groups(run)}


def check_profile_page(pg, run_dir: Path) -> dict:
    import math

    exp = _at_rest(pg, run_dir, "profile", expected_profile)
    b = exp["breakdown"]
    assert _value(pg, "#pf-makespan") == b.makespan_s
    shown = _cells(pg, "table.breakdown tbody tr", "data-category", "seconds", "bytes", "count")
    none = (lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    want = [[r["category"], none(r["seconds"]), none(r["bytes"]), none(r["count"])]
            for r in b.to_frame().to_dict("records")]
    assert shown == want
    g = exp["groups"]
    shown = _cells(pg, "table.groups tbody tr", "data-group", "count", "total", "mean", "max")
    assert shown == [[r["group"], r["count"], r["total_s"], r["mean_s"], r["max_s"]] for r in g.to_dict("records")]
    return exp


def expected_anomalies(run):
    from flowscope.analysis.anomalies.detect import detect_run
    from flowscope.report.anomalies import resource_ranking

    det = detect_run(run)
    a = det.anomalies.to_pandas()
    nsteps = int(det.step.max()) + 1 if len(det.step) else 0
    # the task keys of the calls HBOS must flag, whatever else the machine stretched
    task_keys = np.asarray(det.calls.table["task_key"].to_pylist(), object)
    alone = set(task_keys[alone_in_hbos_bin(np.asarray(det.calls.functions, object)[det.calls.func], det.values)])
    return a, (resource_ranking(a, nsteps) if len(a) else None), alone - {None}


def check_anomalies_ranking(pg, run_dir: Path):
    """The page's ranking against the analysis': (anomalies, ranking, task keys HBOS must flag)."""
    a, rank, alone = _at_rest(pg, run_dir, "anomalies", expected_anomalies)
    if rank is None:
        assert pg.locator("#view .nodata").count() == 1
        return a, rank, alone
    assert pg.locator("#an-facts").get_attribute("data-anomalies") == str(len(a))
    shown = _cells(pg, "table.ranking tbody tr", "data-resource", "mean", "std", "max", "min", "total")
    stat, n = pg.locator("#an-stat").input_value(), int(pg.locator("#an-n").input_value())
    side = pg.locator("#an-side").input_value()
    for row in shown:  # each resource's statistics are the analysis' numbers
        assert row[1:] == [float(rank.loc[row[0], k]) for k in ("mean", "std", "max", "min", "total")]
    col = ["mean", "std", "max", "min", "total"].index(stat) + 1
    want = sorted(rank[stat].tolist(), reverse=side == "top")[:n]
    assert [r[col] for r in shown] == want  # the top (bottom) N by the statistic
    return a, rank, alone


def expected_logs(run):
    return run.sql("""SELECT l.ts_ns, l.level, l.message, l.task_key, t."group" AS grp FROM logs l
                      LEFT JOIN (SELECT task_key, arg_max("group", end_ns) AS "group" FROM activity
                                 WHERE role = 'task' GROUP BY task_key) t USING (task_key)
                      ORDER BY l.ts_ns DESC""")


def check_logs_page(pg, run_dir: Path):
    from flowscope.store.layout import RUN_JSON, read_json

    logs = _at_rest(pg, run_dir, "logs", expected_logs)
    start = int(read_json(run_dir / RUN_JSON).get("start_ns") or 0)
    assert pg.locator("#lg-counts").get_attribute("data-total") == str(len(logs))
    rows = pg.evaluate("""() => Array.from(document.querySelectorAll('table.logs tbody tr')).map(tr =>
        [Number(tr.querySelector('td.t').dataset.value), tr.querySelector('td.level').textContent,
         tr.querySelector('td.message').textContent, tr.querySelector('td.task').textContent,
         tr.children[5].textContent])""")
    assert rows == [[(int(r.ts_ns) - start) / 1e9, r.level, r.message, r.task_key or "",
                     r.grp if r.task_key and isinstance(r.grp, str) else ""] for r in logs.itertuples()]
    return logs


def check_overview_extras(context, base: str, run_dir: Path) -> None:
    """The overview of the finished run: tasks finished per second, and network and disk per host, as the run's
    tables hold them."""
    from flowscope.store.run import Run

    run = Run(run_dir)
    try:
        t0 = int(run.meta["start_ns"])
        tasks = int(run.sql("SELECT count(*) AS n FROM activity WHERE role = 'task'")["n"].iloc[0])
        per = run.sql("SELECT (end_ns - ?) // 1000000000 AS s, count(*) AS n FROM activity WHERE role = 'task' "
                      "GROUP BY s ORDER BY s", [t0])
        hw = run.sql("""SELECT name, resource_id, count(*) AS n FROM metrics WHERE namespace = 'hardware'
                        AND name IN ('net.rx_bytes_per_s', 'net.tx_bytes_per_s', 'disk.read_bytes_per_s',
                                     'disk.write_bytes_per_s') AND isfinite(value) GROUP BY ALL""")
    finally:
        run.close()
    pg = _page(context)
    pg.goto(base, wait_until="load")
    pg.wait_for_function(f"() => {{ const s = window.flowscopeLive && flowscopeLive.summary(); return s && "
                         f"s.status === 'finished' && s.stream >= {tasks}; }}", timeout=WAIT_MS)
    shown = pg.evaluate("() => flowscopeLive.state.throughput")
    assert shown == {str(int(r.s)): int(r.n) for r in per.itertuples()}
    pg.wait_for_function("() => { const d = document.getElementById('throughput'); return d.data; }", timeout=WAIT_MS)
    bars = pg.evaluate("() => { const t = document.getElementById('throughput').data[0]; return [t.x, t.y]; }")
    assert bars == [[int(r.s) + 0.5 for r in per.itertuples()], [int(r.n) for r in per.itertuples()]]
    panel = {"net.rx_bytes_per_s": "net_rx", "net.tx_bytes_per_s": "net_tx", "disk.read_bytes_per_s": "disk_read",
             "disk.write_bytes_per_s": "disk_write"}
    series = pg.evaluate("() => flowscopeLive.state.metrics.series")
    for r in hw.itertuples():  # every sample of the table is drawn (a machine without physical disks has none)
        assert len(series[panel[r.name]][r.resource_id]["t"]) == r.n, r
    assert {panel[n] for n in set(hw["name"])} == set(series) & set(panel.values())
    drawn = pg.evaluate("() => document.getElementById('hosts').layout")
    titles = {v["title"]["text"] for k, v in drawn.items() if k.startswith("yaxis")}
    title = {"net.rx_bytes_per_s": "network received, MiB/s", "net.tx_bytes_per_s": "network sent, MiB/s",
             "disk.read_bytes_per_s": "disk read, MiB/s", "disk.write_bytes_per_s": "disk written, MiB/s"}
    assert {title[n] for n in set(hw["name"])} <= titles
    _shot(pg, "overview-finished")
    _no_markup_ran(pg)
    assert pg.errors == [] and pg.outside == []


# ---- the overview's panels: memory per worker process and the forecast ------------------------------------------

def _js_numbers(doc):
    """``doc`` as JavaScript holds it: integers beyond 2**53 (nanosecond times) are doubles there (and come back
    from the page as the shortest decimal of the double, which is not its exact value: both sides go to float)."""
    if isinstance(doc, bool) or doc is None:
        return doc
    if isinstance(doc, int):
        return float(doc) if abs(doc) > 2 ** 53 else doc
    if isinstance(doc, dict):
        return {k: _js_numbers(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_js_numbers(v) for v in doc]
    return doc


def _worker_ids(run_dir: Path) -> list[str]:
    """The resource ids of the run's Dask worker processes."""
    from flowscope.store.run import Run

    run = Run(run_dir)
    try:
        return sorted(run.sql("SELECT DISTINCT resource_id FROM resources WHERE kind = 'worker'")["resource_id"])
    finally:
        run.close()


def check_forecast_panel(pg, address: str, run_id: str, event: str = "idle", fraction: str = "0.25",
                         window: str | None = None) -> dict:
    """Wait until the overview's forecast panel shows what ``GET /v1/runs/RUN/forecast?event&fraction[&window]``
    answers now, then check every number it shows against that JSON; returns the JSON."""
    import httpx

    url = f"/v1/runs/{run_id}/forecast?event={event}&fraction={fraction}" + (f"&window={window}" if window else "")
    deadline = time.monotonic() + WAIT_S
    while True:
        r = httpx.get(address + url, timeout=60)
        assert r.status_code == 200, r.text
        want = _js_numbers(r.json())
        shown = _js_numbers(pg.evaluate("() => [flowscopePanels.forecast.url, flowscopePanels.forecast.doc]"))
        if shown == [url, want]:
            break
        assert time.monotonic() < deadline, f"the forecast panel never showed {url} as the route answers it"
        pg.wait_for_timeout(300)
    assert want["event"] == event and want["fraction"] == float(fraction)
    pg.wait_for_function("() => flowscopePanels.forecast.renders >= 1", timeout=WAIT_MS)
    hit = pg.locator("#fc-hit-rate")
    if want["hit_rate"] is None:
        assert hit.get_attribute("data-value") is None
    else:
        assert float(hit.get_attribute("data-value")) == want["hit_rate"]
        assert hit.inner_text().endswith(f" % ({want['hits']} of {want['judged']} frames)")
    assert want["judged"] == sum(f["hit"] is not None for f in want["frames"])
    assert want["hits"] == sum(bool(f["hit"]) for f in want["frames"])
    assert int(pg.locator("#fc-threshold").get_attribute("data-value")) == want["threshold"]
    assert int(pg.locator("#fc-window").get_attribute("data-value")) == want["window"]
    assert pg.locator("#fc-note").inner_text() == f"window {want['window_source']}: {want['note']}"
    nxt = pg.locator("#fc-next").get_attribute("data-value")
    assert (None if nxt is None else float(nxt)) == (want["next"]["likelihood"] if want["next"] else None)
    if want["frames"]:  # frame by frame: the predicted likelihood beside what happened
        t0 = want["signal"]["t0_ns"]
        drawn = pg.evaluate("() => document.getElementById('fc-chart').data.map(t => [t.name, t.x, t.y])")
        xs = [(f["start_ns"] - t0) / 1e9 for f in want["frames"]]
        assert drawn == [["predicted likelihood", xs, [f["likelihood"] for f in want["frames"]]],
                         ["observed", xs, [f["observed"] for f in want["frames"]]]]
    return want


def check_memory_panel(pg, run_dir: Path):
    """Wait until the overview's memory panel shows the ``memory`` view of the run's segments as they are on disk,
    then check it against :func:`flowscope.analysis.memory.process_memory_parts` over them (resident bytes, and
    Dask's managed and spilled bytes where recorded); returns that frame."""
    from flowscope.analysis.memory import MEMORY_PARTS, process_memory_parts
    from flowscope.store.run import Run

    deadline = time.monotonic() + WAIT_S
    while True:
        disk = _segments(run_dir, "memory")
        shown = pg.evaluate("() => flowscopePanels.memory.doc && flowscopePanels.memory.doc.segments")
        if shown == disk:
            run = Run(run_dir)
            try:
                want = process_memory_parts(run)
            finally:
                run.close()
            if _segments(run_dir, "memory") == disk:
                break
        assert time.monotonic() < deadline, f"the memory panel never showed segments {disk} (shows {shown})"
        pg.wait_for_timeout(300)
    from flowscope.store.layout import RUN_JSON, read_json

    t0 = int(read_json(run_dir / RUN_JSON)["start_ns"])
    doc = pg.evaluate("() => flowscopePanels.memory.doc.processes")
    expect = []
    for rid, part in want.groupby("resource_id", sort=True):
        p = {"resource_id": rid, "label": part["label"].iloc[0], "t": ((part["ts_ns"] - t0) / 1e9).tolist(),
             "bytes": part["bytes"].tolist()}
        p.update({c: [None if v != v else v for v in part[c].tolist()] for c in MEMORY_PARTS if part[c].notna().any()})
        expect.append(p)
    assert doc == expect
    if expect:
        pg.wait_for_function("() => flowscopePanels.memory.renders >= 1", timeout=WAIT_MS)
        drawn = pg.evaluate("() => document.getElementById('memory').data.map(t => [t.name, t.x, t.y])")
        detailed = any(c in p for p in expect for c in MEMORY_PARTS)
        names = {"bytes": "resident", "managed": "managed", "spilled": "spilled to disk"}
        assert drawn == [[p["label"] + (f" {names[c]}" if detailed else ""), p["t"],
                          [None if b is None else b / 2 ** 20 for b in p[c]]]
                         for p in expect for c in ("bytes", *MEMORY_PARTS) if c in p]
    return want


def _open(context, url: str):
    pg = _page(context)
    pg.goto(url, wait_until="load")
    pg.wait_for_function("() => window.flowscopeView && flowscopeView.doc", timeout=WAIT_MS)
    return pg


def _shot(pg, name: str) -> None:
    folder = os.environ.get(SCREENSHOTS_ENV)
    if folder:
        size = pg.viewport_size
        pg.set_viewport_size({"width": 1300, "height": 1000})  # the page's own height, not the viewport's
        pg.screenshot(path=str(Path(folder) / f"dashboard-{name}.png"), full_page=True)
        pg.set_viewport_size(size)


@pytest.mark.timeout(900)  # one cluster start for every page's checks, the overview's panels included
def test_analysis_pages_follow_a_live_dask_run_with_the_figures_of_the_analyses(collector, browser, tmp_path):  # noqa: F811
    from dask import delayed
    from distributed import Client, LocalCluster

    import flowscope
    from flowscope.sources import semantics
    from flowscope.sources.dask import register, unregister

    gate = str(tmp_path / "gate")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        fs = flowscope.Client(collector.address, name=RUN_NAME,
                              meta={"capture_level": "standard", "semantics": [semantics.DASK_DISTRIBUTED]})
        register(client, fs.address, fs.run_id)
        run_dir = Path(collector.store) / fs.run_id
        base = f"{collector.address}/ui/runs/{fs.run_id}"
        context = browser.new_context(viewport=WHOLE_PAGE)
        try:
            # phase 1: many calls of one function, some far slower (anomalies) and all of those on one worker (a
            # slowed worker), summed by one task
            slowed_worker = sorted(client.scheduler_info()["workers"])[0]
            parts = [client.submit(work, i, key=f"{IMG}-{i}", pure=True,
                                   workers=[slowed_worker] if i in SLOWED else None) for i in range(N_PARTS)]
            first = client.submit(total, *parts, key=f"{SCRIPT}-sum-1", pure=True)
            assert first.result() == sum(range(N_PARTS))  # kept: phase 2 depends on it
            fs.log(f"slow <b>bold</b> part {IMG}-{SLOW}", level="warning", task_key=f"{IMG}-{SLOW}")
            # this test's own process, which runs no task: its memory is no worker's
            fs.metric(PROCESS_MEMORY, 1.0, namespace="performance")
            fs.flush()

            cp = _open(context, f"{base}/critical-path")
            pf = _open(context, f"{base}/profile")
            an = _open(context, f"{base}/anomalies")
            lg = _open(context, f"{base}/logs")
            cp1 = check_critical_path_page(cp, run_dir)
            assert cp1["task"] is not None and cp1["data"] is not None
            # markup in task keys is text in the steps table
            assert f"{SCRIPT}-sum-1" in cp.evaluate("() => Array.from(document.querySelectorAll('#cp-task td.id'))"
                                                   ".map(td => td.textContent)")
            pf1 = check_profile_page(pf, run_dir)
            assert pf.locator(f"table.groups tr[data-group='{IMG}'] td.name").inner_text() == IMG
            a1, rank1, alone1 = check_anomalies_ranking(an, run_dir)
            assert rank1 is not None and len(a1) >= 1
            # while the run runs, every call alone in its bin is an anomaly (a slowed call is unless the machine
            # stretched another call of its function as far), and the slowed worker's thread ranks first
            assert alone1 <= set(a1["task_key"])
            slowed_on = set(a1.loc[a1["task_key"].isin({f"{IMG}-{i}" for i in SLOWED}), "resource_id"])
            assert len(slowed_on) == 1
            assert rank1.loc[slowed_on.pop(), "mean"] == rank1["mean"].max(), rank1
            first_shown = an.locator("table.ranking tbody tr").first.get_attribute("data-resource")
            assert rank1.loc[first_shown, "mean"] == rank1["mean"].max()
            logs1 = check_logs_page(lg, run_dir)
            assert len(logs1) >= 1
            assert lg.locator("table.logs td.message", has_text="slow").first.inner_text() == \
                f"slow <b>bold</b> part {IMG}-{SLOW}"  # the runtime logs too (Dask's long GC pauses): the one of this test
            updates = {n: p.evaluate("() => flowscopeView.updates") for n, p in
                       (("cp", cp), ("pf", pf), ("an", an), ("lg", lg))}
            # the overview's forecast of the live run is the route's, frame by frame
            ov = _page(context)
            ov.goto(base, wait_until="load")
            _on_disk(run_dir, {f"{IMG}-{i}" for i in range(N_PARTS)} | {f"{SCRIPT}-sum-1"})
            fc1 = check_forecast_panel(ov, collector.address, fs.run_id)
            assert fc1["resources"] >= 2 and fc1["frames"] and fc1["tasks"] == N_PARTS + 1
            pushes1 = ov.evaluate("() => flowscopePanels.forecast.pushes")
            # memory per worker process: both workers, sampled while the run runs
            workers = _worker_ids(run_dir)
            ov.wait_for_function("n => { const d = flowscopePanels.memory.doc; return d && d.processes.length === n; }",
                                 arg=len(workers), timeout=WAIT_MS)
            mem1 = ov.evaluate("() => flowscopePanels.memory.doc.processes.map(p => [p.resource_id, p.t.length])")
            assert sorted(m[0] for m in mem1) == workers and all(m[1] >= 1 for m in mem1)

            # phase 2: tasks held until the gate file exists, depending on phase 1's sum; then they finish
            held = [delayed(gated, pure=True)(first, gate, dask_key_name=f"held-{i}") for i in range(4)]
            second = delayed(total, pure=True)(*held, dask_key_name="sum-2")
            fut = client.compute(second)
            # while they are held, a warning about one of them reaches the logs page
            fs.log("held <i>up</i>", level="warning", task_key="held-0")
            fs.flush()
            held_logs = check_logs_page(lg, run_dir)
            assert not fut.done() and "held <i>up</i>" in set(held_logs["message"])
            assert lg.locator("table.logs td.message", has_text="held").first.inner_text() == "held <i>up</i>"
            Path(gate).touch()
            assert fut.result() == 4 * sum(range(N_PARTS))
            fs.log("second part done", level="warning", task_key="sum-2")
            fs.flush()
            _on_disk(run_dir, {f"held-{i}" for i in range(4)} | {"sum-2"})  # the workers send spans every 2 s
            cp2 = check_critical_path_page(cp, run_dir)
            assert cp2["task"].length_ns > cp1["task"].length_ns  # the path grew with the run
            assert "sum-2" in cp.evaluate("() => Array.from(document.querySelectorAll('#cp-task td.id'))"
                                          ".map(td => td.textContent)")
            pf2 = check_profile_page(pf, run_dir)
            assert pf2["breakdown"].tasks == pf1["breakdown"].tasks + 5
            check_anomalies_ranking(an, run_dir)
            logs2 = check_logs_page(lg, run_dir)
            assert len(logs2) > len(logs1)
            for n, p in (("cp", cp), ("pf", pf), ("lg", lg)):
                assert p.evaluate("() => flowscopeView.updates") > updates[n], n
            # the forecast followed the run as it grew, and its state and fraction are selectable (and in the URL)
            fc2 = check_forecast_panel(ov, collector.address, fs.run_id)
            assert fc2["signal"]["t1_ns"] > fc1["signal"]["t1_ns"] and fc2["tasks"] == fc1["tasks"] + 5
            # pushed, not asked for again: the panel's one socket brought each new answer
            assert ov.evaluate("() => flowscopePanels.forecast.connects") == 1
            assert ov.evaluate("() => flowscopePanels.forecast.pushes") > pushes1
            ov.select_option("#fc-event", "compute")
            ov.fill("#fc-fraction", "0.5")
            ov.locator("#fc-fraction").dispatch_event("change")
            fc3 = check_forecast_panel(ov, collector.address, fs.run_id, "compute", "0.5")
            assert fc3["threshold"] == -(-fc3["resources"] // 2) and parse_qs(urlsplit(ov.url).query) == {"event": ["compute"],
                                                                                 "fraction": ["0.5"]}
            # more memory samples of each worker arrived while the run went on
            ov.wait_for_function("m => flowscopePanels.memory.doc.processes.every(p => p.t.length > m[p.resource_id])",
                                 arg={k: n for k, n in mem1}, timeout=WAIT_MS)

            # click through: rank -> step -> call, each selection in the URL
            an.locator("table.ranking tbody tr").first.click()
            rid = an.locator("table.ranking tbody tr").first.get_attribute("data-resource")
            assert parse_qs(urlsplit(an.url).query)["resource"] == [rid]
            _shot(cp, "critical-path")
            _shot(pf, "profile")
            _shot(lg, "logs")
        finally:
            unregister(client)
            fs.close()

    check_overview_extras(context, base, run_dir)
    # the finished run's overview, opened from a link that names the forecast's state and fraction
    ov = _page(context)
    ov.goto(f"{base}?event=idle&fraction=0.5", wait_until="load")
    fc = check_forecast_panel(ov, collector.address, fs.run_id, "idle", "0.5")
    assert len(fc["frames"]) >= len(fc2["frames"]) and ov.locator("#fc-fraction").input_value() == "0.5"
    mem = check_memory_panel(ov, run_dir)
    assert sorted(set(mem["resource_id"])) == workers  # the test's own process is left out
    assert (mem["bytes"] > 2 ** 20).all()  # a Python process's resident memory, not the test's 1.0
    _shot(ov, "overview-panels")
    _no_markup_ran(ov)
    assert ov.errors == [] and ov.outside == [] and ov.evaluate("() => flowscopePanels.errors") == []
    a, _, _ = check_anomalies_ranking(an, run_dir)
    an.locator("table.ranking tbody tr").first.click()
    rid = an.locator("table.ranking tbody tr").first.get_attribute("data-resource")
    per = a[a["resource_id"] == rid].groupby("step").size()
    links = an.evaluate("() => Array.from(document.querySelectorAll('#an-step-links a')).map(a => "
                        "[Number(a.dataset.step), Number(a.dataset.count)])")
    assert links == [[int(s), int(n)] for s, n in per.items()]
    step = int(per.index[0])
    an.locator(f"#an-step-links a[data-step='{step}']").click()
    calls = an.evaluate("() => Array.from(document.querySelectorAll('table.step-anomalies tbody tr'))"
                        ".map(tr => Number(tr.dataset.call))")
    mine = a[(a["resource_id"] == rid) & (a["step"] == step)]
    assert calls == mine["call_id"].tolist()
    an.locator("table.step-anomalies tbody tr").first.click()
    call = mine.iloc[0]
    assert an.locator("#an-call-facts").get_attribute("data-call") == str(call["call_id"])
    assert an.locator("#an-call-stack").inner_text() == "call stack: " + " > ".join(call["call_stack"])
    # the function view's axes are selectable; the selection is in the URL too
    an.select_option("#an-x", "function")
    an.select_option("#an-y", "inclusive")
    an.wait_for_function("() => document.getElementById('an-functions-chart').layout.xaxis.type === 'category'",
                         timeout=WAIT_MS)
    # Chimbuko's function view: the calls of the selected resource in the selected step
    ys = an.evaluate("() => document.getElementById('an-functions-chart').data.find(t => t.name === 'anomaly').y")
    assert ys == (mine["inclusive_ns"] / 1e6).tolist()
    _shot(an, "anomalies")
    # the URL reopens the page as it was: resource, step, call and axes
    url = an.url
    assert parse_qs(urlsplit(url).query) == {"resource": [rid], "step": [str(step)], "call": [str(call["call_id"])],
                                             "x": ["function"], "y": ["inclusive"]}
    again = _open(context, url)
    again.wait_for_function("() => document.getElementById('an-call-facts')", timeout=WAIT_MS)
    assert again.locator("#an-call-facts").get_attribute("data-call") == str(call["call_id"])
    assert again.locator("#an-x").input_value() == "function"
    # logs filtered by a task, by its link; the URL keeps the filter
    lg.locator("table.logs td.task a", has_text=f"{IMG}-{SLOW}").first.click()
    assert parse_qs(urlsplit(lg.url).query) == {"task": [f"{IMG}-{SLOW}"]}
    assert lg.locator("table.logs tbody tr").count() == 1
    for pg in (cp, pf, an, lg, again):
        _no_markup_ran(pg)
        assert pg.errors == [] and pg.outside == [] and pg.evaluate("() => flowscopeView.errors") == []
    context.close()


@pytest.fixture(scope="module")
def imported_store(tmp_path_factory, shared_data) -> tuple[Path, dict]:
    from flowscope.importers import import_paths

    store = tmp_path_factory.mktemp("pages-store")
    runs = {}
    for name, path, fmt in (("starpu", shared_data / "paje" / "starpu-demo" / "paje.trace", "paje"),
                            ("otf2", shared_data / "otf2" / "ping-pong-otf2" / "traces.otf2", None)):
        res = import_paths([path], store, fmt=fmt, name=f"{name} {IMG}")
        runs[name] = res.run_id
    return store, runs


@pytest.fixture(scope="module")
def ui_server(imported_store):
    store, _ = imported_store
    with flowscope_ui(store) as address:
        yield address


@pytest.mark.parametrize("source", ["starpu", "otf2"])
def test_analysis_pages_of_imported_traces_show_the_figures_of_the_analyses(source, imported_store, ui_server,
                                                                            browser):  # noqa: F811
    store, runs = imported_store
    run_dir = store / runs[source]
    context = browser.new_context(viewport=WHOLE_PAGE)
    base = f"{ui_server}/ui/runs/{runs[source]}"
    cp = _open(context, f"{base}/critical-path")
    exp = check_critical_path_page(cp, run_dir)
    if source == "starpu":  # StarPU's tasks.rec gives the task graph
        assert exp["task"] is not None and exp["task"].length_ns > 0
    else:  # MPI: the path through messages, with its wait states
        assert exp["messages"] is not None and exp["messages"].length_ns > 0
    pf = _open(context, f"{base}/profile")
    exp = check_profile_page(pf, run_dir)
    assert len(exp["groups"]) >= 1
    an = _open(context, f"{base}/anomalies?stat=total&side=bottom&n=3")
    check_anomalies_ranking(an, run_dir)
    lg = _open(context, f"{base}/logs")
    check_logs_page(lg, run_dir)
    # the pages link to each other, the overview included
    hrefs = cp.evaluate("() => Array.from(document.querySelectorAll('#run-nav a')).map(a => a.getAttribute('href'))")
    assert hrefs == [f"/ui/runs/{runs[source]}"] + [f"/ui/runs/{runs[source]}/{p}" for p in
                                                     ("advisor", "critical-path", "profile", "charts", "anomalies", "logs")]
    for pg in (cp, pf, an, lg):
        _no_markup_ran(pg)
        assert pg.errors == [] and pg.outside == []
    context.close()


def test_the_forecast_panels_frame_size_is_chosen_on_the_page(imported_store, ui_server, browser):  # noqa: F811
    """The overview's forecast panel takes a frame size in samples (kept in the address, ?window=N): the answer is
    the route's for that window, and clearing it goes back to the model's or the default window."""
    from urllib.parse import parse_qs, urlsplit

    store, runs = imported_store
    context = browser.new_context(viewport=WHOLE_PAGE)
    ov = _page(context)
    ov.goto(f"{ui_server}/ui/runs/{runs['starpu']}?event=idle&fraction=0.5&window=9", wait_until="load")
    ov.locator("#fc-chart").scroll_into_view_if_needed()
    fc = check_forecast_panel(ov, ui_server, runs["starpu"], "idle", "0.5", "9")
    assert (fc["window"], fc["window_source"]) == (9, "given")
    assert ov.locator("#fc-window-size").input_value() == "9"
    ov.fill("#fc-window-size", "")
    ov.locator("#fc-window-size").dispatch_event("change")
    fc = check_forecast_panel(ov, ui_server, runs["starpu"], "idle", "0.5")
    assert fc["window_source"] == "default" and "window" not in parse_qs(urlsplit(ov.url).query)
    ov.fill("#fc-window-size", "0")
    ov.locator("#fc-window-size").dispatch_event("change")
    ov.wait_for_function("() => flowscopePanels.forecast.invalid !== null")
    assert ov.locator("#fc-error").inner_text() == "window: a whole number of samples, 1 or more (empty: the model's or the default)"
    # what the server is asked is the query last committed and found valid, never the field's refused value
    # (the panel's own tick asked for window=0 once, and the server's refusal replaced the page's message)
    ov.evaluate("() => flowscopePanels.refreshForecast()")
    assert "window" not in ov.evaluate("() => flowscopePanels.forecast.url")
    assert ov.errors == []
    context.close()


@pytest.mark.parametrize("source", ["starpu", "otf2"])
def test_every_page_passes_an_accessibility_audit(source, imported_store, ui_server, browser):  # noqa: F811
    """axe-core (the audit engine of Chrome's Lighthouse, bundled by axe-playwright-python) on the runs list, the
    overview and every analysis page: no violation rated serious or critical (a form control without a name, a
    progress bar a screen reader cannot name, text too pale to read)."""
    from axe_playwright_python.sync_playwright import Axe

    store, runs = imported_store
    context = browser.new_context(viewport=WHOLE_PAGE)
    axe = Axe()
    found = {}
    for page in ["/ui/", f"/ui/runs/{runs[source]}", *(f"/ui/runs/{runs[source]}/{p}" for p in
                                                       ("advisor", "critical-path", "profile", "charts", "anomalies",
                                                        "logs"))]:
        pg = _page(context)
        pg.goto(f"{ui_server}{page}", wait_until="load")
        if page == "/ui/":
            pg.wait_for_function("() => window.flowscopeRuns && flowscopeRuns.refreshes > 0", timeout=WAIT_MS)
        elif page.count("/") == 3:
            pg.wait_for_function("() => window.flowscopeLive && flowscopeLive.snapshots > 0", timeout=WAIT_MS)
        else:
            pg.wait_for_function("() => window.flowscopeView && flowscopeView.renders > 0", timeout=WAIT_MS)
        bad = [(v["id"], v["impact"], [n["target"] for n in v["nodes"][:3]])
               for v in axe.run(pg).response["violations"] if v["impact"] in ("serious", "critical")]
        if bad:
            found[page] = bad
        pg.close()
    context.close()
    assert not found, found


def test_a_page_drawn_again_keeps_the_focus_the_typing_and_the_zoom(imported_store, ui_server, browser):  # noqa: F811
    """A live analysis page is drawn again whenever the run changed: what a person was doing survives it. The
    element with the keyboard focus has it again (found by id, by the row's key, else by its place), a filter being
    typed keeps its text, and a chart zoomed in stays zoomed."""
    store, runs = imported_store
    context = browser.new_context(viewport=WHOLE_PAGE)
    base = f"{ui_server}/ui/runs/{runs['starpu']}"

    def again(pg) -> None:
        n = pg.evaluate("() => flowscopeView.renders")
        pg.evaluate("() => flowscopeView.render()")
        pg.wait_for_function("n => flowscopeView.renders > n", arg=n)

    cp = _open(context, f"{base}/critical-path")
    link = cp.locator("#cp-task table.steps tbody tr td.id a").nth(2)
    key = link.text_content()
    link.focus()
    cp.evaluate("() => Plotly.relayout('cp-task-chart', {'xaxis.range': [0.001, 0.002]})")
    again(cp)
    assert cp.evaluate("() => [document.activeElement.tagName, document.activeElement.textContent,"
                       " document.getElementById('view').contains(document.activeElement)]") == ["A", key, True]
    cp.keyboard.press("Tab")  # the keyboard goes on from there: the next step's link
    assert cp.evaluate("() => document.activeElement.textContent") == \
        cp.locator("#cp-task table.steps tbody tr td.id a").nth(3).text_content()
    assert cp.evaluate("() => document.getElementById('cp-task-chart').layout.xaxis.range") == [0.001, 0.002]

    lg = _open(context, f"{base}/logs")
    lg.focus("#lg-task")
    lg.keyboard.type("ta")  # not committed (no Enter, no blur): not in the address yet
    again(lg)
    assert lg.evaluate("() => [document.activeElement.id, document.activeElement.value]") == ["lg-task", "ta"]
    lg.keyboard.type("sk")
    assert lg.evaluate("() => document.activeElement.value") == "task"

    # a ranking row picked with Enter: the page is drawn again with the pick, and the focus is on that row still
    an = _open(context, f"{base}/anomalies?n=50")
    rows = an.locator("#an-ranking tbody tr[data-resource]")
    assert rows.count() >= 2
    picked = rows.nth(1).get_attribute("data-resource")
    rows.nth(1).focus()
    n = an.evaluate("() => flowscopeView.renders")
    an.keyboard.press("Enter")
    an.wait_for_function("n => flowscopeView.renders > n", arg=n)
    assert an.evaluate("() => new URLSearchParams(location.search).get('resource')") == picked
    assert an.evaluate("() => document.activeElement.getAttribute('data-resource')") == picked
    for pg in (cp, lg, an):
        assert pg.errors == []
    context.close()


@pytest.mark.parametrize("source", ["starpu", "otf2"])
def test_the_advisor_page_shows_where_the_time_went_and_the_findings_of_flowscope_explain(source, imported_store,
                                                                                         ui_server, browser):  # noqa: F811
    """The advisor's page: the makespan's attribution and the findings ranked by recoverable time, each with its
    change and evidence, the figures `flowscope explain` computes on the same run (read from the page's cells)."""
    from flowscope.analysis.advisor import explain
    from flowscope.store.run import open_run

    store, runs = imported_store
    want = explain(open_run(store / runs[source])).to_dict()
    context = browser.new_context(viewport=WHOLE_PAGE)
    pg = _open(context, f"{ui_server}/ui/runs/{runs[source]}/advisor")
    rows = pg.evaluate("() => Array.from(document.querySelectorAll('#adv-attribution tbody tr')).map(tr => "
                       "[tr.cells[0].textContent, Number(tr.cells[1].dataset.value)])")
    assert rows == [[a["label"], pytest.approx(a["seconds"], rel=1e-9)] for a in want["attribution"]]
    assert len(rows) >= 2
    got = pg.evaluate("() => Array.from(document.querySelectorAll('#adv-findings .finding')).map(f => ({title: "
                      "f.querySelector('h3').textContent, rec: f.dataset.recoverable, change: "
                      "f.querySelector('.change').textContent, evidence: f.querySelectorAll('tbody tr').length}))")
    assert [g["title"] for g in got] == [f["title"] for f in want["findings"]]
    assert [None if g["rec"] == "" else float(g["rec"]) for g in got] == \
        [None if f["recoverable_s"] is None else pytest.approx(f["recoverable_s"], rel=1e-9) for f in want["findings"]]
    assert [g["change"] for g in got] == [f["change"] for f in want["findings"]]
    assert all(g["evidence"] == min(len(f["evidence"]), 20) for g, f in zip(got, want["findings"]))
    _no_markup_ran(pg)
    assert pg.errors == [] and pg.outside == []
    context.close()


@pytest.mark.parametrize("source", ["starpu", "otf2"])
def test_the_overview_opens_with_the_advisors_top_findings(source, imported_store, ui_server, browser):  # noqa: F811
    """The run overview's first panel: the advisor's attribution and its first three findings, as `flowscope explain`
    computes them, with the link to the advisor's page."""
    from flowscope.analysis.advisor import explain
    from flowscope.store.run import open_run

    store, runs = imported_store
    want = explain(open_run(store / runs[source])).to_dict()
    context = browser.new_context(viewport=WHOLE_PAGE)
    pg = _page(context)
    pg.goto(f"{ui_server}/ui/runs/{runs[source]}", wait_until="load")
    pg.wait_for_function("() => window.flowscopePanels && flowscopePanels.advisor.renders > 0", timeout=WAIT_MS)
    first = pg.evaluate("() => document.querySelector('main section').id")
    assert first == "advisor-panel"
    got = pg.evaluate("() => Array.from(document.querySelectorAll('#advisor-panel .finding')).map(f => "
                      "[f.querySelector('.title').textContent, f.dataset.recoverable, f.querySelector('.change').textContent])")
    got = [[g[0], float(g[1]) if g[1] else None, g[2]] for g in got]
    assert got == [[f["title"], None if f["recoverable_s"] is None else pytest.approx(f["recoverable_s"], rel=1e-9),
                    f["change"]] for f in want["findings"][:3]]
    assert len(got) >= 1
    shares = pg.evaluate("() => Array.from(document.querySelectorAll('#advisor-panel .attribution td.seconds'))"
                         ".map(td => Number(td.dataset.value))")
    assert shares == [pytest.approx(a["seconds"], rel=1e-9) for a in want["attribution"]]
    assert pg.locator("#advisor-panel a.to-advisor").get_attribute("href") == f"/ui/runs/{runs[source]}/advisor"
    _no_markup_ran(pg)
    assert pg.errors == [] and pg.outside == [] and pg.evaluate("() => flowscopePanels.errors") == []
    context.close()


def test_a_page_that_does_not_exist_is_refused_naming_it(ui_server, imported_store):
    import httpx

    _, runs = imported_store
    r = httpx.get(f"{ui_server}/ui/runs/{runs['otf2']}/nonsense", timeout=30)
    assert r.status_code == 404 and "nonsense" in r.json()["error"]
    r = httpx.get(f"{ui_server}/v1/ui/runs/{runs['otf2']}/views/nonsense", timeout=30)
    assert r.status_code == 400 and r.json()["error"].startswith("view:")
    r = httpx.get(f"{ui_server}/v1/ui/runs/{runs['otf2']}/views/profile", timeout=60)
    assert r.status_code == 200 and r.json()["view"] == "profile"


def test_flowscope_ui_serves_the_forecast_and_the_memory_view_of_its_runs(ui_server, imported_store):
    """The overview's panels read the same routes under `flowscope ui` (no collector) as under `flowscope serve`."""
    import httpx

    from flowscope.analysis.forecast import predict
    from flowscope.store.run import Run

    store, runs = imported_store
    r = httpx.get(f"{ui_server}/v1/runs/{runs['starpu']}/forecast?event=compute&fraction=0.5", timeout=120)
    assert r.status_code == 200, r.text
    run = Run(store / runs["starpu"])
    try:
        want = predict(run, "compute", 0.5).as_dict()
    finally:
        run.close()
    assert r.json() == want and len(want["frames"]) > 1
    r = httpx.get(f"{ui_server}/v1/runs/{runs['starpu']}/forecast?event=compute&fraction=2", timeout=30)
    assert r.status_code == 400 and r.json()["field"] == "fraction"
    r = httpx.get(f"{ui_server}/v1/runs/{runs['starpu']}-gone/forecast", timeout=30)
    assert r.status_code == 404 and r.json()["field"] == "run"
    # a trace with no per-process memory samples: the view says so with an empty list
    r = httpx.get(f"{ui_server}/v1/ui/runs/{runs['otf2']}/views/memory", timeout=60)
    assert r.status_code == 200 and r.json()["processes"] == [] and r.json()["metric"] == PROCESS_MEMORY


def test_the_overview_draws_its_charts_again_only_when_what_they_show_changed(imported_store, ui_server, browser):  # noqa: F811
    """The forecast comes again whenever the server's answer may have changed, but a prediction the same as the one
    drawn is not drawn again (a plotly redraw costs a watching page more than anything else it does); another state or fraction
    is."""
    store, runs = imported_store
    context = browser.new_context(viewport=WHOLE_PAGE)
    pg = _page(context)
    pg.goto(f"{ui_server}/ui/runs/{runs['starpu']}?event=compute&fraction=0.5", wait_until="load")
    pg.wait_for_function("() => flowscopePanels.forecast.renders >= 1 && !flowscopePanels.forecast.pending",
                         timeout=WAIT_MS)
    before = pg.evaluate("() => [flowscopePanels.forecast.connects, flowscopePanels.forecast.renders]")
    pg.evaluate("() => flowscopePanels.refreshForecast().then(() => flowscopePanels.refreshForecast())")
    after = pg.evaluate("() => [flowscopePanels.forecast.connects, flowscopePanels.forecast.renders]")
    assert after == [before[0] + 2, before[1]]
    pg.locator("#fc-fraction").fill("0.25")
    pg.locator("#fc-fraction").dispatch_event("change")
    pg.wait_for_function(f"() => flowscopePanels.forecast.renders > {before[1]} && !flowscopePanels.forecast.pending",
                         timeout=WAIT_MS)
    assert pg.evaluate("() => flowscopePanels.forecast.url").endswith("fraction=0.25")
    assert pg.errors == [] and pg.outside == [] and pg.evaluate("() => flowscopePanels.errors") == []
    context.close()


def test_the_overviews_charts_keep_to_a_share_of_the_pages_time(imported_store, ui_server, browser):  # noqa: F811
    """A plotly chart costs a watching page far more than the task stream's partial redraws: once the charts took
    d ms to draw, they are drawn again for new data no sooner than d / share ms later (and never more than once
    a second). The page's clock, frames and timers are replaced by counting ones: nothing here waits."""
    store, runs = imported_store
    context = browser.new_context(viewport=WHOLE_PAGE)
    pg = _page(context)
    pg.goto(f"{ui_server}/ui/runs/{runs['starpu']}", wait_until="load")
    pg.wait_for_function("() => window.Plotly && document.getElementById('throughput').data", timeout=WAIT_MS)
    got = pg.evaluate("""() => {
        const L = flowscopeLive, C = L.charts;
        let now = 100000;
        performance.now = () => now;
        const timers = [];
        window.setTimeout = (f, ms) => { timers.push(ms); return 1; };
        window.requestAnimationFrame = (f) => { f(); return 1; };
        const out = {share: C.share, minMs: C.minMs};
        // the last drawing of the charts took 200 ms and ended just now; the throughput chart has new data
        C.cost = 200; C.last = now; C.timer = 0; C.throughput = true;
        now += 300;
        L.requestRender();
        out.wait = timers.slice(-1)[0];
        // a cheap drawing: the floor of a second
        C.cost = 5; C.last = now; C.timer = 0; timers.length = 0;
        now += 300;
        L.requestRender();
        out.cheapWait = timers.slice(-1)[0];
        return out;
    }""")
    assert 0 < got["share"] < 1 and got["minMs"] == 1000
    assert got["wait"] == pytest.approx(200 / got["share"] - 300)
    assert got["cheapWait"] == pytest.approx(1000 - 300)
    context.close()


def test_the_overviews_charts_and_forecast_wait_until_they_are_scrolled_into_view(imported_store, ui_server, browser):  # noqa: F811
    """A chart or panel below the fold costs nothing: the throughput and host charts are not drawn, the forecast
    is not asked of the server (a prediction it would compute) and the memory view not subscribed until the user
    scrolls to them; then they are, at once. An empty page (its run's view not arrived yet) has every panel in view
    and still asks for nothing. Nothing here waits on time: each check waits for the page's own passes."""
    store, runs = imported_store
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    # the run's view is held back: the page stays empty, and an empty page has every panel in view
    held = []

    def live_socket(ws):
        ws.connect_to_server().on_message(lambda m: held.append(m))

    context.route_web_socket(re.compile(r"/v1/ui/runs/[^/]+/live(\?.*)?$"), live_socket)
    pg = _page(context)
    pg.goto(f"{ui_server}/ui/runs/{runs['starpu']}", wait_until="load")
    pg.wait_for_function("() => flowscopePanels.forecast.deferred >= 3", timeout=WAIT_MS)
    empty = pg.evaluate("() => [flowscopeLive.snapshots, flowscopePanels.forecast.connects, "
                        "flowscopePanels.memory.connected, flowscopeLive.plotly.state]")
    assert empty == [0, 0, False, "none"]  # nothing asked of the server or loaded for an empty page
    context.close()
    context = browser.new_context(viewport={"width": 1300, "height": 400})
    pg = _page(context)
    pg.goto(f"{ui_server}/ui/runs/{runs['starpu']}", wait_until="load")
    # the stream drawn, plotly loaded, and the forecast's ticks passed over it while it was out of view
    pg.wait_for_function("() => window.Plotly && flowscopeLive.timeline && flowscopeLive.renders >= 2 && "
                         "flowscopePanels.forecast.deferred >= 2", timeout=WAIT_MS)
    hidden = pg.evaluate("""() => ({fetches: flowscopePanels.forecast.connects, memory: flowscopePanels.memory.connected,
        throughput: !!document.getElementById('throughput').data, hosts: !!document.getElementById('hosts').data,
        pending: flowscopeLive.charts.throughput})""")
    assert hidden == {"fetches": 0, "memory": False, "throughput": False, "hosts": False, "pending": True}
    pg.locator("#throughput").scroll_into_view_if_needed()
    pg.wait_for_function("() => !!document.getElementById('throughput').data", timeout=WAIT_MS)
    assert pg.evaluate("() => flowscopePanels.forecast.connects") == 0  # still out of view
    pg.locator("#fc-chart").scroll_into_view_if_needed()
    pg.wait_for_function("() => flowscopePanels.forecast.renders >= 1 && flowscopePanels.forecast.connects >= 1",
                         timeout=WAIT_MS)
    assert pg.evaluate("() => document.getElementById('fc-chart').data.length") == 2
    assert pg.errors == [] and pg.outside == [] and pg.evaluate("() => flowscopePanels.errors") == []
    context.close()
