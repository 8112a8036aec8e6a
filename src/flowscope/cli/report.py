"""``flowscope report``: write the self-contained HTML report of a run."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from flowscope.cli.output import LOOKUP_STORE_HELP, progress
from flowscope.cli.semantics import add_semantics_option, open_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write the HTML report of a run",
                       description="Write one self-contained HTML file (it opens offline) with the run's task "
                                   "stream, the computation / communication / I/O breakdown, CPU and memory per "
                                   "host, I/O per thread, communication time vs size, task groups and warnings.")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("-o", "--output", default=None,
                   help="file to write, or a directory to write report.html (dashboard.html with --dashboard) in "
                        "(default: in the run directory)")
    p.add_argument("--dashboard", action="store_true",
                   help="write the dashboard's pages instead (the overview and every analysis page, as `flowscope "
                        "ui` shows them now), drawn offline by the dashboard's own scripts; open FILE#PAGE for a page")
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


#: the file ``--dashboard`` writes in the run directory (or in the directory ``-o`` names)
DASHBOARD_FILE = "dashboard.html"


def cmd_report(args: argparse.Namespace) -> int:
    from flowscope.report import REPORT_FILE, write_report
    from flowscope.report.run_pages import write_run_pages

    run = open_for(args)
    name = DASHBOARD_FILE if args.dashboard else REPORT_FILE
    out = Path(args.output) if args.output else None
    if out is not None and out.is_dir():
        out = out / name
    bar = _LateProgress()
    try:
        if args.dashboard:
            path = write_run_pages(run, out if out is not None else run.path / name, progress=bar)
        else:
            path = write_report(run, out, progress=bar)
    finally:
        bar.close()
    print(path)
    return 0
