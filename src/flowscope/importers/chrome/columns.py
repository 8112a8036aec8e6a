"""Compact column stores for the millions of events of a trace (strings interned to small ints, ``X`` slices as
arrays plus Arrow batches spilled to a temp file), and the encodings the importer's rows share (µs to ns,
attrs JSON)."""

from __future__ import annotations

import json
import tempfile
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

#: how many rows go to the sink at a time
BATCH = 200_000
#: X slices per Arrow record batch of their text columns
XCHUNK = 65_536
#: bytes of X-slice text batches kept in memory before they are spilled to an Arrow IPC temp file
SPILL_BYTES = 256 << 20


class _Intern:
    """Strings to small ints, so millions of events keep one copy of each name."""

    def __init__(self):
        self.codes: dict[Any, int] = {}
        self.values: list[Any] = []

    def __call__(self, v: Any) -> int:
        c = self.codes.get(v)
        if c is None:
            c = self.codes[v] = len(self.values)
            self.values.append(v)
        return c


def _us_to_ns(ts: array | list | np.ndarray) -> np.ndarray:
    """Microseconds (ints or floats) to int64 nanoseconds, exact for integer microseconds."""
    a = np.asarray(ts, dtype=np.float64)
    whole = a == np.floor(a)
    if whole.all():
        return a.astype(np.int64) * 1000
    out = np.rint(a * 1000).astype(np.int64)
    out[whole] = a[whole].astype(np.int64) * 1000
    return out


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _args_json(args: Any) -> str | None:
    if not args:
        return None
    try:
        return _ENCODE(args)
    except (TypeError, ValueError):
        return _ENCODE(str(args))


def _marked_attrs(args: dict, fs: dict) -> str | None:
    """The attrs of a row flowscope exported: the args without what the exporter added for display."""
    added = set(fs.get("added") or ()) | {"flowscope"}
    return _args_json({k: v for k, v in args.items() if k not in added})


_X_SCHEMA = pa.schema([("name", pa.int32()), ("cat", pa.int32()), ("kind", pa.int32()),
                       ("task_key", pa.string()), ("text", pa.string())])


class _XSlices:
    """``X`` slices as compact columns: thread, start and duration as arrays in memory (20 bytes a
    slice, all nesting needs), the rest as Arrow record batches of codes and strings, spilled to an
    Arrow IPC temp file when they pass :data:`SPILL_BYTES`. ``kind`` is -1 for a slice that flowscope
    did not export (its attrs are built once its depth is known, ``text`` then holds its args JSON);
    otherwise the code of its kind and ``text`` its attrs."""

    def __init__(self) -> None:
        self.thread = array("i"); self.ts = array("d"); self.dur = array("d")
        self.name: list[int] = []; self.cat: list[int] = []; self.kind: list[int] = []
        self.task_key: list = []; self.text: list = []
        self.batches: list[pa.RecordBatch] = []
        self.mem_bytes = 0
        self.spilled = 0          # batches in the temp file
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def __len__(self) -> int:
        return len(self.ts)

    def seal(self) -> None:
        """Turn the pending rows into a record batch; spill the kept batches when over budget."""
        if not self.name:
            return
        tk = self.task_key
        if any(v is not None and v.__class__ is not str for v in tk):
            tk = [v if v is None or isinstance(v, str) else json.dumps(v, default=str) for v in tk]
        b = pa.record_batch([pa.array(self.name, pa.int32()), pa.array(self.cat, pa.int32()),
                             pa.array(self.kind, pa.int32()), pa.array(tk, pa.string()),
                             pa.array(self.text, pa.string())], schema=_X_SCHEMA)
        self.name, self.cat, self.kind, self.task_key, self.text = [], [], [], [], []
        self.batches.append(b)
        self.mem_bytes += b.nbytes
        if self.mem_bytes > SPILL_BYTES:
            if self._writer is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="flowscope-chrome-")
                self._writer = pa.ipc.new_stream(Path(self._tmp.name) / "x.arrows", _X_SCHEMA)
            for kept in self.batches:
                self._writer.write_batch(kept)
            self.spilled += len(self.batches)
            self.batches, self.mem_bytes = [], 0

    def read(self):
        """Every batch, in file order (the spilled ones first); may be called again."""
        self.seal()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._tmp is not None:
            with pa.memory_map(str(Path(self._tmp.name) / "x.arrows")) as src:
                yield from pa.ipc.open_stream(src)
        yield from self.batches

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self.batches = []
