"""``flowscope semantics``: show, set or clear how a run's spans and resources map onto the semantic vocabulary
(model/semantics.py); and the ``--semantics`` option the analysis commands share."""

from __future__ import annotations

import argparse
import json

from flowscope.cli.output import LOOKUP_STORE_HELP, console, print_json, print_table
from flowscope.store.catalog import resolve_run
from flowscope.store.run import Run, open_run

SEMANTICS_HELP = ("a semantic mapping that overrides the run's own, for this command only: a JSON file, or "
                  "JSON text (see docs/data-model.md, 'Semantic vocabulary')")


def add_semantics_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--semantics", metavar="FILE_OR_JSON", default=None, help=SEMANTICS_HELP)


def open_for(args: argparse.Namespace) -> Run:
    """The run ``args.run`` names, with the ``--semantics`` override when one was given."""
    return open_run(resolve_run(args.run, args.store), semantics=getattr(args, "semantics", None))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("semantics", help="show or override what a run's spans and resources mean",
                       description="Show how the run's spans map onto the semantic vocabulary (category, role, "
                                   "group) and which resources execute work; --set stores an override with the "
                                   "run (tried before the mappings its sources declared), --clear removes it.")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    act = p.add_mutually_exclusive_group()
    act.add_argument("--set", metavar="FILE_OR_JSON", default=None,
                     help="store this mapping (a JSON file, or JSON text) as the run's override")
    act.add_argument("--clear", action="store_true", help="remove the run's override")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_semantics)


def cmd_semantics(args: argparse.Namespace) -> int:
    from flowscope.model.semantics import load_mappings
    from flowscope.service.collector import Collector

    run_dir = resolve_run(args.run, args.store)
    run = open_run(run_dir)
    if args.set is not None or args.clear:
        collector = Collector(run_dir.parent)
        try:
            if args.clear:
                collector.update_run(run.run_id, {}, drop=("semantics_override",))
            else:
                collector.update_run(run.run_id, {"semantics_override": load_mappings(args.set)})
        finally:
            collector.shutdown()
        run = open_run(run_dir)
    mapping = run.sql("""SELECT kind, category, role, count(*) AS spans, count(DISTINCT "group") AS groups,
                                sum(end_ns - start_ns) / 1e9 AS seconds
                         FROM activity GROUP BY ALL ORDER BY seconds DESC""")
    execs = run.sql("""SELECT kind, executes, slots, count(*) AS resources FROM executors GROUP BY ALL
                       ORDER BY executes DESC, resources DESC""")
    meta = run.meta
    if args.json:
        print_json({"override": meta.get("semantics_override") or [], "declared": meta.get("semantics") or [],
                    "spans": json.loads(mapping.to_json(orient="records")),
                    "resources": json.loads(execs.to_json(orient="records"))})
        return 0
    declared = [m.get("source", "?") for m in meta.get("semantics") or []]
    console.print(f"declared by: {', '.join(declared) or 'no source (generic defaults only)'}; override: "
                  f"{'yes' if meta.get('semantics_override') else 'none'}")
    for title, df in (("spans", mapping), ("resources", execs)):
        import pandas as pd  # only here: every command imports this module at start

        print_table(title, list(df.columns), [["-" if pd.isna(v) else v for v in row]
                                              for row in df.astype(object).values.tolist()])
    return 0
