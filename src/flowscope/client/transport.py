"""How a client reaches a collector over HTTP (a collector in the same process is reached through
flowscope/embedded.py's EmbeddedTransport, with the same interface)."""

from __future__ import annotations

import fnmatch
import http.client
import itertools
import json
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa

ARROW_STREAM = "application/vnd.apache.arrow.stream"
TOKEN_ENV = "FLOWSCOPE_TOKEN"  # the collector's token, sent by every client (flowscope serve prints it)


class Unreachable(ConnectionError):
    """The collector could not be reached (refused, reset, timed out)."""


class Busy(RuntimeError):
    """The collector refused the batch for now (503); retry later."""


class RunNotOpen(Busy):
    """The collector does not know the run (404, reason "unknown-run"): its owner may not have opened it yet, or
    opened it on another collector instance of a shared store a moment ago; retried like a busy collector, then
    spooled, never refused for good."""


class Rejected(ValueError):
    """The collector refused the batch for good (4xx); retrying will not help."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


_pick = itertools.count()


@dataclass(frozen=True)
class Instance:
    """One collector instance of an address file: its address, its token, and the namespaces it serves (glob
    patterns; empty: it claims none, and takes the records and namespaces no instance claims)."""

    address: str
    token: str | None = None
    namespaces: tuple[str, ...] = ()

    def serves(self, namespace: str) -> bool:
        return any(fnmatch.fnmatchcase(namespace, p) for p in self.namespaces)


def read_instances(path: str | Path) -> list[Instance]:
    """The collector instances listed in ``path``, one per line: ``http(s)://HOST:PORT``, optionally followed by
    `` token=TOKEN`` and `` namespaces=GLOB[,GLOB...]`` (``flowscope serve --address-file`` writes them)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the collector address file: {exc.strerror or exc}") from None
    out = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        address, *rest = line.split()
        if not address.startswith(("http://", "https://")) or not urlsplit(address).hostname:
            raise ValueError(f"{path}:{n}: not a collector address: {address!r} (expected http://HOST:PORT)")
        token, namespaces = None, ()
        for item in rest:
            key, sep, value = item.partition("=")
            if key not in ("token", "namespaces") or not sep or not value:
                raise ValueError(f"{path}:{n}: unexpected {item.split('=')[0]!r} after the address "
                                 f"(only token=TOKEN and namespaces=GLOB,... may follow it)")
            if key == "token":
                token = value
            else:
                namespaces = tuple(p for p in value.split(",") if p)
        out.append(Instance(address, token, namespaces))
    if not out:
        raise ValueError(f"{path}: the collector address file lists no address")
    return out


def read_collectors(path: str | Path) -> list[tuple[str, str | None]]:
    """The (address, token or None) of each collector listed in ``path`` (see :func:`read_instances`)."""
    return [(i.address, i.token) for i in read_instances(path)]


def read_address_file(path: str | Path) -> list[str]:
    """The collector addresses listed in ``path``, one per line (``flowscope serve --address-file`` writes it)."""
    return [address for address, _ in read_collectors(path)]


def general_instances(instances: list[Instance]) -> list[Instance]:
    """The instances that take records of no namespace: those claiming no namespace (all, if every one claims)."""
    return [i for i in instances if not i.namespaces] or instances


def pick_instance(instances: list[Instance]) -> Instance:
    """One of ``instances`` that claim no namespace: clients of this process and of others spread round-robin."""
    collectors = general_instances(instances)
    return collectors[(os.getpid() + next(_pick)) % len(collectors)]


def pick_collector(path: str | Path) -> tuple[str, str | None]:
    """One of the collectors in the address file that claim no namespace, with its token (see pick_instance)."""
    i = pick_instance(read_instances(path))
    return i.address, i.token


def pick_address(path: str | Path) -> str:
    """One of the collectors in the address file (see pick_collector)."""
    return pick_collector(path)[0]


