"""The semantic vocabulary (model/semantics.py): every analysis works on every source, not only on Dask tasks.

Real traces from ../shared/data (StarPU's Paje trace with its tasks.rec, Score-P's OTF2 ping-pong, a WfCommons
instance, a viztracer trace), a real Dask LocalCluster and a real local-scheduler run: the breakdown, the
per-group statistics, the resource-state timeline and utilisation come out non-empty and right against what
each tool says itself; an override changes them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import flowscope
from flowscope.analysis.breakdown import breakdown, task_groups
from flowscope.analysis.timeline import resource_states, utilisation_by_resource, utilisation_over_time
from flowscope.importers import import_paths
from flowscope.model.semantics import SemanticsError

ROOT = Path(__file__).resolve().parent.parent


def _import(shared_data: Path, rel: str, tmp_path: Path, **kw) -> flowscope.Run:
    res = import_paths([shared_data / rel], tmp_path / "store", **kw)
    return flowscope.open_run(res.run_dir)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowscope", *args], capture_output=True, text=True, timeout=300)


def check_states(run, states=None) -> None:
    """Per (resource, slot): intervals that do not overlap, are contiguous and cover the window exactly."""
    st = resource_states(run) if states is None else states
    assert len(st), "executing resources have a state timeline"
    t0, t1 = int(st["start_ns"].min()), int(st["end_ns"].max())
    for (rid, slot), g in st.groupby(["resource_id", "slot"]):
        g = g.sort_values("start_ns")
        s, e = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
        assert (e > s).all(), (rid, slot)
        assert (s[1:] == e[:-1]).all(), f"{rid} slot {slot}: gaps or overlaps"
        assert s[0] == t0 and e[-1] == t1, f"{rid} slot {slot} does not cover the run's span"
    assert set(st["state"]) <= {"compute", "communication", "io", "wait", "runtime", "other", "idle"}


# ---- StarPU (Paje) ---------------------------------------------------------------------------------------

def _starpu_tasks_rec(shared_data: Path) -> list[dict]:
    recs, cur = [], {}
    for line in (shared_data / "paje/starpu-demo/tasks.rec").read_text().splitlines():
        if not line.strip():
            if cur:
                recs.append(cur)
            cur = {}
        elif ":" in line:
            k, v = line.split(":", 1)
            cur[k.strip()] = v.strip()
    if cur:
        recs.append(cur)
    return [r for r in recs if "StartTime" in r and r.get("Name") in ("scal", "axpy")]


def test_starpu_trace_gets_groups_breakdown_and_worker_utilisation(shared_data, tmp_path):
    run = _import(shared_data, "paje/starpu-demo/paje.trace", tmp_path)
    tasks = _starpu_tasks_rec(shared_data)
    # groups are the codelets, one task per execution StarPU's own tasks.rec lists
    groups = task_groups(run).set_index("group")
    assert dict(groups["count"]) == dict(Counter(r["Name"] for r in tasks))
    for name in ("scal", "axpy"):
        ms = sum(float(r["EndTime"]) - float(r["StartTime"]) for r in tasks if r["Name"] == name)
        assert groups.loc[name, "total_s"] == pytest.approx(ms / 1e3, rel=1e-6)
    b = breakdown(run)
    codelet_s = sum(float(r["EndTime"]) - float(r["StartTime"]) for r in tasks) / 1e3
    assert b.compute_s == pytest.approx(codelet_s, rel=1e-6), "compute = the codelets' execution time"
    assert b.idle_s > 0.3, "the workers slept (Sleeping states)"
    assert b.runtime_s > 0 and b.tasks == len(tasks)
    util = utilisation_by_resource(run).set_index("resource_id")
    assert set(util.index) == {"paje:w0", "paje:w1"}, "the two StarPU workers execute, nothing else"
    assert ((util["utilisation"] > 0) & (util["utilisation"] <= 1)).all()
    for rid, wid in (("paje:w0", "0"), ("paje:w1", "1")):
        busy = sum(float(r["EndTime"]) - float(r["StartTime"]) for r in tasks if r["WorkerId"] == wid) * 1e6
        assert util.loc[rid, "compute_ns"] == pytest.approx(busy, rel=1e-6)
    check_states(run)
    over = utilisation_over_time(run, bins=20)
    assert len(over) == 20 and over["utilisation"].max() > 0 and (over["utilisation"] <= 1 + 1e-9).all()


def test_an_override_changes_the_outcome(shared_data, tmp_path):
    run = _import(shared_data, "paje/starpu-demo/paje.trace", tmp_path)
    before = breakdown(run)
    mapping = {"spans": [{"when": {"name": "Sleeping"}, "category": "compute"}]}
    over = breakdown(flowscope.open_run(run.path, semantics=mapping))
    assert over.compute_s > before.compute_s + 0.3 and over.idle_s < before.idle_s
    # stored with the run by the CLI, cleared again
    f = tmp_path / "m.json"
    f.write_text(json.dumps(mapping))
    res = _cli("semantics", str(run.path), "--set", str(f))
    assert res.returncode == 0, res.stderr
    assert breakdown(flowscope.open_run(run.path)).compute_s == pytest.approx(over.compute_s)
    shown = json.loads(_cli("show", str(run.path), "--json").stdout)
    assert shown["breakdown"]["compute_s"] == pytest.approx(over.compute_s)
    res = _cli("semantics", str(run.path), "--clear")
    assert res.returncode == 0, res.stderr
    assert breakdown(flowscope.open_run(run.path)).compute_s == pytest.approx(before.compute_s)
    # --semantics on an analysis command
    res = _cli("show", str(run.path), "--json", "--semantics", json.dumps(mapping))
    assert json.loads(res.stdout)["breakdown"]["compute_s"] == pytest.approx(over.compute_s)


def test_one_run_object_follows_an_override_stored_and_cleared_while_it_is_open(shared_data, tmp_path):
    """A Run held open (as the collector holds a live run) answers with the mappings run.json holds at each query,
    though it reads and checks them once per version of the file, not at every query."""
    run = _import(shared_data, "paje/starpu-demo/paje.trace", tmp_path)
    before = breakdown(run)
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"spans": [{"when": {"name": "Sleeping"}, "category": "compute"}]}))
    assert _cli("semantics", str(run.path), "--set", str(f)).returncode == 0
    over = breakdown(run)
    assert over.compute_s > before.compute_s + 0.3
    assert _cli("semantics", str(run.path), "--clear").returncode == 0
    assert breakdown(run).compute_s == pytest.approx(before.compute_s)


def test_a_bad_override_is_refused_naming_the_field(shared_data, tmp_path):
    run = _import(shared_data, "paje/starpu-demo/paje.trace", tmp_path)
    with pytest.raises(SemanticsError, match=r"spans\[0\]\.category: 'computing' is not one of"):
        flowscope.open_run(run.path, semantics={"spans": [{"when": {}, "category": "computing"}]})
    with pytest.raises(SemanticsError, match=r"spans\[0\]\.when: 'colour' is not a column"):
        flowscope.open_run(run.path, semantics={"spans": [{"when": {"colour": "red"}}]})
    res = _cli("semantics", str(run.path), "--set", '{"resources": [{"executes": "yes"}]}')
    assert res.returncode == 1 and "resources[0].executes: expected true or false" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


# ---- OTF2 (MPI) ------------------------------------------------------------------------------------------

def test_otf2_mpi_time_is_communication_and_runtime(shared_data, tmp_path):
    run = _import(shared_data, "otf2/ping-pong-otf2", tmp_path)
    spans = run.sql("SELECT name, end_ns - start_ns AS d FROM spans")
    p2p = int(spans[spans["name"].isin(["MPI_Send", "MPI_Recv"])]["d"].sum())
    b = breakdown(run)
    assert b.communication_s == pytest.approx(p2p / 1e9, rel=1e-9), "point-to-point calls are communication"
    init = int(spans[spans["name"].isin(["MPI_Init", "MPI_Finalize", "MPI_Comm_size", "MPI_Comm_rank"])]["d"].sum())
    assert b.runtime_s == pytest.approx(init / 1e9, rel=1e-9)
    main = int(spans[spans["name"].str.startswith("int main")]["d"].sum())
    assert b.compute_s == pytest.approx((main - p2p - init) / 1e9, rel=1e-9), "main's exclusive time"
    groups = task_groups(run).set_index("group")
    assert groups.loc["MPI_Send", "count"] == 16 and groups.loc["MPI_Send", "category"] == "communication"
    util = utilisation_by_resource(run)
    assert len(util) == 2 and (util["communication_ns"] > 0).all(), "both MPI locations communicate"
    check_states(run)


# ---- WfCommons -------------------------------------------------------------------------------------------

def test_wfcommons_tasks_on_their_machines(shared_data, tmp_path):
    inst = shared_data / "wfinstances/blast-chameleon-small-001.json"
    run = _import(shared_data, "wfinstances/blast-chameleon-small-001.json", tmp_path)
    doc = json.loads(inst.read_text())
    wf = doc["workflow"]
    specs = wf.get("specification", {}).get("tasks") or wf.get("tasks")
    execs = wf.get("execution", {}).get("tasks") or wf.get("tasks")
    runtime = sum(float(t.get("runtimeInSeconds", t.get("runtime", 0))) for t in execs)
    b = breakdown(run)
    assert b.compute_s == pytest.approx(runtime, rel=1e-6) and b.tasks == len(specs)
    groups = task_groups(run)
    assert int(groups["count"].sum()) == len(specs)
    util = utilisation_by_resource(run)
    assert set(util["resource_id"]) == set(run.sql("SELECT DISTINCT resource_id FROM spans")["resource_id"])
    assert (util["slots"] == 24).all(), "a host executes on its cores"
    check_states(run)


# ---- Chrome (viztracer) ----------------------------------------------------------------------------------

def test_viztracer_calls_per_thread(shared_data, tmp_path):
    run = _import(shared_data, "chrome/viztracer/multithread.json", tmp_path)
    b = breakdown(run)
    top = run.sql("""SELECT sum(end_ns - start_ns) AS d FROM spans s WHERE parent_id IS NULL OR NOT EXISTS
                     (SELECT 1 FROM spans p WHERE p.span_id = s.parent_id)""")
    assert b.compute_s > 0
    groups = task_groups(run)
    assert len(groups) and set(groups["role"]) == {"call"}
    util = utilisation_by_resource(run)
    threads = set(run.sql("SELECT DISTINCT resource_id FROM spans")["resource_id"])
    assert set(util["resource_id"]) == threads
    # the threads' busy time is the union of their calls: no more than the top-level calls' total
    assert int(util["busy_ns"].sum()) <= int(top["d"].iloc[0])
    check_states(run)


# ---- show --json for every source ------------------------------------------------------------------------

@pytest.mark.parametrize("rel", ["paje/starpu-demo/paje.trace", "otf2/ping-pong-otf2",
                                 "wfinstances/blast-chameleon-small-001.json", "chrome/viztracer/multithread.json"])
def test_show_json_has_breakdown_and_critical_path(shared_data, tmp_path, rel):
    run = _import(shared_data, rel, tmp_path)
    res = _cli("show", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["breakdown"]["compute_s"] > 0 and doc["breakdown"]["makespan_s"] > 0
    assert doc["breakdown"]["categories"], "seconds per category"
    cp = doc["critical_path"]
    assert cp is not None and (cp.get("measured_ns") or cp.get("structural_ns")), cp
    assert "findings" in doc and isinstance(doc["findings"], list) and doc["findings"]


# ---- Dask: LocalCluster and the local scheduler ----------------------------------------------------------

def _work(x):
    time.sleep(0.02)
    return x + 1


def test_dask_localcluster_results_unchanged(tmp_path):
    from dask import delayed
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        with flowscope.observe(client, store=tmp_path, name="sem") as obs:
            xs = [delayed(_work, pure=True)(i, dask_key_name=f"work-{i}") for i in range(12)]
            delayed(sum)(xs, dask_key_name="total").compute()
    run = obs.run
    assert run.meta.get("semantics"), "the Dask capture declares its mapping in run.json"
    tasks = run.sql("SELECT resource_id, name, start_ns, end_ns FROM spans WHERE kind = 'task'")
    b = breakdown(run)
    assert b.tasks == len(tasks) == 13
    assert b.compute_s == pytest.approx(((tasks["end_ns"] - tasks["start_ns"]).sum()) / 1e9, rel=1e-3)
    groups = task_groups(run).set_index("group")
    assert groups.loc["work", "count"] == 12 and groups.loc["total", "count"] == 1
    util = utilisation_by_resource(run)
    assert set(util["resource_id"]) == set(tasks["resource_id"]), "the worker threads execute"
    check_states(run)
    res = _cli("show", str(run.path), "--json")
    doc = json.loads(res.stdout)
    assert doc["critical_path"]["structural_ns"] > 0 and doc["breakdown"]["tasks"] == 13


def test_local_scheduler_run(tmp_path):
    import dask

    with flowscope.observe(store=tmp_path, name="local") as obs:
        xs = [dask.delayed(_work, pure=True)(i, dask_key_name=f"work-{i}") for i in range(8)]
        dask.compute(*xs, scheduler="threads")
    run = obs.run
    assert run.meta.get("semantics")
    tasks = run.sql("SELECT resource_id, end_ns - start_ns AS d FROM spans WHERE kind = 'task'")
    b = breakdown(run)
    assert b.tasks == 8 and b.compute_s == pytest.approx(tasks["d"].sum() / 1e9, rel=1e-3)
    assert set(utilisation_by_resource(run)["resource_id"]) == set(tasks["resource_id"])
    check_states(run)


# ---- the analyses speak the vocabulary -------------------------------------------------------------------

SOURCE_NAMES = [
    re.compile(r"""kind\s*(=|==|<>|!=)\s*['"](task|call|state|transfer|disk-read|disk-write)['"]"""),
    re.compile(r"""\[\s*['"]kind['"]\s*\]\s*(==|!=)\s*['"]task['"]"""),
    re.compile(r"""kind\s+IN\s*\(\s*'(disk-read|task)"""),
]


