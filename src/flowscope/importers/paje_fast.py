"""The vectorised path of the Paje importer, for the common shape of a large trace.

A time-ordered trace of single-space-separated lines whose states are pushed and popped (no
PajeSetState/PajeResetState), whose variables are set (no Add/Sub), without includes or comments in
the body, is read in chunks of :data:`CHUNK_BYTES`: the lines of each chunk are grouped by event id,
each group is parsed by Arrow's CSV reader with the columns its ``%EventDef`` declares, and states
are matched push-to-pop with array operations per (container, type) stack; states still open at the
end of a chunk carry over to the next. Definitions and container events go through the line
simulator (:class:`flowscope.importers.paje._Reader`), so the result is the same rows, ids and
warnings. Whenever a chunk is not of that shape -- or is invalid in any way -- :class:`Fallback` is
raised and the caller reads the file with the line simulator, which reports errors with file:line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv

from flowscope.importers import TraceError

#: bytes of trace text parsed per step
CHUNK_BYTES = 32 << 20
SMALL = {"PajeDefineContainerType", "PajeDefineStateType", "PajeDefineEventType", "PajeDefineVariableType",
         "PajeDefineLinkType", "PajeDefineEntityValue", "PajeCreateContainer", "PajeDestroyContainer"}
FAST = {"PajePushState", "PajePopState", "PajeSetVariable", "PajeNewEvent", "PajeStartLink", "PajeEndLink"}
_PARSE = csv.ParseOptions(delimiter=" ", quote_char='"', double_quote=False, escape_char=False,
                          newlines_in_values=False, ignore_empty_lines=False)
_LEVEL_BITS, _LINE_BITS = 10, 33
_SAFE_KEY = r'["\\\x00-\x1f\x7f-\U0010ffff]'


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
    from flowscope.importers.paje import TIME_LIMIT

    if not np.all(np.abs(reader.origin_ns + t * 1e9) < TIME_LIMIT):
        raise Fallback("a time out of range")
    if reader.unit_ns is None:
        reader._decide_unit()
    return reader.origin_ns + np.rint(t * reader.unit_ns).astype(np.int64)


class FastReader:
    """Reads one trace with the vectorised path into ``reader``'s spool."""

    def __init__(self, reader: Any):
        self.r = reader
        self.path = str(reader.path)
        self.cont_index: dict[str, int] = {}  # container ident -> index in the arrays below
        self.conts: list[Any] = []
        self.created: list[int] = []
        self.destroyed: list[float] = []
        self.groups: dict[tuple[int, str], int] = {}
        self.group_cont: list[int] = []
        self.group_type: list[Any] = []
        self.first_timed = None
        self.carry: dict[str, np.ndarray] | None = None
        self.carry_names: pa.Array = pa.array([], pa.string())
        self.carry_keys: pa.Array = pa.array([], pa.string())
        self.var_parts: list[tuple[np.ndarray, ...]] = []
        self.link_parts: list[dict] = []

    # ---- containers and types ------------------------------------------------------------
    def _cidx(self, c: Any) -> int:
        i = self.cont_index.get(c.ident)
        if i is None:
            i = self.cont_index[c.ident] = len(self.conts)
            self.conts.append(c)
            self.created.append(-1)
            self.destroyed.append(np.inf)
        return i

    def containers(self, col: pa.ChunkedArray, line: np.ndarray) -> np.ndarray:
        """Index of each row's container; Fallback when one is unknown or used outside its lifetime."""
        enc = pc.dictionary_encode(col).combine_chunks()
        idx = enc.indices.to_numpy(zero_copy_only=False)
        lut = np.empty(len(enc.dictionary), np.int64)
        for k, name in enumerate(enc.dictionary.to_pylist()):
            c = self.r.containers.get(name) or self.r.container_names.get(name)
            if c is None:
                raise Fallback(f"unknown container {name!r}")
            lut[k] = self._cidx(c)
        ci = lut[idx]
        created = np.asarray(self.created, np.int64)[ci]
        destroyed = np.asarray(self.destroyed, np.float64)[ci]
        if np.any(line <= created) or np.any(line >= destroyed):
            raise Fallback("a container used before its creation or after its destruction")
        return ci

    def types(self, col: pa.ChunkedArray, kind: str) -> tuple[np.ndarray, list[Any]]:
        enc = pc.dictionary_encode(col).combine_chunks()
        tys = []
        for name in enc.dictionary.to_pylist():
            t = self.r.types.get(name) or self.r.type_names.get(name)
            if t is None or t.kind != kind:
                raise Fallback(f"bad type {name!r}")
            tys.append(t)
        return enc.indices.to_numpy(zero_copy_only=False), tys

    def group_ids(self, ci: np.ndarray, ti: np.ndarray, tys: list[Any]) -> np.ndarray:
        pair = ci * max(1, len(tys)) + ti
        uniq, inv = np.unique(pair, return_inverse=True)
        lut = np.empty(len(uniq), np.int64)
        for k, p in enumerate(uniq.tolist()):
            c, t = divmod(p, max(1, len(tys)))
            key = (c, tys[t].ident)
            g = self.groups.get(key)
            if g is None:
                g = self.groups[key] = len(self.group_cont)
                self.group_cont.append(c)
                self.group_type.append(tys[t])
            lut[k] = g
        return lut[inv]

    # ---- the pass ------------------------------------------------------------------------
    def run(self, f: Any, line0: int, pos0: int) -> None:
        """Read the body from the open binary file ``f`` (positioned after the header)."""
        r = self.r
        defs = {}
        for ident, d in r.defs.items():
            b = ident.encode()
            if 0 < len(b) <= 4:
                defs[int.from_bytes(b, "little")] = d
        self.defs = defs
        line = line0
        done = pos0
        rest = b""
        while True:
            data = f.read(CHUNK_BYTES)
            buf = rest + data
            if not data:
                if buf:
                    self.chunk(buf + b"\n", line)
                break
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                rest = buf
                continue
            line = self.chunk(buf[:cut], line)
            rest = buf[cut:]
            done += len(data)
            r.sink.advance(done)
        self.finish()

    def chunk(self, buf: bytes, line0: int) -> int:
        r = self.r
        if b"\r" in buf or b"\t" in buf or b"  " in buf or b"\n\n" in buf or b"\n " in buf or buf[:1] in b" \n":
            raise Fallback("whitespace")
        arr = np.frombuffer(buf, np.uint8)
        nl = np.flatnonzero(arr == 10)
        n = len(nl)
        starts = np.empty(n, np.int64)
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
        first = arr[starts]
        if np.any((first == 35) | (first == 37) | (first == 32)):
            raise Fallback("comment or definition in the body")
        if np.any(arr[nl - 1] == 32):
            raise Fallback("trailing space")
        q = np.flatnonzero(arr == 34)
        if len(q):
            # quotes open after a space and close before a space or the line's end, in pairs per line
            per_line = np.diff(np.searchsorted(q, np.append(starts, len(arr))))
            if np.any(per_line % 2):
                raise Fallback("odd quotes")
            op, cl = q[0::2], q[1::2]
            if np.any(arr[op - 1] != 32) or np.any((arr[cl + 1] != 32) & (arr[cl + 1] != 10)):
                raise Fallback("quote inside a token")
        delim = np.flatnonzero((arr == 32) | (arr == 10))
        sp = delim[np.searchsorted(delim, starts)]
        idlen = sp - starts
        if np.any(idlen > 4):
            raise Fallback("long event id")
        code = np.zeros(n, np.int64)
        for k in range(4):
            m = idlen > k
            code[m] |= arr[starts[m] + k].astype(np.int64) << (8 * k)
        lines = line0 + 1 + np.arange(n, dtype=np.int64)
        ends = nl + 1
        parsed: dict[str, list[tuple[Any, pa.Table, np.ndarray]]] = {}
        present = np.unique(code)
        small_rows: list[tuple[int, Any, list]] = []
        for c in present.tolist():
            d = self.defs.get(c)
            if d is None:
                raise Fallback("unknown event id")
            if d.kind not in SMALL | FAST:
                raise Fallback(f"event {d.kind}")
            if d.kind in FAST and any(name != "TaskKey" for name, _ in d.extras):
                raise Fallback(f"extra fields in {d.kind}")
            sel = np.flatnonzero(code == c)
            table = self._parse(arr, starts[sel], ends[sel], d)
            if d.kind in SMALL:
                cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
                for j, ln in enumerate(lines[sel].tolist()):
                    small_rows.append((ln, d, [col[j] for col in cols]))
            else:
                parsed.setdefault(d.kind, []).append((d, table, lines[sel]))
        # times: non-decreasing in file order, as the line simulator requires
        t_all = np.full(n, np.nan)
        small_rows.sort(key=lambda x: x[0])
        for ln, d, toks in small_rows:
            if d.time_index >= 0:
                try:
                    t_all[ln - line0 - 1] = float(toks[d.time_index])
                except ValueError:
                    raise Fallback("time") from None
            elif self.first_timed is not None:
                raise Fallback("definition after timed events")
        for kind, parts in parsed.items():
            for d, table, ln in parts:
                t_all[ln - line0 - 1] = table.column(d.time_index).to_numpy()
        timed = t_all[~np.isnan(t_all)]
        if len(timed):
            if np.any(np.diff(timed) < 0) or timed[0] < r.last_t:
                raise Fallback("not time-ordered")
            if self.first_timed is None:
                self.first_timed = int(lines[~np.isnan(t_all)][0])
            for ln, d, toks in small_rows:
                if d.kind.startswith("PajeDefine") and ln > self.first_timed:
                    raise Fallback("definition after timed events")
        # the few structural events go through the line simulator, in file order
        for ln, d, toks in small_rows:
            where = f"{self.path}:{ln}"
            try:
                t = r._number(toks, d, d.time_index, where) if d.time_index >= 0 else 0.0
                r.dispatch(d, toks, where, t)
            except TraceError as exc:
                raise Fallback(str(exc)) from None
            if d.kind == "PajeCreateContainer":
                ix = d.index
                ident = (toks[ix["Alias"]] if "Alias" in ix else "") or toks[ix["Name"]]
                self.created[self._cidx(r.containers[ident])] = ln
            elif d.kind == "PajeDestroyContainer":
                # the container and those below it (pj_dump destroys recursively): any later use falls back
                todo = [r.container(toks[d.index["Name"]], where, "Name")]
                while todo:
                    c = todo.pop()
                    todo.extend(c.children)
                    i = self._cidx(c)
                    self.destroyed[i] = min(self.destroyed[i], ln)
        if len(timed):
            r.last_t = float(timed[-1])
            r.max_t = max(r.max_t, float(timed.max()))
            r.min_t = min(r.min_t, float(timed.min()))
        self._states(parsed.get("PajePushState", []), parsed.get("PajePopState", []))
        for d, table, ln in parsed.get("PajeSetVariable", []):
            ci = self.containers(table.column(d.index["Container"]), ln)
            ti, tys = self.types(table.column(d.index["Type"]), "variable")
            g = self.group_ids(ci, ti, tys)
            v = table.column(d.index["Value"]).to_numpy()
            self.var_parts.append((ln, g, _ns(r, table.column(d.time_index).to_numpy()), v))
        for kind in ("PajeStartLink", "PajeEndLink"):
            for d, table, ln in parsed.get(kind, []):
                start = kind == "PajeStartLink"
                ci = self.containers(table.column(d.index["Container"]), ln)
                ti, tys = self.types(table.column(d.index["Type"]), "link")
                ep = self.containers(table.column(d.index["StartContainer" if start else "EndContainer"]), ln)
                self.link_parts.append({
                    "line": ln, "start": np.full(len(ln), start), "c": ci,
                    "type": [tys[i].ident for i in ti.tolist()], "ep": ep,
                    "key": table.column(d.index["Key"]).to_pylist(),
                    "value": table.column(d.index["Value"]).to_pylist(),
                    "t": _ns(r, table.column(d.time_index).to_numpy())})
        for d, table, ln in parsed.get("PajeNewEvent", []):
            ci = self.containers(table.column(d.index["Container"]), ln)
            ti, tys = self.types(table.column(d.index["Type"]), "event")
            ts = _ns(r, table.column(d.time_index).to_numpy()).tolist()
            vals = table.column(d.index["Value"]).to_pylist()
            for k, (c, t) in enumerate(zip(ci.tolist(), ti.tolist())):
                ty = tys[t]
                v = ty.values.get(vals[k], vals[k])
                r.n["events"] += 1
                r.spool.row("logs", ts_ns=ts[k], resource_id=self.conts[c].rid or None, level="info",
                            category=ty.name, message=v, attrs=json.dumps({"paje_type": ty.name}))
        return line0 + n

    def _parse(self, arr: np.ndarray, st: np.ndarray, en: np.ndarray, d: Any) -> pa.Table:
        lens = en - st
        total = int(lens.sum())
        offs = np.cumsum(lens) - lens
        idx = np.repeat(st - offs, lens) + np.arange(total, dtype=np.int64)
        data = arr[idx].tobytes()
        types = {name: pa.string() for name in d.names}
        if d.time_index >= 0:
            types["Time"] = pa.float64()
        if d.kind == "PajeSetVariable":
            types["Value"] = pa.float64()
        names = [f"c{i}" for i in range(len(d.names))]
        ctypes = {f"c{i}": types[name] for i, name in enumerate(d.names)}
        try:
            return csv.read_csv(pa.py_buffer(data),
                                read_options=csv.ReadOptions(column_names=names, block_size=1 << 26,
                                                             use_threads=False),
                                parse_options=_PARSE,
                                convert_options=csv.ConvertOptions(column_types=ctypes, strings_can_be_null=False,
                                                                   quoted_strings_can_be_null=False,
                                                                   null_values=[]))
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            raise Fallback(f"csv: {exc}") from None

    # ---- states --------------------------------------------------------------------------
    def _states(self, pushes: list, pops: list) -> None:
        r = self.r
        new: list[dict] = []
        for d, table, ln in pushes:
            ci = self.containers(table.column(d.index["Container"]), ln)
            ti, tys = self.types(table.column(d.index["Type"]), "state")
            g = self.group_ids(ci, ti, tys)
            names = table.column(d.index["Value"]).combine_chunks()
            if any(t.values for t in tys):
                vals = names.to_pylist()
                names = pa.array([self.group_type[gg].values.get(v, v) for gg, v in zip(g.tolist(), vals)],
                                 pa.string())
            key = table.column(d.index["TaskKey"]).combine_chunks() if "TaskKey" in d.index else \
                pa.nulls(len(ln), pa.string())
            new.append({"line": ln, "g": g, "start": _ns(r, table.column(d.time_index).to_numpy()),
                        "name": names, "key": key})
        pop_line, pop_g, pop_t = [], [], []
        for d, table, ln in pops:
            ci = self.containers(table.column(d.index["Container"]), ln)
            ti, tys = self.types(table.column(d.index["Type"]), "state")
            pop_line.append(ln)
            pop_g.append(self.group_ids(ci, ti, tys))
            pop_t.append(_ns(r, table.column(d.time_index).to_numpy()))
        if not new and not pop_line:
            return
        # this chunk's pushes, in file order, with their span ids
        if new:
            p_line = np.concatenate([x["line"] for x in new])
            order = np.argsort(p_line, kind="stable")
            p_line = p_line[order]
            p_g = np.concatenate([x["g"] for x in new])[order]
            p_start = np.concatenate([x["start"] for x in new])[order]
            p_name = pa.concat_arrays([x["name"] for x in new]).take(pa.array(order))
            p_key = pa.concat_arrays([x["key"].cast(pa.string()) for x in new]).take(pa.array(order))
        else:
            p_line = p_g = p_start = np.zeros(0, np.int64)
            p_name = p_key = pa.array([], pa.string())
        p_id = r.span_id + 1 + np.arange(len(p_line), dtype=np.int64)
        r.span_id += len(p_line)
        c = self.carry
        if c is not None and len(c["line"]):
            p_line = np.concatenate([c["line"], p_line])
            p_g = np.concatenate([c["g"], p_g])
            p_start = np.concatenate([c["start"], p_start])
            p_id = np.concatenate([c["id"], p_id])
            p_name = pa.concat_arrays([self.carry_names, p_name])
            p_key = pa.concat_arrays([self.carry_keys, p_key])
        np_ = len(p_line)
        q_line = np.concatenate(pop_line) if pop_line else np.zeros(0, np.int64)
        q_g = np.concatenate(pop_g) if pop_g else np.zeros(0, np.int64)
        q_t = np.concatenate(pop_t) if pop_t else np.zeros(0, np.int64)
        line = np.concatenate([p_line, q_line])
        g = np.concatenate([p_g, q_g])
        delta = np.concatenate([np.ones(np_, np.int64), -np.ones(len(q_line), np.int64)])
        o = np.lexsort((line, g))
        gs, ds = g[o], delta[o]
        cs = np.cumsum(ds)
        newgrp = np.empty(len(gs), bool)
        newgrp[0] = True
        newgrp[1:] = gs[1:] != gs[:-1]
        base = np.maximum.accumulate(np.where(newgrp, np.arange(len(gs)), 0))
        before = cs[base] - ds[base]
        depth = cs - before  # stack depth after each event
        if np.any(depth < 0):
            raise Fallback("pop of an empty stack")
        level = np.where(ds > 0, depth, depth + 1)
        if level.max(initial=0) >= (1 << _LEVEL_BITS) or len(self.group_cont) >= (1 << 20) or \
                line.max(initial=0) >= (1 << _LINE_BITS):
            raise Fallback("too deep")
        o2 = np.lexsort((line[o], level, gs))
        ev = o[o2]  # events sorted by (group, level, line): push, pop, push, pop, ...
        is_push = ev < np_
        blk = (gs[o2] << _LEVEL_BITS) | level[o2]
        nxt_same = np.zeros(len(ev), bool)
        nxt_same[:-1] = blk[1:] == blk[:-1]
        matched = is_push & nxt_same & np.append(~is_push[1:], False)
        pi = ev[matched]  # index into pushes
        qi = ev[np.flatnonzero(matched) + 1] - np_  # index into pops
        open_ = np.ones(np_, bool)
        open_[pi] = False
        # parents: the push one level up in the same stack, the latest before it
        p_level = np.empty(np_, np.int64)
        p_level[ev[is_push]] = level[o2][is_push]
        pkey = (((p_g << _LEVEL_BITS) | p_level) << _LINE_BITS) | p_line
        sk = np.sort(pkey)
        so = np.argsort(pkey)
        want = (((p_g << _LEVEL_BITS) | (p_level - 1)) << _LINE_BITS) | p_line
        j = np.searchsorted(sk, want) - 1
        ok = (j >= 0) & (p_level > 1)
        jj = np.where(ok, j, 0)
        ok &= (sk[jj] >> _LINE_BITS) == ((p_g << _LEVEL_BITS) | (p_level - 1))
        parent = np.where(ok, p_id[so[jj]], 0)
        self._emit(pi, q_t[qi], p_g, p_id, parent, ok, p_start, p_name, p_key, p_level)
        keep = np.flatnonzero(open_)
        self.carry = {"line": p_line[keep], "g": p_g[keep], "start": p_start[keep], "id": p_id[keep],
                      "parent": parent[keep], "ok": ok[keep], "level": p_level[keep]}
        ka = pa.array(keep)
        self.carry_names = p_name.take(ka)
        self.carry_keys = p_key.take(ka)

    def _emit(self, pi: np.ndarray, end: np.ndarray, p_g: np.ndarray, p_id: np.ndarray, parent: np.ndarray,
              ok: np.ndarray, p_start: np.ndarray, p_name: pa.Array, p_key: pa.Array, p_level: np.ndarray) -> None:
        if not len(pi):
            return
        r = self.r
        from flowscope.importers.paje import _LANE

        g = p_g[pi]
        rid = pa.array([self.conts[c].rid or None for c in self.group_cont], pa.string())
        ga = pa.array(g)
        if r.flowscope:
            kinds = pa.array([_LANE.sub("", t.name) for t in self.group_type], pa.string()).take(ga)
            attrs = pa.nulls(len(pi), pa.string())
        else:
            kinds = pa.array(["state"] * len(pi), pa.string())
            pre = pa.array(['{"paje_type": ' + json.dumps(t.name) + ', "depth": ' for t in self.group_type],
                           pa.string()).take(ga)
            attrs = pc.binary_join_element_wise(pre, pa.array((p_level[pi] - 1).astype(str)), pa.scalar("}"), "")
        key = p_key.take(pa.array(pi))
        key = pc.if_else(pc.equal(key, ""), pa.nulls(len(pi), pa.string()), key)
        t = pa.table({
            "span_id": p_id[pi], "parent_id": pa.array(parent[pi], mask=~ok[pi]), "resource_id": rid.take(ga),
            "kind": kinds, "name": p_name.take(pa.array(pi)), "start_ns": p_start[pi], "end_ns": end,
            "task_key": key, "attrs": attrs})
        r.n["states"] += len(pi)
        self.r.spool.table("spans", t)

    # ---- the end -------------------------------------------------------------------------
    def finish(self) -> None:
        r = self.r
        self._links()
        r.finish()  # containers end (destroyed or at the last time); resources emitted
        c = self.carry
        if c is not None and len(c["line"]):
            ends = np.array([self.conts[self.group_cont[g]].end for g in c["g"].tolist()], np.int64)
            idx = np.arange(len(c["line"]))
            self._emit(idx, ends, c["g"], c["id"], c["parent"], c["ok"], c["start"], self.carry_names,
                       self.carry_keys, c["level"])
        self._variables()

    def _variables(self) -> None:
        r = self.r
        if not self.var_parts:
            return
        ln = np.concatenate([p[0] for p in self.var_parts])
        g = np.concatenate([p[1] for p in self.var_parts])
        ts = np.concatenate([p[2] for p in self.var_parts])
        v = np.concatenate([p[3] for p in self.var_parts])
        o = np.lexsort((ln, g))
        g, ts, v = g[o], ts[o], v[o]
        last = np.ones(len(g), bool)
        last[:-1] = (g[1:] != g[:-1]) | (ts[1:] != ts[:-1])
        g, ts, v = g[last], ts[last], v[last]
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
            "ts_ns": ts, "resource_id": pa.array([self.conts[c].rid or None for c in self.group_cont],
                                                 pa.string()).take(ga),
            "namespace": pa.array(ns_, pa.string()).take(ga), "name": pa.array(nm, pa.string()).take(ga),
            "value": v.astype(np.float64)}))

    def _links(self) -> None:
        r = self.r
        if not self.link_parts:
            return
        rows: list[tuple] = []
        for p in self.link_parts:
            rows.extend(zip(p["line"].tolist(), p["start"].tolist(), p["c"].tolist(), p["type"], p["ep"].tolist(),
                            p["key"], p["value"], p["t"].tolist()))
        rows.sort(key=lambda x: x[0])
        half: dict[tuple, tuple] = {}
        used: set[tuple] = set()
        for ln, start, c, tid, ep, key, val, t in rows:
            where = f"{self.path}:{ln}"
            ty = r.types[tid]
            cont = self.conts[c]
            v = ty.values.get(val, val)
            k = (cont.ident, tid, key)
            h = half.pop(k, None)
            if h is None:
                if k in used:
                    r.warn_once("key-reuse", f"{where}: link key {key!r} of type {ty.name!r} was already used "
                                             f"by a complete link; treated as a new link (pj_dump refuses it)")
                half[k] = (start, t, ep, v, where)
                continue
            was_start, then, other, v0, where0 = h
            if was_start == start:
                raise Fallback("link twice")
            if v0 != v:
                r.warn_once("link-value", f"{where}: link {key!r} has value {v!r} here and {v0!r} at {where0}")
            used.add(k)
            s_t, s_c = (t, ep) if start else (then, other)
            e_t, e_c = (then, other) if start else (t, ep)
            r.n["links"] += 1
            r.transfer_id += 1
            attrs = {"paje_type": ty.name, "value": v, "key": key, "container": cont.name}
            r.spool.row("transfers", transfer_id=r.transfer_id, kind=v if r.flowscope else "paje-link",
                        src_resource_id=self.conts[s_c].rid or None, dst_resource_id=self.conts[e_c].rid or None,
                        start_ns=s_t,
                        end_ns=e_t, attrs=json.dumps(attrs))
        # halves left are reported by the line simulator's finish (it reads r.links)
        for k, (start, t, ep, v, where) in half.items():
            r.links[k] = [start, t, None, v, None, None, where]


def header(reader: Any, f: Any) -> tuple[int, int]:
    """Feed the header (comments, blank lines, %EventDef blocks) to ``reader``; return (lines, bytes) read."""
    from flowscope.importers.paje import FLOWSCOPE_MARK

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


def read_fast(reader: Any) -> list[str]:
    """Simulate ``reader``'s trace with the vectorised path; returns the warnings to hand to the sink."""
    notes = _Notes(reader.sink)
    reader.sink = notes
    with open(Path(reader.path), "rb") as f:
        n, pos = header(reader, f)
        FastReader(reader).run(f, n, pos)
    return notes.warnings
