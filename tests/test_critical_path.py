"""Workflow Critical Path: the MERGE rule on the paper's Fig. 6, the structural path against networkx, the measured
path on a real Dask run, incremental == offline, what-if replays, the Dask data-state graph."""

from __future__ import annotations

import itertools
import json
import re
import time

import networkx as nx
import numpy as np
import pandas as pd
import pytest

from distributed import Client as DaskClient
from distributed import LocalCluster

from flowscope.analysis.critical_path import (COMPONENTS, IncrementalDataStatePath, data_state_path,
                                              longest_path, longest_path_length, near_critical_paths, slack,
                                              task_graph_paths, what_if)
from flowscope.analysis.dataflow import data_states_from_tasks
from flowscope.sources.dask import observe

S = 10**9


def fig6() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The Crux paper's Fig. 6: D took 6 s to create from A (through B, C), E 2 s; F merges D and E at 1:08."""
    t0 = 60 * S
    states = pd.DataFrame({"state_id": list("ABCDEF"),
                           "ts_ns": [t0, t0 + 2 * S, t0 + 4 * S, t0 + 6 * S, t0 + 2 * S, t0 + 8 * S],
                           "label": ["input", "b", "c", "d", "e", "merged"],
                           "location": ["node1:disk1"] + ["node1:memory"] * 5})
    mutations = pd.DataFrame({"src_state_id": list("ABCAED"), "dst_state_id": list("BCDEFF"),
                              "kind": ["TRANSFER", "CONVERT", "CONVERT", "TRANSFER", "MERGE", "MERGE"],
                              "application": ["stagein", "pre", "pre", "stagein", "post", "post"]})
    return states, mutations


def test_merge_takes_the_input_that_arrived_last_fig6():
    states, mutations = fig6()
    p = data_state_path(states, mutations)
    assert p.ids == list("ABCDF")
    assert p.length_ns == 8 * S
    assert p.steps["duration_ns"].sum() == p.length_ns
    # the order of the mutation rows does not matter
    p2 = data_state_path(states.iloc[::-1], mutations.iloc[::-1])
    assert p2.ids == list("ABCDF")
    # if E had arrived last (at 1:07) the path would go through it
    late = states.copy()
    late.loc[late["state_id"] == "E", "ts_ns"] = 67 * S
    assert data_state_path(late, mutations).ids == ["A", "E", "F"]
    # A -> B is a transfer from disk: I/O; the rest computes
    comp = p.by_component().set_index("component")["duration_ns"]
    assert comp["io"] == 2 * S and comp["compute"] == 6 * S and comp["wait"] == 0
    assert list(p.by_component()["component"]) == list(COMPONENTS)
    assert p.by_application().set_index("application")["duration_ns"].to_dict() == {
        "pre": 4 * S, "stagein": 2 * S, "post": 2 * S}


def test_a_wait_after_the_last_input_is_its_own_component():
    states, mutations = fig6()
    mutations = mutations.copy()
    mutations["attrs"] = None
    # the merge only began at 1:07: 1 s of waiting after D arrived, then 1 s of merging
    mutations.loc[mutations["dst_state_id"] == "F", "attrs"] = '{"start_ns": %d}' % (67 * S)
    p = data_state_path(states, mutations)
    wait = p.steps[p.steps["kind"] == "WAIT"]
    assert len(wait) == 1 and int(wait["duration_ns"].iloc[0]) == S
    assert p.steps["duration_ns"].sum() == 8 * S


def test_bad_data_state_graphs_are_named():
    states, mutations = fig6()
    bad = mutations.copy()
    bad.loc[2, "src_state_id"] = "Z"
    with pytest.raises(ValueError, match=r"src_state_id 'Z' \(row 2\)"):
        data_state_path(states, bad)
    older = mutations.copy()
    older.loc[0, ["src_state_id", "dst_state_id"]] = ["D", "B"]
    with pytest.raises(ValueError, match="row 0 .*older than its source"):
        data_state_path(states, older)
    with pytest.raises(ValueError, match="missing column.*ts_ns"):
        data_state_path(states.drop(columns="ts_ns"), mutations)
    with pytest.raises(ValueError, match="cycle"):
        longest_path_length(3, [0, 1, 2], [1, 2, 0])


def _random_dag(rng, n: int, m: int):
    perm = rng.permutation(n)
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = a != b
    a, b = a[keep], b[keep]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return perm[lo], perm[hi], rng.integers(0, 1000, len(lo)).astype(float)


def test_structural_length_agrees_with_networkx_on_1000_random_dags():
    rng = np.random.default_rng(4)
    for i in range(1000):
        n = int(rng.integers(1, 60))
        src, dst, w = _random_dag(rng, n, int(rng.integers(0, 4 * n + 1)))
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        for s, d, x in sorted(zip(src.tolist(), dst.tolist(), w.tolist()), key=lambda e: e[2]):
            g.add_edge(s, d, weight=x)   # a duplicate edge keeps its largest weight
        expect = nx.dag_longest_path_length(g, weight="weight") if g.number_of_edges() else 0
        assert longest_path_length(n, src, dst, w) == pytest.approx(expect, rel=1e-12, abs=0), f"DAG {i}"
        length, path = longest_path(n, src, dst, w)
        assert sum(g[u][v]["weight"] for u, v in zip(path[:-1], path[1:])) == pytest.approx(length)


def _networkx_length(n: int, src, dst, w) -> float:
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for s, d, x in sorted(zip(src.tolist(), dst.tolist(), w.tolist()), key=lambda e: e[2]):
        g.add_edge(s, d, weight=x)   # a duplicate edge keeps its largest weight
    return nx.dag_longest_path_length(g, weight="weight") if g.number_of_edges() else 0


