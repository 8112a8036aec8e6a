"""``flowscope report``: write the self-contained HTML report of a run (its dashboard pages, one at a time or all
one after another)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from flowscope.cli.output import LOOKUP_STORE_HELP, progress
from flowscope.cli.semantics import add_semantics_option, open_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write the HTML report of a run",
                       description="Write the run's report: one self-contained HTML file (it opens offline) with the "
                                   "dashboard's pages as `flowscope ui` shows them now: the overview (progress, task "
                                   "stream, hosts, the advisor's findings, the forecast) and the advisor, critical-path, "
                                   "profile, charts, anomalies and logs pages (FILE#PAGE opens one). --single-page "
                                   "writes the print layout of the same file: every page one after another in one "
                                   "scrolling document, each drawn as FILE#PAGE draws it.")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("-o", "--output", default=None,
                   help="file to write, or a directory to write report.html (report-single-page.html with "
                        "--single-page) in (default: in the run directory)")
    p.add_argument("--single-page", action="store_true",
                   help="write the print layout: the same pages one after another in one scrolling document "
                        "(for printing or reading at once)")
    p.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    add_semantics_option(p)
    p.set_defaults(func=cmd_report)


class _LateProgress:
    """A progress bar that appears only once the work has taken more than ``after`` seconds."""

    def __init__(self, after: float = 1.0):
        self.t0 = time.monotonic()
        self.after = after
        self.bar = None
        self.task = None

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.bar is None:
            if time.monotonic() - self.t0 < self.after:
                return
            self.bar = progress()
            self.bar.start()
            self.task = self.bar.add_task(what, total=total)
        self.bar.update(self.task, description=what, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def cmd_report(args: argparse.Namespace) -> int:
    from flowscope.report import REPORT_FILE, SINGLE_PAGE_FILE, write_report, write_single_page

    run = open_for(args)
    name = SINGLE_PAGE_FILE if args.single_page else REPORT_FILE
    out = Path(args.output) if args.output else None
    if out is not None and out.is_dir():
        out = out / name
    write = write_single_page if args.single_page else write_report
    bar = _LateProgress()
    try:
        path = write(run, out, progress=bar)
    finally:
        bar.close()
    print(path)
    return 0
