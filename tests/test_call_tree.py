"""Call-path profiles (analysis/call_tree.py): the calling-context tree of nested spans per resource and merged
across resources, checked against a plain stack walk over otf2-print's events (the OTF2 ping-pong archive),
over viztracer's JSON read with json.load, over random nested intervals, and through Hatchet."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
import threading
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from conftest import needs_tool, require_module

import flowscope
from flowscope import Client, open_run
from flowscope.analysis.call_tree import (NESTING_DERIVED, NESTING_FLAT, NESTING_PARENT_ID, NESTING_TIME,
                                          CallTreeError, call_tree, call_tree_table, query, run_call_tree,
                                          to_hatchet)
from flowscope.cli.main import main as cli
from flowscope.importers import import_paths
from flowscope.model.schemas import TABLES
from flowscope.sources import python_tracing

SPANS = TABLES["spans"]


def spans_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{**{f.name: None for f in SPANS}, "kind": "call", **r} for r in rows], schema=SPANS)


def stack_profile(calls: dict[str, list[tuple[int, int, str]]]) -> dict[tuple[str, tuple[str, ...]], list[int]]:
    """The reference: per resource, intervals (start, end, name) walked in (start, end descending) order with a
    stack (a span ended by the next one's start is closed); {(resource, call path): [calls, inclusive, exclusive]}."""
    out: dict = defaultdict(lambda: [0, 0, 0])
    for res, items in calls.items():
        stack: list[list] = []  # [end, path, child time, start]

        def close(frame, res=res, stack=stack):
            end, path, child, start = frame
            out[(res, path)][0] += 1
            out[(res, path)][1] += end - start
            out[(res, path)][2] += max(end - start - child, 0)
            if stack:
                stack[-1][2] += end - start

        for start, end, name in sorted(items, key=lambda c: (c[0], -c[1], c[2])):
            while stack and stack[-1][0] <= start:
                close(stack.pop())
            path = (stack[-1][1] if stack else ()) + (name,)
            stack.append([end, path, 0, start])
        while stack:
            close(stack.pop())
    return dict(out)


def profile_of(tree) -> dict[tuple[str, tuple[str, ...]], list[int]]:
    t = tree.table().to_pylist()
    return {(r["resource_id"], tuple(r["call_path"])): [r["calls"], r["inclusive_ns"], r["exclusive_ns"]]
            for r in t if r["resource_id"] is not None}


# ---- nesting rules ---------------------------------------------------------------------------------------------

def _random_nested(rng: random.Random, lo: int, hi: int, depth: int, out: list, names: str) -> None:
    """Random properly nested intervals inside [lo, hi], touching and zero-length ones included."""
    t = lo
    while t < hi and rng.random() < 0.8:
        a = rng.randint(t, hi)
        b = rng.choice([a, rng.randint(a, hi), hi])
        out.append((a, b, rng.choice(names)))
        if depth and b > a:
            _random_nested(rng, a, b, depth - 1, out, names)
        t = b if rng.random() < 0.5 else b + 1


@pytest.mark.parametrize("seed", range(40))
def test_time_nesting_equals_a_stack_walk_on_random_nested_spans(seed):
    rng = random.Random(seed)
    calls = {}
    for r in range(rng.randint(1, 4)):
        items: list = []
        _random_nested(rng, 0, rng.randint(0, 60), 4, items, "fgh")
        calls[f"thread:{r}"] = items
    rows = [{"resource_id": res, "name": n, "start_ns": a, "end_ns": b} for res, items in calls.items()
            for a, b, n in items]
    tree = call_tree(spans_table(rows))
    assert profile_of(tree) == stack_profile(calls)
    assert set(tree.nesting.values()) <= {NESTING_TIME}


def test_parent_ids_are_followed_and_spans_that_overlap_without_nesting_are_flat():
    rows = [
        # linked: the child names its parent, even where times alone would say otherwise (same start and end)
        {"resource_id": "rank:0", "name": "main", "start_ns": 0, "end_ns": 100, "span_id": 1},
        {"resource_id": "rank:0", "name": "solve", "start_ns": 0, "end_ns": 100, "span_id": 2, "parent_id": 1},
        {"resource_id": "rank:0", "name": "main", "start_ns": 0, "end_ns": 100, "span_id": 3, "parent_id": 2},
        # crossing: two tasks side by side on one machine
        {"resource_id": "host:a", "name": "task", "start_ns": 0, "end_ns": 10},
        {"resource_id": "host:a", "name": "task", "start_ns": 5, "end_ns": 15},
        {"resource_id": "host:a", "name": "io", "start_ns": 6, "end_ns": 7},
    ]
    tree = call_tree(spans_table(rows))
    assert tree.nesting == {"rank:0": NESTING_PARENT_ID, "host:a": NESTING_FLAT}
    prof = profile_of(tree)
    assert prof == {("rank:0", ("main",)): [1, 100, 0], ("rank:0", ("main", "solve")): [1, 100, 0],
                    ("rank:0", ("main", "solve", "main")): [1, 100, 100],
                    ("host:a", ("task",)): [2, 20, 20], ("host:a", ("io",)): [1, 1, 1]}
    # span ids repeat across two imports into one run: the parent on the span's own resource wins
    dup = spans_table([{"resource_id": r, "name": f"{r}-main", "start_ns": 0, "end_ns": 10, "span_id": 1}
                       for r in ("a", "b")] +
                      [{"resource_id": r, "name": "leaf", "start_ns": 1, "end_ns": 2, "span_id": 2, "parent_id": 1}
                       for r in ("a", "b")])
    assert set(profile_of(call_tree(dup))) == {("a", ("a-main",)), ("a", ("a-main", "leaf")),
                                              ("b", ("b-main",)), ("b", ("b-main", "leaf"))}
    cyc = spans_table([{"resource_id": "r", "name": "a", "start_ns": 0, "end_ns": 1, "span_id": 1, "parent_id": 2},
                       {"resource_id": "r", "name": "b", "start_ns": 0, "end_ns": 1, "span_id": 2, "parent_id": 1}])
    with pytest.raises(CallTreeError, match="cycle through span_id"):
        call_tree(cyc)


def test_merged_statistics_count_a_resource_without_the_path_as_zero():
    rows = [{"resource_id": f"rank:{r}", "name": "main", "start_ns": 0, "end_ns": 100} for r in range(4)]
    rows += [{"resource_id": f"rank:{r}", "name": "wait", "start_ns": 10, "end_ns": 10 + 20 * r} for r in (1, 2, 3)]
    t = call_tree(spans_table(rows)).table().to_pylist()
    merged = {tuple(r["call_path"]): r for r in t if r["resource_id"] is None}
    wait = merged[("main", "wait")]
    assert (wait["calls"], wait["resources"], wait["inclusive_ns"]) == (3, 3, 120)
    assert (wait["inclusive_min_ns"], wait["inclusive_mean_ns"], wait["inclusive_max_ns"]) == (0, 30.0, 60)
    assert wait["inclusive_imbalance"] == pytest.approx((60 - 30) / 60)
    main = merged[("main",)]
    assert (main["inclusive_min_ns"], main["inclusive_max_ns"], main["inclusive_imbalance"]) == (100, 100, 0.0)
    # exclusive: 100 - wait on each rank
    assert (main["exclusive_min_ns"], main["exclusive_max_ns"]) == (40, 100)
    assert main["exclusive_mean_ns"] == pytest.approx((100 + 80 + 60 + 40) / 4)


# ---- flowscope's own Python tracing ------------------------------------------------------------------------------

def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def leaf() -> None:
    pass


def top() -> None:
    fib(4)
    leaf()


def fib_paths(n: int, prefix: tuple = ()) -> dict[tuple, int]:
    out: dict = defaultdict(int)
    path = prefix + ("fib",)
    out[path] += 1
    if n >= 2:
        for k, v in (fib_paths(n - 1, path)).items():
            out[k] += v
        for k, v in fib_paths(n - 2, path).items():
            out[k] += v
    return out


def test_python_tracing_call_paths_and_counts_per_thread_and_merged(tmp_path, monkeypatch):
    client = python_tracing.start(Client("embedded", store=tmp_path / "store", name="profile"))
    try:
        traced = {f.__name__: flowscope.trace(f, name=f.__name__) for f in (fib, leaf, top)}
        for k, f in traced.items():
            monkeypatch.setitem(globals(), k, f)
        threads = [threading.Thread(target=traced["top"]) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        python_tracing.stop()
        client.close()
    run = open_run(client.run_dir)
    tree = run_call_tree(run)
    assert len(tree.resources) == 2 and set(tree.nesting.values()) == {NESTING_PARENT_ID}
    expected = {("top",): 1, ("top", "leaf"): 1, **fib_paths(4, ("top",))}
    rows = call_tree_table(run).to_pylist()
    for res in tree.resources:
        got = {tuple(r["call_path"]): r["calls"] for r in rows if r["resource_id"] == res}
        assert got == expected
    merged = {tuple(r["call_path"]): r for r in rows if r["resource_id"] is None}
    assert {k: r["calls"] for k, r in merged.items()} == {k: 2 * v for k, v in expected.items()}
    assert all(r["resources"] == 2 for r in merged.values())
    # exclusive = inclusive - the inclusive time of the direct children, path by path
    by_path = {(r["resource_id"], r["path_id"]): r for r in rows}
    for (res, pid), r in by_path.items():
        kids = sum(k["inclusive_ns"] for k in rows if k["resource_id"] == res and k["parent_path_id"] == pid)
        assert r["inclusive_ns"] >= kids
        assert r["exclusive_ns"] == r["inclusive_ns"] - kids


# ---- the OTF2 ping-pong, against otf2-print -------------------------------------------------------------------

OTF2_PRINT = shutil.which("otf2-print")


@pytest.fixture(scope="module")
def pingpong(shared_data, tmp_path_factory):
    require_module("otf2", "the otf2 Python package reads OTF2 archives: pip install -e '.[test]'")
    archive = shared_data / "otf2" / "ping-pong-otf2" / "traces.otf2"
    res = import_paths([archive], tmp_path_factory.mktemp("pp") / "store")
    return archive, open_run(res.run_dir)


@needs_tool("otf2-print", "otf2-tools")
def test_ping_pong_profile_per_rank_equals_a_stack_walk_over_otf2_print(pingpong):
    archive, run = pingpong
    out = subprocess.run([OTF2_PRINT, str(archive)], capture_output=True, text=True, check=True).stdout
    defs = subprocess.run([OTF2_PRINT, "-G", str(archive)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Ticks per Seconds: (\d+), Global Offset: (\d+)", defs)
    tps, off = int(m.group(1)), int(m.group(2))
    ns = lambda t: (t - off) * 10**9 // tps  # the conversion docs/formats/otf2.md gives
    open_: dict = defaultdict(list)
    calls: dict = defaultdict(list)
    for line in out.splitlines():
        ev = re.match(r'^(ENTER|LEAVE)\s+(\d+)\s+(\d+)\s.*Region: "([^"]*)"', line)
        if not ev:
            continue
        kind, loc, t, region = ev.group(1), int(ev.group(2)), int(ev.group(3)), ev.group(4)
        if kind == "ENTER":
            open_[loc].append((ns(t), region))
        else:
            start, name = open_[loc].pop()
            assert name == region
            calls[loc].append((start, ns(t), name))
    ref = stack_profile(calls)
    tree = run_call_tree(run)
    got = {(int(res.split(":")[-1]), path): v for (res, path), v in profile_of(tree).items()}
    assert got == ref
    assert len(tree.resources) == 2 and set(tree.nesting.values()) == {NESTING_PARENT_ID}
    # the flat profile per function (what pipit's flat_profile gives): exclusive summed over call paths
    merged = [r for r in tree.table().to_pylist() if r["resource_id"] is None]
    for fn in {p[-1] for _, p in ref}:
        assert sum(r["exclusive_ns"] for r in merged if r["name"] == fn) == \
            sum(v[2] for (_, p), v in ref.items() if p[-1] == fn)
    assert any(r["name"] == "MPI_Recv" and r["inclusive_imbalance"] > 0 for r in merged)


# ---- viztracer's JSON, against json.load ---------------------------------------------------------------------

def us_to_ns(us: float) -> int:
    """The trace-event format's microseconds as the Chrome importer stores them (docs/formats/chrome-perfetto.md)."""
    return int(us) * 1000 if float(us).is_integer() else int(np.rint(us * 1000))


@pytest.mark.parametrize("name", ["multithread.json", "async_simple.json", "tests_fib.json",
                                  "function_args_return.json", "logging_integration.json"])
def test_viztracer_profile_equals_a_stack_walk_over_json_load(shared_data, tmp_path, name):
    path = shared_data / "chrome" / "viztracer" / name
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    calls: dict = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            start = us_to_ns(e["ts"])
            calls[(e["pid"], e["tid"])].append((start, start + us_to_ns(e.get("dur", 0)), e["name"]))
    assert calls, "the file has complete (X) events"
    run = open_run(import_paths([path], tmp_path / "store").run_dir)
    tree = run_call_tree(run, kinds=["call"])
    got = profile_of(tree)
    res = run.sql("SELECT resource_id, pid, tid FROM resources WHERE kind = 'thread'")
    rid = {(int(p), int(t)): r for r, p, t in zip(res["resource_id"], res["pid"], res["tid"])}
    ref = {(rid[k], path): v for (k, path), v in stack_profile(calls).items()}
    assert got == ref


# ---- Hatchet ---------------------------------------------------------------------------------------------------

def test_to_hatchet_gives_a_graphframe_whose_own_inclusive_sums_agree(pingpong):
    require_module("hatchet", "llnl-hatchet reads flowscope's call tree: pip install -e '.[test]'")
    _, run = pingpong
    tree = run_call_tree(run)
    gf = to_hatchet(run)
    assert len(list(gf.graph.traverse())) == len(tree)
    df = gf.dataframe.reset_index()
    assert len(df) == len(tree.path) and set(df["resource_id"]) == set(tree.resources)
    ours = df["time (inc)"].to_numpy().copy()
    gf.drop_index_levels(function="sum")  # hatchet's own inclusive time: exclusive summed over each subtree
    gf.dataframe["time (inc)"] = 0.0
    gf.update_inclusive_columns()
    assert np.allclose(np.sort(gf.dataframe["time (inc)"].to_numpy()),
                       np.sort(np.bincount(tree.path, weights=tree.inclusive) / 1e9), rtol=1e-9, atol=1e-12)
    assert np.allclose(np.sort(ours), np.sort(tree.inclusive / 1e9))
    text = gf.tree(metric_column="time (inc)")
    assert "MPI_Send" in text and "main" in text


def test_to_hatchet_without_hatchet_says_what_to_install(pingpong, monkeypatch):
    _, run = pingpong
    monkeypatch.setitem(sys.modules, "hatchet", None)  # import hatchet raises ImportError
    with pytest.raises(ImportError, match=r"llnl-hatchet.*pip install 'flowscope\[profiles\]'"):
        to_hatchet(run)


# ---- the CLI and SQL -------------------------------------------------------------------------------------------

def test_profile_command_prints_the_tree_merged_and_per_resource(pingpong, capsys):
    _, run = pingpong
    tree = run_call_tree(run)
    assert cli(["profile", str(run.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["by"] == "merged" and doc["resources"] == 2
    paths = {tuple(r["call_path"]): r for r in doc["paths"]}
    assert len(paths) == len(tree)
    send = next(r for p, r in paths.items() if p[-1] == "MPI_Send")
    assert {"calls", "inclusive_ns", "exclusive_ns", "inclusive_imbalance", "inclusive_mean_ns"} <= set(send)

    assert cli(["profile", str(run.path), "--top", "3"]) == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if "MPI_" in ln or "main" in ln]
    assert lines and any(ln.startswith("  ") or "  MPI_" in ln for ln in lines)
    assert "imbalance" in text

    assert cli(["profile", str(run.path), "--by", "resource", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["by"] == "resource" and {r["resource_id"] for r in doc["paths"]} == set(tree.resources)

    assert cli(["sql", str(run.path), "SELECT count(*) AS n FROM call_tree WHERE resource_id IS NULL",
                "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": len(tree)}]
    df = query(run, "SELECT name, sum(calls) AS c FROM call_tree WHERE resource_id IS NOT NULL GROUP BY name")
    assert int(df["c"].sum()) == run.counts()["spans"]


def test_profile_of_a_run_without_spans_says_so(tmp_path, capsys):
    with Client("embedded", store=tmp_path / "store", name="empty") as c:
        c.metric("x", 1.0)
        run_dir = c.run_dir
    assert cli(["profile", str(run_dir)]) == 0
    assert "no spans" in capsys.readouterr().out
    assert cli(["profile", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["paths"] == []


def test_profile_of_a_missing_run_is_one_line_exit_1(tmp_path, capsys):
    assert cli(["profile", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("flowscope profile: error:")



# ---- the report's flame graph ------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["otf2/ping-pong-otf2/traces.otf2", "chrome/viztracer/multithread.json"])
def test_the_report_draws_the_flame_graph_and_the_hottest_paths_in_chromium(shared_data, tmp_path, source):
    """The profile page of the report (its pages file) in headless Chromium: the flame graph merged across
    resources and one per resource behind the menu, drawn; the hottest call path listed whole with its exclusive
    time."""
    if source.endswith(".otf2"):
        require_module("otf2", "the otf2 Python package reads OTF2 archives: pip install -e '.[test]'")
    from test_report import open_view

    from flowscope.report import write_report

    run = open_run(import_paths([shared_data / source], tmp_path / "store").run_dir)
    tree = run_call_tree(run)
    blocked: list = []
    with open_view(write_report(run, tmp_path / "report.html"), "profile", blocked) as (pg, console, errors):
        pg.wait_for_function("() => { const d = document.getElementById('pf-flame-chart'); return d && d.calcdata; }")
        traces = pg.evaluate("() => document.getElementById('pf-flame-chart').data.length")
        drawn = pg.evaluate("() => document.querySelectorAll('#pf-flame-chart .slice').length")
        hot = pg.evaluate("() => Array.from(document.querySelectorAll('table.hot-paths tbody tr')).map(tr => "
                          "[tr.cells[0].textContent, Number(tr.querySelector('td.exclusive').dataset.value)])")
        nodata = pg.locator("#pf-hot .nodata, #pf-flame .nodata").count()
        assert not [m for m in console if m[0] == "error"] and not errors and not blocked
        assert pg.evaluate("() => flowscopeView.errors") == []
    # one flame graph merged across resources, one per resource behind the menu
    assert traces == 1 + len(tree.resources)
    assert drawn > 0 and nodata == 0
    m = tree.merged()
    hottest = int(np.argmax(m["exclusive_ns"]))
    path = tree.call_path(hottest)
    assert [" > ".join(path), m["exclusive_ns"][hottest] / 1e9] in hot  # the whole path, its exclusive time


def test_the_report_draws_every_call_path_as_a_box(pingpong, tmp_path):
    from test_report import open_view

    from flowscope.report import write_report

    _, run = pingpong
    tree = run_call_tree(run)
    with open_view(write_report(run, tmp_path / "report.html"), "profile") as (page, _console, _errors):
        page.wait_for_function("() => document.querySelector('#pf-flame-chart .slice') !== null", timeout=30_000)
        labels = page.evaluate("() => Array.from(document.querySelectorAll('#pf-flame-chart .slice text'))"
                               ".map(t => t.textContent)")
        boxes = page.evaluate("() => document.querySelectorAll('#pf-flame-chart .slice').length")
    assert boxes == len(tree) + 1  # and the base box under the roots
    assert "MPI_Init" in labels and any(lab.startswith("int main") for lab in labels)


def test_the_report_of_a_run_without_spans_says_what_gives_a_profile(tmp_path):
    from test_report import view_text

    from flowscope.report import write_report

    with Client("embedded", store=tmp_path / "store", name="empty") as c:
        c.metric("x", 1.0)
        run_dir = c.run_dir
    text, errors = view_text(write_report(run_dir), "profile")
    assert not errors, errors
    section = text[text.index("Call paths with the most exclusive time"):]
    assert "No spans in this run" in section and "@flowscope.trace" in section


def test_tasks_whose_times_were_placed_by_a_rule_are_not_nested_by_time(shared_data, tmp_path):
    # WfCommons instances have no start times: tasks are placed as soon as possible (time_source derived-asap),
    # so tasks that start together on one machine would look nested in one another
    path = shared_data / "wfinstances" / "blast-chameleon-small-001.json"
    run = open_run(import_paths([path], tmp_path / "store").run_dir)
    tree = run_call_tree(run)
    assert set(tree.nesting.values()) == {NESTING_DERIVED}
    assert int(tree.path_depth.max()) == 0
    assert int(tree.calls.sum()) == run.counts()["spans"]


def test_the_profile_page_says_when_spans_do_not_nest(shared_data, tmp_path):
    """A run whose spans overlap on a resource without nesting (work side by side, not calls), and a WfCommons
    instance whose task times were placed by a rule: the profile page says so beside its flame graph, and that the
    profile is flat, naming what gives call paths; a run of nested calls says neither."""
    from test_report import view_text

    from flowscope.report import write_report

    with Client("embedded", store=tmp_path / "store", name="side by side") as c:
        rid = c.thread_resource()
        for i, (a, b) in enumerate([(0, 10), (5, 15), (12, 20)]):  # the second overlaps both others
            c.emit("spans", span_id=i + 1, resource_id=rid, kind="call", name=f"f{i}", start_ns=1_000 + a * 1_000_000,
                   end_ns=1_000 + b * 1_000_000)
        side = c.run_dir
    wf = import_paths([shared_data / "wfinstances" / "blast-chameleon-small-001.json"], tmp_path / "store").run_dir
    assert set(run_call_tree(open_run(side)).nesting.values()) == {NESTING_FLAT}
    for run_dir, note in ((side, r"\b1 resource has spans that overlap without nesting: its spans are drawn flat"),
                          (wf, r"On [\d,]+ resources? the span times were placed by a rule, not observed")):
        text, errors = view_text(write_report(open_run(run_dir), tmp_path / f"{run_dir.name}.html"), "profile")
        assert not errors, errors
        assert re.search(note, text), text
        assert "No span of this run nests in another: the flame graph is a flat profile" in text, text
        assert "@flowscope.trace" in text[text.index("flat profile"):]
    with Client("embedded", store=tmp_path / "store", name="nested") as c:
        rid = c.thread_resource()
        c.emit("spans", span_id=1, resource_id=rid, kind="call", name="outer", start_ns=1_000, end_ns=9_000_000)
        c.emit("spans", span_id=2, resource_id=rid, kind="call", name="inner", start_ns=2_000, end_ns=5_000_000)
        nested = c.run_dir
    text, errors = view_text(write_report(open_run(nested), tmp_path / "nested.html"), "profile")
    assert not errors and "flat profile" not in text and "without nesting" not in text, (errors, text)
