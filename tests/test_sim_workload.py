"""The DAG workload simulator (sim/workload.py): DAGs with the paper's properties, valid list schedules,
seeded output, Paje traces that flowscope re-imports and pj_dump reads alike, costs fitted to the real StarPU
trace, and `flowscope simulate dag`."""

from __future__ import annotations

import json
import subprocess
import sys

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from conftest import needs_tool
from test_paje import _export_origin, pj_records

from flowscope.analysis.forecast.signal import event_signal, run_signal
from flowscope.analysis.timeline import resource_states
from flowscope.exporters import export_run
from flowscope.importers import import_paths
from flowscope.sim.workload import (
    EPOCH_NS,
    STARPU_DEMO_COSTS,
    corpus,
    fit_costs,
    list_schedule,
    random_dag,
    schedule_states,
    write_run,
)
from flowscope.store.run import open_run


@pytest.mark.parametrize("tasks", [1000, 2600, 4000])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dags_have_the_papers_properties(tasks, seed):
    dag = random_dag(tasks, seed=seed)
    p = dag.properties()
    assert p["tasks"] == tasks
    assert 1.7 * tasks - 0.5 <= p["edges"] <= 1.9 * tasks + 0.5
    assert p["edges"] == round(dag.params["edge_ratio"] * tasks)
    assert 7 <= p["max_out_degree"] <= 18 and p["max_out_degree"] == dag.params["max_out_degree"]
    assert 26 <= p["levels"] <= 132 and p["levels"] == dag.params["levels"]
    # checked independently of the generator's own bookkeeping
    g = nx.DiGraph()
    g.add_nodes_from(range(tasks))
    g.add_edges_from(zip(dag.src.tolist(), dag.dst.tolist()))
    assert g.number_of_edges() == p["edges"]  # no edge twice
    assert nx.is_directed_acyclic_graph(g)
    assert nx.dag_longest_path_length(g) + 1 == p["levels"]
    assert max(d for _, d in g.out_degree()) == p["max_out_degree"]
    # a task's level is the length of the longest chain of tasks ending at it
    depth = {}
    for v in nx.topological_sort(g):
        depth[v] = 1 + max((depth[u] for u in g.predecessors(v)), default=0)
    assert [depth[v] for v in range(tasks)] == dag.level.tolist()


def test_dags_with_given_properties_and_refusals():
    dag = random_dag(1500, seed=5, edge_ratio=1.8, max_out_degree=9, levels=40)
    assert dag.properties() == {"tasks": 1500, "edges": 2700, "max_out_degree": 9, "levels": 40}
    with pytest.raises(ValueError, match="tasks: must be an integer >= 2"):
        random_dag(1)
    with pytest.raises(ValueError, match="levels: must lie in 2..tasks"):
        random_dag(100, levels=101)
    with pytest.raises(ValueError, match="edges: edge_ratio \\* tasks must be at least"):
        random_dag(1000, edge_ratio=0.5, levels=30)
    with pytest.raises(ValueError, match="max_out_degree: must be at least"):
        random_dag(1000, max_out_degree=1, levels=30)


def _check_schedule(run) -> None:
    spans = run.table("spans")
    deps = run.table("dependencies")
    tasks = spans[spans["kind"] == "task"].set_index("task_key")
    fetch = spans[spans["kind"] == "transfer"].set_index("task_key")
    transfers = run.table("transfers")
    moved = {(k[0], json.loads(a)["for_task"], r): e
             for k, a, r, e in zip(transfers["keys"], transfers["attrs"], transfers["dst_resource_id"], transfers["end_ns"])}
    assert len(moved) == len(transfers)
    # no task before its parents end (plus the transfer when they ran elsewhere)
    for child, parent in zip(deps["task_key"], deps["depends_on"]):
        c, p = tasks.loc[child], tasks.loc[parent]
        assert c["start_ns"] >= p["end_ns"]
        if c["resource_id"] != p["resource_id"]:
            arrived = moved[(parent, child, c["resource_id"])]
            assert arrived >= p["end_ns"] and c["start_ns"] >= arrived
            assert fetch.loc[child, "end_ns"] == c["start_ns"]  # fetched right before it ran
    # no two spans overlap on one resource
    for _, g in spans.groupby("resource_id"):
        g = g.sort_values("start_ns")
        assert (g["start_ns"].to_numpy()[1:] >= g["end_ns"].to_numpy()[:-1]).all()
    # every dependency between two resources is one transfer; none within one resource
    remote = sum(tasks.loc[c, "resource_id"] != tasks.loc[p, "resource_id"]
                 for c, p in zip(deps["task_key"], deps["depends_on"]))
    assert len(transfers) == remote


