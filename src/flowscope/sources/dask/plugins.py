"""Dask.distributed scheduler and worker plugins that record a run's task provenance into the canonical tables.

Scheduler side: every transition, the task graph as it arrives (dependencies per
``update_graph``), task errors (exception type only), workers and clients joining
and leaving. Worker side: every worker transition, execution spans on the OS
thread that ran the task (with result size), the other startstops (transfer,
disk-read, disk-write) as spans of their own kind, inter-worker transfers, and
warnings (event loop unresponsive, memory pause/spill, long GC pauses) as logs.

Each plugin owns a :class:`flowscope.Client` that joins the run at ``address``.
Dask swallows exceptions raised in plugin hooks, so each hook counts its own
failures (``errors``) instead of failing silently; tests assert they stay at 0.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from concurrent.futures import Executor
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from distributed.utils import key_split_group

from flowscope.model import arrow_values
from flowscope.model import identifiers as ids
from flowscope.model import schemas as _schemas
from flowscope.model.conform import conform
from flowscope.model.semantics import PROCESS_MEMORY, PROCESS_MEMORY_MANAGED, PROCESS_MEMORY_SPILLED
from flowscope.sources import semantics as _semantics
from flowscope.sources.thread_io import AGGREGATE_JSON as AGG
from flowscope.sources.thread_io import OpenAudit, ThreadIO, ThreadIOReader, thread_ids

log = logging.getLogger("flowscope.dask")

#: what this source's rows mean to the analyses (model/semantics.py)
SEMANTICS = _semantics.DASK_DISTRIBUTED
_time_ns = time.time_ns
_time = time.time

SCHEDULER_RESOURCE = "scheduler"
_EXC_TYPE = re.compile(r"^\s*([A-Za-z_][\w.]*)")
_UNRESPONSIVE = re.compile(r"Event loop was unresponsive in (\w+) for ([0-9.]+)s")


def key_str(key: Any) -> str:
    """A Dask key as text (tuple keys as their repr, as the dashboard shows them)."""
    return key if isinstance(key, str) else str(key)


def exception_type(text: str | None) -> str | None:
    """The exception's type name from Dask's exception text, without the message (it may hold data)."""
    if not text:
        return None
    m = _EXC_TYPE.match(text)
    return m.group(1) if m else None


#: seconds a plugin's records wait before they are sent: FLUSH_S while nobody watches the run, LIVE_FLUSH_S while
#: a dashboard page follows it (a batch every 0.2 s per worker keeps the page within Dask's own dashboard's pace)
FLUSH_S = 2.0
LIVE_FLUSH_S = 0.2


def _client(address: str, run_id: str):
    from flowscope.client.client import Client

    return Client(address, run_id=run_id, flush_interval=FLUSH_S, live_flush_interval=LIVE_FLUSH_S)


class _LogCapture(logging.Handler):
    """Turns Dask's warnings into logs rows: event loop unresponsive, memory pause/spill."""

    LOGGERS = ("distributed.core", "distributed.worker.memory", "distributed.nanny.memory")

    def __init__(self, fs, resource_id: str):
        super().__init__(logging.INFO)
        self.fs = fs
        self.resource_id = resource_id

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            attrs: dict[str, Any] = {"logger": record.name}
            if record.name == "distributed.core":
                m = _UNRESPONSIVE.match(msg)
                if not m:
                    return
                category = "event-loop-unresponsive"
                attrs.update(server=m.group(1), duration_s=float(m.group(2)))
            elif "Pausing worker" in msg:
                category = "memory-pause"
            elif "Resuming worker" in msg:
                category = "memory-resume"
            elif "memory" in record.name:
                category = "memory"
            else:
                return
            self.fs.log(msg.split("  ")[0], level=record.levelname.lower(), category=category,
                        resource_id=self.resource_id, attrs=attrs, ts_ns=int(record.created * 1e9))
        except Exception:  # never let logging break Dask
            pass

    def attach(self) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)

    def detach(self) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)


class _GCWatch:
    """Records garbage-collector pauses longer than ``threshold_s`` as logs rows (category gc)."""

    def __init__(self, fs, resource_id: str, threshold_s: float = 0.05):
        self.fs, self.resource_id, self.threshold_s = fs, resource_id, threshold_s
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        if took >= self.threshold_s:
            try:
                self.fs.log(f"gc generation {info.get('generation')} took {took:.3f}s", level="warning",
                            category="gc", resource_id=self.resource_id,
                            attrs={"duration_s": took, "generation": info.get("generation"),
                                   "collected": info.get("collected")})
            except Exception:
                pass

    def attach(self) -> None:
        gc.callbacks.append(self)

    def detach(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def _stop_recording(plugin, what: str) -> None:
    """Detach a plugin's log and GC watchers and close its client, which delivers what it still holds."""
    plugin._logs.detach()
    plugin._gc.detach()
    fs, plugin.fs = plugin.fs, None
    try:
        fs.close(timeout=30)
    except Exception:
        log.exception("flowscope %s plugin: closing its client failed", what)


def _text(values: list) -> pa.Array:
    """A string array of ``values``: str or None, anything else as its str() (as the row writers store a key)."""
    try:
        return arrow_values.texts(values)
    except (TypeError, pa.ArrowException):
        return arrow_values.texts([v if v is None or v.__class__ is str else str(v) for v in values])


def _repeat(value: str | None, n: int) -> pa.Array:
    """A string array of ``n`` times ``value``."""
    return _text([value]).take(pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.zeros(n, np.int32))]))


