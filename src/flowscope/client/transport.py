"""How a client reaches a collector: over HTTP, or by direct call to one embedded in the same process."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa

from flowscope.model.conform import SchemaError
from flowscope.model.provenance import check_close_request
from flowscope.service.collector import Collector, CollectorBusy, UnknownRun

ARROW_STREAM = "application/vnd.apache.arrow.stream"


class Unreachable(ConnectionError):
    """The collector could not be reached (refused, reset, timed out)."""


class Busy(RuntimeError):
    """The collector refused the batch for now (503); retry later."""


class Rejected(ValueError):
    """The collector refused the batch for good (4xx); retrying will not help."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


_pick = itertools.count()


def read_address_file(path: str | Path) -> list[str]:
    """The collector addresses listed in ``path``, one per line (``flowscope serve --address-file`` writes it)."""
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
        if not line.startswith("http://") or not urlsplit(line).hostname:
            raise ValueError(f"{path}:{n}: not a collector address: {line!r} (expected http://HOST:PORT)")
        out.append(line)
    if not out:
        raise ValueError(f"{path}: the collector address file lists no address")
    return out


def pick_address(path: str | Path) -> str:
    """One of the collectors in the address file: clients of this process and of others spread round-robin."""
    addresses = read_address_file(path)
    return addresses[(os.getpid() + next(_pick)) % len(addresses)]


def ipc_bytes(data: pa.Table) -> bytes:
    """Serialise a table as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    return sink.getvalue().to_pybytes()


class HttpTransport:
    """One keep-alive HTTP connection to a collector."""

    def __init__(self, address: str, timeout: float = 60.0):
        u = urlsplit(address if "://" in address else f"http://{address}")
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"bad collector address {address!r}: expected http://HOST:PORT")
        self.address = f"http://{u.netloc}"
        self._host, self._port = u.hostname, u.port or 80
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                 timeout: float | None = None) -> tuple[int, dict]:
        for attempt in (0, 1):  # one silent reconnect: a kept-alive connection may have been closed
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout or self.timeout)
            try:
                self._conn.request(method, path, body=body, headers=headers or {})
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
        body = data if isinstance(data, (bytes, bytearray, memoryview)) else ipc_bytes(data)
        return self._check(*self._request("POST", f"/v1/runs/{run_id}/tables/{table}", body,
                                          {"Content-Type": ARROW_STREAM, "X-Flowscope-Segment": segment_id}))

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class EmbeddedTransport:
    """Direct calls into a collector in this process: same validation and store, no network."""

    def __init__(self, collector: Collector):
        self.collector = collector
        self.address = f"embedded:{collector.store}"

    def health(self, timeout: float = 2.0) -> dict:
        return self.collector.health()

    def open_run(self, meta: dict) -> dict:
        try:
            return self.collector.open_run(meta)
        except ValueError as exc:  # as the HTTP API answers it
            raise Rejected(422, str(exc)) from None

    def close_run(self, run_id: str, info: dict) -> dict:
        try:
            end_ns, status = check_close_request(info)
        except ValueError as exc:
            raise Rejected(422, str(exc)) from None
        return self.collector.close_run(run_id, end_ns=end_ns, status=status)

    def send(self, run_id: str, table: str, segment_id: str, data: pa.Table | bytes) -> dict:
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        try:
            res = self.collector.ingest(run_id, table, segment_id, data)
        except CollectorBusy as exc:
            raise Busy(str(exc)) from None
        except (SchemaError, UnknownRun, ValueError) as exc:
            raise Rejected(422 if isinstance(exc, SchemaError) else 404, str(exc)) from None
        except OSError as exc:  # the store could not be written (disk full, permissions): retry, then spool
            raise Busy(f"store write failed: {exc}") from None
        return {"rows": res.rows, "duplicate": res.duplicate}

    def close(self) -> None:
        pass