def _deep_dag(rng, chains: int, length: int, cross: int, span: int):
    """``chains`` chains of ``length`` vertices (so ``length`` levels), plus ``cross`` edges from a vertex to one
    of any chain 1..span positions further; vertex numbers shuffled, duplicate edges kept."""
    n = chains * length
    perm = rng.permutation(n)

    def at(chain, position):
        return chain * length + position

    c = np.repeat(np.arange(chains), length - 1)
    i = np.tile(np.arange(length - 1), chains)
    cs, ci = rng.integers(0, chains, cross), rng.integers(0, length - 1, cross)
    cj = np.minimum(ci + rng.integers(1, span + 1, cross), length - 1)
    src = np.concatenate([at(c, i), at(cs, ci)])
    dst = np.concatenate([at(c, i + 1), at(rng.integers(0, chains, cross), cj)])
    return n, perm[src], perm[dst], rng.integers(0, 1000, len(src)).astype(float)


def test_structural_length_agrees_with_networkx_on_deep_dags():
    # the level-by-level pass this replaced needed one round per level: thousands of levels here
    rng = np.random.default_rng(5)
    for i in range(20):
        n, src, dst, w = _deep_dag(rng, int(rng.integers(1, 4)), int(rng.integers(500, 3000)),
                                   int(rng.integers(0, 6000)), int(rng.integers(1, 5)))
        expect = _networkx_length(n, src, dst, w)
        assert longest_path_length(n, src, dst, w) == pytest.approx(expect, rel=1e-12, abs=0), f"DAG {i}"
        length, path = longest_path(n, src, dst, w)
        assert length == pytest.approx(expect, rel=1e-12, abs=0)
        best = {}
        for s, d, x in zip(src.tolist(), dst.tolist(), w.tolist()):
            best[s, d] = max(best.get((s, d), -1.0), x)
        assert sum(best[u, v] for u, v in itertools.pairwise(path)) == pytest.approx(length)


def _dask_edges(*collections) -> tuple[int, np.ndarray, np.ndarray]:
    """The task graph Dask's scheduler receives for ``collections`` (optimised, as Client.compute sends it),
    as edge arrays over task numbers."""
    from dask.base import collections_to_expr
    from dask.core import get_dependencies

    dsk = dict(collections_to_expr(list(collections), optimize_graph=True).optimize().__dask_graph__())
    number = {k: i for i, k in enumerate(dsk)}
    pairs = [(number[d], number[k]) for k in dsk for d in get_dependencies(dsk, k)]
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*pairs))
    return len(dsk), src, dst


def test_structural_length_agrees_with_networkx_on_real_dask_graphs():
    import dask.array as da
    import dask.dataframe as dd

    x = da.random.random((600, 600), chunks=(50, 50))
    y = (x + x.T) - (x + x.T).mean(axis=0)                       # transpose, tree reduction, broadcast
    y = y.rechunk((25, 200)).rechunk((50, 50)).cumsum(axis=1)    # rechunk both ways, a sequential scan
    frame = dd.from_pandas(pd.DataFrame({"a": np.arange(20_000) % 97, "b": np.arange(20_000.0)}), npartitions=24)
    shuffled = frame.shuffle("a", shuffle_method="tasks")
    per_key = shuffled.groupby("a").b.sum(split_out=4)
    rng = np.random.default_rng(9)
    for collections in [(y,), (shuffled.b.cumsum(),), (per_key,), (y.sum(), y.std(axis=0))]:
        n, src, dst = _dask_edges(*collections)
        assert len(src) >= n - len(collections)            # a connected graph, not an empty one
        w = rng.integers(0, 10**6, len(src)).astype(float)
        perm = rng.permutation(n)
        src, dst = perm[src], perm[dst]
        assert longest_path_length(n, src, dst, w) == pytest.approx(_networkx_length(n, src, dst, w), rel=1e-12)


