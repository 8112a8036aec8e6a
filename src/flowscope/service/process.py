"""A collector in a child process: what `observe()` uses so that ingest never competes for the GIL of the
process it observes (a LocalCluster's scheduler runs in the user's process)."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit


def _answers(address: str) -> bool:
    """Whether the collector at ``address`` (``http://127.0.0.1:PORT``) answers its health check; False while it
    cannot be reached, an error if it answers with one. The child inherits $FLOWSCOPE_TOKEN, and then requires
    it: the check sends it."""
    from flowscope.service.auth import TOKEN_ENV

    u = urlsplit(address)
    token = os.environ.get(TOKEN_ENV)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=2.0)
    try:
        conn.request("GET", "/v1/health", headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
    if resp.status >= 400:
        raise RuntimeError(f"the collector process answers its health check with HTTP {resp.status}: "
                           f"{body[:200].decode(errors='replace')}")
    return True


#: the collector process's niceness (``flowscope serve --nice``) unless $FLOWSCOPE_COLLECTOR_NICE says otherwise
COLLECTOR_NICE = 0
NICE_ENV = "FLOWSCOPE_COLLECTOR_NICE"


def collector_nice() -> int:
    """The niceness a collector process is started with: $FLOWSCOPE_COLLECTOR_NICE, else ``COLLECTOR_NICE``."""
    raw = os.environ.get(NICE_ENV, "").strip()
    if not raw:
        return COLLECTOR_NICE
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"${NICE_ENV} must be an integer niceness increment, not {raw!r}") from None


class CollectorProcess:
    """`flowscope serve` on 127.0.0.1 and a free port, writing to ``store``; ``stop()`` drains it. It stops by itself
    when this process ends without stopping it (killed): ``serve --exit-with``."""

    def __init__(self, store: str | Path, timeout: float = 30.0, wall_timeout: float = 600.0, nice: int | None = None):
        """Start it and wait until it answers. It is given up on once it has used ``timeout`` seconds of CPU
        time without answering (a busy machine may keep it from running for far longer than that: starved is
        not stuck), or after ``wall_timeout`` seconds whatever it did. ``nice``: added to its CPU niceness
        (default :func:`collector_nice`)."""
        self.store = Path(store)
        self.nice = collector_nice() if nice is None else int(nice)
        self._dir = tempfile.TemporaryDirectory(prefix="flowscope-collector-")
        addr_file = Path(self._dir.name) / "address"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowscope", "serve", "--port", "0", "--store", str(self.store),
             "--address-file", str(addr_file), *(["--nice", str(self.nice)] if self.nice else []),
             # killed, this process could not stop it: the collector then stops itself
             "--exit-with", str(os.getpid())],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wall_deadline = time.monotonic() + wall_timeout

        def given_up() -> bool:
            return self._cpu_seconds() > timeout or time.monotonic() > wall_deadline

        while not (addr_file.exists() and addr_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the collector process failed to start: "
                                   f"{self.proc.stderr.read().decode(errors='replace').strip()[-500:]}")
            if given_up():
                used = self._cpu_seconds()  # (before it is stopped: a process that is gone has used none)
                self.stop()
                raise TimeoutError(f"the collector process did not start (it used {used:.1f} s of CPU time, "
                                   f"{timeout:g} s allowed, or {wall_timeout:g} s passed)")
            time.sleep(0.02)
        self.address = addr_file.read_text().split()[0]
        while not _answers(self.address):  # the address is written just before the server accepts connections
            if given_up():
                self.stop()
                raise TimeoutError("the collector process does not answer")
            time.sleep(0.02)

    def _cpu_seconds(self) -> float:
        """CPU time the child has used so far (0 once it is gone)."""
        import psutil

        try:
            t = psutil.Process(self.proc.pid).cpu_times()
        except psutil.Error:
            return 0.0
        return t.user + t.system

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ask it to finish its queued writes and exit (SIGTERM); kill it if it does not within ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        self._dir.cleanup()
        return self.proc.returncode
