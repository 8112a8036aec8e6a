"""Readers of other tools' traces: each module reads one format and emits canonical batches.

A format module (``flowscope.importers.<name>``) defines

* ``NAME`` -- the format's name (``--format`` on the command line);
* ``sniff(path: Path, head: bytes) -> bool`` -- whether the file is in this format, judged from its
  content (``head``: up to :data:`HEAD_BYTES` of it, gunzipped when the file is gzip), the name only
  as a tie-breaker; cheap, never raises;
* ``SEMANTICS`` -- what its spans and resources mean to the analyses (a mapping of
  :mod:`flowscope.model.semantics`), added to run.json ``semantics`` by each import;
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
    "parsl": "flowscope.importers.parsl",
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
class Duplicate:
    """A file not read because the run already holds a file with the same bytes (``same_as``)."""

    path: str
    format: str
    same_as: str


@dataclass
class ImportResult:
    """What :func:`import_paths` did: the run it wrote and, per file, the rows it created."""

    run_dir: Path
    run_id: str
    created: bool
    files: list[FileImport]
    skipped: list[str]
    failed: list[tuple[str, str]] = field(default_factory=list)  # (file, why) with keep_going
    duplicates: list[Duplicate] = field(default_factory=list)  # same content as a file the run holds

    @property
    def rows(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for f in self.files:
            for t, n in f.rows.items():
                total[t] = total.get(t, 0) + n
        return total


class ImportInterrupted(KeyboardInterrupt):
    """The import was interrupted (Ctrl-C); the run says so and can be resumed or removed."""


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


def content_files(path: Path, fmt: str) -> list[Path]:
    """The files whose bytes make up the trace ``path`` in format ``fmt`` (several for an OTF2 archive)."""
    members = getattr(format_module(fmt), "content_files", None)
    return list(members(path)) if members is not None else [path]


def _commit_staged(staging: Path, run_dir: Path) -> None:
    """Move a file's staged segments into the run, table by table (each rename is atomic)."""
    for table_dir in sorted(p for p in staging.iterdir() if p.is_dir()):
        dest = run_dir / table_dir.name
        dest.mkdir(exist_ok=True)
        for seg in sorted(table_dir.iterdir()):
            target = dest / seg.name
            if target.exists():  # committed by an import of this file that was killed while committing
                seg.unlink()
            else:
                os.replace(seg, target)


def _remove_segments(run_dir: Path, token: str) -> None:
    """Delete the segments of ``run_dir`` that one imported file wrote (names ``<token>-<n>.parquet``)."""
    for seg in run_dir.glob(f"*/{token}-*.parquet"):
        seg.unlink(missing_ok=True)


def _check_not_importing(run_dir: Path, meta: dict) -> None:
    from flowscope.store.catalog import RunBusy, import_in_progress, run_state

    found = import_in_progress(meta)
    if found is None:
        return
    run_id = meta.get("run_id", run_dir.name)
    if run_state(meta) == "interrupted":
        raise RunBusy(f"run {run_id} has an interrupted import; resume it first (flowscope import --resume "
                      f"{run_id}) or remove the run (flowscope rm {run_id})")
    who = found[1].describe() if found[1] is not None else "another process"
    raise RunBusy(f"run {run_id} is being imported by {who}; wait for it to finish")


