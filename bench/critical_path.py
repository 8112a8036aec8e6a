"""Structural critical path: the longest path of a weighted DAG given as edge arrays, flowscope against rustworkx,
on three graph shapes, each side in a fresh Python process per repetition.

Shapes (bench/README.md has the rules every benchmark follows):

* ``layered`` -- ``--vertices`` vertices in 1,000 layers, ``--edges`` edges drawn, each from a random vertex to a
  random vertex 1..4 layers later (those past the last layer dropped): 1,000 levels.
* ``deep`` -- 5 chains of ``--vertices / 5`` vertices (so 200,000 levels at full size), each vertex linked to the
  next of its chain, plus cross edges up to ``--edges`` in all, from a random vertex to a random vertex of any chain
  1..4 positions further. The shape the old level-by-level pass was worst at.
* ``dask`` -- the task graph of an iterative Dask computation that persists its state every iteration, as flowscope
  records it over the whole run. One iteration is built with Dask itself (the graph its scheduler receives,
  optimised as ``Client.compute`` sends it): a 16 x 16-block dask.array ``y = (x + x.T) / 2``, ``y = y -
  y.mean(axis=0)`` (a tree reduction broadcast back), ``y.rechunk((c/2, 2c)).rechunk(c)``, ``y.cumsum(axis=1)`` (a
  sequential scan), and a 32-partition dask.dataframe ``shuffle("key", shuffle_method="tasks")`` then
  ``assign(value=value - value.mean())``. Iteration i + 1 reads iteration i's output blocks: the composition puts
  each output block's task where the next iteration's input block was, and repeats until ``--vertices`` is reached.
  Dask's graphs have 1 to 2.5 dependencies per task, not 5, so this shape has about 1.5 edges per vertex.

Every shape has its vertex numbers shuffled (vertex numbers say nothing about the order, the worst case for a
memory-bound sweep), duplicate edges kept (they count with their largest weight), weights uniform in [0, 1).

Each repetition runs every (shape, side) in a fresh ``python -c`` process that loads the arrays from .npy files,
imports its library and computes the length; the order of the sides alternates between repetitions. Timed:

* flowscope: ``from flowscope.analysis.critical_path import longest_path_length`` (``import``), then the first
  call ``longest_path_length(n, src, dst, w)`` in the process (``call``: conversion, checks and the compiled sweep);
* rustworkx (the main peer): ``import rustworkx``, then ``build`` = ``PyDiGraph(multigraph=True,
  check_cycle=False, node_count_hint=n, edge_count_hint=m)``, ``extend_from_weighted_edge_list(zip(src.tolist(),
  dst.tolist(), w.tolist()))`` (the fastest of its edge-list methods here; it takes no numpy arrays; it creates
  the nodes up to the largest endpoint itself, which is cheaper than adding n nodes first) and
  ``add_nodes_from`` for any isolated vertices past them, and ``path`` = ``dag_weighted_longest_path_length(g,
  weight_fn=lambda _s, _t, w: w)`` (its float-weighted longest path; the callback is its documented way to read a
  weight);
* both: the whole process's wall time, measured by this script around the child (interpreter start-up, numpy,
  loading the arrays, imports, computation, exit).

Headline per shape: ``ratio_vs_peer`` = median flowscope ``call`` / median rustworkx ``build + path``; ``value`` =
the worst shape's ratio. Whole-process medians and their ratio are reported beside it, and the CPU-time ratios
of the call and of the whole process (steadier than wall time when other jobs share the machine). All lengths of a shape must
agree to 1e-9 relative before any time is printed. Writes ``bench/results/critical_path.json`` and prints one
summary line last.

    python bench/critical_path.py                          # 1,000,000 vertices, 5 repetitions, about 7 minutes
    python bench/critical_path.py --vertices 100000 --edges 500000 --repeat 5   # smaller
    python bench/critical_path.py --shapes deep --networkx  # also networkx, once per shape (slow at full size)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _machine import cpu_model, git_commit, write_result

from flowscope.analysis.critical_path import longest_path_length

BENCH = "critical_path"
TARGET_RATIO = 0.1          # flowscope's call at most a tenth of rustworkx's build + path
RESULT = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
SHAPES = ("layered", "deep", "dask")

# ---- the graphs ------------------------------------------------------------------------------------------


def layered_dag(n: int, m: int, layers: int, span: int, rng) -> tuple[int, np.ndarray, np.ndarray]:
    """n vertices in ``layers`` layers; m edges drawn, each from a uniformly chosen vertex to a uniformly chosen
    vertex 1..span layers later (edges past the last layer are dropped)."""
    bounds = np.linspace(0, n, layers + 1).astype(np.int64)      # layer L holds vertices bounds[L]:bounds[L+1]
    layer_of = np.repeat(np.arange(layers), np.diff(bounds))
    src = rng.integers(0, n, m)
    to_layer = layer_of[src] + rng.integers(1, span + 1, m)
    keep = to_layer < layers
    src, to_layer = src[keep], to_layer[keep]
    lo, hi = bounds[to_layer], bounds[to_layer + 1]
    dst = lo + (rng.random(len(src)) * (hi - lo)).astype(np.int64)
    return n, src, dst


def deep_dag(n: int, m: int, chains: int, span: int, rng) -> tuple[int, np.ndarray, np.ndarray]:
    """``chains`` chains of n / chains vertices (vertex c * length + i is position i of chain c), each vertex
    linked to the next of its chain, plus cross edges (m in all) from a random position to a random chain 1..span
    positions further: as many levels as a chain has vertices."""
    length = n // chains
    n = chains * length
    c = np.repeat(np.arange(chains), length - 1)
    i = np.tile(np.arange(length - 1), chains)
    cross = max(m - len(c), 0)
    ci = rng.integers(0, length - 1, cross)
    cj = np.minimum(ci + rng.integers(1, span + 1, cross), length - 1)
    src = np.concatenate([c * length + i, rng.integers(0, chains, cross) * length + ci])
    dst = np.concatenate([c * length + i + 1, rng.integers(0, chains, cross) * length + cj])
    return n, src, dst


def _source(dsk: dict, key, get_dependencies):
    """The task that holds an input block: persisted dataframes reach their data through Alias tasks."""
    while deps := get_dependencies(dsk, key):
        (key,) = deps
    return key


def dask_iteration(blocks: int, partitions: int, seed: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray,
                                                                   np.ndarray]:
    """One iteration of the computation the ``dask`` shape repeats, as the graph Dask's scheduler receives:
    (vertices, src, dst, inputs, outputs), where inputs[b] / outputs[b] are the vertices of input / output block
    b (the array's blocks, then the frame's partitions)."""
    import warnings

    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd
    from dask.base import collections_to_expr
    from dask.core import flatten, get_dependencies

    rng = np.random.default_rng(seed)
    c = 8                   # rows and columns per block; the graph depends on the number of blocks only
    x = da.random.RandomState(seed).random_sample((blocks * c, blocks * c), chunks=c).persist(scheduler="sync")
    rows = partitions * 64
    frame = dd.from_pandas(pd.DataFrame({"key": rng.integers(0, 1000, rows), "value": rng.random(rows)}),
                           npartitions=partitions).persist(scheduler="sync")
    y = (x + x.T) / 2
    y = y - y.mean(axis=0)
    y = y.rechunk((c // 2, c * 2)).rechunk(c)
    y = y.cumsum(axis=1)
    f = frame.shuffle("key", shuffle_method="tasks")
    f = f.assign(value=f.value - f.value.mean())
    number: dict = {}
    src, dst, inputs, outputs = [], [], [], []
    for before, after in ((x, y), (frame, f)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # dask's PerformanceWarning about the rechunk
            expr = collections_to_expr([after], optimize_graph=True).optimize()
            dsk = dict(expr.__dask_graph__())
        keys = sorted(dsk, key=str)         # dask's own order varies between runs
        for k in keys:
            number[k] = len(number)
        for k in keys:
            for d in sorted(number[d] for d in get_dependencies(dsk, k)):   # a set
                src.append(d)
                dst.append(number[k])
        inputs += [number[_source(dsk, k, get_dependencies)] for k in flatten(before.__dask_keys__())]
        outputs += [number[k] for k in flatten(expr.__dask_keys__())]
    if len(inputs) != len(outputs):
        raise RuntimeError(f"dask iteration: {len(inputs)} input blocks but {len(outputs)} output blocks")
    return (len(number), np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64),
            np.array(inputs, dtype=np.int64), np.array(outputs, dtype=np.int64))


def dask_dag(n: int, blocks: int, partitions: int, seed: int) -> tuple[int, np.ndarray, np.ndarray, dict]:
    """Iterations of :func:`dask_iteration` in sequence, each one's input blocks replaced by the previous one's
    output blocks, until at least n vertices."""
    n1, src1, dst1, inputs, outputs = dask_iteration(blocks, partitions, seed)
    fresh = np.setdiff1d(np.arange(n1), inputs)        # vertices every iteration adds
    iterations = 1 + max(0, -(-(n - n1) // len(fresh)))
    number = np.arange(n1, dtype=np.int64)             # iteration 0: vertex numbers as built
    total = n1
    srcs, dsts = [src1], [dst1]
    for _ in range(1, iterations):
        previous = number[outputs]
        number = np.empty(n1, dtype=np.int64)
        number[inputs] = previous
        number[fresh] = total + np.arange(len(fresh))
        total += len(fresh)
        srcs.append(number[src1])
        dsts.append(number[dst1])
    info = {"iteration_vertices": n1, "iteration_edges": len(src1), "iteration_blocks": len(inputs),
            "iterations": iterations}
    return total, np.concatenate(srcs), np.concatenate(dsts), info


def make_shape(shape: str, args: argparse.Namespace) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, dict]:
    """(n, src, dst, weights, facts) of a shape, vertex numbers shuffled."""
    rng = np.random.default_rng(args.seed)
    info: dict = {}
    if shape == "layered":
        n, src, dst = layered_dag(args.vertices, args.edges, 1000, 4, rng)
        info = {"layers": 1000, "span": 4}
    elif shape == "deep":
        n, src, dst = deep_dag(args.vertices, args.edges, 5, 4, rng)
        info = {"chains": 5, "span": 4}
    else:
        n, src, dst, info = dask_dag(args.vertices, args.dask_blocks, args.dask_partitions, args.seed)
    perm = rng.permutation(n)
    return n, perm[src], perm[dst], rng.random(len(src)), info


# ---- one side in a fresh process -------------------------------------------------------------------------

_LOAD = """
import time
t0 = time.perf_counter()
cpu = time.process_time
import json, sys
import numpy as np
d = sys.argv[1]
n = int(open(d + "/n.txt").read())
src, dst, w = np.load(d + "/src.npy"), np.load(d + "/dst.npy"), np.load(d + "/w.npy")
t1 = time.perf_counter()
"""

CHILD = {
    "flowscope": _LOAD + """
