"""A Dask script that knows nothing of flowscope: a delayed graph and a dask.array reduction on one of Dask's
local schedulers, reporting what really happened so that tests can compare a run against it.

    python dask_local_workload.py SCHEDULER OUT.json [FILES_DIR]

SCHEDULER is threads, processes or sync. Every delayed task returns the process and OS thread that ran it;
the expected graph of each computation is taken from Dask's own graph of the collection, optimised the way
the scheduler optimises it. Writes OUT.json: {"main_pid", "main_tid", "records" (one per delayed task: key,
pid, tid), "graphs" (per computation: its task keys and its dependency edges), "written" (key -> bytes the
task wrote, when FILES_DIR is given)}.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import dask
import dask.array as da
from dask import delayed
from dask._task_spec import DataNode, convert_legacy_graph
from dask._expr import FinalizeCompute
from dask.base import collections_to_expr
from dask.optimization import cull, fuse


def _me(key: str) -> dict:
    return {"key": key, "pid": os.getpid(), "tid": threading.get_native_id()}


def load(key: str) -> list:
    time.sleep(0.005)
    return [_me(key)]


def combine(key: str, *parts: list) -> list:
    time.sleep(0.005)
    return [r for p in parts for r in p] + [_me(key)]


def write(key: str, path: str, size: int, parts: list) -> list:
    """Writes ``size`` bytes to ``path`` through write calls: what per-task I/O must attribute to this task (it
    takes over 1 ms, so that at the default capture level its I/O is read at its own end)."""
    time.sleep(0.002)
    with open(path, "wb") as f:
        f.write(b"x" * size)
    return parts + [_me(key)]


def delayed_graph(files: str | None):
    loads = [delayed(load, pure=True)(f"load-{i}", dask_key_name=f"load-{i}") for i in range(6)]
    combs = [delayed(combine, pure=True)(f"combine-{i}", loads[i], loads[(i + 1) % 6], dask_key_name=f"combine-{i}")
             for i in range(6)]
    total = delayed(combine, pure=True)("total", *combs, dask_key_name="total")
    if files is None:
        return total
    return delayed(write, pure=True)("write", os.path.join(files, "out.bin"), 300_000 + os.getpid() % 1000, total,
                                     dask_key_name="write")


def graph_of(collection, scheduler: str) -> dict:
    """The task graph the scheduler runs for ``collection``: Dask's own graph, optimised as ``compute`` does,
    and for the processes scheduler also culled and fused as ``dask.multiprocessing.get`` does."""
    expr = FinalizeCompute(collections_to_expr([collection], optimize_graph=True)).optimize()  # as dask.compute
    dsk = dict(expr.__dask_graph__())
    if scheduler == "processes":
        flat = list(dask.core.flatten(expr.__dask_keys__()))
        dsk, deps = cull(dsk, flat)
        dsk, _ = fuse(dsk, flat, deps)
    nodes = convert_legacy_graph(dsk)
    tasks = sorted(str(k) for k, v in nodes.items() if not isinstance(v, DataNode))
    edges = sorted([str(k), str(d)] for k, v in nodes.items() for d in v.dependencies)
    return {"tasks": tasks, "edges": edges}


def main(scheduler: str, out: str, files: str | None = None) -> None:
    result = {"main_pid": os.getpid(), "main_tid": threading.get_native_id(), "graphs": []}
    total = delayed_graph(files)
    result["graphs"].append(graph_of(total, scheduler))
    result["records"] = total.compute(scheduler=scheduler)

    x = da.random.RandomState(42).random_sample((240, 240), chunks=80)
    y = (x @ x.T).mean()
    result["graphs"].append(graph_of(y, scheduler))
    value = float(y.compute(scheduler=scheduler))
    assert 0 < value < 240, value
    if files is not None:
        result["written"] = {"write": os.path.getsize(os.path.join(files, "out.bin"))}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
