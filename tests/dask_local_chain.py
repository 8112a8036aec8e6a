"""A chain of tasks that write to a file, run by one of Dask's local schedulers on one thread, knowing nothing of
flowscope: SHORTS one-write tasks, a task that sleeps 20 ms and then writes LONG bytes, then TAILS one-write
tasks. Each task depends on the one before it, so they run one after the other, in that order.

    python dask_local_chain.py SCHEDULER FOLDER OUT.json

SCHEDULER is threads (a pool of one thread), processes (one worker process) or sync. Writes OUT.json: {"order"
(the task keys in the order they ran), "sizes" (key -> bytes the task wrote)}.
"""

from __future__ import annotations

import json
import os
import sys
import time

SHORT = 1_000
LONG = 200_000
SHORTS = 40
TAILS = 5


def write_bytes(path: str, n: int, *_deps) -> int:
    """Append ``n`` bytes to ``path`` in one write call."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * n)
    finally:
        os.close(fd)
    return n


def write_slowly(path: str, n: int, *_deps) -> int:
    time.sleep(0.02)  # far above the 1 ms below which a call's I/O is charged to the next measured call
    return write_bytes(path, n)


def chain(path: str) -> tuple[dict, list[str], dict[str, int]]:
    """(graph, its keys in the order they run, key -> bytes written)."""
    dsk: dict = {}
    order = [f"short-{i}" for i in range(SHORTS)] + ["long"] + [f"tail-{i}" for i in range(TAILS)]
    prev: tuple = ()
    for key in order:
        dsk[key] = (write_slowly if key == "long" else write_bytes, path, LONG if key == "long" else SHORT, *prev)
        prev = (key,)
    return dsk, order, {k: LONG if k == "long" else SHORT for k in order}


def run(scheduler: str, folder: str) -> dict:
    """Run the chain on ``scheduler``, writing into ``folder``/out.bin; what ran, in order, and what it wrote."""
    dsk, order, sizes = chain(os.path.join(folder, "out.bin"))
    if scheduler == "threads":
        from dask.threaded import get

        got = get(dsk, order[-1], num_workers=1)
    elif scheduler == "processes":
        from dask.multiprocessing import get

        got = get(dsk, order[-1], num_workers=1, optimize_graph=False)  # not fused: one task per key
    else:
        from dask.local import get_sync

        got = get_sync(dsk, order[-1])
    assert got == SHORT, got
    assert os.path.getsize(os.path.join(folder, "out.bin")) == sum(sizes.values())
    return {"order": order, "sizes": sizes}


if __name__ == "__main__":
    with open(sys.argv[3], "w") as f:
        json.dump(run(sys.argv[1], sys.argv[2]), f)
