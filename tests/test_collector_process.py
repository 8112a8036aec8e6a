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
    twice the timeout: a starved child is not a stuck one, so the wait goes on while it has used less CPU
    time than the timeout allows."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    timeout = 1.0
    released = threading.Event()

    def hold_then_release() -> None:
        me = psutil.Process()
        while True:
            stopped = [c for c in me.children() if c.status() == psutil.STATUS_STOPPED]
            if stopped:
                break
            time.sleep(0.01)
        time.sleep(2 * timeout)
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
