"""The vectorised path of the Paje importer: the line simulator's semantics, with array operations.

The body is read in chunks of :data:`CHUNK_BYTES`. Each chunk's whitespace is normalised (tabs and
runs of blanks between fields become one space, lines are stripped; line numbers stay), its lines
are grouped by event id and each group is parsed by Arrow's CSV reader with the columns its
``%EventDef`` declares. The few structural events (definitions, container creation and destruction)
go through the line simulator (:class:`flowscope.importers.paje._Reader`) in their place; states,
variables, events and links are simulated per (container, type) with array operations:

* states: a PajeSetState is a reset followed by a push; pushes are matched to pops after a sort by
  (stack, depth, order), a reset ends every state open in its stack; states still open at the end
  of a chunk carry over to the next;
* variables: PajeAddVariable / PajeSubVariable add up in file order from the last PajeSetVariable
  (a sequential sum per run, so values are the line simulator's to the last bit); changes at one
  time collapse into the last;
* links: the halves of one (container, type, key) pair up in order; a key used again after its link
  completed is warned about as the line simulator does (completed keys are remembered as 64-bit
  hashes: 8 bytes per link).

A trace that is not time-ordered (StarPU's) is detected as in the line simulator and read again in
sorted mode: every chunk's events are parsed, sorted by (time, order) and written as a run (Arrow
IPC in a temporary folder); the runs are merged (at most :data:`FAN_IN` at a time) in blocks and the
merged events simulated, so memory stays bounded whatever the trace's size. Includes
(``PajeTraceFile``) are read in place. Whatever is not of this shape -- ``%`` lines after the
header, unusual whitespace (form feeds, Unicode spaces), tabs or double blanks inside a quoted
field, a quote inside a token, an event id longer than 4 bytes, a use of a type or value before its
definition, of a container outside its lifetime, a redefined value alias, extra fields named like
the importer's own attributes -- and any invalid input raises :class:`Fallback`: the caller then
reads the file with the line simulator, which reports errors with file:line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv, ipc

from flowscope.importers import TraceError
from flowscope.importers.paje_format import (
    FLOWSCOPE_MARK,
    LANE,
    TIME_LIMIT,
    Unordered,
    split_fields,
)

#: bytes of trace text parsed per step
CHUNK_BYTES = 8 << 20
#: rows per batch of a sorted run
RUN_BATCH = 1 << 14
#: rows (about) per merged block simulated at once in sorted mode
MERGE_ROWS = 1 << 18
#: runs merged at once (more are merged in rounds), so the merge's memory does not grow with the trace
FAN_IN = 12
DEFINE = {"PajeDefineContainerType", "PajeDefineStateType", "PajeDefineEventType", "PajeDefineVariableType",
          "PajeDefineLinkType", "PajeDefineEntityValue"}
CONTAINER = {"PajeCreateContainer", "PajeDestroyContainer"}
STATE_OPS = {"PajePushState": 0, "PajePopState": 1, "PajeSetState": 2, "PajeResetState": 3}
VAR_OPS = {"PajeSetVariable": 0, "PajeAddVariable": 1, "PajeSubVariable": 2}
_PARSE = csv.ParseOptions(delimiter=" ", quote_char='"', double_quote=False, escape_char=False,
                          newlines_in_values=False, ignore_empty_lines=False)
_ODD_WS = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x1f")
_UNICODE_WS = re.compile(rb"\xc2[\x85\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]|\xe2\x81\x9f|\xe3\x80\x80")
_BLANKS = re.compile(rb"  +")
_QUOTED = re.compile(rb'"[^"\n]*"')
_TAB_CR = bytes.maketrans(b"\t\r", b"  ")
_PUSH, _POP, _RESET = 1, -1, 0
_LEVEL_BITS = 10

S = pa.string()
STATE_SCHEMA = pa.schema([("seq", pa.int64()), ("line", pa.int64()), ("file", pa.int32()), ("t", pa.float64()),
                          ("op", pa.int8()), ("cont", S), ("ty", S), ("value", S), ("task_key", S), ("extras", S)])
VAR_SCHEMA = pa.schema([("seq", pa.int64()), ("line", pa.int64()), ("file", pa.int32()), ("t", pa.float64()),
                        ("op", pa.int8()), ("cont", S), ("ty", S), ("num", pa.float64())])
EVENT_SCHEMA = pa.schema([("seq", pa.int64()), ("line", pa.int64()), ("file", pa.int32()), ("t", pa.float64()),
                          ("cont", S), ("ty", S), ("value", S), ("extras", S)])
LINK_SCHEMA = pa.schema([("seq", pa.int64()), ("line", pa.int64()), ("file", pa.int32()), ("t", pa.float64()),
                         ("start", pa.bool_()), ("cont", S), ("ty", S), ("value", S), ("ep", S), ("key", S),
                         ("xdef", pa.int32()), ("xvals", pa.list_(S))])
SMALL_SCHEMA = pa.schema([("seq", pa.int64()), ("line", pa.int64()), ("file", pa.int32()), ("t", pa.float64()),
                          ("raw", S)])
SCHEMAS = {"states": STATE_SCHEMA, "variables": VAR_SCHEMA, "events": EVENT_SCHEMA, "links": LINK_SCHEMA,
           "small": SMALL_SCHEMA}


class Fallback(Exception):
    """This trace (or this chunk of it) is not of the shape the vectorised path reads."""


class _Notes:
    """Holds the warnings of the vectorised pass until it has succeeded."""

    def __init__(self, sink: Any):
        self.sink = sink
        self.warnings: list[str] = []

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def advance(self, n: int) -> None:
        self.sink.advance(n)


def _ns(reader: Any, t: np.ndarray) -> np.ndarray:
    if not np.all(np.abs(reader.origin_ns + t * 1e9) < TIME_LIMIT):
        raise Fallback("a time out of range")
    if reader.unit_ns is None:
        reader._decide_unit()
    return reader.origin_ns + np.rint(t * reader.unit_ns).astype(np.int64)


def _jstr(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``json.dumps`` of every string of ``a`` (nulls stay null)."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if len(a) == 0:
        return pa.array([], S)
    data = a.buffers()[2]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    if np.any((raw < 0x20) | (raw > 0x7E) | (raw == 0x22) | (raw == 0x5C)):
        enc = pc.dictionary_encode(a)
        return pa.array([json.dumps(v) for v in enc.dictionary.to_pylist()], S).take(enc.indices)
    return pc.binary_join_element_wise('"', a, '"', "")


def _fragment(names: list[str], cols: list[pa.Array]) -> pa.Array | None:
    """The JSON members ``, "name": "value"`` of extra fields, one string per row (None without fields)."""
    if not names:
        return None
    parts: list[Any] = []
    for name, col in zip(names, cols):
        parts += [", " + json.dumps(name) + ": ", _jstr(col)]
    return pc.binary_join_element_wise(*parts, "")


def _hash64(a: pa.Array) -> np.ndarray:
    """A 64-bit polynomial hash of every string of ``a`` (no nulls)."""
    a = a.cast(pa.large_string()) if a.type != pa.large_string() else a
    n = len(a)
    off = np.frombuffer(a.buffers()[1], np.int64)[a.offset:a.offset + n + 1]
    data = np.frombuffer(a.buffers()[2], np.uint8) if a.buffers()[2] is not None else np.zeros(0, np.uint8)
    lens = np.diff(off)
    h = np.full(n, 1469598103934665603, np.uint64) ^ lens.astype(np.uint64)
    if lens.sum() == 0:
        return h
    idx = np.repeat(off[:-1], lens) + (np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens))
    pos = idx - np.repeat(off[:-1], lens)
    mult = np.uint64(1099511628211)
    powers = np.ones(int(lens.max()) + 1, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(1, len(powers)):
            powers[k] = powers[k - 1] * mult
        contrib = (data[idx].astype(np.uint64) + np.uint64(1)) * powers[pos]
    seg = np.repeat(np.arange(n), lens)
    acc = np.zeros(n, np.uint64)
    np.add.at(acc, seg, contrib)
    with np.errstate(over="ignore"):
        return h * mult + acc


def _seg_accumulate(vals: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Running sums restarting where ``start`` is true, each added in order (``out[i] = out[i-1] + vals[i]``:
    the line simulator's float arithmetic, bit for bit)."""
    n = len(vals)
    out = vals.copy()
    if n == 0:
        return out
    s = np.flatnonzero(start)
    lens = np.diff(np.append(s, n))
    long_ = lens > 1
    if not long_.any():
        return out
    s, lens = s[long_], lens[long_]
    width = 1 << np.ceil(np.log2(lens)).astype(np.int64)
    for w in np.unique(width).tolist():
        m = width == w
        ss, ll = s[m], lens[m]
        rows = np.repeat(np.arange(len(ss)), ll)
        cols = np.arange(int(ll.sum())) - np.repeat(np.cumsum(ll) - ll, ll)
        src = np.repeat(ss, ll) + cols
        mat = np.zeros((len(ss), w))
        mat[rows, cols] = vals[src]
        np.add.accumulate(mat, axis=1, out=mat)
        out[src] = mat[rows, cols]
    return out


