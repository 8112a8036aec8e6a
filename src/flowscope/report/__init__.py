"""The report of a run: one self-contained HTML file that opens offline.

:func:`write_report` writes the run's dashboard pages (the overview and every analysis page, drawn by the
dashboard's own scripts from what the server would send them: :mod:`flowscope.report.run_pages`): the report is a
snapshot of the dashboard's views. :func:`write_single_page` writes the same sections on one scrolling page (the
run, the computation / communication / I/O breakdown, the task stream, CPU and memory per host, I/O per thread,
communication time vs size, task groups, the call profile, the critical path, warnings over time), for printing.

    from flowscope.report import write_report
    path = write_report(run)            # <run dir>/report.html
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from flowscope.store.run import Run, open_run

#: ``progress(step, done, total)``, called before each step of a report's build
Progress = Callable[[str, int, int], None]

__all__ = ["REPORT_FILE", "SINGLE_PAGE_FILE", "build_single_page", "write_report", "write_single_page"]

#: the report's file in the run directory (the dashboard's pages)
REPORT_FILE = "report.html"
#: the one-page report's file in the run directory
SINGLE_PAGE_FILE = "report-single-page.html"


def _as_run(run: Run | str | Path) -> Run:
    return run if isinstance(run, Run) else open_run(run)


def write_report(run: Run | str | Path, path: str | Path | None = None, *,
                 progress: Progress | None = None) -> Path:
    """Write the report of ``run`` (a Run or a run directory), its dashboard pages as one offline file, to
    ``path`` (default ``<run dir>/report.html``; ``FILE#PAGE`` opens a page) and return the path. The file is
    replaced atomically, so a reader never sees half a report."""
    from flowscope.report.run_pages import write_run_pages

    run = _as_run(run)
    out = write_run_pages(run, Path(path) if path is not None else run.path / REPORT_FILE, progress)
    if progress is not None:
        progress("done", 1, 1)
    return out


def build_single_page(run: Run | str | Path, *, progress: Progress | None = None) -> str:
    """The one-page report of ``run`` (a Run or a run directory) as an HTML string. ``progress(step, done,
    total)`` is called before each step."""
    from flowscope.report.context import Context
    from flowscope.report.page import build_html  # (plotly's figures: imported only for the one page)

    return build_html(Context.of(_as_run(run)), progress)


def write_single_page(run: Run | str | Path, path: str | Path | None = None, *,
                      progress: Progress | None = None) -> Path:
    """Write the one-page report of ``run`` to ``path`` (default ``<run dir>/report-single-page.html``) and return
    the path. The file is replaced atomically, so a reader never sees half a report."""
    run = _as_run(run)
    out = Path(path) if path is not None else run.path / SINGLE_PAGE_FILE
    text = build_single_page(run, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    if progress is not None:
        progress("done", 1, 1)
    return out
