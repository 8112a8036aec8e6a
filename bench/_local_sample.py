"""One timed sample of a workload on Dask's local scheduler, in a fresh Python process (run by bench/overhead.py).

A user's uninstrumented process imports Dask and nothing of flowscope or the Profiler, and has no audit hook;
flowscope's open audit hook, once added, stays until the process exits. So each sample is a process of its own
that imports only what its mode uses: ``none`` Dask, ``profiler`` also dask.diagnostics, ``flowscope*`` also
flowscope. Two modes take the capture apart: ``imports`` only imports what ``observe()`` brings into the process,
``hooks-only`` also runs the capture's per-task hooks and discards what they took (no rows, no client, no sampler);
``rows-only`` is observe() writing its rows, without per-task I/O or the hardware sampler, and ``rows-at-end`` the same
writing them only when the graph ends. Each first runs the workload once at a small size in its mode (imports, the collector process's start,
Dask's first-call costs: not timed), then once at full size, timed: wall (or, for ``micro``, the thread's CPU),
process CPU, the collector's CPU, the time the garbage collector took during it (``gc.callbacks``, every thread)
and the objects it tracks after it. Prints one JSON object.

    python bench/_local_sample.py local-tiny flowscope --tasks 20000 --store DIR
    python bench/_local_sample.py micro none --tasks 20000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = ("local-tiny", "local-array", "micro")
MODES = ("none", "profiler", "flowscope", "flowscope-full", "flowscope-no-task-io", "flowscope-reference", "imports",
         "hooks-only", "rows-only", "rows-at-end")
# flowscope's modes: (observe() keywords, FLOWSCOPE_COMPILED); the micro-benchmark's hardware sampler is off, so that
# only the per-task path is measured
OBSERVE = {"flowscope": ({}, "1"), "flowscope-full": ({"level": "full"}, "1"),
           "flowscope-no-task-io": ({"task_io": False}, "1"), "flowscope-reference": ({}, "0"),
           # taking the capture apart further (--local-decompose): its rows written, without per-task I/O and without
           # the hardware sampler; and the same with every row written at the end of the graph (no batch each second
           # or 4,096 tasks while it runs)
           "rows-only": ({"task_io": False, "hardware_period": 0}, "1"),
           "rows-at-end": ({"task_io": False, "hardware_period": 0}, "1")}


class SampleError(RuntimeError):
    """The workload returned a wrong value, or a capture missed tasks."""


def _collector_pids() -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process().children(recursive=True)]


def _cpu_of(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def make_workload(kind: str, tasks: int, array_size: int):
    """(run, what it returns when right or None to take the first result) for ``kind``."""
    if kind == "local-array":
        import dask.array as da

        x = da.random.RandomState(42).random_sample((array_size, array_size), chunks=(250, 250))
        y = (x @ x.T).mean()
        return (lambda: float(y.compute(scheduler="threads"))), tasks
    from _tiny_graph import tiny_graph

    dsk, key, n, expected = tiny_graph(tasks)
    if kind == "local-tiny":
        from dask.threaded import get

        def run():
            got = get(dict(dsk), key)
            if got != expected:
                raise SampleError(f"local tiny graph returned {got}, expected {expected}")
            return got
        return run, n

    from dask.local import get_sync  # micro: no-op tasks on the synchronous scheduler, one thread

    def noop(i):
        return i

    flat = {("noop", i): (noop, i) for i in range(tasks)}
    keys = list(flat)

    def run_sync():
        got = get_sync(dict(flat), keys)
        if len(got) != tasks or got[-1] != tasks - 1:
            raise SampleError("micro-benchmark: wrong results")
        return tasks
    return run_sync, tasks


class _Discard:
    """A client that keeps nothing: every call of the capture on it returns at once."""

    def __getattr__(self, name: str):
        if name == "row_writer":
            return lambda table: (lambda *values: None)
        return lambda *args, **kwargs: "discarded"


class HooksOnly:
    """The local capture's per-task path alone: its hooks registered with Dask, every batch of tasks taken from
    them and discarded (no rows built, no client, no hardware sampler); counts the tasks it took."""

    def __init__(self) -> None:
        from flowscope.sources.dask.local import LocalSchedulerCapture

        self.tasks = self.announced = 0
        self.capture = LocalSchedulerCapture(_Discard())
        self.capture._flush = self._take

    def _take(self, g, final: bool = False) -> None:
        out = g.take()
        self.tasks += out[0] + len(out[-1])
        if final:  # the graph ended: the tasks its graph held (what the capture announces for it)
            self.announced += g.tasks

    def __enter__(self):
        self.capture.register()
        return self

    def __exit__(self, *exc) -> None:
        self.capture.close()


def import_what_observe_imports() -> None:
    """The modules ``observe()`` with no client brings into the user's process (Arrow, numpy, the client, the local
    capture, the hardware sampler), nothing started."""
    import flowscope.embedded  # noqa: F401
    import flowscope.sources.dask.local  # noqa: F401
    import flowscope.sources.hardware  # noqa: F401


class GcClock:
    """Wall time spent in the garbage collector (every thread), from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._t0


