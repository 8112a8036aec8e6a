"""Per-thread I/O counters and the open audit hook (flowscope.sources.thread_io), on real files and threads."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from flowscope.model.conform import conform
from flowscope.sources import thread_io as tio
from flowscope.sources.thread_io import (
    OpenAudit,
    ThreadIO,
    ThreadIOReader,
    delta_since,
    io_rows,
    read_thread_io,
    snapshot_threads,
    thread_ids,
)

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/io"),
                                reason="needs Linux per-thread I/O accounting (/proc/self/task/<tid>/io)")

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
SLACK = 64 * 1024  # metadata pages a file system may dirty on the writer's behalf; reads of the counters


def fs_type(path: Path) -> str:
    """The file-system type of the mount holding ``path`` (longest mount point that prefixes it)."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/self/mounts") as f:
        for line in f:
            _, mnt, typ = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, kind = mnt, typ
    return kind


WRITEBACK_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "jfs", "reiserfs", "nfs", "nfs4"}


def roundup(n: int) -> int:
    return -(-n // PAGE) * PAGE


class Parked(threading.Thread):
    """A thread that runs ``work`` when released, then stays alive until told to finish, so that its
    counters can be read from another thread after the work (as a worker plugin does)."""

    def __init__(self, work, name=None):
        super().__init__(name=name, daemon=True)
        self.work = work
        self.go = threading.Event()
        self.done = threading.Event()
        self.finish = threading.Event()
        self.ready = threading.Event()
        self.error = None
        self.result = None

    def run(self):
        self.ready.set()
        self.go.wait()
        try:
            self.result = self.work()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        self.done.set()
        self.finish.wait()


def write_file(path: Path, size: int, fsync: bool = False) -> None:
    with open(path, "wb") as f:
        f.write(b"x" * size)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def read_file(path: Path) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- counters ---------------------------------------------------------------------------------------

def _tgid(tid: int) -> int | None:
    """The process thread ``tid`` belongs to, None when there is no such thread now."""
    try:
        with open(f"/proc/{tid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
    except (OSError, StopIteration):
        return None


def test_read_and_snapshot_the_threads_of_this_process():
    me = threading.get_native_id()
    io = read_thread_io(me)
    assert isinstance(io, ThreadIO) and all(isinstance(v, int) and v >= 0 for v in io)
    assert io.rchar > 0  # at least the interpreter's start-up reads
    assert read_thread_io(2**31 - 7) is None  # no such thread
    snap = snapshot_threads()
    assert me in snap and os.getpid() in snap  # the main thread's tid is the pid
    assert {t.native_id for t in threading.enumerate()} <= set(snap)
    # every tid read is a thread of this process: still one of its tasks, or one that has ended since (the worker
    # process running this test has other threads, which may end between the snapshot and this check)
    ended = {t for t in snap if str(t) not in os.listdir("/proc/self/task")}
    assert all(_tgid(t) in (None, os.getpid()) for t in ended), {t: _tgid(t) for t in ended}
    assert set(snapshot_threads([me, 2**31 - 7])) == {me}


def test_threadio_arithmetic():
    a = ThreadIO(10, 20, 3, 4, 4096, 8192, 0)
    b = ThreadIO(1, 2, 1, 1, 0, 4096, 0)
    assert a - b == ThreadIO(9, 18, 2, 3, 4096, 4096, 0)
    assert (a - b).wchar == 18
    assert b + (a - b) == a
    assert ThreadIO() == ThreadIO(0, 0, 0, 0, 0, 0, 0) == a - a


def test_cached_and_uncached_readers_agree_and_see_new_writes(tmp_path):
    me = threading.get_native_id()
    cached, plain = ThreadIOReader(cache=True), ThreadIOReader(cache=False)
    try:
        before = cached.read(me)
        (tmp_path / "f").write_bytes(b"y" * 12345)
        after_c, after_p = cached.read(me), plain.read(me)
        assert (after_c - before).wchar == 12345  # the cached descriptor re-reads fresh values
        # both read the same counters: only the counter reads themselves differ (a pread each)
        assert after_p.wchar == after_c.wchar and after_p.write_bytes == after_c.write_bytes
        assert me in cached._fds and not plain._fds
    finally:
        cached.close()
        plain.close()
    assert not cached._fds


def test_each_thread_delta_counts_its_own_files_only(tmp_path):
    """Two threads write 3 MiB (no fsync) and 5 MiB (fsync) at the same time; each then reads a file.
    Snapshots are taken from the main thread, before and after, as a worker plugin would."""
    sizes = {"a": 3 * MiB, "b": 5 * MiB}
    a_file, b_file = tmp_path / "a.bin", tmp_path / "b.bin"
    cold = tmp_path / "cold.bin"
    write_file(cold, 2 * MiB, fsync=True)
    drop_cache(cold)

    def work_a():
        write_file(a_file, sizes["a"])
        return read_file(a_file)  # its own file, still in the page cache

    def work_b():
        write_file(b_file, sizes["b"], fsync=True)
        return read_file(cold)  # a file evicted from the page cache: read from storage

    ta, tb = Parked(work_a, "writer-a"), Parked(work_b, "writer-b")
    for t in (ta, tb):
        t.start()
        t.ready.wait()
    before = snapshot_threads()
    main_before = read_thread_io(threading.get_native_id())
    for t in (ta, tb):
        t.go.set()
    for t in (ta, tb):
        assert t.done.wait(60)
        assert t.error is None, t.error
    da, db = delta_since(before, ta.native_id), delta_since(before, tb.native_id)
    main_delta = read_thread_io(threading.get_native_id()) - main_before
    for t in (ta, tb):
        t.finish.set()
        t.join()

    assert ta.result == sizes["a"] and tb.result == 2 * MiB
    # wchar: exactly the bytes each thread wrote, never the other thread's
    assert sizes["a"] <= da.wchar < sizes["a"] + SLACK, da
    assert sizes["b"] <= db.wchar < sizes["b"] + SLACK, db
    assert da.syscw >= 1 and db.syscw >= 1
    assert main_delta.wchar < SLACK and main_delta.write_bytes < SLACK  # the main thread wrote nothing
    # rchar: the bytes each thread read (from cache or not)
    assert sizes["a"] <= da.rchar < sizes["a"] + SLACK, da
    assert 2 * MiB <= db.rchar < 2 * MiB + SLACK, db
    kind = fs_type(tmp_path)
    if kind in WRITEBACK_FS:
        # write_bytes: charged to the dirtying thread at write time, in pages, fsync or not
        assert sizes["a"] <= da.write_bytes <= roundup(sizes["a"]) + SLACK, (kind, da)
        assert sizes["b"] <= db.write_bytes <= roundup(sizes["b"]) + SLACK, (kind, db)
        assert da.read_bytes < SLACK  # its own file came from the page cache
        assert db.read_bytes >= MiB, (kind, db)  # the evicted file came from storage (+ readahead)
    elif kind in ("tmpfs", "ramfs"):
        assert da.write_bytes == db.write_bytes == 0


def test_page_cache_rules(tmp_path):
    """The documented write_bytes rules: pages not bytes, no double count of a still-dirty page,
    a truncation of dirty pages charged to cancelled_write_bytes, tmpfs never counts."""
    if fs_type(tmp_path) not in WRITEBACK_FS:
        pytest.skip(f"{tmp_path} is on {fs_type(tmp_path)}, not a file system with writeback")
    me = threading.get_native_id()
    f = tmp_path / "p.bin"

    b = read_thread_io(me)
    write_file(f, MiB + 1)  # one byte into a new page
    d = read_thread_io(me) - b
    assert d.wchar == MiB + 1
    assert roundup(MiB + 1) <= d.write_bytes <= roundup(MiB + 1) + SLACK

    b = read_thread_io(me)
    with open(f, "r+b") as fh:  # rewrite pages that are still dirty: wchar counts, write_bytes does not
        fh.write(b"z" * MiB)
    d = read_thread_io(me) - b
    assert d.wchar == MiB and d.write_bytes < SLACK, d

    b = read_thread_io(me)
    write_file(f, 4096)  # "wb" truncates: the dirty pages are thrown away, charged to this thread
    d = read_thread_io(me) - b
    assert d.cancelled_write_bytes >= MiB, d

    shm = Path("/dev/shm")
    if shm.is_dir() and fs_type(shm) == "tmpfs" and os.access(shm, os.W_OK):
        g = shm / f"flowscope-test-{os.getpid()}"
        try:
            b = read_thread_io(me)
            write_file(g, 2 * MiB)
            d = read_thread_io(me) - b
            assert d.wchar == 2 * MiB and d.write_bytes == 0, d
        finally:
            g.unlink(missing_ok=True)


def test_delta_for_a_thread_born_after_the_snapshot_and_for_a_gone_thread(tmp_path):
    before = snapshot_threads()
    t = Parked(lambda: write_file(tmp_path / "late.bin", MiB))
    t.start()
    t.ready.wait()
    assert t.native_id not in before
    t.go.set()
    assert t.done.wait(30)
    d = delta_since(before, t.native_id)  # from zero: a new thread's counters start at zero
    assert MiB <= d.wchar < MiB + SLACK, d
    tid = t.native_id
    t.finish.set()
    t.join()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_thread_io(tid) is None and delta_since(before, tid) is None
    assert tid not in snapshot_threads()
    assert tid not in tio._READER._fds  # its descriptor was closed


def test_thread_ids_maps_pthread_ident_to_native_id():
    ids_ = thread_ids()
    assert ids_[threading.get_ident()] == threading.get_native_id()
    seen = {}
    t = Parked(lambda: seen.update(ident=threading.get_ident(), native=threading.get_native_id()))
    t.start()
    t.go.set()
    t.done.wait(10)
    try:
        m = thread_ids()
        assert m[seen["ident"]] == seen["native"] == t.native_id
        assert set(m.values()) <= set(snapshot_threads())  # every Python thread has counters
    finally:
        t.finish.set()
        t.join()


def test_io_rows_fit_the_io_table():
    d = ThreadIO(rchar=100, wchar=3 * MiB, syscr=2, syscw=1, read_bytes=0, write_bytes=3 * MiB + 4096)
    rows = io_rows(d, tid=123, thread_ident=456, start_ns=1_000, end_ns=2_000, task_key="x-1")
    assert [r["op"] for r in rows] == ["read", "write"]
    w = rows[1]
    assert w["nbytes"] == 3 * MiB and w["source"] == "proc-io" and w["task_key"] == "x-1"
    assert w["tid"] == 123 and w["thread_ident"] == 456 and w["pid"] == os.getpid()
    # one row totals the task's write calls (ops), with no time of their own (docs/data-model.md)
    assert json.loads(w["attrs"]) == {"syscw": 1, "write_bytes": 3 * MiB + 4096, "cancelled_write_bytes": 0,
                                      "interface": "syscalls", "aggregate": True, "ops": 1}
    assert io_rows(ThreadIO(), tid=1, start_ns=1, end_ns=2) == []
    assert len(io_rows(ThreadIO(), tid=1, start_ns=1, end_ns=2, skip_empty=False)) == 2
    conform("io", pa.Table.from_pylist(rows))  # raises if a column does not fit


# ---- the open audit hook --------------------------------------------------------------------------

def opener(paths, audit: OpenAudit):
    """Work for a thread: open paths[0] before enable, paths[1] while enabled, paths[2] after disable."""
    def work():
        open(paths[0], "w").close()
        audit.enable()
        try:
            with open(paths[1], "wb") as f:
                f.write(b"1")
        finally:
            audit.disable()
        open(paths[2], "w").close()
        return threading.get_ident()
    return work


def test_open_audit_records_a_threads_opens_only_while_enabled(tmp_path):
    rows = []
    audit = OpenAudit(rows.append)
    paths = [tmp_path / f"f{i}" for i in range(3)]
    t = Parked(opener(paths, audit))
    t.start()
    t.go.set()
    assert t.done.wait(10) and t.error is None, t.error
    t.finish.set()
    t.join()
    assert tio.audit_hook_installed() and not audit.enabled
    mine = [r for r in rows if r["tid"] == t.native_id]
    assert [r["path"] for r in mine] == [str(paths[1])], rows
    r = mine[0]
    assert r["thread_ident"] == t.result and r["pid"] == os.getpid()
    assert r["source"] == "audit" and r["op"] == "open" and r["end_ns"] is None and r["task_key"] is None
    assert r["resource_id"] == f"thread:{r['host']}:{os.getpid()}:{t.native_id}"
    assert abs(r["start_ns"] - time.time_ns()) < 60e9
    attrs = json.loads(r["attrs"])
    assert attrs["mode"] == "w" and attrs["flags"] & os.O_WRONLY and attrs["flags"] & os.O_CREAT
    assert audit.recorded == 1 and audit.errors == 0
    conform("io", pa.Table.from_pylist(mine))


def test_open_audit_filters(tmp_path, monkeypatch):
    rows = []
    keep_out = tmp_path / "excluded"
    keep_out.mkdir()
    monkeypatch.chdir(tmp_path)
    with OpenAudit(rows.append, exclude=[keep_out]) as audit:
        open("relative.txt", "w").close()                 # recorded, made absolute
        fd = os.open(tmp_path / "raw", os.O_WRONLY | os.O_CREAT, 0o644)  # os.open: recorded, mode null
        with open(fd, "w"):                               # open(fd): no file is opened
            pass
        with open(b"/proc/self/status", "rb") as f:       # /proc: skipped
            f.read()
        os.close(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))  # a directory: skipped
        open(keep_out / "x", "w").close()                 # excluded folder: skipped
        read_thread_io(threading.get_native_id())         # the reader's own /proc opens: skipped
        own = threading.Thread(target=lambda: open(tmp_path / "own", "w").close(), name="flowscope-writer-9")
        own.start()
        own.join()                                        # flowscope's own threads: skipped
        with pytest.raises(FileNotFoundError):            # an open that fails is still an attempt
            open(tmp_path / "missing" / "x").close()
        import flowscope                                  # flowscope's own files (an editable install's
        open(flowscope.__file__, "rb").close()            # sources, lazily imported modules): skipped
    assert not audit.enabled
    got = [(r["path"], json.loads(r["attrs"])["mode"]) for r in rows]
    assert got == [(str(tmp_path / "relative.txt"), "w"), (str(tmp_path / "raw"), None),
                   (str(tmp_path / "missing" / "x"), "r")], got


def test_open_audit_never_recurses_and_skips_its_own_writes(tmp_path):
    log = tmp_path / "audit.log"
    depth = threading.local()

    def emit(row):  # a recorder that writes every row to a file: its own opens must not be recorded
        depth.n = getattr(depth, "n", 0) + 1
        assert depth.n == 1, "re-entered"
        try:
            with open(log, "a") as f:
                f.write(json.dumps(row) + "\n")
        finally:
            depth.n -= 1

    with OpenAudit(emit) as audit:
        for i in range(3):
            (tmp_path / f"d{i}").write_text("data")
    logged = [json.loads(line)["path"] for line in log.read_text().splitlines()]
    assert logged == [str(tmp_path / f"d{i}") for i in range(3)]
    assert audit.errors == 0 and audit.recorded == 3


def test_exceptions_inside_emit_do_not_break_the_opening_code(tmp_path):
    def bad(row):
        raise ValueError("emit failed")

    def worse(row):
        raise RecursionError("deep")

    seen = []
    with OpenAudit(bad) as a, OpenAudit(worse) as b, OpenAudit(seen.append) as c:
        p = tmp_path / "ok.txt"
        p.write_text("still works")
        results = []
        ts = [threading.Thread(target=lambda i=i: results.append((tmp_path / f"t{i}").write_text("x")))
              for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert p.read_text() == "still works" and results == [1, 1, 1, 1]
    assert a.errors == b.errors == 6 and isinstance(a.last_error, ValueError)
    assert isinstance(b.last_error, RecursionError)
    assert c.errors == 0 and len(seen) == 6  # one recorder failing does not starve another


def test_install_is_idempotent_and_enable_twice_records_once(tmp_path):
    rows = []
    a = OpenAudit(rows.append)
    a.enable()
    a.enable()
    try:
        assert tio._active.count(a) == 1
        open(tmp_path / "once", "w").close()
    finally:
        a.disable()
        a.disable()
    tio._install()
    tio._install()
    assert [r["path"] for r in rows] == [str(tmp_path / "once")]
    open(tmp_path / "after", "w").close()
    assert len(rows) == 1 and a not in tio._active


def test_open_audit_attributes_concurrent_opens_to_their_threads(tmp_path):
    rows = []
    lock = threading.Lock()

    def emit(row):
        with lock:
            rows.append(row)

    n, per = 6, 50
    barrier = threading.Barrier(n)
    who = {}

    def work(i):
        who[i] = (threading.get_native_id(), threading.get_ident())
        barrier.wait()
        for j in range(per):
            with open(tmp_path / f"w{i}-{j}", "wb") as f:
                f.write(b"x")

    with OpenAudit(emit):
        ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert len(rows) == n * per
    for r in rows:
        i = int(Path(r["path"]).name[1:].split("-")[0])
        assert (r["tid"], r["thread_ident"]) == who[i]


def test_after_fork_the_child_reads_its_own_threads_and_records_its_own_pid(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    me = threading.get_native_id()
    assert read_thread_io(me) is not None  # the parent's descriptor is now cached
    out = tmp_path / "child.json"
    rows = []
    with OpenAudit(rows.append):
        pid = os.fork()
        if pid == 0:  # child: report, then leave without running pytest's teardown
            code = 1
            try:
                child_tid = threading.get_native_id()
                b = read_thread_io(child_tid)
                with open(tmp_path / "child.bin", "wb") as f:
                    f.write(b"c" * 100_000)
                d = read_thread_io(child_tid) - b
                res = {"tid": child_tid, "pid": os.getpid(), "snap": sorted(snapshot_threads()),
                       "wchar": d.wchar, "fds": sorted(tio._READER._fds),
                       "row": [r for r in rows if r["path"].endswith("child.bin")]}
                fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o644)
                os.write(fd, json.dumps(res).encode())
                os.close(fd)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    res = json.loads(out.read_text())
    assert res["tid"] == res["pid"] == pid and res["snap"] == [pid]
    assert 100_000 <= res["wchar"] < 100_000 + SLACK
    assert me not in res["fds"]  # the parent's descriptors were dropped in the child
    assert [(r["pid"], r["tid"]) for r in res["row"]] == [(pid, pid)]
    assert not [r for r in rows if r["path"].endswith("child.bin")]  # the child's rows stayed in the child


def test_rows_go_through_a_real_client_into_the_io_table(tmp_path):
    from flowscope import Client
    from flowscope.store.run import open_run

    data = tmp_path / "data"
    data.mkdir()
    with Client(store=tmp_path / "store", name="thread-io") as client:
        t = Parked(lambda: write_file(data / "out.bin", 3 * MiB), name="task-thread")
        t.start()
        t.ready.wait()
        start = time.time_ns()
        before = snapshot_threads()
        with OpenAudit(lambda row: client.emit("io", **row)):
            t.go.set()
            assert t.done.wait(30)
        d = delta_since(before, t.native_id)
        end = time.time_ns()
        for row in io_rows(d, tid=t.native_id, thread_ident=t.ident, start_ns=start, end_ns=end, task_key="w-0"):
            client.emit("io", **row)
        t.finish.set()
        t.join()
        run_dir = client.run_dir
    io = open_run(run_dir).sql("SELECT source, op, path, nbytes, tid, thread_ident, task_key, start_ns, end_ns "
                               "FROM io ORDER BY source, op")
    opens = io[io.source == "audit"]
    assert list(opens.path) == [str(data / "out.bin")] and list(opens.tid) == [t.native_id]
    w = io[(io.source == "proc-io") & (io.op == "write")].iloc[0]
    assert 3 * MiB <= w["nbytes"] < 3 * MiB + SLACK and w.task_key == "w-0" and w.thread_ident == t.ident
    # the open joins the task's row by thread and time
    o = opens.iloc[0]
    assert o.tid == w.tid and w.start_ns <= o.start_ns <= w.end_ns


def test_a_task_is_matched_to_the_call_that_reported_its_own_compute_times(tmp_path):
    """Dask stamps a task's compute times with the scheduler offset of the moment it ran; when a heartbeat has
    moved the offset since, the nearest call by time can be another task's. The call whose result reported
    exactly those times is the one that ran the task, whatever the offset did."""
    from concurrent.futures import ThreadPoolExecutor

    from flowscope.sources.dask.plugins import MeasuringThreadPoolExecutor

    delay = 1000.0  # the offset Dask added when both tasks ran

    def task(path: Path, n: int) -> dict:
        start = time.time()
        path.write_bytes(b"x" * n)
        return {"op": "task-finished", "start": start + delay, "stop": time.time() + delay}

    inner = ThreadPoolExecutor(1)
    ex = MeasuringThreadPoolExecutor(inner, tio.ThreadIOReader())
    try:
        submitted = time.time()
        first = ex.submit(task, tmp_path / "a", 300_000).result()
        second = ex.submit(task, tmp_path / "b", 900_000).result()
        ident = inner.submit(threading.get_ident).result()
        # a heartbeat moved the estimate by the length of both calls: looked up with the current estimate, the
        # first task's times fall on the second call
        moved = delay - (second["stop"] - first["start"])
        for msg, n in ((first, 300_000), (second, 900_000)):
            call = ex.window(ident, submitted, msg["start"] - moved, msg["stop"] - moved,
                             reported=(msg["start"], msg["stop"]))
            assert call is not None
            assert n <= call[2].wchar < n + 64 * 1024, (n, call[2])
    finally:
        inner.shutdown()


_HOOK_KIND_SCRIPT = """
import json, sys
from flowscope.sources import thread_io as tio
rows = []
with tio.OpenAudit(rows.append):
    open(sys.argv[1], "w").close()
for i in range(1000):
    id(i)  # the frequent event a Python-level hook would pay for
print(json.dumps({"kind": tio.audit_hook_kind(), "paths": [r["path"] for r in rows]}))
"""


@pytest.mark.parametrize("compiled", ["1", "0"])
def test_the_open_hook_is_compiled_when_built_and_both_kinds_record_the_same_opens(tmp_path, compiled):
    """The process-wide hook sees every audit event (Dask's scheduler raises ~130,000 ``builtins.id`` per 20,000
    tasks): it is a C hook when the package is built, and FLOWSCOPE_COMPILED=0 keeps the Python one; both record
    the same open."""
    import subprocess
    import sys

    target = tmp_path / f"opened-{compiled}.txt"
    out = subprocess.run([sys.executable, "-c", _HOOK_KIND_SCRIPT, str(target)], capture_output=True, text=True,
                         env={**os.environ, "FLOWSCOPE_COMPILED": compiled}, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"kind": "compiled" if compiled == "1" else "python", "paths": [str(target)]}
