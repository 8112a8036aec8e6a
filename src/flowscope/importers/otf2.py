"""OTF2 archives (Score-P and other tools) read through the ``otf2`` Python bindings.

Mapping (docs/formats/otf2.md): system-tree nodes, location groups (MPI ranks) and locations become
resources; ENTER/LEAVE pairs become nested ``call`` spans (``span_id``/``parent_id``, depth in attrs);
MPI point-to-point events (SEND/ISEND+ISEND_COMPLETE with RECV/IRECV_REQUEST+IRECV) are matched
into ``mpi`` transfers between rank resources; METRIC events become metrics. Timestamps are ticks
converted to int64 ns with the archive's clock properties.
"""

from __future__ import annotations

import ctypes
import json
import platform
import re
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from flowscope.importers import TraceError
from flowscope.importers.sink import ImportSink

NAME = "otf2"

#: OTF2_UNDEFINED_TIMESTAMP: the archive has no realtime anchor for its clock
UNDEFINED_TIMESTAMP = 2**64 - 1
#: rows of one table gathered before they are handed to the sink
BATCH = 200_000


def sniff(path: Path, head: bytes) -> bool:
    """An OTF2 anchor file: byte 1 is the buffer's endianness mark, then ``OTF2\\0``."""
    return len(head) >= 7 and head[1:2] in (b"B", b"#") and head[2:7] == b"OTF2\x00"


def _event_name(cls_name: str) -> str:
    """``MpiIsendComplete`` -> ``MPI_ISEND_COMPLETE`` (otf2-print's spelling)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls_name).upper()


class _Clock:
    """Ticks -> int64 ns: (t - global_offset) / resolution, anchored at the realtime stamp when the archive has one."""

    def __init__(self, resolution: int, offset: int, realtime_ns: int | None):
        if resolution <= 0:
            raise ValueError(f"clock resolution {resolution} is not positive")
        self.resolution = int(resolution)
        self.offset = int(offset)
        self.base = int(realtime_ns or 0)

    def ns(self, ticks: np.ndarray | list[int]) -> np.ndarray:
        t = np.asarray(ticks, dtype=np.uint64).astype(np.int64) - self.offset
        q, r = np.divmod(t, self.resolution)  # two steps so long traces at GHz resolution do not overflow
        return self.base + q * 1_000_000_000 + (r * 1_000_000_000) // self.resolution

    def one(self, ticks: int) -> int:
        return int(self.ns([ticks])[0])


class _LibraryMessages:
    """What the OTF2 library reports through its error callback while a read is under way, instead of
    the lines it would print to stderr from C (eight of them for one truncated event file)."""

    _lock = threading.Lock()
    _users = 0
    _previous: int | None = None
    _callback: Any = None
    _installed = False
    _local = threading.local()

    @classmethod
    def _install(cls) -> None:
        from _otf2.Config import conf

        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p,
                                 ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
        register = conf.lib.OTF2_Error_RegisterCallback
        register.restype, register.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]
        if cls._callback is None:
            cls._callback = proto(cls._on_error)  # kept referenced: the library holds the pointer
        cls._previous = register(ctypes.cast(cls._callback, ctypes.c_void_p), None)
        cls._installed = True

    @classmethod
    def _uninstall(cls) -> None:
        from _otf2.Config import conf

        conf.lib.OTF2_Error_RegisterCallback(cls._previous, None)
        cls._installed = False

    @staticmethod
    def _text(fmt: bytes | None, va: int | None) -> str:
        if not fmt:
            return ""
        if b"%" in fmt and va and platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64"):
            # va_list reaches the callback as a pointer on these ABIs, so vsnprintf can expand it
            buf = ctypes.create_string_buffer(1024)
            vsnprintf = ctypes.CDLL(None).vsnprintf
            vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
            vsnprintf(buf, len(buf), fmt, va)
            return buf.value.decode(errors="replace")
        return fmt.decode(errors="replace")

    @classmethod
    def _on_error(cls, _user, file, line, _function, code, fmt, va) -> int:
        try:
            text = cls._text(fmt, va)
            sink = getattr(cls._local, "messages", None)
            if sink is not None:
                sink.append(text)
            else:  # an OTF2 call outside any read of ours (another thread): say it as the library would
                print(f"[OTF2] {(file or b'?').decode(errors='replace')}:{line}: {text}", file=sys.stderr)
        except Exception:  # noqa: BLE001, S110 - an exception must not cross back into C
            pass
        return code

    @classmethod
    @contextmanager
    def collect(cls) -> Iterator[list[str]]:
        """Messages the library reports in this thread while the block runs, in order."""
        messages: list[str] = []
        outer = getattr(cls._local, "messages", None)
        cls._local.messages = messages
        with cls._lock:
            if cls._users == 0:
                try:
                    cls._install()
                except (ImportError, AttributeError, OSError):  # bindings without the symbol: the library prints
                    pass
            cls._users += 1
        try:
            yield messages
        finally:
            with cls._lock:
                cls._users -= 1
                if cls._users == 0 and cls._installed:
                    cls._uninstall()
            cls._local.messages = outer


def _said(messages: list[str], most: int = 3) -> str:
    """The library's distinct messages, deepest first, for the end of a one-line error."""
    distinct = list(dict.fromkeys(messages))
    if not distinct:
        return ""
    more = f" (+{len(distinct) - most} more)" if len(distinct) > most else ""
    return "; the OTF2 library said: " + "; ".join(distinct[:most]) + more


