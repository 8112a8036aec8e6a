"""The hardware sampler on this machine's real counters, and the per-host election with real processes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

import flowscope
from flowscope.model import identifiers as ids
from flowscope.sources.hardware import NAMESPACE, HardwareSampler, acquire_host_lease, counter_rates, lease_path

PERIOD = 0.1
MB = 1 << 20


def _metrics(client: flowscope.Client):
    run = flowscope.open_run(client.run_dir)
    table = run.arrow("metrics")
    df = run.table("metrics")
    return table, df[df.namespace == NAMESPACE].sort_values(["ts_ns", "name"])


def _samples(df) -> list[dict[str, float]]:
    """One dict name -> value per sample, in time order (a sample is the rows sharing a ts_ns)."""
    out = []
    for _, g in df.groupby("ts_ns", sort=True):
        assert not g.name.duplicated().any(), f"a name twice in one sample: {list(g.name)}"
        out.append(dict(zip(g.name, g.value, strict=True)))
    return out


def _wait_first_sample(sampler: HardwareSampler, timeout: float = 10.0) -> None:
    """Return once a sample was taken: from then on, each sample's interval is the gap to the previous ts."""
    deadline = time.monotonic() + timeout
    while sampler.samples < 1:
        assert time.monotonic() < deadline, "no sample taken"
        time.sleep(0.005)


def _integral(df, name: str) -> float:
    """Sum of rate x interval over the samples after the first (whose interval starts at start())."""
    rates = df[df.name == name].set_index("ts_ns").value.sort_index()
    intervals = rates.index.to_series().diff() / 1e9
    return float((rates * intervals).iloc[1:].sum())


def _mount_fstype(path: Path) -> str:
    best = ("", "")
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (str(path) == mp or str(path).startswith(mp.rstrip("/") + "/")) and len(mp) > len(best[0]):
            best = (mp, part.fstype)
    return best[1]


