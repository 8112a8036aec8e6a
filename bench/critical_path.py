"""Structural critical path (longest path of a weighted DAG), end to end from edge arrays.

A random layered DAG of ``--vertices`` vertices and about ``--edges`` weighted edges (each edge goes from a vertex
to one in the next ``--span`` layers; vertex numbers are shuffled so no order is given for free; duplicate edges
are kept, and count with their largest weight). Each contender gets the same three numpy arrays (src, dst,
weight) and returns the longest path length:

* flowscope  -- ``flowscope.analysis.critical_path.longest_path_length(n, src, dst, w)`` (the headline ``value``);
* rustworkx  -- the main peer (``ratio_vs_peer``): build a ``PyDiGraph`` from the arrays, then
  ``dag_weighted_longest_path_length`` (a multigraph: duplicate edges stay, the longest path takes the largest);
* networkx   -- build a ``DiGraph`` (edges added in increasing weight, so a duplicate keeps its largest weight),
  then ``dag_longest_path_length``. Takes about 100 s at full size: ``--skip-networkx`` leaves it out.

Every contender's length must agree with flowscope's to 1e-9 relative, or the benchmark fails. flowscope and
rustworkx alternate for ``--repeat`` repetitions (networkx runs ``--networkx-repeat`` times); figures are medians.
Writes ``bench/results/critical_path.json`` (DESIGN.md, "Benchmarks") and prints one summary line last.

    python bench/critical_path.py                      # 1,000,000 vertices, 5,000,000 edges (a few minutes)
    python bench/critical_path.py --skip-networkx
    python bench/critical_path.py --vertices 100000 --edges 500000   # smaller
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from _machine import cpu_model, git_commit, write_result
from flowscope.analysis.critical_path import longest_path_length

BENCH = "critical_path"
TARGET_RATIO = 0.1          # at least 10x faster than rustworkx
RESULT = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"


def layered_dag(n: int, m: int, layers: int, span: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edge arrays (src, dst, weight) of a random DAG: n vertices in ``layers`` layers; each edge from a uniformly
    chosen vertex to a uniformly chosen vertex 1..span layers later (edges past the last layer are dropped)."""
    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, n, layers + 1).astype(np.int64)      # layer L holds vertices bounds[L]:bounds[L+1]
    layer_of = np.repeat(np.arange(layers), np.diff(bounds))
    src = rng.integers(0, n, m)
    to_layer = layer_of[src] + rng.integers(1, span + 1, m)
    keep = to_layer < layers
    src, to_layer = src[keep], to_layer[keep]
    lo, hi = bounds[to_layer], bounds[to_layer + 1]
    dst = lo + (rng.random(len(src)) * (hi - lo)).astype(np.int64)
    perm = rng.permutation(n)
    return perm[src], perm[dst], rng.random(len(src))


def run_flowscope(n, src, dst, w) -> tuple[float, float]:
    t = time.perf_counter()
    length = longest_path_length(n, src, dst, w)
    return time.perf_counter() - t, length


def run_rustworkx(n, src, dst, w) -> tuple[float, float]:
    import rustworkx as rx

    t = time.perf_counter()
    g = rx.PyDiGraph(check_cycle=False, multigraph=True)
    g.add_nodes_from(range(n))
    g.add_edges_from(list(zip(src.tolist(), dst.tolist(), w.tolist())))
    length = rx.dag_weighted_longest_path_length(g, weight_fn=lambda _s, _t, weight: weight)
    seconds = time.perf_counter() - t
    del g
    gc.collect()
    return seconds, float(length)


