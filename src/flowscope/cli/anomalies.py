"""``flowscope anomalies``: anomalous function calls of a run, ranked, with why each was flagged."""

from __future__ import annotations

import argparse
import json

from flowscope.cli.output import LOOKUP_STORE_HELP, console, fmt_ns, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("anomalies", help="find anomalous function calls (HBOS / SSTD, as Chimbuko)",
                       description="Judge every function call (Dask task, traced function, imported enter/leave) "
                                   "of a run against its function's model and print the most severe anomalies "
                                   "with why each was flagged. --reduce writes a reduced run that keeps only the "
                                   "anomalies, a window of calls around each, exemplars and the model.")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("--store", help=LOOKUP_STORE_HELP)
    p.add_argument("--algo", choices=("hbos", "sstd"), default="hbos", help="detector (default hbos)")
    p.add_argument("--sigma", type=float, default=6.0, help="sstd: flag outside mean +- sigma * std (default 6)")
    p.add_argument("--threshold", type=float, default=0.99,
                   help="hbos: flag from min + threshold * (max - min) of the bin scores (default 0.99)")
    p.add_argument("--metric", choices=("exclusive", "inclusive"), default="exclusive",
                   help="time scored (default exclusive)")
    p.add_argument("--window", type=int, default=5, help="calls kept on each side of an anomaly (default 5)")
    p.add_argument("--top", type=int, default=10, help="anomalies to print (default 10)")
    p.add_argument("--reduce", metavar="OUT", help="write the reduced run to directory OUT")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def why(row: dict) -> str:
    """One sentence saying why the anomaly in ``row`` (an anomalies-table record) was flagged."""
    m = json.loads(row["model"])
    x = row[f"{row['metric']}_ns"]
    if row["algo"] == "sstd":
        side = "above" if x >= m["mean"] else "below"
        return (f"{row['metric']} {fmt_ns(x)} is {row['score']:.1f} std {side} the mean {fmt_ns(m['mean'])} of "
                f"{m['count']} calls (limit: {m['sigma']:g} std, {fmt_ns(m['lower'])} .. {fmt_ns(m['upper'])})")
    return (f"{row['metric']} {fmt_ns(x)} falls in a histogram bin holding {m['bin_count']} of {m['count']} calls "
            f"(score {row['score']:.2f} >= threshold {row['threshold']:.2f}; {m['bins']} bins of "
            f"{fmt_ns(m['bin_width'])}; mean {fmt_ns(m['mean'])})")


def run(args: argparse.Namespace) -> int:
    from flowscope.analysis.anomalies import AnomalyConfig, detect_run
    from flowscope.analysis.anomalies.reduce import write_reduced
    from flowscope.store.catalog import resolve_run
    from flowscope.store.run import open_run

    r = open_run(resolve_run(args.run, args.store))
    config = AnomalyConfig(algo=args.algo, sigma=args.sigma, threshold=args.threshold, metric=args.metric,
                           window=args.window)
    det = detect_run(r, config)
    rows = det.anomalies.slice(0, max(args.top, 0)).to_pylist()
    reduction = None
    if args.reduce:
        reduction = write_reduced(det, args.reduce, full_spans=r.arrow("spans"), meta=r.meta)
    total = det.anomalies.num_rows
    by_resource = {}
    for res in det.anomalies["resource_id"].to_pylist():
        by_resource[res] = by_resource.get(res, 0) + 1
    if args.json:
        print_json({"run_id": r.meta.get("run_id"), "config": config.as_dict(), "calls": len(det.calls),
                    "functions": len(det.model), "anomalies": total,
                    "top": [{**{k: v for k, v in row.items() if k != "provenance"}, "model": json.loads(row["model"]),
                             "why": why(row)} for row in rows],
                    "by_resource": by_resource, "reduction": reduction})
        return 0
    console.print(f"run {r.meta.get('run_id')}: {len(det.calls)} calls of {len(det.model)} functions, "
                  f"{total} anomal{'y' if total == 1 else 'ies'} ({config.algo}, {config.metric} time)")
    if rows:
        print_table(f"top {len(rows)} anomalies (most time lost first)",
                    ["#", "function", "resource", "task", config.metric, "lost", "why"],
                    [[row["anomaly_id"], row["function"], row["resource_id"], row["task_key"] or "",
                      fmt_ns(row[f"{config.metric}_ns"]), fmt_ns(row["severity_ns"]), why(row)] for row in rows])
    if reduction:
        console.print(f"reduced run written to {args.reduce}: kept {reduction['kept_calls_rows']} of "
                      f"{reduction['full_spans_rows']} calls, {reduction['kept_bytes']} of "
                      f"{reduction['full_spans_bytes']} bytes ({reduction['reduction_factor']:.1f}x smaller)")
    return 0
