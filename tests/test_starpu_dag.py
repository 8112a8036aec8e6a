"""StarPU's tasks.rec and dag.dot beside its Paje trace: tasks and their DAG in the run, and the critical
paths over them, checked against StarPU's own records and networkx."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import networkx as nx
import pytest

from flowscope.analysis.critical_path import task_graph_paths
from flowscope.analysis.summary import summarize
from flowscope.importers import import_paths
from flowscope.store.run import open_run


def _records(path: Path) -> list[dict[str, str]]:
    """tasks.rec's records, parsed here on their own (blank-line separated 'Field: value' lines)."""
    out, cur = [], {}
    for line in path.read_text().splitlines():
        if not line.strip():
            if cur:
                out.append(cur)
            cur = {}
            continue
        k, _, v = line.partition(":")
        cur[k.strip()] = v.strip()
    if cur:
        out.append(cur)
    return out


def _dot_edges(path: Path) -> set[tuple[str, str]]:
    return set(re.findall(r'"([^"]+)"\s*->\s*"([^"]+)"', path.read_text()))


@pytest.fixture(scope="module")
def demo(shared_data) -> Path:
    return shared_data / "paje" / "starpu-demo"


@pytest.fixture(scope="module")
def starpu_run(demo, tmp_path_factory):
    res = import_paths([demo / "paje.trace"], tmp_path_factory.mktemp("starpu") / "store")
    run = open_run(res.run_dir)
    yield res, run
    run.close()


@pytest.fixture(scope="module")
def runtimes(demo) -> dict[str, int]:
    """task key -> runtime in ns, from tasks.rec (ms with 6 decimals)."""
    return {f"task_{r['JobId']}": round(float(r["EndTime"]) * 1e6) - round(float(r["StartTime"]) * 1e6)
            for r in _records(demo / "tasks.rec") if "StartTime" in r}


def test_tasks_rec_tasks_become_task_spans_on_their_workers(demo, starpu_run):
    """Each of the 36 tasks that ran is the Paje state matched by worker and time: a task span whose key is
    dag.dot's node name; the Paje side's own JobId field (not used to match) agrees."""
    res, run = starpu_run
    tasks = {r["JobId"]: r for r in _records(demo / "tasks.rec") if "StartTime" in r}
    spans = run.sql("""SELECT s.task_key, s.name, s.start_ns, s.end_ns, s.attrs, r.name AS worker
                       FROM spans s JOIN resources r USING (resource_id) WHERE s.kind = 'task'""")
    assert len(spans) == len(tasks) == 36
    for _, s in spans.iterrows():
        job = s["task_key"].removeprefix("task_")
        t = tasks[job]
        attrs = json.loads(s["attrs"])
        assert attrs["JobId"] == job and attrs["starpu_job"] == int(job)
        assert s["name"] == t["Name"] and s["worker"] == f"CPU{t['WorkerId']}"
        assert abs(s["start_ns"] - round(float(t["StartTime"]) * 1e6)) <= 1
        assert abs(s["end_ns"] - round(float(t["EndTime"]) * 1e6)) <= 1
        assert attrs["submit_ns"] == round(float(t["SubmitTime"]) * 1e6)
    meta = res.files[0].meta["starpu"]
    assert meta["tasks_matched"] == 36 and meta["edges_from"] == "dag.dot"


def test_dag_edges_become_dependencies_and_agree_with_tasks_rec(demo, starpu_run):
    _, run = starpu_run
    deps = run.table("dependencies")
    got = set(zip(deps["depends_on"], deps["task_key"]))
    assert got == _dot_edges(demo / "dag.dot") and len(got) == len(deps) == 40
    # the same edges as tasks.rec's DependsOn among the tasks that ran (the rest are ghost unregister tasks)
    recs = [r for r in _records(demo / "tasks.rec") if "StartTime" in r]
    ran = {r["JobId"] for r in recs}
    from_rec = {(f"task_{d}", f"task_{r['JobId']}") for r in recs for d in r.get("DependsOn", "").split()
                if d in ran}
    assert got == from_rec


def test_structural_critical_path_equals_networkx_longest_path(demo, starpu_run, runtimes):
    """The structural path over the DAG with tasks.rec's runtimes is networkx's dag_longest_path_length of
    the same DAG (each edge weighted by its source's runtime, plus a sink after every task)."""
    _, run = starpu_run
    spans = run.table("spans")
    tp = task_graph_paths(spans[spans["kind"] == "task"], run.table("dependencies"), run.table("transfers"))
    g = nx.DiGraph()
    for a, b in _dot_edges(demo / "dag.dot"):
        g.add_edge(a, b, w=runtimes[a])
    for k, d in runtimes.items():
        g.add_edge(k, "end", w=d)
    want = nx.dag_longest_path_length(g, weight="w")
    assert abs(tp.structural.length_ns - want) <= len(tp.structural.ids)  # 1 ns of rounding per task at most
    assert tp.structural.length_ns > max(runtimes.values())
    # the path is a chain of the DAG's edges whose runtimes add up to its length
    assert all(g.has_edge(a, b) for a, b in zip(tp.structural.ids, tp.structural.ids[1:]))
    assert abs(sum(runtimes[k] for k in tp.structural.ids) - tp.structural.length_ns) <= len(tp.structural.ids)