def run_networkx(n, src, dst, w) -> tuple[float, float]:
    import networkx as nx

    t = time.perf_counter()
    order = np.argsort(w, kind="stable")        # the last write of a duplicate edge wins: the largest weight
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_weighted_edges_from(zip(src[order].tolist(), dst[order].tolist(), w[order].tolist()))
    length = nx.dag_longest_path_length(g, weight="weight")
    seconds = time.perf_counter() - t
    del g
    gc.collect()
    return seconds, float(length)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vertices", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=5_000_000, help="edges drawn (those past the last layer dropped)")
    p.add_argument("--layers", type=int, default=1000)
    p.add_argument("--span", type=int, default=4, help="an edge reaches 1..span layers ahead")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--networkx-repeat", type=int, default=1)
    p.add_argument("--skip-networkx", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t = time.perf_counter()
    src, dst, w = layered_dag(args.vertices, args.edges, args.layers, args.span, args.seed)
    print(f"graph: {args.vertices:,} vertices, {len(src):,} edges, {args.layers} layers "
          f"(generated in {time.perf_counter() - t:.1f} s)", flush=True)
    contenders = [("flowscope", run_flowscope), ("rustworkx", run_rustworkx)]
    samples: dict[str, list[float]] = {"flowscope": [], "rustworkx": [], "networkx": []}
    lengths: dict[str, float] = {}
    for rep in range(args.repeat):
        for name, fn in contenders[rep % 2:] + contenders[:rep % 2]:
            seconds, length = fn(args.vertices, src, dst, w)
            samples[name].append(seconds)
            lengths.setdefault(name, length)
            print(f"rep {rep + 1} {name:<10} {seconds:8.3f} s  length {length:.12g}", flush=True)
    if not args.skip_networkx:
        for rep in range(args.networkx_repeat):
            seconds, length = run_networkx(args.vertices, src, dst, w)
            samples["networkx"].append(seconds)
            lengths.setdefault("networkx", length)
            print(f"rep {rep + 1} networkx   {seconds:8.3f} s  length {length:.12g}", flush=True)
    ref = lengths["flowscope"]
    for name, length in lengths.items():
        if abs(length - ref) > 1e-9 * abs(ref):
            print(f"FAIL: {name} length {length!r} differs from flowscope's {ref!r}", file=sys.stderr)
            return 1
    value = statistics.median(samples["flowscope"])
    peer = statistics.median(samples["rustworkx"])
    peers = {"rustworkx": {"value": round(peer, 3), "unit": "s"}}
    if samples["networkx"]:
        peers["networkx"] = {"value": round(statistics.median(samples["networkx"]), 3), "unit": "s"}
    ratio = value / peer
    result = write_result({
        "benchmark": BENCH,
        "metric": "seconds",
        "value": round(value, 4),
        "unit": "s",
        "target": round(TARGET_RATIO * peer, 4),
        "meets_target": ratio <= TARGET_RATIO,
        "peers": peers,
        "ratio_vs_peer": round(ratio, 4),
        "params": {
            "vertices": args.vertices, "edges": int(len(src)), "layers": args.layers, "span": args.span,
            "seed": args.seed, "repeat": args.repeat,
            "networkx_repeat": 0 if args.skip_networkx else args.networkx_repeat,
            "longest_path_length": ref,
            "main_peer": "rustworkx",
            "value_is": "median seconds of longest_path_length(n, src, dst, w) from numpy edge arrays",
            "peer_is": "median seconds of PyDiGraph construction from the same arrays + "
                       "dag_weighted_longest_path_length",
            "target_is": f"ratio_vs_peer <= {TARGET_RATIO} (target = {TARGET_RATIO} x the peer's seconds)",
            "commit": git_commit(), "cpu": cpu_model(),
        },
    }, RESULT)
    nx_part = f", networkx {peers['networkx']['value']:.1f} s" if "networkx" in peers else ""
    print(f"critical_path: flowscope {value:.3f} s vs rustworkx {peer:.2f} s (x{1 / ratio:.1f} faster){nx_part}; "
          f"lengths agree to 1e-9; target ratio <= {TARGET_RATIO}: "
          f"{'meets' if result['meets_target'] else 'below'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