def _nvml_state() -> str | None:
    """None when NVML works here, else why not."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return "pynvml is not installed (pip install nvidia-ml-py), so there are no GPU metrics to check"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        return f"NVML does not initialise on this machine (no NVIDIA driver or GPU): {exc}"
    pynvml.nvmlShutdown()
    return None


def _burn(until: threading.Event) -> None:
    """Keep one core busy; hashlib releases the GIL on large buffers, so the sampler thread is not starved."""
    block = os.urandom(4 * MB)
    while not until.is_set():
        hashlib.sha256(block).digest()


def test_sampler_records_cpu_memory_disk_and_load_of_the_host(tmp_path):
    client = flowscope.Client(store=tmp_path / "store")
    t_start = time.time_ns()
    sampler = HardwareSampler(client, PERIOD).start()
    m0 = time.monotonic()
    stop_burning = threading.Event()
    burner = threading.Thread(target=_burn, args=(stop_burning,))
    time.sleep(0.3)
    _wait_first_sample(sampler)
    burner.start()
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        chunk = os.urandom(MB)
        for _ in range(50):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    time.sleep(1.0)
    stop_burning.set()
    burner.join()
    time.sleep(0.3)
    sampler.stop()
    elapsed = time.monotonic() - m0
    t_end = time.time_ns()
    assert not sampler.running
    client.close()

    assert sampler.errors == 0, sampler.last_error
    assert 0 < sampler.mean_cost_us < 5000  # ~0.2 ms hot, ~0.5-0.7 ms between sleeps on a small VM
    table, df = _metrics(client)
    assert table.schema.field("ts_ns").type == pa.int64()
    assert set(df.resource_id) == {ids.host_id()}
    run = flowscope.open_run(client.run_dir)
    hosts = run.sql(f"SELECT kind, host FROM resources WHERE resource_id = '{ids.host_id()}'")
    assert list(hosts.kind) == ["host"] and list(hosts.host) == [ids.hostname()]
    assert df.ts_ns.between(t_start, t_end).all()

    samples = _samples(df)
    # at most one sample per period (the last one at stop()); a starved thread skips ticks, never doubles them.
    # How many ticks a busy machine lets it take is not asserted: that is the machine's doing, not the sampler's.
    assert len(samples) == sampler.samples >= 2
    expected = elapsed / PERIOD
    assert len(samples) <= expected + 2, (len(samples), elapsed)
    gaps = sorted((df.ts_ns.drop_duplicates().diff().dropna() / 1e9).tolist())
    assert gaps[len(gaps) // 2] > 0.07, gaps

    ncores = os.cpu_count()
    cores = {f"cpu.core{i}.percent" for i in range(ncores)}
    nics = [n for n, s in psutil.net_if_stats().items() if "loopback" not in s.flags.split(",")]
    always = {"cpu.percent", "cpu.iowait.percent", "memory.used_bytes", "memory.available_bytes", "memory.percent",
              "swap.used_bytes", "load.1m", "load.5m", "load.15m", "disk.read_bytes_per_s",
              "disk.write_bytes_per_s", "disk.read_ops_per_s", "disk.write_ops_per_s"}
    if nics:
        always |= {"net.rx_bytes_per_s", "net.tx_bytes_per_s"}
    for s in samples[:-1]:  # the last one may cover too short a time for the kernel's CPU clock
        assert always <= s.keys(), always - s.keys()
        # a core's percent is left out of a sample whose 0.1 s saw no tick of that core's clock (a VM's core the host
        # did not run meanwhile, on a busy machine), never given as a made-up 0 %: the percents given are percents
        assert all(0.0 <= s[c] <= 100.0 for c in cores & s.keys()), s
    assert cores <= set().union(*samples), cores - set().union(*samples)  # every core is measured over the run
    names = set(df.name)
    assert not any(n.startswith("net.lo") for n in names)
    assert {f"net.{n}.rx_bytes_per_s" for n in nics} <= names
    if _nvml_state() is not None:
        assert not any(n.startswith("gpu") for n in names) and sampler.gpus == 0

    cpu = df[df.name == "cpu.percent"].value
    assert cpu.between(0, 100).all()
    assert cpu.max() > 30, cpu.tolist()  # one of the cores burned for a second
    per_core = df[df.name.isin(cores)].value
    assert per_core.between(0, 100).all() and per_core.max() > 60
    total = psutil.virtual_memory().total
    used = df[df.name == "memory.used_bytes"].value
    assert ((used > 0) & (used < total)).all()
    assert df[df.name == "memory.percent"].value.between(0, 100).all()
    assert (df[df.name.str.endswith("_per_s")].value >= 0).all()

    # The 50 MB reached the disk within the run, as the sum of rate x interval over the samples.
    fstype = _mount_fstype(tmp_path)
    if fstype in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {fstype}: its writes never reach a disk, so disk rates cannot show them")
    writes = df[df.name == "disk.write_bytes_per_s"].value
    written = _integral(df, "disk.write_bytes_per_s")
    assert writes.max() > 5 * MB, writes.tolist()
    assert written > 0.8 * 50 * MB, written / MB
    ops = df[df.name == "disk.write_ops_per_s"].value
    assert ops.max() > 0


def test_stop_returns_at_once_and_keeps_the_last_interval(tmp_path):
    client = flowscope.Client(store=tmp_path / "store")
    # an hour-long period: a stop() that waited for the period would wait an hour; how fast a busy machine lets
    # the sampler thread take its last sample and end is not what is asserted
    sampler = HardwareSampler(client, period=3600.0, first_interval=3600.0).start()  # no early first sample
    time.sleep(0.3)
    t0 = time.monotonic()
    sampler.stop()
    took = time.monotonic() - t0
    client.close()
    assert took < 300, f"stop() waited {took:.2f} s for a 3600 s period"
    assert sampler.samples == 1  # the 0.3 s before stop()
    _, df = _metrics(client)
    assert "cpu.percent" in set(df.name) and df.ts_ns.nunique() == 1
    sampler.stop()  # twice is harmless
    with pytest.raises(ValueError, match="period"):
        HardwareSampler(client, period=0)


def test_a_late_sample_is_not_followed_by_one_a_moment_later(tmp_path):
    """A sample that ends late in its period (a slow reading, a starved thread) is followed by the next at least half
    a period on, not a few milliseconds later: over less than the kernel's clock tick the CPU counters read nothing,
    and such a sample has no cpu.percent (a fresh clone's run of the NIC test found one)."""
    client = flowscope.Client(store=tmp_path / "store")
    sampler = HardwareSampler(client, 0.1, first_interval=0.1)
    starts: list[float] = []
    sample = sampler.sample

    def slow_sample():
        if len(starts) in (2, 4):
            time.sleep(0.095)  # the thread starts this one late: 5 ms before the next one is due
        starts.append(time.monotonic())
        sample()
    sampler.sample = slow_sample
    sampler.start()
    deadline = time.monotonic() + 60
    while len(starts) < 6:
        assert time.monotonic() < deadline, f"{len(starts)} samples in 60 s"
        time.sleep(0.01)
    sampler.stop()
    client.close()
    gaps = [b - a for a, b in zip(starts[:6], starts[1:6])]
    assert min(gaps) >= 0.05, gaps
    _, df = _metrics(client)
    assert all("cpu.percent" in s for s in _samples(df)), "a sample without cpu.percent"


def test_loopback_traffic_shows_in_network_rates_when_included(tmp_path):
    loopbacks = [n for n, s in psutil.net_if_stats().items() if "loopback" in s.flags.split(",")]
    if not loopbacks:
        pytest.skip("this machine has no loopback interface")
    client = flowscope.Client(store=tmp_path / "store")
    sampler = HardwareSampler(client, PERIOD, include_loopback=True).start()
    _wait_first_sample(sampler)
    server = socket.create_server(("127.0.0.1", 0))
    received = []

    def serve():
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 16):
                received.append(len(data))

    t = threading.Thread(target=serve)
    t.start()
    sent = 40 * MB
    with socket.create_connection(server.getsockname()) as c:
        block = b"x" * MB
        for _ in range(sent // MB):
            c.sendall(block)
    t.join()
    server.close()
    time.sleep(0.3)
    sampler.stop()
    client.close()
    assert sum(received) == sent
    _, df = _metrics(client)
    lo = [n for n in loopbacks if f"net.{n}.rx_bytes_per_s" in set(df.name)]
    assert lo, sorted(set(df.name))
    assert _integral(df, f"net.{lo[0]}.rx_bytes_per_s") >= 0.95 * sent  # headers and other traffic only add
    rx = df[df.name == f"net.{lo[0]}.rx_bytes_per_s"].set_index("ts_ns").value
    total = df[df.name == "net.rx_bytes_per_s"].set_index("ts_ns").value
    assert (total >= rx - 1e-6).all()


def test_gpu_utilisation_and_memory_from_nvml(tmp_path):
    why = _nvml_state()
    if why is not None:
        pytest.skip(why)
    import pynvml  # type: ignore[import-not-found]

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    client = flowscope.Client(store=tmp_path / "store")
    sampler = HardwareSampler(client, PERIOD).start()
    time.sleep(0.5)
    sampler.stop()
    client.close()
    assert sampler.gpus == count and sampler.errors == 0, sampler.last_error
    _, df = _metrics(client)
    for s in _samples(df)[:-1]:
        for i in range(count):
            assert 0 <= s[f"gpu{i}.utilization.percent"] <= 100
            assert 0 <= s[f"gpu{i}.memory.used_bytes"] <= s[f"gpu{i}.memory.total_bytes"]
            assert s[f"gpu{i}.memory.total_bytes"] > 0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_failing_part_is_left_out_and_sampling_goes_on(tmp_path):
    """The guard around each part of a sample, with a part that always raises."""
    client = flowscope.Client(store=tmp_path / "store")
    sampler = HardwareSampler(client, PERIOD)

    def vanished_nic(prev, cur, dt, out):
        out.append(("net.gone0.rx_bytes_per_s", 1.0))  # half a part is no part: dropped with the failure
        raise OSError(19, "No such device", "gone0")

    sampler._parts.insert(0, ("net.gone0", vanished_nic))
    # the sampler's own logger, heard directly: what other tests of the same process did to the root logger's
    # handlers (pytest-xdist runs many modules in one process) does not matter here
    # and heard even if another module's logging.config call (disable_existing_loggers) disabled it
    logger, caught = logging.getLogger("flowscope.hardware"), _Records()
    logger.addHandler(caught)
    level, logger.level = logger.level, logging.WARNING
    disabled, logger.disabled = logger.disabled, False
    try:
        sampler.start()
        deadline = time.monotonic() + 60
        while sampler.samples < 3:
            assert time.monotonic() < deadline, f"{sampler.samples} samples in 60 s"
            time.sleep(0.01)
        assert sampler.running
        sampler.stop()
    finally:
        logger.removeHandler(caught)
        logger.setLevel(level)
        logger.disabled = disabled
    client.close()
    assert sampler.samples >= 3
    assert sampler.errors == sampler.samples
    assert "net.gone0: OSError" in sampler.last_error and "No such device" in sampler.last_error
    warnings = [r for r in caught.records if "net.gone0" in r.getMessage()]
    assert len(warnings) == 1, (len(caught.records), logger.disabled)  # said once, not once a period
    _, df = _metrics(client)
    samples = _samples(df)
    assert len(samples) == sampler.samples
    assert all("memory.used_bytes" in s and "load.1m" in s for s in samples)
    assert not any(n.startswith("net.gone0") for n in df.name)


def test_counter_rates_skip_devices_that_appear_vanish_or_reset():
    prev = {"eth0": (1000, 500), "eth1": (10, 10), "lo": (0, 0), "gone": (5, 5)}
    cur = {"eth0": (3000, 900), "eth1": (5, 20), "lo": (100, 100), "new": (7, 7)}
    rates, seen = counter_rates(prev, cur, lambda d: d != "lo", dt=2.0)
    assert seen and rates == {"eth0": (1000.0, 200.0)}  # eth1 went back: reset, no rate this time
    rates, seen = counter_rates(prev, {"new": (1, 1)}, lambda d: True, dt=1.0)
    assert not seen and rates == {}


def _namespaces_available() -> str | None:
    """None if this process may make private network and mount namespaces, else why not."""
    if not shutil.which("unshare") or not shutil.which("ip") or not shutil.which("mount"):
        return "unshare, ip or mount is not installed"
    cmd = _unshare() + ["sh", "-c", "ip link add fsv0 type veth peer name fsv1 && ip link del fsv0 && "
                        "mount --bind /proc/self/cmdline /proc/diskstats && umount /proc/diskstats"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        return f"cannot make private network and mount namespaces here: {res.stderr.strip()[:200]}"
    return None


def _unshare() -> list[str]:
    return ["unshare", "--net", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])


# Runs in private network and mount namespaces: adding and deleting a NIC, and hiding /proc/diskstats
# behind a file psutil cannot parse, touch nothing outside them.
_REAL_FAULTS = textwrap.dedent("""
    import json, subprocess, sys, time
    import flowscope
    from flowscope.sources.hardware import HardwareSampler

    def sh(cmd):
        subprocess.run(cmd, shell=True, check=True)

    client = flowscope.Client(store=sys.argv[1])
    sampler = HardwareSampler(client, 0.1).start()
    marks = {}
    def change(what, cmd):
        # a sample stamped after the command returned read the counters after the change (the stamp is taken
        # before the reading); then wait for samples, not for time: a busy machine may starve the sampler
        marks[what + "_start"] = time.time_ns()
        sh(cmd)
        marks[what] = time.time_ns()
        settle()
    def settle(n=4):
        want, deadline = sampler.samples + n, time.monotonic() + 60
        while sampler.samples < want:
            assert time.monotonic() < deadline, f"{sampler.samples} samples, {want} wanted"
            time.sleep(0.01)
    settle()
    change("nic_added", "ip link add fsv0 type veth peer name fsv1")
    change("nic_deleted", "ip link del fsv0")
    with open(sys.argv[2], "w") as f:
        f.write("this is not a diskstats line")
    change("disk_hidden", f"mount --bind {sys.argv[2]} /proc/diskstats")
    change("disk_back", "umount /proc/diskstats")
    alive = sampler.running
    sampler.stop()
    client.close()
    print(json.dumps({"alive": alive, "errors": sampler.errors, "last_error": sampler.last_error,
                      "samples": sampler.samples, "run_dir": str(client.run_dir), **marks}))
""")


def test_a_vanishing_nic_and_unreadable_disk_counters_do_not_stop_the_sampler(tmp_path):
    why = _namespaces_available()
    if why is not None:
        pytest.skip(why)
    res = subprocess.run(_unshare() + [sys.executable, "-c", _REAL_FAULTS, str(tmp_path / "store"),
                                       str(tmp_path / "garbage")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["alive"], out
    assert out["errors"] > 0 and "disk counters: ValueError" in out["last_error"]
    assert "not sure how to interpret line" in res.stderr  # the warning, once
    assert res.stderr.count("left out of the sample") == 1

    df = flowscope.open_run(out["run_dir"]).table("metrics")
    df = df[df.namespace == NAMESPACE]
    samples = _samples(df)
    assert len(samples) == out["samples"]
    ts = sorted(df.ts_ns.unique())

    def names_between(a, b):
        return [set(s) for t, s in zip(ts, samples, strict=True) if a < t <= b]

    assert all("cpu.percent" in s for s in samples[:-1])  # sampling went on through everything
    # windows between a change's command returning and the next one starting: each sample in them read its
    # counters with the change made (the script waited for samples, not for time, after each change)
    nic_window = names_between(out["nic_added"], out["nic_deleted_start"])
    assert any("net.fsv0.rx_bytes_per_s" in s for s in nic_window)  # the new NIC counted from its 2nd sample
    after = names_between(out["nic_deleted"], out["disk_back_start"])
    assert after and not any(n.startswith("net.fsv") for s in after for n in s)
    hidden = names_between(out["disk_hidden"], out["disk_back_start"])
    assert hidden and not any("disk.write_bytes_per_s" in s for s in hidden)
    back = names_between(out["disk_back"], max(ts))[1:]  # the first one's previous reading had no disks
    assert back and all("disk.write_bytes_per_s" in s for s in back)


# ---- one sampler per host --------------------------------------------------------------------------

def test_lease_is_exclusive_released_and_scoped_by_run(tmp_path):
    lease = acquire_host_lease(tmp_path)
    assert lease is not None and lease.held
    assert lease.path == lease_path(tmp_path) and ids.hostname() in lease.path.name
    assert lease.path.read_text().split() == [str(os.getpid()), ids.hostname()]
    assert acquire_host_lease(tmp_path) is None  # a second open file conflicts even in the same process
    other_run = acquire_host_lease(tmp_path, run_id="20260101-000000-abcdef")
    assert other_run is not None  # another run on this host elects its own sampler
    other_run.release()
    lease.release()
    assert not lease.held and not lease.path.exists()
    lease.release()  # twice is harmless
    with acquire_host_lease(tmp_path) as again:
        assert again is not None and again.held
    assert not again.held


def test_default_lease_directory_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWSCOPE_LOCK_DIR", str(tmp_path / "locks"))
    lease = acquire_host_lease()
    assert lease is not None and lease.path.parent == tmp_path / "locks"
    lease.release()


_CONTENDER = textwrap.dedent("""
    import os, sys, time
    from flowscope.sources.hardware import acquire_host_lease
    lease = None
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "try":
            lease = lease or acquire_host_lease(sys.argv[1])
            print("got" if lease else "none", flush=True)
        elif cmd == "fork":
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # fork() returns here after the after-fork hooks ran: say so, then live on
                os.write(w, b"x")
                time.sleep(60)
                os._exit(0)
            os.close(w)
            os.read(r, 1)  # the child has run (on a busy machine it may not have been scheduled yet)
            os.close(r)
            print(pid, flush=True)
""")


class Contender:
    def __init__(self, directory: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", _CONTENDER, str(directory)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def ready(self) -> None:
        assert self.proc.stdout.readline().strip() == "ready"

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def answer(self) -> str:
        return self.proc.stdout.readline().strip()

    def ask(self, cmd: str) -> str:
        self.send(cmd)
        return self.answer()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def contenders(tmp_path):
    made: list[Contender] = []

    def make(n: int) -> list[Contender]:
        new = [Contender(tmp_path) for _ in range(n)]
        made.extend(new)
        for c in new:
            c.ready()
        return new

    yield make
    for c in made:
        c.kill()


def test_processes_racing_for_the_lease_elect_one_and_another_takes_over_when_it_dies(tmp_path, contenders):
    racers = contenders(4)
    for c in racers:  # all ready: send the go as close together as we can
        c.send("try")
    answers = [c.answer() for c in racers]
    assert sorted(answers) == ["got", "none", "none", "none"], answers
    holder = racers[answers.index("got")]
    losers = [c for c in racers if c is not holder]
    assert [c.ask("try") for c in losers] == ["none"] * 3  # still held
    assert lease_path(tmp_path).read_text().split()[0] == str(holder.proc.pid)
    holder.kill()  # SIGKILL: no release, the kernel drops the lock
    assert losers[0].ask("try") == "got"
    assert [c.ask("try") for c in losers[1:]] == ["none", "none"]


def test_a_forked_child_does_not_keep_a_dead_holders_lease(tmp_path, contenders):
    holder, other = contenders(2)
    assert holder.ask("try") == "got"
    child = int(holder.ask("fork"))
    try:
        assert psutil.pid_exists(child)
        holder.kill()
        assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE
        assert other.ask("try") == "got"  # the child still runs, yet the lease is free
    finally:
        os.kill(child, signal.SIGKILL)


def test_electing_the_sampler_is_not_recorded_as_the_workflows_io(tmp_path):
    """A Dask worker retries the host lease every period on its event-loop thread, where the open audit hook records
    what the workflow opens: the lease's lock file is flowscope's own file and must not become an ``io`` row (it
    did, one open a second, on every worker that lost the election), while an open of the workflow's right after is
    still recorded."""
    from flowscope.sources.thread_io import OpenAudit

    rows: list[dict] = []
    audit = OpenAudit(rows.append, enable=True)
    held = acquire_host_lease(tmp_path, run_id="r1")  # another process's lease, in effect
    try:
        def contend() -> None:
            assert acquire_host_lease(tmp_path, run_id="r1") is None  # lost: the lease is held
            (tmp_path / "workflow.txt").write_text("data")

        t = threading.Thread(target=contend, name="worker-event-loop")
        t.start()
        t.join()
    finally:
        audit.disable()
        held.release()
    opened = [r["path"] for r in rows if r["thread_ident"] == t.ident]
    assert opened == [str(tmp_path / "workflow.txt")]