def test_measured_critical_path_runs_through_the_dag_and_the_workers(demo, starpu_run, runtimes):
    """The measured path spans the run's tasks from the first start to the last end, going from task to task
    along a DAG edge or along a worker; `flowscope show`'s summary gives it."""
    _, run = starpu_run
    spans = run.table("spans")
    tasks = spans[spans["kind"] == "task"].set_index("task_key")
    tp = task_graph_paths(tasks.reset_index(), run.table("dependencies"), run.table("transfers"))
    m = tp.measured
    assert m is not None
    assert m.end_ns == tasks["end_ns"].max() and m.start_ns == tasks["start_ns"].min()
    assert m.length_ns == tasks["end_ns"].max() - tasks["start_ns"].min()
    edges = _dot_edges(demo / "dag.dot")
    dag_steps = 0
    for a, b in zip(m.ids, m.ids[1:]):
        if (a, b) in edges:
            dag_steps += 1
        else:
            assert tasks.loc[a, "resource_id"] == tasks.loc[b, "resource_id"], (a, b)
    assert dag_steps >= 1  # the DAG, not only the workers' queues, decides the path
    computed = m.steps[m.steps["kind"] == "task"]
    assert (computed["duration_ns"] <= computed["id"].map(runtimes) + 1).all()
    cp = summarize(run).critical_path
    assert cp["measured_ns"] == m.length_ns and cp["structural_ns"] == tp.structural.length_ns


def test_structural_path_names_the_worker_each_task_ran_on(demo, starpu_run):
    """The structural path over the run's units of work (as `flowscope show` and the report take them) gives each
    task step the StarPU worker that ran it, tasks.rec's WorkerId, in its location column."""
    from flowscope.analysis.critical_path import work_units

    _, run = starpu_run
    worker_of = {f"task_{r['JobId']}": f"CPU{r['WorkerId']}" for r in _records(demo / "tasks.rec") if "StartTime" in r}
    names = dict(zip(run.table("resources")["resource_id"], run.table("resources")["name"]))
    st = task_graph_paths(work_units(run), run.table("dependencies"), run.table("transfers")).structural
    steps = st.steps[st.steps["kind"] == "task"]
    assert len(steps) == len(st.ids) > 1
    assert steps["location"].notna().all(), steps[["id", "location"]]
    assert [names.get(loc) for loc in steps["location"]] == [worker_of[k] for k in steps["id"]]


def test_without_tasks_rec_the_trace_keeps_its_states(demo, tmp_path):
    """The Paje trace alone (no StarPU records beside it) imports as states, as before."""
    shutil.copy(demo / "paje.trace", tmp_path / "paje.trace")
    res = import_paths([tmp_path / "paje.trace"], tmp_path / "store")
    run = open_run(res.run_dir)
    assert run.counts().get("dependencies", 0) == 0
    assert int(run.sql("SELECT count(*) AS n FROM spans WHERE kind = 'task'")["n"].iloc[0]) == 0
    assert "starpu" not in res.files[0].meta
    run.close()


def test_dag_dot_alone_missing_falls_back_to_tasks_rec_dependencies(demo, tmp_path):
    for f in ("paje.trace", "tasks.rec"):
        shutil.copy(demo / f, tmp_path / f)
    res = import_paths([tmp_path / "paje.trace"], tmp_path / "store")
    run = open_run(res.run_dir)
    deps = run.table("dependencies")
    assert set(zip(deps["depends_on"], deps["task_key"])) >= _dot_edges(demo / "dag.dot")
    assert res.files[0].meta["starpu"]["edges_from"] == "tasks.rec DependsOn"
    run.close()


def test_report_draws_the_critical_path_through_starpus_dag(starpu_run, runtimes, tmp_path):
    """The StarPU run's report (its pages file), in headless Chromium: the critical-path page gives the measured
    path and the structural one over the DAG, with its attribution chart drawn and every task of the path
    listed."""
    from test_report import open_view

    from flowscope.report import write_report

    _, run = starpu_run
    spans = run.table("spans")
    tp = task_graph_paths(spans[spans["kind"] == "task"], run.table("dependencies"), run.table("transfers"))
    with open_view(write_report(run, tmp_path / "report.html"), "critical-path") as (pg, console, errors):
        pg.wait_for_function("() => { const d = document.getElementById('cp-task-chart'); return d && d.calcdata; }")
        assert pg.locator("#cp-task-facts").inner_text().startswith("Measured critical path")
        assert float(pg.locator("#cp-task-length").get_attribute("data-value")) == tp.measured.length_ns / 1e9
        assert float(pg.locator("#cp-task-structural").get_attribute("data-value")) == tp.structural.length_ns / 1e9
        assert pg.evaluate("() => document.querySelectorAll('#cp-task-chart .trace').length") > 0
        listed = pg.evaluate("() => Array.from(document.querySelectorAll('#cp-task table.steps tbody tr')).map(tr => "
                             "tr.dataset.id)")
        assert not errors and not [m for m in console if m[0] == "error"]
    assert set(tp.measured.ids) <= set(listed)  # every task of the path is listed
