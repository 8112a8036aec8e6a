"""Batches a client could not deliver, kept on local disk until a collector takes them.

Layout: ``<spool>/<run_id>/run.json`` (the run's open request), one
``<table>__<segment_id>.arrows`` Arrow IPC stream per batch, and ``close.json``
when the run's close could not be delivered either. Files are written atomically.
Replaying is idempotent because the collector ignores a segment id it already has.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from flowscope.store.layout import write_json_atomic

SUFFIX = ".arrows"


def default_spool_dir() -> Path:
    """$FLOWSCOPE_SPOOL, else ~/.cache/flowscope/spool."""
    env = os.environ.get("FLOWSCOPE_SPOOL")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flowscope" / "spool"


class Spool:
    """The spool of one client (all its runs)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def save_open(self, run_id: str, meta: dict) -> None:
        d = self.run_dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "run.json").exists():
            write_json_atomic(d / "run.json", meta)

    def save_batch(self, run_id: str, table: str, segment_id: str, data: pa.Table | bytes) -> Path:
        d = self.run_dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        final = d / f"{table}__{segment_id}{SUFFIX}"
        tmp = d / f".{final.name}.tmp"
        if isinstance(data, (bytes, bytearray, memoryview)):
            with open(tmp, "wb") as f:
                f.write(data)
        else:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, data.schema) as writer:
                writer.write_table(data)
        os.replace(tmp, final)
        return final

    def save_close(self, run_id: str, info: dict) -> None:
        d = self.run_dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        write_json_atomic(d / "close.json", info)

    def pending(self, run_id: str | None = None) -> list[Path]:
        """Spooled batch files, of one run or of all."""
        dirs = [self.run_dir(run_id)] if run_id else [p for p in self.root.iterdir() if p.is_dir()] \
            if self.root.is_dir() else []
        out = []
        for d in dirs:
            if d.is_dir():
                out.extend(sorted(p for p in d.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith(".")))
        return out

    def has_pending(self, run_id: str) -> bool:
        return bool(self.pending(run_id))


@dataclass
class ReplayReport:
    runs: int = 0
    batches: int = 0
    rows: int = 0
    duplicates: int = 0
    closed: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)


def _send_patiently(transport, run_id: str, table: str, seg: str, body: bytes, busy_timeout: float) -> dict:
    """Send one batch, waiting out a busy collector for up to ``busy_timeout`` seconds."""
    from flowscope.client.transport import Busy

    deadline, pause = time.monotonic() + busy_timeout, 0.05
    while True:
        try:
            return transport.send(run_id, table, seg, body)
        except Busy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 1.0)


def replay(root: str | Path, transport, run_id: str | None = None,
           progress: Callable[[int, int], None] | None = None, busy_timeout: float = 60.0) -> ReplayReport:
    """Send everything under the spool ``root`` (or one run of it) through ``transport``.

    Each delivered file is deleted; a run directory is removed once empty. Stops at the
    first unreachable collector, or one still busy after ``busy_timeout`` s (raising it), so
    nothing is deleted that was not delivered.
    A batch the collector rejects for good is left in place and listed in ``failed``.
    """
    from flowscope.client.transport import Rejected

    root = Path(root)
    if (root / "run.json").is_file():  # pointed at one run's spool directory
        run_dirs = [root]
    else:
        run_dirs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        if run_id:
            run_dirs = [d for d in run_dirs if d.name == run_id]
    report = ReplayReport()
    total = sum(1 for d in run_dirs for p in d.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith("."))
    done = 0
    for d in run_dirs:
        meta_path = d / "run.json"
        meta = json.loads(meta_path.read_bytes()) if meta_path.is_file() else {"run_id": d.name}
        rid = meta.get("run_id") or d.name
        transport.open_run(meta)
        report.runs += 1
        failed_before = len(report.failed)
        for p in sorted(p for p in d.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith(".")):
            table, _, seg = p.name[: -len(SUFFIX)].partition("__")
            try:
                body = p.read_bytes()
            except FileNotFoundError:  # delivered meanwhile by another replay
                continue
            try:
                res = _send_patiently(transport, rid, table, seg, body, busy_timeout)
            except Rejected as exc:
                report.failed.append((str(p), str(exc)))
                continue
            report.batches += 1
            report.rows += int(res.get("rows") or 0)
            report.duplicates += bool(res.get("duplicate"))
            p.unlink(missing_ok=True)
            done += 1
            if progress:
                progress(done, total)
        close_path = d / "close.json"
        if close_path.is_file() and len(report.failed) == failed_before:
            transport.close_run(rid, json.loads(close_path.read_bytes()))
            close_path.unlink()
            report.closed += 1
        if {p.name for p in d.iterdir()} <= {"run.json"}:  # all delivered; rejected/ and the like stay
            meta_path.unlink(missing_ok=True)
            d.rmdir()
    return report
