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