def test_analyses_report_and_cli_do_not_select_one_sources_names():
    hits = []
    for sub in ("analysis", "report", "cli"):
        for path in sorted((ROOT / "src/flowscope" / sub).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if any(p.search(line) for p in SOURCE_NAMES):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "analyses read the semantic vocabulary, not a source's kinds:\n" + "\n".join(hits)


# ---- the report draws what the vocabulary gives ----------------------------------------------------------

def test_the_report_of_a_starpu_trace_draws_breakdown_utilisation_and_groups(shared_data, tmp_path):
    """The StarPU trace's report (its pages file, drawn in headless Chromium): the profile page's breakdown (with
    idle time, drawn), the utilisation of both StarPU workers by name and the codelets as groups; the measured
    critical path on the critical-path page."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_report import open_view

    from flowscope.report import write_report

    run = _import(shared_data, "paje/starpu-demo/paje.trace", tmp_path)
    path = write_report(run, tmp_path / "report.html")
    blocked: list = []
    with open_view(path, "profile", blocked) as (pg, console, errors):
        pg.wait_for_function("() => { const d = document.getElementById('pf-chart'); return d && d.calcdata; }")
        cells = "sel => Array.from(document.querySelectorAll(sel)).map(e => e.textContent)"
        util = pg.evaluate(cells, "table.utilisation tbody tr td.key")
        categories = pg.evaluate("() => Array.from(document.querySelectorAll('table.breakdown tbody tr')).map(tr => "
                                 "tr.dataset.category)")
        groups = pg.evaluate("() => Array.from(document.querySelectorAll('table.groups tbody tr')).map(tr => "
                             "tr.dataset.group)")
        nodata = pg.locator("#pf-breakdown .nodata").count()
        drawn = pg.evaluate("() => document.querySelectorAll('#pf-chart .trace').length")
        assert not [m for m in console if m[0] == "error"] and not errors and not blocked
        assert pg.evaluate("() => flowscopeView.errors") == []
    assert "CPU0" in util and "CPU1" in util, ("both StarPU workers, by name", util)
    assert "idle" in categories and nodata == 0 and drawn > 0
    assert "scal" in groups and "axpy" in groups
    with open_view(path, "critical-path") as (pg, _console, errors):
        assert pg.locator("#cp-task-facts").inner_text().startswith("Measured critical path")
        assert not errors


def test_task_states_map_to_phases_first_rule_wins_and_a_bad_phase_is_refused():
    from flowscope.model.semantics import GENERIC, SemanticsError, check_mapping, state_phases

    mine = {"source": "mine", "transitions": [{"when": {"to_state": "fin*"}, "phase": "done"},
                                              {"when": {"to_state": "memory"}, "phase": "other"}]}
    got = state_phases([mine, GENERIC], ["finished_ok", "memory", "erred", "processing", "launched", None])
    # a declared rule comes before the generic ones (memory is not done here), unknown states are other
    assert got == {"finished_ok": "done", "memory": "other", "erred": "erred", "processing": "running",
                   "launched": "other", None: "other"}
    with pytest.raises(SemanticsError, match=r"semantics\.transitions\[0\]\.phase: 'finished' is not one of"):
        check_mapping({"transitions": [{"when": {"to_state": "x"}, "phase": "finished"}]})
    with pytest.raises(SemanticsError, match=r"semantics\.transitions\[0\]\.when: 'name' is not a column \(to_state\)"):
        check_mapping({"transitions": [{"when": {"name": "x"}, "phase": "done"}]})