def ipc_body(data: pa.Table) -> memoryview:
    """A table as an Arrow IPC stream, ready to send."""
    # Written into a buffer sized in advance: a growing output stream reallocates and copies as it goes, which
    # cost more CPU per record than the rest of serialising (docs/performance.md, "Ingest").
    batches = data.to_batches()
    size = data.schema.serialize().size + sum(pa.ipc.get_record_batch_size(b) for b in batches) + 64
    if not any(pa.types.is_dictionary(f.type) for f in data.schema):  # dictionary batches are not counted above
        buf = pa.allocate_buffer(size)
        sink = pa.FixedSizeBufferWriter(buf)
        try:
            with pa.ipc.new_stream(sink, data.schema) as writer:
                for b in batches:
                    writer.write_batch(b)
            return memoryview(buf.slice(0, sink.tell()))
        except (pa.ArrowInvalid, OSError):  # the estimate was short: written the general way below
            pass
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, data.schema) as writer:
        writer.write_table(data)
    return memoryview(out.getvalue())


def ipc_bytes(data: pa.Table) -> bytes:
    """A table as an Arrow IPC stream, as bytes."""
    return bytes(ipc_body(data))


class HttpTransport:
    """One keep-alive HTTP(S) connection to a collector. ``token`` (default $FLOWSCOPE_TOKEN) is sent as
    ``Authorization: Bearer`` on every request; HTTPS verifies the collector's certificate against the
    system's CAs (SSL_CERT_FILE / SSL_CERT_DIR name others)."""

    def __init__(self, address: str, timeout: float = 60.0, token: str | None = None):
        u = urlsplit(address if "://" in address else f"http://{address}")
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad collector address {address!r}: expected http://HOST:PORT or https://HOST:PORT")
        self.address = f"{u.scheme}://{u.netloc}"
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port or (443 if self._https else 80)
        self.timeout = timeout
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                 timeout: float | None = None) -> tuple[int, dict]:
        headers = {**(headers or {}), **self._auth}
        for attempt in (0, 1):  # one silent reconnect: a kept-alive connection may have been closed
            if self._conn is None:
                self._conn = self._connect(timeout or self.timeout)
            try:
                self._conn.request(method, path, body=body, headers=headers)
                resp = self._conn.getresponse()
                raw = resp.read()
                status = resp.status
                if resp.getheader("connection", "").lower() == "close":
                    self.close()
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 1 or isinstance(exc, (ConnectionRefusedError, socket.timeout)):
                    raise Unreachable(f"collector at {self.address} unreachable: {exc}") from exc
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"error": raw[:200].decode(errors="replace")}
        return status, doc

    def _check(self, status: int, doc: dict) -> dict:
        if status == 429 or status >= 500:  # transient on the collector's side (busy, disk trouble): retry, spool
            raise Busy(doc.get("error", f"HTTP {status}"))
        if status == 404 and doc.get("reason") == "unknown-run":
            raise RunNotOpen(doc.get("error", "unknown run"))
        if status >= 400:
            raise Rejected(status, doc.get("error", "no detail"))
        return doc

    def health(self, timeout: float = 2.0) -> dict:
        return self._check(*self._request("GET", "/v1/health", timeout=timeout))

    def open_run(self, meta: dict) -> dict:
        body = json.dumps(meta, default=str).encode()
        return self._check(*self._request("POST", "/v1/runs", body, {"Content-Type": "application/json"}))

    def close_run(self, run_id: str, info: dict) -> dict:
        body = json.dumps(info, default=str).encode()
        return self._check(*self._request("POST", f"/v1/runs/{run_id}/close", body,
                                          {"Content-Type": "application/json"}))

    def send(self, run_id: str, table: str, segment_id: str, data: pa.Table | bytes) -> dict:
        body = data if isinstance(data, (bytes, bytearray, memoryview)) else ipc_body(data)
        return self._check(*self._request("POST", f"/v1/runs/{run_id}/tables/{table}", body,
                                          {"Content-Type": ARROW_STREAM, "X-Flowscope-Segment": segment_id}))

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
