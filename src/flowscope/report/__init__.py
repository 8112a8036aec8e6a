"""The report of a run: one self-contained HTML file that opens offline.

:func:`write_report` writes the run's dashboard pages (the overview and every analysis page, drawn by the
dashboard's own scripts from what the server would send them: :mod:`flowscope.report.run_pages`): the report is a
snapshot of the dashboard's views. :func:`write_single_page` writes the print layout of the same file: every page
one after another in one scrolling document, each drawn as ``FILE#PAGE`` draws it.

    from flowscope.report import write_report
    path = write_report(run)            # <run dir>/report.html
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flowscope.store.run import Run, open_run

#: ``progress(step, done, total)``, called before each step of a report's build
Progress = Callable[[str, int, int], None]

__all__ = ["REPORT_FILE", "SINGLE_PAGE_FILE", "build_single_page", "write_report", "write_single_page"]

#: the report's file in the run directory (the dashboard's pages)
REPORT_FILE = "report.html"
#: the print layout's file in the run directory (the same pages, one after another)
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
    """The print layout of ``run``'s pages (a Run or a run directory) as an HTML string: the pages file showing
    every page one after another. ``progress(step, done, total)`` is called before each step."""
    from flowscope.report.run_pages import run_pages_doc, run_pages_html

    return run_pages_html(run_pages_doc(_as_run(run), progress), layout="all")


def write_single_page(run: Run | str | Path, path: str | Path | None = None, *,
                      progress: Progress | None = None) -> Path:
    """Write the print layout of ``run``'s pages (every page one after another, each drawn by the dashboard's
    scripts) to ``path`` (default ``<run dir>/report-single-page.html``) and return the path. The file is replaced
    atomically, so a reader never sees half a report."""
    from flowscope.report.run_pages import write_run_pages

    run = _as_run(run)
    out = write_run_pages(run, Path(path) if path is not None else run.path / SINGLE_PAGE_FILE, progress,
                          layout="all")
    if progress is not None:
        progress("done", 1, 1)
    return out
