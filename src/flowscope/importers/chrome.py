"""Chrome / Perfetto trace-event JSON (chrome://tracing, ui.perfetto.dev, viztracer, PyTorch profiler).

Reads the object form (``{"traceEvents": [...], "displayTimeUnit": ..., ...}``) and the bare-array
form (also cut short without its closing bracket, which Chrome accepts), plain or gzip. Events are
decoded one at a time from a sliding text window, so the file's text is never held whole; what is
kept is a compact column store of the events themselves, matched and emitted at the end.

Mapping (docs/formats/chrome-perfetto.md): pids and tids -> process and thread resources (named by
``M`` metadata); ``X`` and ``B``/``E`` -> spans (kind ``call``) nested per thread, with
``parent_id`` and ``depth``; async ``b``/``e`` and ``S``/``T``/``F`` -> spans (kind ``async``) on
the process; flows ``s``/``t``/``f`` and ``bind_id``/``flow_in``/``flow_out`` -> transfers;
``C`` counters -> metrics (one per series key); ``i``/``I``/``R``/``n`` -> logs. ``ts``/``dur`` are
microseconds whatever ``displayTimeUnit`` says (that only changes how viewers label the axis).
"""

from __future__ import annotations

import codecs
import gc
import gzip
import json
import re
import tempfile
import zlib
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:
    import orjson
except ImportError:  # optional: without it every event goes through the stdlib scanner
    orjson = None

from flowscope.importers.sink import ImportSink, _column

NAME = "chrome"

CHUNK = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")
_SNIFF_OBJECT = re.compile(rb'^\s*\{.*"traceEvents"\s*:', re.S)
_SNIFF_ARRAY = re.compile(rb'^\s*\[\s*\{')

SLICE = {"X", "B", "E"}
ASYNC = {"b", "e", "S", "T", "p", "F"}
FLOW = {"s", "t", "f"}
INSTANT = {"i", "I", "R", "n"}
#: phases the format defines that have no canonical table (object snapshots, samples, memory dumps,
#: clock sync, context markers): counted and reported, not imported
UNMAPPED = {"N", "O", "D", "P", "V", "v", "c", "(", ")", "=", "M"}

#: how many rows go to the sink at a time
BATCH = 200_000
#: characters of text decoded per window on the fast path (whole events, parsed in one call)
WINDOW = 4 << 20
#: X slices per Arrow record batch of their text columns
XCHUNK = 65_536
#: bytes of X-slice text batches kept in memory before they are spilled to an Arrow IPC temp file
SPILL_BYTES = 256 << 20


def sniff(path: Path, head: bytes) -> bool:
    """A JSON object with a ``traceEvents`` key, or a JSON array whose first object has ``ph``."""
    head = head.lstrip(b"\xef\xbb\xbf")
    if _SNIFF_OBJECT.match(head[:65536]):
        return True
    if _SNIFF_ARRAY.match(head):
        first = head[:4096]
        return b'"ph"' in first and (b'"ts"' in first or b'"name"' in first)
    return False


def _error(path: Path, msg: str) -> Exception:
    from flowscope.importers import TraceError

    return TraceError(f"{path}: {msg}")


