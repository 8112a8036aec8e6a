"""A collector fed by a Redis stream (``flowscope serve --redis redis://HOST:PORT[/DB][?stream=NAME]``): the consumer
side of client/redis_transport.py.

Each collector instance joins the stream's consumer group under its own name (host and pid), so the entries are
shared among the instances, and writes them into its store as if they had come over HTTP (the same validation,
the same memory budget). An entry is acknowledged and deleted from the stream only once its batch is on disk (or
its open or close is done); what an instance took and never acknowledged -- it died, or the run was not open yet
-- is claimed by an instance (``XAUTOCLAIM``) once it has been idle ``claim_idle_s`` seconds, and written again:
its segment id makes that a duplicate the store ignores. So delivery is at least once and storage exactly once,
as over HTTP. An entry refused for good (a table the model does not know, a malformed batch) is moved to
``<stream>:rejected`` with the reason, since its producer is not waiting for an answer.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from flowscope.model.redis_stream import GROUP, connect, parse_address, rejected_stream
from flowscope.model.conform import SchemaError
from flowscope.model.schemas import schema
from flowscope.service.app import ApiError, _decode_batch, _decode_cost, _Held
from flowscope.service.collector import Collector, CollectorBusy, UnknownRun

log = logging.getLogger("flowscope.redis")

#: seconds a batch whose run is not open yet waits here before it is left for a later claim (its open may be
#: being written by another instance right now)
UNKNOWN_RUN_WAIT_S = 2.0


class _Later(Exception):
    """The entry cannot be handled yet: left pending, to be claimed again once idle."""


class RedisConsumer:
    """Reads the stream of ``address`` into ``collector`` on a thread of its own (:meth:`start`, :meth:`stop`).
    ``stats`` counts entries by outcome: stored, duplicate, opened, closed, rejected, claimed (taken over from an
    instance that had not acknowledged them), later (left pending)."""

    def __init__(self, collector: Collector, address: str, *, consumer: str | None = None,
                 claim_idle_s: float = 30.0, block_ms: int = 1000, count: int = 16):
        if claim_idle_s <= 0:
            raise ValueError(f"claim_idle_s must be positive, not {claim_idle_s}")
        self.collector = collector
        self._url, self.stream = parse_address(address)
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.claim_idle_s, self.block_ms, self.count = float(claim_idle_s), int(block_ms), int(count)
        self._redis = connect(self._url, timeout=max(30.0, 2 * block_ms / 1000))
        self.stats = {k: 0 for k in ("stored", "duplicate", "opened", "closed", "rejected", "claimed", "later")}
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flowscope-redis-consumer", daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> RedisConsumer:
        """Join the consumer group (created, with the stream, if missing) and start reading."""
        import redis

        try:
            self._redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop reading; entries taken and not yet written stay pending, for another instance to claim."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- reading -----------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        import redis

        next_claim, down = 0.0, False
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_claim:
                    self._claim()
                    next_claim = time.monotonic() + max(0.2, self.claim_idle_s / 2)
                got = self._redis.xreadgroup(GROUP, self.consumer, {self.stream: ">"}, count=self.count,
                                             block=self.block_ms)
                if down:
                    log.warning("Redis at %s reachable again", self._url)
                    down = False
                for _, entries in got or ():
                    for entry_id, fields in entries:
                        self._handle(entry_id, fields)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not down:
                    log.warning("Redis at %s unreachable (%s); retrying every second", self._url, exc)
                    down = True
                self._stop.wait(1.0)
            except Exception:  # noqa: BLE001 - one bad entry or call must not stop the instance
                log.exception("reading the Redis stream %s failed", self.stream)
                self._stop.wait(0.5)

    def _claim(self) -> None:
        """Take over the entries idle for ``claim_idle_s`` (an instance died holding them, or they wait for a run
        to be opened) and handle them."""
        start = "0-0"
        while not self._stop.is_set():
            reply = self._redis.xautoclaim(self.stream, GROUP, self.consumer, int(self.claim_idle_s * 1000),
                                           start_id=start, count=self.count)
            start, entries = reply[0], reply[1]
            for entry_id, fields in entries:
                if not fields:  # trimmed away meanwhile: nothing to write
                    self._done(entry_id)
                    continue
                self._count("claimed")
                self._handle(entry_id, fields)
            if start in (b"0-0", "0-0"):
                return

    # ---- one entry ---------------------------------------------------------------------------------------------
    def _handle(self, entry_id: bytes, fields: dict) -> None:
        f = {k.decode() if isinstance(k, bytes) else k: v for k, v in fields.items()}
        op, run_id = _text(f.get("op")), _text(f.get("run"))
        try:
            if op == "segment":
                self._segment(entry_id, run_id, f)
                return
            doc = json.loads(f.get("doc") or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("doc: not a JSON object")
            if op == "open":
                self.collector.open_run(doc)
                self._count("opened")
            elif op == "close":
                self.collector.close_run(run_id, end_ns=doc.get("end_ns"), status=doc.get("status") or "finished")
                self._count("closed")
            else:
                raise ValueError(f"op: unknown operation {op!r} (open, segment or close)")
            self._done(entry_id)
        except (UnknownRun, _Later) as exc:
            self._count("later")
            log.info("stream entry %s left pending: %s", _text(entry_id), exc)
        except (ValueError, SchemaError, ApiError) as exc:
            self._reject(entry_id, f, exc.message if isinstance(exc, ApiError) else str(exc))

    def _segment(self, entry_id: bytes, run_id: str, f: dict) -> None:
        table, segment_id, body = _text(f.get("table")), _text(f.get("segment")), f.get("data") or b""
        try:
            schema(table)  # what the HTTP route's path checks
        except KeyError as exc:
            raise ValueError(f"table: {exc.args[0]}") from None
        c = self.collector
        if c.segment_exists(run_id, table, segment_id):  # stored by an instance that died before acknowledging
            c.count_duplicate()
            self._count("duplicate")
            self._done(entry_id)
            return
        deadline = time.monotonic() + UNKNOWN_RUN_WAIT_S
        while not c.has_run(run_id):
            if time.monotonic() >= deadline:
                raise _Later(f"run {run_id!r} is not open yet")
            self._stop.wait(0.05)
        while True:  # the write budget is the backpressure: wait for room rather than refuse
            try:
                held = _Held(c, _decode_cost("arrow", len(body), True))
                break
            except CollectorBusy:
                if self._stop.wait(0.1):
                    raise _Later("stopping") from None
        try:
            data = _decode_batch(table, body, "arrow", held, c.max_request_bytes)
        except BaseException:
            held.release()
            raise
        fut = c.submit(run_id, table, segment_id, data, reserved=held.nbytes)  # releases the budget if it refuses
        fut.add_done_callback(lambda done: self._written(entry_id, done))

    def _written(self, entry_id: bytes, fut) -> None:
        if fut.exception() is not None:  # left pending: claimed and tried again once idle
            self._count("later")
            log.warning("stream entry %s: writing failed (%s); left pending", _text(entry_id), fut.exception())
            return
        self._count("duplicate" if fut.result().duplicate else "stored")
        self._done(entry_id)

    def _done(self, entry_id: bytes) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.xack(self.stream, GROUP, entry_id)
        pipe.xdel(self.stream, entry_id)
        pipe.execute()

    def _reject(self, entry_id: bytes, f: dict, why: str) -> None:
        log.warning("stream entry %s (%s %s/%s) refused: %s", _text(entry_id), _text(f.get("op")),
                    _text(f.get("run")), _text(f.get("table")), why)
        kept = {k: v for k, v in f.items() if v is not None}
        self._redis.xadd(rejected_stream(self.stream), {**kept, "entry": entry_id, "error": why,
                                                        "consumer": self.consumer})
        self._count("rejected")
        self._done(entry_id)

    def _count(self, key: str) -> None:
        with self._stats_lock:
            self.stats[key] += 1


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else ("" if v is None else str(v))
