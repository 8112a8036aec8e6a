"""``flowscope lineage``: everything a run recorded about one task."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.markup import escape

from flowscope.cli.output import (
    LOOKUP_STORE_HELP,
    console,
    fmt_ns,
    print_json,
    print_table,
)
from flowscope.cli.semantics import add_semantics_option, open_for

if TYPE_CHECKING:
    import pandas as pd


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lineage", help="everything about one task: transitions, dependencies, data, I/O, verdicts",
                       description="Everything a run recorded about one task (a unit of work of any source: a "
                                   "Dask task, a StarPU task, a WfCommons task): its executions, every transition "
                                   "with where and when it happened, the tasks it depends on and those that "
                                   "depend on it, the transfers that moved its data, its I/O records, the logs "
                                   "about it and the warnings on its resources while it ran, the anomaly "
                                   "detector's verdict, and whether it is on the critical path.")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("key", help="the task's key (spans.task_key, transitions.task_key)")
    p.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    p.add_argument("--json", action="store_true", help="print JSON")
    add_semantics_option(p)
    p.set_defaults(func=cmd_lineage)


def _rows(df: pd.DataFrame, cols: list[str], t0: int | None) -> list[list]:
    import pandas as pd  # here: every command builds this module's parser, few show a lineage

    out = []
    for row in df[cols].astype(object).itertuples(index=False):
        vals = []
        for c, v in zip(cols, row):
            if v is None or (not isinstance(v, (list, str)) and pd.isna(v)):
                vals.append("")
            elif c.endswith("_ns") and c != "duration_ns" and t0 is not None:
                vals.append(f"+{fmt_ns(int(v) - t0)}")
            elif c == "duration_ns":
                vals.append(fmt_ns(int(v)))
            else:
                vals.append(v)
        out.append(vals)
    return out


def cmd_lineage(args: argparse.Namespace) -> int:
    from flowscope.analysis.lineage import lineage

    run = open_for(args)
    lin = lineage(run, args.key)
    if args.json:
        print_json(lin.to_dict())
        return 0
    t0 = run.meta.get("start_ns")
    console.print(f"[bold]{escape(lin.key)}[/bold] (group {escape(lin.group or '-')}) in run {escape(lin.run_id)}; "
                  f"times from the run's "
                  f"start", markup=True, highlight=False)
    if len(lin.executions):
        print_table("executions", ["resource", "host", "category", "start", "duration"],
                    _rows(lin.executions, ["resource_id", "host", "category", "start_ns", "duration_ns"], t0))
    if len(lin.transitions):
        print_table("transitions", ["time", "from", "to", "where", "worker"],
                    _rows(lin.transitions, ["ts_ns", "from_state", "to_state", "observer", "worker"], t0))
    for title, df in (("depends on", lin.dependencies), ("needed by", lin.dependants)):
        if len(df):
            print_table(title, ["key", "group", "ran on", "host", "ended"],
                        _rows(df, ["key", "group", "resource_id", "host", "end_ns"], t0))
    if len(lin.transfers):
        print_table("data movements", ["from", "to", "bytes", "start", "duration"],
                    _rows(lin.transfers, ["src_resource_id", "dst_resource_id", "nbytes", "start_ns", "duration_ns"],
                          t0))
    if len(lin.io):
        print_table("I/O", ["op", "path", "bytes", "source", "start"],
                    _rows(lin.io, ["op", "path", "nbytes", "source", "start_ns"], t0))
    if len(lin.logs):
        print_table("logs and warnings", ["time", "level", "category", "message"],
                    _rows(lin.logs, ["ts_ns", "level", "category", "message"], t0))
    a = lin.anomaly
    if a is None:
        console.print("anomaly: not judged (no execution)")
    else:
        scores = ", ".join(f"{e['score']:.3g}" for e in a["executions"])
        console.print(f"anomaly ({a['algo']}): {'FLAGGED' if a['flagged'] else 'normal'} (score {scores})",
                      markup=False, highlight=False)
    cp = lin.critical_path
    if cp.get("error"):
        console.print(f"critical path: not computed ({cp['error']})", markup=False, highlight=False)
    else:
        measured = {True: "on", False: "not on", None: "none (derived times)"}[cp.get("on_measured")]
        console.print(f"critical path: {'on' if cp['on_structural'] else 'not on'} the structural path, "
                      f"measured path: {measured}; slack {fmt_ns(cp['slack_ns'])}", markup=False, highlight=False)
    return 0
