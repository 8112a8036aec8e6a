"""The tiny-task DAG of bench/overhead.py, in a module of its own so that a process timing Dask's local scheduler
(bench/_local_sample.py) can build it without importing what the uninstrumented side would not."""

from __future__ import annotations

MOD = 1_000_003


def inc(x):
    return x + 1


def add(a, b):
    return (a + b) % MOD


def tiny_graph(tasks: int, width: int = 100) -> tuple[dict, str, int, int]:
    """A layered DAG: ``width`` inc tasks, then layers of ``add(prev[i], prev[i+1 mod width])``, then one
    ``sum`` of the last layer. Returns (graph, output key, number of tasks, expected result)."""
    width = max(2, min(width, tasks // 2))
    depth = max(2, tasks // width)
    dsk: dict = {}
    vals = [i + 1 for i in range(width)]
    for i in range(width):
        dsk[("inc", i)] = (inc, i)
    prev = "inc"
    for d in range(1, depth):
        name = f"add-{d:04d}"
        for i in range(width):
            dsk[(name, i)] = (add, (prev, i), (prev, (i + 1) % width))
        vals = [(vals[i] + vals[(i + 1) % width]) % MOD for i in range(width)]
        prev = name
    dsk["total"] = (sum, [(prev, i) for i in range(width)])
    return dsk, "total", len(dsk), sum(vals)