class _Events:
    """Decodes the top-level value of a trace-event file one event at a time with bounded memory.

    Iterating yields each event (a dict); ``meta`` collects the object form's other keys,
    ``form`` is ``"object"`` or ``"array"``, ``unterminated`` whether an array ended without ``]``."""

    def __init__(self, path: Path, raw: BinaryIO, text_offset_note: str):
        self.path = path
        self.raw = raw
        self.note = text_offset_note
        self.dec = codecs.getincrementaldecoder("utf-8")("strict")
        self.scan = json.JSONDecoder().scan_once
        self.buf = ""
        self.pos = 0
        self.base_bytes = 0   # bytes of decoded content before self.buf
        self.eof = False
        self.form = ""
        self.unterminated = False
        self.meta: dict[str, Any] = {}
        self.index = -1        # index of the event being decoded
        self.event_pos = 0     # its position in self.buf
        self.batch_pos = -1    # where the window of events being handed out starts (fast path)
        self.batch_index = 0   # index of its first event
        self.slow_until = 0    # the fast path failed before here: decode one event at a time up to it

    # ---- window --------------------------------------------------------------------------------
    def byte_offset(self, pos: int | None = None) -> int:
        """Byte offset (in the decompressed content) of ``pos`` in the current window."""
        p = self.pos if pos is None else pos
        return self.base_bytes + len(self.buf[:p].encode("utf-8", "surrogatepass"))

    def where(self, pos: int | None = None) -> str:
        return f"byte offset {self.byte_offset(pos)}{self.note}"

    def event_where(self) -> str:
        """Where the current event starts (found again by scanning when it came from a window)."""
        if self.batch_pos < 0:
            return self.where(self.event_pos)
        p = _WS.match(self.buf, self.batch_pos).end()
        for _ in range(self.index - self.batch_index):
            _v, p = self.scan(self.buf, p)
            p = _WS.match(self.buf, p).end() + 1  # the comma
            p = _WS.match(self.buf, p).end()
        return self.where(p)

    def _window(self) -> list | None:
        """The whole events from the cursor to the last ``},`` of a large window, parsed in one call;
        None when that does not parse as a JSON array of objects (then events are decoded one by one,
        which places the error exactly)."""
        while len(self.buf) - self.pos < WINDOW and self._fill():
            pass
        cut = self.buf.rfind("},", self.pos)
        if cut < self.pos:
            self.slow_until = len(self.buf)
            return None
        try:
            events = orjson.loads("[" + self.buf[self.pos:cut + 1] + "]")
        except orjson.JSONDecodeError:
            events = None
        if events is None or not all(e.__class__ is dict for e in events):
            self.slow_until = cut + 1
            return None
        self.batch_pos = self.pos
        self.batch_index = self.index + 1
        self.pos = cut + 1
        return events

    def _fill(self) -> bool:
        """Drop what is consumed, read another chunk; False at end of input."""
        if self.eof:
            return False
        if self.pos:
            self.base_bytes += len(self.buf[:self.pos].encode("utf-8", "surrogatepass"))
            self.event_pos -= self.pos
            self.slow_until -= self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        try:
            data = self.raw.read(CHUNK)
        except (OSError, EOFError, zlib.error) as exc:
            raise _error(self.path, f"cannot read past {self.where(len(self.buf))}: {exc}") from None
        try:
            text = self.dec.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise _error(self.path, f"invalid UTF-8 at byte offset "
                                    f"{self.byte_offset(len(self.buf)) + exc.start}{self.note}") from None
        if not data:
            self.eof = True
        self.buf += text
        return bool(data) or bool(text)

    def _skip_ws(self) -> str:
        """The next non-blank character ("" at end of input), not consumed."""
        if self.pos < len(self.buf) and self.buf[self.pos] not in " \t\n\r":
            return self.buf[self.pos]
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                return ""

    def _value(self, what: str) -> Any:
        """Decode one JSON value at the cursor, reading more input when the window ends inside it."""
        while True:
            try:
                value, end = self.scan(self.buf, self.pos)
                if end == len(self.buf) and not self.eof and not isinstance(value, (dict, list, str)):
                    # a number at the window's end may continue in the next chunk
                    raise json.JSONDecodeError("number at window end", self.buf, len(self.buf))
                self.pos = end
                return value
            except StopIteration as exc:
                err = ("Expecting value", exc.value)
            except json.JSONDecodeError as exc:
                err = (exc.msg, exc.pos)
            except RecursionError:
                raise _error(self.path, f"{what} nested too deeply at {self.where()}") from None
            at_end = err[1] >= len(self.buf) - 8 or err[0].startswith("Unterminated string")
            if at_end and self._fill():
                continue
            pos = min(err[1], len(self.buf))
            if at_end:
                raise _error(self.path, f"truncated: the file ends inside {what} "
                                        f"(which starts at {self.where(self.pos)}; input ends at "
                                        f"{self.where(len(self.buf))})")
            raise _error(self.path, f"invalid JSON in {what} at {self.where(pos)}: {err[0]}")

    def _expect(self, chars: str, what: str) -> str:
        c = self._skip_ws()
        if c == "":
            raise _error(self.path, f"truncated: the file ends where {what} was expected ({self.where()})")
        if c not in chars:
            raise _error(self.path, f"invalid JSON at {self.where()}: expected {what}, found {c!r}")
        self.pos += 1
        return c

    # ---- structure -----------------------------------------------------------------------------
    def __iter__(self):
        c = self._skip_ws()
        if c == "\ufeff":
            self.pos += 1
            c = self._skip_ws()
        if c == "[":
            self.form = "array"
            self.pos += 1
            yield from self._array(top=True)
        elif c == "{":
            self.form = "object"
            self.pos += 1
            yield from self._object()
        elif c == "":
            raise _error(self.path, "empty file: expected a JSON object with traceEvents or an array of events")
        else:
            raise _error(self.path, f"not a trace-event file: expected '{{' or '[' at {self.where()}, found {c!r}")
        if self._skip_ws() != "":
            raise _error(self.path, f"unexpected data after the end of the trace at {self.where()}")

    def _object(self):
        seen_events = False
        if self._skip_ws() == "}":
            self.pos += 1
        else:
            while True:
                self._expect('"', "a key (string)")
                self.pos -= 1
                key = self._value("a key")
                self._expect(":", "':'")
                if key == "traceEvents":
                    self._expect("[", "the traceEvents array '['")
                    seen_events = True
                    yield from self._array(top=False)
                else:
                    if self._skip_ws() == "":
                        raise _error(self.path, f"truncated: the file ends before the value of {key!r} "
                                                f"({self.where()})")
                    self.meta[key] = self._value(f"the value of {key!r}")
                if self._expect(",}", "',' or '}'") == "}":
                    break
        if not seen_events:
            raise _error(self.path, "the JSON object has no traceEvents array")

    def _array(self, top: bool):
        c = self._skip_ws()
        if c == "]":
            self.pos += 1
            return
        while True:
            c = self._skip_ws()
            if c == "" and top and self.index >= 0:
                self.unterminated = True  # Chrome writes the array form without "]" while tracing
                return
            events = self._window() if orjson is not None and self.pos >= self.slow_until else None
            if events is not None:
                for event in events:
                    self.index += 1
                    yield event
                self.batch_pos = -1
            else:
                self.index += 1
                self.event_pos = self.pos
                event = self._value(f"event #{self.index}")
                if not isinstance(event, dict):
                    raise _error(self.path, f"event #{self.index} at {self.where(self.event_pos)} is a "
                                            f"{type(event).__name__}, expected a JSON object")
                yield event
            c = self._skip_ws()
            if c == ",":
                self.pos += 1
                if top and self._skip_ws() == "":
                    self.unterminated = True
                    return
                continue
            if c == "]":
                self.pos += 1
                return
            if c == "" and top:
                self.unterminated = True
                return
            if c == "":
                raise _error(self.path, f"truncated: the file ends inside the traceEvents array ({self.where()})")
            raise _error(self.path, f"invalid JSON at {self.where()}: expected ',' or ']' after event "
                                    f"#{self.index}, found {c!r}")


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


def _num(event: dict, key: str, ev: _Events, required: bool = True) -> float | int | None:
    v = event.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    if v is None and not required:
        return None
    if v is None:
        raise _error(ev.path, f"event #{ev.index} (ph {event.get('ph')!r}) at {ev.event_where()} "
                              f"has no {key!r} field")
    raise _error(ev.path, f"event #{ev.index} (ph {event.get('ph')!r}) at {ev.event_where()}: "
                          f"field {key!r} is {type(v).__name__} {v!r:.40}, expected a number of microseconds")


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