class TransitionRows:
    """Transitions as a hook sees them, one tuple each -- (time ns, key, group or None, prefix, from, to, worker
    address or None, stimulus id) -- turned into ``transitions`` rows a batch at a time by the client's builder
    thread (``Client.add_buffer``). What a row needs beyond what the hook has at hand is made there, once per
    distinct value in the batch rather than on every transition on the event loop: the key as text, the worker's
    resource id and, with ``groups_from_keys`` (a worker's hook, which has no task group), the group from the key.
    Any thread may append to ``rows``; ``take`` cuts the rows it converts off the front of the list (one atomic
    operation), so rows appended meanwhile stay for the next batch."""

    table = "transitions"
    _schema = _schemas.schema("transitions")

    def __init__(self, flush_rows: int, observer: str, groups_from_keys: bool = False,
                 on_error: Callable[[], None] | None = None):
        self.flush_rows = flush_rows
        self.observer = observer
        self.groups_from_keys = groups_from_keys
        self.on_error = on_error  # called (inside the except block) when a batch cannot be made; it is dropped
        self.rows: list[tuple] = []
        self._wids: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, reset: bool = False) -> pa.Table | None:
        """The rows appended so far as a ``transitions`` table (None if none), removed from ``rows``."""
        rows = self.rows
        n = len(rows)
        if not n:
            return None
        batch = rows[:n]
        del rows[:n]
        try:
            return self._to_arrow(batch)
        except Exception:  # on the builder's thread, which must go on: the plugin counts it as a failed hook
            if self.on_error is not None:
                self.on_error()
            return None

    def _to_arrow(self, batch: list[tuple]) -> pa.Table:
        # Few distinct values per column (a key has about five transitions in a batch; states, groups and workers
        # repeat): each column is built from its distinct values and an int32 code per row, as the client's packer
        # does, which costs far less than turning every row's Python strings into Arrow.
        n = len(batch)
        ts_ns, keys, groups, prefixes, starts, finishes, workers, stimuli = zip(*batch)
        if self.groups_from_keys:
            named: dict = {}
            groups = [named.get(k) or named.setdefault(k, key_split_group(k)) for k in keys]
        key_codes, key_values = _codes(keys)
        texts = [k if k.__class__ is str else str(k) for k in key_values]
        combo_codes, combos = _codes(zip(groups, prefixes, starts, finishes, workers))
        stim_codes, stim_values = _codes(stimuli)
        wids = self._wids
        group_v, prefix_v, start_v, finish_v, worker_v = (list(c) for c in zip(*combos))
        worker_v = [None if not w else wids.get(w) or wids.setdefault(w, ids.worker_id(w)) for w in worker_v]
        combo_idx = _indices(combo_codes, n)
        return conform(self.table, pa.Table.from_arrays([
            arrow_values.fixed(pa.int64(), np.fromiter(ts_ns, dtype=np.int64, count=n)),
            _text(texts).take(_indices(key_codes, n)),
            _text(group_v).take(combo_idx), _text(prefix_v).take(combo_idx), _text(start_v).take(combo_idx),
            _text(finish_v).take(combo_idx), _repeat(self.observer, n), _text(worker_v).take(combo_idx),
            _text(stim_values).take(_indices(stim_codes, n)), pa.nulls(n, pa.string())], schema=self._schema))


def _codes(values) -> tuple[list[int], list]:
    """(a code per value, the distinct values in order of first appearance)."""
    seen: dict = {}
    codes = [seen.setdefault(v, len(seen)) for v in values]
    return codes, list(seen)


def _indices(codes: list[int], n: int) -> pa.Array:
    return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.fromiter(codes, dtype=np.int32, count=n))])


