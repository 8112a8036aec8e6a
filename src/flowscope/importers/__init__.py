"""Readers of other tools' traces: each module reads one format and emits canonical batches.

A format module (``flowscope.importers.<name>``) defines

* ``NAME`` -- the format's name (``--format`` on the command line);
* ``sniff(path: Path, head: bytes) -> bool`` -- whether the file is in this format, judged from its
  content (``head``: up to :data:`HEAD_BYTES` of it, gunzipped when the file is gzip), the name only
  as a tie-breaker; cheap, never raises;
* ``read(path: Path, sink: ImportSink) -> None`` -- read the file and hand canonical rows to the
  sink (see :mod:`flowscope.importers.sink`). Bad input raises :class:`TraceError` saying where
  (file and line, byte offset or record); what the importer can repair it reports through
  ``sink.warn``.

Nothing downstream knows the format: it only sees the run's tables. :func:`import_paths` detects,
creates (or adds to) a run and records each import in run.json under ``imports``.
"""

from __future__ import annotations

import gzip
import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowscope.importers.sink import ImportSink

#: format name -> module, in the order detection tries them (most specific first)
FORMATS: dict[str, str] = {
    "otf2": "flowscope.importers.otf2",
    "darshan": "flowscope.importers.darshan",
    "wfcommons": "flowscope.importers.wfcommons",
    "chrome": "flowscope.importers.chrome",
    "paje": "flowscope.importers.paje",
}
HEAD_BYTES = 64 * 1024


class TraceError(ValueError):
    """A trace file cannot be read; the message says which file and where in it."""


class UnknownFormat(TraceError):
    """No importer recognises a file."""


