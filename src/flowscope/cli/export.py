"""``flowscope export``: write a run in another tool's format (Perfetto / Chrome trace JSON, Paje)."""

from __future__ import annotations

import argparse

from flowscope.cli.output import LOOKUP_STORE_HELP, console, print_json


def register(sub: argparse._SubParsersAction) -> None:
    from flowscope.exporters import FORMATS

    p = sub.add_parser("export", help="write a run as Perfetto (Chrome trace-event JSON) or Paje",
                       description="Write a run in another tool's format: 'perfetto' is Chrome trace-event JSON "
                                   "that ui.perfetto.dev and chrome://tracing open; 'paje' is a Paje trace that "
                                   "pj_dump and ViTE read.")
    p.add_argument("run", help="run id, run directory or 'latest'")
    p.add_argument("--format", required=True, choices=sorted(FORMATS))
    p.add_argument("-o", "--output", help="output file (default: in the run directory, <run_id>.<ext>)")
    p.add_argument("--store", help=LOOKUP_STORE_HELP)
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flowscope.exporters import export_run
    from flowscope.store.catalog import resolve_run

    path, counts = export_run(resolve_run(args.run, args.store), args.format, args.output)
    if args.json:
        print_json({"path": str(path), "format": args.format, "written": counts})
    else:
        console.print(f"wrote {path} ({args.format}): " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    return 0
