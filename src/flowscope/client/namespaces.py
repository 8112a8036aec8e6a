"""Publishing hierarchical records into namespaces, SOMA's client API in Python (docs/publish.md).

A :class:`Namespace` keeps a record (a Conduit-like tree) in the producer's memory. ``set`` overwrites a leaf,
``append`` adds to a leaf's list; both are local. ``commit`` closes the current update (SOMA's commit, akin to
closing a file) and counts it; every ``publish_every``-th commit publishes the record to the collector and
starts an empty one. Blocking, the publishing commit returns once the collector has stored the rows (they are
queryable when it returns); non-blocking, it returns a ``concurrent.futures.Future`` resolving to the same
acknowledgement. A commit that does not publish returns None, as SOMA's ``soma_commit_namespace_async`` returns
no response. Closing the namespace (or its client) publishes what is pending, uncommitted updates included.

The rows go through the client's senders (retry when the collector is busy, spool to disk when it is
unreachable), in their own segments: an acknowledgement names what happened to them.
"""

from __future__ import annotations

import atexit
import functools
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flowscope.model.namespaces import (
    APPEND,
    MODES,
    OVERWRITE,
    SEPARATOR,
    VALID_PATHS,
    NamespaceError,
    check_namespace,
    check_path,
    common_leaves,
    domain_of,
    leaves,
    tables,
)

if TYPE_CHECKING:
    from flowscope.client.client import Client

_MISSING = object()
#: a non-blocking publication waits this long for the next ones to travel with it (Kafka's ``linger.ms``): the rows
#: of publications close together go as one batch per table, one request and one segment, not one each; a blocking
#: publication, flush() and close() send what is held at once. None: as long as the client lets any record wait
#: (its ``flush_interval``, or ``live_flush_interval`` while a dashboard page follows the run), as spans do
LINGER_S: float | None = None
#: ... or until this many leaves are held
LINGER_LEAVES = 50_000


#: namespaces holding publications: at exit, what they hold is sent and waited for (EXIT_WAIT_S at most), so that a
#: program that ends without closing its client loses no more than it did before publications were held
_HOLDING: weakref.WeakSet = weakref.WeakSet()
EXIT_WAIT_S = 10.0