def format_module(name: str):
    """The module that reads format ``name``."""
    if name not in FORMATS:
        raise UnknownFormat(f"unknown format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return importlib.import_module(FORMATS[name])


def available_formats() -> list[str]:
    """Formats whose module exists in this installation."""
    out = []
    for name, mod in FORMATS.items():
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        out.append(name)
    return out


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """Up to ``n`` bytes of the file's content (decompressed if it is gzip)."""
    with open(path, "rb") as f:
        raw = f.read(n)
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as g:
                return g.read(n)
        except (OSError, EOFError):
            return raw
    return raw


def detect_format(path: str | Path) -> str | None:
    """The name of the format of ``path`` (judged from its content), or None if no importer claims it."""
    path = Path(path)
    if path.is_dir():
        return None
    head = read_head(path)
    for name in available_formats():
        if format_module(name).sniff(path, head):
            return name
    return None


@dataclass
class FileImport:
    """What importing one file did."""

    path: str
    format: str
    rows: dict[str, int]
    warnings: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class ImportResult:
    """What :func:`import_paths` did: the run it wrote and, per file, the rows it created."""

    run_dir: Path
    run_id: str
    created: bool
    files: list[FileImport]
    skipped: list[str]
    failed: list[tuple[str, str]] = field(default_factory=list)  # (file, why) with keep_going

    @property
    def rows(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for f in self.files:
            for t, n in f.rows.items():
                total[t] = total.get(t, 0) + n
        return total


def expand(paths: Iterable[str | Path], fmt: str | None = None) -> tuple[list[tuple[Path, str]], list[str]]:
    """The files to import with their formats, and the files of given folders that no importer claims.

    A file given by name must be recognised (else :class:`UnknownFormat`); a folder is walked and
    its unrecognised files (READMEs, licences, an OTF2 archive's event files) are skipped."""
    todo: list[tuple[Path, str]] = []
    skipped: list[str] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for name in sorted(files):
                    f = Path(root) / name
                    found = fmt if fmt and format_module(fmt).sniff(f, read_head(f)) else \
                        (None if fmt else detect_format(f))
                    if found:
                        todo.append((f, found))
                    else:
                        skipped.append(str(f))
            continue
        found = fmt or detect_format(p)
        if found is None:
            raise UnknownFormat(f"{p}: not a format flowscope reads (tried {', '.join(available_formats())}); "
                                f"give --format to force one")
        todo.append((p, found))
    return todo, skipped


def _commit_staged(staging: Path, run_dir: Path) -> None:
    """Move a file's staged segments into the run, table by table (each rename is atomic)."""
    for table_dir in sorted(p for p in staging.iterdir() if p.is_dir()):
        dest = run_dir / table_dir.name
        dest.mkdir(exist_ok=True)
        for seg in sorted(table_dir.iterdir()):
            target = dest / seg.name
            if target.exists():  # the same file imported into this run before: nothing new
                seg.unlink()
            else:
                os.replace(seg, target)


def import_paths(paths: Iterable[str | Path], store: str | Path | None = None, *, run: str | Path | None = None,
                 name: str | None = None, fmt: str | None = None,
                 progress: Callable[[str, int, int], None] | None = None, keep_going: bool = False) -> ImportResult:
    """Import trace files (and folders of them) into a new run of ``store``, or into the existing ``run``.

    ``progress(path, done_bytes, total_bytes)`` is called as each file is read. Each file's rows,
    warnings and facts go to run.json's ``imports`` list. A file lands whole or not at all: its
    segments are staged in a hidden folder of the run and moved in once it has been read
    completely. A failed file raises; the files imported before it stay, and a new run that
    received nothing is removed. With ``keep_going``, a file that cannot be read (TraceError) is
    listed in ``failed`` with the reason and the others are imported; the call raises only if no
    file could be."""
    import shutil

    from flowscope.model.provenance import collect_provenance, new_run_id
    from flowscope.service.collector import Collector
    from flowscope.store.catalog import default_store, resolve_run
    from flowscope.store.layout import RUN_JSON, read_json, write_segment

    todo, skipped = expand(paths, fmt)
    if not todo:
        raise UnknownFormat("no importable file among " + ", ".join(map(str, paths)))
    if run is not None:
        run_dir = resolve_run(run, store)
        run_id = read_json(run_dir / RUN_JSON)["run_id"]
        collector = Collector(run_dir.parent)
        created = False
    else:
        collector = Collector(store if store is not None else default_store())
        run_id = new_run_id()
        collector.open_run({"run_id": run_id, "name": name or todo[0][0].stem, "command": None,
                            "provenance": {"source": "import", "imported_by": collect_provenance()},
                            "imports": []})
        run_dir = collector.run_dir(run_id)
        created = True
    files: list[FileImport] = []
    failed: list[tuple[str, str]] = []
    try:
        for path, f in todo:
            total = path.stat().st_size
            cb = (lambda done, _p=path, _t=total: progress(str(_p), done, _t)) if progress else None
            staging = run_dir / f".import-{os.getpid()}-{len(files)}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            sink = ImportSink(run_id, path, f, lambda _r, t, seg, d, _s=staging: write_segment(_s, t, seg, d),
                              cb, run_dir)
            try:
                try:
                    format_module(f).read(path, sink)
                    sink.flush()
                except (TraceError, OSError, MemoryError):
                    raise
                except ValueError as exc:  # a SchemaError or a parse error the importer did not place
                    raise TraceError(f"{path}: {exc}") from exc
                _commit_staged(staging, run_dir)
            except TraceError as exc:
                if not keep_going:
                    raise
                failed.append((str(path), str(exc)))
                continue
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            if cb:
                cb(total)
            done = FileImport(str(path), f, dict(sink.counts), list(sink.warnings), dict(sink.meta))
            files.append(done)
            meta = read_json(run_dir / RUN_JSON)
            imports = list(meta.get("imports") or [])
            imports.append({"path": str(path.resolve()), "format": f, "rows": done.rows,
                            "warnings": done.warnings, "meta": done.meta})
            fields: dict[str, Any] = {"imports": imports}
            if created:
                for k, v in sink.run_fields.items():
                    if k in ("start_ns", "end_ns") and meta.get(k) is not None and len(files) > 1 and v is not None:
                        v = min(meta[k], v) if k == "start_ns" else max(meta[k], v)
                    fields[k] = v
            collector.update_run(run_id, fields)
        if not files and failed:
            raise TraceError(f"no file could be imported; the first: {failed[0][1]}")
    except BaseException:
        if created and not files:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif created:
            collector.close_run(run_id, end_ns=read_json(run_dir / RUN_JSON).get("end_ns") or None,
                                status="imported-partly")
        raise
    finally:
        collector.shutdown()
    if created:
        collector.close_run(run_id, end_ns=read_json(run_dir / RUN_JSON).get("end_ns") or None,
                            status="imported-partly" if failed else "imported",
                            extra={"import_failures": [{"path": p, "error": e} for p, e in failed]} if failed else None)
    return ImportResult(run_dir, run_id, created, files, skipped, failed)
