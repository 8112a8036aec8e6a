"""``flowscope rm``: delete runs from a store (an interrupted import, a run no longer wanted)."""

from __future__ import annotations

import argparse

from flowscope.cli.output import LOOKUP_STORE_HELP, console, err_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rm", help="delete runs from a store",
                       description="Delete run directories, e.g. an import that was interrupted. Refuses a run "
                                   "that an import is still writing, and a run whose status is still 'running' "
                                   "(a collector may be writing it) unless --force.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directory, run id in the store, or 'latest'")
    p.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    p.add_argument("--force", action="store_true",
                   help="also delete a run that is still 'running' or being imported (its writer is gone)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flowscope.store.catalog import RunBusy, remove_run, resolve_run
    from flowscope.store.layout import RUN_JSON, read_json

    refused = 0
    for name in args.runs:
        run_dir = resolve_run(name, args.store)
        run_id = read_json(run_dir / RUN_JSON).get("run_id", run_dir.name)
        try:
            remove_run(run_dir, force=args.force)
        except RunBusy as exc:
            err_console.print(f"flowscope rm: error: {exc}", markup=False, highlight=False, soft_wrap=True)
            refused += 1
            continue
        console.print(f"removed run {run_id} ({run_dir})", markup=False, highlight=False, soft_wrap=True)
    return 1 if refused else 0
