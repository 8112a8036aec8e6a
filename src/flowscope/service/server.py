"""Running the collector's HTTP API: in the foreground (``flowscope serve``) or in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

import uvicorn

from flowscope.service.app import build_app
from flowscope.service.auth import TokenAuth, is_loopback
from flowscope.service.collector import Collector


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only for sockets that say so;
    # without it every response waits ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def address_of(sock: socket.socket, scheme: str = "http") -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def compress_pages(host: str) -> bool:
    """Whether the dashboard's WebSocket messages are compressed (permessage-deflate) when serving on ``host``:
    beyond loopback, where bandwidth is scarce; not on loopback, where deflating what a page receives (about 8 MB/s
    per page at 100,000 records/s) cost the collector 3 % of a core per page and saved nothing."""
    return not is_loopback(host)


def _config(collector: Collector, log_level: str, token: str | None = None, ssl_keyfile: str | None = None,
            ssl_certfile: str | None = None, host: str = "127.0.0.1") -> uvicorn.Config:
    app = build_app(collector)
    if token:
        app = TokenAuth(app, token)
    # Connections beyond the limit get 503, which clients treat as "busy", so memory stays bounded.
    return uvicorn.Config(app, log_level=log_level, access_log=False, limit_concurrency=256, timeout_keep_alive=30,
                          lifespan="off", ssl_keyfile=ssl_keyfile, ssl_certfile=ssl_certfile,
                          ws_per_message_deflate=compress_pages(host))


def serve_forever(collector: Collector, host: str = "127.0.0.1", port: int = 8765, *,
                  address_file: str | Path | None = None, log_level: str = "warning",
                  on_ready=None, on_stop=None, token: str | None = None, ssl_keyfile: str | None = None,
                  ssl_certfile: str | None = None, namespaces: str | None = None, exit_with: int | None = None) -> None:
    """Serve until interrupted (SIGINT/SIGTERM), then finish queued writes (``on_stop()`` first, when given: what
    else feeds the collector stops before it does).

    With ``exit_with`` (a pid), also stop once that process has ended: the collector of one program (observe()'s)
    must not outlive it when it is killed and cannot stop it. Its runs still open are then marked ``interrupted``
    (what they hold stays: every batch acknowledged is on disk), and the address file is removed when it lists no
    other instance (with its folder, when nothing else is in it).

    With ``token``, every request must carry ``Authorization: Bearer <token>`` (401 otherwise); with
    ``ssl_keyfile``/``ssl_certfile``, uvicorn serves HTTPS."""
    config = _config(collector, log_level, token, ssl_keyfile, ssl_certfile, host)
    config.load()  # reads the key and certificate now, so a bad file fails before the address is announced
    sock = bind(host, port)
    address = address_of(sock, "https" if ssl_certfile else "http")
    if address_file:
        _append_address(Path(address_file), address, token, namespaces)
    if on_ready:
        on_ready(address)
    server = _QuietServer(config)

    def stop(signum, frame) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    ended = _watch_process(exit_with, server) if exit_with is not None else None
    try:
        _run_server(server, sock)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if on_stop:
            on_stop()
        collector.shutdown(wait=True)  # acknowledged batches are on disk already; finish the queued ones
        if ended is not None and ended.is_set():
            collector.interrupt_open_runs(f"the process it was recording (pid {exit_with}) ended without closing "
                                          f"the run (killed?); what it sent before is kept")
            if address_file:
                _remove_address_file(Path(address_file), address)


#: how often a collector started with ``exit_with`` looks whether that process still runs (seconds)
EXIT_WITH_POLL_S = 0.5


def _watch_process(pid: int, server) -> threading.Event:
    """Stop ``server`` once process ``pid`` has ended (a thread looks every EXIT_WITH_POLL_S); the event says it
    did. The process is known by its pid and its start time, so that another process given the same pid later is
    not taken for it; a process that is gone already when this starts has ended."""
    import psutil

    ended = threading.Event()
    try:
        born = psutil.Process(pid).create_time()
    except psutil.Error:
        born = None

    def running() -> bool:
        try:
            p = psutil.Process(pid)
            return born is not None and p.create_time() == born and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def watch() -> None:
        while not server.should_exit:
            if not running():
                ended.set()
                server.should_exit = True
                return
            time.sleep(EXIT_WITH_POLL_S)

    threading.Thread(target=watch, name=f"flowscope-exit-with-{pid}", daemon=True).start()
    return ended


def _remove_address_file(path: Path, address: str) -> None:
    """Remove the address file of a collector that stopped, when it lists no other instance than this one
    (``address``), and then its folder when nothing else is in it."""
    try:
        listed = {line.split()[0] for line in path.read_text().splitlines() if line.strip() and line[0] != "#"}
        if listed <= {address}:
            path.unlink()
            path.parent.rmdir()
    except OSError:  # gone already, or a folder with more in it: left
        pass


def run_uvicorn(app, sock: socket.socket, log_level: str = "warning") -> None:
    """Serve the ASGI ``app`` on ``sock`` in the foreground until interrupted (the read-only dashboard)."""
    config = uvicorn.Config(app, log_level=log_level, access_log=False, limit_concurrency=256, lifespan="off",
                            ws_per_message_deflate=compress_pages(sock.getsockname()[0]))
    _run_server(uvicorn.Server(config), sock)


def _run_server(server: uvicorn.Server, sock: socket.socket) -> None:
    """Serve on uvicorn's own event loop choice (uvloop when installed), as ``uvicorn.Server.run`` does."""
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(server.serve(sockets=[sock]))


class _QuietServer(uvicorn.Server):
    """uvicorn re-raises the signal that stopped it, which would kill the process before the collector
    drains its queue; serve_forever installs its own handlers instead."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _append_address(path: Path, address: str, token: str | None = None, namespaces: str | None = None) -> None:
    """Record this instance's address (and token: the file is then readable by its owner only; and the namespaces
    it serves); clients map to the listed instances round-robin, and a namespace to the instance serving it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    line = address + (f" token={token}" if token else "") + (f" namespaces={namespaces}" if namespaces else "")
    with os.fdopen(fd, "a") as f:
        if token:
            os.fchmod(fd, 0o600)  # a file that existed may have been readable by others
        f.write(line + "\n")


class BackgroundServer:
    """The collector's HTTP API on a thread of the calling process (embedded mode)."""

    def __init__(self, collector: Collector, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 token: str | None = None):
        self.collector = collector
        self._sock = bind(host, port)
        self.address = address_of(self._sock)
        self._server = uvicorn.Server(_config(collector, log_level, token, host=host))
        self._thread = threading.Thread(target=self._run, name="flowscope-http", daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            threading.Event().wait(0.01)

    def _run(self) -> None:
        _run_server(self._server, self._sock)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