from flowscope.analysis.critical_path import longest_path_length
t2, c2 = time.perf_counter(), cpu()
length = longest_path_length(n, src, dst, w)
t3, c3 = time.perf_counter(), cpu()
print(json.dumps({"load": t1 - t0, "import": t2 - t1, "call": t3 - t2, "call_cpu": c3 - c2, "length": length}))
""",
    "rustworkx": _LOAD + """
import rustworkx as rx
t2, c2 = time.perf_counter(), cpu()
g = rx.PyDiGraph(check_cycle=False, multigraph=True, node_count_hint=n, edge_count_hint=len(src))
g.extend_from_weighted_edge_list(zip(src.tolist(), dst.tolist(), w.tolist()))   # makes nodes 0..max endpoint
g.add_nodes_from([None] * (n - g.num_nodes()))                                  # isolated vertices past them
t3 = time.perf_counter()
length = rx.dag_weighted_longest_path_length(g, weight_fn=lambda _s, _t, weight: weight)
t4, c4 = time.perf_counter(), cpu()
print(json.dumps({"load": t1 - t0, "import": t2 - t1, "build": t3 - t2, "path": t4 - t3,
                  "call": t4 - t2, "call_cpu": c4 - c2, "length": float(length)}))
""",
    "networkx": _LOAD + """
