"""What ``observe(client)``'s setup and teardown cost, in CPU time of every process (the caller's, the workers', the
collector's) and in wall time, with an almost empty block (100 tiny tasks), on fresh clusters.

A diagnostic beside ``bench/overhead.py`` (which times setup and teardown inside each level's ratio): it splits the
two apart per process, which is what says where they go. CPU time moves much less than wall time on a shared
machine. It runs the observe() of whatever flowscope is importable, so the same command measures another tree
(``PYTHONPATH=<tree>/src``); a tree without capture levels or ``start_collector`` is measured as it is, its
collector started inside observe() (counted in setup: ``collector`` is then that process's whole CPU).

    python bench/observe_setup.py            # 5 repetitions per level, levels interleaved
    python bench/observe_setup.py --repeat 9

Writes ``bench/results/observe_setup.json`` (bench/README.md's format): ``value`` is the median setup + teardown
wall time of the worst level, against bench/overhead.py's 0.3 s target; no peer (a diagnostic).
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

from _machine import cpu_model, git_commit, write_result
from flowscope.sources import dask as fs_dask

RESULTS = Path(__file__).resolve().parent / "results" / "observe_setup.json"
TARGET_S = 0.3  # setup + teardown, median, worst level (bench/overhead.py's TARGET_SETUP_TEARDOWN_S)

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
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    store = Path(tempfile.mkdtemp(prefix="flowscope-bench-setup-")) / "store"
    levels = ("standard", "full") if "level" in inspect.signature(fs_dask.observe).parameters else (None,)
    if hasattr(fs_dask, "start_collector"):
        fs_dask.start_collector(store)  # before any cluster, as a user's process can
    rows: dict = {lv: [] for lv in levels}
    for rep in range(args.repeat):
        for level in (levels if rep % 2 == 0 else levels[::-1]):  # neither level always first
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
    summary: dict = {}
    for level, rs in rows.items():
        def med(f, rs=rs):
            return statistics.median(f(r) for r in rs)
        print(f"level {level or '(no levels)'}: median of {len(rs)}, load avg {psutil.getloadavg()[0]:.1f}")
        lv = summary[level or "(no levels)"] = {}
        for part in ("setup", "teardown"):
            cpu = {k: med(lambda r, k=k, part=part: r[f"{part}_cpu"][k]) for k in ("caller", "workers", "collector")}
            walls = [r[f"{part}_s"] for r in rs]
            lv[part] = {"wall_s": {"median": statistics.median(walls), "min": min(walls), "max": max(walls)},
                        "cpu_s": cpu}
            print(f"  {part:<8} wall {med(lambda r, part=part: r[f'{part}_s']):.3f} s, CPU caller {cpu['caller']:.3f} s, "
                  f"workers {cpu['workers']:.3f} s (2 workers), collector {cpu['collector']:.3f} s")
        both = [r["setup_s"] + r["teardown_s"] for r in rs]
        lv["setup_plus_teardown_s"] = {"median": statistics.median(both), "min": min(both), "max": max(both)}
    worst = max(summary, key=lambda k: summary[k]["setup_plus_teardown_s"]["median"])
    value = summary[worst]["setup_plus_teardown_s"]["median"]
    write_result({"benchmark": "observe_setup", "metric": "setup_plus_teardown_wall_s", "value": round(value, 4),
                  "unit": "s", "target": TARGET_S, "meets_target": value <= TARGET_S, "peers": {},
                  "ratio_vs_peer": None,
                  "params": {"value_is": f"median setup + teardown wall time of observe(client) at the worst level "
                                         f"({worst}), an almost empty block of 100 tasks, fresh 2-worker clusters",
                             "repeat": args.repeat, "levels": summary, "load_avg_1m": round(psutil.getloadavg()[0], 2),
                             "cpu_model": cpu_model(), "commit": git_commit()}}, RESULTS)
    print(f"observe_setup: setup + teardown {value:.3f} s at level {worst} (target <= {TARGET_S} s), median of "
          f"{args.repeat}")


if __name__ == "__main__":
    main()