def _async_key(e: dict, pid: Any) -> tuple:
    id2 = e.get("id2")
    if isinstance(id2, dict):
        if "global" in id2:
            ident: Any = ("g", str(id2["global"]))
        else:
            ident = ("l", pid, str(id2.get("local")))
    else:
        ident = ("i", str(e.get("id")))
    return e.get("cat"), e.get("scope"), ident


def _nest(thread: np.ndarray, start: np.ndarray, end: np.ndarray, is_async: np.ndarray,
          piece: int = 1 << 19) -> tuple[np.ndarray, np.ndarray]:
    """Parent index (-1 for none) and depth of each span: per thread, by start then longest first, a
    span is the child of the innermost open span that contains it; async spans take no part."""
    n = len(thread)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    order = np.lexsort((np.arange(n), -end, start, is_async, thread))
    order = order[~is_async[order]]
    st_end: list[int] = []
    st_idx: list[int] = []
    cur = None
    for lo in range(0, len(order), piece):  # in pieces, so the Python lists stay small
        idx = order[lo:lo + piece]
        par = [-1] * len(idx)
        dep = [0] * len(idx)
        k = 0
        for i, t, s, e in zip(idx.tolist(), thread[idx].tolist(), start[idx].tolist(), end[idx].tolist()):
            if t != cur:
                st_end.clear()
                st_idx.clear()
                cur = t
            while st_end and st_end[-1] <= s and not (st_end[-1] == s == e):
                st_end.pop()
                st_idx.pop()
            while st_end and e > st_end[-1]:  # overlaps without nesting: not a child
                st_end.pop()
                st_idx.pop()
            if st_end:
                par[k] = st_idx[-1]
                dep[k] = len(st_end)
            st_end.append(e)
            st_idx.append(i)
            k += 1
        parent[idx] = par
        depth[idx] = dep
    return parent, depth


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
        """Every batch, in file order (the spilled ones first)."""
        self.seal()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
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