class FlowscopeSchedulerPlugin(SchedulerPlugin):
    """Records scheduler-side provenance of a run."""

    name = "flowscope-scheduler"

    def __init__(self, address: str, run_id: str):
        self.address = address
        self.run_id = run_id
        self.errors = 0
        # hook calls after close() and before Dask removes the plugin (observe closes it first, to flush
        # and count errors): nothing to record them into, so they do nothing and are counted here
        self.late_hooks = 0
        self.finished = 0  # transitions out of processing: tasks this run saw run (or fail, or move)
        self.fs = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self.fs = _client(self.address, self.run_id)
        fs = self.fs
        fs.resource("scheduler", SCHEDULER_RESOURCE, name=scheduler.address, parent_id=fs.process_resource(),
                    host=ids.hostname(), pid=os.getpid(), address=scheduler.address)
        self._logs = _LogCapture(fs, SCHEDULER_RESOURCE)
        self._logs.attach()
        self._gc = _GCWatch(fs, SCHEDULER_RESOURCE)
        self._gc.attach()
        self._transitions = TransitionRows(fs.flush_records, "scheduler", on_error=self._failed)
        fs.add_buffer(self._transitions)
        self._append = self._transitions.rows.append
        self._tasks_get = scheduler.tasks.get
        for addr in list(scheduler.workers):
            self.add_worker(scheduler, addr)

    def _failed(self) -> None:
        self.errors += 1
        if self.errors <= 3:
            log.exception("flowscope scheduler hook failed")

    def transition(self, key, start, finish, *args, stimulus_id=None, worker=None, **kwargs) -> None:
        # the hottest hook (about 5 calls per task, on the scheduler's event loop, which is what a graph of tiny
        # tasks waits for): one tuple appended; the row's text (the key as text, the worker's id) is made a batch
        # at a time on the client's builder thread (TransitionRows.take)
        if self.fs is None:
            self.late_hooks += 1
            return
        try:
            ts = self._tasks_get(key)
            if ts is not None:
                if worker is None:
                    ws = ts.processing_on
                    if ws is not None:
                        worker = ws.address
                self._append((_time_ns(), key, ts.group.name, ts.prefix.name, start, finish, worker, stimulus_id))
            else:
                self._append((_time_ns(), key, None, None, start, finish, worker, stimulus_id))
            if start == "processing":
                self.finished += 1
                if finish != "erred":
                    return
                etype = exception_type(kwargs.get("exception_text"))
                wid = ids.worker_id(worker) if worker else None
                self.fs.log(f"task failed with {etype or 'an exception'}", level="error", category="task-error",
                            resource_id=wid or SCHEDULER_RESOURCE, task_key=key_str(key),
                            attrs={"exception_type": etype})
        except Exception:
            self._failed()

    def log_event(self, topic, msg) -> None:
        """Dask's work stealing moves a task between workers without a transition; its 'confirm' event is
        recorded as one: processing -> processing onto the thief (the victim is the task's previous worker)."""
        if topic != "stealing" or self.fs is None:
            return
        try:
            if isinstance(msg, (tuple, list)) and len(msg) >= 6 and msg[0] == "confirm":
                _, key, _, _victim, thief, stimulus_id = msg[:6]
                ts = self._tasks_get(key)
                self._append((_time_ns(), key, ts.group.name if ts is not None else None,
                              ts.prefix.name if ts is not None else None, "processing", "processing", thief,
                              stimulus_id))
        except Exception:
            self._failed()

    def update_graph(self, scheduler, *, client=None, keys=None, tasks=None, stimulus_id=None, **kwargs) -> None:
        if self.fs is None:
            self.late_hooks += 1
            return
        try:
            now = time.time_ns()
            get = scheduler.tasks.get
            dependents, depends_on = [], []
            for key in tasks or ():
                ts = get(key)
                if ts is None or not ts.dependencies:
                    continue
                k = key_str(key)
                for dep in ts.dependencies:
                    dependents.append(k)
                    depends_on.append(dep.key)
            if dependents:  # the graph's edges as one batch, built column by column
                n = len(dependents)
                texts: dict = {}
                self.fs.write("dependencies", pa.Table.from_arrays([
                    _repeat(stimulus_id, n),
                    _text(dependents),
                    _text([k if k.__class__ is str else texts.get(k) or texts.setdefault(k, str(k))
                           for k in depends_on]),
                    arrow_values.fixed(pa.int64(), np.full(n, now, dtype=np.int64))],
                    names=["graph_id", "task_key", "depends_on", "ts_ns"]))
            self.fs.log(f"graph of {len(tasks or ())} tasks from {client}", category="graph-submitted",
                        resource_id=SCHEDULER_RESOURCE,
                        attrs={"graph_id": stimulus_id, "tasks": len(tasks or ()), "client": client})
        except Exception:
            self._failed()

    def add_worker(self, scheduler, worker: str) -> None:
        if self.fs is None:
            self.late_hooks += 1
            return
        try:
            ws = scheduler.workers.get(worker)
            # host and parent are left to the worker's own plugin, which knows its hostname and process
            self.fs.resource("worker", ids.worker_id(worker), name=str(ws.name) if ws is not None else worker,
                             pid=getattr(ws, "pid", None), address=worker,
                             attrs={"nthreads": ws.nthreads, "memory_limit": ws.memory_limit} if ws else None)
            self.fs.log(f"worker {worker} joined", category="worker-joined", resource_id=ids.worker_id(worker))
        except Exception:
            self._failed()

    def remove_worker(self, scheduler, worker: str, *, stimulus_id=None, **kwargs) -> None:
        if self.fs is None:
            self.late_hooks += 1
            return
        try:
            now = time.time_ns()
            self.fs.emit("resources", resource_id=ids.worker_id(worker), kind="worker", end_ns=now)
            self.fs.log(f"worker {worker} left", category="worker-left", resource_id=ids.worker_id(worker),
                        ts_ns=now, attrs={"stimulus_id": stimulus_id})
        except Exception:
            self._failed()

    def add_client(self, scheduler, client: str) -> None:
        if self.fs is None:
            self.late_hooks += 1
            return
        try:
            self.fs.resource("client", f"client:{client}", name=client, parent_id=SCHEDULER_RESOURCE)
            self.fs.log(f"client {client} connected", category="client-joined", resource_id=f"client:{client}")
        except Exception:
            self._failed()

    def remove_client(self, scheduler, client: str) -> None:
        if self.fs is None:
            self.late_hooks += 1
            return
        try:
            self.fs.emit("resources", resource_id=f"client:{client}", kind="client", end_ns=time.time_ns())
            self.fs.log(f"client {client} left", category="client-left", resource_id=f"client:{client}")
        except Exception:
            self._failed()

    def flush(self, timeout: float = 30.0) -> bool:
        return self.fs.flush(timeout) if self.fs else True

    async def close(self) -> None:
        if self.fs is None:
            return
        _stop_recording(self, "scheduler")


_PROC_IO_LABELS = len(b"rchar: \nwchar: \nsyscr: \nsyscw: \nread_bytes: \nwrite_bytes: \ncancelled_write_bytes: \n")
_WORKER_FINISH = frozenset(("memory", "error", "released", "forgotten"))


