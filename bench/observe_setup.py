"""What ``observe(client)``'s setup and teardown cost, in CPU time of every process (the caller's, the workers', the
collector's) and in wall time, with an almost empty block (100 tiny tasks), on fresh clusters.

A diagnostic beside ``bench/overhead.py`` (which times setup and teardown inside each level's ratio): it splits the
two apart per process, which is what says where they go. CPU time moves much less than wall time on a shared
machine. It runs the observe() of whatever flowscope is importable, so the same command measures another tree
(``PYTHONPATH=<tree>/src``); a tree without capture levels or ``start_collector`` is measured as it is, its
collector started inside observe() (counted in setup: ``collector`` is then that process's whole CPU).

    python bench/observe_setup.py            # 3 repetitions per level
    python bench/observe_setup.py --repeat 5
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from distributed import Client, LocalCluster

from flowscope.sources import dask as fs_dask

CLUSTER = {"n_workers": 2, "threads_per_worker": 2, "processes": True, "dashboard_address": None}


def inc(x: int) -> int:
    return x + 1


def _cpu() -> float:
    ct = psutil.Process().cpu_times()
    return ct.user + ct.system


def _collector_cpu() -> float:
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            if "serve" in child.cmdline():
                ct = child.cpu_times()
                total += ct.user + ct.system
        except psutil.NoSuchProcess:
            continue
    return total


def _snapshot(client) -> dict:
    return {"caller": _cpu(), "workers": sum(client.run(_cpu).values()), "collector": _collector_cpu()}


def _delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in a}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    store = Path(tempfile.mkdtemp(prefix="flowscope-bench-setup-")) / "store"
    levels = ("standard", "full") if "level" in inspect.signature(fs_dask.observe).parameters else (None,)
    if hasattr(fs_dask, "start_collector"):
        fs_dask.start_collector(store)  # before any cluster, as a user's process can
    rows: dict = {lv: [] for lv in levels}
    for _ in range(args.repeat):
        for level in levels:
            with LocalCluster(**CLUSTER) as cluster, Client(cluster) as client:
                client.run(inc, 0)
                kw = {"level": level} if level else {}
                s0 = _snapshot(client)
                t0 = time.perf_counter()
                cm = fs_dask.observe(client, store=store, **kw)
                cm.__enter__()
                t1 = time.perf_counter()
                s1 = _snapshot(client)
                client.gather(client.map(inc, range(100)))
                s2 = _snapshot(client)
                t2 = time.perf_counter()
                cm.__exit__(None, None, None)
                t3 = time.perf_counter()
                s3 = _snapshot(client)
                if not hasattr(fs_dask, "start_collector"):  # the collector process is gone: its CPU is all setup's
                    s3["collector"] = s2["collector"]
                rows[level].append({"setup_s": t1 - t0, "teardown_s": t3 - t2, "setup_cpu": _delta(s0, s1),
                                    "teardown_cpu": _delta(s2, s3)})
    for level, rs in rows.items():
        def med(f, rs=rs):
            return statistics.median(f(r) for r in rs)
        print(f"level {level or '(no levels)'}: median of {len(rs)}, load avg {psutil.getloadavg()[0]:.1f}")
        for part in ("setup", "teardown"):
            cpu = {k: med(lambda r, k=k, part=part: r[f"{part}_cpu"][k]) for k in ("caller", "workers", "collector")}
            print(f"  {part:<8} wall {med(lambda r, part=part: r[f'{part}_s']):.3f} s, CPU caller {cpu['caller']:.3f} s, "
                  f"workers {cpu['workers']:.3f} s (2 workers), collector {cpu['collector']:.3f} s")


if __name__ == "__main__":
    main()
