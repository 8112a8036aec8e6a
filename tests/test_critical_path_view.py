"""The critical-path view at scale: the report (the pages file) of a run with a 100,000-state data-state graph
draws it on the critical-path page collapsed by application in headless Chromium, with the critical path in full;
the dashboard's page (served by a real `flowscope ui`, and offline in the report) and report/critical_path.py's
graph view expand a group on demand; the GraphML and JSON exports read back with networkx and json.load."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import networkx as nx
import numpy as np
import pytest
from conftest import shared_browser
from test_dashboard import flowscope_ui
from test_report import open_page, open_view

import flowscope
from flowscope.analysis.critical_path import data_state_path
from flowscope.report import write_report
from flowscope.report.critical_path import GraphLayout, graph_view, to_graphml, to_json
from flowscope.sim.dag import layered_dag

N_STATES, N_MUTATIONS = 100_000, 150_000
# a guard against a page that never finishes drawing, not a speed target (those are measured, not asserted)
OPEN_SECONDS = 120
GRAPH = "fig-critical-path-graph"


def _run(tmp_path: Path, n: int, m: int, seed: int = 3) -> Path:
    """A run holding a random layered data-state graph (7 applications, 16 locations), recorded through the
    client's table API into an embedded collector."""
    states, muts = layered_dag(n, m, seed=seed)
    fs = flowscope.Client("embedded", store=tmp_path / "store", name="wcp-view")
    ds = fs.data_states(batch=10 * (n + m))
    ds.add(states, muts)
    ds.flush()
    fs.close()
    return Path(fs.run_dir)


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("big"), N_STATES, N_MUTATIONS)


def test_a_100k_state_graph_opens_collapsed_on_the_critical_path_page(big_run, tmp_path):
    """The critical-path page of the report: one mark per application (its states counted), the mutations between
    groups, and the critical path drawn in full over them, each state of it named."""
    run = flowscope.open_run(big_run)
    states, muts = run.table("data_states"), run.table("mutations")
    assert (len(states), len(muts)) == (N_STATES, N_MUTATIONS)
    path = data_state_path(states, muts)
    t0 = time.perf_counter()
    report = write_report(big_run, tmp_path / "report.html")
    print(f"write_report of {N_STATES:,} states: {time.perf_counter() - t0:.1f} s")
    sizes = states.groupby("origin").size()

    t0 = time.perf_counter()
    with open_view(report, "critical-path") as (page, console, errors):
        page.wait_for_function("() => { const d = document.getElementById('cp-graph'); return d && d.calcdata; }",
                               timeout=OPEN_SECONDS * 1000)
        print(f"opened and drawn in {time.perf_counter() - t0:.1f} s")
        traces = page.evaluate("() => document.getElementById('cp-graph').data.map(t => [t.name, t.x.length])")
        names = [t[0] for t in traces]
        assert names == ["mutations between groups", "groups (collapsed)", "critical path"], names
        assert traces[1][1] == len(sizes), "one vertex per application"
        assert traces[2][1] == len(path.ids), "the critical path is drawn in full"
        assert page.evaluate("() => document.getElementById('cp-graph').data[2].text") == path.ids
        groups = page.evaluate("() => document.getElementById('cp-graph').data[1].text")
        assert groups == [f"{g}: {c:,} states" for g, c in sizes.items()]
        assert float(page.locator("#cp-data-length").get_attribute("data-value")) == path.length_ns / 1e9
        bad = [m for m in console if m[0] == "error"] + errors
        assert not bad, bad


def _expected_group(states, muts, group: str) -> dict:
    """What expanding ``group`` must draw: its states, the locations among them, the mutations ending there."""
    mine = states.loc[states["origin"] == group]
    return {"states": len(mine), "locations": mine["location"].nunique(),
            "inputs": int(muts["dst_state_id"].isin(mine["state_id"]).sum()),
            "ids": set(mine["state_id"].astype(str))}


def _traces(page) -> list:
    return page.evaluate("() => document.getElementById('cp-graph').data.map(t => [t.name, t.x.length])")