class MeasuringThreadPoolExecutor(Executor):
    """Delegates to the worker's executor; each call records its thread's I/O counter delta.

    The counters are read once per call, on the calling thread, when the call ends: a thread runs one
    call at a time, so the reading at the end of its previous call is the baseline of the next (a
    thread seen for the first time is read before its first call too). The read keeps the GIL (see
    ThreadIOReader); the call's delta is worked out only when a task is matched to the call.

    ``window(ident, submitted, start, stop)`` finds the delta of the call that ran a given task.
    The name matters: Dask runs a task through its thread-aware path (contextvars, active_threads)
    only when "ThreadPoolExecutor" appears in the executor's type name."""

    def __init__(self, inner: Executor, reader: ThreadIOReader, keep: int = 16):
        self.inner = inner
        self._reader = reader
        self._keep = keep
        self._last: dict[int, ThreadIO] = {}
        self._windows: dict[int, deque] = {}

    def submit(self, fn, /, *args, **kwargs):
        return self.inner.submit(self._measured, fn, args, kwargs)

    def _measured(self, fn, args, kwargs):
        ident = threading.get_ident()
        if ident not in self._windows:
            self._windows[ident] = deque(maxlen=self._keep)
            tid = threading.get_native_id()
            first = self._reader.read(tid)
            if first is not None:
                self._last[tid] = first
        t0 = time.time()
        result = None
        try:
            result = fn(*args, **kwargs)
            return result
        finally:
            t1 = time.time()
            tid = threading.get_native_id()
            now = self._reader.read(tid)
            before = self._last.get(tid)
            if now is not None:
                self._last[tid] = now
                if before is not None:  # the delta is worked out only for the call a task is matched to
                    # Dask's task message carries the compute times it will store: the exact key of this call
                    reported = None
                    if isinstance(result, dict):
                        reported = (result.get("start"), result.get("stop"))
                    self._windows[ident].append((t0, t1, before, now, reported))

    def window(self, ident: int | None, submitted: float | None, start: float,
               stop: float, reported: tuple[float, float] | None = None) -> tuple[float, float, ThreadIO] | None:
        """The call on thread ``ident`` that ran a task submitted at ``submitted`` whose compute interval is about
        [start, stop] (all in this process's clock), as (its start, its end, its I/O counter delta): the call
        whose result reported the task's compute times exactly as Dask stored them (``reported``, offset
        included), else, of the calls that began after the submission, the one whose middle is nearest. Dask's
        own times carry an estimate of the offset to the scheduler's clock that moves with each heartbeat, so
        matching on time alone can take a neighbouring call when the machine is busy."""
        # a copy: the thread may append while we look (iterating a deque being appended to raises)
        calls = tuple(self._windows.get(ident, ()))
        if reported is not None:
            for c in reversed(calls):
                if c[4] == reported:
                    return c[0], c[1], c[3] - c[2] - _own_read(c[2])
        floor = (submitted - 0.001) if submitted is not None else float("-inf")
        mid2 = start + stop
        best, best_d = None, float("inf")
        for c in reversed(calls):  # newest first: the call sought is almost always the last or the one before
            if c[0] < floor:
                break
            d = abs(c[0] + c[1] - mid2)
            if d < best_d:
                best, best_d = c, d
            elif c[1] * 2 < mid2 - best_d:  # this call and every older one ends too early to be nearer
                break
        if best is None:
            return None
        return best[0], best[1], best[3] - best[2] - _own_read(best[2])

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)

    def __getattr__(self, name: str):  # _threads, _max_workers and the like: the inner executor's
        return getattr(self.inner, name)


CLOCKS = ("auto", "local", "scheduler")


def check_clock(clock: str | None) -> str:
    """The clock worker records are written in: ``clock``, or Dask's setting ``flowscope.clock`` when None
    (default ``auto``). ``scheduler``: Dask's times as Dask reports them, moved to the scheduler's clock by the
    worker's estimate of the offset; ``local``: the worker's own clock; ``auto``: ``local`` on the scheduler's host
    (one clock: the estimate is only noise there), ``scheduler`` elsewhere."""
    if clock is None:
        import dask

        clock = dask.config.get("flowscope.clock", "auto")
    if clock not in CLOCKS:
        raise ValueError(f"flowscope.clock must be one of {', '.join(CLOCKS)}, not {clock!r}")
    return clock


_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def _on_schedulers_host(worker) -> bool:
    """Whether ``worker`` runs on its scheduler's host: the scheduler's address is a loopback one, the worker's
    own, or in-process."""
    address = str(worker.scheduler.address)
    scheme, _, rest = address.rpartition("://")
    if scheme == "inproc":
        return True
    host = rest.rsplit(":", 1)[0] if rest.count(":") == 1 or rest.startswith("[") else rest
    own = worker.address.split("://")[-1].rsplit(":", 1)[0]
    return host.startswith(_LOOPBACK) or host == own


