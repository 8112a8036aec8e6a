"""One import's state: each event routed by phase into the column stores, resources named from metadata,
the time origin (flowscope's export marker, Kineto's ``baseTimeNanoseconds``), and at the end the rows:
logs and metrics in batches as they come, then spans (:mod:`.spans`), transfers (:mod:`.flows`), resources
and the import's facts."""

from __future__ import annotations

import json
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from flowscope.importers.chrome.columns import (
    BATCH,
    XCHUNK,
    _args_json,
    _Intern,
    _marked_attrs,
    _us_to_ns,
    _XSlices,
)
from flowscope.importers.chrome.events import _error, _Events, _num
from flowscope.importers.chrome.flows import _Flows
from flowscope.importers.chrome.spans import _async_key, _Spans
from flowscope.importers.sink import ImportSink

SLICE = {"X", "B", "E"}
ASYNC = {"b", "e", "S", "T", "p", "F"}
FLOW = {"s", "t", "f"}
INSTANT = {"i", "I", "R", "n"}
#: phases the format defines that have no canonical table (object snapshots, samples, memory dumps,
#: clock sync, context markers): counted and reported, not imported
UNMAPPED = {"N", "O", "D", "P", "V", "v", "c", "(", ")", "=", "M"}


class _Reader(_Spans, _Flows):
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
        flows = self._flows()
        self._emit_spans(spans, flows)
        self._transfers(flows)
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
