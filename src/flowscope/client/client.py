"""The producer-side API: buffered, non-blocking emission of canonical records to a collector.

Each producing thread packs its records into its own buffer per table (see
packer.py). A full buffer is turned into an Arrow batch by the thread that filled
it; a builder thread does the same for buffers older than ``flush_interval``.
Sender threads deliver the batches. When the collector is busy a sender retries
with backoff, then spools; when it cannot be reached the sender spools at once,
probes the collector every second and replays the spool when it is back. Memory
is bounded: at most ``max_buffer_records`` records wait to be sent, and a thread
whose buffer is full waits for room (it slows down, it does not lose records).
``close()`` delivers (or spools) everything.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import re
import secrets
import sys
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from flowscope.client import span_recorder
from flowscope.client.packer import Packer, recorder
from flowscope.client.spool import Spool, default_spool_dir, replay
from flowscope.client.transport import (
    TOKEN_ENV,
    Busy,
    HttpTransport,
    Instance,
    Rejected,
    Unreachable,
    general_instances,
    pick_instance,
    read_instances,
)
from flowscope.model import identifiers as ids
from flowscope.model.conform import SchemaError, conform
from flowscope.model.provenance import (
    check_open_request,
    check_run_id,
    collect_provenance,
    new_run_id,
    now_ns,
)

log = logging.getLogger("flowscope.client")
#: what a closed client's ``_local`` is: a thread-local that lives as long as the process (see Client.close)
_CLOSED_LOCAL = threading.local()

EMBEDDED = "embedded"


class FlowscopeError(RuntimeError):
    """Records could not be delivered or were refused; the message says where they are kept."""


#: publications' batches a sender takes from its queue at once, to send those of one table together
MAX_COALESCED = 64


def coalesce(items: list[tuple], max_rows: int) -> list[list[tuple]]:
    """Queued batches ``(table, segment id, data[, future])`` grouped for sending: the publications (those with a
    future) of one table merge, in queue order, into groups of at most ``max_rows`` rows, sent as one batch under
    the first one's segment id; every other batch goes alone. Groups keep the order of their first batch."""
    groups: list[list[tuple]] = []
    rows: list[int] = []
    accepting: dict[str, int] = {}  # table -> the group its next publication may join
    for it in items:
        if len(it) > 3:
            k = accepting.get(it[0])
            if k is not None and rows[k] + it[2].num_rows <= max_rows:
                groups[k].append(it)
                rows[k] += it[2].num_rows
                continue
            accepting[it[0]] = len(groups)
        groups.append([it])
        rows.append(it[2].num_rows)
    return groups


#: addresses reached through a Redis stream (client/redis_transport.py) rather than a collector's HTTP
REDIS_SCHEMES = ("redis://", "rediss://")