def import_paths(paths: Iterable[str | Path], store: str | Path | None = None, *, run: str | Path | None = None,
                 name: str | None = None, fmt: str | None = None,
                 progress: Callable[[str, int, int], None] | None = None, keep_going: bool = False) -> ImportResult:
    """Import trace files (and folders of them) into a new run of ``store``, or into the existing ``run``.

    ``progress(path, done_bytes, total_bytes)`` is called as each file is read. Each file's rows,
    warnings and facts go to run.json's ``imports`` list. A file lands whole or not at all: its
    segments are staged in a hidden folder of the run and moved in once it has been read
    completely. A file whose bytes the run already holds (a copy, the same file again) is not read:
    it is listed in ``duplicates``. The import is all or nothing: when a file fails, the files
    imported before it are taken out again (a new run is removed) and the call raises saying so.
    With ``keep_going``, a file that cannot be read (TraceError) is listed in ``failed`` with the
    reason and the others are imported; the call raises only if no file could be.

    While it runs, run.json's ``importing`` names this process (host, pid, start time) and the files;
    an import that is killed stays recorded there, so readers see it as interrupted and
    :func:`resume_import` can finish it."""
    from flowscope.model.provenance import collect_provenance, new_run_id, now_ns
    from flowscope.service.collector import Collector
    from flowscope.store.catalog import default_store, resolve_run
    from flowscope.store.layout import RUN_JSON, read_json
    from flowscope.store.writers import WriterId

    todo, skipped = expand(paths, fmt)
    if not todo:
        raise UnknownFormat("no importable file among " + ", ".join(map(str, paths)))
    job = {"by": WriterId.current().to_dict(), "since_ns": now_ns(),
           "files": [{"path": str(p.absolute()), "format": f} for p, f in todo], "keep_going": bool(keep_going)}
    if run is not None:
        run_dir = resolve_run(run, store)
        meta = read_json(run_dir / RUN_JSON)
        _check_not_importing(run_dir, meta)
        run_id = meta["run_id"]
        collector = Collector(run_dir.parent)
        job.update(created_run=False, imports_before=len(meta.get("imports") or []), had_imports="imports" in meta)
        collector.update_run(run_id, {"importing": job})
    else:
        collector = Collector(store if store is not None else default_store())
        run_id = new_run_id()
        job.update(created_run=True, imports_before=0, had_imports=True)
        collector.open_run({"run_id": run_id, "name": name or todo[0][0].stem, "command": None,
                            "provenance": {"source": "import", "imported_by": collect_provenance()},
                            "imports": [], "importing": job})
        collector.update_run(run_id, {"imports": [], "importing": job})
    run_dir = collector.run_dir(run_id)
    return _import_files(collector, run_dir, run_id, job, todo, skipped, progress)


def resume_import(run: str | Path, store: str | Path | None = None, *,
                  progress: Callable[[str, int, int], None] | None = None) -> ImportResult:
    """Finish the interrupted import of ``run`` (its importing process is gone): import the files it had not
    imported yet, as that import would have (the files it did import are listed in ``duplicates``)."""
    import shutil

    from flowscope.model.provenance import now_ns
    from flowscope.service.collector import Collector
    from flowscope.store.catalog import RunBusy, import_in_progress, resolve_run, run_state
    from flowscope.store.layout import RUN_JSON, read_json, staging_dirs
    from flowscope.store.writers import WriterId

    run_dir = resolve_run(run, store)
    meta = read_json(run_dir / RUN_JSON)
    run_id = meta.get("run_id", run_dir.name)
    found = import_in_progress(meta)
    if found is None:
        raise ValueError(f"run {run_id} has no interrupted import")
    job, writer = found
    if run_state(meta) != "interrupted":
        who = writer.describe() if writer is not None else "another process"
        raise RunBusy(f"run {run_id} is being imported by {who}; it has not been interrupted")
    try:
        todo = [(Path(f["path"]), str(f["format"])) for f in job["files"]]
        for _, f in todo:
            format_module(f)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{run_dir / RUN_JSON}: 'importing' is not an import record ({exc!r})") from None
    for path, _ in todo:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file, and the interrupted import of run {run_id} needs it; "
                                    f"put it back, or remove the run with flowscope rm {run_id}")
    if writer is not None:  # what the dead importer had staged (a collector starting removes it too)
        for staged in staging_dirs(run_dir, writer):
            shutil.rmtree(staged, ignore_errors=True)
    collector = Collector(run_dir.parent)
    job = {**job, "by": WriterId.current().to_dict(), "resumed_ns": now_ns()}
    collector.update_run(run_id, {"importing": job})
    return _import_files(collector, run_dir, run_id, job, todo, [], progress)


