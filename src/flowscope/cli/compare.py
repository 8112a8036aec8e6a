"""``flowscope compare``: repeated runs side by side, and which task groups changed between two sets of runs."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from flowscope.cli.output import STORE_HELP, console, err_console, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare runs: phases with their spread, changed task groups, order, placement",
                       description="Compare runs (of one store or several): computation, communication, I/O and "
                                   "total time per run and their mean and spread across the runs of each name; "
                                   "each task group's duration distribution per run, with its CV; which groups "
                                   "changed significantly between two sets of runs (Mann-Whitney U per group, Holm's "
                                   "correction, and a minimum effect); Kendall's tau between the runs' task start "
                                   "orders; where each group's tasks ran. Without --against, the latest run is "
                                   "tested against the others. See docs/compare.md.")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids in the store(s), or run directories")
    p.add_argument("--name", action="append", default=[], help="every run with this name (repeatable)")
    p.add_argument("--against", nargs="+", default=[], metavar="RUN",
                   help="the runs to test against (the baseline); the others are the runs tested")
    p.add_argument("--against-name", action="append", default=[], metavar="NAME",
                   help="every run with this name is a baseline run (repeatable)")
    p.add_argument("--store", action="append", default=[], help=STORE_HELP + " (repeatable: several stores)")
    p.add_argument("--alpha", type=float, default=None, help="significance level after Holm's correction (0.01)")
    p.add_argument("--min-change", type=float, default=None,
                   help="least relative change of a group's median duration called a change (0.2: 20 %%)")
    p.add_argument("--min-shift", type=float, default=None,
                   help="least absolute change of a group's median duration called a change, seconds (0.001)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="also write the comparison's figures as one self-contained HTML file (the dashboard's "
                        "compare page, offline)")
    p.set_defaults(func=cmd_compare)


def _s(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3f}" if abs(x) >= 0.001 or x == 0 else f"{x:.2e}"


def cmd_compare(args: argparse.Namespace) -> int:
    from flowscope.analysis import compare as cmp
    from flowscope.store.catalog import default_store
    from flowscope.store.layout import RUN_JSON, read_json
    from flowscope.store.run_set import open_store

    stores = [Path(s) for s in args.store] or [default_store()]
    ids = []
    for r in args.runs:  # a run directory brings its store along
        path = Path(r)
        if (path / RUN_JSON).is_file():
            if path.parent not in stores:
                stores.append(path.parent)
            ids.append(read_json(path / RUN_JSON)["run_id"])
        else:
            ids.append(r)
    if not (ids or args.name):
        raise ValueError("name the runs to compare: RUN ... or --name NAME")
    chosen, baseline = cmp.choose(open_store(*stores), ids, args.name, args.against, args.against_name)
    options = {k: v for k, v in (("alpha", args.alpha), ("min_change", args.min_change),
                                 ("min_shift_s", args.min_shift)) if v is not None}
    c = cmp.compare(chosen, before=baseline or None, **options)
    figures = _figures(chosen)
    if args.html:
        from flowscope.report.compare_view import compare_view
        from flowscope.report.snapshot import write_snapshot

        # the figures' own tables, with their per-record rows; the critical paths (a replay per run) made once
        doc = compare_view(chosen, comparison=c, paths=figures["paths"])
        doc["store"] = ", ".join(map(str, stores))
        out = write_snapshot("compare.html", doc, args.html)
        err_console.print(f"wrote {out}", markup=False, highlight=False, soft_wrap=True)
    if args.json:
        print_json({**c.to_dict(), "figures": {"transfer_fit": _rows(figures["fit"]),
                                               "warning_summary": _rows(figures["warnings"]),
                                               "critical_paths": figures["paths"].to_dict()}})
        return 0
    print_table("runs", ["run", "name", "host", "script", "wall (s)"],
                [[r.run_id, r.name, r.host, r.script_sha256[:12] if isinstance(r.script_sha256, str) else "(none)", _s(r.duration_s)]
                 for r in c.runs.itertuples()])
    print_table("time per phase (s): mean ± std across the runs of each name", ["name", "phase", "runs", "mean",
                                                                                  "std", "min", "max", "CV"],
                [[r.name, r.phase, r.runs, _s(r.mean_s), _s(r.std_s), _s(r.min_s), _s(r.max_s), _s(r.cv)]
                 for r in c.phase_summary.itertuples()])
    print_table("task groups per run (s)", ["run", "group", "tasks", "total", "mean", "median", "CV"],
                [[r.run_id, r.group, r.tasks, _s(r.total_s), _s(r.mean_s), _s(r.median_s), _s(r.cv)]
                 for r in c.groups.itertuples()])
    if len(c.changes):
        console.print(f"{', '.join(c.after)} against {', '.join(c.before)}: {c.settings['test']}, "
                      f"alpha {c.settings['alpha']}", markup=False, highlight=False, soft_wrap=True)
        print_table("task groups: what changed", ["group", "verdict", "median before", "median after", "ratio",
                                                  "tasks", "p (adjusted)"],
                    [[r.group, r.direction or "unchanged", _s(r.median_before_s), _s(r.median_after_s),
                      _s(r.ratio), f"{r.tasks_before} / {r.tasks_after}", f"{r.p_adjusted:.2g}"]
                     for r in c.changes.itertuples()])
        changed = c.changes[c.changes["changed"]]
        console.print("changed: " + ("; ".join(f"{r.group} {r.direction} (median {_s(r.median_before_s)} s -> "
                                                f"{_s(r.median_after_s)} s, adjusted p {r.p_adjusted:.2g})"
                                                for r in changed.itertuples()) or "no task group"),
                      markup=False, highlight=False, soft_wrap=True)
    else:
        console.print("task groups: nothing to test (one set of runs is empty)")
    if len(c.order):
        print_table("scheduling order (Kendall tau over the start order of shared task keys)",
                    ["run", "run", "shared tasks", "tau"],
                    [[r.run_a, r.run_b, r.common_tasks, _s(r.kendall_tau)] for r in c.order.itertuples()])
    print_table("where tasks ran", ["run", "group", "host", "worker", "tasks", "share"],
                [[r.run_id, r.group, r.host, r.worker, r.tasks, f"{100 * r.share:.0f} %"]
                 for r in c.placement.itertuples()])
    paths, groups = figures["paths"].runs, figures["paths"].groups
    print_table("critical paths side by side", ["run", "path", "length (s)", "groups on it (share)"],
                [[r.run_id, r.kind or f"none: {r.missing}", _s(r.length_s),
                  ", ".join(f"{g.group} {100 * g.share:.0f} %" for g in
                            groups[groups["run_id"] == r.run_id].head(3).itertuples())]
                 for r in paths.itertuples()])
    if len(figures["fit"]):
        print_table("communication: latency and bandwidth per run and locality (time = latency + size / bandwidth)",
                    ["run", "locality", "transfers", "latency (s)", "bandwidth (MB/s)"],
                    [[r.run_id, r.locality, r.transfers, _s(r.latency_s),
                      "-" if not r.bandwidth == r.bandwidth else f"{r.bandwidth / 1e6:.3g}"]
                     for r in figures["fit"].itertuples()])
    print_table("warnings against long tasks (a long task: >= 10x its run's median and >= 0.1 s)",
                ["run", "warnings", "during long tasks", "long tasks", "their share of host-time"],
                [[r.run_id, r.warnings, r.during_long_tasks, r.long_tasks, f"{100 * r.long_task_time_share:.0f} %"]
                 for r in figures["warnings"].itertuples()])
    return 0


def _figures(runs) -> dict:
    """The figures' summary tables of ``runs`` (analysis/compare_figures.py)."""
    from flowscope.analysis import compare_figures as cf

    return {"fit": cf.transfer_fit(cf.transfer_costs(runs)), "warnings": cf.warnings_and_long_tasks(runs)[2],
            "paths": cf.critical_paths(runs)}


def _rows(df) -> list[dict]:
    import json

    return json.loads(df.to_json(orient="records", double_precision=15)) if len(df) else []
