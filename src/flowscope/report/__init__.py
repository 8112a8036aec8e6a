"""The HTML report of a run: one self-contained file (plotly.js embedded once, no external resource) that
opens offline. Sections: the run, the computation / communication / I/O breakdown, the task stream, CPU and
memory per host, I/O per thread, communication time vs size, task groups, the call profile (a flame graph of
the call tree), the critical path, warnings over time.

    from flowscope.report import write_report
    path = write_report(run)            # <run dir>/report.html
"""

from __future__ import annotations

import os
from pathlib import Path

from flowscope.report.page import Progress, build_html
from flowscope.store.run import Run, open_run

__all__ = ["REPORT_FILE", "build_report", "write_report"]

REPORT_FILE = "report.html"


def _as_run(run: Run | str | Path) -> Run:
    return run if isinstance(run, Run) else open_run(run)


def build_report(run: Run | str | Path, *, progress: Progress | None = None) -> str:
    """The report of ``run`` (a Run or a run directory) as an HTML string. ``progress(step, done, total)``
    is called before each step."""
    from flowscope.report.context import Context

    return build_html(Context.of(_as_run(run)), progress)


def write_report(run: Run | str | Path, path: str | Path | None = None, *,
                 progress: Progress | None = None) -> Path:
    """Write the report of ``run`` to ``path`` (default ``<run dir>/report.html``) and return the path.
    The file is replaced atomically, so a reader never sees half a report."""
    run = _as_run(run)
    out = Path(path) if path is not None else run.path / REPORT_FILE
    text = build_report(run, progress=progress)
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