@dataclass
class _Block:
    """Event lines of one piece of one file, normalised: ``text[index[i]]`` is line ``line[i]`` (with its newline)."""

    text: pa.StringArray
    index: np.ndarray
    line: np.ndarray
    seq: np.ndarray
    code: np.ndarray
    file: int


def normalise(buf: bytes) -> bytes:
    """``buf`` (whole lines) with one space between fields and no leading or trailing blanks; the same lines.

    Raises Fallback where that would change a field (blanks inside quotes) or where the line
    simulator's notion of whitespace (Python's ``str.split``) is wider than tab, CR and space."""
    if any(c in buf for c in _ODD_WS) or (not buf.isascii() and _UNICODE_WS.search(buf)):
        raise Fallback("unusual whitespace")
    tabs = b"\t" in buf or b"\r" in buf
    blanks = b"  " in buf
    if (tabs or blanks) and b'"' in buf:
        # quoted fields (paired left to right within a line, as the line simulator's tokenizer does) keep
        # their blanks as they are: refuse to touch one that has tabs or runs of blanks
        inside = b"".join(_QUOTED.findall(buf))
        if b"\t" in inside or b"\r" in inside or b"  " in inside:
            raise Fallback("blanks inside a quoted field")
    if tabs:
        buf = buf.translate(_TAB_CR)
    if blanks or tabs:
        buf = _BLANKS.sub(b" ", buf)
    if b" \n" in buf:
        buf = buf.replace(b" \n", b"\n")
    if b"\n " in buf:
        buf = buf.replace(b"\n ", b"\n")
    if buf[:1] == b" ":
        buf = buf[1:]
    return buf