def _open(path: Path):
    import otf2

    try:
        return otf2.reader.Reader(str(path))
    except Exception as exc:  # _otf2.Error or TraceReaderError: the library names no file
        raise TraceError(f"{path}: not a readable OTF2 archive (anchor file or global definitions "
                         f"{path.with_suffix('.def').name} invalid or truncated): {exc}") from None


def _locate_bad_location(path: Path, locations: list) -> str:
    """Which location's event file fails to read (checked one by one, only after a failure)."""
    import otf2

    for loc in locations:
        try:
            with otf2.reader.open(str(path)) as tr:
                sel = [x for x in tr.definitions.locations if x._ref == loc._ref]
                n = 0
                for _ in tr.events(sel):
                    n += 1
        except Exception:
            return (f"location {loc._ref} ({loc.name!r}, event file "
                    f"{path.with_suffix('')}/{loc._ref}.evt) fails after {n} of {loc.number_of_events} events")
    return "no single location fails on its own"


def _enum(path: Path, value, what: str) -> str:
    """The name of an OTF2 enum value read from the definitions; a value the format does not define (a
    corrupted byte) raises TraceError naming the definition instead of a KeyError from the bindings."""
    names = getattr(type(value), "_names", {})
    if getattr(value, "value", None) not in names:
        raise TraceError(f"{path}: global definitions {path.with_suffix('.def').name}: {what} has "
                         f"{type(value).__name__} {getattr(value, 'value', value)!r}, which OTF2 does not define "
                         f"(the file is corrupt)")
    return names[value.value]


