"""Per-thread I/O without patching: Linux per-thread I/O counters, and the files threads open.

Two observers, both cheap enough to leave on, both keyed by thread so that their rows join a
task through the thread that ran it and the time window it ran in (``io.tid`` /
``io.thread_ident`` + ``start_ns``/``end_ns``, see docs/data-model.md):

1. **Counters** -- ``/proc/self/task/<tid>/io``, where ``<tid>`` is the *native* thread id
   (``threading.get_native_id()``, gettid). :func:`read_thread_io` reads one thread,
   :func:`snapshot_threads` reads many (all threads of the process by default), and
   ``after - before`` (:class:`ThreadIO` subtraction) gives what a thread did in between.
   :func:`delta_since` does "now minus the snapshot" for one thread and treats a thread born after
   the snapshot as having started from zero (the kernel zeroes a new thread's counters).
   Nothing here has to run on the observed thread: a thread's counters can be read from any
   thread of the process, which is what a Dask worker plugin (hooks on the event-loop thread)
   needs. :func:`io_rows` turns a delta into ``io`` rows (``source="proc-io"``).

   Reads keep one open file descriptor per thread and pread it: about 3 us per thread read
   and parsed on the 2-CPU development VM (1.4 us of it the pread), against 7.5 us when the file
   is opened, read and closed each time. The pread goes through libc with the GIL held
   (:func:`_gil_holding_pread`): ``os.pread`` releases the GIL, and a thread that gives the GIL up
   while the event loop wants it waits to get it back (9 us on average with one busy thread here,
   62 us per read inside a busy Dask worker), for a kernel call that takes about 2 us; a snapshot of 6 given threads takes about 18 us (45 us
   uncached), of all 8 threads of a process through os.listdir 33 us (65 us). The descriptors are
   closed when their thread is gone, and in a forked child (whose copies describe the parent's
   threads).

2. **Opens** -- :class:`OpenAudit` installs, once per process, a ``sys.addaudithook`` hook that
   sees the ``"open"`` audit event raised by ``open()``/``io.open``/``pathlib``, ``os.open`` and
   ``io.open_code`` (imports) on any thread, and hands each open of a file as an ``io`` row
   (``source="audit"``, ``op="open"``, ``end_ns`` null) to a callable.

Which counter means what (kernel ``Documentation/filesystems/proc.rst`` and
``include/linux/task_io_accounting.h``; checked on ext4 and tmpfs by tests/test_thread_io.py):

``rchar`` / ``wchar``
    Bytes the thread passed through read-like / write-like system calls (``read``, ``pread``,
    ``readv``, ``write``, ``pwrite``, ``writev``, ``sendfile``, ``splice``, ``copy_file_range``),
    counted when the call returns, whatever the file is: regular files, but also pipes,
    terminals (a ``print``) and sockets used through ``read``/``write`` (not ``send``/``recv``).
    They say nothing about the disk: a read served from the page cache counts in full, a write
    counts in full the moment it is copied into the page cache. Memory-mapped I/O is not counted.
``syscr`` / ``syscw``
    Number of those read-like / write-like system calls.
``read_bytes``
    Bytes the thread caused to be fetched from the storage layer, counted when the block I/O is
    submitted (including readahead, so it can exceed what was asked for). Reads served from the
    page cache count 0 here. 0 on file systems without a block device (tmpfs).
``write_bytes``
    Bytes the thread caused to be sent to the storage layer, counted **when the thread dirties a
    page-cache page**, not when the page is written back: a buffered write counts at once (before
    any ``fsync``, which does not change the thread that is charged), in whole pages (a 3 MiB + 1
    byte file counts 3 MiB + 4 KiB), plus the odd metadata page the file system dirties on the
    thread's behalf (0-3 pages per file on ext4). A page that is still dirty when it is written
    again is not counted again. Writes through ``mmap`` count here (at page fault) but not in
    ``wchar``. ``O_DIRECT`` writes count when submitted. Stays 0 on file systems without
    writeback (tmpfs, ramfs).
``cancelled_write_bytes``
    Bytes of dirty pages this thread threw away before they reached storage, by truncating or
    deleting a file (``open(path, "w")`` on a file whose pages are still dirty counts here).
    The writer was charged ``write_bytes`` for them; the canceller is charged here, so
    ``write_bytes - cancelled_write_bytes`` is only meaningful summed over the whole process.

**Per-task "bytes written" is ``wchar``** (and "bytes read" is ``rchar``): it is exact, counted
at the call and on the thread that made the call, and does not depend on the page cache, the
file system or writeback. For a task that writes files of total size S through write calls,
``wchar == S`` exactly, plus whatever else the thread wrote through write calls during the task
(log lines, prints), so ``wchar >= S``. ``write_bytes`` is the storage-side view, kept in the
row's attrs: on a page-cache file system with writeback (ext4, xfs, NFS) and for newly written
files, ``S <= write_bytes <= S rounded up to pages + a few metadata pages``; it is lower when the
task rewrites pages that are still dirty, 0 on tmpfs, and it includes mmap writes. ``read_bytes``
is 0 for data already in the page cache (a file the same node wrote just before).

Counters are per thread, so a thread that runs one task at a time (a Dask executor thread) gives
the task's I/O exactly; a thread that interleaves work (the event-loop thread running async tasks)
gives the sum of everything it did in the window.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Self

from flowscope.model import identifiers as ids

try:  # the open audit hook in C (built with the package); without it, sys.addaudithook's Python hook
    from flowscope.sources import _open_hook
except ImportError:
    _open_hook = None

__all__ = ["OpenAudit", "ThreadIO", "ThreadIOReader", "audit_hook_installed", "delta_since", "io_rows",
           "parse_raw", "read_cost", "read_thread_io", "snapshot_threads", "thread_ids"]

_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes", "cancelled_write_bytes")
_KEYS = [f.encode() + b":" for f in _FIELDS]


class ThreadIO(NamedTuple):
    """The counters of /proc/self/task/<tid>/io (see the module docstring for what each means).

    ``a - b`` is the field-wise difference (what happened between two readings), ``a + b`` the
    field-wise sum; ``ThreadIO()`` is all zeros (a thread's counters when it is created)."""

    rchar: int = 0
    wchar: int = 0
    syscr: int = 0
    syscw: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    cancelled_write_bytes: int = 0

    def __sub__(self, other: ThreadIO) -> ThreadIO:  # type: ignore[override]
        if not isinstance(other, ThreadIO):
            return NotImplemented
        return ThreadIO(*[a - b for a, b in zip(self, other)])

    def __add__(self, other: ThreadIO) -> ThreadIO:  # type: ignore[override]
        if not isinstance(other, ThreadIO):
            return NotImplemented
        return ThreadIO(*[a + b for a, b in zip(self, other)])


ZERO = ThreadIO()


def read_cost(raw: bytes) -> ThreadIO:
    """What reading a counters file that returned ``raw`` added to the reading thread's own counters: one
    read call of ``len(raw)`` bytes. A delta between two readings on the same thread includes the first
    reading's cost; subtract it to get what the thread did in between."""
    return ThreadIO(rchar=len(raw), syscr=1)


def parse_raw(raw: bytes) -> ThreadIO | None:
    """The counters in the text of a /proc/<pid>/task/<tid>/io file (as ``ThreadIOReader.read_raw`` returns it)."""
    return _parse(raw)


def _parse(data: bytes) -> ThreadIO | None:
    parts = data.split()
    if len(parts) == 14 and parts[0] == b"rchar:" and parts[12] == b"cancelled_write_bytes:":
        return ThreadIO(*map(int, parts[1::2]))
    # another layout (a future kernel adding or reordering lines): go by name
    values = dict(zip(parts[0::2], parts[1::2]))
    try:
        return ThreadIO(*[int(values.get(k, 0)) for k in _KEYS]) if values else None
    except ValueError:
        return None


def _gil_holding_pread():
    """libc's pread called without releasing the GIL (ctypes.PyDLL), or None where unavailable."""
    try:
        import ctypes

        libc = ctypes.PyDLL(None, use_errno=True)
        fn = libc.pread
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
        fn.restype = ctypes.c_ssize_t
    except (OSError, AttributeError):
        return None
    get_errno = ctypes.get_errno

    def pread(fd: int, buf, size: int = 1024) -> bytes:
        n = fn(fd, buf, size, 0)
        if n < 0:
            e = get_errno()
            raise OSError(e, os.strerror(e))
        return buf.raw[:n]

    return pread, ctypes.create_string_buffer


_GIL_PREAD = _gil_holding_pread()


class ThreadIOReader:
    """Reads /proc/self/task/<tid>/io through one cached descriptor per thread (pread with the GIL held).

    Thread-safe. A descriptor whose thread has exited fails with ESRCH on the next read; it is
    closed then and the tid opened afresh once (the tid may have been reused by a new thread).
    ``snapshot(None)`` also closes the descriptors of threads that are no longer listed.
    ``cache=False`` opens, reads and closes the file on every read instead."""

    MAX_CACHED = 4096

    def __init__(self, cache: bool = True):
        self.cache = cache
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        if _GIL_PREAD is not None:
            pread, new_buffer = _GIL_PREAD
            buf = new_buffer(1024)  # one buffer is enough: reads happen under self._lock
            self._pread = lambda fd: pread(fd, buf)
        else:
            self._pread = lambda fd: os.pread(fd, 1024, 0)

    def _open(self, tid: int) -> int | None:
        try:
            return os.open(f"/proc/self/task/{tid}/io", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def _drop(self, tid: int) -> None:
        fd = self._fds.pop(tid, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _raw_locked(self, tid: int) -> bytes | None:
        if not self.cache:
            fd = self._open(tid)
            if fd is None:
                return None
            try:
                return self._pread(fd)
            except OSError:
                return None
            finally:
                os.close(fd)
        fd = self._fds.get(tid)
        for attempt in (0, 1):
            if fd is None:
                fd = self._open(tid)
                if fd is None:
                    return None
                if len(self._fds) >= self.MAX_CACHED:
                    self._close_all()
                self._fds[tid] = fd
            try:
                return self._pread(fd)
            except OSError:
                self._drop(tid)  # the thread is gone (ESRCH); a new thread may have its tid
                fd = None
        return None

    def _read_locked(self, tid: int) -> ThreadIO | None:
        raw = self._raw_locked(tid)
        return _parse(raw) if raw is not None else None

    def read(self, tid: int) -> ThreadIO | None:
        """The counters of native thread ``tid`` of this process, or None if it is gone or unreadable."""
        with self._lock:
            return self._read_locked(int(tid))

    def read_raw(self, tid: int) -> bytes | None:
        """The text of native thread ``tid``'s counters file as read (``parse_raw`` turns it into ThreadIO),
        or None if the thread is gone or the file unreadable: for hot paths that parse later, in bulk. Reading
        it adds ``len(text)`` to the thread's ``rchar`` and 1 to its ``syscr`` (see ``read_cost``)."""
        with self._lock:
            return self._raw_locked(tid)

    def snapshot(self, tids: Iterable[int] | None = None) -> dict[int, ThreadIO]:
        """``{tid: counters}`` for ``tids`` (all threads of this process when None); gone threads are left out."""
        with self._lock:
            if tids is None:
                try:
                    tids = [int(n) for n in os.listdir("/proc/self/task")]
                except OSError:
                    return {}
                if self.cache:
                    live = set(tids)
                    for tid in [t for t in self._fds if t not in live]:
                        self._drop(tid)
            out = {}
            for tid in tids:
                io = self._read_locked(int(tid))
                if io is not None:
                    out[int(tid)] = io
            return out

    def _close_all(self) -> None:
        for tid in list(self._fds):
            self._drop(tid)

    def close(self) -> None:
        with self._lock:
            self._close_all()

    def _after_fork_in_child(self) -> None:
        # the copies describe the parent's threads; another thread may have held the lock at fork
        self._lock = threading.Lock()
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass


_READER = ThreadIOReader()


def read_thread_io(tid: int) -> ThreadIO | None:
    """The I/O counters of native thread ``tid`` (``threading.get_native_id()``) of this process;
    None if the thread is gone or the file cannot be read (not Linux, no task I/O accounting)."""
    return _READER.read(tid)


def snapshot_threads(tids: Iterable[int] | None = None) -> dict[int, ThreadIO]:
    """``{native tid: ThreadIO}`` for ``tids``, or for every thread of this process (the entries
    of /proc/self/task, including threads Python did not start) when ``tids`` is None."""
    return _READER.snapshot(tids)


def delta_since(snapshot: Mapping[int, ThreadIO], tid: int) -> ThreadIO | None:
    """What native thread ``tid`` did since ``snapshot`` was taken: its counters now minus its
    counters in the snapshot, or minus zero if it was not in the snapshot (a thread started after
    it: a new thread's counters start at zero). None if the thread is gone. A negative field means
    the tid was reused by a new thread since the snapshot; the counters are then those of the new
    thread alone (returned as they are, minus zero)."""
    now = _READER.read(tid)
    if now is None:
        return None
    before = snapshot.get(tid)
    if before is None:
        return now
    d = now - before
    return now if min(d) < 0 else d


def thread_ids() -> dict[int, int]:
    """``{pthread ident (threading.get_ident, what Dask and Darshan DXT report): native id
    (threading.get_native_id, gettid, what /proc/self/task and flowscope thread resources use)}``
    for the Python threads of this process (threading.enumerate())."""
    out = {}
    for t in threading.enumerate():
        if t.ident is not None and t.native_id is not None:
            out[t.ident] = t.native_id
    return out


#: what a proc-io row says about itself (docs/data-model.md, "I/O rows that total many operations"): it totals
#: ``ops`` read or write system calls of one task; the time they took is not known
AGGREGATE = {"interface": "syscalls", "aggregate": True}
AGGREGATE_JSON = '"interface": "syscalls", "aggregate": true, '  # the same, spliced into hand-written JSON


def io_rows(delta: ThreadIO, *, tid: int, start_ns: int, end_ns: int, thread_ident: int | None = None,
            task_key: str | None = None, pid: int | None = None, host: str | None = None,
            skip_empty: bool = True, attrs: dict | None = None) -> list[dict[str, Any]]:
    """``io`` rows for one thread's counter delta over [start_ns, end_ns] (``source="proc-io"``):
    an ``op="read"`` row with ``nbytes=rchar`` (attrs: syscr, read_bytes) and an ``op="write"`` row
    with ``nbytes=wchar`` (attrs: syscw, write_bytes, cancelled_write_bytes). With ``skip_empty``,
    a direction with no calls and no bytes gives no row. Emit each with ``client.emit("io", **row)``."""
    pid = os.getpid() if pid is None else pid
    host = host or ids.hostname()
    common = {"resource_id": ids.thread_id(tid, pid, host), "host": host, "pid": pid, "tid": tid,
              "thread_ident": thread_ident, "source": "proc-io", "path": None, "start_ns": start_ns,
              "end_ns": end_ns, "task_key": task_key}
    rows = []
    if not skip_empty or delta.rchar or delta.syscr or delta.read_bytes:
        rows.append({**common, "op": "read", "nbytes": delta.rchar,
                     "attrs": json.dumps({"syscr": delta.syscr, "read_bytes": delta.read_bytes, **AGGREGATE,
                                          "ops": delta.syscr, **(attrs or {})})})
    if not skip_empty or delta.wchar or delta.syscw or delta.write_bytes or delta.cancelled_write_bytes:
        rows.append({**common, "op": "write", "nbytes": delta.wchar,
                     "attrs": json.dumps({"syscw": delta.syscw, "write_bytes": delta.write_bytes,
                                          "cancelled_write_bytes": delta.cancelled_write_bytes, **AGGREGATE,
                                          "ops": delta.syscw, **(attrs or {})})})
    return rows


# ---- the open audit hook -------------------------------------------------------------------------

_SKIP_PREFIXES = ("/proc/", "/sys/", "/dev/")
_SKIP_EXACT = frozenset(("/proc", "/sys", "/dev"))
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: flowscope's own package folder: its files are never the observed program's I/O
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_OWN_THREAD_PREFIX = "flowscope"  # the client's builder/senders, the collector's writers and HTTP thread

_installed: str | None = None  # the hook's kind once added: it stays until the process exits
_install_lock = threading.Lock()
_active: tuple[OpenAudit, ...] = ()  # enabled recorders; the hook does nothing when empty
_tls = threading.local()
_pid = os.getpid()


def _reset_pid() -> None:
    global _pid
    _pid = os.getpid()


def _after_fork_in_child() -> None:
    global _tls
    _reset_pid()
    _tls = threading.local()  # a thread forked from inside the hook would otherwise stay "busy"
    _READER._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _audit_hook(event: str, args: tuple) -> None:
    # The pure-Python hook (no compiled _open_hook): runs for every audit event of the process (id(),
    # sys._getframe, imports, sockets, ...), so the common case must return after one comparison.
    if event != "open" or not _active:
        return
    _on_open(args)


def _on_open_event(args: tuple) -> None:
    """What the compiled hook calls for an "open" event."""
    if _active:
        _on_open(args)


def _thread_facts(local: dict) -> tuple:
    """(native id, resource id, skip?) of the calling thread, computed on its first open and kept
    in its thread-local dict (threading.get_native_id() is a system call; Thread.native_id is stale
    in a forked child, whose thread-locals are reset by _after_fork_in_child)."""
    tid = threading.get_native_id()
    facts = (tid, ids.thread_id(tid, _pid), threading.current_thread().name.startswith(_OWN_THREAD_PREFIX))
    local["facts"] = facts
    return facts


def _attrs_json(mode: Any, flags: Any) -> str:
    s = json.dumps({"mode": mode, "flags": flags})
    if len(_attrs_cache) < 512:
        _attrs_cache[(mode, flags)] = s
    return s


_attrs_cache: dict[tuple, str] = {}


def _on_open(args: tuple) -> None:
    try:
        local = _tls.__dict__  # this thread's own dict
        if local.get("busy"):
            return  # an open made by a recorder's own emit (or anything it calls): no recursion
        local["busy"] = True
    except Exception:  # noqa: BLE001 - interpreter shutting down; never break the caller's open
        return
    try:
        tid, rid, own = local.get("facts") or _thread_facts(local)
        if own:
            return  # flowscope's own threads (client builder/senders, collector writers, HTTP)
        path, mode, flags = args
        if path.__class__ is not str:
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            elif isinstance(path, str):
                path = str(path)
            else:
                return  # open(fd): no file is being opened
        if path[:1] != "/":
            path = os.path.abspath(path)
        if path.startswith(_SKIP_PREFIXES) or path in _SKIP_EXACT:
            return
        if flags and flags & _O_DIRECTORY and (flags & _O_TMPFILE) != _O_TMPFILE:
            return  # a directory (os.fwalk, dir_fd), not a file
        ts = time.time_ns()
        pid = _pid
        host = ids.hostname()
        attrs = _attrs_cache.get((mode, flags)) or _attrs_json(mode, flags)
        ident = threading.get_ident()
        for rec in _active:  # each recorder gets its own dict: emit may keep or change it
            if rec._exclude and path.startswith(rec._exclude):
                continue
            rec._deliver({"resource_id": rid, "host": host, "pid": pid, "tid": tid, "thread_ident": ident,
                          "source": "audit", "op": "open", "path": path, "start_ns": ts, "end_ns": None,
                          "task_key": None, "attrs": attrs})
    except Exception:  # noqa: BLE001, S110 - the hook runs inside arbitrary code: it must never raise
        pass
    finally:
        local["busy"] = False


@contextlib.contextmanager
def own_opens() -> Iterator[None]:
    """Files opened on this thread inside the block are flowscope's own (a lock file, a spool): no recorder sees them,
    whichever thread this is (a Dask worker's event loop runs flowscope's periodic work beside the workflow's)."""
    local = _tls.__dict__
    before = local.get("busy", False)
    local["busy"] = True
    try:
        yield
    finally:
        local["busy"] = before


def audit_hook_installed() -> bool:
    """Whether this process's open audit hook is in place (it stays until the process exits)."""
    return _installed is not None


def audit_hook_kind() -> str | None:
    """Which open audit hook this process has: ``"compiled"`` (``_open_hook.c``: Python is called for "open"
    events only), ``"python"`` (``sys.addaudithook``: a Python call for every audit event; without the build, or
    with FLOWSCOPE_COMPILED=0), or None (none yet)."""
    return _installed


def _install() -> None:
    global _installed
    if _installed:
        return
    with _install_lock:
        if not _installed:
            if _open_hook is not None and os.environ.get("FLOWSCOPE_COMPILED", "1") != "0":
                _open_hook.install(_on_open_event)
                _installed = "compiled"
            else:
                sys.addaudithook(_audit_hook)
                _installed = "python"


class OpenAudit:
    """Records the files this process opens, on every thread, as ``io`` rows handed to ``emit``.

    Each row is a dict: ``resource_id`` (the opening thread's resource id), ``host``, ``pid``,
    ``tid`` (native id), ``thread_ident`` (pthread id), ``source="audit"``, ``op="open"``,
    ``path`` (absolute; relative paths are resolved against the current directory at the open),
    ``start_ns`` (time.time_ns() at the open), ``end_ns=None``, ``task_key=None`` and ``attrs``, a
    JSON string ``{"mode": ..., "flags": ...}`` (mode as Python's open gives it, e.g. "w", "rb" --
    null for os.open; flags the os.O_* bits). Pass it on as ``client.emit("io", **row)``.

    The event is raised *before* the open is attempted, so an open that then fails (missing file,
    permission) is recorded too. Left out: opens of file descriptors (``open(fd)``), directories,
    anything under /proc, /sys and /dev, paths under ``exclude`` prefixes and under flowscope's own
    package folder, opens made by
    flowscope's own threads (names starting with "flowscope") and opens made while ``emit`` runs
    on the same thread (a thread-local guard; this also stops any recursion), and every open while
    the recorder is disabled.

    ``emit`` runs on the opening thread, inside the caller's ``open``: keep it short. An exception
    it raises is swallowed (counted in ``errors``, the last one kept in ``last_error``); the
    caller's open goes on. Audit hooks cannot be removed, so the process-wide hook is installed
    once, on the first ``enable()``, and ``enable()``/``disable()`` only add or remove this
    recorder from the hook's list; with no recorder enabled the hook costs one comparison per
    audit event.
    """

    def __init__(self, emit: Callable[[dict], None], *, exclude: Iterable[str] = (), enable: bool = False):
        self.emit = emit
        # "dir/": whole folders; flowscope's own package always (an editable install's sources are outside
        # sys.prefix, and a lazily imported module of ours is no I/O of the observed program)
        self._exclude = tuple(os.path.join(os.path.abspath(p), "") for p in (*exclude, _PACKAGE_DIR))
        self.recorded = 0
        self.errors = 0
        self.last_error: BaseException | None = None
        if enable:
            self.enable()

    def _deliver(self, row: dict) -> None:
        try:
            self.emit(row)
            self.recorded += 1
        except Exception as exc:  # noqa: BLE001 - never let a recorder break the caller's open
            self.errors += 1
            self.last_error = exc

    @property
    def enabled(self) -> bool:
        return self in _active

    def enable(self) -> Self:
        """Start recording (installs the process-wide hook the first time)."""
        global _active
        _install()
        with _install_lock:
            if self not in _active:
                _active = (*_active, self)
        return self

    def disable(self) -> None:
        """Stop recording; the hook stays installed (it cannot be removed) but ignores this recorder."""
        global _active
        with _install_lock:
            _active = tuple(r for r in _active if r is not self)

    def __enter__(self) -> Self:
        return self.enable()

    def __exit__(self, *exc) -> None:
        self.disable()
