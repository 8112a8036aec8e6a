"""The live channel's binary messages: a JSON header and the task stream's columns as little-endian buffers that a
page reads with typed arrays, without parsing or converting them per task.

A message that carries columns (a snapshot, or deltas with tasks or transfers) is one binary WebSocket frame:

    u32 (little-endian) H | H bytes of UTF-8 JSON: the header | zero bytes up to a multiple of 8 | the body

The header is the message as it would be sent as text (``{"type": "snapshot", ...}`` or ``{"type": "deltas",
"epoch": ..., "deltas": [...]}``) plus ``"body": [L0, L1, ...]``: the byte length of each item's segment of the
body, in order (a snapshot is one item, each delta one), every length a multiple of 8. An item that holds sets of
columns of equal length (the stream's ``tasks``, ``transfers``) names them in its member ``"binary"`` (a list of
member names: only the item's own fields, never a name that came from the observed program, so a task group
called "columns" is not mistaken for one). Such a member is ``{"n": N, "columns": {name: spec}}``, each spec
relative to the item's own segment:

* ``["f64", offset]``: N float64 values; ``["i32", offset]``: N int32 values (every offset a multiple of 8);
* ``["utf8", offsets, data, length]``: N strings as Arrow keeps them: N + 1 int32 offsets at ``offsets`` into the
  ``length`` bytes of UTF-8 at ``data`` (string i is ``data[offsets[i]:offsets[i + 1]]``, a null is empty).

An item's segment is independent of where it sits, so a delta is encoded once and the same bytes go into the
message of every page, alone or with the deltas a reconnecting page missed. A message without columns is sent as
text, as before. :func:`read_message` is the reference reader (``live.js`` reads the same way).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.service.json_text import encode

__all__ = ["FrameError", "Item", "encode_item", "message", "read_message"]

_ALIGN = 8
_PAD = bytes(_ALIGN)


class FrameError(ValueError):
    """A binary message that does not follow the layout (says what and at which byte)."""


class Item:
    """One snapshot or delta, encoded once: its JSON text (columns as specs) and its body segment."""

    __slots__ = ("body", "text")

    def __init__(self, text: str, body: bytes):
        self.text, self.body = text, body


def _is_columns(v: Any) -> bool:
    return (isinstance(v, dict) and bool(v)
            and all(isinstance(c, (np.ndarray, pa.Array, pa.ChunkedArray)) for c in v.values()))


def _texts(col) -> tuple[np.ndarray, bytes]:
    """(N + 1 int32 offsets from 0, UTF-8 bytes) of a string column (nulls as empty strings)."""
    if isinstance(col, pa.ChunkedArray):
        col = pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], pa.string())
    if not pa.types.is_string(col.type):
        col = pc.cast(col, pa.string())
    col = pc.fill_null(col, "") if col.null_count else col
    n = len(col)
    if n == 0:
        return np.zeros(1, np.int32), b""
    _, offs, data = col.buffers()
    offsets = np.frombuffer(offs, np.int32, count=n + 1, offset=4 * col.offset)
    lo, hi = int(offsets[0]), int(offsets[-1])
    return (offsets - lo).astype(np.int32, copy=False), data.slice(lo, hi - lo).to_pybytes() if data is not None else b""


def _pad(n: int) -> int:
    return -n % _ALIGN


def _columns(cols: dict, parts: list[bytes], at: int) -> tuple[dict, int]:
    """The spec of one set of columns, its buffers appended to ``parts`` from byte ``at`` of the segment."""
    n = None
    spec: dict[str, list] = {}

    def put(b: bytes) -> int:
        nonlocal at
        start = at
        parts.append(b)
        at += len(b)
        if _pad(at):
            parts.append(_PAD[:_pad(at)])
            at += _pad(at)
        return start

    for name, col in cols.items():
        if isinstance(col, (pa.Array, pa.ChunkedArray)) and (pa.types.is_string(col.type)
                                                           or pa.types.is_large_string(col.type)):
            offsets, data = _texts(col)
            size = len(offsets) - 1
            spec[name] = ["utf8", put(offsets.tobytes()), put(data), len(data)]
        else:
            a = np.asarray(col)
            size = len(a)
            if a.dtype.kind == "f":
                spec[name] = ["f64", put(np.ascontiguousarray(a, "<f8").tobytes())]
            elif a.dtype.kind in "iub":
                if size and (a.min() < -2 ** 31 or a.max() >= 2 ** 31):
                    raise ValueError(f"column {name!r} holds values beyond int32")
                spec[name] = ["i32", put(np.ascontiguousarray(a, "<i4").tobytes())]
            else:
                raise TypeError(f"column {name!r} has dtype {a.dtype}: not f64, i32 or utf8")
        if n is None:
            n = size
        elif size != n:
            raise ValueError(f"column {name!r} has {size} values, the others {n}")
    return {"n": n or 0, "columns": spec}, at


def encode_item(doc: dict) -> Item:
    """``doc`` (a snapshot or a delta) as an :class:`Item`: its sets of columns (dicts of numpy or Arrow arrays of
    equal length) in the body, everything else in its JSON text."""
    parts: list[bytes] = []
    at = 0
    head = {}
    binary = []
    for k, v in doc.items():
        if _is_columns(v):
            head[k], at = _columns(v, parts, at)
            binary.append(k)
        else:
            head[k] = v
    if binary:
        head["binary"] = binary
    return Item(encode(head), b"".join(parts))


def message(fields: str, items: list[Item], key: str | None) -> str | bytes:
    """The message of ``items``: ``{fields, key: [item texts]}`` (``key`` None: one item whose fields are the
    message's own, a snapshot). ``fields`` is the JSON text of the message's other members, without braces. Text
    when no item has a body, else a binary frame."""
    if key is None:
        (item,) = items
        inner = item.text[1:-1]
        text = "{" + ",".join(p for p in (fields, inner) if p) + "}"
    else:
        text = "{" + ",".join(p for p in (fields, f'"{key}":[{",".join(i.text for i in items)}]') if p) + "}"
    if not any(i.body for i in items):
        return text
    text = text[:-1] + ',"body":[' + ",".join(str(len(i.body)) for i in items) + "]}"
    head = text.encode()
    return b"".join([struct.pack("<I", len(head)), head, _PAD[:_pad(4 + len(head))], *(i.body for i in items)])


def _read_columns(spec: dict, buf: memoryview, base: int, end: int) -> dict:
    n = spec.get("n")
    cols = spec.get("columns")
    if not isinstance(n, int) or n < 0 or not isinstance(cols, dict):
        raise FrameError(f"a column set at body byte {base} has no count n or no columns")
    out: dict[str, Any] = {}
    for name, c in cols.items():
        kind = c[0] if isinstance(c, list) and c else None
        size = {"f64": 8, "i32": 4}.get(kind)
        if size is not None:
            lo = base + c[1]
            if lo % _ALIGN or lo + size * n > end:
                raise FrameError(f"column {name!r} ({kind}) at byte {lo}: outside its segment [{base}, {end})")
            out[name] = np.frombuffer(buf, "<f8" if kind == "f64" else "<i4", count=n, offset=lo)
        elif kind == "utf8" and len(c) == 4:
            lo, data, length = base + c[1], base + c[2], c[3]
            if lo + 4 * (n + 1) > end or data + length > end:
                raise FrameError(f"column {name!r} (utf8) at byte {lo}: outside its segment [{base}, {end})")
            offsets = np.frombuffer(buf, "<i4", count=n + 1, offset=lo)
            raw = bytes(buf[data:data + length])
            out[name] = [raw[offsets[i]:offsets[i + 1]].decode() for i in range(n)]
        else:
            raise FrameError(f"column {name!r} has an unknown spec {c!r}")
    return out


def read_message(data: str | bytes) -> dict:
    """A message of the live channel as a dict: text parsed, a binary frame with its columns as numpy arrays
    (numbers) and lists of str (texts)."""
    if isinstance(data, str):
        return json.loads(data)
    buf = memoryview(data)
    if len(buf) < 4:
        raise FrameError(f"a binary message of {len(buf)} bytes: shorter than its 4-byte header length")
    (h,) = struct.unpack_from("<I", buf, 0)
    if 4 + h > len(buf):
        raise FrameError(f"the header claims {h} bytes, the message holds {len(buf) - 4} after byte 4")
    doc = json.loads(bytes(buf[4:4 + h]))
    items = doc["deltas"] if doc.get("type") == "deltas" else [doc]
    lengths = doc.pop("body", None)
    if not isinstance(lengths, list) or len(lengths) != len(items):
        raise FrameError(f"the header's body lists {lengths!r}: not one length per item ({len(items)})")
    base = 4 + h + _pad(4 + h)
    for item, length in zip(items, lengths):
        end = base + length
        if end > len(buf):
            raise FrameError(f"an item's segment ends at byte {end}, the message at {len(buf)}")
        for k in item.pop("binary", None) or []:
            v = item.get(k)
            if not isinstance(v, dict):
                raise FrameError(f"the item's column set {k!r} is missing")
            item[k] = _read_columns(v, buf, base, end)
        base = end
    return doc
