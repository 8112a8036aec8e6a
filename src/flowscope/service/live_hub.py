"""The runs a dashboard is watching, each kept live as the collector acknowledges its batches.

A run is watched from the first time a page asks for it (nobody watching: no cost): its live view
(:class:`flowscope.analysis.live.LiveRun`) is built once from the segments on disk, then updated by every
segment the collector writes for it, and each change is kept in a bounded ring with its sequence number
so that a page that reconnects gets what it missed instead of the whole view. The collector acknowledges a
batch without waiting for the view: one thread of the hub applies the written segments (and closes) in the
order the collector told them, and encodes each delta once for every page, off the event loop. Without a collector
(``flowscope ui STORE``: a store read by nobody else's collector) new segments are read from disk when
a page asks.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import threading
import uuid
import weakref
from collections import deque
from pathlib import Path

from flowscope.analysis.live import LiveRun, read_pending
from flowscope.service.frames import encode_item, message
from flowscope.service.json_text import encode
from flowscope.store.layout import RUN_JSON, read_json
from flowscope.store.run import Run

log = logging.getLogger("flowscope.dashboard")

#: deltas kept per run for pages that reconnect; one that missed more gets the whole view again
RING = 2000
#: bytes of acknowledged batches the hub may hold before its view takes them; beyond, the collector waits for the
#: view (as it always did before issue 15) instead of holding ever more batches outside its memory budget
FEED_BYTES = 64 * 1024 * 1024


class Encoded:
    """One delta, encoded once for every page (service/frames.py: its columns as binary buffers): the encoded item,
    and the whole ``deltas`` message that carries it alone (what a page that is up to date receives: the same object
    for every page)."""

    __slots__ = ("item", "message", "seq")

    def __init__(self, epoch: str, delta: dict):
        self.seq = delta["seq"]
        self.item = item = encode_item(delta)
        self.message = msg = deltas_message(epoch, [self])
        if item.body:  # the item's columns end the message: kept once, the item's a view of the message's
            item.body = memoryview(msg)[len(msg) - len(item.body):]


def deltas_message(epoch: str, deltas: list[Encoded]) -> str | bytes:
    """The ``{"type": "deltas", "epoch": E, "deltas": [...]}`` message of already encoded ``deltas``: text, or a
    binary frame when they carry columns."""
    if len(deltas) == 1 and hasattr(deltas[0], "message"):  # Encoded.__init__ builds its own message here
        return deltas[0].message
    return message(f'"type":"deltas","epoch":{encode(epoch)}', [d.item for d in deltas], "deltas")


def snapshot_message(snap: dict) -> str | bytes:
    """The ``{"type": "snapshot", ...}`` message of a snapshot taken with its columns as arrays."""
    return message('"type":"snapshot"', [encode_item(snap)], None)


class Watched:
    """One watched run: its live view, the recent deltas and the pages waiting for the next one."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.epoch = uuid.uuid4().hex  # a page's sequence numbers are those of this epoch only
        self.lock = threading.Lock()
        self.loaded = threading.Event()
        self.live: LiveRun | None = None
        self.pending: list[tuple] = []
        self.deltas: deque[Encoded] = deque(maxlen=RING)
        self.waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self.failed: BaseException | None = None
        self._closed: tuple | None = None  # (status, end_ns) of run.json last told to the pages

    def _publish(self, delta: dict | None) -> None:
        """Keep ``delta``, encoded once for all pages, and wake the pages (called with ``lock`` held)."""
        if delta is None:
            return
        if delta.pop("reset", False):  # the stream started again: every page takes a snapshot of a new epoch
            self.epoch = uuid.uuid4().hex
            self.deltas.clear()
        else:
            self.deltas.append(Encoded(self.epoch, delta))
        for loop, event in list(self.waiters):
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that page's loop is closed
                self.waiters.discard((loop, event))

    def apply(self, table: str, segment_id: str, data) -> None:
        with self.lock:
            if not self.loaded.is_set():
                self.pending.append((table, segment_id, data))
                return
            self._apply(table, segment_id, data)

    def _apply(self, table: str, segment_id: str, data) -> None:
        """Apply one segment and publish its delta (with ``lock`` held). A segment the view cannot take is left
        out of it, and logged: the dashboard must never fail ingest or stop following the run."""
        try:
            delta = self.live.apply(table, segment_id, data)
        except Exception:
            log.exception("the dashboard's view of %s left out segment %s/%s", self.run_dir.name, table, segment_id)
            return
        self._publish(delta)

    def status(self, status: str | None, end_ns: int | None) -> None:
        with self.lock:
            if self.live is None or self._closed == (status, end_ns):
                return
            self._closed = (status, end_ns)
            self.live.seq += 1
            self._publish({"seq": self.live.seq, "status": status,
                           "end_s": (end_ns - self.live.t0_ns) / 1e9 if end_ns else None})

    def catch_up(self, read_status: bool = False) -> None:
        """Apply the segments on disk that the view has not seen (what another process wrote); with
        ``read_status``, tell the pages when run.json's status or end changed (another process closed the run)."""
        if read_status:
            try:
                meta = read_json(self.run_dir / RUN_JSON)
            except (OSError, ValueError):
                meta = None
            if meta is not None and self._closed is not None:
                self.status(meta.get("status"), meta.get("end_ns"))
        for table, sid, path, data in read_pending(self.run_dir, self.live):
            if isinstance(data, Exception):  # a damaged segment must not stop the view: left out, logged
                log.warning("the dashboard skips %s: %s", path, data)
                continue
            with self.lock:
                self._apply(table, sid, data)

    def since(self, epoch: str | None, seq: int | None, columns: bool = False) -> tuple[str, object]:
        """What a page that has applied ``seq`` of ``epoch`` needs: ("deltas", (message, last seq)), None when it
        has everything, or ("snapshot", {...}) (``columns``: its tasks and transfers as arrays, for
        :func:`snapshot_message`)."""
        with self.lock:
            live = self.live
            if epoch == self.epoch and seq is not None and 0 <= seq <= live.seq:
                if seq == live.seq:
                    return "deltas", None
                if self.deltas and self.deltas[0].seq <= seq + 1:
                    # the ring's numbers are gapless and end at live.seq: the missed ones are its last entries
                    missed = list(itertools.islice(self.deltas, max(0, len(self.deltas) - (live.seq - seq)), None))
                    if missed[0].seq != seq + 1:
                        missed = [d for d in self.deltas if d.seq > seq]
                    return "deltas", (deltas_message(self.epoch, missed), missed[-1].seq)
            snap = live.snapshot(columns)
            snap["epoch"] = self.epoch
            meta = read_json(self.run_dir / RUN_JSON)
            if self._closed is None:
                self._closed = (meta.get("status"), meta.get("end_ns"))
            snap["status"] = meta.get("status")
            snap["end_s"] = (meta["end_ns"] - live.t0_ns) / 1e9 if meta.get("end_ns") else None
            return "snapshot", snap


