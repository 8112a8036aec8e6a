"""``flowscope runs``, ``flowscope show`` and ``flowscope sql``: what is in a store and in a run."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys

from rich.markup import escape

from flowscope.cli.output import LOOKUP_STORE_HELP, STORE_HELP, console, fmt_ns, print_json, print_table
from flowscope.store.catalog import default_store, interruption, list_runs, run_state
from flowscope.cli.semantics import add_semantics_option, open_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list the runs in a store", description="List the runs in a store directory.")
    p.add_argument("store", nargs="?", default=None, help=STORE_HELP)
    p.add_argument("--store", dest="store_opt", default=None, help=STORE_HELP + "; the same as STORE")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("show", help="summarise one run", description="Summarise one run: rows per table, "
                       "time range, resources, and the span names with most total time; for a run that "
                       "recorded no work, why, and what to do.")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    p.add_argument("--top", type=int, default=10, help="how many span names to list (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_semantics_option(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("sql", help="query a run with SQL (DuckDB)",
                       description="Run a SQL query over a run; each table (spans, transitions, dependencies, "
                                   "transfers, io, metrics, namespace_values, logs, resources, data_states, "
                                   "mutations) is a view, "
                                   "and so are activity (spans with their category, role and group), "
                                   "executors (resources with executes and slots) and call_tree, the call-path "
                                   "profile (flowscope profile). With --all, every run of a store (or of "
                                   "several) together: each view has a run_id column, and a runs table holds "
                                   "each run's provenance (docs/compare.md).")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'; with --all, a store directory "
                               f"(several joined with {os.pathsep!r})")
    p.add_argument("query", help='e.g. "SELECT name, count(*) FROM spans GROUP BY name"')
    p.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    p.add_argument("--all", action="store_true", dest="all_runs",
                   help="query every run of the store(s) RUN names, with a run_id column and a runs table")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON records")
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    p.add_argument("--max-rows", type=int, default=100, help="rows to print as a table (default 100; JSON/CSV print all)")
    add_semantics_option(p)
    p.set_defaults(func=cmd_sql)


def _when(ns: int | None) -> str:
    if not ns:
        return "-"
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def cmd_runs(args: argparse.Namespace) -> int:
    store = args.store or args.store_opt or default_store()
    runs = list_runs(store)
    for m in runs:  # what run.json cannot say itself: an import whose process is gone
        if "error" not in m:
            m["status"] = run_state(m)
            if note := interruption(m):
                m["interruption"] = note
    if args.json:
        print_json(runs)
        return 0
    if not runs:
        console.print(f"no runs in {store}")
        return 0
    rows = []
    for m in runs:
        dur = (m["end_ns"] - m["start_ns"]) if m.get("end_ns") and m.get("start_ns") else None
        status = f"bad run.json: {m['error']}" if m.get("error") else m.get("status")
        rows.append([m.get("run_id"), m.get("name"), status, _when(m.get("start_ns")),
                     fmt_ns(dur), m.get("command") or ""])
    print_table(f"runs in {store}", ["run", "name", "status", "started (UTC)", "duration", "command"], rows)
    for m in runs:
        if m.get("interruption"):
            console.print(f"{m.get('run_id')}: {m['interruption']}", markup=False, highlight=False, soft_wrap=True)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from flowscope.analysis.nothing_observed import why_nothing_observed
    from flowscope.analysis.summary import summarize

    run = open_for(args)
    s = summarize(run, top=args.top)
    reasons = why_nothing_observed(run)
    if args.json:
        print_json({**s.to_dict(), "nothing_observed": [asdict(r) for r in reasons]})
        return 0
    console.print(f"[bold]{escape(s.run_id)}[/bold] {escape(s.name or '')} — {s.status}, {fmt_ns(s.duration_ns)} "
                  f"({_when(s.start_ns)} UTC) at {escape(str(run.path))}")
    if note := interruption(run.meta):
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    if reasons:
        console.print("[bold yellow]no work recorded[/bold yellow]: " + " ".join(r.why for r in reasons))
        for r in reasons:
            console.print(f"  what to do: {r.what_to_do}")
    if any(s.rows.values()):
        print_table("rows", ["table", "rows"], [[k, v] for k, v in s.rows.items() if v])
    else:
        console.print("no rows")
    if s.resources_by_kind:
        console.print("resources: " + ", ".join(f"{n} {k}" for k, n in s.resources_by_kind.items()))
    if s.top_spans:
        print_table("where span time goes", ["name", "kind", "count", "total", "mean", "max"],
                    [[r["name"], r["kind"], r["count"], fmt_ns(r["total_ns"]), fmt_ns(r["mean_ns"]),
                      fmt_ns(r["max_ns"])] for r in s.top_spans])
    if s.logs_by_level:
        console.print("logs: " + ", ".join(f"{n} {k}" for k, n in s.logs_by_level.items()))
    b = s.breakdown
    if b is not None and b.categories:
        console.print("breakdown (slot-time of the executing resources): "
                      + ", ".join(f"{c} {fmt_ns(v * 1e9)}" for c, v in b.categories.items()))
    _print_paths_and_utilisation(s)
    for f in s.findings:
        console.print(f"finding: {f['message']}", markup=False, highlight=False, soft_wrap=True)
    return 0


def _print_paths_and_utilisation(s) -> None:
    cp, u = s.critical_path, s.utilisation
    if cp and cp.get("error"):
        console.print(f"critical path: not computed ({cp['error']})")
    elif cp and "structural_ns" in cp and cp["measured_ns"] is None:
        console.print(f"critical path: {fmt_ns(cp['structural_ns'])} through {len(cp['structural_ids'])} tasks "
                      f"(structural: the task times are derived, not measured)")
    elif cp and "structural_ns" in cp and cp.get("units") == "I/O operations":
        comp = cp.get("measured_components") or {}
        console.print(f"critical path: {fmt_ns(cp['measured_ns'])} measured on {cp.get('measured_end_location')} "
                      f"(the resource whose I/O ended last): {cp['measured_tasks']} I/O operations, "
                      f"{fmt_ns(comp.get('io', 0))} in I/O, {fmt_ns(comp.get('idle', 0))} between them",
                      markup=False, highlight=False, soft_wrap=True)
    elif cp and "structural_ns" in cp:
        console.print(f"critical path: {fmt_ns(cp['measured_ns'])} measured through {cp['measured_tasks']} tasks, "
                      f"{fmt_ns(cp['structural_ns'])} structural (unlimited workers)")
    elif cp and cp.get("data_states"):
        ds = cp["data_states"]
        console.print(f"critical path: not computed ({ds['error']})" if ds.get("error") else
                      f"critical path: {fmt_ns(ds['length_ns'])} through {ds['states']} data states")
    elif cp and cp.get("reason"):
        console.print(cp["reason"], markup=False, highlight=False, soft_wrap=True)
    mp = (cp or {}).get("messages")
    if mp and mp.get("error"):
        console.print(f"critical path through messages: not computed ({mp['error']})")
    elif mp:
        w = mp["wait_ns"]
        console.print(f"critical path through messages: {fmt_ns(mp['length_ns'])} through "
                      f"{len(mp['resources']) - 1} of the {mp['messages']} messages between "
                      f"{len(set(mp['resources']))} resources; {mp['wait_states']} wait states: late sender "
                      f"{fmt_ns(w['late-sender'])}, late receiver {fmt_ns(w['late-receiver'])}")
    if u is not None:
        console.print(f"utilisation: {100 * u.value:.1f} % of {u.slots} slots over {fmt_ns(u.makespan_ns)}"
                      if u.value is not None else f"utilisation: unknown ({u.reason})")


def cmd_sql(args: argparse.Namespace) -> int:
    if args.all_runs:
        from flowscope.store.run_set import open_store

        run = open_store(*[s for s in args.run.split(os.pathsep) if s])
    else:
        run = open_for(args)
    try:
        if args.all_runs:
            df = run.sql(args.query)
        elif re.search(r"\bcall_tree\b", args.query, re.IGNORECASE):  # a derived view, computed when asked for
            from flowscope.analysis.call_tree import query

            df = query(run, args.query)
        else:
            df = run.sql(args.query)
    except Exception as exc:  # DuckDB's own message says what is wrong with the query
        raise ValueError(f"query failed: {exc}") from None
    if args.json:
        print_json(json.loads(df.to_json(orient="records", double_precision=15)))  # NaN/NA become null
    elif args.csv:
        df.to_csv(sys.stdout, index=False)
    else:
        shown = df.head(args.max_rows)
        import pandas as pd  # only here: every command imports this module at start

        print_table(None, list(df.columns), [[None if pd.isna(v) else v for v in row]
                                             for row in shown.astype(object).itertuples(index=False)])
        if len(df) > len(shown):
            console.print(f"({len(df)} rows, {len(shown)} shown; use --max-rows, --json or --csv for all)")
    return 0