def test_longest_to_on_a_large_shuffled_graph_equals_a_level_by_level_reference():
    """A graph large enough that the sweep's scratch buffers take its large-buffer allocation (over 1 MiB each:
    300,000 vertices, 900,000 edges with duplicates), vertex numbers shuffled, weights on edges and vertices:
    every vertex's longest arrival equals a numpy pass level by level, to the bit (the same additions and
    maxima), and so does the length."""
    from flowscope.analysis.graph_kernels import longest_to

    rng = np.random.default_rng(21)
    n, m, levels = 300_000, 900_000, 40
    level = np.sort(np.concatenate([np.arange(levels), rng.integers(0, levels, n - levels)]))  # none empty
    src = rng.integers(0, n, m)
    later = level[src] < levels - 1
    src = src[later]
    to_level = np.minimum(level[src] + rng.integers(1, 4, len(src)), levels - 1)
    first = np.searchsorted(level, to_level)
    count = np.searchsorted(level, to_level, side="right") - first
    dst = first + (rng.random(len(src)) * count).astype(np.int64)
    dup = rng.integers(0, len(src), len(src) // 10)
    src, dst = np.concatenate([src, src[dup]]), np.concatenate([dst, dst[dup]])
    w, vw = rng.random(len(src)), rng.random(n)
    expect = np.full(n, -np.inf)
    for lv in range(levels):                   # vertices in level order: all in-edges come from earlier levels
        at = np.flatnonzero(level == lv)
        into = np.flatnonzero(level[dst] == lv)
        best = np.full(n, -np.inf)
        np.maximum.at(best, dst[into], expect[src[into]] + w[into])
        expect[at] = np.where(np.isfinite(best[at]), best[at], 0.0) + vw[at]
    perm = rng.permutation(n)
    got = longest_to(n, perm[src], perm[dst], w, vw[np.argsort(perm)])
    np.testing.assert_array_equal(got[perm], expect)
    assert longest_path_length(n, perm[src], perm[dst], w, vw[np.argsort(perm)]) == expect.max()


def test_a_cycle_is_named_by_a_vertex_on_it():
    # 0 -> 1 -> 2 -> 3 -> 1 is a cycle; 4 hangs behind it; 5 -> 6 is fine
    with pytest.raises(ValueError, match=r"cycle through vertex 1 \(1 -> 2 -> 3 -> 1\)") as e:
        longest_path_length(7, [0, 1, 2, 3, 3, 5], [1, 2, 3, 1, 4, 6])
    assert e.value.cycle == [1, 2, 3]
    assert e.value.vertex == 1
    assert "4 of 7 vertices" in str(e.value)
    with pytest.raises(ValueError, match=r"cycle through vertex 2 \(2 -> 2\)"):
        longest_path_length(3, [0, 2], [1, 2])
    # a back edge planted in random DAGs: the cycle reported is one of the graph's
    rng = np.random.default_rng(13)
    for i in range(200):
        n = int(rng.integers(2, 80))
        src, dst, w = _random_dag(rng, n, int(rng.integers(1, 4 * n + 1)))
        if len(src) == 0:
            continue
        j = int(rng.integers(0, len(src)))
        u, v = int(src[j]), int(dst[j])
        back_src, back_dst = np.append(src, v), np.append(dst, u)
        with pytest.raises(ValueError, match="cycle") as e:
            longest_path(n, back_src, back_dst, np.append(w, 1.0))
        cyc = e.value.cycle
        edges = set(zip(back_src.tolist(), back_dst.tolist()))
        assert all((a, b) in edges for a, b in zip(cyc, cyc[1:] + cyc[:1])), f"graph {i}: {cyc}"
        assert len(set(cyc)) == len(cyc)


def test_bad_edges_and_weights_are_named():
    with pytest.raises(ValueError, match=r"edge 1 \(1 -> 7\): 7 is not a vertex number in \[0, 3\)"):
        longest_path_length(3, [0, 1], [1, 7])
    with pytest.raises(ValueError, match=r"edge 0 \(-1 -> 1\): -1 is not a vertex number"):
        longest_path_length(3, [-1], [1])
    with pytest.raises(ValueError, match=r"edge weights: edge 1 has weight nan; weights must be finite"):
        longest_path_length(3, [0, 1], [1, 2], [1.0, float("nan")])
    with pytest.raises(ValueError, match=r"vertex weights: vertex 2 has weight inf"):
        longest_path_length(3, [0, 1], [1, 2], None, [0.0, 1.0, float("inf")])
    with pytest.raises(ValueError, match="same length"):
        longest_path_length(3, [0, 1], [1])
    with pytest.raises(ValueError, match=r"4,294,967,296 vertices; the longest path handles 0 to 4,294,967,294"):
        longest_path_length(2**32, [0], [1])
    with pytest.raises(ValueError, match=r"-1 vertices"):
        longest_path(-1, [], [])


def test_negative_weights_and_lone_vertices():
    # what_if puts negative lags on edges: a longest path may be shorter than its heaviest vertex alone
    assert longest_path_length(3, [0], [1], [-5.0], [2.0, 1.0, 4.0]) == 4.0
    assert longest_path_length(2, [0], [1], [-5.0], [2.0, 1.0]) == 2.0
    assert longest_path_length(2, [0, 0], [1, 1], [-5.0, -1.0], [0.0, 0.0]) == 0.0
    assert longest_path(3, [0], [1], [-1.0], [2.0, 3.0, 1.0]) == (4.0, [0, 1])
    assert longest_path_length(4, [], [], None, None) == 0.0


def test_vertex_weights_count_like_a_split_vertex():
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = 30
        src, dst, w = _random_dag(rng, n, 80)
        vw = rng.integers(0, 100, n).astype(float)
        # the same graph with each vertex v split into v_in -> v_out carrying its weight
        g = nx.DiGraph()
        for v in range(n):
            g.add_edge(("in", v), ("out", v), weight=vw[v])
        for s, d, x in sorted(zip(src.tolist(), dst.tolist(), w.tolist()), key=lambda e: e[2]):
            g.add_edge(("out", s), ("in", d), weight=x)
        assert longest_path_length(n, src, dst, w, vw) == pytest.approx(nx.dag_longest_path_length(g))


def test_incremental_equals_offline_at_every_batch():
    rng = np.random.default_rng(11)
    n = 400
    ts = np.sort(rng.integers(0, 10**6, n)) * 1000
    src, dst = [], []
    for v in range(1, n):
        for u in set(rng.integers(max(0, v - 30), v, int(rng.integers(1, 4))).tolist()):
            src.append(u)
            dst.append(v)
    ids = np.array([f"s{i}" for i in range(n)])
    states = pd.DataFrame({"state_id": ids, "ts_ns": ts, "location": rng.choice(["n1:disk", "w1:memory"], n)})
    mutations = pd.DataFrame({"src_state_id": ids[src], "dst_state_id": ids[dst],
                              "kind": rng.choice(["CONVERT", "MERGE", "TRANSFER"], len(src))})
    inc = IncrementalDataStatePath()
    cuts_s = np.linspace(0, n, 9).astype(int)
    cuts_m = np.linspace(0, len(mutations), 9).astype(int)
    for k in range(8):
        # mutations arrive in a different batching than states; some before their states
        inc.add(None, mutations.iloc[cuts_m[k]:cuts_m[k + 1]])
        inc.add(states.iloc[cuts_s[k]:cuts_s[k + 1]], None)
        known = set(states["state_id"].iloc[:cuts_s[k + 1]])
        sub = mutations.iloc[:cuts_m[k + 1]]
        sub = sub[sub["src_state_id"].isin(known) & sub["dst_state_id"].isin(known)]
        offline = data_state_path(states.iloc[:cuts_s[k + 1]], sub)
        online = inc.current()
        assert online.ids == offline.ids
        pd.testing.assert_frame_equal(online.steps, offline.steps)
    assert inc.pending == 0
    assert inc.current().ids[-1] == f"s{n - 1}"


# ---- hand-built runs whose measured path is known in advance ------------------------------------------------

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def hand_built_run(tmp_path, tasks: dict, deps: list, transfers: list = ()):
    """A run written row by row through a Client, as a Dask capture would write it. ``tasks``: key -> (worker,
    thread, start ms, end ms); ``deps``: (task, the task it depends on); ``transfers``: (key, from worker, to
    worker, start ms, end ms). Times are ms after T0."""
    import flowscope

    fs = flowscope.Client("embedded", store=tmp_path / "store", name="hand-built")
    for key, (worker, thread, s, e) in tasks.items():
        fs.emit("spans", resource_id=f"thread:{worker}:{thread}", kind="task", name=key.rstrip("0123456789"),
                start_ns=T0 + s * MS, end_ns=T0 + e * MS, task_key=key,
                attrs=json.dumps({"worker": f"tcp://{worker}:1", "thread_ident": thread}))
    for key, dep in deps:
        fs.emit("dependencies", task_key=key, depends_on=dep)
    for key, src, dst, s, e in transfers:
        fs.emit("transfers", kind="dask-fetch", src_resource_id=f"worker:tcp://{src}:1",
                dst_resource_id=f"worker:tcp://{dst}:1", nbytes=1000, start_ns=T0 + s * MS, end_ns=T0 + e * MS,
                keys=[key])
    fs.close()
    run = flowscope.open_run(fs.run_dir)
    return run.table("spans"), run.table("dependencies"), run.table("transfers")


def _steps(path) -> list[tuple]:
    """The steps as (vertex, kind, start ms, end ms, component), times after T0."""
    return [(r.id, r.kind, (r.start_ns - T0) / MS, (r.end_ns - T0) / MS, r.component)
            for r in path.steps.itertuples()]


def test_measured_path_of_a_diamond_goes_through_the_input_that_arrived_last(tmp_path):
    """a feeds b (same thread as d, done at 30) and c (the other worker, done at 60); d needs both. c's output
    reaches d's worker last (transfer 60-64), so the path is a, the fetch of a, c, the fetch of c, d's wait for
    the scheduler, d -- not through b, although b ran on d's own thread just before it."""
    spans, deps, transfers = hand_built_run(
        tmp_path,
        tasks={"a": ("w1", 1, 0, 10), "b": ("w1", 1, 10, 30), "c": ("w2", 2, 12, 60), "d": ("w1", 1, 66, 80)},
        deps=[("b", "a"), ("c", "a"), ("d", "b"), ("d", "c")],
        transfers=[("a", "w1", "w2", 10, 12), ("c", "w2", "w1", 60, 64)])
    paths = task_graph_paths(spans, deps, transfers)
    m = paths.measured
    assert m.ids == ["a", "c", "d"]
    assert _steps(m) == [("a", "task", 0, 10, "compute"),
                         ("a", "TRANSFER", 10, 12, "transfer"),
                         ("c", "task", 12, 60, "compute"),
                         ("c", "TRANSFER", 60, 64, "transfer"),
                         ("d", "QUEUE", 64, 66, "queue"),
                         ("d", "task", 66, 80, "compute")]
    assert m.length_ns == 80 * MS
    comp = m.by_component().set_index("component")["duration_ns"].to_dict()
    assert comp == {"compute": 72 * MS, "transfer": 6 * MS, "io": 0, "wait": 0, "queue": 2 * MS}
    # the structural path: the same chain, durations and transfer times only, from 0
    assert paths.structural.ids == ["a", "c", "d"]
    assert paths.structural.length_ns == (10 + 2 + 48 + 4 + 14) * MS
    assert paths.difference_ns == 2 * MS  # d's queueing is the only time scheduling cost
    # slowing the late input lengthens the run one for one; slowing b (off the path, 30 ms of slack) does not
    assert what_if(spans, deps, transfers, scale={"c": 1.5}) == (80 + 24) * MS
    assert what_if(spans, deps, transfers, scale={"b": 2.0}) == 80 * MS


def test_what_if_scales_single_tasks(tmp_path):
    """The diamond above with c alone twice as fast: c ends at 36, its output reaches d's worker at 40, d keeps
    its observed 2 ms wait and ends at 56; scaling b (off the path) or a key the run lacks changes nothing."""
    spans, deps, transfers = hand_built_run(
        tmp_path,
        tasks={"a": ("w1", 1, 0, 10), "b": ("w1", 1, 10, 30), "c": ("w2", 2, 12, 60), "d": ("w1", 1, 66, 80)},
        deps=[("b", "a"), ("c", "a"), ("d", "b"), ("d", "c")],
        transfers=[("a", "w1", "w2", 10, 12), ("c", "w2", "w1", 60, 64)])
    assert what_if(spans, deps, transfers, scale_tasks={"c": 0.5}) == 56 * MS
    assert what_if(spans, deps, transfers, scale_tasks={"b": 0.0, "no-such-key": 3.0}) == 80 * MS
    # on top of the group's factor
    assert what_if(spans, deps, transfers, scale={"c": 2.0}, scale_tasks={"c": 0.25}) == 56 * MS
    with pytest.raises(ValueError, match="scale_tasks"):
        what_if(spans, deps, transfers, scale_tasks={"c": -1.0})


def test_measured_path_of_a_task_queued_behind_another_on_its_thread(tmp_path):
    """z's input p was ready at 5 ms, but z's thread ran x until 40: z waited for the thread, not for data. The
    path is x then z (queueing 40-42), and p -- z's only dependency -- is not on it."""
    spans, deps, transfers = hand_built_run(
        tmp_path,
        tasks={"x": ("w1", 1, 0, 40), "p": ("w1", 2, 0, 5), "z": ("w1", 1, 42, 50)},
        deps=[("z", "p")])
    paths = task_graph_paths(spans, deps, transfers)
    m = paths.measured
    assert m.ids == ["x", "z"]
    assert _steps(m) == [("x", "task", 0, 40, "compute"),
                         ("z", "QUEUE", 40, 42, "queue"),
                         ("z", "task", 42, 50, "compute")]
    assert m.by_component().set_index("component")["duration_ns"].to_dict() == {
        "compute": 48 * MS, "transfer": 0, "io": 0, "wait": 0, "queue": 2 * MS}
    # with unlimited threads z would have followed p at once: x alone is the structural path
    assert paths.structural.ids == ["x"] and paths.structural.length_ns == 40 * MS
    assert paths.difference_ns == 10 * MS


def test_measured_path_waits_for_the_last_input_to_finish_before_the_fetch(tmp_path):
    """d (on w1) needs b (w1, done at 50) and c (w2, done at 40). The scheduler placed d once b finished, and only
    then did w1 fetch c (52-60): c's output arrived last, but what held the fetch back was b. The path is b,
    a 2 ms wait for the fetch to begin, the fetch of c, d's queueing, d."""
    spans, deps, transfers = hand_built_run(
        tmp_path,
        tasks={"b": ("w1", 1, 0, 50), "c": ("w2", 2, 0, 40), "d": ("w1", 1, 61, 70)},
        deps=[("d", "b"), ("d", "c")],
        transfers=[("c", "w2", "w1", 52, 60)])
    m = task_graph_paths(spans, deps, transfers).measured
    assert m.ids == ["b", "d"]
    assert _steps(m) == [("b", "task", 0, 50, "compute"),
                         ("b", "WAIT", 50, 52, "wait"),
                         ("c", "TRANSFER", 52, 60, "transfer"),
                         ("d", "QUEUE", 60, 61, "queue"),
                         ("d", "task", 61, 70, "compute")]
    assert m.by_component().set_index("component")["duration_ns"].to_dict() == {
        "compute": 59 * MS, "transfer": 8 * MS, "io": 0, "wait": 2 * MS, "queue": MS}


# ---- a real Dask run ----------------------------------------------------------------------------------------

def load(i: int) -> np.ndarray:
    time.sleep(0.03 + 0.01 * i)
    return np.ones(20_000 * (i + 1))


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    time.sleep(0.02)
    return a[:100] + b[:100]


def slow(xs: list[np.ndarray]) -> np.ndarray:
    time.sleep(0.25)
    return xs[0] * 2


def write_file(x: float, path: str) -> int:
    with open(path, "wb") as f:
        return f.write(np.full(10_000, x).tobytes())


@pytest.fixture(scope="module")
def dask_run(tmp_path_factory):
    """2 workers x 1 thread; loads feed pairwise combines (fetches across workers), one slow task after all the
    combines (so it finishes last and is on both paths by the graph, not by how fast the machine runs the other
    tasks), one task writing a file."""
    tmp = tmp_path_factory.mktemp("wcp")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                         worker_dashboard_address=None) as cluster, DaskClient(cluster) as client:
        with observe(client, store=tmp / "store", name="wcp-test") as obs:
            loads = [client.submit(load, i, key=f"load-{i}") for i in range(6)]
            combs = [client.submit(combine, loads[i], loads[(i + 1) % 6], key=f"combine-{i}") for i in range(6)]
            s = client.submit(slow, combs, key="slow-0")
            total = client.submit(lambda xs: float(sum(x.sum() for x in xs)), combs + [s], key="total-0")
            written = client.submit(write_file, total, str(tmp / "out.bin"), key="write-0")
            written.result()
    return obs.run


