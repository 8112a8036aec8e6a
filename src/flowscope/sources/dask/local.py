"""Dask's local schedulers -- threaded (``dask.threaded``), processes (``dask.multiprocessing``) and synchronous
(``dask.local.get_sync``) -- observed through Dask's own callback mechanism (``dask.callbacks.Callback``, the
one ``dask.diagnostics.Profiler`` uses), with no change to the user's code.

What is measured where
----------------------
Dask calls ``start`` / ``start_state`` / ``pretask`` / ``posttask`` / ``finish`` on the thread that called
``compute`` (the scheduler loop), not on the thread or process that runs a task: ``pretask`` when the task is
handed to the pool, ``posttask`` when the scheduler has picked its result up. Timing a task between those two
(what Profiler does) includes the wait for a free thread and for the scheduler loop, and for the processes
scheduler covers a whole batch of tasks sent together. So ``start_state`` (once per graph, after Dask has
ordered it and before its loop hands out the first task) replaces every task in the scheduler's own copy of
the graph (``get_async`` makes it; the user's graph is not touched) by a :class:`MeasuredTask` that runs the
task where the scheduler runs it and notes, there: start and end (``time.time_ns``), the OS thread (native id,
pthread id, name), the process, the thread's I/O counters (``/proc/self/task/<tid>/io``) around the task and
the result's size (``dask.sizeof``, what distributed records as ``nbytes``). There is no ``pretask``: the loop
hands a task to the pool without calling the capture, and ``posttask`` only decides whether a batch of rows is
due. The wrapper's ``__class__`` is the task's, so Dask's own code that meets it in the graph (``get_dependencies``
when it reruns a task that raised, with ``rerun_exceptions_locally``) sees a task; a task is measured by its first
call only.

- threaded and synchronous: the wrapper runs in this process and records the task into its graph at the end of
  the call (what happens after that in the scheduler's loop is Dask's). As in
  the distributed capture, a pool thread's reading at the end of one task is the baseline of its next
  reading in the same graph; the first task of each graph on a thread reads before it starts. Which tasks
  are read follows the capture level, as in the distributed capture: at ``full`` every task; at
  ``standard`` only a task whose call took ``MIN_CALL_NS`` (1 ms) or more, whose rows then hold the I/O of
  the shorter calls before it on the thread too (span ``"io": "own"``, rows ``"tasks": n``; a shorter
  call's span says ``"io": "next"``); what calls still pending when a graph ends did is read then, from the
  scheduler's thread, into rows with no task.
- processes: the wrapper travels to the worker process (``dask.multiprocessing`` pickles it with the task),
  measures there, and appends one JSON line per task (and per file the task opened, from the open audit
  hook) to a spool file of that worker process; ``finish`` reads the spool. ``posttask`` notes such a task's
  result size and worker, and when the loop saw it done. The pid recorded is the worker
  process's own ``os.getpid()``; it is checked against the id Dask passes to ``posttask``
  (``multiprocessing.current_process().ident``, the same pid). Each task's I/O counters are read before and
  after it in the worker process (the pool's pipes carry tasks and results between them), at both levels:
  a worker process has no end of the graph at which pending calls could be read. A task whose
  spool line is missing (the spool could not be written) keeps the scheduler's view: [pickled for the pool,
  posttask] on the worker process's main thread, marked ``"timing": "scheduler"``.

Per task, only what cannot wait is done, on the thread that ran it: two clock reads, the thread and the result's
size (``dask.sizeof``, its function looked up once per type); the task lands in columns (index, start, end, size,
thread, flags). A code for each task's group (a tuple key's first item, or the key itself) is found when a batch is
taken, and the text of the rows (key, group, prefix, attrs) is put together by Arrow for a whole batch, once per
thread and per group. The wrappers live as long as the computation (about 160 bytes a task). This path is compiled
(``_local_tasks.c``: the two hooks are C callables and the wrapper a C type) when the package is built;
``compiled=False`` (or FLOWSCOPE_COMPILED=0) runs its pure-Python reference, the same steps storing the same values
(tests/test_dask_local_compiled.py checks the rows are the same). Tasks out of the common case (one that raised, one
run in a worker process, a size that is not an int) keep their objects and are written by the same Python code on
both paths.

Records: every task is a ``task`` span named by its prefix, on the thread that ran it (resources thread ->
process -> host; a worker process nests in the scheduler's process), attrs ``nbytes``, ``group``,
``scheduler`` (threads / processes / sync), ``state`` (memory / erred), ``thread_ident``; the graph's
dependencies (``graph_id`` per computation); per-task I/O as ``io`` rows (``proc-io`` bytes, ``audit``
opens) with the same rules as the distributed capture; ``task-error`` logs (exception type only); one
``graph-submitted`` log per computation. Rows are gathered per graph and written in batches (every 65,536
tasks, each second, and at ``finish``), handed to the client encoded: keys, threads and groups as positions in
their texts and attrs as a struct, whose text the collector makes (model/json_columns.py).
"""

from __future__ import annotations

import atexit
import collections
import functools
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from array import array
from typing import Any

from dask.callbacks import Callback
from dask.utils import key_split

try:
    from dask._task_spec import DataNode
except ImportError:  # a Dask without task objects: every node of the graph is a task
    DataNode = ()

from flowscope.model import identifiers as ids
from flowscope.sources import process_facts
from flowscope.sources import semantics as _semantics
from flowscope.sources.dask import DEFAULT_LEVEL, LEVEL_ENV, check_level
from flowscope.sources.thread_io import AGGREGATE_JSON as AGG
from flowscope.sources.thread_io import OpenAudit, ThreadIOReader, parse_raw, read_cost

try:
    from flowscope.sources.dask import _local_tasks
except ImportError:  # built with the package; a source tree without the build measures in pure Python
    _local_tasks = None

__all__ = ["COMPILED_AVAILABLE", "LocalSchedulerCapture", "MeasuredTask", "install_from_env", "key_group"]