class LiveHub:
    """The watched runs of one store; fed by ``collector`` (None: read from disk on demand)."""

    def __init__(self, store: Path, collector=None):
        self.store = Path(store)
        self.collector = collector
        self._runs: dict[str, Watched] = {}
        self._lock = threading.Lock()
        # what the collector told, in its order, for the feed thread: ((function, args), bytes held)
        self._feed: deque = deque()
        self._feed_bytes = 0
        self._feed_cv = threading.Condition()
        # the views' DuckDB connections are closed before the interpreter finalises: one destroyed during
        # finalisation aborts the process ("FATAL: exception not rethrown", seen at the end of `flowscope run`)
        atexit.register(LiveHub._close_views, weakref.ref(self))
        if collector is not None:
            threading.Thread(target=self._feed_loop, name="flowscope-dashboard-feed", daemon=True).start()
            collector.add_listener(self._on_segment, self._on_close, self.watching)

    @staticmethod
    def _close_views(ref) -> None:
        hub = ref()
        for w in list(hub._runs.values()) if hub is not None else []:
            if w.live is not None and w.lock.acquire(timeout=5):
                try:
                    w.live.close()
                finally:
                    w.lock.release()

    def watching(self, run_id: str) -> bool:
        """Whether a page is connected to ``run_id`` now (the overview's stream or an analysis page)."""
        w = self._runs.get(run_id)
        return w is not None and bool(w.waiters)

    def _on_segment(self, run_id: str, table: str, segment_id: str, data) -> None:
        w = self._runs.get(run_id)
        if w is not None:
            self._enqueue(w.apply, (table, segment_id, data), data.nbytes)

    def _on_close(self, run_id: str, doc: dict) -> None:
        w = self._runs.get(run_id)
        if w is not None:
            self._enqueue(self._closed, (w, doc), 0)

    @staticmethod
    def _closed(w: Watched, doc: dict) -> None:
        if w.loaded.is_set():
            w.status(doc.get("status"), doc.get("end_ns"))

    def _enqueue(self, fn, args: tuple, nbytes: int) -> None:
        """Hand one change to the feed thread; waits only while the batches it holds exceed FEED_BYTES."""
        with self._feed_cv:
            while self._feed and self._feed_bytes + nbytes > FEED_BYTES:
                self._feed_cv.wait()
            self._feed.append(((fn, args), nbytes))
            self._feed_bytes += nbytes
            self._feed_cv.notify_all()

    def _feed_loop(self) -> None:
        while True:
            with self._feed_cv:
                while not self._feed:
                    self._feed_cv.wait()
                (fn, args), _ = self._feed[0]  # left queued until applied: flush() waits for it
            try:
                fn(*args)
            except Exception:  # the dashboard must never stop following the runs
                log.exception("the dashboard's live view failed to take a change")
            del fn, args
            with self._feed_cv:
                _, nbytes = self._feed.popleft()
                self._feed_bytes -= nbytes
                self._feed_cv.notify_all()

    def flush(self) -> None:
        """Wait until the views hold every segment and close the collector acknowledged so far."""
        with self._feed_cv:
            while self._feed:
                self._feed_cv.wait()

    def watched(self, run_id: str) -> Watched | None:
        w = self._runs.get(run_id)
        return w if w is not None and w.loaded.is_set() and w.failed is None else None

    def watch(self, run_id: str) -> Watched:
        """The live view of ``run_id``, built from disk on first use (blocking: call it off the event loop).
        FileNotFoundError when the store has no such run."""
        with self._lock:
            w = self._runs.get(run_id)
            creator = w is None or w.failed is not None
            if creator:
                run_dir = self.store / run_id
                if not (run_dir / RUN_JSON).is_file():
                    raise FileNotFoundError(f"unknown run {run_id!r} in store {self.store}")
                w = self._runs[run_id] = Watched(run_dir)
        if not creator:
            w.loaded.wait()
            if w.failed is not None:
                raise w.failed
            if self.collector is None:
                w.catch_up(read_status=True)
            return w
        try:
            run = Run(w.run_dir)
            w.live = LiveRun(run.meta, run.mappings())
            w.catch_up()
            with w.lock:  # what the collector wrote meanwhile; a segment already read from disk counts once
                for table, sid, data in w.pending:
                    w._apply(table, sid, data)
                w.pending.clear()
                meta = read_json(w.run_dir / RUN_JSON)
                w._closed = (meta.get("status"), meta.get("end_ns"))
                w.loaded.set()
        except BaseException as exc:
            w.failed = exc
            w.loaded.set()
            raise
        return w