def _tables(run):
    return run.table("spans"), run.table("dependencies"), run.table("transfers")


def test_measured_path_covers_the_makespan_of_a_real_run(dask_run):
    spans, deps, transfers = _tables(dask_run)
    tasks = spans[spans["kind"] == "task"]
    makespan = int(tasks["end_ns"].max() - tasks["start_ns"].min())
    paths = task_graph_paths(spans, deps, transfers)
    m = paths.measured
    assert m.length_ns == makespan
    assert int(m.steps["duration_ns"].sum()) == makespan
    assert (m.steps["duration_ns"] >= 0).all()
    # contiguous: each step starts where the previous one ended
    assert (m.steps["start_ns"].to_numpy()[1:] == m.steps["end_ns"].to_numpy()[:-1]).all()
    assert int(m.by_component()["duration_ns"].sum()) == makespan
    assert set(m.steps["component"]) <= set(COMPONENTS)
    assert m.ids[-1] == tasks.loc[tasks["end_ns"].idxmax(), "task_key"]
    # every consecutive pair on the path is a dependency or two tasks on the same thread
    dep_pairs = set(zip(deps["depends_on"], deps["task_key"]))
    thread = dict(zip(tasks["task_key"], tasks["resource_id"]))
    for a, b in zip(m.ids[:-1], m.ids[1:]):
        assert (a, b) in dep_pairs or thread[a] == thread[b], (a, b)
    # the slow task, after every combine and before the total, is on both paths; unlimited workers can only be
    # faster
    assert "slow-0" in m.ids and "slow-0" in paths.structural.ids
    assert 0 <= paths.structural.length_ns <= m.length_ns
    assert paths.difference_ns == m.length_ns - paths.structural.length_ns


