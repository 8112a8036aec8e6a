"""``flowscope io``: the I/O job summary of a run (by interface, file, access size and rank)."""

from __future__ import annotations

import argparse
import math

from flowscope.cli.output import LOOKUP_STORE_HELP, console, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("io", help="summarise a run's I/O: bytes and time by interface and file, sizes, ranks",
                       description="Summarise the I/O a run recorded (an imported Darshan log's counters and DXT "
                                   "traces, a Dask run's per-task I/O, your own io rows): bytes, operations and "
                                   "read / write / metadata time per I/O interface (POSIX, MPI-IO, STDIO, HDF5...), "
                                   "the largest files, access-size histograms, the volume per rank and its "
                                   "imbalance. Each byte is counted once in the totals (MPI-IO over POSIX is not "
                                   "added twice).")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("--store", help=LOOKUP_STORE_HELP)
    p.add_argument("--top", type=int, default=10, help="largest files to list (default 10)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def _bytes(n: float | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _s(x: float | None) -> str:
    return "unknown" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f} s"


def run(args: argparse.Namespace) -> int:
    from flowscope.analysis.io_summary import io_summary
    from flowscope.store.catalog import resolve_run
    from flowscope.store.run import open_run

    r = open_run(resolve_run(args.run, args.store))
    s = io_summary(r, top=max(args.top, 0))
    if args.json:
        print_json({"run_id": r.meta.get("run_id"), **s.to_dict()})
        return 0
    rid = r.meta.get("run_id")
    if s.absent:
        console.print(f"run {rid}: {s.absent}", markup=False, highlight=False)
        return 0
    t = s.totals
    console.print(f"run {rid}: {s.rows:,} I/O records ({', '.join(s.sources)}); read {_bytes(t['read_bytes'])} in "
                  f"{t['reads']:,} operations, written {_bytes(t['write_bytes'])} in {t['writes']:,}, {t['files']:,} "
                  f"files; data time {_s(t['data_s'])}, metadata time {_s(t['meta_s'])} (summed over ranks)",
                  markup=False, highlight=False)
    print_table("by interface (layers above another, such as MPI-IO over POSIX, are not in the totals)",
                ["interface", "files", "read", "written", "reads", "writes", "read time", "write time",
                 "metadata time", "in totals"],
                [[i["interface"], f"{int(i['files']):,}", _bytes(i["read_bytes"]), _bytes(i["write_bytes"]),
                  f"{int(i['reads']):,}", f"{int(i['writes']):,}", _s(i["read_s"]), _s(i["write_s"]), _s(i["meta_s"]),
                  "yes" if i["in_totals"] else "no"] for i in s.by_interface.to_dict("records")])
    if len(s.top_files):
        print_table(f"top {len(s.top_files)} files by bytes", ["file", "bytes", "read", "written", "data time",
                                                                "metadata time", "interfaces"],
                    [[f["path"], _bytes(f["bytes"]), _bytes(f["read_bytes"]), _bytes(f["write_bytes"]),
                      _s(f["data_s"]), _s(f["meta_s"]), f["interfaces"]] for f in s.top_files.to_dict("records")])
    if len(s.sizes):
        from flowscope.analysis.io_summary import SIZE_BUCKETS

        grid = s.sizes.pivot_table(index=["interface", "op"], columns="bucket", values="count", aggfunc="sum",
                                   fill_value=0).reindex(columns=list(SIZE_BUCKETS), fill_value=0)
        print_table("access sizes (operations per size, bytes)", ["interface", "op", *SIZE_BUCKETS],
                    [[i, op, *(f"{int(v):,}" for v in row)] for (i, op), row in grid.iterrows()])
    im = s.imbalance
    if im["ranks"]:
        console.print(f"per rank: {im['ranks']} ranks, mean {_bytes(im['mean_bytes'])}, max {_bytes(im['max_bytes'])} "
                      f"(rank {im['max_rank']}), max / mean {im['max_over_mean']:.2f}, imbalance "
                      f"{100 * im['imbalance']:.1f} %", markup=False, highlight=False)
    if im["unattributed_bytes"]:
        console.print(f"{_bytes(im['unattributed_bytes'])} of the totals are in rows that name no rank (a file "
                      f"Darshan shared over all ranks with no DXT trace to split it, or a source with no ranks)",
                      markup=False, highlight=False)
    if s.timeline_interfaces:
        console.print("per-operation timeline (the report draws it): " + ", ".join(s.timeline_interfaces),
                      markup=False, highlight=False)
    return 0