def _check_expanded(page, group: str, want: dict, path) -> None:
    """The page's graph holds ``group`` expanded: its states (coloured by location, each named), the mutations
    ending there, and the critical path last."""
    page.wait_for_function("n => { const d = document.getElementById('cp-graph');"
                           "return d && d.data && d.data.some(t => t.name === n); }",
                           arg=f"{group} ({want['states']:,} states)", timeout=OPEN_SECONDS * 1000)
    by_name = {t[0]: t[1] for t in _traces(page)}
    assert by_name[f"{group} ({want['states']:,} states)"] == want["states"]
    assert by_name[f"{group}: inputs"] == 3 * want["inputs"]
    assert _traces(page)[-1] == ["critical path", len(path.ids)], "the path stays on top"
    drawn = page.evaluate("n => { const t = document.getElementById('cp-graph').data.find(t => t.name === n);"
                          "return [t.text, new Set(t.marker.color).size]; }", f"{group} ({want['states']:,} states)")
    assert set(drawn[0]) == want["ids"]
    assert drawn[1] == want["locations"]


def _expand_and_collapse(page, states, muts, path, sizes) -> None:
    """On the critical-path page: the group control lists every group; expanding the second draws it and keeps it
    in the page's address; a re-render (a live update) keeps it; collapsing removes it from the graph and the
    address."""
    page.wait_for_function("() => { const d = document.getElementById('cp-graph'); return d && d.data; }",
                           timeout=OPEN_SECONDS * 1000)
    assert [t[0] for t in _traces(page)] == ["mutations between groups", "groups (collapsed)", "critical path"]
    options = page.evaluate("() => Array.from(document.querySelectorAll('#cp-graph-group option'))"
                            ".map(o => o.textContent)")
    assert options == [f"{g} ({c:,} states)" for g, c in sizes.items()]
    group = sizes.index[1]
    want = _expected_group(states, muts, group)
    page.select_option("#cp-graph-group", label=f"{group} ({sizes[group]:,} states)")
    page.click("#cp-graph-expand")
    _check_expanded(page, group, want, path)
    assert page.evaluate("() => new URLSearchParams(location.search).getAll('expand')") == [group]
    renders = page.evaluate("() => flowscopeView.renders")
    page.evaluate("() => flowscopeView.render()")  # what a live update does: the page drawn again
    page.wait_for_function("n => flowscopeView.renders > n", arg=renders)
    _check_expanded(page, group, want, path)
    page.click("#cp-graph-collapse")
    page.wait_for_function("() => document.getElementById('cp-graph').data.length === 3")
    assert page.evaluate("() => new URLSearchParams(location.search).getAll('expand')") == []


def test_the_dashboard_page_expands_a_group_on_demand(big_run):
    """A real `flowscope ui` over the run's store: the critical-path page of the 100,000 states opens collapsed,
    expands an application into its states on demand (fetched from the server), keeps it across a re-render and
    in its address (a deep link reopens the page with it expanded), and collapses it again."""
    run = flowscope.open_run(big_run)
    states, muts = run.table("data_states"), run.table("mutations")
    path = data_state_path(states, muts)
    sizes = states.groupby("origin").size()
    with flowscope_ui(big_run.parent) as address:
        page = shared_browser().new_page(viewport={"width": 1400, "height": 900})
        errors: list = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            url = f"{address}/ui/runs/{big_run.name}/critical-path"
            page.goto(url)
            _expand_and_collapse(page, states, muts, path, sizes)
            group = sizes.index[2]
            page.goto(f"{url}?expand={group}")  # a deep link to the page with a group expanded
            _check_expanded(page, group, _expected_group(states, muts, group), path)
            assert page.evaluate("() => flowscopeView.errors") == []
        finally:
            page.close()
        assert not errors, errors
        # the route itself: a group that is not there, and none given, are refused saying so
        base = f"{address}/v1/ui/runs/{big_run.name}/views/critical-path/group"
        r = httpx.get(base, params={"group": "<b>nope</b>"}, timeout=60)
        assert r.status_code == 404 and "'<b>nope</b>'" in r.json()["error"] and sizes.index[0] in r.json()["error"]
        r = httpx.get(base, timeout=60)
        assert r.status_code == 400 and r.json()["error"].startswith("group: missing")