#: the compiled per-task path (``_local_tasks.c``) is built; ``compiled=False`` / FLOWSCOPE_COMPILED=0 use the
#: pure-Python reference, which stores the same rows
COMPILED_AVAILABLE = _local_tasks is not None

_time_ns = time.time_ns

#: what this source's rows mean to the analyses (model/semantics.py)
SEMANTICS = _semantics.DASK_LOCAL
_get_ident = threading.get_ident
_READER = ThreadIOReader()
_LABEL_BYTES = b"abcdefghijklmnopqrstuvwxyz_:"  # what /proc/<tid>/io holds besides digits and whitespace
#: a batch of task rows is written after this many tasks (the client's batch, one segment) or this long: each batch
#: costs the collector 10-20 ms of CPU whatever its size, taken from the observed program on a small machine
#: (docs/performance.md); at 4,096 tasks a 20,000-task graph of tiny tasks ran 2 % slower than at 65,536
FLUSH_TASKS = 65_536
FLUSH_SECONDS = 1.0
#: level standard: a task call this long or longer has its thread's I/O counters read at its end; a shorter
#: call's I/O is charged to the next measured call on the same thread (as the distributed capture does)
MIN_CALL_NS = 1_000_000


def key_group(key: Any) -> str:
    """A task's group, as distributed names it (``key_split_group``): the name of a tuple key, the prefix of
    a string key."""
    if key.__class__ is tuple:
        return str(key[0])
    if isinstance(key, str):
        if key[:1] == "(":
            return key.split(",", 1)[0].strip("()\"'")
        if key[:1] == "<":
            return key.strip("<>").split()[0].split(".")[-1]
        return key_split(key)
    if isinstance(key, bytes):
        return key_group(key.decode())
    return "Other"


# ---- on the thread or in the process that runs a task ---------------------------------------------------

class _ThreadState:
    """One executing thread, as its tasks see it: ids, name, its last counter reading (when it was taken), the
    calls since then whose I/O that reading does not hold yet, and the graph they were for."""

    __slots__ = ("tid", "ident", "name", "last", "last_ns", "pending", "gen", "key", "slot")

    def __init__(self) -> None:
        t = threading.current_thread()
        self.tid, self.ident, self.name = threading.get_native_id(), threading.get_ident(), t.name
        self.last: bytes | None = None
        self.last_ns = 0
        self.pending = 0
        self.gen = -1
        self.key: Any = None   # the task running on this thread now (the open audit hook attributes to it)
        self.slot = 0          # its position in the threads of its graph ``gen``


_tls = threading.local()


def _thread_state() -> _ThreadState:
    st = _tls.__dict__.get("st")
    if st is None:
        st = _tls.st = _ThreadState()
    return st


class MeasuredTask:
    """A task of a graph being run by a local scheduler, wrapped to be measured where it runs (see the module
    docstring). Calls, ``repr``, attributes and ``__class__`` (what ``isinstance`` sees) are the task's own;
    pickled, it becomes a :class:`_RemoteMeasuredTask` that measures in the worker process."""

    __slots__ = ("task", "graph", "index", "submitted", "t0", "t1", "st", "before", "after", "calls", "error",
                 "nbytes", "worker", "seen", "slot", "recorded")

    def __init__(self, task, graph: _Graph, index: int):
        self.task, self.graph, self.index = task, graph, index
        self.submitted = 0
        self.t0 = 0
        self.error: str | None = None
        self.nbytes = self.worker = None
        self.recorded = False

    def __call__(self, values=()):
        g = self.graph
        if self.recorded or not g.live:  # measured once, by its first call (Dask reruns a task that raised, with
            return self.task(values)     # rerun_exceptions_locally)
        self.recorded = True
        st = _tls.__dict__.get("st") or _thread_state()
        if st.gen != g.gen:  # this thread's first task of this graph: its counters before it
            st.last, st.last_ns, st.pending, st.gen = g.read(st.tid), _time_ns(), 0, g.gen
            g.threads.append(st)
            st.slot = g.threads.index(st)  # not len() before the append: another thread may append in between
        self.slot = st.slot
        st.key = self
        result = None
        t0 = _time_ns()
        try:
            result = self.task(values)
            return result
        except BaseException as exc:
            self.error = exc.__class__.__name__
            raise
        finally:
            t1 = self.t1 = _time_ns()
            self.t0 = t0
            st.key = None
            self.st = st
            if t1 - t0 >= g.min_ns:  # measured: its I/O and that of the calls since the last reading
                self.before, self.calls = st.last, st.pending + 1
                st.last = self.after = g.read(st.tid)
                st.last_ns, st.pending = t1, 0
            else:  # level standard, a call under 1 ms: its I/O goes into the thread's next reading
                self.before = None
                st.pending += 1
            nbytes = None
            if self.error is None:  # its size as dask.sizeof gives it, here rather than in the scheduler's loop
                try:
                    nbytes = (_SIZEOF.get(result.__class__) or _sizeof_of(result.__class__))(result)
                except Exception:  # noqa: BLE001 - a result Dask cannot size
                    nbytes = None
            try:
                g.record(self, nbytes)
            except Exception:  # noqa: BLE001 - the task's result matters more than its record
                g.lost += 1

    def __reduce__(self):  # a worker process has no end of the graph to read pending calls at: each is read
        self.graph.shipped = True
        self.submitted = _time_ns()
        return _RemoteMeasuredTask, (self.task, self.index, self.graph.spool, self.graph.io)

    @property
    def __class__(self):  # what isinstance() sees, as Dask's own code meets the wrapper in the graph
        return self.task.__class__

    def __getattr__(self, name: str):  # key, dependencies, ...: the task's
        return getattr(self.task, name)

    def __repr__(self) -> str:
        return repr(self.task)


_spool_fds: dict[str, int] = {}
_remote_audit: OpenAudit | None = None


