"""The Redis stream between producers and collectors (client/redis_transport.py writes it, service/redis_consumer.py
reads it): its address, ``redis://HOST:PORT[/DB][?stream=NAME]``, the consumer group the collectors share, and where
refused entries go.

An entry's fields: ``op`` (``open``, ``segment`` or ``close``) and ``run``; for a segment ``table``, ``segment`` (its
id) and ``data`` (the batch as an Arrow IPC stream); for open and close ``doc`` (the request's JSON, as over HTTP).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

#: the stream used when the address names none
DEFAULT_STREAM = "flowscope"
#: the consumer group every collector of a stream joins
GROUP = "flowscope-collectors"


def rejected_stream(stream: str) -> str:
    """Where collectors put the entries of ``stream`` they refused for good, with the reason."""
    return f"{stream}:rejected"


def parse_address(address: str) -> tuple[str, str]:
    """(Redis URL without the query, stream name) of ``redis://HOST:PORT[/DB][?stream=NAME]``; ValueError says
    what is wrong."""
    u = urlsplit(address)
    if u.scheme not in ("redis", "rediss") or not u.hostname:
        raise ValueError(f"bad Redis address {address!r}: expected redis://HOST:PORT[/DB][?stream=NAME]")
    query = parse_qs(u.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"stream"})
    if unknown:
        raise ValueError(f"bad Redis address {address!r}: unknown parameter {unknown[0]!r} (only stream=NAME)")
    stream = query.get("stream", [DEFAULT_STREAM])[-1]
    if not stream or len(stream) > 200:
        raise ValueError(f"bad Redis address {address!r}: the stream name must be 1-200 characters")
    return u._replace(query="", fragment="").geturl(), stream


def connect(url: str, timeout: float):
    """A Redis client for ``url`` (redis-py); ImportError says how to install it."""
    try:
        import redis
    except ImportError as exc:
        raise ImportError("the Redis transport needs the redis package: pip install 'flowscope[redis]'") from exc
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