class _Reader:
    """State of one archive's import: definitions -> resources, events -> buffered columns."""

    def __init__(self, path: Path, sink: ImportSink, tr):
        self.path = path
        self.sink = sink
        self.tr = tr
        d = tr.definitions
        cp = d.clock_properties
        realtime = getattr(cp, "realtime_timestamp", UNDEFINED_TIMESTAMP)
        self.clock_anchor = "realtime" if realtime not in (None, UNDEFINED_TIMESTAMP) else "relative"
        self.clock = _Clock(cp.timer_resolution, cp.global_offset,
                            realtime if self.clock_anchor == "realtime" else None)
        self.cp = cp
        self.counts: Counter[str] = Counter()
        self._resources(d)
        self._regions(d)
        # spans
        self.stacks: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # loc -> [(span_id, region, start)]
        self.next_span = 1
        self.sp: dict[str, list] = {k: [] for k in ("span_id", "parent_id", "resource_id", "name", "start",
                                                  "end", "attrs")}
        self.last_time: dict[int, int] = {}
        # messages
        self.sends: list[tuple] = []      # (src_rank, dst_rank, comm, tag, seq_time, nbytes, mode, loc, req)
        self.recvs: list[tuple] = []
        self.isend_done: dict[tuple[int, int], int] = {}
        self.irecv_req: dict[tuple[int, int], int] = {}
        # metrics
        self.mt: dict[str, list] = {"ts": [], "resource_id": [], "name": [], "value": []}
        self.metric_names: dict[int, list[str]] = {}  # metric ref -> its members' metric names
        self.program: str | None = None

    # ---- definitions ----------------------------------------------------------------------
    def _resources(self, d) -> None:
        import otf2

        rows: list[dict[str, Any]] = []
        stn_id: dict[int, str] = {}
        stn_host: dict[int, str | None] = {}
        for node in d.system_tree_nodes:  # parents are defined before children
            ref = node._ref
            parent = node.parent._ref if node.parent is not None else None
            if (node.class_name or "").lower() == "node":
                rid, kind, host = f"host:{node.name}", "host", node.name
            else:
                rid, kind = f"otf2:stn:{ref}", "container"
                host = stn_host.get(parent) if parent is not None else None
            stn_id[ref], stn_host[ref] = rid, host
            rows.append({"resource_id": rid, "kind": kind, "name": f"{node.class_name} {node.name}".strip(),
                         "parent_id": stn_id.get(parent), "host": host,
                         "attrs": json.dumps({"otf2": "system_tree_node", "class": node.class_name})})
        # MPI rank of a location = its index in the MPI COMM_LOCATIONS group
        self.loc_rank: dict[int, int] = {}
        self.comm_locs: dict[int, list[int]] = {}
        mpi_locations = None
        for g in d.groups:
            if g.group_type == otf2.GroupType.COMM_LOCATIONS and g.paradigm == otf2.Paradigm.MPI:
                mpi_locations = [m._ref for m in g.members]
                self.loc_rank = {ref: i for i, ref in enumerate(mpi_locations)}
        for c in d.comms:
            g = c.group
            if g is None:
                continue
            members = []
            for m in g.members:
                if hasattr(m, "_ref"):
                    members.append(m._ref)
                elif mpi_locations is not None and 0 <= int(m) < len(mpi_locations):
                    members.append(mpi_locations[int(m)])
            self.comm_locs[c._ref] = members
        lg_id: dict[int, str] = {}
        lg_host: dict[int, str | None] = {}
        self.lg_of_loc: dict[int, int] = {}
        group_rank: dict[int, int] = {}
        for loc in d.locations:
            self.lg_of_loc[loc._ref] = loc.group._ref
            if loc._ref in self.loc_rank:
                group_rank.setdefault(loc.group._ref, self.loc_rank[loc._ref])
        for lg in d.location_groups:
            ref = lg._ref
            parent = lg.system_tree_parent._ref if lg.system_tree_parent is not None else None
            host = stn_host.get(parent)
            rank = group_rank.get(ref)
            if rank is not None:
                rid, kind = f"rank:{rank}", "rank"
            else:
                rid, kind = f"otf2:lg:{ref}", "process"
            lg_id[ref], lg_host[ref] = rid, host
            rows.append({"resource_id": rid, "kind": kind, "name": lg.name, "parent_id": stn_id.get(parent),
                         "host": host, "address": None if rank is None else str(rank),
                         "attrs": json.dumps({"otf2": "location_group", "id": ref,
                                              "type": "LocationGroupType." + _enum(
                                                  self.path, lg.location_group_type, f"location group {ref}")})})
        self.loc_rid: dict[int, str] = {}
        self.loc_host: dict[int, str | None] = {}
        self.rank_rid: dict[int, str] = {}  # location -> its rank (location group) resource
        for loc in d.locations:
            ref = loc._ref
            g = loc.group._ref
            rid = f"otf2:loc:{ref}"
            t = "LocationType." + _enum(self.path, loc.type, f"location {ref}")
            kind = "thread" if "THREAD" in t else ("device" if ("GPU" in t or "ACCELERATOR" in t) else "container")
            self.loc_rid[ref] = rid
            self.loc_host[ref] = lg_host.get(g)
            self.rank_rid[ref] = lg_id[g]
            rows.append({"resource_id": rid, "kind": kind, "name": f"{loc.group.name} / {loc.name}",
                         "parent_id": lg_id[g], "host": lg_host.get(g),
                         "attrs": json.dumps({"otf2": "location", "id": ref, "type": t,
                                              "events": loc.number_of_events})})
        self.sink.add("resources", rows)

    def _regions(self, d) -> None:
        self.region_name: dict[int, str] = {}
        self.region_attrs: dict[int, str] = {}
        for r in d.regions:
            name = r.name or r.canonical_name or f"region {r._ref}"  # the display name, as otf2-print shows
            self.region_name[r._ref] = name
            extra = {"region": r._ref, "paradigm": _enum(self.path, r.paradigm, f"region {r._ref} ({name!r})"),
                     "role": _enum(self.path, r.region_role, f"region {r._ref} ({name!r})")}
            if r.canonical_name and r.canonical_name != name:
                extra["canonical_name"] = r.canonical_name
            if r.source_file:
                extra["file"], extra["line"] = r.source_file, r.begin_line_number
            self.region_attrs[r._ref] = json.dumps(extra)[1:]  # '"region": ..}' after '{"depth": d, '

    # ---- events ---------------------------------------------------------------------------
    def run(self) -> None:
        from otf2.event_reader import BufferedEventReader

        reader = self

        from otf2.enums import Type
        from otf2.events import Metric

        union_field = {Type.UINT64: "unsigned_int", Type.INT64: "signed_int", Type.DOUBLE: "floating_point"}

        class RawEvents(BufferedEventReader):
            """Keeps events as raw (type, location, time, args): no per-event Python objects."""

            def _append(self, event_type, location_ref, time, _, attribute_list, *args):
                if event_type is Metric:
                    # the value unions are views of the library's one event buffer, which the next METRIC
                    # overwrites: read them now, inside the callback, not when the batch is consumed
                    metric_ref, type_ids, unions = args
                    args = (metric_ref, [getattr(u, union_field.get(t, "floating_point"))
                                         for t, u in zip(type_ids, unions)])
                self.buffer.append((event_type, location_ref, time, args))

        ev = RawEvents(self.tr, 10_000)
        total = sum(loc.number_of_events for loc in self.tr.definitions.locations)
        done = 0
        try:
            for etype, loc, time, args in ev:
                reader._event(etype, loc, time, args)
                done += 1
                if done % 100_000 == 0:
                    self.sink.advance(int(self.path.stat().st_size * done / max(total, 1)))
        except TraceError:
            raise
        except Exception as exc:
            where = _locate_bad_location(self.path, list(self.tr.definitions.locations))
            raise TraceError(f"{self.path}: OTF2 event data invalid or truncated after {done} events: "
                             f"{where} ({exc})") from None
        self._finish()

    def _event(self, etype, loc: int, time: int, args: tuple) -> None:
        name = etype.__name__
        self.counts[name] += 1
        self.last_time[loc] = time
        if name == "Enter":
            stack = self.stacks[loc]
            stack.append((self.next_span, args[0], time))
            self.next_span += 1
        elif name == "Leave":
            self._leave(loc, time, args[0])
        elif name == "MpiSend":
            self._send(loc, time, args[0], args[1], args[2], args[3], "send", None)
        elif name == "MpiIsend":
            self._send(loc, time, args[0], args[1], args[2], args[3], "isend", args[4])
        elif name == "MpiIsendComplete":
            self.isend_done[(loc, args[0])] = time
        elif name == "MpiRecv":
            self._recv(loc, time, args[0], args[1], args[2], args[3], "recv", None)
        elif name == "MpiIrecvRequest":
            self.irecv_req[(loc, args[0])] = time
        elif name == "MpiIrecv":
            self._recv(loc, time, args[0], args[1], args[2], args[3], "irecv", args[4])
        elif name == "Metric":
            self._metric(loc, time, args)
        elif name == "ProgramBegin" and self.program is None:
            self.program = self.tr.definitions.strings[args[0]]

    def _leave(self, loc: int, time: int, region: int) -> None:
        stack = self.stacks[loc]
        if not stack:
            self.sink.warn(f"{self.path}: location {loc}: LEAVE of {self.region_name.get(region)!r} at tick "
                           f"{time} without a matching ENTER; ignored")
            return
        if stack[-1][1] != region:
            names = [self.region_name.get(r) for _, r, _ in stack]
            if region not in [r for _, r, _ in stack]:
                self.sink.warn(f"{self.path}: location {loc}: LEAVE of {self.region_name.get(region)!r} at tick "
                               f"{time} does not match any open region {names}; ignored")
                return
            self.sink.warn(f"{self.path}: location {loc}: LEAVE of {self.region_name.get(region)!r} at tick "
                           f"{time} closes inner regions still open {names}; they end here too")
            while stack[-1][1] != region:
                self._close(loc, time, unclosed=True)
        self._close(loc, time)

    def _close(self, loc: int, time: int, unclosed: bool = False) -> None:
        stack = self.stacks[loc]
        span_id, region, start = stack.pop()
        sp = self.sp
        sp["span_id"].append(span_id)
        sp["parent_id"].append(stack[-1][0] if stack else None)
        sp["resource_id"].append(self.loc_rid[loc])
        sp["name"].append(self.region_name.get(region, f"region {region}"))
        sp["start"].append(start)
        sp["end"].append(time)
        extra = ', "unclosed": true' if unclosed else ""
        sp["attrs"].append(f'{{"depth": {len(stack)}{extra}, {self.region_attrs.get(region, "}")}')
        if len(sp["span_id"]) >= BATCH:
            self._flush_spans()

    def _flush_spans(self) -> None:
        sp = self.sp
        if not sp["span_id"]:
            return
        self.sink.add("spans", {
            "span_id": np.asarray(sp["span_id"], dtype=np.int64), "parent_id": sp["parent_id"],
            "resource_id": sp["resource_id"], "kind": ["call"] * len(sp["span_id"]), "name": sp["name"],
            "start_ns": self.clock.ns(sp["start"]), "end_ns": self.clock.ns(sp["end"]), "attrs": sp["attrs"]})
        for v in sp.values():
            v.clear()

    def _peer(self, comm: int, rank: int) -> int | None:
        members = self.comm_locs.get(comm)
        if members is None or not 0 <= rank < len(members):
            return None
        return members[rank]

    def _send(self, loc, time, receiver, comm, tag, length, mode, req) -> None:
        peer = self._peer(comm, receiver)
        if peer is None:
            self.sink.warn(f"{self.path}: location {loc}: {mode.upper()} at tick {time} to rank {receiver} of "
                           f"communicator {comm}, which has no such member; message skipped")
            return
        self.sends.append((loc, peer, comm, tag, time, length, mode, req))

    def _recv(self, loc, time, sender, comm, tag, length, mode, req) -> None:
        peer = self._peer(comm, sender)
        if peer is None:
            self.sink.warn(f"{self.path}: location {loc}: {mode.upper()} at tick {time} from rank {sender} of "
                           f"communicator {comm}, which has no such member; message skipped")
            return
        self.recvs.append((peer, loc, comm, tag, time, length, mode, req))

    def _metric(self, loc: int, time: int, args: tuple) -> None:
        metric_ref, values = args
        names = self.metric_names.get(metric_ref)
        if names is None:
            metric = self.tr.definitions.metrics[metric_ref]
            members = getattr(metric, "members", None) or metric.metric_class.members  # class or instance
            names = self.metric_names[metric_ref] = [f"otf2.{m.name}" for m in members]
        rid = self.loc_rid[loc]
        mt = self.mt
        for name, value in zip(names, values):
            mt["ts"].append(time)
            mt["resource_id"].append(rid)
            mt["name"].append(name)
            mt["value"].append(float(value))
        if len(mt["ts"]) >= BATCH:
            self._flush_metrics()

    def _flush_metrics(self) -> None:
        if not self.mt["ts"]:
            return
        n = len(self.mt["ts"])
        self.sink.add("metrics", {"ts_ns": self.clock.ns(self.mt["ts"]), "resource_id": self.mt["resource_id"],
                                  "namespace": ["performance"] * n, "name": self.mt["name"],
                                  "value": np.asarray(self.mt["value"], dtype=np.float64)})
        for v in self.mt.values():
            v.clear()

    # ---- end ------------------------------------------------------------------------------
    def _finish(self) -> None:
        open_spans = sum(len(s) for s in self.stacks.values())
        if open_spans:
            self.sink.warn(f"{self.path}: {open_spans} regions ENTERed but never LEFT; they end at their "
                           f"location's last event")
            for loc, stack in self.stacks.items():
                while stack:
                    self._close(loc, self.last_time.get(loc, stack[-1][2]), unclosed=True)
        self._flush_spans()
        self._flush_metrics()
        matched, unmatched_s, unmatched_r = self._messages()
        if unmatched_s or unmatched_r:
            self.sink.warn(f"{self.path}: {unmatched_s} sends and {unmatched_r} receives have no partner "
                           f"(matched by sender, receiver, communicator, tag, in order)")
        cp = self.cp
        defs = self.tr.definitions
        self.sink.set_meta(
            clock={"timer_resolution": int(cp.timer_resolution), "global_offset": int(cp.global_offset),
                   "trace_length": int(cp.trace_length), "anchor": self.clock_anchor},
            event_counts={_event_name(k): v for k, v in sorted(self.counts.items())},
            locations=len(self.loc_rid), messages_matched=matched, messages_unmatched_sends=unmatched_s,
            messages_unmatched_receives=unmatched_r,
            communicators={str(c._ref): c.name for c in defs.comms})
        fields: dict[str, Any] = {"start_ns": self.clock.one(cp.global_offset),
                                  "end_ns": self.clock.one(cp.global_offset + cp.trace_length)}
        if self.program:
            fields["command"] = self.program
        self.sink.set_run_fields(**fields)

    def _messages(self) -> tuple[int, int, int]:
        """Pair sends with receives: MPI's non-overtaking rule makes the n-th send from A to B on
        (communicator, tag) the n-th receive at B from A on the same (communicator, tag)."""
        import pandas as pd

        cols = ["src", "dst", "comm", "tag", "time", "nbytes", "mode", "req"]
        s = pd.DataFrame(self.sends, columns=cols)
        r = pd.DataFrame(self.recvs, columns=cols)
        if s.empty or r.empty:
            return 0, len(s), len(r)
        key = ["src", "dst", "comm", "tag"]
        s = s.sort_values("time", kind="stable")
        r = r.sort_values("time", kind="stable")
        s["seq"] = s.groupby(key, sort=False).cumcount()
        r["seq"] = r.groupby(key, sort=False).cumcount()
        m = s.merge(r, on=key + ["seq"], suffixes=("_s", "_r"))
        if m.empty:
            return 0, len(s), len(r)
        send_done = [self.isend_done.get((a, b)) if b is not None and b == b else None
                     for a, b in zip(m["src"], m["req_s"])]
        recv_req = [self.irecv_req.get((a, b)) if b is not None and b == b else None
                    for a, b in zip(m["dst"], m["req_r"])]
        attrs = []
        comm_name = {c._ref: c.name for c in self.tr.definitions.comms}
        for tag, comm, ms, mr, nr, sd, rq in zip(m["tag"], m["comm"], m["mode_s"], m["mode_r"], m["nbytes_r"],
                                                 send_done, recv_req):
            a = {"tag": int(tag), "comm": comm_name.get(comm, str(comm)), "send": ms, "recv": mr,
                 "recv_nbytes": int(nr)}
            if sd is not None:
                a["send_complete_ns"] = self.clock.one(sd)
            if rq is not None:
                a["recv_request_ns"] = self.clock.one(rq)
            attrs.append(json.dumps(a))
        self.sink.add("transfers", {
            "kind": ["mpi"] * len(m),
            "src_resource_id": [self.rank_rid[x] for x in m["src"]],
            "dst_resource_id": [self.rank_rid[x] for x in m["dst"]],
            "nbytes": m["nbytes_s"].to_numpy(np.int64),
            "start_ns": self.clock.ns(m["time_s"].to_numpy(np.uint64)),
            "end_ns": self.clock.ns(m["time_r"].to_numpy(np.uint64)),
            "attrs": attrs})
        return len(m), len(s) - len(m), len(r) - len(m)