class _Reader:
    """State of one import: resources seen, and column stores per kind of record."""

    def __init__(self, path: Path, sink: ImportSink):
        self.path = path
        self.sink = sink
        self.label = path.name
        self.names = _Intern()
        self.cats = _Intern()
        self.threads = _Intern()     # (pid, tid) -> code; tid None = the process itself
        self.proc_names: dict[Any, str] = {}
        self.thread_names: dict[tuple, str] = {}
        self.sort_index: dict[tuple, Any] = {}
        self.marked: dict[tuple, dict] = {}  # (pid, tid) -> flowscope resource description
        self.phases: Counter = Counter()
        self.unknown: dict[str, tuple[int, str]] = {}
        self.other_meta: dict[str, Any] = {}
        self.t_min = None
        self.t_max = None
        self.kinds = _Intern()
        self.xs = _XSlices()
        # B/E slices, in file order
        self.sl_thread = array("q"); self.sl_ts = array("d")
        self.sl_ph = array("b"); self.sl_name = array("q"); self.sl_cat = array("q")
        self.sl_args: list = []
        self.sl_bind: list = []  # (thread, name code, bind key, flow_in, flow_out, ts) for flow v2
        self.no_dur = 0
        # async: (key, ph, ts, thread, name, cat, args, order)
        self.asyncs: list = []
        # flows: (key, ph, ts, thread, name, cat, args, order, bp)
        self.flows: list = []
        # instants and counters go to the sink in batches
        self.logs: dict[str, list] = {k: [] for k in ("ts", "thread", "level", "category", "message", "task_key", "attrs")}
        self.metrics: dict[str, list] = {k: [] for k in ("ts", "thread", "namespace", "name", "value")}
        self.origin_ns = 0
        self.origin: dict[str, Any] | None = None  # which top-level key gave origin_ns
        self.flushed_before_origin = 0  # log and metric rows written while no origin was known

    # ---- time origin -----------------------------------------------------------------------
    def set_origin(self, meta: dict[str, Any]) -> None:
        """ns since the epoch of ``ts`` 0, from the top-level keys read so far: flowscope's own export marker,
        else ``baseTimeNanoseconds`` (PyTorch profiler / Kineto: ``ts`` are µs after that base)."""
        if self.origin is not None:
            return
        fs = meta.get("flowscope")
        if isinstance(fs, dict) and isinstance(fs.get("time_origin_ns"), int):
            self.origin_ns = fs["time_origin_ns"]
            self.origin = {"key": "flowscope.time_origin_ns", "ns": self.origin_ns}
            return
        if "baseTimeNanoseconds" not in meta:
            return
        base = meta["baseTimeNanoseconds"]
        if isinstance(base, float) and base.is_integer():
            base = int(base)
        if isinstance(base, bool) or not isinstance(base, int) or not 0 <= base < 1 << 62:
            self.origin = {"key": "baseTimeNanoseconds", "ignored": repr(base)[:40]}
            self.sink.warn(f"top-level baseTimeNanoseconds is {type(base).__name__} {base!r:.40}, expected an "
                           f"integer number of ns since the epoch below 2**62: ignored, times are the trace's own "
                           f"(µs from its 0)")
            return
        self.origin_ns = base
        self.origin = {"key": "baseTimeNanoseconds", "ns": base}

    # ---- resources -------------------------------------------------------------------------
    def thread(self, e: dict, scope_process: bool = False) -> int:
        pid = e.get("pid")
        tid = None if scope_process else e.get("tid")
        return self.threads((pid, tid))

    def process_rid(self, pid: Any) -> str:
        m = self.marked.get((pid, None))
        return m["resource_id"] if m else f"process:{self.label}:{pid}"

    def resource_id(self, key: tuple) -> str:
        pid, tid = key
        m = self.marked.get(key)
        if m:
            return m["resource_id"]
        if tid is None:
            return self.process_rid(pid)
        return f"thread:{self.label}:{pid}:{tid}"

    # ---- per event -------------------------------------------------------------------------
    def event(self, e: dict, ev: _Events) -> None:
        ph = e.get("ph")
        self.phases[ph] += 1
        if ph == "X":
            ts = e.get("ts")
            if ts.__class__ is not float and ts.__class__ is not int:
                ts = _num(e, "ts", ev)
            dur = e.get("dur")
            if dur is None:
                self.no_dur += 1
                dur = 0
            elif dur.__class__ is not float and dur.__class__ is not int:
                dur = _num(e, "dur", ev)
            th = self.threads((e.get("pid"), e.get("tid")))
            name = self.names(e.get("name") or "")
            if "bind_id" in e or e.get("flow_in") or e.get("flow_out"):
                bid = e.get("bind_id", e.get("id"))
                self.sl_bind.append((th, name, (e.get("cat"), str(bid)), bool(e.get("flow_in")),
                                     bool(e.get("flow_out")), ts))
            xs = self.xs
            xs.thread.append(th)
            xs.ts.append(ts)
            xs.dur.append(dur)
            xs.name.append(name)
            xs.cat.append(self.cats(e.get("cat")))
            args = e.get("args")
            fs = args.get("flowscope") if args.__class__ is dict else None
            if fs.__class__ is dict:
                xs.kind.append(self.kinds(fs.get("kind") or "call"))
                xs.task_key.append(fs.get("task_key"))
                xs.text.append(_marked_attrs(args, fs))
            else:
                xs.kind.append(-1)
                xs.task_key.append(None)
                xs.text.append(_args_json(args))
            if len(xs.name) >= XCHUNK:
                xs.seal()
        elif ph == "B" or ph == "E":
            ts = _num(e, "ts", ev)
            self._seen(ts)
            th = self.thread(e)
            name = self.names(e.get("name") or "")
            if "bind_id" in e or e.get("flow_in") or e.get("flow_out"):
                bid = e.get("bind_id", e.get("id"))
                self.sl_bind.append((th, name, (e.get("cat"), str(bid)), bool(e.get("flow_in")),
                                     bool(e.get("flow_out")), ts))
            self.sl_thread.append(th)
            self.sl_ts.append(ts)
            self.sl_ph.append(1 if ph == "B" else 2)
            self.sl_name.append(name)
            self.sl_cat.append(self.cats(e.get("cat")))
            self.sl_args.append(e.get("args") or None)
        elif ph in INSTANT:
            ts = _num(e, "ts", ev)
            self._seen(ts)
            s = e.get("s")
            args = e.get("args") or {}
            fs = args.get("flowscope") if isinstance(args, dict) else None
            L = self.logs
            L["ts"].append(ts)
            L["thread"].append(-1 if s == "g" else self.thread(e, scope_process=(s == "p" or ph == "n")))
            if isinstance(fs, dict):
                L["level"].append(fs.get("level") or "info")
                L["category"].append(fs.get("category") or "instant")
                L["task_key"].append(fs.get("task_key"))
                L["attrs"].append(_marked_attrs(args, fs))
            else:
                L["level"].append("info")
                L["category"].append(e.get("cat") or ("async-instant" if ph == "n" else "instant"))
                L["task_key"].append(None)
                extra = {k: e[k] for k in ("s", "id", "scope") if k in e}
                if args:
                    extra["args"] = args
                L["attrs"].append(_args_json(extra))
            L["message"].append(e.get("name"))
            if len(L["ts"]) >= BATCH:
                self.flush_logs()
        elif ph == "C":
            ts = _num(e, "ts", ev)
            self._seen(ts)
            args = e.get("args") or {}
            if not isinstance(args, dict):
                raise _error(self.path, f"event #{ev.index} (counter {e.get('name')!r}) at {ev.event_where()}: "
                                        f"args is {type(args).__name__}, expected an object of series values")
            base = str(e.get("name") or "counter")
            if e.get("id") is not None:
                base = f"{base}[{e['id']}]"
            th = self.thread(e, scope_process=True)
            M = self.metrics
            for key, v in args.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    if isinstance(v, str):
                        try:
                            v = float(v)
                        except ValueError:
                            continue
                    else:
                        continue
                M["ts"].append(ts)
                M["thread"].append(th)
                M["namespace"].append(e.get("cat") or "counter")
                M["name"].append(base if key == "value" else f"{base}.{key}")
                M["value"].append(float(v))
            if len(M["ts"]) >= BATCH:
                self.flush_metrics()
        elif ph in ASYNC:
            ts = _num(e, "ts", ev)
            self._seen(ts)
            self.asyncs.append((_async_key(e, e.get("pid")), ph, ts, self.thread(e), e.get("name") or "",
                                e.get("cat"), e.get("args") or None, len(self.asyncs)))
        elif ph in FLOW:
            ts = _num(e, "ts", ev)
            self._seen(ts)
            self.flows.append(((e.get("cat"), str(e.get("id", (e.get("id2") or {}).get("global")))), ph, ts,
                               self.thread(e), e.get("name") or "", e.get("cat"), e.get("args") or None,
                               len(self.flows), e.get("bp")))
        elif ph == "M":
            self.metadata(e)
        elif ph in UNMAPPED:
            self.thread(e)
        else:
            if ph not in self.unknown:
                self.unknown[str(ph)] = (ev.index, ev.event_where())

    def _seen(self, ts: float) -> None:
        if self.t_min is None or ts < self.t_min:
            self.t_min = ts
        if self.t_max is None or ts > self.t_max:
            self.t_max = ts

    def metadata(self, e: dict) -> None:
        name = e.get("name")
        args = e.get("args") or {}
        pid, tid = e.get("pid"), e.get("tid")
        fs = args.get("flowscope") if isinstance(args, dict) else None
        if name == "process_name":
            self.proc_names[pid] = str(args.get("name"))
            self.threads((pid, None))
            if isinstance(fs, dict) and fs.get("resource_id"):
                self.marked[(pid, None)] = fs
        elif name == "thread_name":
            self.thread_names[(pid, tid)] = str(args.get("name"))
            self.threads((pid, tid))
            if isinstance(fs, dict) and fs.get("resource_id"):
                self.marked[(pid, tid)] = fs
        elif name == "process_sort_index":
            self.sort_index[(pid, None)] = args.get("sort_index")
        elif name == "thread_sort_index":
            self.sort_index[(pid, tid)] = args.get("sort_index")
        else:
            self.other_meta.setdefault(str(name), args if len(json.dumps(args, default=str)) < 4096 else "…")

    # ---- output ----------------------------------------------------------------------------
    def _rids(self, codes: np.ndarray) -> list:
        table = [self.resource_id(k) for k in self.threads.values]
        return [None if c < 0 else table[c] for c in codes.tolist()]

    def flush_logs(self) -> None:
        L = self.logs
        if not L["ts"]:
            return
        if self.origin is None:
            self.flushed_before_origin += len(L["ts"])
        self.sink.add("logs", {"ts_ns": _us_to_ns(L["ts"]) + self.origin_ns,
                               "resource_id": self._rids(np.asarray(L["thread"])),
                               "level": L["level"], "category": L["category"], "message": L["message"],
                               "task_key": L["task_key"], "attrs": L["attrs"]})
        for v in L.values():
            v.clear()

    def flush_metrics(self) -> None:
        M = self.metrics
        if not M["ts"]:
            return
        if self.origin is None:
            self.flushed_before_origin += len(M["ts"])
        self.sink.add("metrics", {"ts_ns": _us_to_ns(M["ts"]) + self.origin_ns,
                                  "resource_id": self._rids(np.asarray(M["thread"])),
                                  "namespace": M["namespace"], "name": M["name"], "value": M["value"]})
        for v in M.values():
            v.clear()

    def finish(self, ev: _Events) -> None:
        if self.origin is None:  # the key came after traceEvents in the file
            self.set_origin(ev.meta)
            if self.origin is not None and self.origin_ns and self.flushed_before_origin:
                self.sink.warn(f"{self.origin['key']} comes after traceEvents in the file: the first "
                               f"{self.flushed_before_origin} log and metric rows were written before it was read "
                               f"and keep the trace's own times (µs from its 0, as ns)")
        self.flush_logs()
        self.flush_metrics()
        if len(self.xs):
            ts = np.frombuffer(self.xs.ts, dtype=np.float64)
            end = ts + np.frombuffer(self.xs.dur, dtype=np.float64)
            self._seen(float(min(ts.min(), end.min())))
            self._seen(float(max(ts.max(), end.max())))
            del ts, end
        end_us = self.t_max if self.t_max is not None else 0
        spans = self._slices(end_us)
        spans += self._async_spans(end_us)
        self._emit_spans(spans)
        self._transfers()
        self._resources()
        meta: dict[str, Any] = {"form": ev.form, "events": int(sum(self.phases.values())),
                                "events_by_phase": {str(k): v for k, v in sorted(self.phases.items(), key=str)}}
        if ev.unterminated:
            meta["unterminated_array"] = True
        dtu = ev.meta.get("displayTimeUnit")
        if dtu is not None:
            meta["display_time_unit"] = dtu
        small = {k: v for k, v in ev.meta.items() if k not in ("displayTimeUnit", "traceEvents")
                 and len(json.dumps(v, default=str)) < 8192}
        if small:
            meta["trace_metadata"] = small
        big = sorted(set(ev.meta) - set(small) - {"displayTimeUnit"})
        if big:
            meta["not_imported_keys"] = big
        if self.other_meta:
            meta["metadata_events"] = self.other_meta
        if self.origin is not None:
            meta["time_origin"] = self.origin
        self.sink.set_meta(**meta)
        if self.t_min is not None:
            self.sink.set_run_fields(start_ns=int(_us_to_ns([self.t_min])[0]) + self.origin_ns,
                                     end_ns=int(_us_to_ns([self.t_max])[0]) + self.origin_ns)
        if self.no_dur:
            self.sink.warn(f"{self.no_dur} X events have no 'dur': imported with duration 0")
        for ph, (i, where) in sorted(self.unknown.items()):
            self.sink.warn(f"unknown phase ph={ph!r} ({self.phases[ph]} events, first: event #{i} at {where}): "
                           f"not imported")
        skipped = {str(p): n for p, n in self.phases.items() if p in UNMAPPED and p != "M"}
        if skipped:
            self.sink.warn(f"{sum(skipped.values())} events of phases {', '.join(sorted(skipped))} (object "
                           f"snapshots, samples, memory dumps, clock sync) have no flowscope table: not imported")

    # ---- slices ----------------------------------------------------------------------------
    def _slices(self, end_us: float) -> list[tuple]:
        """(thread, start_us, end_us, name, cat, args, unclosed, index) for matched B/E pairs."""
        n = len(self.sl_ts)
        out: list[tuple] = []
        if n == 0:
            return out
        thread = np.frombuffer(self.sl_thread, dtype=np.int64)
        ts = np.frombuffer(self.sl_ts, dtype=np.float64)
        ph = np.frombuffer(self.sl_ph, dtype=np.int8)
        names, cats, args = self.names.values, self.cats.values, self.sl_args
        be = np.arange(n)
        if len(be):
            order = be[np.lexsort((be, ts[be], thread[be]))]  # per thread, by time, file order on ties
            stacks: dict[int, list] = {}
            orphans = 0
            mismatched = 0
            for i in order.tolist():
                th = int(thread[i])
                st = stacks.setdefault(th, [])
                if ph[i] == 1:
                    st.append(i)
                    continue
                if not st:
                    orphans += 1
                    continue
                b = st.pop()
                if self.sl_name[i] != self.sl_name[b] and names[self.sl_name[i]]:
                    mismatched += 1
                a = args[b]
                if args[i]:
                    a = {**(a or {}), **args[i]} if isinstance(a, dict) or a is None else a
                out.append((th, ts[b], ts[i], names[self.sl_name[b]], cats[self.sl_cat[b]], a, False, b))
            unclosed = [(th, b) for th, st in stacks.items() for b in st]
            for th, b in unclosed:
                out.append((th, ts[b], max(end_us, ts[b]), names[self.sl_name[b]], cats[self.sl_cat[b]],
                            args[b], True, b))
            if unclosed:
                ex = ", ".join(f"{names[self.sl_name[b]]!r} on {self.resource_id(self.threads.values[th])}"
                               for th, b in unclosed[:3])
                self.sink.warn(f"{len(unclosed)} B events have no matching E (unclosed slices, e.g. {ex}): "
                               f"imported ending at the trace end, marked unclosed in attrs")
            if orphans:
                self.sink.warn(f"{orphans} E events have no open B on their thread: ignored")
            if mismatched:
                self.sink.warn(f"{mismatched} E events close a B of another name (matched by nesting, as viewers do)")
        return out

    def _async_spans(self, end_us: float) -> list[tuple]:
        """Matched async begin/end pairs, as slices on the process of their begin event."""
        out: list[tuple] = []
        if not self.asyncs:
            return out
        events = sorted(self.asyncs, key=lambda r: (r[2], r[7]))
        open_n: dict[tuple, list] = {}     # nestable b/e: stack per key
        open_l: dict[tuple, dict] = {}     # legacy S/T/F: per key and name
        orphans = 0
        for key, ph, ts, th, name, cat, args, order in events:
            if ph == "b":
                open_n.setdefault(key, []).append([ts, th, name, cat, args])
            elif ph == "e":
                st = open_n.get(key)
                if not st:
                    orphans += 1
                    continue
                j = len(st) - 1
                while j >= 0 and name and st[j][2] != name:
                    j -= 1
                j = j if j >= 0 else len(st) - 1
                b = st.pop(j)
                a = b[4]
                if args:
                    a = {**(a or {}), **args} if isinstance(a, dict) or a is None else a
                out.append(self._async_row(b[1], b[0], ts, b[2], b[3], a, False, key, len(st)))
            elif ph == "S":
                open_l.setdefault((key, name), [])
                open_l[(key, name)].append([ts, th, name, cat, args, []])
            elif ph in ("T", "p"):
                st = open_l.get((key, name))
                if st:
                    st[-1][5].append({"ts_us": ts, "ph": ph, **({"args": args} if args else {})})
                else:
                    orphans += 1
            elif ph == "F":
                st = open_l.get((key, name))
                if not st:
                    orphans += 1
                    continue
                b = st.pop(0)
                a = dict(b[4] or {})
                if args:
                    a.update(args)
                if b[5]:
                    a["steps"] = b[5]
                out.append(self._async_row(b[1], b[0], ts, b[2], b[3], a or None, False, key, 0))
        unclosed = [(k, b) for k, st in open_n.items() for b in st] + \
                   [(k[0], b) for k, st in open_l.items() for b in st]
        for key, b in unclosed:
            out.append(self._async_row(b[1], b[0], max(end_us, b[0]), b[2], b[3], b[4], True, key, 0))
        if unclosed:
            self.sink.warn(f"{len(unclosed)} async begin events (b/S) have no matching end: imported ending "
                           f"at the trace end, marked unclosed in attrs")
        if orphans:
            self.sink.warn(f"{orphans} async end/step events (e/T/F) have no open begin: ignored")
        return out

    def _async_row(self, th: int, t0: float, t1: float, name: str, cat: Any, args: Any, unclosed: bool,
                   key: tuple, depth: int) -> tuple:
        pid = self.threads.values[th][0]
        ident = key[2][-1]
        extra = {"async_id": ident, "async_depth": depth, "tid": self.threads.values[th][1]}
        if key[1] is not None:
            extra["scope"] = key[1]
        return (self.threads((pid, None)), t0, t1, name, cat, args, unclosed, -1, extra)

    def _emit_spans(self, rows: list[tuple]) -> None:
        """Write the X slices (from their column store) then ``rows`` (B/E and async spans), with
        parents and depths from one nesting pass over all of them."""
        nx = len(self.xs)
        n = nx + len(rows)
        if n == 0:
            return
        thread = np.empty(n, dtype=np.int64)
        start = np.empty(n, dtype=np.int64)
        end = np.empty(n, dtype=np.int64)
        is_async = np.zeros(n, dtype=bool)
        if nx:
            thread[:nx] = np.frombuffer(self.xs.thread, dtype=np.int32)
            ts = np.frombuffer(self.xs.ts, dtype=np.float64)
            start[:nx] = _us_to_ns(ts)
            # an X slice's end is its start plus its duration, each rounded to the ns on its own
            end[:nx] = start[:nx] + _us_to_ns(np.frombuffer(self.xs.dur, dtype=np.float64))
            del ts
        if rows:
            thread[nx:] = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            start[nx:] = _us_to_ns([r[1] for r in rows])
            end[nx:] = _us_to_ns([r[2] for r in rows])
            is_async[nx:] = np.fromiter((len(r) > 8 for r in rows), dtype=bool, count=len(rows))
        parent, depth = _nest(thread, start, end, is_async)
        base = (zlib.crc32(self.sink.token.encode()) & 0x7FFFFFFF) << 32
        rid_table = _column([self.resource_id(k) for k in self.threads.values], pa.string(), "spans", "resource_id")
        if nx:
            self._emit_x(base, thread, start, end, parent, depth, rid_table)
        if rows:
            self._emit_rows(rows, base, thread, start, end, parent, depth, is_async, rid_table, nx)
        self._thread_span_times = (thread, start, end)

    def _emit_x(self, base: int, thread: np.ndarray, start: np.ndarray, end: np.ndarray, parent: np.ndarray,
                depth: np.ndarray, rid_table: pa.Array) -> None:
        names = _column([v if v is None or isinstance(v, str) else str(v) for v in self.names.values],
                        pa.string(), "spans", "name")
        kinds = _column(["call"] + [str(v) for v in self.kinds.values], pa.string(), "spans", "kind")
        cat_json = pa.array(["" if c is None else ',"cat":' + _ENCODE(c) for c in self.cats.values], pa.string())
        lo = 0
        for b in self.xs.read():
            hi = lo + b.num_rows
            th = pa.array(thread[lo:hi])
            par = parent[lo:hi]
            kind = b.column("kind")
            marked = pc.greater_equal(kind, 0)
            # attrs of a slice flowscope did not write: {"depth":D,"cat":C,"args":A}
            args_part = pc.fill_null(pc.binary_join_element_wise(',"args":', b.column("text"), ""), "")
            built = pc.binary_join_element_wise(
                '{"depth":', pc.cast(pa.array(depth[lo:hi]), pa.string()), cat_json.take(b.column("cat")),
                args_part, "}", "")
            self.sink.add("spans", {
                "span_id": pa.array(base + np.arange(lo, hi, dtype=np.int64)),
                "parent_id": pa.array(base + par, mask=par < 0),
                "resource_id": rid_table.take(th), "kind": kinds.take(pc.add(kind, 1)),
                "name": names.take(b.column("name")),
                "start_ns": pa.array(start[lo:hi] + self.origin_ns), "end_ns": pa.array(end[lo:hi] + self.origin_ns),
                "task_key": b.column("task_key"),
                "attrs": pc.if_else(marked, b.column("text"), built)})
            lo = hi
        self.xs.close()

    def _emit_rows(self, rows: list[tuple], base: int, thread: np.ndarray, start: np.ndarray, end: np.ndarray,
                   parent: np.ndarray, depth: np.ndarray, is_async: np.ndarray, rid_table: pa.Array,
                   nx: int) -> None:
        kinds, names, task_keys, attrs = [], [], [], []
        cat_json: dict[Any, str] = {}
        for j, r in enumerate(rows):
            i = nx + j
            args = r[5]
            fs = args.get("flowscope") if isinstance(args, dict) else None
            names.append(r[3])
            if isinstance(fs, dict):
                kinds.append(fs.get("kind") or "call")
                task_keys.append(fs.get("task_key"))
                attrs.append(_marked_attrs(args, fs))
                continue
            kinds.append("async" if is_async[i] else "call")
            task_keys.append(None)
            if not args and not r[6] and not is_async[i]:  # the common case, without building a dict
                c = cat_json.get(r[4])
                if c is None:
                    c = cat_json[r[4]] = "" if r[4] is None else ',"cat":' + _ENCODE(r[4])
                attrs.append(f'{{"depth":{depth[i]}{c}}}')
                continue
            a: dict[str, Any] = {"depth": int(r[8]["async_depth"]) if is_async[i] else int(depth[i])}
            if r[4] is not None:
                a["cat"] = r[4]
            if r[6]:
                a["unclosed"] = True
            if is_async[i]:
                a.update(r[8])
            if args:
                a["args"] = args
            attrs.append(_args_json(a))
        n = len(rows)
        for lo in range(0, n, BATCH):
            hi = min(n, lo + BATCH)
            par = parent[nx + lo:nx + hi]
            self.sink.add("spans", {"span_id": base + np.arange(nx + lo, nx + hi, dtype=np.int64),
                                    "parent_id": pa.array(base + par, mask=par < 0),
                                    "resource_id": rid_table.take(pa.array(thread[nx + lo:nx + hi])),
                                    "kind": kinds[lo:hi], "name": names[lo:hi],
                                    "start_ns": start[nx + lo:nx + hi] + self.origin_ns,
                                    "end_ns": end[nx + lo:nx + hi] + self.origin_ns,
                                    "task_key": task_keys[lo:hi], "attrs": attrs[lo:hi]})

    # ---- flows -----------------------------------------------------------------------------
    def _transfers(self) -> None:
        rows: dict[str, list] = {k: [] for k in ("src", "dst", "t0", "t1", "kind", "attrs", "nbytes", "keys")}
        unmatched = 0
        open_f: dict[tuple, list] = {}

        def step_or_finish(key, ph, ts, th) -> bool:
            b = open_f.get(key)
            if b is None:
                return False
            if ph == "t":
                b[5].append({"ts_us": ts, "resource_id": self.resource_id(self.threads.values[th])})
            else:
                del open_f[key]
                self._transfer_row(rows, b[1], th, b[0], ts, b[2], b[3], b[4], b[5], key[1])
            return True

        flows = sorted(self.flows, key=lambda r: (r[2], r[7]))
        i = 0
        while i < len(flows):
            j = i + 1
            while j < len(flows) and flows[j][2] == flows[i][2]:
                j += 1
            # events of one timestamp, in whatever order the file has them: steps and finishes of flows
            # begun earlier first, then the starts, then steps and finishes of the flows that start here
            later = []
            for key, ph, ts, th, _name, _cat, _args, _order, _bp in flows[i:j]:
                if ph != "s" and not (key in open_f and open_f[key][0] < ts and step_or_finish(key, ph, ts, th)):
                    later.append((key, ph, ts, th))
            for key, ph, ts, th, name, cat, args, _order, _bp in flows[i:j]:
                if ph == "s":
                    open_f[key] = [ts, th, name, cat, args, []]
            for key, ph, ts, th in later:
                if not step_or_finish(key, ph, ts, th):
                    unmatched += 1
            i = j
        unmatched += len(open_f)
        # flow v2: slices bound by id, flow_out on the source, flow_in on the destination
        if self.sl_bind:
            outs: dict[tuple, tuple] = {}
            for th, name, key, fin, fout, ts in sorted(self.sl_bind, key=lambda r: r[5]):
                if fin and key in outs:
                    name0, th0, t0 = outs.pop(key)
                    self._transfer_row(rows, th0, th, t0, ts, self.names.values[name0], key[0], None, [], key[1])
                if fout:
                    outs[key] = (name, th, ts)
            unmatched += len(outs)
        if unmatched:
            self.sink.warn(f"{unmatched} flow events have no matching start or finish: ignored")
        if rows["src"]:
            self.sink.add("transfers", {
                "kind": rows["kind"], "src_resource_id": self._rids(np.asarray(rows["src"])),
                "dst_resource_id": self._rids(np.asarray(rows["dst"])), "nbytes": rows["nbytes"],
                "start_ns": _us_to_ns(rows["t0"]) + self.origin_ns, "end_ns": _us_to_ns(rows["t1"]) + self.origin_ns,
                "keys": rows["keys"], "attrs": rows["attrs"]})

    def _transfer_row(self, rows: dict, src: int, dst: int, t0: float, t1: float, name: str, cat: Any,
                      args: Any, steps: list, ident: str) -> None:
        fs = args.get("flowscope") if isinstance(args, dict) else None
        rows["src"].append(src)
        rows["dst"].append(dst)
        rows["t0"].append(t0)
        rows["t1"].append(t1)
        if isinstance(fs, dict):
            rows["kind"].append(fs.get("kind") or "flow")
            rows["nbytes"].append(fs.get("nbytes"))
            rows["keys"].append(fs.get("keys"))
            rows["attrs"].append(_marked_attrs(args, fs))
            return
        a: dict[str, Any] = {"name": name, "flow_id": ident}
        if cat is not None:
            a["cat"] = cat
        if steps:
            a["steps"] = steps
        if args:
            a["args"] = args
        rows["kind"].append("flow")
        rows["nbytes"].append(None)
        rows["keys"].append(None)
        rows["attrs"].append(_args_json(a))

    # ---- resources -------------------------------------------------------------------------
    def _resources(self) -> None:
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        if hasattr(self, "_thread_span_times"):
            thread, start, end = self._thread_span_times
            if len(thread):
                order = np.argsort(thread, kind="stable")
                th_sorted = thread[order]
                cuts = np.flatnonzero(np.diff(th_sorted)) + 1
                starts = np.minimum.reduceat(start[order], np.r_[0, cuts])
                ends = np.maximum.reduceat(end[order], np.r_[0, cuts])
                for th, s, e in zip(th_sorted[np.r_[0, cuts]].tolist(), starts.tolist(), ends.tolist()):
                    first[th], last[th] = s + self.origin_ns, e + self.origin_ns
        rows: dict[str, dict] = {}
        for code, (pid, tid) in enumerate(self.threads.values):
            for key in ((pid, None), (pid, tid)) if tid is not None else ((pid, None),):
                rid = self.resource_id(key)
                row = rows.get(rid)
                if row is None:
                    m = self.marked.get(key)
                    is_thread = key[1] is not None
                    attrs = {"trace_pid": pid} if not is_thread else {"trace_pid": pid, "trace_tid": tid}
                    if key in self.sort_index:
                        attrs["sort_index"] = self.sort_index[key]
                    row = rows[rid] = {
                        "resource_id": rid,
                        "kind": (m or {}).get("kind") or ("thread" if is_thread else "process"),
                        "name": (m or {}).get("name") or (self.thread_names.get(key) if is_thread
                                                          else self.proc_names.get(pid)) or
                                (f"{pid}:{tid}" if is_thread else str(pid)),
                        "parent_id": (m or {}).get("parent_id") if m else
                                     (self.process_rid(pid) if is_thread else None),
                        "host": (m or {}).get("host"),
                        "pid": pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                        "tid": tid if is_thread and isinstance(tid, int) and not isinstance(tid, bool) else None,
                        "address": (m or {}).get("address"),
                        "start_ns": None, "end_ns": None,
                        "attrs": (m or {}).get("attrs") if m else _args_json(attrs)}
                if code in first and (key[1] is not None or tid is None or True):
                    s, e = first[code], last[code]
                    row["start_ns"] = s if row["start_ns"] is None else min(row["start_ns"], s)
                    row["end_ns"] = e if row["end_ns"] is None else max(row["end_ns"], e)
        if rows:
            self.sink.add("resources", list(rows.values()))


def _open(path: Path) -> tuple[BinaryIO, BinaryIO, str]:
    raw = open(path, "rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw, " of the decompressed content"
    raw.seek(0)
    return raw, raw, ""


def read(path: Path, sink: ImportSink) -> None:
    """Import one Chrome trace-event JSON file (object or array form, plain or gzip) into ``sink``."""
    path = Path(path)
    stream, raw, note = _open(path)
    r = None
    # millions of short-lived acyclic dicts would each time trigger the cycle collector, which then
    # scans everything alive: it took three quarters of the parse time
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        ev = _Events(path, stream, note)
        r = _Reader(path, sink)
        n = 0
        origin_checked = False
        for e in ev:
            if not origin_checked:
                origin_checked = True
                r.set_origin(ev.meta)
            r.event(e, ev)
            n += 1
            if n % 65536 == 0:
                sink.advance(raw.tell())
        r.finish(ev)
    finally:
        if gc_was_enabled:
            gc.enable()
        if r is not None:
            r.xs.close()
        stream.close()
        raw.close()