def sample(kind: str, mode: str, tasks: int, array_size: int, store: Path, tag: str) -> dict:
    """Warm up, then time one run of ``kind`` in ``mode``; what was measured, and what the capture recorded."""
    small = make_workload(kind, min(tasks, 1_000), min(array_size, 500))[0]
    run, n = make_workload(kind, tasks, array_size)
    clock = time.thread_time if kind == "micro" else time.perf_counter
    gc_clock = GcClock()
    res: dict = {"mode": mode, "workload": kind, "pid": os.getpid(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    for timed in (False, True):
        cm = obs = None
        if mode == "profiler":
            from dask.diagnostics import Profiler

            cm = Profiler()
            cm.__enter__()
        elif mode in ("imports", "hooks-only"):
            import_what_observe_imports()
            if mode == "hooks-only":
                cm = HooksOnly()
                cm.__enter__()
        elif mode != "none":
            from flowscope.sources.dask import observe

            kw, compiled = OBSERVE[mode]
            os.environ["FLOWSCOPE_COMPILED"] = compiled
            if mode == "rows-at-end":
                import flowscope.sources.dask.local as local_capture

                local_capture.FLUSH_TASKS, local_capture.FLUSH_SECONDS = 1 << 62, 1e9
            if kind == "micro":
                kw = {**kw, "hardware_period": 0}
            gc.collect()
            t0 = time.perf_counter()
            cm = observe(store=store, name=f"bench-overhead-{tag}", **kw)
            obs = cm.__enter__()
            setup_s = time.perf_counter() - t0
        gc.collect()
        pids = _collector_pids()
        gc_clock.total = 0.0
        cpu0, coll0, t0 = time.process_time(), _cpu_of(pids), clock()
        try:
            value = (run if timed else small)()
        except BaseException:
            if cm is not None:
                cm.__exit__(*sys.exc_info())
            raise
        wall = clock() - t0
        gc_s = gc_clock.total
        cpu = {"bench": time.process_time() - cpu0, "collector": _cpu_of(pids) - coll0}
        t0 = time.perf_counter()
        if cm is not None:
            cm.__exit__(None, None, None)
        teardown_s = time.perf_counter() - t0
        if not timed:
            continue
        res.update(wall_s=wall, cpu_s=cpu, value=value, clock="thread_time" if kind == "micro" else "perf_counter",
                   gc_s=gc_s, gc_objects=len(gc.get_objects()))
        if mode == "profiler":
            res["tasks"] = len(cm.results)
        if mode == "hooks-only":
            if cm.tasks != cm.announced or not cm.tasks:
                raise SampleError(f"{kind}: Dask ran {cm.announced} tasks, the hooks took {cm.tasks}")
            res["tasks"] = cm.tasks
        if obs is not None:
            res.update(setup_s=setup_s, teardown_s=teardown_s)
            if obs.hook_errors != {"local": 0}:
                raise SampleError(f"flowscope local hooks failed: {obs.hook_errors}")
            row = obs.run.sql("""SELECT (SELECT count(*) FROM spans WHERE kind = 'task') AS spans,
                                        (SELECT sum(CAST(json_extract(attrs, '$.tasks') AS BIGINT)) FROM logs
                                         WHERE category = 'graph-submitted') AS announced""").iloc[0]
            if int(row["spans"]) != int(row["announced"]):
                raise SampleError(f"{kind}: Dask ran {int(row['announced'])} tasks, the run holds "
                                  f"{int(row['spans'])} task spans")
            res["tasks"] = int(row["spans"])
            counts = obs.run.counts()
            res["records"] = {k: counts[k] for k in ("spans", "dependencies", "io", "metrics") if k in counts}
            shutil.rmtree(obs.run_dir, ignore_errors=True)
        res.setdefault("tasks", n)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workload", choices=WORKLOADS)
    p.add_argument("mode", choices=MODES)
    p.add_argument("--tasks", type=int, default=20_000, help="tasks of local-tiny and micro (default 20,000)")
    p.add_argument("--array-size", type=int, default=3_000, help="side of local-array's matrix (default 3,000)")
    p.add_argument("--store", type=Path, default=None, help="flowscope's store (default: a temporary directory)")
    p.add_argument("--tag", default="sample", help="names the run")
    args = p.parse_args(argv)
    tmp = None
    if args.store is None:
        tmp = args.store = Path(tempfile.mkdtemp(prefix="flowscope-bench-local-"))
    try:
        print(json.dumps(sample(args.workload, args.mode, args.tasks, args.array_size, args.store, args.tag)),
              flush=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