def content_files(path: Path) -> list[Path]:
    """The files of the archive whose anchor file is ``path``: the anchor, its global definitions and the
    files of its folder of per-location definitions and events (what makes two archives the same)."""
    path = Path(path)
    folder = path.with_suffix("")
    members = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    defs = path.with_suffix(".def")
    return [path, *([defs] if defs.is_file() else []), *members]


def read(path: Path, sink: ImportSink) -> None:
    """Import the OTF2 archive whose anchor file is ``path`` (its .def and per-location files beside it)."""
    path = Path(path)
    try:
        import otf2  # noqa: F401
    except ImportError:
        raise TraceError(f"{path}: reading OTF2 needs the 'otf2' Python package (pip install 'flowscope[import]', or pip install otf2)") from None
    with _LibraryMessages.collect() as messages:
        try:
            _read(path, sink)
        except TraceError as exc:
            raise TraceError(f"{exc}{_said(messages)}") from None
    for m in dict.fromkeys(messages):  # the archive was read all the same
        sink.warn(f"{path}: the OTF2 library reported: {m}")


def _read(path: Path, sink: ImportSink) -> None:
    tr = _open(path)
    try:
        try:
            reader = _Reader(path, sink, tr)
        except TraceError:
            raise
        except Exception as exc:  # a corrupted definition the bindings accept but cannot resolve
            raise TraceError(f"{path}: global definitions {path.with_suffix('.def').name} are inconsistent "
                             f"(the file is corrupt): {type(exc).__name__}: {exc}") from None
        reader.run()
    finally:
        try:
            tr.close()
        except Exception:
            pass