def _send_held_at_exit() -> None:
    futures = []
    for ns in list(_HOLDING):
        with ns._lock:
            futures += [h.future for h in ns._held]
            ns._send_held()
    deadline = time.monotonic() + EXIT_WAIT_S
    for f in futures:
        try:
            f.result(max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - nobody is left to tell; the client's spool keeps what it could not send
            pass


atexit.register(_send_held_at_exit)


@functools.lru_cache(maxsize=4096)
def _prefixes(path: str) -> tuple[str, ...]:
    """The paths above ``path`` (``a``, ``a/b`` for ``a/b/c``)."""
    keys = path.split(SEPARATOR)
    return tuple(SEPARATOR.join(keys[:i]) for i in range(1, len(keys)))


@dataclass
class _Held:
    """A non-blocking publication not sent yet: its leaves ((path, commit ts_ns, values, single)), commits, time, and
    the Future its commit returned."""

    parts: list
    commits: tuple[int, int]
    ts_ns: int
    future: Future


def _rows_of(parts: list) -> dict[str, int]:
    """Rows per table the leaves ``parts`` make (model.namespaces.tables): a single number is a metrics row, every
    other value a namespace_values row."""
    metrics = values = 0
    for _, _, vals, single in parts:
        if single and not isinstance(vals[0], str):
            metrics += 1
        else:
            values += len(vals)
    return {t: n for t, n in (("metrics", metrics), ("namespace_values", values)) if n}


class PublishError(RuntimeError):
    """The collector refused a publication for good; the rows are kept in the spool's ``rejected/`` folder."""


@dataclass(frozen=True)
class Acknowledgement:
    """What became of one publication: ``stored`` when the collector wrote every row to the run (queryable now);
    False when some were spooled to local disk because the collector could not be reached or stayed busy (they
    are delivered when it is back, or by ``flowscope ingest-spool``)."""

    namespace: str
    commits: tuple[int, int]        # the first and last commit the publication carries (1-based)
    ts_ns: int                      # the time of its last commit
    rows: dict[str, int]            # rows per table (metrics, namespace_values)
    stored: bool
    segments: tuple[str, ...] = field(default=())  # the segments holding its rows (maybe shared with others)


@dataclass(slots=True)
class _Node:
    """A leaf of the record being built: its values per commit ([stamp, values]; the stamp is a one-item list shared
    by every value put since the last commit, holding None until that commit gives it its time)."""

    parts: list
    single: bool


def _all_of(futures: list[Future], make: Any) -> Future:
    """A future resolved with ``make([results])`` once every one of ``futures`` is, or with the first exception."""
    out: Future = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def done(_f: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            out.set_exception(errors[0])
            return
        try:
            out.set_result(make([f.result() for f in futures]))
        except Exception as exc:  # noqa: BLE001 - carried to whoever waits
            out.set_exception(exc)

    if not futures:
        out.set_result(make([]))
    for f in futures:
        f.add_done_callback(done)
    return out


class Namespace:
    """A named stream of hierarchical records published into ``client``'s run (make one with
    ``client.namespace(...)`` or ``flowscope.namespace(...)``).

    ``publish_every``: publish on every k-th commit (SOMA's publish frequency). ``blocking``: a publishing commit
    waits for the collector's acknowledgement (True) or returns a Future (False). ``resource_id``: what the
    records are about (an MPI rank's resource, a node); default the publishing process."""

    def __init__(self, client: Client, name: str, *, publish_every: int = 1, blocking: bool = True,
                 resource_id: str | None = None):
        self.name = check_namespace(name)
        self.domain = domain_of(name)
        self.client = client
        self.publish_every = 1
        self.set_publish_frequency(publish_every)
        self.blocking = bool(blocking)
        self.resource_id = resource_id
        self.commits = 0            # commits so far
        self.published_commits = 0  # commits carried by publications so far
        self._last_ts = 0
        self._nodes: dict[str, _Node] = {}
        self._inner: set[str] = set()   # paths that have keys below them
        self._dirty = False             # updates since the last commit
        self._open: list = [None]       # the time of the commit that will close the current update (once made)
        self._lock = threading.RLock()
        self._owns_client = False
        self.pending: list[Future] = []  # non-blocking publications not yet acknowledged
        self._pending_check = 64
        self._held: list[_Held] = []     # non-blocking publications waiting for the linger to end
        self._held_leaves = 0
        self._held_since = 0.0
        self._timer: threading.Timer | None = None
        self.closed = False

    def __repr__(self) -> str:
        return (f"Namespace({self.name!r}, publish_every={self.publish_every}, blocking={self.blocking}, "
                f"commits={self.commits})")

    # ---- updates (local) -----------------------------------------------------------------------------------
    def set_publish_frequency(self, every: int) -> None:
        """Publish on every ``every``-th commit from now on (SOMA's ``soma_set_publish_frequency``)."""
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise NamespaceError("publish_every", f"a whole number of commits >= 1, got {every!r}")
        self.publish_every = every

    def update(self, path: str | Mapping, value: Any = _MISSING, *, mode: str = OVERWRITE) -> None:
        """Put ``value`` at ``path`` (SOMA's ``soma_update_namespace``): ``mode`` overwrite replaces the leaf,
        append adds to its list. A mapping value is walked, its keys extending the path, and each of its leaves
        updated the same way (other leaves under ``path`` stay, as Conduit's ``Node.update``); ``update(mapping)``
        updates from the root. NamespaceError names the path that cannot be published; nothing is changed then."""
        if self.closed:
            raise NamespaceError("namespace", f"{self.name} is closed")
        if mode not in MODES:
            raise NamespaceError("mode", f"{mode!r} is not one of {', '.join(MODES)}")
        if value is _MISSING:
            if not isinstance(path, Mapping):
                raise NamespaceError("value", "update(path, value): the value is missing")
            path, value = "", path
        else:
            check_path(path)
        # checked before anything changes; the shapes set every step take the quick walk
        given = common_leaves(path, value)
        if given is None:
            given = [(p, leaf.values, leaf.single) for p, leaf in leaves(path, value)]
        self._put_all(given, mode)

    def _put_all(self, given: list[tuple[str, list, bool]], mode: str) -> None:
        """Check the leaves ``given`` against the record's shape, then put every one (all or nothing)."""
        with self._lock:
            self._check_shape(given, mode)
            for p, values, single in given:
                self._put(p, values, single, mode)
            self._dirty = True

    def set(self, path: str | Mapping, value: Any = _MISSING) -> None:
        """Overwrite the leaf (or leaves of a mapping) at ``path``."""
        # a program sets the same record every step: when every leaf of the value is in the record already, each is
        # overwritten where it is (its shape was checked when it came); else update() checks and puts it
        if value is not _MISSING and path.__class__ is str and path in VALID_PATHS and not self.closed:
            given = common_leaves(path, value)
            if given is not None:
                with self._lock:
                    nodes = self._nodes
                    for leaf in given:
                        if leaf[0] not in nodes:
                            break
                    else:
                        for p, values, single in given:
                            node = nodes[p]
                            node.parts, node.single = [[self._open, values]], single
                        self._dirty = True
                        return
                self._put_all(given, OVERWRITE)  # new leaves: walked already, checked there
                return
        self.update(path, value, mode=OVERWRITE)

    def append(self, path: str | Mapping, value: Any = _MISSING) -> None:
        """Append ``value`` to the list at ``path`` (a sequence or array: its items, in order)."""
        self.update(path, value, mode=APPEND)

    def _check_shape(self, given: list[tuple[str, list, bool]], mode: str) -> None:
        nodes, inner = self._nodes, self._inner
        seen: set[str] = set()       # new leaves of this call, and the paths above them
        above: set[str] = set()
        for p, _, _ in given:
            node = nodes.get(p)
            if node is not None:  # a leaf of this record already: it fits where it is (its shape was checked)
                if mode == APPEND and node.single:
                    raise NamespaceError(p, "holds a single value (set) in this record; set it again, or append to a "
                                            "list")
                continue
            if p in inner or p in above:
                raise NamespaceError(p, "has keys below it in this record; a path is either a value or holds keys")
            for prefix in _prefixes(p):
                if prefix in nodes or prefix in seen:
                    raise NamespaceError(p, f"{prefix} holds a value in this record; no key can be below it")
                above.add(prefix)
            seen.add(p)

    def _put(self, path: str, values: list, single: bool, mode: str) -> None:
        node = self._nodes.get(path)
        if node is None:
            self._inner.update(_prefixes(path))
            self._nodes[path] = _Node([[self._open, values]], single=single and mode == OVERWRITE)
        elif mode == OVERWRITE:
            node.parts, node.single = [[self._open, values]], single
        elif node.parts[-1][0] is self._open:
            node.parts[-1][1].extend(values)
        else:
            node.parts.append([self._open, values])

    # ---- commit and publish --------------------------------------------------------------------------------
    def commit(self) -> Acknowledgement | Future | None:
        """Close the current update and count it (SOMA's ``soma_commit_namespace``, or ``..._async`` when not
        blocking); every ``publish_every``-th commit publishes the record: its acknowledgement (blocking) or a
        Future of it (non-blocking). None when this commit only counted."""
        with self._lock:
            self._stamp()
            if self.commits - self.published_commits >= self.publish_every:
                return self._publish()
            return None

    def _stamp(self) -> None:
        if self.closed:
            raise NamespaceError("namespace", f"{self.name} is closed")
        ts = max(time.time_ns(), self._last_ts + 1)  # a commit's time identifies it: strictly increasing
        self._last_ts = ts
        self.commits += 1
        self._open[0] = ts  # every value put since the last commit now carries its time
        self._open = [None]
        self._dirty = False

    def publish(self) -> Acknowledgement | Future | None:
        """Publish the committed record now, whatever the frequency (SOMA's ``soma_publish_namespace``);
        None when no commit is waiting."""
        with self._lock:
            if self.commits == self.published_commits:
                return None
            return self._publish()

    def _publish(self) -> Acknowledgement | Future:
        parts = [(p, stamp[0], values, node.single) for p, node in self._nodes.items()
                 for stamp, values in node.parts if stamp[0] is not None]
        held = _Held(parts, (self.published_commits + 1, self.commits), self._last_ts, Future())
        self._nodes, self._inner = {}, set()
        self.published_commits = self.commits
        if self.blocking:
            self._send_held()  # what earlier non-blocking publications left held goes first
            self._send([held])
            return held.future.result()
        if len(self.pending) >= self._pending_check:  # forget the acknowledged ones now and then: when the list
            self.pending = [f for f in self.pending if not f.done()]  # has doubled, not at every publication
            self._pending_check = max(64, 2 * len(self.pending))
        self.pending.append(held.future)
        now, linger = time.monotonic(), self._linger()
        if not self._held:
            self._held_since = now
            _HOLDING.add(self)
        self._held.append(held)
        self._held_leaves += len(parts)
        if now - self._held_since >= linger or self._held_leaves >= LINGER_LEAVES:
            self._send_held()
        elif self._timer is None:  # nothing may come after it: the linger's end sends it
            self._timer = threading.Timer(max(0.0, self._held_since + linger - now), self._linger_ended)
            self._timer.daemon = True
            self._timer.start()
        return held.future

    def _linger(self) -> float:
        """How long a non-blocking publication waits for others (LINGER_S, else the client's flush interval now)."""
        if LINGER_S is not None:
            return LINGER_S
        c = self.client
        live = getattr(c, "live_flush_interval", None)
        return live if getattr(c, "watched", False) and live is not None else getattr(c, "flush_interval", 1.0)

    def _linger_ended(self) -> None:
        with self._lock:
            self._timer = None
            self._send_held()

    def _send_held(self) -> None:
        """Send the held non-blocking publications now, as one batch per table."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held, self._held_leaves = self._held, [], 0
        if held:
            self._send(held)

    def _send(self, held: list[_Held]) -> None:
        """Send the rows of publications ``held`` together (one batch per table); each one's Future resolves to its
        own acknowledgement once every batch is acknowledged (PublishError when the collector refused one)."""
        rid = self.resource_id or self.client.process_resource()
        data = tables(self.name, rid, [p for h in held for p in h.parts])
        futures, segments = [], []
        for table, t in data.items():
            for seg, fut in self.client.send_acknowledged(table, t):
                segments.append(seg)
                futures.append(fut)
        name = self.name

        def acknowledge(outcomes: list[str]) -> None:
            refused = [o for o in outcomes if o.startswith("rejected")]
            stored_in = tuple(dict.fromkeys(getattr(f, "segment", None) or s for s, f in zip(segments, futures)))
            stored = all(o == "stored" for o in outcomes)
            for h in held:
                first, last = h.commits
                if refused:
                    h.future.set_exception(PublishError(f"namespace {name}, commits {first}-{last}: {refused[0]}"))
                else:
                    h.future.set_result(Acknowledgement(name, h.commits, h.ts_ns, _rows_of(h.parts), stored,
                                                        stored_in))

        def failed(f: Future) -> None:
            if f.exception() is not None:
                for h in held:
                    if not h.future.done():
                        h.future.set_exception(f.exception())

        _all_of(futures, acknowledge).add_done_callback(failed)

    # ---- analysis ------------------------------------------------------------------------------------------
    def analyze(self, sql: str | None = None, *, reduce: str | None = None, name: str | None = None,
                by: str | None = None) -> dict:
        """Have the collector run a query over this namespace's rows in the run and return its result
        (SOMA's ``soma_analyze``): ``sql``, one SELECT over the table ``namespace`` (columns ts_ns,
        resource_id, name, item, value, text), or a named reduction ``reduce`` (count, sum, mean, min, max,
        first, last) of the numbers whose path matches the glob ``name`` (default all), per path and, with
        ``by="resource_id"``, per publisher. Returns ``{"columns": [...], "rows": [{...}, ...]}``; what is
        published and not yet acknowledged is not in it (publish blocking, or wait for the Future, first).
        NamespaceError names the request field the collector refused."""
        request = {k: v for k, v in (("sql", sql), ("reduce", reduce), ("name", name), ("by", by))
                   if v is not None}
        return self.client.analyze(self.name, request)

    # ---- end -----------------------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> Acknowledgement | None:
        """Commit uncommitted updates, publish what no publication carried yet, and wait for every
        publication of this namespace to be acknowledged; the last acknowledgement, or None."""
        with self._lock:
            if self._dirty:
                self._stamp()
            ack = None
            if self.commits > self.published_commits:
                out = self._publish()
                self._send_held()
                ack = out.result(timeout) if isinstance(out, Future) else out
            self._send_held()
            pending, self.pending = self.pending, []
        for f in pending:
            f.result(timeout)
        return ack

    def close(self, status: str = "finished") -> None:
        """Flush, and close the client (with ``status``) when this namespace made it (``flowscope.namespace``
        without a client)."""
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            if self._owns_client:
                self.client.close(status=status)

    def __enter__(self) -> Namespace:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(status="failed" if exc_type else "finished")