class Client:
    """Connects producers to a collector and one run.

    ``address``: ``http://host:port`` of a collector, or None / "embedded" for a collector in
    this process writing to ``store`` (default $FLOWSCOPE_STORE or ./flowscope-runs): that one is
    ``flowscope.Client``'s (flowscope/embedded.py), since this class knows collectors by address only.
    ``address_file``: a file listing several collector instances (``flowscope serve
    --address-file``); the client picks one round-robin. $FLOWSCOPE_ADDRESS,
    $FLOWSCOPE_ADDRESS_FILE and $FLOWSCOPE_RUN are used when the arguments are not given, so
    child processes join their parent's run. A client that created its run closes it.
    ``token``: what a collector bound beyond loopback requires on every request; default the token next
    to the picked address in the address file, else $FLOWSCOPE_TOKEN.
    ``flush_interval``: seconds a record may wait in this process before it is sent (looked at four times an
    interval: a record waits at most 1.25 times it); ``live_flush_interval`` (None: the same) the shorter wait
    while a page of the collector's dashboard follows the run (each acknowledgement says whether one does), so
    that the page shows the run within about that much.
    ``compiled``: record spans with the compiled recorder (client/span_recorder.py; the default when it is built,
    unless $FLOWSCOPE_COMPILED is 0) or, False, with the pure-Python packer; both store the same rows.
    """

    def __init__(self, address: str | None = None, *, address_file: str | Path | None = None,
                 store: str | Path | None = None,
                 run_id: str | None = None, name: str | None = None, command: str | list[str] | None = None,
                 meta: dict | None = None, flush_records: int = 65_536, flush_interval: float = 1.0,
                 live_flush_interval: float | None = None,
                 max_buffer_records: int = 500_000, spool_dir: str | Path | None = None,
                 busy_timeout: float = 30.0, senders: int = 2, serve: bool = False,
                 collector_options: dict | None = None, token: str | None = None, compiled: bool | None = None):
        if isinstance(command, list):
            command = " ".join(command)
        if compiled is None:
            compiled = span_recorder.AVAILABLE and os.environ.get("FLOWSCOPE_COMPILED", "1") != "0"
        self.compiled = bool(compiled)
        if self.compiled:  # Client.span on this instance: the C recorder (the class attribute is the pure-Python one)
            self.span = span_recorder.new_recorder(self._spans_buffer)
        # refused here, in the producer's call, rather than by the collector once the threads run
        check_open_request({"name": name, "command": command, **(meta or {})})
        listed_token = None  # the token written next to the address in an address file
        #: the collector instances of the address file this client picked from (namespaces go to theirs)
        self.instances: list[Instance] = []
        if not address:
            if not address_file and not os.environ.get("FLOWSCOPE_ADDRESS"):
                address_file = os.environ.get("FLOWSCOPE_ADDRESS_FILE") or None
            if address_file:
                self.instances = read_instances(address_file)
                picked = pick_instance(self.instances)
                address, listed_token = picked.address, picked.token
            elif os.environ.get("FLOWSCOPE_ADDRESS"):
                address = os.environ["FLOWSCOPE_ADDRESS"]
            else:
                address = EMBEDDED
        self._auth_token = token or listed_token or os.environ.get(TOKEN_ENV) or None
        self._embedded = None  # the collector in this process, when there is one (flowscope/embedded.py)
        if address == EMBEDDED:
            self._embedded = self._embed(store, collector_options or {}, serve, token)
            shared = self._embedded.transport
            self._new_transport = lambda: shared
            if serve:
                # on loopback: a token only when this client was given one (the simulator's workers send none)
                self._auth_token = token
            self.address = self._embedded.address
        elif address.startswith(REDIS_SCHEMES):  # through a Redis stream to the collectors consuming it
            # imported here: a process that sends over HTTP or to an embedded collector does not hold its module
            from flowscope.client.redis_transport import RedisTransport

            self.address = RedisTransport(address).address
            self._new_transport = lambda: RedisTransport(self.address)
        else:
            self.address = HttpTransport(address).address
            self._new_transport = lambda: HttpTransport(self.address, token=self._auth_token or "")
        self._transport = self._new_transport()  # for open, close and replay (under _control_lock)
        if self.address == EMBEDDED:
            self._probe = None
        elif self.address.startswith(REDIS_SCHEMES):
            from flowscope.client.redis_transport import RedisTransport

            self._probe = RedisTransport(self.address, timeout=2.0)
        else:
            self._probe = HttpTransport(self.address, timeout=2.0, token=self._auth_token or "")

        given = run_id or (os.environ.get("FLOWSCOPE_RUN") if address != EMBEDDED else None)
        self.run_id = check_run_id(given) if given else new_run_id()
        self.owns_run = given is None
        self.flush_records = int(flush_records)
        self.flush_interval = float(flush_interval)
        self.live_flush_interval = float(live_flush_interval) if live_flush_interval is not None else None
        self.watched = False  # the last acknowledgement said a dashboard page follows the run
        self.builder_wakes = 0  # times the builder looked for records due (tests/test_cli_embedded.py)
        self.max_buffer_records = max(int(max_buffer_records), self.flush_records)
        self.busy_timeout = float(busy_timeout)
        self.spool = Spool(spool_dir if spool_dir is not None else default_spool_dir())
        self.stats = {"records": 0, "batches_sent": 0, "batches_spooled": 0, "batches_replayed": 0,
                      "rows_rejected": 0, "busy_retries": 0}
        self.errors: list[str] = []
        self._token = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._seq = itertools.count()
        self._packers: list[Packer] = []
        self._packers_lock = threading.Lock()
        self._wake = threading.Event()
        self._flush_requests: queue.Queue = queue.Queue()
        # batches waiting to be sent: together with one open batch per thread and table, this bounds memory
        self._sendq: queue.Queue = queue.Queue(maxsize=max(2, self.max_buffer_records // self.flush_records))
        self._progress = threading.Condition()  # guards the two counters below and stats
        self._enqueued = 0   # batches handed to the senders
        self._settled = 0    # batches delivered, spooled or refused
        self._opened = threading.Event()
        self._offline_since: float | None = None
        self._closed = False
        self._local = threading.local()
        self._control_lock = threading.Lock()
        self._known_resources: set[str] = set()
        self._namespaces: list = []  # client/namespaces.py: flushed first when the client closes
        self._joined: dict[str, Client] = {}  # address -> a client joined to this run there, for namespaces
        self._round_robin = 0  # the next instance a namespace no instance claims goes to
        #: what a thread's resource, declared by its first record, nests in: called on that thread, it returns a
        #: resource id, or None for the thread's process (a Dask worker's plugin: the worker, for its task threads)
        self.thread_parent: Callable[[], str | None] | None = None

        # only a client that opens the run sends its metadata (a joining one, such as a Dask plugin's, skips the cost)
        self._meta = {"run_id": self.run_id, "name": name, "command": command, "start_ns": now_ns(),
                      **({"provenance": collect_provenance()} if self.owns_run or self._embedded is not None else {}),
                      **(meta or {})}
        if not (self.owns_run or self._embedded is not None):
            self._opened.set()  # joining a run that exists: nothing to open
        self._builder = threading.Thread(target=self._build_loop, name="flowscope-builder", daemon=True)
        # Two senders, each with its own connection: one waits for an acknowledgement while the other sends.
        self._senders = [threading.Thread(target=self._send_loop, args=(i,), name=f"flowscope-sender-{i}",
                                          daemon=True) for i in range(max(1, int(senders)))]
        self._builder.start()
        for t in self._senders:
            t.start()

    def _embed(self, store: str | Path | None, collector_options: dict, serve: bool, token: str | None):
        """The collector in this process an address-less client writes to (an object with ``transport``,
        ``address``, ``run_dir(run_id)``, ``post_data_states(run_id, states, mutations)`` and ``stop()``).
        ``flowscope.Client`` starts one; this class, which reaches collectors by address, has none."""
        raise FlowscopeError("no collector address: give one (or set $FLOWSCOPE_ADDRESS or $FLOWSCOPE_ADDRESS_FILE); "
                             "flowscope.Client runs a collector in this process when there is none")

    # ---- where the run lives ---------------------------------------------------------------
    @property
    def run_dir(self) -> Path | None:
        """The run's directory when the collector is embedded (None for a remote collector)."""
        return self._embedded.run_dir(self.run_id) if self._embedded else None

    def env(self) -> dict[str, str]:
        """Environment variables that make a child process's Client join this run."""
        if self.address == EMBEDDED:
            raise FlowscopeError("an embedded collector without serve=True cannot be reached by other processes")
        env = {"FLOWSCOPE_ADDRESS": self.address, "FLOWSCOPE_RUN": self.run_id}
        if self._auth_token:
            env[TOKEN_ENV] = self._auth_token
        return env

    # ---- emission ----------------------------------------------------------------------------
    def _packer(self, table: str) -> Packer:
        """The calling thread's packer for ``table``; a thread's first record also declares its resource."""
        local = self._local
        try:
            return local.packers[table]
        except AttributeError:
            local.packers = {}
            self.thread_resource()
            return self._packer(table)
        except KeyError:
            pass
        if table == "spans" and self.compiled:
            p = span_recorder.SpanBuffer(threading.current_thread(), flush_rows=self.flush_records,
                                         on_full=self._full, rid=local.rid)
        else:
            p = Packer(table, owner=threading.current_thread(), flush_rows=self.flush_records, on_full=self._full)
            p.rid = local.rid
            setattr(local, f"{table}_state", p.state())  # what the generated span() unpacks
        with self._packers_lock:
            self._packers.append(p)
        local.packers[table] = p
        setattr(local, table, p)  # metric() and log() read it as an attribute: the fastest lookup
        return p

    def _spans_buffer(self) -> span_recorder.SpanBuffer:
        """The calling thread's span buffer, for the compiled recorder (on the thread's first span)."""
        return self._packer("spans")

    def _state(self, table: str) -> tuple:
        """The calling thread's buffers for ``table`` as the generated recorders unpack them (first record)."""
        return self._packer(table).state()

    def _full(self, p: Packer) -> None:
        """A thread's batch reached the flush size: that thread turns it into Arrow and queues it.

        Doing it here rather than waking the builder means one call per batch instead of one per
        record until the builder runs; queueing blocks while the send queue is full, which is what
        slows a producer down when the collector cannot keep up (memory stays bounded)."""
        data = p.take(reset=True)
        if data is not None:
            self._enqueue(p.table, data)

    def row_writer(self, table: str):
        """A function recording one row of ``table`` from positional values in column order (see
        ``flowscope.TABLES[table].names``): the fastest way to record from a hot path. It writes
        to the buffer of the thread that calls it; values are checked as they are recorded."""
        p = self._packer(table)
        if table == "spans" and self.compiled:
            return self.span.row  # it finds the calling thread's buffer itself
        p.keep = True  # the function may outlive its thread: the builder keeps the buffer it writes to

        def elsewhere(*values: Any) -> None:
            self._packer(table).add(*values)

        return p.writer(elsewhere)

    def add_buffer(self, buffer: Any) -> None:
        """Have the builder take batches from ``buffer`` too, as it does from each thread's own buffers: for a
        producer on a hot path that keeps its rows in a form of its own (a list of tuples) and turns them into
        Arrow a batch at a time. ``buffer`` has ``table``, ``flush_rows``, ``len()`` (rows waiting) and ``take()``
        (those rows as an Arrow table of ``table``'s canonical schema, or None), which runs on the builder's
        thread while producers go on adding; it is taken from until the client closes."""
        buffer.since, buffer.owner, buffer.keep = 0.0, None, True
        with self._packers_lock:
            self._packers.append(buffer)

    def emit(self, table: str, **fields: Any) -> None:
        """Append one record to ``table``; fields are the table's columns (docs/data-model.md).

        Raises SchemaError, naming the column, if the record does not fit the table."""
        p = self._packer(table)
        keys = fields.keys()
        if not keys <= p.colset:
            bad = sorted(keys - p.colset)
            raise SchemaError(table, f"unknown column(s) {bad}; columns are {', '.join(p.columns)}", bad[0])
        p.add(*map(fields.get, p.columns))

    # Client.span is the per-record hot path: generated from the spans schema like Packer.add, it checks and
    # buffers the values itself instead of calling the thread's Packer.add (one call less per record).
    span = recorder(
        "spans", "name: str, start_ns: int, end_ns: int, *, kind: str = 'call', resource_id: str | None = None, "
                 "task_key: str | None = None, attrs: dict | str | None = None, span_id: int | None = None, "
                 "parent_id: int | None = None",
        {c: c for c in ("span_id", "parent_id", "resource_id", "kind", "name", "start_ns", "end_ns", "task_key",
                        "attrs")},
        ["    resource_id = resource_id or rid"],
        doc="Record an interval [start_ns, end_ns] on a resource (default: the calling thread).",
        state_attr="spans_state", first="_state")

    @contextmanager
    def timed(self, name: str, *, kind: str = "call", **kw: Any):
        """Record the enclosed block as a span."""
        t0 = time.time_ns()
        try:
            yield
        finally:
            self.span(name, t0, time.time_ns(), kind=kind, **kw)

    def metric(self, name: str, value: float, *, namespace: str = "application", resource_id: str | None = None,
               ts_ns: int | None = None) -> None:
        """Record one sample of a named metric."""
        try:
            p = self._local.metrics
        except AttributeError:
            p = self._packer("metrics")
        p.add(ts_ns or time.time_ns(), resource_id or self.process_resource(), namespace, name, value)

    def log(self, message: str, *, level: str = "info", category: str = "application",
            resource_id: str | None = None, task_key: str | None = None, attrs: dict | None = None,
            ts_ns: int | None = None) -> None:
        """Record one log event."""
        try:
            p = self._local.logs
        except AttributeError:
            p = self._packer("logs")
        p.add(ts_ns or time.time_ns(), resource_id or p.rid, level, category, message, task_key, attrs)

    def resource(self, kind: str, resource_id: str, *, name: str | None = None, parent_id: str | None = None,
                 host: str | None = None, pid: int | None = None, tid: int | None = None,
                 thread_ident: int | None = None, address: str | None = None, attrs: dict | None = None,
                 start_ns: int | None = None) -> str:
        """Declare a resource once (later calls with the same id are ignored) and return its id."""
        if resource_id not in self._known_resources:
            self.emit("resources", resource_id=resource_id, kind=kind, name=name or resource_id,
                      parent_id=parent_id, host=host, pid=pid, tid=tid, thread_ident=thread_ident,
                      address=address, start_ns=start_ns or time.time_ns(), attrs=attrs)
            self._known_resources.add(resource_id)
        return resource_id

    def process_resource(self) -> str:
        """This process's resource id, declared (with its host) on first use."""
        rid = ids.process_id()
        if rid not in self._known_resources:
            host = ids.hostname()
            self.resource("host", ids.host_id(), name=host, host=host)
            self.resource("process", rid, name=f"{host}:{os.getpid()}", parent_id=ids.host_id(),
                          host=host, pid=os.getpid(), attrs={"argv": sys.argv[:8]})
        return rid

    def thread_resource(self) -> str:
        """The calling thread's resource id, declared (with its process and host) on first use."""
        rid = getattr(self._local, "rid", None)
        if rid is None:
            self._local.rid = ids.thread_id()  # set first: declaring it emits through this thread's packers
            host = ids.hostname()
            self.process_resource()
            t = threading.current_thread()
            parent = (self.thread_parent() if self.thread_parent is not None else None) or ids.process_id()
            rid = self.resource("thread", ids.thread_id(), name=t.name, parent_id=parent, host=host,
                                pid=os.getpid(), tid=threading.get_native_id(), thread_ident=threading.get_ident())
            self._local.rid = rid
        return rid

    def write(self, table: str, data: pa.Table | pa.RecordBatch | Any) -> None:
        """Queue a whole batch (Arrow table/batch, pandas DataFrame, or dict of columns); validated now. Dictionary-
        encoded strings and an ``attrs`` struct travel as they are and are decoded by the collector."""
        if not isinstance(data, (pa.Table, pa.RecordBatch)):
            if isinstance(data, dict):
                data = pa.table(data)
            else:
                data = pa.Table.from_pandas(data, preserve_index=False)
        self._enqueue(table, conform(table, data, decode=False))

    def _enqueue(self, table: str, data: pa.Table) -> None:
        with self._progress:
            self.stats["records"] += data.num_rows
        parts = max(1, round(data.num_rows / self.flush_records))  # equal parts, no tiny remainder
        size = -(-data.num_rows // parts)
        for off in range(0, max(data.num_rows, 1), size or 1):
            with self._progress:
                self._enqueued += 1
            self._sendq.put((table, self._segment_id(), data.slice(off, size)))

    def _segment_id(self) -> str:
        return f"{self._token}-{next(self._seq):08d}"

    def send_acknowledged(self, table: str, data: pa.Table) -> list[tuple[str, Future]]:
        """Queue a canonical table for the senders in batches of at most ``flush_records`` rows, each with a
        Future of what became of it: "stored" (acknowledged by the collector), "spooled" (kept on local disk),
        or "rejected: why" (kept in the spool's rejected/ folder). Returns (segment id, Future) per batch. Batches
        queued together for one table may travel as one (:func:`coalesce`): before a Future resolves, its
        ``segment`` is set to the id its rows were stored under, which may be an earlier batch's."""
        with self._progress:
            self.stats["records"] += data.num_rows
        out = []
        for off in range(0, max(data.num_rows, 1), self.flush_records):
            fut: Future = Future()
            seg = self._segment_id()
            with self._progress:
                self._enqueued += 1
            self._sendq.put((table, seg, data.slice(off, self.flush_records), fut))
            out.append((seg, fut))
        return out

    # ---- namespaces (client/namespaces.py) ----------------------------------------------------------
    def namespace(self, name: str, *, publish_every: int = 1, blocking: bool = True,
                  resource_id: str | None = None):
        """A :class:`~flowscope.client.namespaces.Namespace` publishing records into this run (SOMA's
        ``soma_create_namespace``): every ``publish_every``-th commit publishes, blocking or not. Closing the
        client publishes what its namespaces hold."""
        from flowscope.client.namespaces import Namespace

        ns = Namespace(self._namespace_client(name), name, publish_every=publish_every, blocking=blocking,
                       resource_id=resource_id or self.process_resource())
        with self._packers_lock:
            self._namespaces.append(ns)
        return ns

    def _namespace_client(self, name: str) -> Client:
        """The client that publishes namespace ``name``: this one, or one joined to this run on the instance of the
        address file that serves ``name`` (else, for a namespace no instance claims, the next of the instances
        claiming none, round-robin)."""
        if len(self.instances) < 2:
            return self
        claimed = [i for i in self.instances if i.namespaces and i.serves(name)]
        if claimed:
            target = claimed[0]
        else:
            pool = general_instances(self.instances)
            target = pool[self._round_robin % len(pool)]
            self._round_robin += 1
        if target.address == self.address:
            return self
        with self._control_lock:
            joined = self._joined.get(target.address)
            if joined is None:
                joined = self._joined[target.address] = Client(
                    target.address, run_id=self.run_id, token=target.token or self._auth_token,
                    flush_records=self.flush_records, flush_interval=self.flush_interval,
                    live_flush_interval=self.live_flush_interval, busy_timeout=self.busy_timeout,
                    # a spool of its own: two clients replaying one folder would race for its files
                    spool_dir=self.spool.root / "by-instance" / re.sub(r"[^A-Za-z0-9.-]", "_", target.address),
                    compiled=self.compiled)
        return joined

    def analyze(self, namespace: str, request: dict) -> dict:
        """Have the collector run ``request`` (``sql``, or ``reduce`` with ``name`` and ``by``) over
        ``namespace``'s rows of this run (``POST /v1/runs/{run}/namespaces/{namespace}/analyze``) and return
        ``{"columns", "rows"}``. NamespaceError names a refused field."""
        from flowscope.model.namespaces import NamespaceError, check_namespace

        check_namespace(namespace)
        self._opened.wait()  # the sender thread opens the run
        if self._embedded is not None:
            return self._embedded.analyze(self.run_id, namespace, request)
        body = json.dumps(request).encode()
        transport = getattr(self._local, "ns_transport", None)
        if transport is None:  # one kept-alive connection per thread
            transport = self._local.ns_transport = self._http_transport("analyze()")
        status, doc = transport._request("POST", f"/v1/runs/{self.run_id}/namespaces/{namespace}/analyze", body,
                                         {"Content-Type": "application/json"})
        if 400 <= status < 500 and status != 429:
            raise NamespaceError(doc.get("field") or "request", doc.get("message") or doc.get("error", "refused"))
        return transport._check(status, doc)

    # ---- data states and mutations (client/data_states.py) ------------------------------------
    def data_states(self, batch: int = 1):
        """A :class:`~flowscope.client.data_states.DataStates` recorder for this run; ``batch`` records are
        delivered per request (1: each call is delivered, and checked by the collector, at once)."""
        from flowscope.client.data_states import DataStates

        if batch == 1:
            ds = getattr(self, "_data_states", None)
            if ds is None:
                ds = self._data_states = DataStates(self)
            return ds
        return DataStates(self, batch=batch)

    def state(self, state_id: str | None = None, **fields: Any) -> str:
        """Record a data state now (see DataStates.state) and return its id."""
        return self.data_states().state(state_id, **fields)

    def mutation(self, src: str, dst: str, kind: str, **fields: Any) -> str:
        """Record a data mutation now (see DataStates.mutation) and return its id."""
        return self.data_states().mutation(src, dst, kind, **fields)

    def post_data_states(self, states: list[dict], mutations: list[dict]) -> dict:
        """Deliver states and mutations synchronously, all or nothing; DataStateError names a refused field."""
        from flowscope.client.data_states import DataStateError

        self._opened.wait()  # the sender thread opens the run
        if self._embedded is not None:
            return self._embedded.post_data_states(self.run_id, states, mutations)
        body = json.dumps({"states": states, "mutations": mutations}, default=str).encode()
        transport = getattr(self._local, "ds_transport", None)
        if transport is None:  # one kept-alive connection per thread
            transport = self._local.ds_transport = self._http_transport("data states")
        status, doc = transport._request("POST", f"/v1/runs/{self.run_id}/states", body,
                                         {"Content-Type": "application/json"})
        if status == 422:
            raise DataStateError(doc.get("table") or "data_states", doc.get("field") or "?",
                                 doc.get("message") or doc.get("error", "refused"), doc.get("record"))
        return transport._check(status, doc)

    def _http_transport(self, what: str) -> HttpTransport:
        """A connection to the collector for a request that needs its answer (``what`` needs it)."""
        if self.address.startswith(REDIS_SCHEMES):
            raise ValueError(f"{what} asks the collector and waits for its answer: it needs a collector's HTTP "
                             f"address, and this client sends through Redis ({self.address})")
        return HttpTransport(self.address, token=self._auth_token or "")

    # ---- builder: packers -> Arrow batches --------------------------------------------------
    def _due(self, p: Packer, force: bool, now: float) -> bool:
        n = len(p)
        if not n:
            p.since = 0.0
            return False
        if not p.since:
            p.since = now
        interval = self.live_flush_interval if self.watched and self.live_flush_interval is not None \
            else self.flush_interval
        return force or n >= p.flush_rows or now - p.since >= interval

    def _build_loop(self) -> None:
        while True:
            # a quarter of the time a record may wait now: a record is sent within 1.25 of it, and an idle client
            # (a program publishing every few seconds) wakes 4 times an interval, not every 0.1 s; a full batch
            # does not wait for it (its own thread queues it, _full)
            interval = self.live_flush_interval if self.watched and self.live_flush_interval is not None \
                else self.flush_interval
            self._wake.wait(interval / 4)
            self._wake.clear()
            self.builder_wakes += 1
            requests = []
            while True:
                try:
                    requests.append(self._flush_requests.get_nowait())
                except queue.Empty:
                    break
            force = bool(requests)
            now = time.monotonic()
            with self._packers_lock:
                packers = list(self._packers)
            due: dict[str, list[pa.Table]] = {}
            for p in packers:
                if self._due(p, force, now):
                    data = p.take()
                    p.since = 0.0
                    if data is not None:
                        due.setdefault(p.table, []).append(data)
                if not len(p) and p.owner is not None and not p.keep and not p.owner.is_alive():
                    with self._packers_lock:  # the thread is gone and so is its data
                        self._packers.remove(p)
            # one batch per table, not per thread: fewer, larger segments for a run with many threads
            for table, parts in due.items():
                self._enqueue(table, pa.concat_tables(parts) if len(parts) > 1 else parts[0])
            for req in requests:
                if req is None:  # stop
                    return
                with self._progress:
                    req.target = self._enqueued
                req.set()

    # ---- sender: batches -> collector (or spool) ---------------------------------------------
    def _go_offline(self, why: Exception) -> None:
        if self._offline_since is None:
            self._offline_since = time.monotonic()
            log.warning("flowscope collector unreachable (%s); spooling to %s", why, self.spool.run_dir(self.run_id))

    def _count(self, key: str, n: int = 1) -> None:
        with self._progress:
            self.stats[key] += n

    def _to_spool(self, table: str, seg: str, data: pa.Table) -> None:
        self.spool.save_open(self.run_id, self._meta)
        self.spool.save_batch(self.run_id, table, seg, data)
        self._count("batches_spooled")

    def _replay_own(self, busy_timeout: float) -> bool:
        """Probe the collector if offline, then replay this run's spool; True when the spool is empty."""
        with self._control_lock:
            return self._replay_locked(busy_timeout)

    def _replay_locked(self, busy_timeout: float) -> bool:
        try:
            if self._offline_since is not None:
                self._probe.health()
            rep = replay(self.spool.root, self._transport, run_id=self.run_id, busy_timeout=busy_timeout)
        except (Unreachable, OSError) as exc:
            self._go_offline(exc)
            return False
        except Busy:
            return False
        self._count("batches_replayed", rep.batches)
        for path, why in rep.failed:
            self.errors.append(f"{path}: {why}")
        if self._offline_since is not None:
            log.warning("flowscope collector back; replayed %d spooled batch(es)", rep.batches)
        self._offline_since = None
        return not self.spool.has_pending(self.run_id)

    def _deliver(self, transport, table: str, seg: str, data: pa.Table) -> str:
        """Send one batch; what became of it: "stored", "spooled" or "rejected: why"."""
        if self._offline_since is not None:
            self._to_spool(table, seg, data)
            return "spooled"
        deadline, pause = time.monotonic() + self.busy_timeout, 0.02
        while True:
            try:
                ack = transport.send(self.run_id, table, seg, data)
                self.watched = bool(ack.get("watched")) if isinstance(ack, dict) else False
                self._count("batches_sent")
                return "stored"
            except Busy:
                self._count("busy_retries")
                if time.monotonic() >= deadline:
                    self._to_spool(table, seg, data)
                    return "spooled"
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
            except Unreachable as exc:
                self._go_offline(exc)
                self._to_spool(table, seg, data)
                return "spooled"
            except Rejected as exc:
                path = self.spool.run_dir(self.run_id) / "rejected"
                path.mkdir(parents=True, exist_ok=True)
                self.spool.save_batch(self.run_id, f"rejected/{table}", seg, data)
                msg = f"collector refused a {table} batch of {data.num_rows} rows ({exc}); kept in {path}"
                self.errors.append(msg)
                self._count("rows_rejected", data.num_rows)
                log.warning(msg)
                return f"rejected: {msg}"

    def _open_run(self) -> None:
        with self._control_lock:
            try:
                self._transport.open_run(self._meta)
            except (Unreachable, Busy) as exc:
                self._go_offline(exc)
                self.spool.save_open(self.run_id, self._meta)
            except Rejected as exc:
                self.errors.append(f"collector refused to open run {self.run_id}: {exc}")
        self._opened.set()

    def _send_loop(self, index: int) -> None:
        transport = self._new_transport()
        if index == 0 and not self._opened.is_set():
            self._open_run()
        self._opened.wait()
        try:
            while True:
                try:
                    item = self._sendq.get(timeout=1.0)
                except queue.Empty:
                    if index == 0 and (self._offline_since is not None or self.spool.has_pending(self.run_id)):
                        self._replay_own(busy_timeout=1.0)
                    continue
                if item is None:
                    return
                if self._offline_since is not None and time.monotonic() - self._offline_since > 1.0:
                    self._replay_own(busy_timeout=1.0)
                items = [item]
                if len(item) > 3:  # a publication: those queued behind it may travel with it
                    while len(items) < MAX_COALESCED:
                        try:
                            items.append(self._sendq.get_nowait())
                        except queue.Empty:
                            break
                        if items[-1] is None:
                            break
                stop = items[-1] is None
                for group in coalesce(items[:-1] if stop else items, self.flush_records):
                    self._send_group(transport, group)
                if stop:
                    return
        finally:
            if transport is not self._transport:
                transport.close()

    def _send_group(self, transport, group: list[tuple]) -> None:
        """Deliver one batch, or several publications' batches of one table as one (:func:`coalesce`); each
        publication's future gets ``segment``, the id its rows were stored or spooled under, then the outcome."""
        table, seg = group[0][0], group[0][1]
        outcome = "spooled"
        try:
            data = group[0][2] if len(group) == 1 else pa.concat_tables([g[2] for g in group])
            outcome = self._deliver(transport, table, seg, data)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the batches are kept, each under its own id
            seg = None
            for g in group:
                self._to_spool(table, g[1], g[2])
            log.warning("delivering a %s batch failed (%s: %s); spooled", table, type(exc).__name__, exc)
        finally:
            for g in group:
                if len(g) > 3:
                    g[3].segment = seg or g[1]
                    g[3].set_result(outcome)
            with self._progress:
                self._settled += len(group)
                self._progress.notify_all()

    # ---- lifecycle -----------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Deliver (or spool) everything emitted so far; True if done within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        req = threading.Event()
        req.target = 0
        self._flush_requests.put(req)
        self._wake.set()
        if not req.wait(timeout):
            return False
        with self._progress:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return self._progress.wait_for(lambda: self._settled >= req.target, left)

    def close(self, status: str = "finished", timeout: float | None = None, end_ns: int | None = None) -> None:
        """Flush, close the run if this client opened it, stop the threads. ``end_ns``: the run's end (default
        now; a simulator gives its simulated end). Raises FlowscopeError if records were refused or are left
        in the spool."""
        if self._closed:
            return
        for ns in list(self._namespaces):  # pending commits (and uncommitted updates) are published first
            try:
                ns.flush(timeout)
            except Exception as exc:  # noqa: BLE001 - reported below, the rest still closes
                self.errors.append(f"namespace {ns.name}: {exc}")
        self.flush(timeout)
        for joined in list(self._joined.values()):  # their rows are delivered before the run is closed
            try:
                joined.close(timeout=timeout)
            except FlowscopeError as exc:
                self.errors.append(f"{joined.address}: {exc}")
        if self._offline_since is not None or self.spool.has_pending(self.run_id):
            self._replay_own(busy_timeout=self.busy_timeout)
        if self.owns_run:
            info = {"end_ns": now_ns() if end_ns is None else int(end_ns), "status": status}
            if self._offline_since is not None or self.spool.has_pending(self.run_id):
                self.spool.save_close(self.run_id, info)
            else:
                try:
                    with self._control_lock:
                        self._transport.close_run(self.run_id, info)
                except (Unreachable, Busy) as exc:
                    self._go_offline(exc)
                    self.spool.save_open(self.run_id, self._meta)
                    self.spool.save_close(self.run_id, info)
        self._flush_requests.put(None)
        self._wake.set()
        self._builder.join(timeout)
        for _ in self._senders:
            self._sendq.put(None)
        for t in self._senders:
            t.join(timeout)
        self._closed = True
        # this client's per-thread state goes now, by reference counting: left to a garbage collection, a
        # threading.local can deadlock CPython 3.11 when the collection starts inside sys._current_frames(),
        # which Dask's worker profiler calls every 10 ms (cpython#106883: both take the thread list lock)
        self._local = _CLOSED_LOCAL
        self._transport.close()
        if self._embedded:
            self._embedded.stop()
        pending = self.spool.pending(self.run_id)
        spooled_dir = self.spool.run_dir(self.run_id)
        if not pending and (spooled_dir / "close.json").exists():
            self.errors.append(f"the run's open and close could not be delivered and are kept in {spooled_dir}; "
                               f"deliver them with `flowscope ingest-spool {spooled_dir} --address ADDRESS`")
        if pending:
            self.errors.append(f"{len(pending)} batch(es) could not be delivered and are kept in "
                               f"{self.spool.run_dir(self.run_id)}; deliver them with "
                               f"`flowscope ingest-spool {self.spool.run_dir(self.run_id)} --address ADDRESS`")
        if self.errors:
            raise FlowscopeError("; ".join(self.errors))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(status="failed" if exc_type else "finished")
