"""The collector's core: opens and closes runs and writes ingested batches to the run store.

Transport-free: the HTTP app and the embedded client both call it. Memory is
bounded by reservations: a batch reserves its bytes before it is decoded and
releases them once written; when the reservations would exceed ``queue_bytes``
the collector refuses the batch with :class:`CollectorBusy` (HTTP 503) and the
client retries or spools. A batch is acknowledged only after its segment is on
disk, so a killed collector never loses an acknowledged batch.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from flowscope.model.conform import conform
from flowscope.model.provenance import (CLOSE_FIELDS, RUN_FIELDS, check_close_request, check_open_request,
                                       check_run_id, collect_provenance, new_run_id, now_ns)
from flowscope.model.schemas import INT64_MAX, schema
from flowscope.store.layout import (RUN_JSON, check_segment_id, read_json, remove_dead_temps, segment_path,
                                    write_json_atomic, write_segment)

log = logging.getLogger("flowscope.collector")

MiB = 2**20


class CollectorBusy(RuntimeError):
    """The write queue is full; retry later."""


class UnknownRun(KeyError):
    """No run with that id in the store."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class IngestResult:
    rows: int
    duplicate: bool
    segment_id: str


class Collector:
    """Owns a store directory: run lifecycle, bounded write queue, writer threads."""

    def __init__(self, store: str | Path, *, queue_bytes: int = 256 * MiB, max_request_bytes: int = 64 * MiB,
                 writers: int = 2, writer_delay: float = 0.0, compression: str = "zstd", fsync: bool = False,
                 kill_after_segments: int = 0):
        self.store = Path(store)
        self.store.mkdir(parents=True, exist_ok=True)
        # Other processes may be writing this store right now: only the leftovers of dead writers go. In the
        # background: a large store on a parallel file system takes a while to walk, and nothing waits for it.
        self.removed_temps: int | None = None
        self.temps_swept = threading.Event()
        threading.Thread(target=self._sweep_temps, name="flowscope-temp-sweep", daemon=True).start()
        self.queue_bytes = int(queue_bytes)
        self.max_request_bytes = int(max_request_bytes)
        self.writer_delay = float(writer_delay)
        self.compression = compression
        self.fsync = fsync
        # test-only fault injection: SIGKILL this process right after its N-th segment is renamed into
        # place, before that batch is acknowledged (set by `flowscope serve` from an environment variable)
        self.kill_after_segments = int(kill_after_segments)
        self._segments_written = 0
        self.started_ns = now_ns()
        self._reserved = 0
        self._decoding = 0
        self._peak_reserved = 0
        self._res_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._run_lock = threading.Lock()
        self._known_runs: set[str] = set()
        self._inflight: dict[tuple[str, str, str], Future] = {}
        self.stats = {"batches": 0, "rows": 0, "duplicates": 0, "busy_refusals": 0, "errors": 0}
        self._rows_by_table: dict[str, int] = {}   # rows written since start, per table (Prometheus /metrics)
        self._run_status: dict[str, str] = {}      # status of each run this collector opened or closed since start
        self._segment_listeners: list = []
        self._close_listeners: list = []
        self._watch_probes: list = []
        self._stopping = False
        self._writers = [threading.Thread(target=self._write_loop, name=f"flowscope-writer-{i}", daemon=True)
                         for i in range(max(1, writers))]
        for t in self._writers:
            t.start()

    def _sweep_temps(self) -> None:
        try:
            self.removed_temps = remove_dead_temps(self.store)
        except OSError:
            log.exception("removing dead writers' temp files from %s failed", self.store)
        finally:
            self.temps_swept.set()

    # ---- run lifecycle -------------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        return self.store / check_run_id(run_id)

    def has_run(self, run_id: str) -> bool:
        if run_id in self._known_runs:
            return True
        try:
            exists = (self.run_dir(run_id) / RUN_JSON).is_file()
        except ValueError:
            return False
        if exists:
            self._known_runs.add(run_id)
        return exists

    def open_run(self, meta: dict | None = None) -> dict:
        """Create the run described by ``meta`` (idempotent for a given run_id) and return its run.json.

        ValueError, naming the field, when ``meta`` does not fit run.json (see check_open_request)."""
        meta = check_open_request(meta or {})
        run_id = check_run_id(meta.get("run_id") or new_run_id())
        with self._run_lock:
            d = self.run_dir(run_id)
            path = d / RUN_JSON
            if path.is_file():
                existing = read_json(path)
                self._known_runs.add(run_id)
                self._run_status[run_id] = str(existing.get("status"))
                return existing
            d.mkdir(parents=True, exist_ok=True)
            doc = {
                "run_id": run_id,
                "name": meta.get("name") or run_id,
                "command": meta.get("command"),
                "start_ns": meta.get("start_ns") or now_ns(),
                "end_ns": None,
                "status": "running",
                "provenance": meta.get("provenance") or collect_provenance(),
                "collector": {"store": str(self.store.resolve())},
                "format_version": 1,
            }
            for k, v in meta.items():
                doc.setdefault(k, v)
            write_json_atomic(path, doc)
            self._known_runs.add(run_id)
            self._run_status[run_id] = "running"
            return doc

    def close_run(self, run_id: str, *, end_ns: int | None = None, status: str = "finished",
                  extra: dict | None = None) -> dict:
        """Mark the run finished (end time, status); later batches are still accepted.

        ``extra`` adds fields of the collector's own callers (an import's failures); it may not replace a
        field of run.json's own (run_id, start_ns, ...). ValueError names what does not fit."""
        # an imported trace's end may precede 1970; the 0 floor of a live client's close is checked at the edge
        end_ns, status = check_close_request({"end_ns": end_ns, "status": status}, earliest=-INT64_MAX)
        clash = sorted(set(extra or ()) & {*RUN_FIELDS, *CLOSE_FIELDS})
        if clash:
            raise ValueError(f"close: {', '.join(clash)} cannot be replaced")
        with self._run_lock:
            path = self.run_dir(run_id) / RUN_JSON
            if not path.is_file():
                raise UnknownRun(f"unknown run {run_id!r}")
            doc = read_json(path)
            doc["end_ns"] = int(end_ns or now_ns())
            doc["status"] = status
            if extra:
                doc.update(extra)
            write_json_atomic(path, doc)
            self._run_status[run_id] = status
        self._tell(self._close_listeners, run_id, doc)
        return doc

    def interrupt_open_runs(self, why: str) -> list[str]:
        """Close every run this collector opened that is still running with the status ``interrupted``, ``why``
        recorded beside it (run.json ``interrupted``); the ids of those runs."""
        with self._run_lock:
            open_runs = [r for r, status in self._run_status.items() if status == "running"]
        closed = []
        for run_id in open_runs:
            try:
                self.close_run(run_id, status="interrupted", extra={"interrupted": why})
                closed.append(run_id)
            except (UnknownRun, ValueError, OSError):  # removed meanwhile, or its run.json unreadable: left as it is
                continue
        return closed

    def add_listener(self, on_segment, on_close=None, watching=None) -> None:
        """Call ``on_segment(run_id, table, segment_id, data)`` for every segment written, on the writer thread,
        before the batch is acknowledged, and ``on_close(run_id, run_json)`` when a run is closed. A listener
        that raises is logged and never fails the batch; it must be quick (it delays the acknowledgement).
        ``watching(run_id) -> bool`` says whether someone follows the run live (see :meth:`watched`)."""
        self._segment_listeners.append(on_segment)
        if on_close is not None:
            self._close_listeners.append(on_close)
        if watching is not None:
            self._watch_probes.append(watching)

    def add_watch_probe(self, watching) -> None:
        """Add ``watching(run_id) -> bool``, a reader that follows runs live without listening to segments."""
        self._watch_probes.append(watching)

    def watched(self, run_id: str) -> bool:
        """Whether a page follows ``run_id`` live now: the acknowledgement of a batch says so, and a client that
        reads it sends its batches more often while it holds (``Client(live_flush_interval=...)``)."""
        for probe in self._watch_probes:
            try:
                if probe(run_id):
                    return True
            except Exception:  # a hint: never a reason to fail a batch
                log.exception("a collector watch probe failed on %s", run_id)
        return False

    @staticmethod
    def _tell(listeners: list, *args) -> None:
        for fn in listeners:
            try:
                fn(*args)
            except Exception:
                log.exception("a collector listener failed on %s", args[0])

    def update_run(self, run_id: str, fields: dict, drop: tuple[str, ...] = ()) -> dict:
        """Merge ``fields`` into run.json, and remove the keys named in ``drop``."""
        with self._run_lock:
            path = self.run_dir(run_id) / RUN_JSON
            if not path.is_file():
                raise UnknownRun(f"unknown run {run_id!r}")
            doc = read_json(path)
            doc.update(fields)
            for key in drop:
                doc.pop(key, None)
            write_json_atomic(path, doc)
            return doc

    # ---- ingest --------------------------------------------------------------------------
    def reserve(self, nbytes: int) -> None:
        """Take ``nbytes`` of the write budget or raise CollectorBusy."""
        with self._res_lock:
            if self._reserved and self._reserved + nbytes > self.queue_bytes:
                self.stats["busy_refusals"] += 1
                raise CollectorBusy(f"collector busy: write queue holds {self._reserved / MiB:.1f} MiB "
                                    f"of {self.queue_bytes / MiB:.0f} MiB; retry later")
            self._reserved += nbytes
            self._peak_reserved = max(self._peak_reserved, self._reserved)

    def release(self, nbytes: int) -> None:
        with self._res_lock:
            self._reserved -= nbytes

    def resize(self, held: int, nbytes: int) -> int:
        """Change a reservation of ``held`` bytes (taken with :meth:`reserve`) to ``nbytes`` and return
        ``nbytes``. Shrinking always succeeds; growing raises CollectorBusy, keeping ``held``, when the
        budget cannot take it (a reservation larger than the budget still fits when it is the only one)."""
        with self._res_lock:
            others = self._reserved - held
            if nbytes > held and others and others + nbytes > self.queue_bytes:
                self.stats["busy_refusals"] += 1
                raise CollectorBusy(f"collector busy: a batch needs {nbytes / MiB:.1f} MiB and the write queue "
                                    f"holds {others / MiB:.1f} MiB of {self.queue_bytes / MiB:.0f} MiB; retry later")
            self._reserved = others + nbytes
            self._peak_reserved = max(self._peak_reserved, self._reserved)
        return nbytes

    def decoding(self, delta: int) -> None:
        """Count a batch starting (+1) or ending (-1) its decoding (reported by :meth:`health`)."""
        with self._res_lock:
            self._decoding += delta

    def count_duplicate(self) -> None:
        """Count a batch answered as a duplicate before it was decoded (its segment already exists)."""
        with self._res_lock:
            self.stats["duplicates"] += 1

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    def submit(self, run_id: str, table: str, segment_id: str, data: pa.Table | pa.RecordBatch,
               reserved: int = 0) -> Future:
        """Validate and queue one batch; the future resolves to an IngestResult once it is on disk.

        ``reserved`` bytes (taken by the caller with :meth:`reserve`) are released when the
        batch is written or fails. Validation errors raise here, before anything is queued.
        """
        try:
            schema(table)
            check_segment_id(segment_id)
            if not self.has_run(run_id):
                raise UnknownRun(f"unknown run {run_id!r}: open it first (POST /v1/runs)")
            data = conform(table, data)
        except BaseException:
            self.release(reserved)
            raise
        fut: Future = Future()
        key = (run_id, table, segment_id)
        with self._res_lock:
            first = self._inflight.setdefault(key, fut)
        if first is not fut:  # the same batch is being written right now (a client retried): answer as a replay
            self.release(reserved)
            dup: Future = Future()
            first.add_done_callback(lambda f: dup.set_result(IngestResult(data.num_rows, True, segment_id))
                                    if f.exception() is None else dup.set_exception(f.exception()))
            return dup
        self._queue.put((run_id, table, segment_id, data, reserved, fut))
        return fut

    def ingest(self, run_id: str, table: str, segment_id: str, data: pa.Table | pa.RecordBatch,
               timeout: float | None = None) -> IngestResult:
        """Reserve, validate, write and wait: the blocking form used by the embedded client."""
        nbytes = data.nbytes
        self.reserve(nbytes)
        return self.submit(run_id, table, segment_id, data, reserved=nbytes).result(timeout)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            run_id, table, segment_id, data, reserved, fut = item
            del item  # else the batch stays alive, outside the budget, while this thread waits for the next
            try:
                if self.writer_delay:
                    time.sleep(self.writer_delay)
                written = write_segment(self.run_dir(run_id), table, segment_id, data,
                                        compression=self.compression, fsync=self.fsync)
                with self._res_lock:
                    self.stats["batches"] += 1
                    if written:
                        self.stats["rows"] += data.num_rows
                        self._rows_by_table[table] = self._rows_by_table.get(table, 0) + data.num_rows
                        self._segments_written += 1
                    else:
                        self.stats["duplicates"] += 1
                    kill = written and self._segments_written == self.kill_after_segments
                if kill:
                    log.warning("test fault injection: killing the collector after segment %s/%s/%s",
                                run_id, table, segment_id)
                    os.kill(os.getpid(), signal.SIGKILL)
                if written and self._segment_listeners:
                    self._tell(self._segment_listeners, run_id, table, segment_id, data)
                fut.set_result(IngestResult(data.num_rows, not written, segment_id))
            except BaseException as exc:  # the future carries it to the caller
                with self._res_lock:
                    self.stats["errors"] += 1
                log.exception("writing %s/%s/%s failed", run_id, table, segment_id)
                fut.set_exception(exc)
            finally:
                del data
                with self._res_lock:
                    self._inflight.pop((run_id, table, segment_id), None)
                self.release(reserved)

    def segment_exists(self, run_id: str, table: str, segment_id: str) -> bool:
        return segment_path(self.run_dir(run_id), table, check_segment_id(segment_id)).exists()

    def health(self) -> dict:
        with self._res_lock:
            return {
                "status": "ok",
                "store": str(self.store),
                "reserved_bytes": self._reserved,
                "peak_reserved_bytes": self._peak_reserved,
                "queue_bytes": self.queue_bytes,
                "max_request_bytes": self.max_request_bytes,
                "queued_batches": self._queue.qsize(),
                "decoding_batches": self._decoding,
                "uptime_s": (now_ns() - self.started_ns) / 1e9,
                "dead_temps_removed": self.removed_temps,  # None until the sweep at start is done
                "rows_by_table": dict(self._rows_by_table),
                **self.stats,
            }

    def rows_by_table(self) -> dict[str, int]:
        """Rows written since this collector started, per table."""
        with self._res_lock:
            return dict(self._rows_by_table)

    def runs_by_status(self) -> dict[str, int]:
        """How many of the runs this collector opened or closed since it started are in each status."""
        with self._run_lock:
            return dict(collections.Counter(self._run_status.values()))

    def shutdown(self, wait: bool = True) -> None:
        """Finish writing what is queued, then stop the writer threads."""
        if self._stopping:
            return
        self._stopping = True
        for _ in self._writers:
            self._queue.put(None)
        if wait:
            for t in self._writers:
                t.join()