@pytest.mark.parametrize("resources", [8, 256])
def test_the_schedule_is_valid(tmp_path, resources):
    sch = list_schedule(random_dag(1200, seed=11), resources, seed=11)
    run = open_run(write_run(sch, tmp_path / "store"))
    _check_schedule(run)
    spans = run.table("spans")
    assert spans["resource_id"].nunique() == resources  # every resource appears (at least its initialisation)
    assert (spans["kind"] == "task").sum() == 1200
    # the run's own span is the simulated one, not when the simulation ran
    assert run.meta["start_ns"] == EPOCH_NS and run.meta["end_ns"] == EPOCH_NS + sch.makespan_ns
    assert run.meta["status"] == "finished" and run.meta["simulation"]["levels"] == sch.dag.levels
    # the scheduler placed each task where it finished first: never later than the free-earliest resource allows
    assert sch.makespan_ns <= int(sch.duration.sum() + sch.comm.sum() + sch.init_ns.max())
    # the canonical run's timeline is the one the schedule implies (what the experiment samples directly)
    ours = schedule_states(sch)[["resource_id", "start_ns", "end_ns", "state"]]
    theirs = resource_states(run)[["resource_id", "start_ns", "end_ns", "state"]]
    key = ["resource_id", "start_ns"]
    pd.testing.assert_frame_equal(ours.sort_values(key, ignore_index=True), theirs.sort_values(key, ignore_index=True))
    for event in ("idle", "compute", "communication"):
        a, b = event_signal(schedule_states(sch), event), run_signal(run, event)
        assert a.resources == b.resources == resources
        assert np.array_equal(a.counts, b.counts) and a.period_ns == b.period_ns
    run.close()


def test_the_same_seed_gives_the_same_output(tmp_path):
    runs, traces = [], []
    for i, seed in enumerate([4, 4, 5]):
        run_dir = write_run(list_schedule(random_dag(1000, seed=seed), 16, seed=seed), tmp_path / f"s{i}")
        runs.append(open_run(run_dir))
        traces.append(export_run(run_dir, "paje", tmp_path / f"{i}.paje")[0].read_bytes())
    for table in ("resources", "spans", "dependencies", "transfers"):
        a, b, c = (r.arrow(table).sort_by([(n, "ascending") for n in _sort_keys(table)]) for r in runs)
        assert a.equals(b), table
        assert not a.equals(c), table
    # the Paje files differ only in the comment naming the run (its id)
    body = [b"\n".join(line for line in t.split(b"\n") if not line.startswith(b"# run ")) for t in traces]
    assert body[0] == body[1] and body[0] != body[2]
    for r in runs:
        r.close()


def _sort_keys(table: str) -> list[str]:
    return {"resources": ["resource_id"], "spans": ["span_id"], "dependencies": ["task_key", "depends_on"],
            "transfers": ["transfer_id"]}[table]