import networkx as nx
t2, c2 = time.perf_counter(), cpu()
order = np.argsort(w, kind="stable")        # the last write of a duplicate edge wins: the largest weight
g = nx.DiGraph()
g.add_nodes_from(range(n))
g.add_weighted_edges_from(zip(src[order].tolist(), dst[order].tolist(), w[order].tolist()))
t3 = time.perf_counter()
length = nx.dag_longest_path_length(g, weight="weight")
t4, c4 = time.perf_counter(), cpu()
print(json.dumps({"load": t1 - t0, "import": t2 - t1, "build": t3 - t2, "path": t4 - t3,
                  "call": t4 - t2, "call_cpu": c4 - c2, "length": float(length)}))
""",
}


def run_side(side: str, folder: Path) -> dict:
    """One fresh process: its own timings, plus its wall time and CPU time (user + system) seen from here."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", CHILD[side], str(folder)], stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        whole = time.perf_counter() - t
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode != 0:
            raise RuntimeError(f"{side} on {folder.name} failed (exit {child.returncode}): {err.read().strip()[-2000:]}")
        res = json.loads(out.read().strip().splitlines()[-1])
    res["whole"] = whole
    res["whole_cpu"] = usage.ru_utime + usage.ru_stime
    return res


# ---- the run ---------------------------------------------------------------------------------------------