class FastReader:
    """Reads one trace with the vectorised path into ``reader``'s spool."""

    def __init__(self, reader: Any, sorted_mode: bool, unordered: Any = None):
        self.r = reader
        self.sorted_mode = sorted_mode
        self.unordered = unordered
        self.files: list[str] = [str(reader.path)]
        self.include_stack: list[str] = []
        self.seq = 0
        self.pos_base = 0
        self.cont_index: dict[int, int] = {}  # id(Container) -> index in the arrays below
        self.conts: list[Any] = []
        self.created: list[int] = []
        self.destroyed: list[float] = []
        self.type_pos: dict[str, int] = {}
        self.alias_pos: dict[tuple[str, str], int] = {}
        self.groups: dict[tuple[int, str], int] = {}
        self.group_cont: list[int] = []
        self.group_type: list[Any] = []
        self.carry: dict[str, Any] | None = None
        self.var_carry: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.link_carry: pa.Table | None = None
        self.link_done = np.zeros(0, np.uint64)
        self.defs: dict[int, Any] = {}
        self.deflist: list[Any] = []
        self.tmp = reader.spool.tmpdir

    # ---- definitions --------------------------------------------------------------------------
    def _index_defs(self) -> None:
        self.defs = {}
        self.deflist = []
        for ident, d in self.r.defs.items():
            b = ident.encode()
            if not 0 < len(b) <= 4 or b"\n" in b or b" " in b:
                raise Fallback(f"event id {ident!r}")
            d.fast_index = len(self.deflist)  # type: ignore[attr-defined]
            self.deflist.append(d)
            self.defs[int.from_bytes(b, "little")] = d

    # ---- containers and types -----------------------------------------------------------------
    def _cidx(self, c: Any) -> int:
        i = self.cont_index.get(id(c))
        if i is None:
            i = self.cont_index[id(c)] = len(self.conts)
            self.conts.append(c)
            self.created.append(-1)
            self.destroyed.append(np.inf)
        return i

    def containers(self, col: pa.ChunkedArray | pa.Array, pos: np.ndarray) -> np.ndarray:
        """Index of each row's container; Fallback when one is unknown or used outside its lifetime."""
        enc = pc.dictionary_encode(col)
        if isinstance(enc, pa.ChunkedArray):
            enc = enc.combine_chunks()
        idx = enc.indices.to_numpy(zero_copy_only=False)
        lut = np.empty(len(enc.dictionary), np.int64)
        for k, name in enumerate(enc.dictionary.to_pylist()):
            c = self.r.containers.get(name) or self.r.container_names.get(name)
            if c is None:
                raise Fallback(f"unknown container {name!r}")
            lut[k] = self._cidx(c)
        ci = lut[idx]
        if np.any(pos <= np.asarray(self.created, np.int64)[ci]) or \
                np.any(pos >= np.asarray(self.destroyed, np.float64)[ci]):
            raise Fallback("a container used before its creation or after its destruction")
        return ci

    def types(self, col: pa.ChunkedArray | pa.Array, kind: str, pos: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        enc = pc.dictionary_encode(col)
        if isinstance(enc, pa.ChunkedArray):
            enc = enc.combine_chunks()
        idx = enc.indices.to_numpy(zero_copy_only=False)
        tys = []
        late = np.full(len(enc.dictionary), -1, np.int64)
        for k, name in enumerate(enc.dictionary.to_pylist()):
            t = self.r.types.get(name) or self.r.type_names.get(name)
            if t is None or t.kind != kind:
                raise Fallback(f"bad type {name!r}")
            tys.append(t)
            late[k] = self.type_pos.get(t.ident, -1)
        if np.any(pos <= late[idx]):
            raise Fallback("a type used before its definition")
        return idx, tys

    def group_ids(self, ci: np.ndarray, ti: np.ndarray, tys: list[Any]) -> np.ndarray:
        m = max(1, len(tys))
        uniq, inv = np.unique(ci * m + ti, return_inverse=True)
        lut = np.empty(len(uniq), np.int64)
        for k, p in enumerate(uniq.tolist()):
            c, t = divmod(p, m)
            key = (c, tys[t].ident)
            g = self.groups.get(key)
            if g is None:
                g = self.groups[key] = len(self.group_cont)
                self.group_cont.append(c)
                self.group_type.append(tys[t])
            lut[k] = g
        return lut[inv.reshape(-1)]

    def values(self, col: pa.ChunkedArray | pa.Array, ti: np.ndarray, tys: list[Any], pos: np.ndarray) -> pa.Array:
        """Each row's value through its type's aliases (PajeDefineEntityValue), as when the row is read."""
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if not any(t.values for t in tys) or len(col) == 0:
            return col
        enc = pc.dictionary_encode(col)
        di = enc.indices.to_numpy(zero_copy_only=False)
        nd = max(1, len(enc.dictionary))
        uniq, inv = np.unique(ti * nd + np.where(enc.indices.is_null().to_numpy(zero_copy_only=False), 0, di),
                              return_inverse=True)
        inv = inv.reshape(-1)
        first = np.full(len(uniq), np.iinfo(np.int64).max)
        np.minimum.at(first, inv, pos)
        words = enc.dictionary.to_pylist()
        out = []
        for k, p in enumerate(uniq.tolist()):
            t, j = divmod(p, nd)
            ty = tys[t]
            v = words[j] if words else None
            if v is not None and self.alias_pos.get((ty.ident, v), -1) >= first[k]:
                raise Fallback("a value used before its alias is defined")
            out.append(ty.values.get(v, v) if v is not None else None)
        mapped = pa.array(out, S).take(pa.array(inv))
        return pc.if_else(pc.is_null(col), pa.nulls(len(col), S), mapped)

    # ---- reading ------------------------------------------------------------------------------
    def blocks(self, path: Path, where: str | None, f: Any = None, line0: int = 0, pos0: int = 0):
        """Normalised event lines of ``path`` (from the open ``f`` at ``line0``/``pos0`` for the top file),
        with PajeTraceFile includes read in place."""
        key = str(path.resolve())
        if key in self.include_stack:
            self.r.sink.warn(f"{where}: PajeTraceFile includes {path.name}, which is already being read "
                             f"(a cycle); not read again")
            return
        if f is None and not path.is_file():
            raise Fallback("missing include")
        self.include_stack.append(key)
        top = len(self.include_stack) == 1
        own = f is None
        if own:
            self.files.append(str(path))
        fid = 0 if top else len(self.files) - 1
        with contextlib.ExitStack() as stack:
            fh = stack.enter_context(open(path, "rb")) if own else f
            try:
                yield from self._read_chunks(fh, own, top, line0, pos0, fid, path)
            finally:
                self.include_stack.pop()

    def _read_chunks(self, fh: Any, own: bool, top: bool, line0: int, pos0: int, fid: int, path: Path):
        if own:
            fh.seek(pos0)
        line = line0
        done = pos0
        rest = b""
        while True:
            data = fh.read(CHUNK_BYTES)
            buf = rest + data
            if not data:
                if buf:
                    yield from self._pieces(buf + b"\n", line, fid, path)
                break
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                rest = buf
                continue
            piece = buf[:cut]
            rest = buf[cut:]
            n = piece.count(b"\n")
            yield from self._pieces(piece, line, fid, path)
            line += n
            done += len(data)
            if top:
                self.r.sink.advance(done)

    def _pieces(self, buf: bytes, line0: int, fid: int, path: Path):
        buf = normalise(buf)
        arr = np.frombuffer(buf, np.uint8)
        nl = np.flatnonzero(arr == 10)
        n = len(nl)
        if n == 0:
            return
        starts = np.empty(n, np.int64)
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
        first = arr[starts]
        lines = line0 + 1 + np.arange(n, dtype=np.int64)
        if len(buf) >= (1 << 31):
            raise Fallback("chunk too large")
        text = pa.StringArray.from_buffers(n, pa.py_buffer(np.append(starts, len(buf)).astype(np.int32)),
                                           pa.py_buffer(buf))
        if np.any(first == 37):
            raise Fallback("a % line after the header")
        if np.any(first == 35) and b"flowscope paje export" in buf:
            raise Fallback("a flowscope mark in the body")
        ev = np.flatnonzero((first != 10) & (first != 35))
        starts, lines = starts[ev], lines[ev]
        if len(starts) == 0:
            return
        q = np.flatnonzero(arr == 34)
        if len(q):
            qline = np.searchsorted(nl, q)
            keep = np.zeros(n, bool)
            keep[ev] = True
            q = q[keep[qline]]
            if len(q):
                if len(q) % 2 or np.any(np.bincount(np.searchsorted(nl, q)) % 2):
                    raise Fallback("odd quotes")
                op, cl = q[0::2], q[1::2]
                if np.any(arr[op - 1] != 32) or np.any((arr[cl + 1] != 32) & (arr[cl + 1] != 10)):
                    raise Fallback("quote inside a token")
        # the event id: up to 4 bytes before the first space (or the newline)
        code = np.zeros(len(starts), np.int64)
        live = np.ones(len(starts), bool)
        for k in range(5):
            ch = arr[np.minimum(starts + k, len(arr) - 1)].astype(np.int64)
            live &= (ch != 32) & (ch != 10)
            if k == 4:
                if live.any():
                    raise Fallback("long event id")
                break
            code |= np.where(live, ch << (8 * k), 0)
        inc = [c for c, d in self.defs.items() if d.kind == "PajeTraceFile"]
        cut = np.flatnonzero(np.isin(code, inc)) if inc else np.zeros(0, np.int64)
        lo = 0
        for i in cut.tolist() + [len(starts)]:
            if i > lo:
                m = i - lo
                yield _Block(text, ev[lo:i], lines[lo:i], self.seq + np.arange(m, dtype=np.int64), code[lo:i], fid)
                self.seq += m
            if i == len(starts):
                break
            s = bytes(arr[starts[i]:nl[ev[i]]]).decode("utf-8", "replace")
            where = f"{path}:{int(lines[i])}"
            try:
                toks = split_fields(s, where)
            except TraceError:
                raise Fallback("include line") from None
            d = self.defs[int(code[i])]
            if len(toks) != len(d.names):
                raise Fallback("include fields")
            self.seq += 1
            target = Path(toks[d.index["Filename"]])
            if not target.is_absolute():
                target = path.parent / target
            yield from self.blocks(target, where)
            lo = i + 1

    # ---- parsing ------------------------------------------------------------------------------
    @staticmethod
    def _lines(b: _Block, sel: np.ndarray) -> pa.StringArray:
        return b.text.take(pa.array(b.index[sel]))

    def _csv(self, b: _Block, sel: np.ndarray, d: Any, numeric: set[str],
             lines: pa.StringArray | None = None) -> pa.Table:
        lines = self._lines(b, sel) if lines is None else lines
        off = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset:lines.offset + len(lines) + 1]
        data = pa.py_buffer(lines.buffers()[2])[int(off[0]):int(off[-1])]
        names = [f"c{i}" for i in range(len(d.names))]
        ctypes = {f"c{i}": (pa.float64() if name in numeric else S) for i, name in enumerate(d.names)}
        try:
            return csv.read_csv(pa.BufferReader(data),
                                read_options=csv.ReadOptions(column_names=names, block_size=1 << 26,
                                                             use_threads=False),
                                parse_options=_PARSE,
                                convert_options=csv.ConvertOptions(column_types=ctypes, strings_can_be_null=False,
                                                                   quoted_strings_can_be_null=False,
                                                                   null_values=[]))
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            raise Fallback(f"csv: {exc}") from None

    def parse(self, b: _Block) -> dict[str, list[pa.Table]]:
        """The block's events as tables per kind (see SCHEMAS), each in reading order."""
        out: dict[str, list[pa.Table]] = {}
        for c in np.unique(b.code).tolist():
            d = self.defs.get(c)
            if d is None:
                raise Fallback("unknown event id")
            sel = np.flatnonzero(b.code == c)
            k = d.kind
            base = {"seq": pa.array(b.seq[sel]), "line": pa.array(b.line[sel]),
                    "file": pa.array(np.full(len(sel), b.file, np.int32))}
            if k in DEFINE or k in CONTAINER:
                lines = self._lines(b, sel)
                raw = pc.utf8_rtrim(lines, "\n")
                if d.time_index >= 0:
                    tab = self._csv(b, sel, d, set(), lines)
                    try:
                        t = pc.cast(tab.column(d.time_index), pa.float64())
                    except (pa.ArrowInvalid, ValueError):
                        raise Fallback("time") from None
                else:
                    t = pa.nulls(len(sel), pa.float64())
                out.setdefault("small", []).append(pa.table({**base, "t": t, "raw": raw}, schema=SMALL_SCHEMA))
                continue
            if k == "PajeTraceFile":
                raise Fallback("include")
            ix = d.index
            if k in VAR_OPS:
                if d.extras:
                    raise Fallback("extra fields on a variable")
                tab = self._csv(b, sel, d, {"Time", "Value"})
                out.setdefault("variables", []).append(pa.table({
                    **base, "t": tab.column(ix["Time"]), "op": pa.array(np.full(len(sel), VAR_OPS[k], np.int8)),
                    "cont": tab.column(ix["Container"]), "ty": tab.column(ix["Type"]),
                    "num": tab.column(ix["Value"])}, schema=VAR_SCHEMA))
                continue
            tab = self._csv(b, sel, d, {"Time"})
            n = len(sel)
            extra = [(name, i) for name, i in d.extras]
            if k in STATE_OPS:
                xs = [(name, i) for name, i in extra if name != "TaskKey"]
                if any(name in ("paje_type", "depth") for name, _ in xs):
                    raise Fallback("an extra field named like an attribute")
                tk = [i for name, i in extra if name == "TaskKey"]
                frag = _fragment([x for x, _ in xs], [tab.column(i) for _, i in xs])
                out.setdefault("states", []).append(pa.table({
                    **base, "t": tab.column(ix["Time"]), "op": pa.array(np.full(n, STATE_OPS[k], np.int8)),
                    "cont": tab.column(ix["Container"]), "ty": tab.column(ix["Type"]),
                    "value": tab.column(ix["Value"]) if "Value" in ix else pa.nulls(n, S),
                    "task_key": tab.column(tk[0]) if tk else pa.nulls(n, S),
                    "extras": frag if frag is not None else pa.nulls(n, S)}, schema=STATE_SCHEMA))
            elif k == "PajeNewEvent":
                if any(name == "paje_type" for name, _ in extra):
                    raise Fallback("an extra field named like an attribute")
                frag = _fragment([x for x, _ in extra], [tab.column(i) for _, i in extra])
                out.setdefault("events", []).append(pa.table({
                    **base, "t": tab.column(ix["Time"]), "cont": tab.column(ix["Container"]),
                    "ty": tab.column(ix["Type"]), "value": tab.column(ix["Value"]),
                    "extras": frag if frag is not None else pa.nulls(n, S)}, schema=EVENT_SCHEMA))
            elif k in ("PajeStartLink", "PajeEndLink"):
                if any(name in ("paje_type", "value", "key", "container") for name, _ in extra):
                    raise Fallback("an extra field named like an attribute")
                start = k == "PajeStartLink"
                if extra:
                    flat = pa.concat_arrays([tab.column(i).combine_chunks() for _, i in extra])
                    order = np.arange(n * len(extra)).reshape(len(extra), n).T.reshape(-1)
                    xvals = pa.ListArray.from_arrays(pa.array(np.arange(0, n * len(extra) + 1, len(extra),
                                                                        dtype=np.int32)), flat.take(pa.array(order)))
                else:
                    xvals = pa.nulls(n, pa.list_(S))
                out.setdefault("links", []).append(pa.table({
                    **base, "t": tab.column(ix["Time"]), "start": pa.array(np.full(n, start)),
                    "cont": tab.column(ix["Container"]), "ty": tab.column(ix["Type"]),
                    "value": tab.column(ix["Value"]),
                    "ep": tab.column(ix["StartContainer" if start else "EndContainer"]), "key": tab.column(ix["Key"]),
                    "xdef": pa.array(np.full(n, d.fast_index, np.int32)), "xvals": xvals}, schema=LINK_SCHEMA))
            else:
                raise Fallback(f"event {k}")
        return out

    # ---- the passes ---------------------------------------------------------------------------
    def run(self, f: Any, line0: int, pos0: int) -> None:
        """Read the body from the open binary file ``f`` (positioned after the header)."""
        self._index_defs()
        if self.sorted_mode:
            self._run_sorted(f, line0, pos0)
        else:
            for b in self.blocks(Path(self.r.path), None, f, line0, pos0):
                ev = {k: _concat(v, SCHEMAS[k]) for k, v in self.parse(b).items()}
                self._check_order(ev)
                self.simulate({k: t.append_column("pos", t.column("seq")) for k, t in ev.items()})
        self.finish()

    def _check_order(self, ev: dict[str, pa.Table]) -> None:
        """The line simulator's test: a timed event earlier than the one before it (in reading order)."""
        parts = [(t.column("seq").to_numpy(), t.column("t").to_numpy(), t.column("line").to_numpy(),
                  t.column("file").to_numpy()) for t in ev.values()]
        seq = np.concatenate([p[0] for p in parts])
        t = np.concatenate([p[1] for p in parts])
        timed = ~np.isnan(t)
        o = np.argsort(seq[timed], kind="stable")
        tt = t[timed][o]
        if not len(tt):
            return
        prev = np.concatenate([[self.r.last_t], tt[:-1]])
        bad = np.flatnonzero(tt < prev)
        if len(bad):
            i = int(bad[0])
            ln = np.concatenate([p[2] for p in parts])[timed][o][i]
            fi = np.concatenate([p[3] for p in parts])[timed][o][i]
            raise Unordered(f"{self.files[int(fi)]}:{int(ln)}", float(tt[i]), float(prev[i]))
        self.r.last_t = float(tt[-1])

    def _run_sorted(self, f: Any, line0: int, pos0: int) -> None:
        """Sorted mode: definitions as they come, timed events through an external sort by (time, order)."""
        if self.unordered is not None:
            exc = self.unordered
            self.r.sink.warn(f"{exc.where}: the trace is not time-ordered (time {exc.t!r} after {exc.prev!r}); it was "
                             f"imported after a stable sort of its events by time (pj_dump refuses traces whose "
                             f"events go back in time within a container and type)")
        runs: list[dict[str, str]] = []
        for b in self.blocks(Path(self.r.path), None, f, line0, pos0):
            ev = {k: _concat(v, SCHEMAS[k]) for k, v in self.parse(b).items()}
            small = ev.get("small")
            if small is not None:
                untimed = pc.is_null(small.column("t")).to_numpy(zero_copy_only=False)
                if untimed.any():
                    self._dispatch_small(small.filter(pa.array(untimed)), sorted_defs=True)
                    ev["small"] = small.filter(pa.array(~untimed))
            runs.append(self._write_run(ev, len(runs)))
        rnd = 0
        while len(runs) > FAN_IN:
            merged = []
            for i in range(0, len(runs), FAN_IN):
                group = runs[i:i + FAN_IN]
                if len(group) == 1:
                    merged.append(group[0])
                    continue
                writers = _RunWriter(self.tmp, f"m{rnd}-{i}")
                for ev in _merge(group):
                    writers.write(ev)
                merged.append(writers.close())
                _remove(group)
            runs = merged
            rnd += 1
        for ev in _merge(runs):
            # global positions: the merged order across kinds
            keys = [(k, t.column("t").to_numpy(), t.column("seq").to_numpy()) for k, t in ev.items()]
            tt = np.concatenate([x[1] for x in keys])
            ss = np.concatenate([x[2] for x in keys])
            o = np.lexsort((ss, tt))
            pos = np.empty(len(o), np.int64)
            pos[o] = self.pos_base + np.arange(len(o))
            self.pos_base += len(o)
            lo = 0
            for k, t, _ in keys:
                ev[k] = ev[k].append_column("pos", pa.array(pos[lo:lo + len(t)]))
                lo += len(t)
            if len(tt):
                self.r.last_t = float(tt[o[-1]])
            self.simulate(ev)
        _remove(runs)

    def _write_run(self, ev: dict[str, pa.Table], n: int) -> dict[str, str]:
        w = _RunWriter(self.tmp, f"r{n}")
        sorted_ev = {}
        for k, t in ev.items():
            if t.num_rows:
                o = np.lexsort((t.column("seq").to_numpy(), t.column("t").to_numpy()))
                sorted_ev[k] = t.take(pa.array(o))
        w.write(sorted_ev)
        return w.close()

    # ---- simulation ---------------------------------------------------------------------------
    def simulate(self, ev: dict[str, pa.Table]) -> None:
        r = self.r
        first_timed = min((int(t.column("pos")[0].as_py()) for k, t in ev.items() if k != "small" and t.num_rows),
                          default=None)
        small = ev.get("small")
        if small is not None and small.num_rows:
            self._dispatch_small(small, first_timed=first_timed)
        if first_timed is not None and r.unit_ns is None:
            r._decide_unit()
        for k, t in ev.items():
            if k != "small" and t.num_rows:
                tt = t.column("t").to_numpy()
                r.max_t = max(r.max_t, float(tt.max()))
                r.min_t = min(r.min_t, float(tt.min()))
        if "states" in ev:
            self._states(ev["states"])
        if "variables" in ev:
            self._variables(ev["variables"])
        if "events" in ev:
            self._events(ev["events"])
        if "links" in ev:
            self._links(ev["links"])

    def _dispatch_small(self, small: pa.Table, sorted_defs: bool = False, first_timed: int | None = None) -> None:
        """Definitions and container events, one by one through the line simulator, in their order."""
        r = self.r
        order = np.argsort(small.column("pos" if "pos" in small.column_names else "seq").to_numpy(), kind="stable")
        small = small.take(pa.array(order))
        raws = small.column("raw").to_pylist()
        lines = small.column("line").to_pylist()
        files = small.column("file").to_pylist()
        poss = small.column("pos").to_pylist() if "pos" in small.column_names else [-1] * len(raws)
        for s, ln, fi, pos in zip(raws, lines, files, poss):
            where = f"{self.files[fi]}:{ln}"
            if first_timed is not None and pos > first_timed and r.unit_ns is None:
                r._decide_unit()
            try:
                toks = split_fields(s, where)
                d = r.defs.get(toks[0])
                if d is None or len(toks) != len(d.names):
                    raise Fallback("fields")
                t = r._number(toks, d, d.time_index, where) if d.time_index >= 0 else 0.0
                k = d.kind
                if k == "PajeDefineEntityValue" and not sorted_defs:
                    ty = r.ptype(toks[d.index["Type"]], where, "Type")
                    before = dict(ty.values)
                    r.dispatch(d, toks, where, t)
                    for key, v in ty.values.items():
                        if key in before and before[key] != v:
                            raise Fallback("a value alias redefined")
                        if key not in before:
                            self.alias_pos[(ty.ident, key)] = pos
                    continue
                r.dispatch(d, toks, where, t)
            except TraceError as exc:
                raise Fallback(str(exc)) from None
            if k in DEFINE and k != "PajeDefineEntityValue" and not sorted_defs:
                ix = d.index
                self.type_pos[(toks[ix["Alias"]] if "Alias" in ix else "") or toks[ix["Name"]]] = pos
            elif k == "PajeCreateContainer":
                ix = d.index
                ident = (toks[ix["Alias"]] if "Alias" in ix else "") or toks[ix["Name"]]
                self.created[self._cidx(r.containers[ident])] = pos
            elif k == "PajeDestroyContainer":
                # the container and those below it (pj_dump destroys recursively): any later use falls back
                todo = [r.container(toks[d.index["Name"]], where, "Name")]
                while todo:
                    c = todo.pop()
                    todo.extend(c.children)
                    i = self._cidx(c)
                    self.destroyed[i] = min(self.destroyed[i], pos)

    # ---- states ---------------------------------------------------------------------------------
    def _states(self, st: pa.Table) -> None:
        r = self.r
        n = st.num_rows
        pos = st.column("pos").to_numpy()
        op = st.column("op").to_numpy()
        ci = self.containers(st.column("cont"), pos)
        ti, tys = self.types(st.column("ty"), "state", pos)
        g = self.group_ids(ci, ti, tys)
        ts = _ns(r, st.column("t").to_numpy())
        push_rows = np.flatnonzero((op == 0) | (op == 2))
        names = self.values(st.column("value").take(pa.array(push_rows)), ti[push_rows], tys, pos[push_rows])
        c = self.carry
        nc = len(c["g"]) if c is not None else 0
        npn = len(push_rows)
        new_ids = r.span_id + 1 + np.arange(npn, dtype=np.int64)
        r.span_id += npn
        # push entities: the carried ones, then this block's pushes in order
        p_g = np.concatenate([c["g"], g[push_rows]]) if nc else g[push_rows]
        p_start = np.concatenate([c["start"], ts[push_rows]]) if nc else ts[push_rows]
        p_id = np.concatenate([c["id"], new_ids]) if nc else new_ids
        p_name = pa.concat_arrays([c["name"], names]) if nc else names
        p_key = pa.concat_arrays([c["key"], st.column("task_key").take(pa.array(push_rows)).combine_chunks()]) \
            if nc else st.column("task_key").take(pa.array(push_rows)).combine_chunks()
        p_extra = pa.concat_arrays([c["extras"], st.column("extras").take(pa.array(push_rows)).combine_chunks()]) \
            if nc else st.column("extras").take(pa.array(push_rows)).combine_chunks()
        # events: carried pushes first (in their order), then per row a reset (set/reset) and a push or pop
        rows = np.arange(n, dtype=np.int64)
        rs = np.flatnonzero((op == 2) | (op == 3))
        pp = np.flatnonzero(op != 3)
        push_entity = np.full(n, -1, np.int64)
        push_entity[push_rows] = nc + np.arange(npn)
        e_key = np.concatenate([np.arange(nc, dtype=np.int64) - nc, 2 * rows[rs], 2 * rows[pp] + 1])
        e_g = np.concatenate([p_g[:nc], g[rs], g[pp]])
        e_kind = np.concatenate([np.full(nc, _PUSH), np.full(len(rs), _RESET),
                                 np.where(op[pp] == 1, _POP, _PUSH)]).astype(np.int64)
        e_ref = np.concatenate([np.arange(nc), rs, np.where(op[pp] == 1, pp, push_entity[pp])])
        e_t = np.concatenate([np.zeros(nc, np.int64), ts[rs], ts[pp]])
        o = np.lexsort((e_key, e_g))
        e_key, e_g, e_kind, e_ref, e_t = e_key[o], e_g[o], e_kind[o], e_ref[o], e_t[o]
        m = len(e_key)
        if m >= (1 << 26):
            raise Fallback("block too large")
        newgrp = np.empty(m, bool)
        newgrp[0] = True
        newgrp[1:] = e_g[1:] != e_g[:-1]
        newstack = newgrp | (e_kind == _RESET)
        s = np.cumsum(newstack) - 1
        cs = np.cumsum(e_kind)
        base = np.maximum.accumulate(np.where(newstack, np.arange(m), 0))
        depth = cs - (cs[base] - e_kind[base])
        if np.any(depth < 0):
            raise Fallback("pop of an empty stack")
        level = np.where(e_kind == _POP, depth + 1, depth)
        if level.max(initial=0) >= (1 << _LEVEL_BITS):
            raise Fallback("too deep")
        pe = np.flatnonzero(e_kind != _RESET)
        o2 = pe[np.lexsort((pe, level[pe], s[pe]))]
        is_push = e_kind[o2] == _PUSH
        same = np.zeros(len(o2), bool)
        same[:-1] = (s[o2][1:] == s[o2][:-1]) & (level[o2][1:] == level[o2][:-1])
        matched = is_push & same & np.append(~is_push[1:], False)
        mi = np.flatnonzero(matched)
        ent = e_ref[o2[mi]]
        end = e_t[o2[mi + 1]]
        closed = np.zeros(len(p_g), bool)
        closed[ent] = True
        # a reset ends what its stack's predecessor left open
        nstack = int(s[-1]) + 1
        stack_first = np.flatnonzero(newstack)
        stack_g = e_g[stack_first]
        next_reset_t = np.full(nstack, -1, np.int64)
        cont_next = np.zeros(nstack, bool)
        cont_next[:-1] = stack_g[1:] == stack_g[:-1]
        next_reset_t[:-1] = np.where(cont_next[:-1], e_t[stack_first[1:]], -1)
        push_ev = np.flatnonzero(e_kind == _PUSH)
        p_level = np.zeros(len(p_g), np.int64)
        p_level[e_ref[push_ev]] = level[push_ev]
        p_stack = np.zeros(len(p_g), np.int64)
        p_stack[e_ref[push_ev]] = s[push_ev]
        p_rank = np.zeros(len(p_g), np.int64)
        p_rank[e_ref[push_ev]] = push_ev
        open_ = ~closed
        by_reset = open_ & cont_next[p_stack]
        # parents: the push one level up in the same stack, the latest before it
        bits = max(1, int(m).bit_length())
        pkey = (((p_stack << _LEVEL_BITS) | p_level) << bits) | p_rank
        so = np.argsort(pkey)
        sk = pkey[so]
        want = (((p_stack << _LEVEL_BITS) | (p_level - 1)) << bits) | p_rank
        j = np.searchsorted(sk, want) - 1
        ok = (j >= 0) & (p_level > 1)
        jj = np.where(ok, j, 0)
        ok &= (sk[jj] >> bits) == ((p_stack << _LEVEL_BITS) | (p_level - 1))
        parent = np.where(ok, p_id[so[jj]], 0)
        if nc:
            parent[:nc] = c["parent"]
            ok[:nc] = c["ok"]
        ends = np.zeros(len(p_g), np.int64)
        ends[ent] = end
        ends[by_reset] = next_reset_t[p_stack[by_reset]]
        done = np.flatnonzero(closed | by_reset)
        self._emit(done, ends[done], p_g, p_id, parent, ok, p_start, p_name, p_key, p_extra, p_level)
        keep = np.flatnonzero(open_ & ~by_reset)
        ka = pa.array(keep)
        self.carry = {"g": p_g[keep], "start": p_start[keep], "id": p_id[keep], "parent": parent[keep],
                      "ok": ok[keep], "level": p_level[keep], "name": p_name.take(ka), "key": p_key.take(ka),
                      "extras": p_extra.take(ka)}

    def _emit(self, pi: np.ndarray, end: np.ndarray, p_g: np.ndarray, p_id: np.ndarray, parent: np.ndarray,
              ok: np.ndarray, p_start: np.ndarray, p_name: pa.Array, p_key: pa.Array, p_extra: pa.Array,
              p_level: np.ndarray) -> None:
        if not len(pi):
            return
        r = self.r
        g = p_g[pi]
        ga = pa.array(g)
        pia = pa.array(pi)
        rid = pa.array([self.conts[c].rid or None for c in self.group_cont], S)
        extras = p_extra.take(pia)
        if r.flowscope:
            kinds = pa.array([LANE.sub("", t.name) for t in self.group_type], S).take(ga)
            attrs = pc.if_else(pc.is_null(extras), pa.nulls(len(pi), S),
                               pc.binary_join_element_wise("{", pc.utf8_slice_codeunits(pc.fill_null(extras, ", "), 2),
                                                           "}", ""))
        else:
            kinds = pa.array(["state"] * len(pi), S)
            pre = pa.array(['{"paje_type": ' + json.dumps(t.name) + ', "depth": ' for t in self.group_type],
                           S).take(ga)
            attrs = pc.binary_join_element_wise(pre, pc.cast(pa.array(p_level[pi] - 1), S),
                                                pc.fill_null(extras, ""), "}", "")
        key = p_key.take(pia)
        key = pc.if_else(pc.equal(key, ""), pa.nulls(len(pi), S), key)
        t = pa.table({
            "span_id": p_id[pi], "parent_id": pa.array(parent[pi], mask=~ok[pi]), "resource_id": rid.take(ga),
            "kind": kinds, "name": p_name.take(pia), "start_ns": p_start[pi], "end_ns": end,
            "task_key": key, "attrs": attrs})
        r.n["states"] += len(pi)
        r.spool.table("spans", t)

    # ---- variables ------------------------------------------------------------------------------
    def _variables(self, vt: pa.Table) -> None:
        r = self.r
        pos = vt.column("pos").to_numpy()
        op = vt.column("op").to_numpy()
        ci = self.containers(vt.column("cont"), pos)
        ti, tys = self.types(vt.column("ty"), "variable", pos)
        g = self.group_ids(ci, ti, tys)
        ts = _ns(r, vt.column("t").to_numpy())
        v = vt.column("num").to_numpy()
        c = self.var_carry
        nc = len(c[0]) if c is not None else 0
        e_g = np.concatenate([c[0], g]) if nc else g
        e_ts = np.concatenate([c[1], ts]) if nc else ts
        e_v = np.concatenate([c[2], np.where(op == 2, -v, v)]) if nc else np.where(op == 2, -v, v)
        e_op = np.concatenate([np.zeros(nc, np.int8), op]) if nc else op
        e_key = np.concatenate([np.arange(nc) - nc, np.arange(len(g))]) if nc else np.arange(len(g))
        o = np.lexsort((e_key, e_g))
        e_g, e_ts, e_v, e_op = e_g[o], e_ts[o], e_v[o], e_op[o]
        m = len(e_g)
        first = np.empty(m, bool)
        first[0] = True
        first[1:] = e_g[1:] != e_g[:-1]
        if np.any(first & (e_op == 2)):
            raise Fallback("PajeSubVariable on a variable with no value")
        val = _seg_accumulate(e_v, first | (e_op == 0))
        last_g = np.empty(m, bool)
        last_g[-1] = True
        last_g[:-1] = e_g[1:] != e_g[:-1]
        last_run = last_g.copy()
        last_run[:-1] |= e_ts[1:] != e_ts[:-1]
        emit = np.flatnonzero(last_run & ~last_g)
        self._emit_variables(e_g[emit], e_ts[emit], val[emit])
        keep = np.flatnonzero(last_g)
        self.var_carry = (e_g[keep], e_ts[keep], val[keep])

    def _emit_variables(self, g: np.ndarray, ts: np.ndarray, v: np.ndarray) -> None:
        if not len(g):
            return
        r = self.r
        ns_, nm = [], []
        for ty in self.group_type:
            a, b = ("paje", ty.name)
            if r.flowscope and ":" in ty.name:
                a, b = ty.name.split(":", 1)
            ns_.append(a)
            nm.append(b)
        ga = pa.array(g)
        r.n["variables"] += len(g)
        r.spool.table("metrics", pa.table({
            "ts_ns": ts, "resource_id": pa.array([self.conts[c].rid or None for c in self.group_cont], S).take(ga),
            "namespace": pa.array(ns_, S).take(ga), "name": pa.array(nm, S).take(ga),
            "value": v.astype(np.float64)}))

    # ---- events ---------------------------------------------------------------------------------
    def _events(self, et: pa.Table) -> None:
        r = self.r
        pos = et.column("pos").to_numpy()
        ci = self.containers(et.column("cont"), pos)
        ti, tys = self.types(et.column("ty"), "event", pos)
        vals = self.values(et.column("value"), ti, tys, pos)
        ts = _ns(r, et.column("t").to_numpy())
        tia = pa.array(ti)
        rid = pa.array([c.rid or None for c in self.conts], S).take(pa.array(ci))
        pre = pa.array(['{"paje_type": ' + json.dumps(t.name) for t in tys], S).take(tia)
        attrs = pc.binary_join_element_wise(pre, pc.fill_null(et.column("extras").combine_chunks(), ""), "}", "")
        r.n["events"] += et.num_rows
        r.spool.table("logs", pa.table({
            "ts_ns": ts, "resource_id": rid, "level": pa.array(["info"] * et.num_rows, S),
            "category": pa.array([t.name for t in tys], S).take(tia), "message": vals, "attrs": attrs}))

    # ---- links ----------------------------------------------------------------------------------
    def _links(self, lt: pa.Table) -> None:
        r = self.r
        pos = lt.column("pos").to_numpy()
        ci = self.containers(lt.column("cont"), pos)
        ti, tys = self.types(lt.column("ty"), "link", pos)
        ep = self.containers(lt.column("ep"), pos)
        vals = self.values(lt.column("value"), ti, tys, pos)
        ts = _ns(r, lt.column("t").to_numpy())
        cident = pa.array([c.ident for c in self.conts], S).take(pa.array(ci))
        tident = pa.array([t.ident for t in tys], S).take(pa.array(ti))
        key = lt.column("key").combine_chunks()
        gk = pc.binary_join_element_wise(cident, tident, key, "\n")
        new = pa.table({"gk": gk, "pos": pa.array(pos), "line": lt.column("line"), "file": lt.column("file"),
                        "start": lt.column("start"), "c": pa.array(ci), "ty": tident, "ep": pa.array(ep),
                        "value": vals, "key": key, "ts": pa.array(ts), "xdef": lt.column("xdef"),
                        "xvals": lt.column("xvals"), "hash": pa.nulls(len(pos), pa.uint64())})
        halves = pa.concat_tables([self.link_carry, new]) if self.link_carry is not None else new
        enc = pc.dictionary_encode(halves.column("gk")).combine_chunks()
        grp = enc.indices.to_numpy(zero_copy_only=False)
        hpos = halves.column("pos").to_numpy()
        o = np.lexsort((hpos, grp))
        halves = halves.take(pa.array(o))
        grp, hpos = grp[o], hpos[o]
        m = len(grp)
        first = np.empty(m, bool)
        first[0] = True
        first[1:] = grp[1:] != grp[:-1]
        start_idx = np.maximum.accumulate(np.where(first, np.arange(m), 0))
        j = np.arange(m) - start_idx
        opens = np.flatnonzero(j % 2 == 0)
        closes = opens + 1
        paired = closes < m
        paired[paired] = grp[closes[paired]] == grp[opens[paired]]
        a, b = opens[paired], closes[paired]
        st = halves.column("start").to_numpy(zero_copy_only=False)
        if np.any(st[a] == st[b]):
            raise Fallback("a link half twice")
        # hashes of the keys that open here for the first time (the carried halves have theirs)
        hcol = halves.column("hash")
        unknown = pc.is_null(hcol).to_numpy(zero_copy_only=False)
        hashes = pc.fill_null(hcol, 0).to_numpy().astype(np.uint64)
        fresh = np.flatnonzero(first & unknown)
        if len(fresh):
            hashes[fresh] = _hash64(halves.column("gk").take(pa.array(fresh)).combine_chunks())
        hashes = hashes[start_idx]
        # a key used again after its link completed: the line simulator warns once and counts
        reuse = np.concatenate([opens[(j[opens] >= 2)],
                                fresh[np.isin(hashes[fresh], self.link_done)] if len(fresh) else np.zeros(0, np.int64)])
        lines = halves.column("line").to_numpy()
        files = halves.column("file").to_numpy()
        if len(reuse):
            reuse = reuse[np.argsort(hpos[reuse])]
            i = int(reuse[0])
            tyname = r.types[halves.column("ty")[i].as_py()].name
            r.warn_once("key-reuse", f"{self.files[files[i]]}:{lines[i]}: link key {halves.column('key')[i].as_py()!r} "
                                     f"of type {tyname!r} was already used by a complete link; treated as a new "
                                     f"link (pj_dump refuses it)")
            r.warned["key-reuse"] += len(reuse) - 1
        # completed links, in the order they complete
        oc = np.argsort(hpos[b], kind="stable")
        a, b = a[oc], b[oc]
        vv = halves.column("value").combine_chunks()
        if len(b):
            diff = np.flatnonzero(pc.not_equal(vv.take(pa.array(a)), vv.take(pa.array(b)))
                                  .to_numpy(zero_copy_only=False))
            if len(diff):
                i, i0 = int(b[diff[0]]), int(a[diff[0]])
                r.warn_once("link-value", f"{self.files[files[i]]}:{lines[i]}: link {halves.column('key')[i].as_py()!r} "
                                          f"has value {vv[i].as_py()!r} here and {vv[i0].as_py()!r} at "
                                          f"{self.files[files[i0]]}:{lines[i0]}")
                r.warned["link-value"] += len(diff) - 1
            self.link_done = np.union1d(self.link_done, hashes[b])
            sh = np.where(st[a], a, b)
            eh = np.where(st[a], b, a)
            cc = halves.column("c").to_numpy()
            epa = halves.column("ep").to_numpy()
            tsa = halves.column("ts").to_numpy()
            n = len(b)
            ids = r.transfer_id + 1 + np.arange(n, dtype=np.int64)
            r.transfer_id += n
            r.n["links"] += n
            rid = pa.array([c.rid or None for c in self.conts], S)
            tys_all = halves.column("ty").take(pa.array(b)).to_pylist()
            tyname = pa.array([r.types[x].name for x in tys_all], S)
            v = vv.take(pa.array(b))
            cname = pa.array([c.name for c in self.conts], S).take(pa.array(cc[b]))
            attrs = pc.binary_join_element_wise(
                '{"paje_type": ', _jstr(tyname), ', "value": ', _jstr(v), ', "key": ',
                _jstr(halves.column("key").take(pa.array(b)).combine_chunks()), ', "container": ', _jstr(cname),
                self._link_extras(halves, sh, eh), "}", "")
            r.spool.table("transfers", pa.table({
                "transfer_id": ids, "kind": v if r.flowscope else pa.array(["paje-link"] * n, S),
                "src_resource_id": rid.take(pa.array(epa[sh])), "dst_resource_id": rid.take(pa.array(epa[eh])),
                "start_ns": tsa[sh], "end_ns": tsa[eh], "attrs": attrs}))
        # halves left open carry over, with their hashes
        single = np.ones(m, bool)
        single[a] = False
        single[b] = False
        keep = np.flatnonzero(single)
        carry = halves.take(pa.array(keep))
        self.link_carry = carry.set_column(carry.schema.get_field_index("hash"), "hash",
                                           pa.array(hashes[keep], pa.uint64()))

    def _link_extras(self, halves: pa.Table, sh: np.ndarray, eh: np.ndarray) -> pa.Array:
        """The extra fields of each link: the start half's, then the end half's not named by the start's."""
        n = len(sh)
        xdef = halves.column("xdef").to_numpy()
        xvals = halves.column("xvals").combine_chunks()
        out = pa.array([""] * n, S)
        combos = np.unique(xdef[sh] * len(self.deflist) + xdef[eh])
        for cmb in combos.tolist():
            ds, de = divmod(cmb, len(self.deflist))
            sd, ed = self.deflist[ds], self.deflist[de]
            if not sd.extras and not ed.extras:
                continue
            rows = np.flatnonzero((xdef[sh] == ds) & (xdef[eh] == de))
            names, cols = [], []
            sv = xvals.take(pa.array(sh[rows]))
            for k, (name, _) in enumerate(sd.extras):
                names.append(name)
                cols.append(pc.list_element(sv, k))
            ev = xvals.take(pa.array(eh[rows]))
            for k, (name, _) in enumerate(ed.extras):
                if name not in names:
                    names.append(name)
                    cols.append(pc.list_element(ev, k))
            frag = _fragment(names, cols)
            mask = np.zeros(n, bool)
            mask[rows] = True
            out = pc.replace_with_mask(out, pa.array(mask), frag)
        return out

    # ---- the end --------------------------------------------------------------------------------
    def finish(self) -> None:
        r = self.r
        if self.link_carry is not None and self.link_carry.num_rows:
            lc = self.link_carry
            for ty, key, ci, st, ts, v, ln, fi in zip(lc.column("ty").to_pylist(), lc.column("key").to_pylist(),
                                                      lc.column("c").to_pylist(), lc.column("start").to_pylist(),
                                                      lc.column("ts").to_pylist(), lc.column("value").to_pylist(),
                                                      lc.column("line").to_pylist(), lc.column("file").to_pylist()):
                r.links[(self.conts[ci].ident, ty, key)] = [st, ts, None, v, None, None, f"{self.files[fi]}:{ln}"]
        r.finish()  # containers end (destroyed or at the last time); resources emitted
        c = self.carry
        if c is not None and len(c["g"]):
            ends = np.array([self.conts[self.group_cont[g]].end for g in c["g"].tolist()], np.int64)
            idx = np.arange(len(c["g"]))
            self._emit(idx, ends, c["g"], c["id"], c["parent"], c["ok"], c["start"], c["name"], c["key"],
                       c["extras"], c["level"])
        if self.var_carry is not None:
            self._emit_variables(*self.var_carry)