def test_slack_and_near_critical_paths(dask_run):
    spans, deps, transfers = _tables(dask_run)
    paths = task_graph_paths(spans, deps, transfers)
    sl = slack(spans, deps, transfers).set_index("key")
    assert (sl.loc[paths.structural.ids, "slack_ns"] == 0).all()
    assert (sl["slack_ns"] >= 0).all()
    near = near_critical_paths(spans, deps, transfers, k=3)
    assert near[0] == (paths.structural.length_ns, paths.structural.ids)
    assert [x[0] for x in near] == sorted((x[0] for x in near), reverse=True)
    assert len({tuple(x[1]) for x in near}) == len(near)


def test_what_if_replays_the_run(dask_run):
    spans, deps, transfers = _tables(dask_run)
    tasks = spans[spans["kind"] == "task"]
    makespan = int(tasks["end_ns"].max() - tasks["start_ns"].min())
    groups = set(tasks["name"])
    assert what_if(spans, deps, transfers, scale={g: 1.0 for g in groups}) == makespan
    assert what_if(spans, deps, transfers) == makespan
    slow_ns = int((tasks.loc[tasks["name"] == "slow", "end_ns"] - tasks.loc[tasks["name"] == "slow", "start_ns"]).sum())
    freed = what_if(spans, deps, transfers, scale={"slow": 0.0})
    assert freed < makespan
    assert freed >= makespan - slow_ns
    assert what_if(spans, deps, transfers, scale={"slow": 0.5}) < makespan
    assert what_if(spans, deps, transfers, scale={"transfer": 0.0}) <= makespan
    with pytest.raises(ValueError, match="no task group 'nope'"):
        what_if(spans, deps, transfers, scale={"nope": 0.5})


