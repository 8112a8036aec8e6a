"""``flowscope explain``: why a run took as long as it did, what to change, and what changed between runs."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from rich.markup import escape

from flowscope.cli.output import LOOKUP_STORE_HELP, console, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="why a run is slow: where the makespan went, ranked findings, what changed",
                       description="Attribute a run's makespan (client-side graph construction and submission, "
                                   "scheduler overhead, queueing, transfers, compute, I/O, GC and event-loop "
                                   "stalls, spilling, idle resources), then list findings ranked by the time they "
                                   "could recover, each with its evidence and a concrete change. With two or more "
                                   "runs: what changed between the earlier runs and the last one, and how much of "
                                   "the difference each change explains. See docs/advisor.md.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run directory, run id in the store, or 'latest'; with several, the last is explained "
                        "against the others")
    p.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    p.add_argument("--top", type=int, default=10, help="findings to show (10)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_explain)


def _s(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3f}" if abs(x) >= 0.001 or x == 0 else f"{x:.2e}"


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f} %"


def cmd_explain(args: argparse.Namespace) -> int:
    from flowscope.analysis.advisor import explain, explain_runs
    from flowscope.store.catalog import resolve_run
    from flowscope.store.layout import RUN_JSON, read_json
    from flowscope.store.run import open_run
    from flowscope.store.run_set import open_store

    if args.top < 0:
        raise ValueError(f"--top must be 0 or more, got {args.top}")
    paths = [resolve_run(r, args.store) for r in args.runs]
    if len(paths) == 1:
        e = explain(open_run(paths[0]))
    else:
        ids = [read_json(Path(p) / RUN_JSON)["run_id"] for p in paths]
        if len(set(ids)) < len(ids):
            raise ValueError("a run is named twice")
        stores = list(dict.fromkeys(Path(p).parent for p in paths))
        runs = open_store(*stores, runs=ids)
        e = explain_runs(runs, before=ids[:-1], after=ids[-1:])
    e.findings = e.findings[:args.top]
    if args.json:
        print_json(e.to_dict())
        return 0
    console.print(f"[bold]run {escape(e.run_id)}[/bold] ({escape(e.name or 'unnamed')}): {_s(e.wall_s)} s wall, "
                  f"{e.tasks:,} tasks "
                  f"on {e.slots} slots, task phase {_s(e.task_phase_s)} s", highlight=False)
    print_table("where the makespan went (the chain that bounded it)", ["part", "seconds", "share", "status", "how"],
                [[r.label, _s(r.seconds), _pct(r.share), r.status, r.note] for r in e.attribution.itertuples()])
    c = e.capacity
    if c.get("idle_share") is not None:
        console.print(f"idle resources: {_s(c['idle_s'])} slot-seconds of {c['slots']} slots over the task phase "
                      f"({_pct(c['idle_share'])} of capacity)", markup=False, highlight=False)
    for n in e.notes:
        console.print(n, markup=False, highlight=False)
    if e.changes is not None:
        cmp = e.compared
        console.print(f"{', '.join(cmp['after'])} against {', '.join(cmp['before'])}: wall {_s(cmp['wall_before_s'])} s "
                      f"-> {_s(cmp['wall_after_s'])} s ({cmp['difference_s']:+.3f} s)", markup=False, highlight=False)
        print_table("what changed, and how much of the difference it explains",
                    ["part", "before (s)", "after (s)", "change (s)", "explains", "task durations"],
                    [[r.what, _s(r.before_s), _s(r.after_s), f"{r.delta_s:+.3f}", _pct(r.share_of_difference),
                      "" if r.direction is None or (isinstance(r.direction, float)) else
                      f"{r.direction} (median {_s(r.median_before_s)} -> {_s(r.median_after_s)} s, "
                      f"adjusted p {r.p_adjusted:.2g})"]
                     for r in e.changes.head(12).itertuples()])
    if not e.findings:
        console.print("findings: none (no rule found a cause worth 1 % of the task phase)")
        return 0
    console.print("[bold]findings, by recoverable time[/bold]", highlight=False)
    for i, f in enumerate(e.findings, 1):
        rec = f"{_s(f.recoverable_s)} s" if f.recoverable_s is not None else "unknown"
        also = f" (explained by {f.explained_by})" if f.explained_by else ""
        console.print(f"{i}. [{f.rule}] {f.title}{also}\n   recoverable: {rec} ({f.method})\n   change: {f.change}",
                      markup=False, highlight=False, soft_wrap=True)
        ev = f.evidence.head(5)
        if len(ev):
            print_table(None, list(ev.columns), [[_cell(v) for v in row] for row in ev.itertuples(index=False)])
    return 0


def _cell(v) -> str:
    if isinstance(v, float):
        return _s(v)
    return "" if v is None else str(v)
