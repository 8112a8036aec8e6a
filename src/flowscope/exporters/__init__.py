"""Writers of other tools' formats from a run's canonical tables (presenters: they only read the run).

A format module (``flowscope.exporters.<name>``) defines ``NAME``, ``SUFFIX`` (the default file
extension) and ``write(run: Run, out: Path) -> dict`` returning what it wrote (counts per kind of
record). :func:`export_run` picks the module.
"""

from __future__ import annotations

import importlib
from pathlib import Path

FORMATS: dict[str, str] = {
    "perfetto": "flowscope.exporters.perfetto",
    "paje": "flowscope.exporters.paje",
}


def format_module(name: str):
    """The module that writes format ``name``."""
    if name not in FORMATS:
        raise ValueError(f"unknown export format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return importlib.import_module(FORMATS[name])


def export_run(run_dir: str | Path, fmt: str, out: str | Path | None = None) -> tuple[Path, dict]:
    """Write the run at ``run_dir`` in format ``fmt`` to ``out`` (default: next to the run,
    ``<run_id><SUFFIX>``); returns the path written and the module's counts."""
    from flowscope.store.run import open_run

    mod = format_module(fmt)
    run = open_run(run_dir)
    try:
        path = Path(out) if out is not None else Path(run_dir) / f"{run.run_id}{mod.SUFFIX}"
        tmp = path.with_name(f".{path.name}.tmp")
        counts = mod.write(run, tmp)
        tmp.replace(path)
    finally:
        run.close()
    return path, counts
