"""How a client reaches the collectors through a Redis stream (``redis://HOST:PORT[/DB][?stream=NAME]``), the
broker-based alternative to HTTP for sites where producers cannot reach a collector directly, or where several
collector instances share the work.

Every request the HTTP transport makes becomes one stream entry (model/redis_stream.py says its fields). ``send``
returns once Redis has the entry, not once a collector stored it: the collectors of the stream's consumer group
(``flowscope serve --redis``, service/redis_consumer.py) store it and then acknowledge and delete it, and an entry a
collector took but never acknowledged (it died) is claimed by another. Segment ids make a second delivery a
duplicate the store ignores, so every batch is stored once.
"""

from __future__ import annotations

import json

import pyarrow as pa

from flowscope.client.transport import Busy, Rejected, Unreachable, ipc_bytes
from flowscope.model.redis_stream import connect, parse_address


class RedisTransport:
    """Sends a client's requests as entries of one Redis stream (the interface of HttpTransport)."""

    def __init__(self, address: str, timeout: float = 60.0):
        self._url, self.stream = parse_address(address)
        self.address = address
        self.timeout = timeout
        self._redis = None

    def _xadd(self, fields: dict) -> dict:
        import redis

        if self._redis is None:
            self._redis = connect(self._url, self.timeout)
        try:
            entry = self._redis.xadd(self.stream, fields)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.close()
            raise Unreachable(f"Redis at {self._url} unreachable: {exc}") from exc
        except redis.ResponseError as exc:  # OOM (maxmemory reached), LOADING, BUSY: the broker may recover
            text = str(exc)
            if text.startswith(("OOM", "LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN")):
                raise Busy(f"Redis at {self._url}: {text}") from exc
            raise Rejected(400, f"Redis at {self._url} refused the entry: {text}") from exc
        return {"entry": entry.decode() if isinstance(entry, bytes) else entry, "stream": self.stream}

    def health(self, timeout: float = 2.0) -> dict:
        import redis

        probe = connect(self._url, timeout)
        try:
            probe.ping()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unreachable(f"Redis at {self._url} unreachable: {exc}") from exc
        finally:
            probe.close()  # a probe repeated while offline must not leave a connection behind each time
        return {"status": "ok", "stream": self.stream}

    def open_run(self, meta: dict) -> dict:
        return self._xadd({"op": "open", "run": str(meta.get("run_id") or ""),
                           "doc": json.dumps(meta, default=str)})

    def close_run(self, run_id: str, info: dict) -> dict:
        return self._xadd({"op": "close", "run": run_id, "doc": json.dumps(info, default=str)})

    def send(self, run_id: str, table: str, segment_id: str, data: pa.Table | bytes) -> dict:
        body = bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else ipc_bytes(data)
        return self._xadd({"op": "segment", "run": run_id, "table": table, "segment": segment_id, "data": body})

    def close(self) -> None:
        if self._redis is not None:
            try:
                self._redis.close()
            finally:
                self._redis = None
