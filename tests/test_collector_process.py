"""observe()'s collector child process: started however long a busy machine keeps it from running."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil

from flowscope.service.process import CollectorProcess


def test_a_collector_held_back_longer_than_the_timeout_still_starts(tmp_path, monkeypatch):
    """The child stops itself as Python starts (a sitecustomize sends it SIGSTOP) and is let go only after
    more than the timeout: a starved child is not a stuck one, so the wait goes on while it has used less CPU
    time than the timeout allows."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    # above what a collector's start costs on a slow, busy machine (0.8-1.0 s of CPU on a quiet one here, 2026-12-02)
    timeout = 5.0
    released = threading.Event()

    def hold_then_release() -> None:
        me = psutil.Process()
        while True:
            stopped = [c for c in me.children() if c.status() == psutil.STATUS_STOPPED]
            if stopped:
                break
            time.sleep(0.01)
        time.sleep(timeout + 1.0)  # held longer than the timeout, in wall time
        os.kill(stopped[0].pid, signal.SIGCONT)
        released.set()

    t = threading.Thread(target=hold_then_release, daemon=True)
    t.start()
    server = CollectorProcess(tmp_path / "store", timeout=timeout)
    try:
        assert released.is_set()
        assert server.address.startswith("http://127.0.0.1:")
    finally:
        server.stop()
    t.join(5)


def test_the_collector_process_runs_at_the_niceness_asked_for_on_every_thread(tmp_path, monkeypatch):
    """$FLOWSCOPE_COLLECTOR_NICE (and ``nice=``) raise the collector's niceness before it starts its threads, so
    that every thread of it (HTTP, writers, live view) yields to the workflow it observes; it still stores what it
    is sent. A value that is not an integer is refused, naming the variable."""
    import pytest

    from flowscope import Client

    base = psutil.Process().nice()
    monkeypatch.setenv("FLOWSCOPE_COLLECTOR_NICE", "7")
    server = CollectorProcess(tmp_path / "store")
    try:
        fs = Client(server.address, name="niced")
        fs.log("stored by a niced collector")
        fs.close()
        tids = [t.id for t in psutil.Process(server.proc.pid).threads()]
        assert len(tids) > 1
        assert {psutil.Process(tid).nice() for tid in tids} == {min(base + 7, 19)}
        from flowscope.store.run import open_run

        logs = open_run(tmp_path / "store" / fs.run_id).sql("SELECT message FROM logs")
        assert "stored by a niced collector" in set(logs["message"])
    finally:
        server.stop()
    monkeypatch.setenv("FLOWSCOPE_COLLECTOR_NICE", "low")
    with pytest.raises(ValueError, match="FLOWSCOPE_COLLECTOR_NICE"):
        CollectorProcess(tmp_path / "store2")


VICTIM = """
import sys
import dask
from dask import delayed
import flowscope

block = flowscope.observe(store=sys.argv[1], name="killed", hardware_period=0)
o = block.__enter__()  # (the block kept: closing it would close the run)
total = dask.compute(*[delayed(lambda i: i)(i) for i in range(40)], scheduler="threads")
assert o.client.flush(30)  # everything so far acknowledged: on disk, the collector's
print("flushed", o.collector_pid, flush=True)
sys.stdin.read()  # until this test kills it
"""


def test_a_killed_observed_process_leaves_no_collector_and_its_run_interrupted_with_its_records(tmp_path):
    """A process that observe()s and is killed (SIGKILL: no exit handler runs) cannot stop its collector child
    itself. The child sees its parent gone, stops, keeps every record acknowledged before (the 40 tasks), marks the
    run it was writing ``interrupted`` (saying whose end it was), and removes its address file."""
    import subprocess
    import sys

    from flowscope.store.run import open_run

    store = tmp_path / "store"
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = victim.stdout.readline().split()
        assert said[:1] == ["flushed"], said
        collector = psutil.Process(int(said[1]))
        assert collector.ppid() == victim.pid and "serve" in collector.cmdline()
        address_file = collector.cmdline()[collector.cmdline().index("--address-file") + 1]
        victim.kill()
        victim.wait()
        collector.wait(120)  # it exits on its own (a timeout here means it never would)
    finally:
        if victim.poll() is None:
            victim.kill()
        if "collector" in locals() and collector.is_running():  # the test failed: no orphan left behind it
            collector.kill()
    (run_dir,) = [p for p in store.iterdir() if p.is_dir()]
    run = open_run(run_dir)
    assert run.meta["status"] == "interrupted"
    assert str(victim.pid) in run.meta["interrupted"] and run.meta["end_ns"] >= run.meta["start_ns"]
    assert int(run.sql("SELECT count(*) FROM spans WHERE kind = 'task'").iloc[0, 0]) == 40
    run.close()
    assert not os.path.exists(address_file) and not os.path.exists(os.path.dirname(address_file))
