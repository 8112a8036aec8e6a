"""``--preload flowscope.dask`` on a cluster started by hand, with no collector and no run set up beforehand: real
``dask scheduler`` and ``dask worker`` processes, a worker joining late, the scheduler closed at the end."""

from __future__ import annotations

import json
import operator
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from distributed import Client

from flowscope.store.catalog import list_runs
from flowscope.store.run import open_run

DASK = str(Path(sys.executable).parent / "dask")


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLOWSCOPE_")}


def _wait(what: str, cond, procs=(), timeout: float = 120.0):
    """Poll ``cond`` until it is true; fail naming ``what`` if a process in ``procs`` exits first or it takes
    longer than a generous deadline (a busy machine is slow, not stuck)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: process {p.args[:3]} exited with {p.returncode}: {_log(p)}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _start(tmp_path: Path, name: str, *args: str) -> subprocess.Popen:
    """``dask ARGS`` in ``tmp_path``, its log (Dask logs a lot: a pipe would fill and block it) in a file."""
    with open(tmp_path / f"{name}.log", "wb") as log:
        proc = subprocess.Popen([DASK, *args], cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=log)
    proc.log = tmp_path / f"{name}.log"
    return proc


def _log(proc: subprocess.Popen) -> str:
    return proc.log.read_text(errors="replace")[-3000:]


def _worker(tmp_path: Path, name: str) -> subprocess.Popen:
    return _start(tmp_path, name, "worker", "--scheduler-file", str(tmp_path / "scheduler.json"), "--no-nanny",
                  "--nthreads", "2", "--name", name, "--no-dashboard", "--preload", "flowscope.dask")


def test_preload_alone_hosts_collector_and_observes_late_worker(tmp_path):
    sched = _start(tmp_path, "scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                   "--scheduler-file", str(tmp_path / "scheduler.json"), "--preload", "flowscope.dask")
    workers = []
    try:
        _wait("the scheduler file", lambda: (tmp_path / "scheduler.json").exists()
              and json.loads((tmp_path / "scheduler.json").read_text() or "{}").get("address"), [sched])
        address = json.loads((tmp_path / "scheduler.json").read_text())["address"]
        workers.append(_worker(tmp_path, "first"))
        with Client(address, timeout=120) as client:
            _wait("the first worker", lambda: len(client.scheduler_info()["workers"]) == 1, [sched, *workers])
            first_addr = next(iter(client.scheduler_info()["workers"]))
            first = [client.submit(operator.add, i, 1, key=f"first-{i}", workers=[first_addr]) for i in range(20)]
            assert client.gather(first) == list(range(1, 21))

            # any producer given only the scheduler's address finds the collector and the run
            from flowscope.dask import discover

            found = discover(address)
            assert found["address"].startswith("http://127.0.0.1:") and found["run_id"]
            # so does `flowscope monitor --scheduler`; this host's sampler for the run is already a worker's (one
            # per host and run), which the monitor says before leaving it alone
            mon = subprocess.run([sys.executable, "-m", "flowscope", "monitor", "--scheduler", address],
                                 capture_output=True, text=True, env=_env(), timeout=300)
            assert mon.returncode == 0, mon.stderr
            assert f"already records run {found['run_id']}" in mon.stderr, mon.stderr

            workers.append(_worker(tmp_path, "late"))
            _wait("the late worker", lambda: len(client.scheduler_info()["workers"]) == 2, [sched, *workers])
            late_addr = next(a for a in client.scheduler_info()["workers"] if a != first_addr)
            late = [client.submit(operator.add, i, 1, key=f"late-{i}", workers=[late_addr]) for i in range(20)]
            assert client.gather(late) == list(range(1, 21))
        sched.send_signal(signal.SIGTERM)
        _wait("the scheduler to exit", lambda: sched.poll() is not None)
        for w in workers:
            _wait("the workers to exit", lambda w=w: w.poll() is not None)
    finally:
        for p in (sched, *workers):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sched.returncode == 0, _log(sched)

    store = tmp_path / "flowscope-runs"  # the default store, in the scheduler's working directory
    [meta] = list_runs(store)
    assert meta["run_id"] == found["run_id"]
    assert meta["status"] == "finished"
    run = open_run(store / found["run_id"])
    spans = run.sql("""SELECT s.task_key, w.address FROM spans s JOIN resources r ON s.resource_id = r.resource_id
                       JOIN resources w ON r.parent_id = w.resource_id WHERE s.kind = 'task'""")
    where = dict(zip(spans["task_key"], spans["address"]))
    assert Counter(spans["task_key"]) == Counter([f"first-{i}" for i in range(20)] + [f"late-{i}" for i in range(20)])
    assert {where[f"first-{i}"] for i in range(20)} == {first_addr}
    assert {where[f"late-{i}"] for i in range(20)} == {late_addr}
    # the scheduler's side too: every task left processing once, to memory
    ran = run.sql("""SELECT task_key FROM transitions WHERE observer = 'scheduler'
                     AND from_state = 'processing' AND to_state = 'memory'""")
    assert Counter(ran["task_key"]) == Counter(list(where))
    workers_seen = run.sql("SELECT DISTINCT address FROM resources WHERE kind = 'worker'")
    assert set(workers_seen["address"]) == {first_addr, late_addr}


def test_preload_unreachable_address_is_named(tmp_path, monkeypatch):
    # Dask logs a preload's failure and runs on unobserved: the log must say plainly which address failed
    monkeypatch.setenv("FLOWSCOPE_ADDRESS", "http://127.0.0.1:9")
    monkeypatch.setenv("FLOWSCOPE_RUN", "r-nowhere")
    env = {**_env(), "FLOWSCOPE_ADDRESS": "http://127.0.0.1:9", "FLOWSCOPE_RUN": "r-nowhere"}
    with open(tmp_path / "s.log", "wb") as log:
        proc = subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                 "--preload", "flowscope.dask"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                stderr=log)
    proc.log = tmp_path / "s.log"
    try:
        _wait("the preload's error", lambda: "Failed to start preload" in _log(proc), [proc])
        lines = [ln for ln in _log(proc).splitlines() if "FLOWSCOPE_ADDRESS" in ln]
        assert any("http://127.0.0.1:9" in ln and "cannot be reached" in ln for ln in lines), _log(proc)
    finally:
        proc.kill()
        proc.wait()
