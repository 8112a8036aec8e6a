"""``flowscope ingest-spool``: deliver batches a client kept on disk while its collector was away."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from flowscope.cli.output import console, print_json, progress
from flowscope.store.catalog import DEFAULT_STORE, STORE_ENV


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest-spool", help="deliver spooled batches to a collector or a store",
                       description="Replay the batches a client spooled (a spool root, or one run's spool "
                                   "directory) to a collector, or straight into a store. Delivered files are "
                                   "deleted; replaying twice never duplicates a record.")
    p.add_argument("spool", help="spool directory (a client's spool root, or one run's folder in it)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--address", help="collector address, http://HOST:PORT")
    target.add_argument("--store", help="write into this store directly, no collector running (default "
                        f"${STORE_ENV}, else ./{DEFAULT_STORE}, when --address is not given either)")
    p.add_argument("--token", default=None,
                   help="the collector's token (default $FLOWSCOPE_TOKEN; needed when it is bound beyond loopback)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flowscope.client.spool import SUFFIX, replay
    from flowscope.client.transport import HttpTransport

    root = Path(args.spool)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such spool directory")
    collector = None
    if args.address:
        transport = HttpTransport(args.address, token=args.token)
    else:
        from flowscope.embedded import EmbeddedTransport
        from flowscope.service.collector import Collector
        from flowscope.store.catalog import default_store

        collector = Collector(args.store or default_store())
        transport = EmbeddedTransport(collector)
    total = sum(1 for _ in root.rglob(f"*{SUFFIX}"))
    try:
        with progress() as bar:
            task = bar.add_task("replaying", total=total)
            report = replay(root, transport, progress=lambda done, _t: bar.update(task, completed=done))
    finally:
        transport.close()
        if collector:
            collector.shutdown()
    out = {"runs": report.runs, "batches": report.batches, "rows": report.rows, "duplicates": report.duplicates,
           "closed_runs": report.closed, "failed": report.failed}
    if args.json:
        print_json(out)
    else:
        console.print(f"delivered {report.batches} batch(es), {report.rows} row(s) for {report.runs} run(s) to "
                      f"{transport.address}; {report.duplicates} already there; {report.closed} run(s) closed")
        for path, why in report.failed:
            console.print(f"[red]refused[/red] {escape(f'{path}: {why}')}", highlight=False, soft_wrap=True)
    return 1 if report.failed else 0