def _concat(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    t = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    if len(parts) > 1:
        t = t.take(pa.array(np.argsort(t.column("seq").to_numpy(), kind="stable")))
    return t


class _RunWriter:
    """One sorted run on disk: an Arrow IPC file per kind."""

    def __init__(self, tmp: str, name: str):
        self.tmp = tmp
        self.name = name
        self.files: dict[str, tuple[str, Any, Any]] = {}

    def write(self, ev: dict[str, pa.Table]) -> None:
        for k, t in ev.items():
            if not t.num_rows:
                continue
            t = t.select(SCHEMAS[k].names)
            if k not in self.files:
                path = os.path.join(self.tmp, f"{self.name}-{k}.arrow")
                f = pa.OSFile(path, "wb")
                self.files[k] = (path, f, ipc.new_file(f, SCHEMAS[k]))
            for batch in t.to_batches(max_chunksize=RUN_BATCH):
                self.files[k][2].write_batch(batch)

    def close(self) -> dict[str, str]:
        for _, f, w in self.files.values():
            w.close()
            f.close()
        return {k: v[0] for k, v in self.files.items()}


def _remove(runs: list[dict[str, str]]) -> None:
    for run in runs:
        for p in run.values():
            try:
                os.unlink(p)
            except OSError:
                pass


class _Source:
    """A cursor over one kind of one sorted run."""

    def __init__(self, kind: str, path: str):
        self.kind = kind
        self.f = pa.OSFile(path, "rb")
        self.reader = ipc.open_file(self.f)
        self.i = 0
        self.batch: pa.RecordBatch | None = None
        self.off = 0
        self.load()

    def load(self) -> None:
        while self.i < self.reader.num_record_batches:
            self.batch = self.reader.get_batch(self.i)
            self.i += 1
            self.off = 0
            if self.batch.num_rows:
                self.t = self.batch.column("t").to_numpy()
                self.seq = self.batch.column("seq").to_numpy()
                return
        self.batch = None
        self.f.close()

    def upto(self, ft: float, fs: int) -> int:
        """Rows of the current batch, from the cursor, up to (ft, fs) included."""
        lo = self.off + int(np.searchsorted(self.t[self.off:], ft, "left"))
        hi = self.off + int(np.searchsorted(self.t[self.off:], ft, "right"))
        return lo + int(np.searchsorted(self.seq[lo:hi], fs, "right"))


def _merge(runs: list[dict[str, str]]):
    """The events of sorted runs merged by (time, order), in blocks: a dict of tables per kind."""
    sources = [_Source(k, p) for run in runs for k, p in run.items()]
    sources = [s for s in sources if s.batch is not None]
    pending: dict[str, list[pa.RecordBatch]] = {}
    rows = 0
    while sources:
        ft, fs = min((float(s.t[-1]), int(s.seq[-1])) for s in sources)
        out: dict[str, list[pa.RecordBatch]] = {}
        for s in sources:
            k = s.upto(ft, fs)
            if k > s.off:
                out.setdefault(s.kind, []).append(s.batch.slice(s.off, k - s.off))
                s.off = k
            if s.off >= s.batch.num_rows:
                s.load()
        sources = [s for s in sources if s.batch is not None]
        for kind, parts in out.items():
            pending.setdefault(kind, []).extend(parts)
            rows += sum(p.num_rows for p in parts)
        if rows < MERGE_ROWS and sources:
            continue
        ev = {}
        for kind, parts in pending.items():
            t = pa.Table.from_batches(parts)
            if len(parts) > 1:
                t = t.take(pa.array(np.lexsort((t.column("seq").to_numpy(), t.column("t").to_numpy()))))
            ev[kind] = t
        pending, rows = {}, 0
        yield ev


def header(reader: Any, f: Any) -> tuple[int, int]:
    """Feed the header (comments, blank lines, %EventDef blocks) to ``reader``; return (lines, bytes) read."""
    cur, cur_where = None, ""
    n = 0
    pos = 0
    while True:
        at = f.tell()
        raw = f.readline()
        if not raw:
            break
        s = raw.decode("utf-8", "replace").strip()
        if s and s[0] not in "#%":
            f.seek(at)
            break
        n += 1
        pos += len(raw)
        where = f"{reader.path}:{n}"
        if not s:
            continue
        if s[0] == "#":
            m = FLOWSCOPE_MARK.match(s)
            if m and reader.unit_ns is None:
                reader.mark_flowscope_export(int(m.group(1)))
            continue
        try:
            cur, cur_where = reader._header_line(s, where, cur, cur_where)
        except TraceError as exc:
            raise Fallback(str(exc)) from None
    if cur is not None:
        raise Fallback("open %EventDef")
    return n, pos


def read_fast(reader: Any, unordered: Any = None) -> list[str]:
    """Simulate ``reader``'s trace with the vectorised path; returns the warnings to hand to the sink.

    Raises the line simulator's ``Unordered`` (paje_format.py) when the trace is not time-ordered and ``reader`` is
    not in sorted mode; the caller then reads again with a reader in sorted mode, passing that
    exception as ``unordered`` (its warning is given here)."""
    notes = _Notes(reader.sink)
    reader.sink = notes
    with open(Path(reader.path), "rb") as f:
        n, pos = header(reader, f)
        FastReader(reader, reader.sorted_mode, unordered).run(f, n, pos)
    return notes.warnings