class _WorkerCapture(WorkerPlugin):
    """What both capture levels record on a worker: its resource and threads, warnings (Dask's logs, long GC
    pauses), opened files, and, in one worker process per host, the host's hardware every ``hardware_period``
    s. The level's own part is installed by ``_install`` and removed by ``_uninstall``."""

    name = "flowscope-worker"
    level = "?"

    def __init__(self, address: str, run_id: str, hardware_period: float = 1.0, clock: str | None = None):
        self.address = address
        self.run_id = run_id
        self.hardware_period = hardware_period
        self.clock = check_clock(clock)
        self.errors = 0
        self.fs = None

    def setup(self, worker) -> None:
        self.worker = worker
        self.fs = fs = _client(self.address, self.run_id)
        self.rid = ids.worker_id(worker.address)
        host = ids.hostname()
        fs.resource("worker", self.rid, name=str(worker.name), parent_id=fs.process_resource(), host=host,
                    pid=os.getpid(), address=worker.address,
                    attrs={"nthreads": worker.state.nthreads, "memory_limit": worker.memory_manager.memory_limit})
        self._host = worker.address.split("://")[-1].rsplit(":", 1)[0]
        self._local_clock = self.clock == "local" or (self.clock == "auto" and _on_schedulers_host(worker))
        # called with (prefix, key, start_ns, end_ns, thread ident) of each task span as it is recorded: the
        # anomaly detector judges the spans this plugin records, on the same clock (anomaly_plugin.py)
        self.span_listeners: list[Callable[[str, str, int, int, int | None], None]] = []
        self._threads: dict[int, str] = {}  # pthread ident -> thread resource id
        # a task's thread may record before its first task span is written (a GC pause logged from inside the
        # task): declared by that record, it is still the worker's
        fs.thread_parent = self._executor_parent
        # what tasks already on the worker did before this run began is not this run's: a task computed
        # earlier and released during the run must not bring its old compute span along
        self._startstops_done: dict[Any, int] = {key: len(ts.startstops) for key, ts in
                                                 list(worker.state.tasks.items()) if ts.startstops}
        self._last_transfer: dict | None = worker.transfer_incoming_log[-1] if worker.transfer_incoming_log else None
        self._emit_span = fs.row_writer("spans")
        self._emit_transfer = fs.row_writer("transfers")
        self._emit_io = fs.row_writer("io")
        self._worker_json = json.dumps(worker.address)
        self._hostname, self._pid = ids.hostname(), os.getpid()
        self._logs = _LogCapture(fs, self.rid)
        self._logs.attach()
        self._gc = _GCWatch(fs, self.rid)
        self._gc.attach()
        # Per-task I/O is read on the thread that runs the task: the worker's executor is wrapped so that
        # the calls it runs read their own thread's counters. Reading them from the event loop instead is
        # racy: Dask may start the next task on a thread before it has handled the completion of that
        # thread's previous one.
        self._io_reader = ThreadIOReader()
        self._native: dict[int, int] = {}
        # worker.handle_stimulus is wrapped by both levels (full: to note the stimulus id; standard: to record
        # each execution and fetch as Dask reports it done)
        self._handle_stimulus = worker.__dict__.get("handle_stimulus")  # another wrapper already there, if any
        self._install(worker)
        self._audit = OpenAudit(self._record_open, exclude=[sys.prefix, sys.base_prefix, *sys.path[1:2]])
        self._audit.enable()
        self._sampler = self._lease = self._lease_retry = self._memory_sampling = None
        if self.hardware_period > 0:
            from tornado.ioloop import PeriodicCallback

            self._try_lease()
            if self._sampler is None:  # another process samples this host; take over if it goes away
                self._lease_retry = PeriodicCallback(self._try_lease, self.hardware_period * 1000)
                self._lease_retry.start()
            # every worker process samples its own memory (the host sampler sees the host's only)
            self._process = psutil.Process()
            self._sample_memory()
            self._memory_sampling = PeriodicCallback(self._sample_memory, self.hardware_period * 1000)
            self._memory_sampling.start()

    def _sample_memory(self) -> None:
        """One sample of this worker process's memory, on the worker's resource: its resident size, and of the
        data Dask holds the part in memory (managed) and the part spilled to disk, as Dask's dashboard counts
        them (its worker metrics: managed = nbytes less what was spilled, spilled = the bytes on disk)."""
        try:
            ts = time.time_ns()
            self.fs.metric(PROCESS_MEMORY, float(self._process.memory_info().rss), namespace="performance",
                           resource_id=self.rid, ts_ns=ts)
            try:
                spilled_memory, spilled_disk = self.worker.data.spilled_total
            except AttributeError:  # spilling is disabled: a plain dict
                spilled_memory, spilled_disk = 0, 0
            self.fs.metric(PROCESS_MEMORY_MANAGED, float(max(0, self.worker.state.nbytes - spilled_memory)),
                           namespace="performance", resource_id=self.rid, ts_ns=ts)
            self.fs.metric(PROCESS_MEMORY_SPILLED, float(spilled_disk), namespace="performance",
                           resource_id=self.rid, ts_ns=ts)
        except Exception:
            self._failed()

    def _try_lease(self) -> None:
        """Become this host's hardware sampler for the run if no other process is."""
        try:
            from flowscope.sources.hardware import HardwareSampler, acquire_host_lease

            if self._sampler is not None or self.fs is None:
                return
            lease = acquire_host_lease(run_id=self.run_id)
            if lease is None:
                return
            self._lease, self._sampler = lease, HardwareSampler(self.fs, self.hardware_period).start()
            if self._lease_retry is not None:
                self._lease_retry.stop()
        except Exception:
            self._failed()

    def _record_open(self, row: dict) -> None:
        """An open seen by the audit hook, on the thread that opened: attributed to that thread's task."""
        row["task_key"] = key_str(self.worker.active_threads[row["thread_ident"]]) \
            if row.get("thread_ident") in self.worker.active_threads else None
        row["resource_id"] = self._threads.get(row.get("thread_ident")) or row.get("resource_id")
        self.fs.emit("io", **row)

    def _failed(self) -> None:
        self.errors += 1
        if self.errors <= 3:
            log.exception("flowscope worker hook failed")

    def _native_tid(self, ident: int | None) -> int | None:
        tid = self._native.get(ident)
        if tid is None and ident is not None:
            tid = self._native[ident] = thread_ids().get(ident)
        return tid

    def _record_task_io(self, k: str | None, ident: int | None, tid: int, t0: int, t1: int, delta: ThreadIO,
                        calls: int | None = None) -> None:
        """The task's I/O rows, over its call [t0, t1] in this process's clock (as every io row). ``calls``: how many
        executor calls the delta covers (level standard, where shorter calls are charged to the next measured one)."""
        rid = self._threads.get(ident) or ids.thread_id(tid)
        tasks = f', "tasks": {calls}' if calls is not None else ""
        if delta.rchar or delta.syscr or delta.read_bytes:
            self._emit_io(rid, self._hostname, self._pid, tid, ident, None, "proc-io", "read", None, None,
                          delta.rchar, t0, t1, k,
                          f'{{"syscr": {delta.syscr}, "read_bytes": {delta.read_bytes}, {AGG}"ops": {delta.syscr}{tasks}}}')
        if delta.wchar or delta.syscw or delta.write_bytes or delta.cancelled_write_bytes:
            self._emit_io(rid, self._hostname, self._pid, tid, ident, None, "proc-io", "write", None, None,
                          delta.wchar, t0, t1, k,
                          f'{{"syscw": {delta.syscw}, "write_bytes": {delta.write_bytes}, '
                          f'"cancelled_write_bytes": {delta.cancelled_write_bytes}, {AGG}"ops": {delta.syscw}{tasks}}}')

    def _executor_parent(self) -> str | None:
        """The worker's resource id when the calling thread is one of its executors' threads, else None."""
        ident = threading.get_ident()
        for ex in list(self.worker.executors.values()):
            if any(t.ident == ident for t in list(getattr(ex, "_threads", ()))):
                return self.rid
        return None

    def _thread_resource(self, ident: int | None) -> str:
        rid = self._threads.get(ident)
        if rid is None:
            native = next((t.native_id for t in threading.enumerate() if t.ident == ident), None)
            name = next((t.name for t in threading.enumerate() if t.ident == ident), None)
            rid = ids.thread_id(native if native is not None else ident)
            self.fs.resource("thread", rid, name=name, parent_id=self.rid, host=ids.hostname(), pid=os.getpid(),
                             tid=native, thread_ident=ident)
            self._threads[ident] = rid
        return rid

    def _recorded(self, start: float, stop: float) -> tuple[int, int]:
        """Dask's times of a transfer or spill, which it moved by the worker's current offset estimate, in the
        clock the records use."""
        if self._local_clock:
            shift = self.worker.scheduler_delay
            start, stop = start - shift, stop - shift
        return int(start * 1e9), int(stop * 1e9)

    def _drain_transfers(self) -> None:
        """Record the worker's incoming transfers logged since the last call (one row per fetch message).

        The log is a bounded deque; it is drained on every transition out of ``flight``, which follows
        each fetch, so no entry ages out unseen."""
        log = self.worker.transfer_incoming_log
        new = []
        for entry in reversed(log):
            if entry is self._last_transfer:
                break
            new.append(entry)
        if not new:
            return
        self._last_transfer = new[0]
        for e in reversed(new):
            who = e.get("who")
            src_host = who.split("://")[-1].rsplit(":", 1)[0] if who else None
            self._emit_transfer(None, "dask-fetch", ids.worker_id(who) if who else "unknown", self.rid,
                                int(e.get("total") or 0), *self._recorded(e["start"], e["stop"]),
                                [key_str(k) for k in e.get("keys", ())],
                                {"inter_host": src_host != self._host, "bandwidth_bytes_per_s": e.get("bandwidth"),
                                 "nbytes_per_key": {key_str(k): v for k, v in e.get("keys", {}).items()}})

    def flush(self, timeout: float = 30.0) -> bool:
        return self.fs.flush(timeout) if self.fs else True

    def teardown(self, worker) -> None:
        if self.fs is None:
            return
        self._audit.disable()
        if worker.__dict__.get("handle_stimulus") is self._stimulus_wrapper:  # not if wrapped again since
            if self._handle_stimulus is not None:
                worker.handle_stimulus = self._handle_stimulus
            else:
                del worker.handle_stimulus
        if worker.executors.get("default") is self._executor:
            worker.executors["default"] = self._executor.inner
        try:
            self._uninstall(worker)
        except Exception:
            self._failed()
        self._io_reader.close()
        if self._memory_sampling is not None:
            self._memory_sampling.stop()
            self._sample_memory()  # the memory it ended with
        if self._lease_retry is not None:
            self._lease_retry.stop()
        if self._sampler is not None:
            self._sampler.stop()
            self._lease.release()
        _stop_recording(self, "worker")


