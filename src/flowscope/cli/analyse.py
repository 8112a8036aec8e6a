"""``flowscope analyse``: the breakdown, per-group statistics and anomalies of a run too large for one process,
computed on a Dask cluster."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator

from flowscope.cli.output import LOOKUP_STORE_HELP, console, fmt_ns, print_json, print_table, progress
from flowscope.cli.semantics import add_semantics_option, open_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyse", aliases=["analyze"],
                       help="breakdown, task groups and anomalies of a run too large for one process, on Dask",
                       description="Read the run's spans in parts, regroup them by resource with Dask's shuffle, and "
                                   "compute where the time went, per-group statistics and the anomalous calls on a "
                                   "Dask cluster: a new LocalCluster on this machine, or the cluster at "
                                   "--scheduler (its workers must be able to read the store). The results equal "
                                   "`flowscope show`'s breakdown, the task groups and `flowscope anomalies`.")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("--store", help=LOOKUP_STORE_HELP)
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="address of a running Dask scheduler (default: start a LocalCluster here)")
    p.add_argument("--workers", type=int, default=None,
                   help="LocalCluster: worker processes (default: the cores, one thread each)")
    p.add_argument("--memory-limit", default="auto",
                   help="LocalCluster: memory per worker, e.g. 3GiB (default: this machine's memory shared out)")
    p.add_argument("--rows-per-part", type=int, default=None,
                   help="spans per part (default 2,000,000; a worker holds one part at a time)")
    p.add_argument("--scratch", metavar="DIR",
                   help="folder for the run regrouped by resource, readable by every worker (default: beside "
                        "the run); removed afterwards")
    p.add_argument("--top", type=int, default=10, help="groups and anomalies to print (default 10)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_semantics_option(p)
    p.set_defaults(func=run)


@contextlib.contextmanager
def dask_client(scheduler: str | None, workers: int | None, memory_limit: str) -> Iterator:
    """A Dask client of the cluster at ``scheduler``, or of a new LocalCluster (closed on exit)."""
    from distributed import Client, LocalCluster

    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    n = workers or os.cpu_count() or 1
    with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, memory_limit=memory_limit,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def run(args: argparse.Namespace) -> int:
    import logging

    import pandas as pd

    from flowscope.analysis.partitioned import ROWS_PER_PARTITION, analyse

    # each shuffle's start and end is logged as a warning by Dask; the progress bar says as much
    logging.getLogger("distributed.shuffle._scheduler_plugin").setLevel(logging.ERROR)

    if args.rows_per_part is not None and args.rows_per_part < 1:
        raise ValueError(f"--rows-per-part must be at least 1, not {args.rows_per_part}")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, not {args.workers}")
    r = open_for(args)
    if not r.counts()["spans"]:
        message = f"run {r.run_id} has no spans: nothing to analyse (`flowscope show` says what it holds)"
        if args.json:
            print_json({"run_id": r.run_id, "rows": 0, "message": message})
        else:
            console.print(message)
        return 0
    with dask_client(args.scheduler, args.workers, args.memory_limit) as client, progress() as bar:
        tasks: dict[str, int] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        res = analyse(r, client, rows_per_partition=args.rows_per_part or ROWS_PER_PARTITION,
                      scratch=args.scratch, progress=on_progress)
    top = res.anomalies.slice(0, max(args.top, 0)).to_pylist()
    if args.json:
        out = res.to_dict()
        out["top_anomalies"] = [{k: v for k, v in row.items() if k not in ("provenance", "model")} for row in top]
        print_json(out)
        return 0
    b = res.breakdown
    console.print(f"run {res.run_id}: {res.rows:,} spans in {res.partitions} parts; makespan {b.makespan_s:.6g} s, "
                  f"{b.tasks:,} tasks on {b.executors} executing resources")
    print_table("where the time went (slot-seconds)", ["category", "seconds", "bytes", "count"],
                [[row["category"], f"{row['seconds']:.6g}" if pd.notna(row["seconds"]) else "unknown",
                  f"{int(row['bytes']):,}" if pd.notna(row["bytes"]) else "",
                  f"{int(row['count']):,}" if pd.notna(row["count"]) else ""]
                 for row in b.to_frame().to_dict("records")])
    g = res.task_groups.head(max(args.top, 0))
    print_table(f"task groups (top {len(g)} of {len(res.task_groups)} by total time)",
                ["group", "category", "count", "total s", "mean", "cv", "max"],
                [[row["group"], row["category"], f"{int(row['count']):,}", f"{row['total_s']:.6g}",
                  fmt_ns(row["mean_s"] * 1e9), f"{row['cv']:.2f}", fmt_ns(row["max_s"] * 1e9)]
                 for row in g.to_dict("records")])
    console.print(f"{res.anomalies.num_rows:,} anomalous calls among {len(res.model):,} functions")
    if top:
        print_table(f"top {len(top)} anomalies (most time lost first)",
                    ["#", "function", "resource", "task", "time", "lost"],
                    [[row["anomaly_id"], row["function"], row["resource_id"], row["task_key"] or "",
                      fmt_ns(row["exclusive_ns"] if row["metric"] == "exclusive" else row["inclusive_ns"]),
                      fmt_ns(row["severity_ns"])] for row in top])
    console.print("stages: " + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in res.timings_s.items()))
    return 0
