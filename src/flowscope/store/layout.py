"""Where things live in a run directory, and the atomic writes that put them there.

A run is ``<store>/<run_id>/`` holding ``run.json`` and one folder per table of
Parquet segments, ``<table>/<segment_id>.parquet``. A segment is written to a
``.<name>.<writer>.<n>.tmp`` file and renamed into place, so a reader only ever sees
whole segments and a crashed writer leaves at worst a temp file that readers ignore.
The temp file's name carries its writer's identity (host, pid, start time; see
:mod:`flowscope.store.writers`), so :func:`remove_dead_temps` deletes only those of
writers that are gone, never one another process is writing. A segment's name is the
producer's batch id, which makes a replayed batch a no-op.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from pathlib import Path

import orjson
import pyarrow as pa

from flowscope.model.schemas import dictionary_columns
from flowscope.store.writers import WriterId

RUN_JSON = "run.json"
SEGMENT_SUFFIX = ".parquet"
_SEGMENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_TEMP = re.compile(r"^\..*\.(?P<writer>[A-Za-z0-9-]{1,40}\+\d+\+\d+)\.\d+\.tmp$")
_STAGING = re.compile(r"^\.import-(?P<writer>[A-Za-z0-9-]{1,40}\+\d+\+\d+)-\d+$")
_temp_seq = itertools.count()


def check_segment_id(segment_id: str) -> str:
    """Return ``segment_id`` if it is safe as a file name, else raise ValueError."""
    if not isinstance(segment_id, str) or not _SEGMENT_ID.match(segment_id):
        raise ValueError(f"invalid segment id {segment_id!r}: use letters, digits, '.', '_' and '-' (at most 200)")
    return segment_id


def segment_path(run_dir: Path, table: str, segment_id: str) -> Path:
    return run_dir / table / f"{segment_id}{SEGMENT_SUFFIX}"


def segment_files(run_dir: Path, table: str) -> list[Path]:
    """The complete segments of ``table``, oldest name first; temp files are never listed."""
    d = run_dir / table
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return [d / n for n in sorted(names) if n.endswith(SEGMENT_SUFFIX) and not n.startswith(".")]


def temp_path(final: Path, writer: WriterId | None = None) -> Path:
    """A temp file beside ``final`` that names its writer (this process unless ``writer`` is given)."""
    writer = writer or WriterId.current()
    return final.with_name(f".{final.name[:120]}.{writer.token}.{next(_temp_seq)}.tmp")


def staging_dir(run_dir: Path, n: int) -> Path:
    """The hidden folder of ``run_dir`` where this process stages the ``n``-th file it imports."""
    return run_dir / f".import-{WriterId.current().token}-{n}"


def staging_dirs(run_dir: Path, writer: WriterId) -> list[Path]:
    """The staging folders ``writer`` made in ``run_dir`` (see :func:`staging_dir`)."""
    return sorted(run_dir.glob(f".import-{writer.token}-*"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` at once: a reader sees the old content or the new, never a part."""
    tmp = temp_path(path)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write ``obj`` as indented JSON with sorted keys, replacing ``path`` atomically."""
    tmp = temp_path(path)
    try:  # the standard library's encoder is pure Python when it indents: an import rewrites run.json per file
        body = orjson.dumps(obj, default=str,
                            option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
                            | orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits, which the standard library writes
        body = (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
    with open(tmp, "wb") as f:
        f.write(body)
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    """The JSON object in ``path`` (UTF-8, whatever the locale)."""
    return json.loads(Path(path).read_bytes())


def write_segment(run_dir: Path, table: str, segment_id: str, data: pa.Table, *,
                  compression: str = "zstd", fsync: bool = False) -> bool:
    """Write ``data`` as one segment of ``table``; False (and nothing written) if that segment exists."""
    final = segment_path(run_dir, table, check_segment_id(segment_id))
    if final.exists():
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final)
    import pyarrow.parquet as pq  # here: a producer imports this module for its spool, and writes no Parquet

    pq.write_table(data, tmp, compression=compression, use_dictionary=dictionary_columns(data.schema),
                   write_statistics=True)
    if fsync:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, final)
    return True


def _writer_gone(name: str, pattern: re.Pattern, judged: dict[str, bool]) -> bool:
    m = pattern.match(name)
    if m is None:  # not named by a writer (or by an older flowscope): whose it is cannot be known
        return False
    token = m["writer"]
    if token not in judged:
        writer = WriterId.from_token(token)
        judged[token] = writer is not None and writer.alive() is False
    return judged[token]


def remove_dead_temps(store: Path) -> int:
    """Delete the temp files and import staging folders, in every run of ``store``, whose writer process is
    gone; returns how many. Those of live writers, of writers on other hosts and unnamed ones stay."""
    n = 0
    judged: dict[str, bool] = {}  # writer token -> gone
    try:
        runs = [e for e in os.scandir(store) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except FileNotFoundError:
        return 0
    for run in runs:
        try:
            entries = list(os.scandir(run.path))
        except OSError:
            continue
        for e in entries:
            try:
                if e.name.startswith("."):
                    if e.is_dir(follow_symlinks=False) and _writer_gone(e.name, _STAGING, judged):
                        shutil.rmtree(e.path)
                        n += 1
                    elif e.is_file(follow_symlinks=False) and _writer_gone(e.name, _TEMP, judged):
                        os.unlink(e.path)
                        n += 1
                elif e.is_dir(follow_symlinks=False):
                    for t in os.scandir(e.path):
                        if t.name.startswith(".") and _writer_gone(t.name, _TEMP, judged):
                            os.unlink(t.path)
                            n += 1
            except OSError:  # vanished meanwhile (its writer renamed it), or not ours to delete
                continue
    return n

