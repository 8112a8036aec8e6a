"""Where things live in a run directory, and the atomic writes that put them there.

A run is ``<store>/<run_id>/`` holding ``run.json`` and one folder per table of
Parquet segments, ``<table>/<segment_id>.parquet``. A segment is written to a
``.<name>.tmp`` file and renamed into place, so a reader only ever sees whole
segments and a crashed writer leaves at worst a temp file that readers ignore.
A segment's name is the producer's batch id, which makes a replayed batch a no-op.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flowscope.model.schemas import dictionary_columns

RUN_JSON = "run.json"
SEGMENT_SUFFIX = ".parquet"
_SEGMENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


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


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def write_segment(run_dir: Path, table: str, segment_id: str, data: pa.Table, *,
                  compression: str = "zstd", fsync: bool = False) -> bool:
    """Write ``data`` as one segment of ``table``; False (and nothing written) if that segment exists."""
    final = segment_path(run_dir, table, check_segment_id(segment_id))
    if final.exists():
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
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


def remove_stale_temps(run_dir: Path) -> int:
    """Delete temp files left by a writer that crashed; returns how many."""
    n = 0
    for p in run_dir.glob("*/.*.tmp"):
        try:
            p.unlink()
            n += 1
        except OSError:
            pass
    return n
