"""The hardware sampler: this host's CPU, memory, swap, load, network, disk and GPUs, sampled every
``period`` seconds into the ``metrics`` table, namespace ``hardware``, on the host's resource.

One process per host samples: ``acquire_host_lease`` elects it with an exclusive lock on a file named
after the host (and, optionally, the run), released by ``HostLease.release()`` or by the process's death.

Metric names (``<i>`` a CPU's or GPU's index, ``<nic>`` a network interface's name as the OS gives it):

=================================  ===========================================================
``cpu.percent``                    busy time of all CPUs over the interval, 0-100 (100 = all busy)
``cpu.iowait.percent``             time all CPUs sat idle waiting for I/O, 0-100 (Linux)
``cpu.core<i>.percent``            busy time of CPU ``i``, 0-100
``memory.used_bytes``              memory in use (psutil's ``used``, what ``free`` shows)
``memory.available_bytes``         memory that can be given to processes without swapping
``memory.percent``                 (total - available) / total, 0-100
``swap.used_bytes``                swap in use
``load.1m``, ``load.5m``,          load average over 1, 5 and 15 minutes
``load.15m``
``net.rx_bytes_per_s``,            bytes received / sent per second, all interfaces but loopback
``net.tx_bytes_per_s``
``net.<nic>.rx_bytes_per_s``,      the same for one interface
``net.<nic>.tx_bytes_per_s``
``disk.read_bytes_per_s``,         bytes read / written per second on the host's physical disks
``disk.write_bytes_per_s``
``disk.read_ops_per_s``,           read / write operations completed per second on those disks
``disk.write_ops_per_s``
``gpu<i>.utilization.percent``     time the GPU was running kernels, 0-100 (NVML)
``gpu<i>.memory.used_bytes``       GPU memory in use (NVML)
``gpu<i>.memory.total_bytes``      GPU memory size (NVML)
=================================  ===========================================================

Every metric of one sample has the same ``ts_ns``: the end of the interval that its percentages and
rates cover (the time since the previous sample). Physical disks are whole block devices that no other
block device sits below (partitions, device-mapper, md RAID, loop and RAM disks are left out, so that a
byte is counted once). GPU metrics appear when ``pynvml`` imports and NVML initialises; otherwise there
are none, without error.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from flowscope.model import identifiers as ids
from flowscope.sources.thread_io import own_opens

log = logging.getLogger("flowscope.hardware")

NAMESPACE = "hardware"
LOCK_DIR_ENV = "FLOWSCOPE_LOCK_DIR"

Metrics = list[tuple[str, float]]


# ---- rates from counters ------------------------------------------------------------------------

def counter_rates(prev: Mapping[str, tuple[int, ...]], cur: Mapping[str, tuple[int, ...]],
                  counted: Callable[[str], bool], dt: float) -> tuple[dict[str, tuple[float, ...]], bool]:
    """Per-second rates of the counters of each device present in both ``prev`` and ``cur`` and
    ``counted``, and whether any device was. A device that appeared or vanished in between, or whose
    counters went back (it was reset, or a counter wrapped), has no rate for this interval."""
    rates: dict[str, tuple[float, ...]] = {}
    seen = False
    for dev, now in cur.items():
        before = prev.get(dev)
        if before is None or not counted(dev):
            continue
        seen = True
        deltas = [b - a for a, b in zip(before, now, strict=True)]
        if min(deltas) >= 0:
            rates[dev] = tuple(d / dt for d in deltas)
    return rates, seen


def _cpu_split(t: Any) -> tuple[float, float, float]:
    """(total, busy, iowait) seconds of one CPU's times, the way psutil's cpu_percent counts them."""
    total = sum(t)
    if sys.platform.startswith("linux"):  # guest time is already counted in user and nice
        total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    iowait = getattr(t, "iowait", 0.0)
    return total, total - t.idle - iowait, iowait


def _cpu_counters() -> list[tuple[float, float, float]]:
    return [_cpu_split(t) for t in psutil.cpu_times(percpu=True)]


def _net_counters() -> dict[str, tuple[int, int]]:
    # nowrap=False: a counter that wraps gives no rate for one interval, and reading is cheaper
    return {n: (c.bytes_recv, c.bytes_sent) for n, c in psutil.net_io_counters(pernic=True, nowrap=False).items()}


def _disk_counters() -> dict[str, tuple[int, int, int, int]]:
    return {d: (c.read_bytes, c.write_bytes, c.read_count, c.write_count)
            for d, c in (psutil.disk_io_counters(perdisk=True, nowrap=False) or {}).items()}


# ---- which devices count ------------------------------------------------------------------------

def _is_loopback(nic: str) -> bool:
    try:
        stats = psutil.net_if_stats().get(nic)
    except OSError:
        stats = None
    flags = getattr(stats, "flags", None)
    if flags is not None:
        return "loopback" in flags.split(",")
    return nic == "lo" or re.fullmatch(r"lo\d*", nic) is not None


_NOT_PHYSICAL = re.compile(r"(loop|ram|zram)\d+")


def _is_physical_disk(disk: str) -> bool:
    """A whole disk with nothing below it: on Linux a /sys/block entry without slaves that is not a
    loop or RAM disk; elsewhere every disk psutil lists (they are whole disks there)."""
    if not sys.platform.startswith("linux"):
        return True
    block = Path("/sys/block") / disk.replace("/", "!")
    if not block.is_dir() or _NOT_PHYSICAL.fullmatch(disk):
        return False
    try:
        return not any((block / "slaves").iterdir())
    except OSError:
        return True


class _Classifier:
    """Remembers, per device name, whether a device counts; a name is looked at once."""

    def __init__(self, test: Callable[[str], bool]):
        self._test = test
        self._known: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        try:
            return self._known[name]
        except KeyError:
            ok = self._known[name] = bool(self._test(name))
            return ok


# ---- GPUs -----------------------------------------------------------------------------------------

class _Nvml:
    """The host's GPUs through NVML, or None from ``open()`` when pynvml or NVML is not there."""

    def __init__(self, nvml: Any, handles: list[tuple[int, Any]]):
        self.nvml = nvml
        self.handles = handles  # (NVML index, handle)

    @classmethod
    def open(cls) -> _Nvml | None:
        try:
            import pynvml  # type: ignore[import-not-found]
        except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install: no GPU metrics
            log.debug("no GPU metrics: pynvml does not import (%s)", exc)
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            log.debug("no GPU metrics: NVML does not initialise (%s)", exc)
            return None
        handles = []
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handles.append((i, pynvml.nvmlDeviceGetHandleByIndex(i)))
                except Exception as exc:  # noqa: BLE001 - e.g. a GPU this process may not see
                    log.warning("no metrics for GPU %d: %s", i, exc)
        except Exception as exc:  # noqa: BLE001
            log.warning("no GPU metrics: NVML cannot count the GPUs (%s)", exc)
        if not handles:
            pynvml.nvmlShutdown()
            return None
        return cls(pynvml, handles)

    def sample(self, out: Metrics) -> None:
        failed = None
        for i, h in self.handles:
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(h)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
            except Exception as exc:  # noqa: BLE001 - one lost GPU does not hide the others
                failed = failed or exc
                continue
            out += [(f"gpu{i}.utilization.percent", float(util.gpu)),
                    (f"gpu{i}.memory.used_bytes", float(mem.used)),
                    (f"gpu{i}.memory.total_bytes", float(mem.total))]
        if failed is not None:
            raise failed

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