def summary(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "samples": [round(x, 4) for x in xs]}


def fmt(s: dict) -> str:
    return f"{s['median']:7.3f} [{s['min']:.3f}-{s['max']:.3f}]"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vertices", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=5_000_000, help="edges of the layered and deep shapes")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, from " + ", ".join(SHAPES))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dask-blocks", type=int, default=16, help="dask shape: blocks per side of the array")
    p.add_argument("--dask-partitions", type=int, default=32, help="dask shape: partitions of the frame")
    p.add_argument("--networkx", action="store_true", help="also run networkx once per shape (slow)")
    args = p.parse_args(argv)
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown shape {unknown[0]!r}; known: {', '.join(SHAPES)}")
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sides = ["flowscope", "rustworkx"]
    shapes: dict[str, dict] = {}
    runs: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="flowscope-bench-cp-") as tmp:
        for shape in args.shapes:
            t = time.perf_counter()
            n, src, dst, w, info = make_shape(shape, args)
            folder = Path(tmp) / shape
            folder.mkdir()
            (folder / "n.txt").write_text(str(n))
            np.save(folder / "src.npy", src)
            np.save(folder / "dst.npy", dst)
            np.save(folder / "w.npy", w)
            levels = int(longest_path_length(n, src, dst, None, np.ones(n)))   # vertices on the longest chain
            shapes[shape] = {"vertices": n, "edges": len(src), "levels": levels, **info}
            runs[shape] = {s: [] for s in sides + ["networkx"]}
            print(f"{shape}: {n:,} vertices, {len(src):,} edges, {levels:,} levels "
                  f"(made in {time.perf_counter() - t:.1f} s)", flush=True)
        for rep in range(args.repeat):
            order = sides if rep % 2 == 0 else sides[::-1]
            for shape in args.shapes:
                for side in order:
                    runs[shape][side].append(run_side(side, Path(tmp) / shape))
            print(f"repetition {rep + 1}/{args.repeat} done ({' then '.join(order)})", flush=True)
        if args.networkx:
            for shape in args.shapes:
                runs[shape]["networkx"].append(run_side("networkx", Path(tmp) / shape))
                print(f"networkx {shape} done", flush=True)
    # every length of a shape agrees before any time is shown
    for shape in args.shapes:
        ref = runs[shape]["flowscope"][0]["length"]
        for side, rs in runs[shape].items():
            for i, r in enumerate(rs):
                if abs(r["length"] - ref) > 1e-9 * abs(ref):
                    print(f"FAIL: {shape}: {side} run {i + 1} length {r['length']!r} differs from flowscope's {ref!r}",
                          file=sys.stderr)
                    return 1
        shapes[shape]["longest_path_length"] = ref
    print(f"lengths agree to 1e-9 on every run; seconds, median [min-max] of {args.repeat} fresh processes")
    print(f"{'shape':<8} {'side':<10} {'call (build+path)':>24} {'build':>24} {'path':>24} "
          f"{'import':>8} {'whole process':>24}")
    worst, worst_shape, meets = 0.0, None, True
    for shape in args.shapes:
        sh = shapes[shape]
        for side in sides + (["networkx"] if args.networkx else []):
            rs = runs[shape][side]
            rec = {k: summary([r[k] for r in rs]) for k in ("call", "call_cpu", "import", "load", "whole", "whole_cpu")}
            if side != "flowscope":
                rec["build"] = summary([r["build"] for r in rs])
                rec["path"] = summary([r["path"] for r in rs])
            sh[side] = rec
            print(f"{shape:<8} {side:<10} {fmt(rec['call']):>24} "
                  f"{fmt(rec['build']) if 'build' in rec else '':>24} {fmt(rec['path']) if 'path' in rec else '':>24} "
                  f"{rec['import']['median']:8.3f} {fmt(rec['whole']):>24}")
        fs, rx = sh["flowscope"], sh["rustworkx"]
        sh["ratio_vs_peer"] = round(fs["call"]["median"] / rx["call"]["median"], 4)
        sh["whole_process_ratio_vs_peer"] = round(fs["whole"]["median"] / rx["whole"]["median"], 4)
        sh["cpu_ratio_vs_peer"] = round(fs["call_cpu"]["median"] / rx["call_cpu"]["median"], 4)
        sh["whole_process_cpu_ratio_vs_peer"] = round(fs["whole_cpu"]["median"] / rx["whole_cpu"]["median"], 4)
        sh["faster_than_peer_path_alone"] = fs["call"]["median"] < rx["path"]["median"]
        sh["meets_target"] = sh["ratio_vs_peer"] <= TARGET_RATIO and sh["faster_than_peer_path_alone"]
        meets &= sh["meets_target"]
        if sh["ratio_vs_peer"] >= worst:
            worst, worst_shape = sh["ratio_vs_peer"], shape
        print(f"{shape:<8} ratio_vs_peer {sh['ratio_vs_peer']:.4f} (call / build+path; CPU time "
              f"{sh['cpu_ratio_vs_peer']:.4f}), whole process {sh['whole_process_ratio_vs_peer']:.4f} (CPU time "
              f"{sh['whole_process_cpu_ratio_vs_peer']:.4f}); faster than rustworkx's path alone: "
              f"{sh['faster_than_peer_path_alone']}")
    import rustworkx

    result = write_result({
        "benchmark": BENCH,
        "metric": "worst_ratio_vs_rustworkx",
        "value": worst,
        "unit": "ratio",
        "target": TARGET_RATIO,
        "meets_target": meets,
        "peers": {"rustworkx": {"value": shapes[worst_shape]["rustworkx"]["call"]["median"], "unit": "s",
                                "shape": worst_shape, "version": rustworkx.__version__}},
        "ratio_vs_peer": worst,
        "shapes": shapes,
        "params": {
            "vertices": args.vertices, "edges": args.edges, "repeat": args.repeat, "seed": args.seed,
            "dask_blocks": args.dask_blocks, "dask_partitions": args.dask_partitions, "networkx": args.networkx,
            "main_peer": "rustworkx",
            "value_is": "the worst shape's ratio_vs_peer: median seconds of flowscope's first longest_path_length "
                        "call in a fresh process / median seconds of rustworkx's PyDiGraph build + "
                        "dag_weighted_longest_path_length in a fresh process",
            "target_is": f"ratio_vs_peer <= {TARGET_RATIO} on every shape, and flowscope's call faster than "
                         "rustworkx's path alone",
            "whole_process": "shapes.<shape>.<side>.whole: wall time of the whole child process (start-up, numpy, "
                             "loading the arrays, imports, computation, exit); whole_cpu: its user + system CPU "
                             "time; call_cpu: the CPU time of the call (steadier than wall time on a shared "
                             "machine, not the headline)",
            "commit": git_commit(), "cpu": cpu_model(),
        },
    }, RESULT)
    print(f"critical_path: worst ratio_vs_peer {worst:.4f} ({worst_shape}; flowscope call / rustworkx build+path, "
          f"fresh processes, medians of {args.repeat}); "
          + ", ".join(f"{s} {shapes[s]['ratio_vs_peer']:.3f}" for s in args.shapes)
          + f"; target <= {TARGET_RATIO}: {'meets' if result['meets_target'] else 'below'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