class FlowscopeWorkerPlugin(_WorkerCapture):
    """Level ``full``: every worker transition as a row (through Dask's per-transition hook), execution spans
    on OS threads (with result size), the other startstops (transfer, disk-read, disk-write) as spans of their
    own kind, inter-worker transfers, and each task's own I/O, however short the task."""

    level = "full"

    def _install(self, worker) -> None:
        transitions = TransitionRows(self.fs.flush_records, self.rid, groups_from_keys=True, on_error=self._failed)
        self.fs.add_buffer(transitions)
        self._append = transitions.rows.append
        self._address = worker.address
        self._tasks = worker.state.tasks
        self._executor = MeasuringThreadPoolExecutor(worker.executors["default"], self._io_reader)
        worker.executors["default"] = self._executor
        # Dask calls a worker plugin's transition hook without the stimulus id. Every stimulus reaches the
        # worker's state machine through worker.handle_stimulus, which is wrapped to note the stimulus being
        # handled; the state machine's own stimulus log covers a call with several stimuli (it logs each
        # before handling it, except find-missing, which Dask always sends alone).
        self._stimulus_id: str | None = None
        self._stimulus_log = worker.state.stimulus_log
        worker.handle_stimulus = self._stimulus_wrapper = self._noting_stimulus(worker.handle_stimulus)

    def _uninstall(self, worker) -> None:
        pass

    def _noting_stimulus(self, handle_stimulus):
        def noting(*stims):
            self._stimulus_id = stims[0].stimulus_id if len(stims) == 1 else None
            return handle_stimulus(*stims)

        noting.__wrapped__ = handle_stimulus
        return noting

    def _logged_stimulus(self) -> str | None:
        """The stimulus the state machine logged last: the one being handled when a call carried several."""
        try:
            return self._stimulus_log[-1].stimulus_id
        except (IndexError, AttributeError):
            return None

    def _task_call(self, ident: int | None, submitted: float | None, start: float,
                   stop: float) -> tuple[float, ThreadIO | None]:
        """The offset Dask added to this process's clock in a task's compute times [start, stop], and the I/O
        counter delta of the executor call that ran it (None when unknown).

        Dask stamps a task with the worker's ``scheduler_delay`` as it was when the task was submitted; a
        heartbeat may have moved it since. The call's local window brackets the compute interval, so the
        offset lies in [stop - call end, start - call start]: the current estimate, moved into that
        range when a heartbeat took it out."""
        shift = self.worker.scheduler_delay
        call = self._executor.window(ident, submitted, start - shift, stop - shift, reported=(start, stop))
        if call is None:
            return shift, None
        c0, c1, delta = call
        lo, hi = stop - c1, start - c0
        if lo <= hi:
            shift = min(max(shift, lo), hi)
        return shift, delta

    def transition(self, key, start, finish, **kwargs) -> None:
        # about 6 calls per task on the worker's event loop: one tuple appended; the key as text and its group are
        # made a batch at a time on the client's builder thread (TransitionRows.take)
        try:
            ts = self._tasks.get(key)
            # Dask passes the state it was asked for; the task may have gone elsewhere (executing -> released
            # leaves it cancelled) or stayed put (flight -> fetch while the fetch runs is a no-op): record the
            # state it reached, as Dask's own log does, and nothing when it did not move
            if ts is not None:
                finish = ts.state
                if finish == start:
                    return
            self._append((_time_ns(), key, None, ts.prefix if ts is not None else None, start, finish, self._address,
                          self._stimulus_id if self._stimulus_id is not None else self._logged_stimulus()))
            if start == "flight":
                self._drain_transfers()
            if ts is not None and finish in _WORKER_FINISH and len(ts.startstops) > self._startstops_done.get(key, 0):
                self._record_startstops(key, key if key.__class__ is str else str(key), ts, start, finish)
            if finish == "forgotten":
                self._startstops_done.pop(key, None)
        except Exception:
            self._failed()

    def _record_startstops(self, key, k: str, ts, start: str, finish: str) -> None:
        done = self._startstops_done.get(key, 0)
        new = ts.startstops[done:]
        if not new:
            return
        self._startstops_done[key] = len(ts.startstops)
        for ss in new:
            action = ss.get("action")
            if action == "compute":
                t0, t1 = int(ss["start"] * 1e9), int(ss["stop"] * 1e9)
                ident = self.worker.state.threads.get(key)
                nbytes = ts.nbytes
                offset, delta = self._task_call(ident, ts.start_time, ss["start"], ss["stop"])
                off = round(offset * 1e9)
                if self._local_clock:
                    t0, t1, off = t0 - off, t1 - off, 0
                # the attempt: Dask's run id, new each time the scheduler sends the task to a worker (a retry, a
                # recomputation after a lost worker); a failed attempt says why, by the exception's type only
                failed = f', "exception_type": {json.dumps(exception_type(ts.exception_text))}' \
                    if finish == "error" else ""
                attrs = (f'{{"nbytes": {nbytes if nbytes.__class__ is int else json.dumps(nbytes)}, '
                         f'"thread_ident": {ident if ident.__class__ is int else "null"}, '
                         f'"worker": {self._worker_json}, "state": "{finish}", "clock_offset_ns": {off}, '
                         f'"attempt_id": {ts.run_id if ts.run_id.__class__ is int else "null"}{failed}}}')
                self._emit_span(None, None, self._thread_resource(ident), "task", ts.prefix, t0, t1, k, attrs)
                for listener in self.span_listeners:
                    listener(ts.prefix, k, t0, t1, ident)
                if delta is not None:
                    tid = self._native_tid(ident)
                    if tid is not None:
                        self._record_task_io(k, ident, tid, t0 - off, t1 - off, delta)
            elif action == "transfer":  # Dask books a fetch on the task that needed the data
                t0, t1 = self._recorded(ss["start"], ss["stop"])
                self._emit_span(None, None, self.rid, "transfer", ts.prefix, t0, t1, k, {"source": ss.get("source")})
            else:  # disk-read, disk-write (spilling) and whatever Dask adds later
                t0, t1 = self._recorded(ss["start"], ss["stop"])
                self._emit_span(None, None, self.rid, str(action), ts.prefix, t0, t1, k, {"nbytes": ts.nbytes})