def test_the_reports_critical_path_page_expands_a_group_offline(big_run, tmp_path):
    """The report (the pages file) holds each group's states: its critical-path page expands one without a
    request leaving the file."""
    run = flowscope.open_run(big_run)
    states, muts = run.table("data_states"), run.table("mutations")
    path = data_state_path(states, muts)
    sizes = states.groupby("origin").size()
    report = write_report(big_run, tmp_path / "report.html")
    blocked: list = []
    with open_view(report, "critical-path", blocked) as (page, console, errors):
        _expand_and_collapse(page, states, muts, path, sizes)
        bad = [m for m in console if m[0] == "error"] + errors + page.evaluate("() => flowscopeView.errors")
        assert not bad, bad
    assert not blocked, blocked


def test_a_report_too_large_to_hold_its_graph_says_where_to_expand_it(big_run, tmp_path, monkeypatch):
    """Above OFFLINE_GRAPH_STATES the file holds no group's states: expanding one says to open the run with
    flowscope ui, and the page goes on working."""
    from flowscope.report import run_pages

    monkeypatch.setattr(run_pages, "OFFLINE_GRAPH_STATES", 1_000)
    report = write_report(big_run, tmp_path / "report.html")
    with open_view(report, "critical-path") as (page, console, errors):
        page.wait_for_function("() => { const d = document.getElementById('cp-graph'); return d && d.data; }",
                               timeout=OPEN_SECONDS * 1000)
        page.click("#cp-graph-expand")
        page.wait_for_function("() => document.getElementById('cp-graph-status').textContent.includes('could not')")
        said = page.locator("#cp-graph-status").inner_text()
        assert "more than a file holds (1,000)" in said and "flowscope ui" in said, said
        assert [t[0] for t in _traces(page)] == ["mutations between groups", "groups (collapsed)", "critical path"]
        assert not errors and page.evaluate("() => flowscopeView.errors") == []


def test_the_graph_view_expands_a_group_on_demand(big_run, tmp_path):
    """report/critical_path.py's graph view of the 100,000 states, on a page of its own: it opens collapsed by
    application, expands one into its states (coloured by location) and the mutations ending there, with the path
    kept on top, and collapses again. (The dashboard's critical-path page draws the collapsed graph only.)"""
    from flowscope.report.snapshot import asset_text

    run = flowscope.open_run(big_run)
    states, muts = run.table("data_states"), run.table("mutations")
    path = data_state_path(states, muts)
    sizes = states.groupby("origin").size()
    report = tmp_path / "graph.html"
    report.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><script>{asset_text('plotly.min.js')}</script></head>"
                      f"<body>{graph_view(states, muts, path, div_id=GRAPH)}</body></html>", encoding="utf-8")
    with open_page(report) as (page, console, errors):
        page.wait_for_function(f"() => {{ const d = document.getElementById('{GRAPH}'); return d && d.data; }}",
                               timeout=OPEN_SECONDS * 1000)
        traces = page.evaluate(f"() => document.getElementById('{GRAPH}').data.map(t => [t.name, t.x.length])")
        assert [t[0] for t in traces] == ["mutations between groups", "groups (collapsed)", "critical path"]
        assert traces[1][1] == len(sizes) and traces[2][1] == len(path.ids)
        options = page.evaluate(f"() => Array.from(document.querySelectorAll('#{GRAPH}-group option'))"
                                ".map(o => o.textContent)")
        assert options == [f"{g} ({c:,} states)" for g, c in sizes.items()]

        # expand the second application: its states (coloured by location) and the mutations ending there
        group = sizes.index[1]
        page.select_option(f"#{GRAPH}-group", "1")
        t0 = time.perf_counter()
        page.click(f"#{GRAPH}-expand")
        page.wait_for_function(f"() => document.getElementById('{GRAPH}').data.length === 5")
        expand_s = time.perf_counter() - t0
        traces = page.evaluate(f"() => document.getElementById('{GRAPH}').data.map(t => [t.name, t.x.length])")
        by_name = {t[0]: t for t in traces}
        assert by_name[f"{group} ({sizes[group]})"][1] == sizes[group]
        ends = int(muts["dst_state_id"].isin(states.loc[states["origin"] == group, "state_id"]).sum())
        assert by_name[f"{group}: inputs"][1] == 3 * ends
        assert traces[-1][0] == "critical path", "the path stays on top"
        colours = page.evaluate(f"() => new Set(document.getElementById('{GRAPH}').data[4 - 1].marker.color)"
                                ".size")
        assert colours == states.loc[states["origin"] == group, "location"].nunique()
        print(f"one group expanded in {expand_s:.1f} s")
        # collapse it again
        page.click(f"#{GRAPH}-collapse")
        page.wait_for_function(f"() => document.getElementById('{GRAPH}').data.length === 3")
        bad = [m for m in console if m[0] == "error"] + errors
        assert not bad, bad