@needs_tool("pj_dump", "pajeng")
def test_the_paje_trace_imports_back_and_pj_dump_agrees(tmp_path):
    sch = list_schedule(random_dag(1000, seed=2), 32, seed=2)
    run = open_run(write_run(sch, tmp_path / "a"))
    out, counts = export_run(run.path, "paje", tmp_path / "dag.paje")
    spans = run.sql("SELECT resource_id, kind, name, start_ns, end_ns, task_key FROM spans ORDER BY ALL")
    assert counts["states"] == len(spans) and counts["links"] == len(run.table("transfers"))
    # flowscope's Paje importer gives the same spans back
    res = import_paths([out], tmp_path / "b", fmt="paje")
    back = open_run(res.run_dir)
    again = back.sql("SELECT resource_id, kind, name, start_ns, end_ns, task_key FROM spans ORDER BY ALL")
    pd.testing.assert_frame_equal(spans, again)
    assert np.array_equal(run_signal(back, "idle").counts, run_signal(run, "idle").counts)
    # pj_dump reads the same states: container, start, end, value (times in the export's clock: from the origin)
    rc, records, err = pj_records(out, 1e9)
    assert rc == 0, err
    origin = _export_origin(out)
    names = dict(zip(run.table("resources")["resource_id"], run.table("resources")["name"]))
    pj = sorted((r[1], r[3], r[4], r[6]) for r in records if r[0] == "State")
    ours = sorted((names[r], s - origin, e - origin, n) for r, n, s, e in
                  zip(spans["resource_id"], spans["name"], spans["start_ns"], spans["end_ns"]))
    assert pj == ours
    run.close()
    back.close()


def test_the_costs_are_the_fit_of_the_real_starpu_trace(tmp_path, shared_data):
    res = import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], tmp_path / "store")
    run = open_run(res.run_dir)
    fit = fit_costs(run, nbytes=800_000)
    assert set(fit.kinds) == set(STARPU_DEMO_COSTS.kinds) == {"scal", "axpy"}
    for k, (share, dist) in fit.kinds.items():
        want_share, want = STARPU_DEMO_COSTS.kinds[k]
        assert share == pytest.approx(want_share) and dist.n == want.n
        assert dist.mu == pytest.approx(want.mu, abs=1e-6) and dist.sigma == pytest.approx(want.sigma, abs=1e-6)
    for got, want in ((fit.transfer, STARPU_DEMO_COSTS.transfer), (fit.init, STARPU_DEMO_COSTS.init)):
        assert got.n == want.n
        assert got.mu == pytest.approx(want.mu, abs=1e-6) and got.sigma == pytest.approx(want.sigma, abs=1e-6)
    # the simulated durations follow the fit: each kind's median within 10 % of the trace's
    sch = list_schedule(random_dag(4000, seed=1), 64, seed=1)
    for code, k in enumerate(sch.dag.kinds):
        med = float(np.median(sch.duration[sch.dag.kind == code]))
        assert med == pytest.approx(STARPU_DEMO_COSTS.kinds[k][1].median, rel=0.1)
    run.close()


def test_the_corpus_subsets_are_disjoint_and_cover_every_group():
    dags = corpus(8, 3, seed=0)
    assert len(dags) == 16 * 11
    assert len({(d.group, d.index) for d in dags}) == len(dags)
    for s in range(11):
        groups = sorted(d.group for d in dags if d.subset == s)
        assert groups == list(range(1000, 4001, 200))
    assert all(d.group <= d.tasks <= d.group + 25 for d in dags)
    assert corpus(8, 3, seed=0) == dags and corpus(8, 3, seed=1) != dags


def test_cli_simulate_dag(tmp_path):
    cmd = [sys.executable, "-m", "flowscope", "simulate", "dag", "--tasks", "1000", "--resources", "16", "--seed",
           "1", "--store", str(tmp_path / "store"), "--paje", str(tmp_path / "t.paje"), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    dag = random_dag(1000, seed=1)
    assert {k: res[k] for k in ("tasks", "edges", "max_out_degree", "levels")} == dag.properties()
    assert res["resources"] == 16 and 0 < res["utilisation"] <= 1
    run = open_run(res["run_dir"])
    assert (run.table("spans")["kind"] == "task").sum() == 1000
    assert (tmp_path / "t.paje").stat().st_size > 0
    run.close()
    bad = subprocess.run([*cmd[:6], "1", *cmd[7:]], capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1].endswith("tasks: must be an integer >= 2, got 1")
