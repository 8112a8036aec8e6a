"""Spans recorded per record into C column buffers, and handed to Arrow without a copy.

``Client.span``, ``Client.emit("spans", ...)`` and ``Client.row_writer("spans")`` are the per-record hot path of
every producer (the Dask plugin, ``@flowscope.trace``, a program's own spans). In pure Python each record costs a
call, a thread-local lookup, a dictionary lookup and seven list appends, each a few tens of nanoseconds of
CPython's own overhead, all under one GIL. The compiled recorder (``_span_recorder.c``, built with the package)
takes the call itself: it finds the calling thread's buffer, checks the values, looks up the repetitive strings
(resource, kind, name) in per-batch dictionaries and stores fixed-width values (int64, int32 codes, UTF-8 bytes),
with no Python object kept per value. A batch becomes Arrow from the buffers' own memory (``pyarrow.py_buffer``
over blocks the C side hands out and frees with the last Arrow reader).

Whatever is outside the common case (a value of another type, an interval that ends before it starts, an
``attrs`` dict) is decided by :func:`flowscope.client.packer.checker`, the pure-Python packer's own checks: both
paths accept, convert and refuse the same values with the same messages, and store the same rows.

When the extension is not built, :data:`AVAILABLE` is False and the client records spans with its pure-Python
packer (``Client(compiled=False)`` asks for that path explicitly).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa

from flowscope.client.packer import _to_json, checker
from flowscope.model.arrow_values import texts
from flowscope.model.conform import SchemaError
from flowscope.model.schemas import schema

try:
    from flowscope.client import _span_recorder
except ImportError:  # built with the package; a source tree without the build records in pure Python
    _span_recorder = None

__all__ = ["AVAILABLE", "SpanBuffer", "new_recorder"]

AVAILABLE = _span_recorder is not None

if AVAILABLE:
    _span_recorder.configure(SchemaError)
    _Buffer = _span_recorder.Buffer
else:
    _Buffer = object

_SCHEMA = schema("spans")
_TYPES = [f.type for f in _SCHEMA]
_normalize = checker("spans")


class SpanBuffer(_Buffer):
    """One thread's spans in C buffers, with the interface of a :class:`~flowscope.client.packer.Packer` that the
    client's builder uses (``len``, ``take``, ``since``, ``owner``, ...). ``add(*values)`` takes a span's values in
    column order; ``on_full(buffer)`` is called on the adding thread once ``flush_rows`` records are buffered."""

    table = "spans"
    schema = _SCHEMA
    columns = tuple(_SCHEMA.names)
    colset = frozenset(columns)

    def __init__(self, owner: threading.Thread | None = None, *, flush_rows: int | None = None,
                 on_full: Callable[[SpanBuffer], None] | None = None, rid: str | None = None):
        super().__init__(int(flush_rows) if flush_rows else 2**62, rid, on_full, _normalize, _to_json)
        self.owner = owner
        self.since = 0.0
        self.keep = False

    def take(self, reset: bool = False) -> pa.Table | None:
        """The records added so far as a canonical Arrow table (None if none), removed from the buffer. The
        string dictionaries start afresh with every batch (``reset`` is accepted for Packer's interface)."""
        raw = self._take()
        return None if raw is None else _to_arrow(raw)


def _to_arrow(raw: tuple) -> pa.Table:
    (n, span_id, span_id_valid, span_id_nulls, parent_id, parent_id_valid, parent_id_nulls,
     rid_codes, rid_values, kind_codes, kind_values, name_codes, name_values, starts, ends,
     key_offsets, key_text, key_valid, key_nulls, attrs_offsets, attrs_text, attrs_valid, attrs_nulls) = raw
    buf = pa.py_buffer

    def fixed(i: int, data, valid, nulls: int) -> pa.Array:
        return pa.Array.from_buffers(_TYPES[i], n, [buf(valid) if nulls else None, buf(data)], null_count=nulls)

    def coded(codes, values: list) -> pa.Array:
        return texts(values).take(pa.Array.from_buffers(pa.int32(), n, [None, buf(codes)], null_count=0))

    def text(i: int, offsets, data, valid, nulls: int) -> pa.Array:
        return pa.Array.from_buffers(_TYPES[i], n, [buf(valid) if nulls else None, buf(offsets), buf(data)],
                                     null_count=nulls)

    arrays = [fixed(0, span_id, span_id_valid, span_id_nulls), fixed(1, parent_id, parent_id_valid, parent_id_nulls),
              coded(rid_codes, rid_values), coded(kind_codes, kind_values), coded(name_codes, name_values),
              fixed(5, starts, None, 0), fixed(6, ends, None, 0),
              text(7, key_offsets, key_text, key_valid, key_nulls),
              text(8, attrs_offsets, attrs_text, attrs_valid, attrs_nulls)]
    return pa.Table.from_arrays(arrays, schema=_SCHEMA)


def new_recorder(first: Callable[[], SpanBuffer]) -> Callable[..., None]:
    """``span(name, start_ns, end_ns, *, kind='call', resource_id=None, task_key=None, attrs=None, span_id=None,
    parent_id=None)`` recording into the calling thread's buffer, which ``first()`` makes (and the caller keeps)
    on the thread's first record; its ``row(*values)`` is the spans row writer. Needs :data:`AVAILABLE`."""
    if not AVAILABLE:
        raise ImportError("flowscope.client._span_recorder is not built (pip install -e . builds it)")
    return _span_recorder.Recorder(first)
