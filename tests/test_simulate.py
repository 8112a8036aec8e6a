"""The Crux patterns, run as real processes, give exactly their critical path by construction; random DAGs."""

from __future__ import annotations

import numpy as np
import pytest

from flowscope.analysis.critical_path import data_state_path
from flowscope.cli.simulate import simulate
from flowscope.sim.dag import layered_dag
from flowscope.sim.patterns import PATTERNS, build, execute
from flowscope.store.run import open_run


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_critical_path(pattern, tmp_path):
    res = simulate(pattern, ranks=3, seed=7, scale=0.4, size=4096, store=tmp_path / "store",
                   workdir=tmp_path / "files")
    plan = build(pattern, ranks=3, seed=7, scale=0.4)
    # the path the plan implies, written out per pattern from the slowest ranks
    a, c = plan.slowest.get("mpi"), plan.slowest.get("mpi2")
    expected = {
        "crux-generic": ["source", "staged", f"part-{a}", f"mpi-out-{a}", "post", "viz"],
        "crux-data-splits": ["source", "staged", f"part-{a}", f"node-{a}", f"mpi-out-{a}", "post", "viz"],
        "crux-checkpoint": ["source", "staged", f"part-{a}", f"mpi-out-{a}", "checkpoint", f"restart-{c}",
                            f"mpi2-out-{c}", "post2", "viz"],
        "crux-multiple-sources": ["source2", "loaded", f"mpi2-out-{c}", "post2", "viz"],
        "crux-create-delete": ["source", "staged", f"part-{a}", f"mpi-out-{a}", f"tmp-{a}", "post",
                               f"mpi2-out-{c}", "post2", "viz"],
    }[pattern]
    assert plan.expected == expected
    assert res["observed"] == expected  # online, from the collector's incremental path
    run = open_run(res["run_dir"])
    offline = data_state_path(run.table("data_states"), run.table("mutations"))
    assert offline.ids == expected
    assert offline.length_ns == res["length_ns"]
    # real files were written and read: sizes are the configured ones; every job is a span
    states = run.table("data_states").set_index("state_id")
    assert int(states.loc["viz", "size_bytes"]) == 4096
    steps = run.sql("SELECT count(*) AS n FROM spans WHERE kind = 'step'")["n"].iloc[0]
    assert steps == len(plan.jobs)
    if pattern == "crux-create-delete":
        kinds = run.table("mutations")["kind"].value_counts()
        assert kinds["DELETE"] == 3
        assert not any((tmp_path / "files" / f"tmp-{i}.dat").exists() for i in range(3))


@pytest.mark.parametrize("pattern", ["crux-data-splits", "crux-create-delete"])
def test_the_slowest_rank_gates_the_merge_even_when_a_sibling_is_delayed(pattern, tmp_path):
    """On a busy machine a sibling rank's process may start or run late by more than any margin; the rank the
    plan made slowest still delivers its output last, so the critical path is the planned one."""
    from flowscope import Client

    plan = build(pattern, ranks=3, seed=7, scale=0.4)
    a = plan.slowest["mpi"]
    jobs = {j.name: j for j in plan.jobs}
    other = f"mpi-{(a + 1) % 3}"
    jobs[other].sleep = jobs[f"mpi-{a}"].sleep + 1.0  # the machine delayed this rank beyond the plan's margin
    client = Client("embedded", store=tmp_path / "store", serve=True, name=pattern)
    try:
        times = execute(plan, client, tmp_path / "files", size=1024)
    finally:
        client.close()
    run = open_run(client.run_dir)
    states = run.table("data_states").set_index("state_id")["ts_ns"]
    outs = [f"mpi-out-{i}" for i in range(3)]
    assert states[outs].idxmax() == f"mpi-out-{a}"
    assert times[f"mpi-{a}"][1] > times[other][1]
    assert data_state_path(run.table("data_states"), run.table("mutations")).ids == plan.expected


def test_unknown_pattern_and_bad_ranks():
    with pytest.raises(ValueError, match="unknown pattern 'crux-nope'"):
        build("crux-nope")
    with pytest.raises(ValueError, match="--ranks must be at least 1"):
        build("crux-generic", ranks=0)


def test_layered_dag_is_time_ordered_and_acyclic():
    import networkx as nx

    states, muts = layered_dag(2_000, 10_000, seed=3)
    assert states.num_rows == 2_000 and muts.num_rows == 10_000
    ts = dict(zip(states["state_id"].to_pylist(), states["ts_ns"].to_pylist()))
    src, dst = muts["src_state_id"].to_pylist(), muts["dst_state_id"].to_pylist()
    assert all(ts[s] < ts[d] for s, d in zip(src, dst))
    g = nx.DiGraph(zip(src, dst))
    assert nx.is_directed_acyclic_graph(g)
    again = layered_dag(2_000, 10_000, seed=3)
    assert again[1].equals(muts)  # seeded
    assert not layered_dag(2_000, 10_000, seed=4)[1].equals(muts)
    # sizes are within the generator's range and never negative
    assert int(np.min(states["size_bytes"].to_numpy())) >= 0