def test_the_dask_data_state_graph(dask_run, tmp_path):
    states, mutations = data_states_from_tasks(dask_run)
    spans, deps, transfers = _tables(dask_run)
    tasks = spans[spans["kind"] == "task"]
    ids = set(states["state_id"])
    assert set(tasks["task_key"]) <= ids
    kinds = mutations.groupby("dst_state_id")["kind"].agg(set)
    assert kinds["total-0"] == {"MERGE"} and kinds["slow-0"] == {"MERGE"} and kinds["write-0"] == {"CONVERT"}
    assert (mutations["kind"] == "TRANSFER").sum() >= sum(len(k) for k in transfers["keys"])
    assert set(mutations["src_state_id"]) <= ids and set(mutations["dst_state_id"]) <= ids
    # the file the write task produced is a state on disk
    disk = states[states["location"].fillna("").str.endswith(":disk")]
    assert any(str(x).endswith("out.bin") for x in disk["label"])
    p = data_state_path(states, mutations)
    assert p.ids[-1] == disk["state_id"].iloc[0] or p.ids[-1] == "write-0"
    # the written file is the final state; the merge that produced its input is on the path
    assert p.ids[-1].startswith("file:") and p.ids[-2:] == ["write-0", p.ids[-1]] and "total-0" in p.ids
    assert "MERGE" in set(p.steps["kind"])
    assert int(p.steps["duration_ns"].sum()) == p.length_ns
    t0 = int(tasks["start_ns"].min())
    assert p.start_ns == t0


def test_the_view_and_its_exports(tmp_path):
    import networkx as nx

    from flowscope.report.critical_path import critical_path_section, graph_figure, to_graphml, to_json

    states, mutations = fig6()
    html = critical_path_section(states, mutations)
    assert "Workflow critical path" in html and "MERGE" in html
    doc = to_json(states, mutations, tmp_path / "g.json")
    assert doc["critical_path"]["ids"] == list("ABCDF")
    g = nx.read_graphml(to_graphml(states, mutations, tmp_path / "g.graphml"))
    assert {n for n, a in g.nodes(data=True) if a["critical"]} == set("ABCDF")
    # above the limit the graph is drawn collapsed by location
    fig = graph_figure(states, mutations, max_vertices=3)
    assert "6 states in 2 groups by location (collapsed)" in fig.layout.title.text


def test_derived_states_never_precede_their_sources():
    """Task times come from several workers' clocks: a state that seems older than an input it was made
    from is moved to that input's time (and says so), so the graph keeps the Crux rule."""
    from flowscope.analysis.dataflow import _monotone

    states = pd.DataFrame({"state_id": ["a", "b", "c"], "label": None, "size_bytes": pd.array([1, 1, 1], "Int64"),
                           "ts_ns": [100, 90, 95], "origin": None, "location": None, "attrs": [None, None, None]})
    muts = pd.DataFrame({"mutation_id": ["m0", "m1"], "src_state_id": ["a", "b"], "dst_state_id": ["b", "c"],
                         "kind": ["CONVERT", "CONVERT"], "application": None, "attrs": None})
    fixed, _ = _monotone(states, muts)
    assert fixed["ts_ns"].tolist() == [100, 100, 100]
    assert json.loads(fixed["attrs"][1]) == {"ts_adjusted_from": 90}
    assert json.loads(fixed["attrs"][2]) == {"ts_adjusted_from": 95}
    assert data_state_path(fixed, muts).ids == ["a", "b", "c"]


# ---- a run whose only timed work is I/O operations (a Darshan log with DXT, recorded here through the client) ----

MS_ = 1_000_000


def _io_only_run(tmp_path):
    """Two ranks that only do I/O, recorded through flowscope.Client: rank:0 writes 0-10 ms (an operation of a
    layer above holding two of a layer below, 1-4 and 5-9) and reads 30-40; rank:1 writes 2-20 and 25-45. Decoys
    that must not count: a per-file aggregate of rank:0 whose window runs to 100 ms, an instantaneous open at 70 ms,
    and a write to 60 ms on a container (which executes nothing)."""
    import flowscope

    t = 1_700_000_000 * 1_000_000_000
    with flowscope.Client(name="io-only", store=tmp_path) as fs:
        for r in ("rank:0", "rank:1"):
            fs.resource("rank", r, start_ns=t)
        fs.resource("container", "shared", start_ns=t)

        def op(rid, kind, a, b, attrs=None, **kw):
            fs.emit("io", resource_id=rid, source="test", op=kind, path=f"/data/{rid}", nbytes=4096,
                    start_ns=t + a * MS_, end_ns=None if b is None else t + b * MS_,
                    attrs=json.dumps(attrs) if attrs else None, **kw)

        op("rank:0", "write", 0, 10, {"interface": "MPI-IO"})
        op("rank:0", "write", 1, 4, {"interface": "POSIX"})
        op("rank:0", "write", 5, 9, {"interface": "POSIX"})
        op("rank:0", "read", 30, 40)
        op("rank:1", "write", 2, 20)
        op("rank:1", "write", 25, 45)
        op("rank:0", "write", 0, 100, {"aggregate": True, "ops": 3})
        op("rank:0", "open", 70, None)
        op("shared", "write", 0, 60)
        run_dir = fs.run_dir
    return flowscope.open_run(run_dir), t