class ShortCallsDeferringThreadPoolExecutor(Executor):
    """Delegates to the worker's executor; reads the calling thread's I/O counters at the end of each call that
    took ``min_call_s`` or more (level ``standard``).

    A shorter call is only counted: its I/O is in the next reading on that thread, which carries the number of
    calls it covers. A reading is kept under the ``start`` of the task's result (the value Dask reports in the
    task's ExecuteSuccessEvent / ExecuteFailureEvent), so the event loop finds it by that key when Dask reports
    the task done. The name matters: see MeasuringThreadPoolExecutor."""

    MAX_KEPT = 65_536  # readings never claimed (a task Dask dropped): the oldest go

    def __init__(self, inner: Executor, reader: ThreadIOReader, min_call_s: float = 0.001):
        self.inner = inner
        self._reader = reader
        self._min = min_call_s
        self._last: dict[int, ThreadIO] = {}    # native tid -> the last reading on that thread
        self._last_t: dict[int, float] = {}     # native tid -> when it was taken
        self._pending: dict[int, int] = {}      # native tid -> calls since that reading
        self.readings: dict[float, tuple] = {}  # result start -> (call start, call end, tid, before, now, calls)

    def submit(self, fn, /, *args, **kwargs):
        return self.inner.submit(self._measured, fn, args, kwargs)

    def _measured(self, fn, args, kwargs):
        tid = threading.get_native_id()
        if tid not in self._last:
            first = self._reader.read(tid)
            if first is not None:
                self._last[tid] = first
                self._last_t[tid] = _time()
        t0 = _time()
        result = fn(*args, **kwargs)
        t1 = _time()
        if t1 - t0 < self._min:
            self._pending[tid] = self._pending.get(tid, 0) + 1
            return result
        now = self._reader.read(tid)
        before = self._last.get(tid)
        calls = self._pending.pop(tid, 0) + 1
        if now is not None:
            self._last[tid] = now
            self._last_t[tid] = t1
            if before is not None and result.__class__ is dict:
                readings = self.readings
                if len(readings) >= self.MAX_KEPT:
                    del readings[next(iter(readings))]
                readings[result.get("start")] = (t0, t1, tid, before, now, calls)
        return result

    def pending_readings(self) -> list[tuple[int, int, float, ThreadIO, ThreadIO]]:
        """(tid, calls, time of the last reading, last reading, reading now) of every thread with calls not yet
        charged to a reading."""
        out = []
        for tid, calls in list(self._pending.items()):
            before, now = self._last.get(tid), self._reader.read(tid)
            if calls and before is not None and now is not None:
                out.append((tid, calls, self._last_t[tid], before, now))
        self._pending.clear()
        return out

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _own_read(before: ThreadIO) -> ThreadIO:
    """What the read that gave ``before`` itself added to the counters of its thread: one read call and the text it
    returned, whose length follows from the values it showed."""
    return ThreadIO(rchar=_PROC_IO_LABELS + sum(len(str(v)) for v in before), syscr=1)