def test_a_small_graph_is_drawn_state_by_state(tmp_path):
    states, muts = layered_dag(500, 900, seed=5)
    states, muts = states.to_pandas(), muts.to_pandas()
    html = graph_view(states, muts, div_id="g")
    assert "-expand" not in html, "nothing to expand below the threshold"
    layout = GraphLayout(states, muts, data_state_path(states, muts))
    assert layout.n == 500 and len(layout.src) == 900
    # states lie in their group's lane, at their time
    row = int(np.flatnonzero(layout.ids == "s42")[0])
    origin = states.set_index("state_id").loc["s42", "origin"]
    assert int(layout.y[row]) == layout.groups.index(origin)
    assert layout.x[row] == pytest.approx((states.set_index("state_id").loc["s42", "ts_ns"] -
                                           states["ts_ns"].min()) / 1e9)


def test_graphml_export_reads_back_in_networkx(big_run, tmp_path):
    run = flowscope.open_run(big_run)
    states, muts = run.table("data_states").head(20_000), None
    keep = set(states["state_id"])
    muts = run.table("mutations")
    muts = muts[muts["src_state_id"].isin(keep) & muts["dst_state_id"].isin(keep)]
    path = data_state_path(states, muts)
    out = to_graphml(states, muts, tmp_path / "graph.graphml")
    g = nx.read_graphml(out, force_multigraph=True)
    assert g.number_of_nodes() == len(states) and g.number_of_edges() == len(muts)
    critical = {n for n, d in g.nodes(data=True) if d["critical"]}
    assert critical == set(path.ids)
    on_edges = {(u, v) for u, v, d in g.edges(data=True) if d["critical"]}
    assert on_edges == set(zip(path.ids[:-1], path.ids[1:]))
    sample = states.iloc[1234]
    node = g.nodes[sample["state_id"]]
    assert node["ts_ns"] == int(sample["ts_ns"]) and node["location"] == sample["location"]
    assert {d["kind"] for _, _, d in g.edges(data=True)} == set(muts["kind"])


def test_json_export_reads_back(tmp_path):
    states, muts = layered_dag(3_000, 6_000, seed=9)
    states, muts = states.to_pandas(), muts.to_pandas()
    to_json(states, muts, tmp_path / "graph.json")
    with open(tmp_path / "graph.json") as f:
        doc = json.load(f)
    assert len(doc["states"]) == 3_000 and len(doc["mutations"]) == 6_000
    assert doc["critical_path"]["ids"] == data_state_path(states, muts).ids


def test_a_graph_with_an_origin_per_task_is_laid_out_in_few_lanes(tmp_path):
    """A workflow whose states each name their task as origin (WfCommons: 1,001 origins for 1,000 tasks) gets
    one lane per location, not a lane per task: a lane per task drew 1,001 tick labels and took Chromium 40 s
    to lay out."""
    states, muts = layered_dag(3000, 4500, seed=7)
    states, muts = states.to_pandas(), muts.to_pandas()
    states["origin"] = [f"task_ID{i // 3:07d}" for i in range(len(states))]   # 1,000 origins
    layout = GraphLayout(states, muts, data_state_path(states, muts))
    assert layout.group_by == "location"
    assert layout.groups == sorted(states["location"].astype(str).unique())
    assert len(layout.groups) <= GraphLayout.MAX_LANES
    fig = graph_view(states, muts, div_id="g")
    assert "one vertex per location" in fig and "1,000 origins" in fig
    # a graph whose every grouping has too many values is drawn in one lane
    states["location"] = [f"host{i}" for i in range(len(states))]
    layout = GraphLayout(states, muts, data_state_path(states, muts))
    assert layout.groups == ["all"] and (layout.group == 0).all()
    # within the cap, the origin stays the lane
    few = states.assign(origin=[f"app{i % 7}" for i in range(len(states))])
    assert GraphLayout(few, muts, data_state_path(few, muts)).group_by == "origin"