def test_a_run_of_timed_io_operations_gets_the_io_timeline_of_the_rank_that_ended_last(tmp_path):
    from flowscope.analysis.critical_path import IDLE_COMPONENT, IO_UNIT, work_units
    from flowscope.analysis.summary import summarize

    run, t = _io_only_run(tmp_path)
    units = work_units(run)
    assert set(units["unit"]) == {IO_UNIT} and set(units["category"]) == {"io"}
    # the outermost timed operations of the resources that execute: not the inner writes, the aggregate, the
    # instantaneous open or the container's write
    got = sorted((r.resource_id, r.name, (r.start_ns - t) // MS_, (r.end_ns - t) // MS_)
                 for r in units.itertuples())
    assert got == [("rank:0", "read", 30, 40), ("rank:0", "write", 0, 10),
                   ("rank:1", "write", 2, 20), ("rank:1", "write", 25, 45)]
    m = task_graph_paths(units, run.table("dependencies"), run.table("transfers")).measured
    steps = [(r.kind, (r.start_ns - t) // MS_, (r.end_ns - t) // MS_, r.component, r.location)
             for r in m.steps.itertuples()]
    assert steps == [("IDLE", 0, 2, IDLE_COMPONENT, "rank:1"), ("task", 2, 20, "io", "rank:1"),
                     ("IDLE", 20, 25, IDLE_COMPONENT, "rank:1"), ("task", 25, 45, "io", "rank:1")]
    assert m.length_ns == 45 * MS_
    cp = summarize(run).critical_path
    assert cp["units"] == "I/O operations" and cp["measured_ns"] == 45 * MS_ and cp["measured_tasks"] == 2
    assert cp["measured_components"] == {"io": 38 * MS_, "idle": 7 * MS_}
    assert cp["measured_end_location"] == "rank:1"


def test_a_run_without_a_path_says_why_and_what_would_supply_one(tmp_path):
    import flowscope
    from flowscope.analysis.summary import summarize

    with flowscope.Client(name="counters", store=tmp_path / "a") as fs:
        fs.resource("rank", "rank:0")
        fs.emit("io", resource_id="rank:0", source="test", op="write", path="/data/x", nbytes=1 << 20,
                start_ns=1_000, end_ns=9_000_000, attrs=json.dumps({"aggregate": True, "ops": 12}))
        counters = fs.run_dir
    with flowscope.Client(name="metrics", store=tmp_path / "b") as fs:
        fs.metric("residual", 1e-6, namespace="application")
        metrics = fs.run_dir
    cp = summarize(flowscope.open_run(counters)).critical_path
    assert cp["path"] is None and set(cp) == {"path", "reason"}
    assert "its 1 I/O records are totals" in cp["reason"] and "DXT_ENABLE_IO_TRACE=1" in cp["reason"]
    cp = summarize(flowscope.open_run(metrics)).critical_path
    assert cp["path"] is None and "it holds no timed work" in cp["reason"]
    assert re.search(r"only .*\b[\d,]+ metrics rows", cp["reason"]), cp["reason"]
    assert "dependencies" in cp["reason"] and "messages" in cp["reason"]


# ---- dependencies between calls inside units of work (Chrome flows, MPI messages) ------------------------------

def _calls_run(tmp_path):
    """Three threads of calls, recorded through flowscope.Client, no tasks: the units of work are each thread's
    outermost spans. Thread a: ``step`` 0-10 ms holding ``pack`` 2-3 and ``send`` 8-9. Thread b: ``prep`` 0-3,
    then ``step`` 12-20 holding ``recv`` 12-13. Thread c: ``step`` 5-15 holding ``poll`` 14-15. Dependencies,
    between inner calls as a flow or a message gives them: recv on send (a's step ended before b's began: b's step
    waited for it), send on pack (within one unit), poll on send (c's step began before a's ended: says nothing of
    the order of the two steps)."""
    import flowscope

    with flowscope.Client(name="calls", store=tmp_path) as fs:
        for th in "abc":
            fs.resource("thread", f"thread:{th}", start_ns=T0)

        def span(sid, th, name, a, b, parent=None):
            fs.emit("spans", span_id=sid, parent_id=parent, resource_id=f"thread:{th}", kind="call", name=name,
                    start_ns=T0 + a * MS, end_ns=T0 + b * MS, task_key=f"call:{sid}" if parent else None)

        span(1, "a", "step", 0, 10)
        span(2, "a", "pack", 2, 3, 1)
        span(3, "a", "send", 8, 9, 1)
        span(4, "b", "prep", 0, 3)
        span(5, "b", "step", 12, 20)
        span(6, "b", "recv", 12, 13, 5)
        span(7, "c", "step", 5, 15)
        span(8, "c", "poll", 14, 15, 7)
        for dst, src in (("call:6", "call:3"), ("call:3", "call:2"), ("call:8", "call:3")):
            fs.emit("dependencies", graph_id="flows", task_key=dst, depends_on=src)
        run_dir = fs.run_dir
    return flowscope.open_run(run_dir)


def test_a_dependency_between_calls_inside_units_is_one_between_the_units_on_the_measured_path(tmp_path):
    """b's step waited for a's step (its recv on a's send, a flow's or a message's ends): the measured path goes
    from b's step back to a's step through that dependency, not through b's own earlier prep, and `flowscope show`
    gives the same path. The dependency within a's step and the one from c's step, which began before a's ended,
    link no units."""
    from flowscope.analysis.critical_path import work_units
    from flowscope.analysis.summary import summarize

    run = _calls_run(tmp_path)
    units = work_units(run)
    key = {sid: k for sid, k in zip(units["span_id"], units["task_key"])}
    assert sorted(key) == [1, 4, 5, 7]
    deps, transfers = run.table("dependencies"), run.table("transfers")
    m = task_graph_paths(units, deps, transfers).measured
    assert m.ids == [key[1], key[5]], m.ids
    assert _steps(m) == [(key[1], "task", 0, 10, "compute"), (key[5], "QUEUE", 10, 12, "queue"),
                         (key[5], "task", 12, 20, "compute")]
    assert list(m.steps["location"]) == ["thread:a", "thread:b", "thread:b"]
    edges = {(a, b) for _, ids in near_critical_paths(units, deps, transfers, k=10) for a, b in itertools.pairwise(ids)}
    assert edges == {(key[1], key[5])}, edges
    cp = summarize(run).critical_path
    assert cp["measured_ns"] == 20 * MS and cp["measured_tasks"] == 2


@pytest.mark.parametrize("name", ["flow.json", "flow_simple.json"])
def test_chrome_flows_link_the_units_that_hold_their_ends(shared_data, tmp_path, name):
    """A Chrome trace's flows bind the innermost slice at each end; its units of work are each thread's outermost
    slices. Every flow whose end's outermost slice began after its start's outermost slice ended is an edge between
    the two units, and the graph has no other edge (read back through near_critical_paths, whose paths together
    pass every edge); on flow_simple.json the measured path walks the flow into the thread that finished last."""
    import flowscope
    from flowscope.analysis.critical_path import work_units
    from flowscope.importers import import_paths

    run = flowscope.open_run(import_paths([shared_data / "chrome" / "catapult" / name], tmp_path).run_dir)
    units = work_units(run)
    spans = run.sql("SELECT span_id, parent_id, resource_id, task_key, start_ns, end_ns FROM spans")
    row = {int(s): r for s, r in zip(spans["span_id"], spans.itertuples())}
    unit_of_span = {int(s): k for s, k in zip(units["span_id"], units["task_key"])}
    times = {k: (s, e) for k, s, e in zip(units["task_key"], units["start_ns"], units["end_ns"])}

    def unit(call: str) -> str | None:
        r = row[int(spans.loc[spans["task_key"] == call, "span_id"].iloc[0])]
        while pd.notna(r.parent_id) and int(r.parent_id) in row and row[int(r.parent_id)].resource_id == r.resource_id:
            r = row[int(r.parent_id)]
        return unit_of_span.get(int(r.span_id))

    deps = run.table("dependencies")
    assert len(deps) and set(deps["graph_id"]) == {"flows"}
    want = set()
    for dst, src in zip(deps["task_key"], deps["depends_on"]):
        a, b = unit(src), unit(dst)
        if a is not None and b is not None and a != b and times[b][0] >= times[a][1]:
            want.add((a, b))
    assert want
    paths = near_critical_paths(units, deps, run.table("transfers"), k=len(want) + 1)
    got = {(a, b) for _, ids in paths for a, b in itertools.pairwise(ids)}
    assert got == want, (len(got), len(want))
    if name == "flow_simple.json":
        m = task_graph_paths(units, deps, run.table("transfers")).measured
        assert any(p in want for p in itertools.pairwise(m.ids)), m.ids


def test_what_if_with_any_placement_lets_the_replay_rebalance_work_across_threads(tmp_path):
    """Two threads: a, b, c (10 ms each) one after another on w1, and d (40 ms) alone on w2. Kept where they ran,
    d four times faster leaves w1's 30 ms as the makespan; replayed with any placement (each task, in the observed
    start order, on the thread free first) it also lets b and c move: 20 ms. With no factor, both give the
    measured 40 ms here (no lag to replay)."""
    spans, deps, transfers = hand_built_run(
        tmp_path,
        tasks={"a": ("w1", 1, 0, 10), "b": ("w1", 1, 10, 20), "c": ("w1", 1, 20, 30), "d": ("w2", 2, 0, 40)},
        deps=[], transfers=[])
    assert what_if(spans, deps, transfers) == 40 * MS
    assert what_if(spans, deps, transfers, placement="any") == 40 * MS
    assert what_if(spans, deps, transfers, scale_tasks={"d": 0.25}) == 30 * MS
    assert what_if(spans, deps, transfers, scale_tasks={"d": 0.25}, placement="any") == 20 * MS
    with pytest.raises(ValueError, match="placement"):
        what_if(spans, deps, transfers, placement="somewhere")


def test_what_if_with_any_placement_keeps_dependencies_and_transfers(tmp_path):
    """The diamond of the tests above: with any placement, d still waits for c's output and its transfer; c
    twice as fast: a 0-10, c 12-36 (its input's 2 ms transfer), b 10-30 on the other thread, d at 40 (c's 4 ms
    transfer), ends 54."""
    spans, deps, transfers = hand_built_run(
        tmp_path,
        tasks={"a": ("w1", 1, 0, 10), "b": ("w1", 1, 10, 30), "c": ("w2", 2, 12, 60), "d": ("w1", 1, 66, 80)},
        deps=[("b", "a"), ("c", "a"), ("d", "b"), ("d", "c")],
        transfers=[("a", "w1", "w2", 10, 12), ("c", "w2", "w1", 60, 64)])
    assert what_if(spans, deps, transfers, scale_tasks={"c": 0.5}, placement="any") == 54 * MS


def test_the_worker_of_each_task_is_read_from_its_attrs_whatever_they_hold():
    """The worker named in a span's attrs (JSON text), prefixed as a resource id, for every kind of value a source
    may leave there: none, invalid or non-object JSON, no worker, a worker already prefixed, a number."""
    import pandas as pd

    from flowscope.analysis.critical_path.task_graph import _worker_of

    attrs = pd.Series(['{"worker": "tcp://10.0.0.1:4000", "nbytes": 8}', None, "not json", "[1, 2]", '{"nbytes": 3}',
                       '{"worker": "worker:tcp://a:1"}', '{"worker": 7}', '{"worker": ""}', float("nan"),
                       '{"worker": "tcp://10.0.0.2:4000"}'], index=[5, 3, 9, 1, 0, 2, 4, 6, 7, 8])
    got = _worker_of(attrs)
    assert list(got.index) == list(attrs.index)
    assert got.tolist() == ["worker:tcp://10.0.0.1:4000", None, None, None, None, "worker:tcp://a:1", "worker:7", "",
                            None, "worker:tcp://10.0.0.2:4000"]