class _Absent:
    """A class attribute that instances do not have: ``hasattr(instance, name)`` is False. Dask's worker calls
    ``plugin.transition`` on every worker transition of every plugin that has one, and WorkerPlugin defines a
    no-op: this hides it."""

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        raise AttributeError("this plugin has no per-transition hook")


class FlowscopeStandardWorkerPlugin(_WorkerCapture):
    """Level ``standard`` (the default): no per-transition hook. Each execution is recorded when Dask reports it
    done (its ExecuteSuccessEvent / ExecuteFailureEvent, through worker.handle_stimulus) as a span on the OS thread
    that ran it, with the I/O of its call when the call took 1 ms or more (shorter calls' I/O is charged to the
    next measured call on the thread: the span says ``"io": "next"``, and the io rows of the call that carries it
    say how many calls they cover, ``"tasks"``); each fetch as transfers rows when Dask reports it done
    (GatherDep*Event). Worker transitions are not recorded: the scheduler's transitions give each task's
    lifecycle, with the worker that ran it."""

    level = "standard"
    MIN_CALL_S = 0.001
    transition = _Absent()  # no per-transition hook: Dask calls none on this plugin, not even WorkerPlugin's no-op

    def _install(self, worker) -> None:
        from distributed.worker_state_machine import (
            ExecuteFailureEvent,
            ExecuteSuccessEvent,
            GatherDepDoneEvent,
        )

        self._executor = ShortCallsDeferringThreadPoolExecutor(worker.executors["default"], self._io_reader,
                                                               self.MIN_CALL_S)
        worker.executors["default"] = self._executor
        self._success, self._failure, self._gathered = ExecuteSuccessEvent, ExecuteFailureEvent, GatherDepDoneEvent
        self._tasks = worker.state.tasks
        self._readings = self._executor.readings
        worker.handle_stimulus = self._stimulus_wrapper = self._recording(worker.handle_stimulus)

    def _recording(self, handle_stimulus):
        success, failure, gathered = self._success, self._failure, self._gathered
        tasks = self._tasks

        def recording(*stims):
            done = None
            for ev in stims:
                cls = ev.__class__
                if cls is success or cls is failure or isinstance(ev, gathered):
                    if done is None:
                        done = []
                    # the task as it is before Dask handles the event, which may forget it
                    done.append((ev, tasks.get(ev.key) if cls is not gathered and not isinstance(ev, gathered)
                                 else None))
            out = handle_stimulus(*stims)
            if done is not None:
                for ev, ts in done:
                    try:
                        if isinstance(ev, gathered):
                            self._drain_transfers()
                        else:
                            self._executed(ev, ts)
                    except Exception:
                        self._failed()
            return out

        recording.__wrapped__ = handle_stimulus
        return recording

    def _executed(self, ev, ts) -> None:
        """The execution Dask reports done in ``ev`` as a task span, and its call's I/O when it was measured."""
        start, stop = ev.start, ev.stop
        reading = self._readings.pop(start, None)
        if start is None or stop is None:  # failed before it ran: no execution to record
            return
        key = ev.key
        k = key if key.__class__ is str else str(key)
        ident = self.worker.state.threads.get(key)
        shift = self.worker.scheduler_delay
        if reading is not None:  # Dask's times are in the scheduler's clock: the offset lies in this range
            lo, hi = stop - reading[1], start - reading[0]
            if lo <= hi:
                shift = min(max(shift, lo), hi)
        off = round(shift * 1e9)
        t0, t1 = int(start * 1e9), int(stop * 1e9)  # on this process's clock: t0 - off, t1 - off
        failed = ev.__class__ is self._failure
        nbytes = None if failed else ev.nbytes
        prefix = ts.prefix if ts is not None else key_split_group(key)
        if ts is not None and len(ts.startstops) >= 1 + (not failed):
            ss = ts.startstops[-1 - (not failed)]  # Dask's read of spilled inputs, just before the compute
            if ss.get("action") == "disk-read":
                d0, d1 = self._recorded(ss["start"], ss["stop"])
                self._emit_span(None, None, self.rid, "disk-read", prefix, d0, d1, k, {"nbytes": ts.nbytes})
        if self._local_clock:
            t0, t1, off = t0 - off, t1 - off, 0
        extra = f', "exception_type": {json.dumps(exception_type(ev.exception_text))}' if failed else ""
        run_id = ev.run_id
        attrs = (f'{{"nbytes": {nbytes if nbytes.__class__ is int else json.dumps(nbytes)}, '
                 f'"thread_ident": {ident if ident.__class__ is int else "null"}, '
                 f'"worker": {self._worker_json}, "state": "{"error" if failed else "memory"}", '
                 f'"clock_offset_ns": {off}, "attempt_id": {run_id if run_id.__class__ is int else "null"}, '
                 f'"io": "{"own" if reading is not None else "next"}"{extra}}}')
        self._emit_span(None, None, self._thread_resource(ident), "task", prefix, t0, t1, k, attrs)
        for listener in self.span_listeners:
            listener(prefix, k, t0, t1, ident)
        if reading is not None:  # over the task's compute interval on this process's clock, as at level full
            tid, before, now, calls = reading[2:]
            self._record_task_io(k, ident, tid, t0 - off, t1 - off, now - before - _own_read(before), calls)

    def _uninstall(self, worker) -> None:
        """What calls too short to be read on their own did since their thread's last reading, as rows of no task."""
        now_ns = time.time_ns()
        for tid, calls, since, before, now in self._executor.pending_readings():
            self._record_task_io(None, None, tid, int(since * 1e9), now_ns, now - before - _own_read(before), calls)
