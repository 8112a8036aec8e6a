"""The trace's slices as span rows: ``B``/``E`` pairs and async begin/end pairs matched, every slice nested per
thread (parent and depth), task keys given to the slices flows bind, and the rows written in batches."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.importers.chrome.columns import (
    _ENCODE,
    BATCH,
    _args_json,
    _marked_attrs,
    _us_to_ns,
)
from flowscope.importers.sink import _column
from flowscope.model.identifiers import call_key


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


class _Spans:
    """The span-writing half of :class:`~flowscope.importers.chrome.reader._Reader` (its state is the reader's)."""

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

    def _emit_spans(self, rows: list[tuple], flows: dict[str, list] | None = None) -> None:
        """Write the X slices (from their column store) then ``rows`` (B/E and async spans), with
        parents and depths from one nesting pass over all of them; the slices ``flows`` bind to get a
        task key (theirs, or :func:`~flowscope.model.identifiers.call_key`), kept in ``flows`` as
        ``src_call`` / ``dst_call``."""
        nx = len(self.xs)
        n = nx + len(rows)
        if flows is not None:
            flows["src_call"] = [None] * len(flows["src"])
            flows["dst_call"] = [None] * len(flows["src"])
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
        bound = self._bind_flows(flows, thread, start, end, parent, is_async) if flows else {}
        keys: dict[int, str] = {}
        if bound:
            marked = self._marked_keys(rows, nx, set(bound))
            keys = {i: marked.get(i) or call_key(base + i) for i in bound}
            for end_name, col in (("src", "src_call"), ("dst", "dst_call")):
                for j, i in enumerate(flows[f"{end_name}_slice"]):
                    if i >= 0:
                        flows[col][j] = keys[i]
        if nx:
            self._emit_x(base, thread, start, end, parent, depth, rid_table, keys)
        if rows:
            self._emit_rows(rows, base, thread, start, end, parent, depth, is_async, rid_table, nx, keys)
        self._thread_span_times = (thread, start, end)

    def _marked_keys(self, rows: list[tuple], nx: int, want: set[int]) -> dict[int, str]:
        """The task keys flowscope's exporter wrote on the slices ``want`` (slice index -> key)."""
        out: dict[int, str] = {}
        lo = 0
        if nx and any(i < nx for i in want):
            for b in self.xs.read():
                hi = lo + b.num_rows
                tk = b.column("task_key")
                for i in (i for i in want if lo <= i < hi):
                    v = tk[i - lo].as_py()
                    if v:
                        out[i] = v
                lo = hi
        for i in (i for i in want if i >= nx):
            args = rows[i - nx][5]
            fs = args.get("flowscope") if isinstance(args, dict) else None
            if isinstance(fs, dict) and fs.get("task_key"):
                out[i] = fs["task_key"]
        return out

    def _emit_x(self, base: int, thread: np.ndarray, start: np.ndarray, end: np.ndarray, parent: np.ndarray,
                depth: np.ndarray, rid_table: pa.Array, keys: dict[int, str] | None = None) -> None:
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
                "task_key": self._with_keys(b.column("task_key"), keys, lo, hi),
                "attrs": pc.if_else(marked, b.column("text"), built)})
            lo = hi
        self.xs.close()

    @staticmethod
    def _with_keys(col: pa.Array, keys: dict[int, str] | None, lo: int, hi: int) -> pa.Array:
        here = [i for i in keys if lo <= i < hi] if keys else []
        if not here:
            return col
        values = col.to_pylist()
        for i in here:
            values[i - lo] = keys[i]
        return pa.array(values, pa.string())

    def _emit_rows(self, rows: list[tuple], base: int, thread: np.ndarray, start: np.ndarray, end: np.ndarray,
                   parent: np.ndarray, depth: np.ndarray, is_async: np.ndarray, rid_table: pa.Array,
                   nx: int, keys: dict[int, str] | None = None) -> None:
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
        for i, k in (keys or {}).items():
            if i >= nx:
                task_keys[i - nx] = k
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