def _import_files(collector, run_dir: Path, run_id: str, job: dict, todo: list[tuple[Path, str]],
                  skipped: list[str], progress: Callable[[str, int, int], None] | None) -> ImportResult:
    """Import ``todo`` into the run as the import ``job`` (run.json's ``importing``) describes."""
    import shutil

    from flowscope.importers.sink import content_key
    from flowscope.store.layout import RUN_JSON, read_json, staging_dir, write_segment

    created, keep_going, before = bool(job["created_run"]), bool(job["keep_going"]), int(job["imports_before"])
    meta = read_json(run_dir / RUN_JSON)
    held: dict[tuple[str, str], str] = {}  # (content, format) -> path of the file the run holds with those bytes
    for entry in meta.get("imports") or []:
        if isinstance(entry, dict) and entry.get("content"):
            held.setdefault((entry["content"], entry.get("format")), entry.get("path"))
    files: list[FileImport] = []
    failed: list[tuple[str, str]] = []
    duplicates: list[Duplicate] = []
    current: str | None = None  # segment name prefix of the file being imported
    try:
        for n, (path, f) in enumerate(todo):
            key = content_key(content_files(path, f))
            content = f"blake2b:{key}" if key else None
            if content and (content, f) in held:
                duplicates.append(Duplicate(str(path), f, held[(content, f)]))
                continue
            total = path.stat().st_size
            cb = (lambda done, _p=path, _t=total: progress(str(_p), done, _t)) if progress else None
            staging = staging_dir(run_dir, n)
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            sink = ImportSink(run_id, path, f, lambda _r, t, seg, d, _s=staging: write_segment(_s, t, seg, d),
                              cb, run_dir, key=key)
            current = sink.token
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
            if content:
                held[(content, f)] = str(path.resolve())
            meta = read_json(run_dir / RUN_JSON)
            imports = list(meta.get("imports") or [])
            imports.append({"path": str(path.resolve()), "format": f, "content": content, "segments": sink.token,
                            "rows": done.rows, "warnings": done.warnings, "meta": done.meta})
            fields: dict[str, Any] = {"imports": imports}
            declared = getattr(format_module(f), "SEMANTICS", None)
            if declared is not None:  # what this format's rows mean to the analyses (model/semantics.py)
                from flowscope.model.semantics import with_declared

                fields["semantics"] = with_declared(meta.get("semantics"), [declared])
            if created:
                for k, v in sink.run_fields.items():
                    if k in ("start_ns", "end_ns") and meta.get(k) is not None and len(imports) > 1 and v is not None:
                        v = min(meta[k], v) if k == "start_ns" else max(meta[k], v)
                    fields[k] = v
            collector.update_run(run_id, fields)
            current = None
        if not files and failed and not duplicates:
            raise TraceError(f"no file could be imported; the first: {failed[0][1]}")
    except Exception as exc:
        taken_out = _roll_back(collector, run_dir, run_id, created, before, current, job.get("had_imports", True))
        if not taken_out:
            raise
        raise TraceError(f"{exc}; nothing was imported ({taken_out}; --keep-going imports the files that can "
                         f"be read)") from exc
    except KeyboardInterrupt:
        raise ImportInterrupted(f"import into run {run_id} interrupted; resume it with flowscope import --resume "
                                f"{run_id}, or remove the run with flowscope rm {run_id}") from None
    finally:
        collector.shutdown()
    fields = {"import_failures": [{"path": p, "error": e} for p, e in failed]} if failed else {}
    collector.update_run(run_id, fields, drop=("importing",))
    if created:
        collector.close_run(run_id, end_ns=read_json(run_dir / RUN_JSON).get("end_ns") or None,
                            status="imported-partly" if failed else "imported")
    return ImportResult(run_dir, run_id, created, files, skipped, failed, duplicates)


def _roll_back(collector, run_dir: Path, run_id: str, created: bool, before: int, current: str | None,
               had_imports: bool) -> str:
    """Take out what a failed import put in the run (a new run: the run); say what was taken out, if anything."""
    import shutil

    from flowscope.store.layout import RUN_JSON, read_json

    meta = read_json(run_dir / RUN_JSON)
    imports = list(meta.get("imports") or [])
    landed = [Path(str(e.get("path"))).name for e in imports[before:] if isinstance(e, dict)]
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
        return f"{', '.join(landed)}, imported before it, went again with the new run {run_id}" if landed else ""
    for entry in imports[before:]:
        if isinstance(entry, dict) and isinstance(entry.get("segments"), str):
            _remove_segments(run_dir, entry["segments"])
    if current:
        _remove_segments(run_dir, current)
    if had_imports:
        collector.update_run(run_id, {"imports": imports[:before]}, drop=("importing",))
    else:
        collector.update_run(run_id, {}, drop=("importing", "imports"))
    return f"{', '.join(landed)}, imported before it, was taken out of run {run_id} again" if landed else ""