# ---- the sampler ----------------------------------------------------------------------------------

class _Counters(NamedTuple):
    mono: float
    ts_ns: int
    cpus: list[tuple[float, float, float]]
    net: dict[str, tuple[int, int]]
    disk: dict[str, tuple[int, int, int, int]]


class HardwareSampler:
    """Samples this host's hardware every ``period`` seconds (default 1) into ``client``'s ``metrics``
    table, namespace ``hardware``, on ``resource_id`` (default the host's resource, which it declares).

    ``start()`` begins sampling in a daemon thread: a first sample ``first_interval`` seconds after the start
    (default the smaller of 0.1 s and the period, so that the curve begins with the run rather than a period
    later), then every ``period`` seconds; ``stop()`` takes a last sample, so a short run has its whole
    curve. A part of a sample that fails (a vanished device, a lost GPU) is left out of that sample
    and counted in ``errors``; sampling goes on. ``samples``, ``errors``, ``last_error`` and
    ``mean_cost_us`` (CPU time to read and record one sample) describe the sampler's work so far.
    Loopback interfaces are left out unless ``include_loopback``; ``gpu=False`` skips NVML.
    """

    def __init__(self, client: Any, period: float = 1.0, *, resource_id: str | None = None,
                 include_loopback: bool = False, gpu: bool = True, first_interval: float | None = None):
        if not period > 0:
            raise ValueError(f"period must be a positive number of seconds, not {period!r}")
        self.client = client
        self.period = float(period)
        self.first_interval = min(0.1, self.period) if first_interval is None else float(first_interval)
        self.resource_id = resource_id or ids.host_id()
        self.include_loopback = include_loopback
        self.samples = 0
        self.errors = 0
        self.last_error: str | None = None
        self._cost_ns = 0
        self._want_gpu = gpu
        self._gpu: _Nvml | None = None
        self._nic_counted = _Classifier(lambda nic: include_loopback or not _is_loopback(nic))
        self._disk_counted = _Classifier(_is_physical_disk)
        self._prev: _Counters | None = None
        self._lock = threading.Lock()  # one sample at a time: sample() may be called beside the thread
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()
        self._parts: list[tuple[str, Callable[[_Counters, _Counters, float, Metrics], None]]] = [
            ("cpu", self._cpu), ("memory", self._memory), ("load", self._load), ("net", self._net),
            ("disk", self._disk), ("gpu", self._gpus)]

    @property
    def gpus(self) -> int:
        """How many GPUs are sampled (0 without NVML)."""
        return len(self._gpu.handles) if self._gpu else 0

    @property
    def mean_cost_us(self) -> float:
        """Mean CPU time taken to read and record one sample, in microseconds."""
        return self._cost_ns / self.samples / 1e3 if self.samples else 0.0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> HardwareSampler:
        """Declare the host resource, read the counters the first sample's rates start from, and
        sample every ``period`` seconds in a daemon thread until ``stop()``."""
        if self.running:
            return self
        host = ids.hostname()
        self.client.resource("host", self.resource_id, name=host, host=host)
        if self._want_gpu and self._gpu is None:
            self._gpu = _Nvml.open()
        with self._lock:
            self._prev = self._read_counters()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="flowscope-hardware", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Take a last sample, covering the time since the previous one unless that is too short to
        measure (under 50 ms and a tenth of the period), stop the thread and wait for it (at most
        ``timeout`` seconds)."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        thread.join(timeout)
        if not thread.is_alive():
            self._thread = None
            if self._gpu is not None:
                self._gpu.close()
                self._gpu = None

    def __enter__(self) -> HardwareSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        if self.first_interval < self.period and not self._stopping.wait(self.first_interval):
            self._guarded_sample()  # the curve starts with the run, not a period later
        due = time.monotonic() + self.period
        while not self._stopping.wait(max(0.0, due - time.monotonic())):
            self._guarded_sample()
            now = time.monotonic()
            due += self.period
            if due <= now:  # fell behind (a suspended process, a starved thread): skip missed ticks
                due += self.period * ((now - due) // self.period + 1)
            # a sample taken late is not followed by one a moment later: over less than the kernel's clock tick
            # the CPU counters read nothing, and the rates of a few milliseconds are noise
            due = max(due, now + self.period / 2)
        prev = self._prev
        if prev is None or time.monotonic() - prev.mono >= min(self.period / 10, 0.05):
            self._guarded_sample()

    def _guarded_sample(self) -> None:
        try:
            self.sample()
        except Exception as exc:  # noqa: BLE001 - the sampler outlives any one bad sample
            self._failed("sample", exc)

    # ---- one sample ---------------------------------------------------------------------------------
    def sample(self) -> int:
        """Take one sample now and record it; returns the number of metrics recorded. Rates cover
        the time since the previous sample (since ``start()`` for the first)."""
        with self._lock:
            t0 = time.thread_time_ns()
            cur = self._read_counters()
            ts = cur.ts_ns
            prev, self._prev = self._prev, cur
            out: Metrics = []
            if prev is None or cur.mono <= prev.mono:
                return 0  # nothing to measure against: this reading starts the next interval
            dt = cur.mono - prev.mono
            for name, part in self._parts:
                kept = len(out)
                try:
                    part(prev, cur, dt, out)
                except Exception as exc:  # noqa: BLE001 - one failing part does not drop the rest
                    del out[kept:]
                    self._failed(name, exc)
                else:
                    self._failing.discard(name)
            metric, rid = self.client.metric, self.resource_id
            for name, value in out:
                metric(name, value, namespace=NAMESPACE, resource_id=rid, ts_ns=ts)
            self.samples += 1
            self._cost_ns += time.thread_time_ns() - t0
            return len(out)

    def _read_counters(self) -> _Counters:
        """The cumulative counters, read together; a source that fails gives an empty reading."""
        mono, ts = time.monotonic(), time.time_ns()  # together: ts differences match the rates' intervals
        cpus = self._read("cpu", _cpu_counters, [])
        net = self._read("net", _net_counters, {})
        disk = self._read("disk", _disk_counters, {})
        return _Counters(mono, ts, cpus, net, disk)

    def _read(self, what: str, read: Callable[[], Any], empty: Any) -> Any:
        try:
            value = read()
        except Exception as exc:  # noqa: BLE001 - that part is left out until the counters read again
            self._failed(f"{what} counters", exc)
            return empty
        self._failing.discard(f"{what} counters")
        return value

    def _failed(self, part: str, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{part}: {type(exc).__name__}: {exc}"
        if part not in self._failing:  # say it once per run of failures, not once a period
            self._failing.add(part)
            log.warning("hardware sampler: %s left out of the sample (%s: %s)", part, type(exc).__name__, exc)

    # ---- the parts ----------------------------------------------------------------------------------
    def _cpu(self, prev: _Counters, cur: _Counters, dt: float, out: Metrics) -> None:
        if not cur.cpus or len(prev.cpus) != len(cur.cpus):
            return  # no reading, or a CPU went on- or offline: no per-core comparison this time
        total = busy = iowait = 0.0
        cores: Metrics = []
        for i, ((t0, b0, w0), (t1, b1, w1)) in enumerate(zip(prev.cpus, cur.cpus, strict=True)):
            dtot = t1 - t0
            total += dtot
            busy += b1 - b0
            iowait += w1 - w0
            if dtot > 0:
                cores.append((f"cpu.core{i}.percent", _percent(b1 - b0, dtot)))
        if total <= 0:
            return  # the kernel's clock did not tick in between (a very short interval)
        out.append(("cpu.percent", _percent(busy, total)))
        if sys.platform.startswith("linux"):
            out.append(("cpu.iowait.percent", _percent(iowait, total)))
        out += cores

    def _memory(self, prev: _Counters, cur: _Counters, dt: float, out: Metrics) -> None:
        vm = psutil.virtual_memory()
        out += [("memory.used_bytes", float(vm.used)), ("memory.available_bytes", float(vm.available)),
                ("memory.percent", float(vm.percent)), ("swap.used_bytes", float(_swap_used()))]

    def _load(self, prev: _Counters, cur: _Counters, dt: float, out: Metrics) -> None:
        one, five, fifteen = psutil.getloadavg()
        out += [("load.1m", float(one)), ("load.5m", float(five)), ("load.15m", float(fifteen))]

    def _net(self, prev: _Counters, cur: _Counters, dt: float, out: Metrics) -> None:
        rates, seen = counter_rates(prev.net, cur.net, self._nic_counted, dt)
        if not seen:
            return
        rx = tx = 0.0
        for nic, (r, t) in rates.items():
            out += [(f"net.{nic}.rx_bytes_per_s", r), (f"net.{nic}.tx_bytes_per_s", t)]
            rx += r
            tx += t
        out += [("net.rx_bytes_per_s", rx), ("net.tx_bytes_per_s", tx)]

    def _disk(self, prev: _Counters, cur: _Counters, dt: float, out: Metrics) -> None:
        rates, seen = counter_rates(prev.disk, cur.disk, self._disk_counted, dt)
        if not seen:
            return
        sums = [sum(r[k] for r in rates.values()) for k in range(4)]
        out += [("disk.read_bytes_per_s", sums[0]), ("disk.write_bytes_per_s", sums[1]),
                ("disk.read_ops_per_s", sums[2]), ("disk.write_ops_per_s", sums[3])]

    def _gpus(self, prev: _Counters, cur: _Counters, dt: float, out: Metrics) -> None:
        if self._gpu is not None:
            self._gpu.sample(out)


def _swap_used() -> int:
    """Swap in use, as psutil counts it; on Linux read from /proc/meminfo alone (psutil.swap_memory
    also parses /proc/vmstat, which more than doubles the cost of a sample)."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo", "rb") as f:
                fields = dict(line.split(None, 2)[:2] for line in f if line.startswith(b"Swap"))
            return (int(fields[b"SwapTotal:"]) - int(fields[b"SwapFree:"])) * 1024
        except (OSError, KeyError, ValueError):
            pass
    return psutil.swap_memory().used


def _percent(part: float, whole: float) -> float:
    return min(100.0, max(0.0, 100.0 * part / whole))


# ---- one sampler per host -------------------------------------------------------------------------

_leases: set[HostLease] = set()  # held leases: a lease lasts until release() even if its object is dropped


class HostLease:
    """This process's claim to be its host's one hardware sampler (for a run, when a run id was
    given). It ends with ``release()`` or with the process: the kernel drops the lock of a dead
    process, so another process can then acquire the lease. A child created by ``fork`` does not
    inherit it. The lock file holds the holder's pid and host."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd
        _leases.add(self)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the lease up (removing the lock file); does nothing if it is not held."""
        fd, self._fd = self._fd, None
        _leases.discard(self)
        if fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: see acquire_host_lease
        except OSError:
            pass
        os.close(fd)  # closing the last descriptor drops the lock

    def _forget_after_fork(self) -> None:
        fd, self._fd = self._fd, None
        _leases.discard(self)
        if fd is not None:
            os.close(fd)  # the parent's lock stays: it holds the same open file

    def __enter__(self) -> HostLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"HostLease({str(self.path)!r}, held={self.held})"


def _forget_leases_in_child() -> None:
    for lease in list(_leases):
        lease._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_leases_in_child)


def lease_path(directory: str | Path | None = None, *, run_id: str | None = None) -> Path:
    """The lock file that elects this host's sampler: ``flowscope-hardware-<host>[-<run_id>].lock``
    in ``directory`` (default $FLOWSCOPE_LOCK_DIR, else the system's temporary directory)."""
    d = Path(directory or os.environ.get(LOCK_DIR_ENV) or tempfile.gettempdir())
    key = ids.hostname() if run_id is None else f"{ids.hostname()}-{run_id}"
    return d / f"flowscope-hardware-{re.sub(r'[^A-Za-z0-9._-]', '_', key)}.lock"


def acquire_host_lease(directory: str | Path | None = None, *, run_id: str | None = None) -> HostLease | None:
    """Try, without waiting, to become this host's one hardware sampler; None if another process is.

    With ``run_id``, the election is per host and run, so that two runs sharing a host each get a
    sampler. ``directory`` must be local to the host or support ``flock`` (see ``lease_path``). The lock file's opens
    are flowscope's own: the open audit hook does not record them as the workflow's I/O."""
    with own_opens():
        return _acquire_host_lease(lease_path(directory, run_id=run_id))


def remove_abandoned_lease(directory: str | Path | None = None, *, run_id: str) -> bool:
    """Remove the lock file of ``run_id``'s lease on this host when no process holds it: what a sampler killed
    before it could let go (SIGKILL) leaves behind. Call it once the run has ended; True if a file was removed."""
    path = lease_path(directory, run_id=run_id)
    try:
        with own_opens():
            if not path.exists():
                return False
            lease = _acquire_host_lease(path)
    except OSError:
        return False
    if lease is None:  # still held: its holder removes it
        return False
    lease.release()
    return True


def _acquire_host_lease(path: Path) -> HostLease | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except PermissionError:  # another user's lock file: locking needs only a read descriptor
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise OSError(exc.errno, f"cannot lock {path} ({exc.strerror}); set {LOCK_DIR_ENV} to a "
                                     f"directory on a local file system") from None
        # A holder removes the file before it lets go, so the file we locked may be one that was just
        # removed: the lease is ours only if the path still names what we locked.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {ids.hostname()}\n".encode())
            except OSError:
                pass  # read-only descriptor: the lease holds all the same
            return HostLease(path, fd)
        os.close(fd)
    return None