def _spool_write(spool: str, record: list) -> None:
    fd = _spool_fds.get(spool)
    if fd is None:
        os.makedirs(spool, exist_ok=True)
        fd = _spool_fds[spool] = os.open(os.path.join(spool, f"{os.getpid()}.jsonl"),
                                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def _remote_open(row: dict) -> None:
    st = _tls.__dict__.get("st")
    task = st.key if st is not None else None
    if task is not None:  # only opens made by a task: the pool's own machinery is not a task's I/O
        _spool_write(task.spool, ["open", task.index, row])


class _RemoteMeasuredTask:
    """A :class:`MeasuredTask` in a worker process of the processes scheduler: runs the task, measures it and
    appends the measurement to the spool of that worker process."""

    __slots__ = ("task", "index", "spool", "io")

    def __init__(self, task, index: int, spool: str, io: bool = True):
        self.task, self.index, self.spool, self.io = task, index, spool, io

    def __call__(self, values=()):
        global _remote_audit
        st = _tls.__dict__.get("st") or _thread_state()
        if _remote_audit is None and self.io:
            _remote_audit = OpenAudit(_remote_open, exclude=[sys.prefix, sys.base_prefix, *sys.path[1:2]]).enable()
        before = _READER.read_raw(st.tid) if self.io else None
        error = None
        st.key = self
        t0 = _time_ns()
        try:
            return self.task(values)
        except BaseException as exc:
            error = exc.__class__.__name__
            raise
        finally:
            t1 = _time_ns()
            st.key = None
            after = _READER.read_raw(st.tid) if self.io else None
            try:
                delta = None
                if before is not None and after is not None:
                    delta = list(parse_raw(after) - parse_raw(before) - read_cost(before))
                _spool_write(self.spool, ["task", self.index, t0, t1, os.getpid(), st.tid, st.ident, st.name,
                                          error, delta])
            except Exception:  # noqa: BLE001 - the task's result matters more than its measurement
                pass

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def __repr__(self) -> str:
        return repr(self.task)


def _after_fork_in_child() -> None:
    global _remote_audit
    _spool_fds.clear()  # the parent's spool files
    _remote_audit = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---- in the scheduler's thread -------------------------------------------------------------------------

def _no_reading(tid: int) -> None:
    return None


_NEVER = 1 << 62  # ns: a call that long is never measured (no per-task I/O)


class _GraphBase:
    """One computation (one ``get`` call) being observed: what both per-task paths share. The per-task state
    (``keys``, ``pos``, ``threads``, the columns of the tasks reported done, ``take()``) is :class:`_Graph`'s in
    pure Python, :class:`_local_tasks.Core`'s when compiled; both hold the same values."""

    __slots__ = ()
    _ids = itertools.count()

    def setup(self, capture: LocalSchedulerCapture, dsk) -> None:
        n = next(self._ids)
        self.gen = n
        self.id = f"local-{ids.hostname()}-{os.getpid()}-{n}"
        self.caller = threading.get_ident()
        self.names = self.key_texts(dsk)           # key -> the key as text
        self.keys = list(self.names)                # index -> key (keys start_state meets outside the graph appended)
        self.pos = dict(zip(self.keys, range(len(self.keys))))
        self.key_text = None                        # the keys' text as an Arrow array (made at the start)
        self.head_names: list[str] = []             # group code -> span name (the group's prefix)
        self.head_groups: list[str] = []            # group code -> the group (its JSON text is the collector's)
        self.capture = capture  # (its spool root is made when a worker process first needs this graph's spool)
        self.tasks = 0
        self.io = capture.io
        self.read = _READER.read_raw if capture.io else _no_reading
        # calls shorter than this have their I/O charged to the next measured call on their thread
        self.min_ns = (MIN_CALL_NS if capture.level == "standard" else 0) if capture.io else _NEVER
        self.marks = capture.io and capture.level == "standard"  # rows say whose I/O they hold (io, tasks)
        self.threads = []                         # threads that ran tasks of this graph (a task's ``slot``)
        self.remote: dict[int, list] = {}         # index -> measurement a worker process spooled
        self.spool_offsets: dict[str, int] = {}   # spool file -> bytes already read
        self.sizers, self.sizer_of = _SIZEOF, _sizeof_of
        self.flush_tasks, self.flush_every_ns = FLUSH_TASKS, int(FLUSH_SECONDS * 1e9)
        self.next_flush = time.monotonic_ns() + self.flush_every_ns
        self.pending = 0
        self.lost = 0        # tasks whose record failed (out of memory)
        self.shipped = False  # a task was pickled: the graph runs in worker processes
        self.live = True      # its tasks record themselves (until finish)

    @property
    def spool(self) -> str:
        """The folder worker processes append this graph's measurements to, under the capture's spool root, which
        is made on first use: a graph no worker process runs makes no folder."""
        return os.path.join(self.capture.spool_root, str(self.gen))

    @property
    def spool_made(self) -> str | None:
        """This graph's spool folder if the capture's spool root was made, else None (nothing to read or remove)."""
        root = self.capture.spool_root_made
        return os.path.join(root, str(self.gen)) if root is not None else None

    @staticmethod
    def key_texts(dsk) -> dict:
        """Each key of the graph -> the key as text (itself if a str, else ``str(key)``)."""
        return {k: k if k.__class__ is str else str(k) for k in dsk}

    def graph_edges(self, dsk) -> tuple[bytes, bytes, list, int]:
        """The graph's (task, dependency) pairs as positions: int32 columns (bytes) of the task's position in
        ``pos`` and of the dependency's, a dependency outside ``pos`` numbered after them (``len(pos)`` + its place
        in the list of their texts, ``str()`` of each, one per pair); the texts; and how many of the graph's nodes
        are data, not tasks."""
        pos = self.pos
        n = len(pos)
        src, dst, outside = array("i"), array("i"), []
        for k, node in dsk.items():
            i = pos[k]
            for x in node.dependencies:
                j = pos.get(x)
                if j is None:
                    j = n + len(outside)
                    outside.append(str(x))
                src.append(i)
                dst.append(j)
        return src.tobytes(), dst.tobytes(), outside, sum(1 for node in dsk.values() if isinstance(node, DataNode))

    def name_of(self, index: int) -> str:
        key = self.keys[index]
        return self.names.get(key) or str(key)


class _Graph(_GraphBase):
    """A graph measured by the pure-Python reference path (``compiled=False``)."""

    __slots__ = ("_done", "_other_heads", "_tuple_heads", "caller", "capture", "flush", "flush_every_ns", "flush_tasks",
                 "gen", "head_groups", "head_names", "heads", "id", "io", "key_text", "keys", "live", "lost", "marks",
                 "measured", "min_ns", "names", "next_flush", "pending", "pos", "read", "remote", "shipped", "sizer_of",
                 "sizers", "slow", "spool_offsets", "tasks", "threads")

    def __init__(self) -> None:
        self.flush = None
        # appended to by pool threads, emptied by take() on the scheduler's: deques, whose append and popleft are
        # each atomic
        self._done: collections.deque = collections.deque()  # columns of tasks that ran here and returned
        self.measured: collections.deque = collections.deque()  # ... those whose counters were read: I/O rows
        self.slow: collections.deque = collections.deque()  # tasks out of the common case (raised, ran elsewhere)
        self.heads: list = []      # group code -> the key that introduced it
        self._tuple_heads: dict = {}
        self._other_heads: dict = {}

    def head_code(self, key) -> int:
        """The code of ``key``'s group: a tuple key's first item, or the key itself."""
        if key.__class__ is tuple and key:
            d, hk = self._tuple_heads, key[0]
        else:
            d, hk = self._other_heads, key
        code = d.get(hk)
        if code is None:
            code = d[hk] = len(self.heads)
            self.heads.append(key)
        return code

    def record(self, m: MeasuredTask, nbytes) -> None:
        """A task that ran in this process (``nbytes``: its result's size, None if it raised or Dask cannot size
        it): into the columns, or with the tasks out of the common case."""
        sized = nbytes.__class__ is int and -(1 << 63) <= nbytes < (1 << 63)
        if not self.live:
            return  # the graph ended (finish) while the task ran
        if m.error is not None or not (sized or nbytes is None):
            m.nbytes = nbytes
            self.slow.append(m)
            return
        measured = m.before is not None and m.after is not None
        if measured:
            self.measured.append(m)
        self._done.append((m.index, m.t0, m.t1, nbytes if sized else 0, m.slot,
                           (_F_NBYTES if sized else 0) | (_F_MEASURED if measured else 0)))

    def take(self) -> tuple:
        """What ``_local_tasks.Core.take`` returns: (n, index, start, end, nbytes, slot, head, flags, measured,
        slow), columns as bytes."""
        done, measured, slow = self._done, self.measured, self.slow
        rows = [done.popleft() for _ in range(len(done))]
        measured = [measured.popleft() for _ in range(len(measured))]
        slow = [slow.popleft() for _ in range(len(slow))]
        self.pending = 0
        self.next_flush = time.monotonic_ns() + self.flush_every_ns
        index, t0, t1, nb, slot, flags = zip(*rows) if rows else ((),) * 6
        head = [self.head_code(self.keys[i]) for i in index]
        return (len(rows), array("q", index).tobytes(), array("q", t0).tobytes(), array("q", t1).tobytes(),
                array("q", nb).tobytes(), array("i", slot).tobytes(), array("i", head).tobytes(), bytes(flags),
                measured, slow)


_F_NBYTES, _F_MEASURED = 1, 2  # flags of a task in the columns: its size is known; its counters were read

if _local_tasks is not None:
    class _CompiledGraph(_GraphBase, _local_tasks.Core):
        """A graph measured by the compiled per-task path (its keys and edges read in C too: the same values)."""

        @staticmethod
        def key_texts(dsk) -> dict:
            return _local_tasks.key_texts(dsk) if dsk.__class__ is dict else _GraphBase.key_texts(dsk)

        def graph_edges(self, dsk) -> tuple[bytes, bytes, list, int]:
            if dsk.__class__ is dict:
                return _local_tasks.graph_edges(dsk, self.pos, DataNode)
            return _GraphBase.graph_edges(self, dsk)

    _MEASURED: tuple = (MeasuredTask, _local_tasks.MeasuredTask)
    _local_tasks.configure(lambda: _local_tasks.ThreadState(threading.get_native_id(), threading.get_ident(),
                                                            threading.current_thread().name), _RemoteMeasuredTask)
else:
    _MEASURED = (MeasuredTask,)


def _running_state() -> Any:
    """The state of the calling thread if it is running a task of an observed graph (either path), else None."""
    st = _tls.__dict__.get("st")
    if st is not None and st.key is not None:
        return st
    st = _local_tasks.current() if _local_tasks is not None else None
    return st if st is not None and st.key is not None else None


class LocalSchedulerCapture(Callback):
    """Observes every computation Dask's local schedulers run while registered (``register()`` / ``with``).

    ``client`` is a :class:`flowscope.Client`, or a callable that makes one the first time a graph runs
    (``flowscope run`` joins the run of its environment that way). ``level`` is the capture level
    (``flowscope.dask.LEVELS``): at ``standard`` a task's I/O counters are read only when its call took
    ``MIN_CALL_NS`` or more, a shorter call's I/O being charged to the next measured call on its thread; at
    ``full`` every task's are. ``io=False`` leaves per-task I/O out (the /proc counters and the files tasks
    open). ``errors`` counts the hook calls that failed: a failing hook never fails the computation (its
    records for that call are lost). ``compiled``: Dask's per-task hooks and the task wrapper in C
    (``_local_tasks.c``; the default when it is built, unless $FLOWSCOPE_COMPILED is ``0``), else their
    pure-Python reference, which stores the same rows."""

    def __init__(self, client, *, io: bool = True, level: str = DEFAULT_LEVEL, compiled: bool | None = None):
        super().__init__()
        if compiled is None:
            compiled = COMPILED_AVAILABLE and os.environ.get("FLOWSCOPE_COMPILED", "1") != "0"
        if compiled and not COMPILED_AVAILABLE:
            raise ImportError("flowscope.sources.dask._local_tasks is not built (pip install -e . builds it)")
        self.compiled = bool(compiled)
        self._client = client if not callable(client) or hasattr(client, "emit") else None
        self._factory = None if self._client is not None else client
        self.io = io
        self.level = check_level(level)
        self.errors = 0
        self.graphs = 0
        self.tasks = 0
        self._lock = threading.Lock()
        self._graphs: dict[int, _Graph] = {}
        self._spool_root: str | None = None
        self._declared: set[str] = set()
        self._opens: collections.deque = collections.deque()  # (row, thread state) from the open audit hook
        self._rids: dict[_ThreadState, str] = {}  # threads declared in this capture's run
        self._audit: OpenAudit | None = None
        self._pid = os.getpid()
        if self.compiled:  # C callables (Callback._callback reads the instance's)
            self._start_state = _local_tasks.Hook(self._graphs, self._failed, False)
            self._posttask = _local_tasks.Hook(self._graphs, self._failed, True)
        self._graph_class = _CompiledGraph if self.compiled else _Graph

    # ---- what the hooks share ------------------------------------------------------------------------
    @property
    def fs(self):
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._factory()
        return self._client

    @property
    def spool_root(self) -> str:
        """The temporary folder the graphs' spool folders go in, made on first use (removed by ``close()``)."""
        if self._spool_root is None:
            self._spool_root = tempfile.mkdtemp(prefix="flowscope-local-")
        return self._spool_root

    @property
    def spool_root_made(self) -> str | None:
        """The spool root if it was made, else None."""
        return self._spool_root

    def _failed(self, exc: BaseException | None = None) -> None:
        """A hook call failed (``exc``: what it raised, when not the exception being handled)."""
        self.errors += 1
        if self.errors <= 3:
            import logging

            logging.getLogger("flowscope.dask").error("flowscope local-scheduler hook failed",
                                                      exc_info=exc if exc is not None else True)

    def _enable_audit(self) -> None:
        if self.io and self._audit is None:
            self._audit = OpenAudit(self._record_open, exclude=[sys.prefix, sys.base_prefix, *sys.path[1:2]])
            self._audit.enable()

    def _record_open(self, row: dict) -> None:
        """An open seen on a task's thread: kept, and written with the task's other rows from the scheduler's
        thread (a thread that runs tasks never records through the client itself)."""
        st = _running_state()
        task = st.key if st is not None else None
        if task is None or not isinstance(task, _MEASURED) or not task.graph.live:
            return  # not inside a task of an observed graph (or its graph ended while it ran)
        key = task.graph.keys[task.index]
        row["task_key"] = key if key.__class__ is str else str(key)
        self._opens.append((row, st))

    # ---- Dask's hooks ----------------------------------------------------------------------------------
    def _start(self, dsk) -> None:
        try:
            if os.getpid() != self._pid:  # a forked copy of the capture: not ours to record
                return
            g = self._graph_class()
            g.setup(self, dsk)
            g.flush = functools.partial(self._flush, g)
            self._graphs[id(dsk)] = g
            fs = self.fs
            self._enable_audit()
            now = _time_ns()
            gid = g.id
            src, dst, outside, data_nodes = g.graph_edges(dsk)
            g.tasks = len(dsk) - data_nodes
            from flowscope.model import arrow_values as av  # no pa.array(): it would import pandas here

            g.key_text = av.texts(list(g.names.values()))  # in the order of g.keys; the rows' task_key
            if src:  # the pairs as positions in the keys' texts: the collector makes each pair's text
                import pyarrow as pa

                n = len(src) // 4
                dep_text = pa.concat_arrays([g.key_text, av.texts(outside)]) if outside else g.key_text
                fs.write("dependencies", {"graph_id": _constant(gid, n),
                                          "task_key": pa.DictionaryArray.from_arrays(av.int32s(src), g.key_text),
                                          "depends_on": pa.DictionaryArray.from_arrays(av.int32s(dst), dep_text),
                                          "ts_ns": av.repeat_int64(now, n)})
            fs.log(f"graph of {g.tasks} tasks on a local Dask scheduler", category="graph-submitted",
                   resource_id=fs.process_resource(), ts_ns=now,
                   attrs={"graph_id": gid, "tasks": g.tasks, "scheduler": "local"})
            self.graphs += 1
            process_facts.FACTS["local_graphs"] += 1
        except Exception:
            self._failed()

    # the pure-Python reference of the hooks below (compiled: ``_local_tasks.Hook``, the same steps); there is no
    # pretask: Dask hands a task to its pool without calling the capture
    def _start_state(self, dsk, state) -> None:
        """Every task of the graph (a key not in ``state["cache"]``) replaced in the scheduler's graph by a
        :class:`MeasuredTask`, once, before the scheduler's loop hands any to the pool."""
        g = self._graphs.get(id(dsk))
        if g is None:
            return
        try:
            cache = state.get("cache") if isinstance(state, dict) else None
            keys, pos = g.keys, g.pos
            for i, (key, task) in enumerate(list(dsk.items())):
                index = i if i < len(keys) and keys[i] is key else pos.get(key)
                if index is None:  # a key outside the graph start saw
                    index = pos[key] = len(keys)
                    keys.append(key)
                if (cache is not None and key in cache) or type(task) is MeasuredTask:
                    continue  # data, never run
                dsk[key] = MeasuredTask(task, g, index)
        except Exception:
            self._failed()

    def _posttask(self, key, result, dsk, state, worker_id) -> None:
        """A task's result reached the scheduler's loop. A task run in this process has recorded itself; one run in
        a worker process (the graph was shipped) is noted here: its size, its worker, and when the loop saw it, in
        case no measurement comes from its worker. Then a batch of rows is written if one is due."""
        g = self._graphs.get(id(dsk))
        if g is None:
            return
        try:
            if g.shipped:
                m = dsk.get(key)
                if type(m) is MeasuredTask and m.graph is g and not m.recorded:
                    m.recorded = True
                    try:
                        nbytes = (_SIZEOF.get(result.__class__) or _sizeof_of(result.__class__))(result)
                    except Exception:  # noqa: BLE001 - a result Dask cannot size
                        nbytes = None
                    m.nbytes, m.worker, m.seen = nbytes, worker_id, _time_ns()
                    g.slow.append(m)
            g.pending += 1
            if g.pending >= g.flush_tasks or time.monotonic_ns() >= g.next_flush:
                self._flush(g)  # so that a live run (flowscope run's progress line) trails by a second at most
        except Exception:
            self._failed()

    def _finish(self, dsk, state, failed) -> None:
        g = self._graphs.pop(id(dsk), None)
        if g is None:
            return
        try:
            # a task still running records nothing now; one that ran in a worker process and was never reported
            # done (the graph failed) is in its worker's spool, read by the final flush
            g.live = False
            self._flush(g, final=True)
            if g.marks:
                self._pending_io(g)
            self.errors += g.lost
        except Exception:
            self._failed()
        finally:
            g.flush = None
            # wrappers outlive the computation where something keeps them (dask.diagnostics.Profiler keeps each task
            # it saw): let go of what only the graph's rows needed
            g.keys, g.pos, g.names, g.key_text = [], {}, {}, None
            spool = g.spool_made
            if spool is not None and os.path.isdir(spool):
                shutil.rmtree(spool, ignore_errors=True)

    # ---- turning measurements into rows ------------------------------------------------------------------
    def _thread_resource(self, st: _ThreadState) -> str:
        rid = self._rids.get(st)
        if rid is None:
            fs = self.fs
            rid = ids.thread_id(st.tid)
            fs.resource("thread", rid, name=st.name, parent_id=fs.process_resource(), host=ids.hostname(),
                        pid=os.getpid(), tid=st.tid, thread_ident=st.ident)
            self._rids[st] = rid
        return rid

    def _remote_resource(self, pid: int, tid: int, ident: int | None, name: str | None) -> str:
        rid = ids.thread_id(tid, pid)
        if rid not in self._declared:
            fs, host = self.fs, ids.hostname()
            proc = ids.process_id(pid)
            fs.resource("process", proc, name=f"{host}:{pid}", parent_id=fs.process_resource(), host=host,
                        pid=pid, attrs={"role": "dask-worker-process", "scheduler": "processes"})
            fs.resource("thread", rid, name=name, parent_id=proc, host=host, pid=pid, tid=tid, thread_ident=ident)
            self._declared.add(rid)
        return rid

    def _attrs_head(self, key, kind: str, state: str) -> tuple[str, str]:
        """(span name, the attrs after ``nbytes``) of a task of ``key``'s group, for scheduler ``kind`` and task
        ``state``."""
        grp = key_group(key)
        return key_split(grp), (f'"group": {json.dumps(grp)}, "scheduler": "{kind}", "state": "{state}", '
                                f'"thread_ident": ')

    def _flush(self, g: _GraphBase, final: bool = False) -> None:
        """Write the rows of the tasks reported done since the last flush (``final``: the graph ended)."""
        n, index, t0, t1, nbytes, slot, head, flags, measured, slow = g.take()
        fs = self.fs
        if n:  # the common case, a whole batch at once: tasks that ran in this process and returned
            fs.write("spans", self._span_batch(g, n, index, t0, t1, nbytes, slot, head, flags))
        local_io = [(m, self._thread_resource(m.st), g.name_of(m.index)) for m in measured]
        if slow or final:
            local_io += self._flush_others(g, slow, fs.row_writer("spans"), final)
        if local_io:
            self._local_io(local_io, g.marks)
        opens = self._opens
        while opens:
            row, st = opens.popleft()
            row["resource_id"] = self._thread_resource(st)
            fs.emit("io", **row)
        self.tasks += n + len(slow)
        process_facts.FACTS["local_tasks"] += n + len(slow)

    def _span_batch(self, g: _GraphBase, n: int, index: bytes, t0: bytes, t1: bytes, nbytes: bytes, slot: bytes,
                    head: bytes, flags: bytes) -> dict:
        """Columns of ``spans`` rows for a batch of tasks that ran in this process and returned (the columns
        ``take()`` hands on), encoded: keys, threads and groups as positions in their texts, attrs as a struct. The
        rows' text is made by the collector (model/json_columns.py), not in the user's process."""
        import numpy as np
        import pyarrow as pa

        from flowscope.model import arrow_values as av  # no pa.array(): it would import pandas into this process

        slots = av.int32s(slot)
        threads = [(self._thread_resource(st), st.ident, "sync" if st.ident == g.caller else "threads")
                   for st in g.threads]
        rids, idents, kinds = zip(*threads)
        for key in g.heads[len(g.head_names):]:  # groups first seen in this batch
            grp = key_group(key)
            g.head_names.append(key_split(grp))
            g.head_groups.append(grp)
        heads = av.int32s(head)
        if g.key_text is None or len(g.key_text) != len(g.keys):
            names = g.names  # in the order of g.keys, which holds more only for keys start_state met outside the graph
            text = list(names.values()) + [names.get(k) or str(k) for k in g.keys[len(names):]]
            g.key_text = av.texts(text)
        flag = np.frombuffer(flags, np.uint8)
        positions = np.frombuffer(index, np.int64)
        lo, hi = int(positions.min()), int(positions.max())  # only the texts of this batch's range of keys travel
        fields = [av.int64s(nbytes, nulls=(flag & _F_NBYTES) == 0),
                  pa.DictionaryArray.from_arrays(heads, av.texts(g.head_groups)),
                  pa.DictionaryArray.from_arrays(slots, av.texts(kinds)), _constant("memory", n),
                  pa.DictionaryArray.from_arrays(slots, av.int64s(idents))]
        names = ["nbytes", "group", "scheduler", "state", "thread_ident"]
        if g.marks:  # level standard: whether the span's I/O is in its own rows or the next measured call's
            fields.append(pa.DictionaryArray.from_arrays(av.int32s(((flag & _F_MEASURED) != 0).astype(np.int32)),
                                                         av.texts(["next", "own"])))
            names.append("io")
        return {"resource_id": pa.DictionaryArray.from_arrays(slots, av.texts(rids)), "kind": _constant("task", n),
                "name": pa.DictionaryArray.from_arrays(heads, av.texts(g.head_names)),
                "start_ns": av.int64s(t0), "end_ns": av.int64s(t1),
                "task_key": pa.DictionaryArray.from_arrays(av.int32s((positions - lo).astype(np.int32)),
                                                           g.key_text.slice(lo, hi - lo + 1)),
                "attrs": pa.StructArray.from_arrays(fields, names=names)}

    def _flush_others(self, g: _Graph, items: list[MeasuredTask], span, final: bool) -> list[tuple]:
        """Tasks that failed, or ran in worker processes (their measurements come from the spool). Returns the
        counter readings of failed tasks that ran in this process, as ``_local_io`` takes them."""
        fs = self.fs
        host = ids.hostname()
        if final or any(not m.t0 for m in items):
            self._read_spool(g)
        remote = g.remote
        marks = g.marks
        # at level standard a worker process reads every task (it has no end of the graph to read pending
        # calls at): its rows say they hold their own task's I/O
        calls = 1 if marks else None
        rows = []
        local_io = []
        for m in items:
            nbytes = m.nbytes
            timing = None
            close = "}"
            if m.t0:  # ran in this process, and raised
                st = m.st
                rid = self._thread_resource(st)
                kind = "sync" if st.ident == g.caller else "threads"
                t0, t1, ident, error = m.t0, m.t1, st.ident, m.error
                measured = m.before is not None and m.after is not None
                if measured:
                    local_io.append((m, rid, g.names.get(g.keys[m.index]) or str(g.keys[m.index])))
                if marks:
                    close = _OWN if measured else _NEXT
            else:
                rec = remote.pop(m.index, None)
                kind = "processes"
                if rec is not None:
                    _, _, t0, t1, rpid, tid, ident, tname, error, delta = rec
                    rid = self._remote_resource(rpid, tid, ident, tname)
                    if delta:
                        self._io_rows(rid, host, rpid, tid, ident, t0, t1, g.names.get(g.keys[m.index]), delta,
                                      calls)
                        if marks:
                            close = _OWN
                elif isinstance(m.worker, int):  # reported done, no measurement reached us: the scheduler's view
                    t0, t1, ident, error = m.submitted, m.seen, None, m.error
                    rid = self._remote_resource(m.worker, m.worker, None, "MainThread")
                    timing = "scheduler"
                else:
                    continue  # still running when the graph failed
            rows.append((m.index, nbytes, rid, kind, t0, t1, ident, error, timing, close))
        if final:  # measured in a worker process, never reported done (the graph failed)
            for index, rec in remote.items():
                _, _, t0, t1, rpid, tid, ident, tname, error, delta = rec
                if index < len(g.keys):
                    rid = self._remote_resource(rpid, tid, ident, tname)
                    if delta:
                        self._io_rows(rid, host, rpid, tid, ident, t0, t1, g.names.get(g.keys[index]), delta, calls)
                    rows.append((index, None, rid, "processes", t0, t1, ident, error, None,
                                 _OWN if marks and delta else "}"))
            remote.clear()
        for index, nbytes, rid, kind, t0, t1, ident, error, timing, close in rows:
            key = g.keys[index]
            k = g.names.get(key) or str(key)
            name, head = self._attrs_head(key, kind, "erred" if error else "memory")
            if error:
                fs.log(f"task failed with {error}", level="error", category="task-error", resource_id=rid,
                       task_key=k, attrs={"exception_type": error}, ts_ns=t1)
            span(None, None, rid, "task", name, t0, t1, k,
                 f'{{"nbytes": {"null" if nbytes is None else nbytes}, {head}{"null" if ident is None else ident}'
                 + (f', "timing": "{timing}"' if timing else "") + close)
        return local_io

    def _read_spool(self, g: _Graph) -> None:
        """Read what the worker processes appended to this graph's spool since the last read: task records
        into ``g.remote`` (index -> record), file opens recorded at once."""
        opens: list[list] = []
        spool = g.spool_made
        try:
            names = os.listdir(spool) if spool is not None else ()
        except OSError:
            return
        for name in names:
            done = g.spool_offsets.get(name, 0)
            try:
                with open(os.path.join(spool, name), "rb") as f:
                    f.seek(done)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # whole lines only: a worker may be writing the next one
            g.spool_offsets[name] = done + end
            for line in data[:end].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec[0] == "task":
                    g.remote[rec[1]] = rec
                    self._remote_resource(*rec[4:8])  # pid, tid, ident, thread name
                elif rec[0] == "open" and rec[1] < len(g.keys):
                    opens.append(rec)
        for _, index, row in opens:
            key = g.keys[index]
            row["task_key"] = key if key.__class__ is str else str(key)
            row["resource_id"] = self._remote_resource(row["pid"], row["tid"], row.get("thread_ident"), None)
            self.fs.emit("io", **row)

    def _io_rows(self, rid: str, host: str, pid: int, tid: int, ident, t0: int, t1: int, k: str | None,
                 d: list, calls: int | None = None) -> None:
        """The ``io`` rows of one counter delta ``d`` over [t0, t1]; ``calls``: how many task calls it holds
        (level standard, where a shorter call's I/O is charged to the next measured one)."""
        rchar, wchar, syscr, syscw, read_bytes, write_bytes, cancelled = d
        emit = self.fs.row_writer("io")
        tasks = f', "tasks": {calls}' if calls is not None else ""
        if rchar or syscr or read_bytes:
            emit(rid, host, pid, tid, ident, None, "proc-io", "read", None, None, rchar, t0, t1, k,
                 f'{{"syscr": {syscr}, "read_bytes": {read_bytes}, {AGG}"ops": {syscr}{tasks}}}')
        if wchar or syscw or write_bytes or cancelled:
            emit(rid, host, pid, tid, ident, None, "proc-io", "write", None, None, wchar, t0, t1, k,
                 f'{{"syscw": {syscw}, "write_bytes": {write_bytes}, "cancelled_write_bytes": {cancelled}, '
                 f'{AGG}"ops": {syscw}{tasks}}}')

    def _pending_io(self, g: _Graph) -> None:
        """What the calls still pending on each thread when graph ``g`` ends did since the thread's last reading
        (level standard): rows with no task over that interval, ``tasks`` = their number. A thread still in a
        task (the graph failed while it ran) is left alone."""
        host, pid = ids.hostname(), os.getpid()
        for st in g.threads:
            if st.gen != g.gen or not st.pending or st.key is not None or st.last is None:
                continue
            now, now_ns = _READER.read_raw(st.tid), _time_ns()
            if now is None:
                continue
            calls, before, since = st.pending, st.last, st.last_ns
            st.last, st.last_ns, st.pending = now, now_ns, 0
            # the read that gave ``before`` is in the thread's counters; this one is not yet
            delta = parse_raw(now) - parse_raw(before) - read_cost(before)
            self._io_rows(self._thread_resource(st), host, pid, st.tid, st.ident, since, now_ns, None, list(delta),
                          calls)

    def _local_io(self, rows: list[tuple], marks: bool = False) -> None:
        """Per-task counter deltas of tasks run in this process, parsed in bulk: (MeasuredTask, thread resource,
        task key) per task; ``marks``: the rows say how many task calls each delta holds."""
        import numpy as np

        n = len(rows)
        befores = [r[0].before for r in rows]
        values = None
        digits = b"".join(befores + [r[0].after for r in rows]).translate(None, _LABEL_BYTES)  # no labels
        if digits.count(b"\n") == 14 * n:  # the layout this kernel documents: 7 lines a reading
            values = np.fromstring(digits, dtype=np.int64, sep=" ")
        if values is not None and len(values) == 14 * n:
            v = values.reshape(2, n, 7)
            delta = v[1] - v[0]
        else:  # another layout of the counters file: one reading at a time
            delta = np.array([list(parse_raw(r[0].after) - parse_raw(r[0].before)) for r in rows], dtype=np.int64)
        delta[:, 0] -= np.fromiter(map(len, befores), dtype=np.int64, count=n)  # the baseline read itself
        delta[:, 2] -= 1
        host, pid = ids.hostname(), os.getpid()
        for i in np.flatnonzero(delta.any(axis=1)):
            m, rid, k = rows[i]
            self._io_rows(rid, host, pid, m.st.tid, m.st.ident, m.t0, m.t1, k, delta[i].tolist(),
                          m.calls if marks else None)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop observing and deliver what was recorded (closes a client this capture made)."""
        try:
            self.unregister()
        except KeyError:
            pass
        if self._audit is not None:
            self._audit.disable()
            self._audit = None
        if self._spool_root is not None:
            shutil.rmtree(self._spool_root, ignore_errors=True)
            self._spool_root = None
        if self._factory is not None and self._client is not None:
            client, self._client = self._client, None
            client.close(timeout=30)
        elif self._client is not None:
            self._client.flush(30)


_OWN = ', "io": "own"}'   # level standard: the span's I/O is in its own rows
_NEXT = ', "io": "next"}'  # ... in the rows of the next measured call on its thread


def _constant(value: str, n: int):
    """``n`` times the text ``value``, dictionary-encoded (one text, ``n`` zeros)."""
    import numpy as np
    import pyarrow as pa

    from flowscope.model import arrow_values as av

    return pa.DictionaryArray.from_arrays(av.int32s(np.zeros(n, np.int32)), av.texts([value]))


_SIZEOF: dict[type, Any] = {}  # type -> the function dask.sizeof dispatches it to


def _sizeof_of(cls: type):
    """``dask.sizeof``'s implementation for results of type ``cls`` (its dispatch, looked up once per type)."""
    from dask.sizeof import sizeof, sizeof_default

    f = sizeof.dispatch(cls)
    if f is sizeof_default:  # what it calls, without its Python frame (ints, floats, None, most objects)
        f = sys.getsizeof
    _SIZEOF[cls] = f
    return f




_installed: LocalSchedulerCapture | None = None


def install_from_env() -> LocalSchedulerCapture | None:
    """Observe every local-scheduler computation of this process into the run of $FLOWSCOPE_ADDRESS /
    $FLOWSCOPE_RUN at the capture level of $FLOWSCOPE_LEVEL (as ``flowscope run`` sets them); the client is
    made when the first graph runs and closed at exit. Does nothing without both variables, or if already installed."""
    global _installed
    address, run_id = os.environ.get("FLOWSCOPE_ADDRESS"), os.environ.get("FLOWSCOPE_RUN")
    if not address or not run_id or _installed is not None:
        return _installed

    def client():
        from flowscope.client.client import Client

        # closed at exit, when nothing can be imported any more: its batches are built from buffers
        # (model/arrow_values.py), so no pa.array() imports pandas then (nor earlier, into the user's program)
        return Client(address, run_id=run_id)

    _installed = LocalSchedulerCapture(client, level=os.environ.get(LEVEL_ENV) or DEFAULT_LEVEL)
    _installed.register()
    atexit.register(_installed.close)
    return _installed
