"""Paje traces (pajeng, StarPU, SimGrid, POTI): the generic self-defining format into the canonical tables.

Containers become resources, states spans (kind ``state``, nested by imbrication), links transfers,
variables metrics (one row per value change), events logs. The header's ``%EventDef`` blocks define
each event id's fields in any order; fields beyond the obligatory ones go to ``attrs``. The file is
read line by line; rows go out in batches, so memory holds only the open states, pending links and
containers. A trace that is not time-ordered is re-read and simulated after a stable sort by time
(external, in bounded memory) and a warning says so. Semantics follow pajeng's simulator (what
``pj_dump`` reports): a PajeSetState closes every open state of its type in its container; a
variable change at the same time as the previous one replaces it; destroying a container ends its
states and destroys its children (again and again: a second destruction is not an error); containers
never destroyed end at the trace's last time. Paje's implicit root container "0" is a resource, as
in pj_dump's dump (:data:`ROOT_RID`, kind ``root`` -- Paje reserves the type name "0" -- name "0", from
time 0), except in a trace that flowscope's exporter wrote, whose root is only the format's frame.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import ipc

from flowscope.importers import TraceError
from flowscope.importers.paje_format import FLOWSCOPE_MARK, TIME_LIMIT
from flowscope.importers.paje_format import LANE as _LANE
from flowscope.importers.paje_format import Unordered as _Unordered
from flowscope.importers.paje_format import split_fields as _split
from flowscope.importers.sink import ImportSink
from flowscope.model.schemas import schema

NAME = "paje"

#: what Paje states and containers mean (model/semantics.py): StarPU's worker states by value (a state named
#: after a codelet that carries a JobId is a task's execution; the zero-length marker before it is not), its
#: Worker containers execute; other Paje traces fall to the generic defaults (states as 'other')
SEMANTICS = {
    "source": "paje",
    "spans": [
        {"when": {"kind": "state", "name": ["Sleeping", "Idle"]}, "category": "idle", "role": "state"},
        {"when": {"kind": "state", "name": ["FetchingInput", "PushingOutput"]}, "category": "communication",
         "role": "state"},
        {"when": {"kind": "state", "name": ["Waiting task", "Waiting all tasks", "Blocked*", "Waiting*"]},
         "category": "wait", "role": "state"},
        {"when": {"kind": "state", "name": ["Overhead", "Scheduling", "Progressing", "Initializing",
                                            "Deinitializing", "Callback", "Building task", "Submitting task",
                                            "Freeing", "Allocating*", "Reclaiming", "Executing"]},
         "category": "runtime", "role": "state"},
        {"when": {"kind": "state", "attrs.paje_type": "Worker State", "attrs.JobId": "*"}, "category": "compute",
         "role": "task", "group": "name"},
        {"when": {"kind": "state", "attrs.paje_type": "Worker State"}, "category": "compute", "role": "state"},
    ],
    "resources": [
        {"when": {"kind": "Worker"}, "executes": True, "slots": 1},
        {"when": {"kind": ["Thread", "User Thread", "Memory Node", "Memory Manager", "Scheduler State", "Program",
                           "MPI Program", "root"]}, "executes": False},
    ],
}
#: rows collected per table before they are spooled
BATCH_ROWS = 100_000
#: timed events held in memory per sorted run when a trace must be sorted
SORT_CHUNK = 500_000
#: try the vectorised path (importers/paje_fast.py) first; FLOWSCOPE_PAJE_FAST=0 turns it off
FAST = os.environ.get("FLOWSCOPE_PAJE_FAST", "1") != "0"
#: the resource id of Paje's implicit root container "0"
ROOT_RID = "paje:0"
#: its kind (Paje reserves its type name "0": a kind "0" could not be exported)
ROOT_KIND = "root"

# obligatory fields per event (pajeng's strict definitions)
OBLIGATORY: dict[str, tuple[str, ...]] = {
    "PajeDefineContainerType": ("Name", "Type"),
    "PajeDefineStateType": ("Name", "Type"),
    "PajeDefineEventType": ("Name", "Type"),
    "PajeDefineVariableType": ("Name", "Type"),
    "PajeDefineLinkType": ("Name", "Type", "StartContainerType", "EndContainerType"),
    "PajeDefineEntityValue": ("Name", "Type"),
    "PajeCreateContainer": ("Time", "Name", "Type", "Container"),
    "PajeDestroyContainer": ("Time", "Name", "Type"),
    "PajeNewEvent": ("Time", "Type", "Container", "Value"),
    "PajeSetState": ("Time", "Type", "Container", "Value"),
    "PajePushState": ("Time", "Type", "Container", "Value"),
    "PajePopState": ("Time", "Type", "Container"),
    "PajeResetState": ("Time", "Type", "Container"),
    "PajeSetVariable": ("Time", "Type", "Container", "Value"),
    "PajeAddVariable": ("Time", "Type", "Container", "Value"),
    "PajeSubVariable": ("Time", "Type", "Container", "Value"),
    "PajeStartLink": ("Time", "Type", "Container", "Value", "StartContainer", "Key"),
    "PajeEndLink": ("Time", "Type", "Container", "Value", "EndContainer", "Key"),
    "PajeTraceFile": ("Filename",),
}
# fields the simulator reads; any other defined field is kept in attrs
KNOWN_FIELDS = {"Time", "Name", "Alias", "Type", "Container", "Value", "StartContainer", "EndContainer", "Key",
                "StartContainerType", "EndContainerType", "Color", "Filename"}
NUMERIC_TYPES = {"date", "double", "int", "hex"}
FIELD_TYPES = NUMERIC_TYPES | {"string", "color"}


def sniff(path: Path, head: bytes) -> bool:
    """A Paje trace starts (after comments and blank lines) with ``%EventDef`` definitions."""
    try:
        text = head.decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - sniff never raises
        return False
    for line in text.splitlines()[:200]:
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        return s.startswith("%") and "EventDef" in s
    return False


@dataclass
class EventDef:
    """One ``%EventDef``: the event's kind and its fields in order."""

    kind: str
    names: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    line: int = 0
    index: dict[str, int] = field(default_factory=dict)
    extras: list[tuple[str, int]] = field(default_factory=list)
    time_index: int = -1


@dataclass
class PType:
    """A Paje type (container, state, event, variable or link type)."""

    ident: str
    name: str
    kind: str
    parent: str | None
    values: dict[str, str] = field(default_factory=dict)


@dataclass
class Container:
    ident: str
    name: str
    rid: str
    kind: str
    parent_rid: str | None
    start: int
    attrs: dict[str, Any]
    end: int | None = None
    children: list[Container] = field(default_factory=list)
    #: open states per state type ident: a stack of [span id, value, start, depth, parent, def, tokens]
    states: dict[str, list[list]] = field(default_factory=dict)


class _Spool:
    """Output rows per table: collected as columns, spooled to Arrow IPC files in a temp dir, replayed
    into the sink only once the whole trace has been simulated (so a restart leaves no rows behind)."""

    def __init__(self, tmpdir: str):
        self.tmpdir = tmpdir
        self.cols: dict[str, dict[str, list]] = {}
        self.files: dict[str, tuple[str, Any, Any]] = {}
        self.counts: dict[str, int] = {}

    def row(self, table: str, **values: Any) -> None:
        cols = self.cols.get(table)
        if cols is None:
            cols = self.cols[table] = {f.name: [] for f in schema(table)}
        for k, lst in cols.items():
            lst.append(values.get(k))
        self.counts[table] = self.counts.get(table, 0) + 1
        if len(cols["attrs" if "attrs" in cols else "value"]) >= BATCH_ROWS:
            self._spill(table)

    def table(self, table: str, data: pa.Table) -> None:
        """Spool a whole Arrow table of rows (columns named as in the canonical schema)."""
        target = schema(table)
        n = data.num_rows
        data = pa.table({f.name: (data.column(f.name) if f.name in data.column_names else pa.nulls(n, f.type))
                         for f in target}).cast(target)
        self.counts[table] = self.counts.get(table, 0) + n
        if table not in self.files:
            path = os.path.join(self.tmpdir, f"{table}.arrow")
            sinkf = pa.OSFile(path, "wb")
            self.files[table] = (path, sinkf, ipc.new_file(sinkf, target))
        for batch in data.to_batches(max_chunksize=BATCH_ROWS * 4):
            self.files[table][2].write_batch(batch)

    def _spill(self, table: str) -> None:
        cols = self.cols.pop(table, None)
        if not cols:
            return
        target = schema(table)
        batch = pa.record_batch([pa.array(cols[f.name], type=f.type) for f in target], schema=target)
        if table not in self.files:
            path = os.path.join(self.tmpdir, f"{table}.arrow")
            sinkf = pa.OSFile(path, "wb")
            self.files[table] = (path, sinkf, ipc.new_file(sinkf, target))
        self.files[table][2].write_batch(batch)

    def replay(self, sink: ImportSink, whole: dict[str, Any] | None = None) -> None:
        """Hand every spooled row to ``sink``; ``whole`` maps a table to a function that gets all its rows
        at once and returns them (changed) before they go."""
        for table in list(self.cols):
            self._spill(table)
        for table, (path, f, writer) in self.files.items():
            writer.close()
            f.close()
            with pa.OSFile(path, "rb") as src:  # read, not mapped: mapped pages would count in the peak RSS
                reader = ipc.open_file(src)
                if whole and table in whole:
                    sink.add(table, whole[table](reader.read_all()))
                    continue
                for i in range(reader.num_record_batches):
                    sink.add(table, reader.get_batch(i))

    def close(self) -> None:
        for _, f, writer in self.files.values():
            with contextlib.suppress(Exception):  # already closed by replay
                writer.close()
                f.close()


class _Reader:
    """Parses and simulates one trace into a :class:`_Spool`."""

    def __init__(self, path: Path, sink: ImportSink, spool: _Spool, sorted_mode: bool):
        self.path = path
        self.sink = sink
        self.spool = spool
        self.sorted_mode = sorted_mode
        self.defs: dict[str, EventDef] = {}
        self.types: dict[str, PType] = {"0": PType("0", "0", "container", None)}
        self.type_names: dict[str, PType] = {}
        self.root = Container("0", "0", ROOT_RID, ROOT_KIND, None, 0, {"paje_type": "0"})
        self.containers: dict[str, Container] = {"0": self.root}
        self.container_names: dict[str, Container] = {}
        self.variables: dict[tuple[str, str], list] = {}
        self.links: dict[tuple[str, str], list] = {}
        self.used_keys: set[tuple[str, str]] = set()
        self.unit_ns: float | None = None
        self.unit_reason = ""
        self.origin_ns = 0
        self.flowscope = False
        self.last_t = float("-inf")
        self.max_t = float("-inf")
        self.min_t = float("inf")
        self.span_id = 0
        self.transfer_id = 0
        self.n = {"containers": 0, "states": 0, "events": 0, "links": 0, "variables": 0}
        self.unknown_value_warned: set[str] = set()
        self.include_stack: list[str] = []
        self.bytes_done = 0
        self.warned: dict[str, int] = {}
        self.timed_spool: list | None = None

    # ---- notes ----------------------------------------------------------------------------------
    def warn_once(self, key: str, message: str) -> None:
        n = self.warned.get(key, 0)
        self.warned[key] = n + 1
        if n == 0:
            self.sink.warn(message)

    # ---- lines ----------------------------------------------------------------------------------
    def lines(self, path: Path, where: str | None = None) -> Iterator[tuple[str, int, str]]:
        """Every line of ``path`` with PajeTraceFile includes expanded where they occur."""
        key = str(path.resolve())
        if key in self.include_stack:
            self.sink.warn(f"{where}: PajeTraceFile includes {path.name}, which is already being read "
                           f"(a cycle); not read again")
            return
        if not path.is_file():
            raise TraceError(f"{where}: field Filename: included file {str(path)!r} does not exist")
        self.include_stack.append(key)
        top = len(self.include_stack) == 1
        try:
            with open(path, "rb") as f:
                for n, raw in enumerate(f, 1):
                    if top:
                        self.bytes_done += len(raw)
                        if n % 200_000 == 0:
                            self.sink.advance(self.bytes_done)
                    yield str(path), n, raw.decode("utf-8", "replace")
        finally:
            self.include_stack.pop()

    # ---- the pass -------------------------------------------------------------------------------
    def run(self) -> None:
        """Read the whole trace; in sorted mode, collect the timed events, sort them, then simulate."""
        cur: EventDef | None = None
        cur_where = ""
        stack: list[Iterator[tuple[str, int, str]]] = [self.lines(self.path, str(self.path))]
        sorter = _ExternalSort(self.spool.tmpdir) if self.sorted_mode else None
        seq = 0
        while stack:
            try:
                fname, n, line = next(stack[-1])
            except StopIteration:
                stack.pop()
                continue
            where = f"{fname}:{n}"
            s = line.strip()
            if not s:
                continue
            c = s[0]
            if c == "#":
                m = FLOWSCOPE_MARK.match(s)
                if m and self.unit_ns is None:
                    self.mark_flowscope_export(int(m.group(1)))
                continue
            if c == "%":
                cur, cur_where = self._header_line(s, where, cur, cur_where)
                continue
            if cur is not None:
                raise TraceError(f"{cur_where}: %EventDef {cur.kind} is not closed by %EndEventDef "
                                 f"before {where}")
            toks = _split(s, where)
            d = self.defs.get(toks[0])
            if d is None:
                raise TraceError(f"{where}: unknown event id {toks[0]!r} (defined ids: "
                                 f"{', '.join(sorted(self.defs, key=lambda x: (len(x), x))) or 'none'})")
            if len(toks) != len(d.names):
                raise TraceError(f"{where}: event {toks[0]} ({d.kind}) has {len(toks) - 1} fields, its "
                                 f"definition at {d.line_where} has {len(d.names) - 1} "
                                 f"({', '.join(d.names[1:])})")
            if d.kind == "PajeTraceFile":
                inc = Path(toks[d.index["Filename"]])
                if not inc.is_absolute():
                    inc = Path(fname).parent / inc
                stack.append(self.lines(inc, where))
                continue
            if d.time_index < 0:
                self.dispatch(d, toks, where, 0.0)
                continue
            t = self._number(toks, d, d.time_index, where)
            if sorter is not None:
                seq += 1
                sorter.add(t, seq, where, s)
                continue
            if t < self.last_t:
                raise _Unordered(where, t, self.last_t)
            self.last_t = t
            self.dispatch(d, toks, where, t)
        if cur is not None:
            raise TraceError(f"{cur_where}: %EventDef {cur.kind} is not closed by %EndEventDef (file ends)")
        if sorter is not None:
            for t, _seq, where, s in sorter.merged():
                toks = _split(s, where)
                d = self.defs[toks[0]]
                self.last_t = t
                self.dispatch(d, toks, where, t)
        self.finish()

    def mark_flowscope_export(self, origin_ns: int) -> None:
        """The trace was written by flowscope's exporter: absolute times from ``origin_ns``, container
        aliases are resource ids, and the implicit root container is not a resource."""
        self.origin_ns = origin_ns
        self.flowscope = True
        self.root.rid = ""

    def _header_line(self, s: str, where: str, cur: EventDef | None, cur_where: str) -> tuple[EventDef | None, str]:
        body = s[1:].split()
        if not body:
            return cur, cur_where
        head = body[0]
        if head == "EventDef":
            if cur is not None:
                raise TraceError(f"{cur_where}: %EventDef {cur.kind} is not closed by %EndEventDef before {where}")
            if len(body) < 3:
                raise TraceError(f"{where}: %EventDef needs an event name and an id")
            kind, ident = body[1], body[2]
            if kind not in OBLIGATORY:
                raise TraceError(f"{where}: unknown event {kind!r} in %EventDef")
            d = EventDef(kind)
            d.line_where = where  # type: ignore[attr-defined]
            d.ident = ident  # type: ignore[attr-defined]
            d.names.append("__id__")
            d.types.append("id")
            return d, where
        if head == "EndEventDef":
            if cur is None:
                raise TraceError(f"{where}: %EndEventDef without %EventDef")
            missing = [f for f in OBLIGATORY[cur.kind] if f not in cur.index]
            if missing:
                raise TraceError(f"{cur_where}: the definition of {cur.kind} lacks obligatory field(s) "
                                 f"{', '.join(missing)} (it has {', '.join(cur.names[1:]) or 'none'})")
            cur.time_index = cur.index.get("Time", -1)
            ident = cur.ident  # type: ignore[attr-defined]
            if ident in self.defs:
                self.warn_once(f"redef:{ident}", f"{cur_where}: event id {ident} is defined again; the new "
                                                 f"definition replaces the earlier one")
            self.defs[ident] = cur
            return None, ""
        if cur is None:
            raise TraceError(f"{where}: field line {s!r} outside an %EventDef block")
        if len(body) < 2:
            raise TraceError(f"{where}: field line needs a name and a type")
        fname, ftype = body[0], body[1].lower()
        if ftype not in FIELD_TYPES:
            raise TraceError(f"{where}: field {fname}: unknown field type {body[1]!r} "
                             f"(known: {', '.join(sorted(FIELD_TYPES))})")
        if fname in cur.index:
            raise TraceError(f"{where}: field {fname} defined twice in {cur.kind}")
        cur.index[fname] = len(cur.names)
        cur.names.append(fname)
        cur.types.append(ftype)
        if fname not in KNOWN_FIELDS:
            cur.extras.append((fname, len(cur.names) - 1))
        return cur, cur_where

    def _number(self, toks: list[str], d: EventDef, i: int, where: str) -> float:
        try:
            v = float(toks[i])
        except ValueError:
            raise TraceError(f"{where}: field {d.names[i]} ({d.types[i]}): {toks[i]!r} is not a number") from None
        if i == d.time_index and not abs(self.origin_ns + v * 1e9) < TIME_LIMIT:  # also NaN
            raise TraceError(f"{where}: field Time: {toks[i]!r} is not a finite time within ±9.2e9 s of the origin (int64 nanoseconds)")
        return v

    # ---- simulation -----------------------------------------------------------------------------
    def ns(self, t: float) -> int:
        if self.unit_ns is None:
            self._decide_unit()
        return self.origin_ns + round(t * self.unit_ns)

    def _decide_unit(self) -> None:
        names = {t.name for t in self.types.values()}
        if not self.flowscope and {"Worker State", "Memory Node", "Program"} <= names:
            self.unit_ns, self.unit_reason = 1e6, "StarPU trace (starpu_fxt_tool writes milliseconds)"
        else:
            self.unit_ns, self.unit_reason = 1e9, "Paje times are seconds"

    def ptype(self, ident: str, where: str, fieldname: str, kind: str | None = None) -> PType:
        t = self.types.get(ident) or self.type_names.get(ident)
        if t is None:
            raise TraceError(f"{where}: field {fieldname}: unknown type {ident!r}")
        if kind is not None and t.kind != kind:
            raise TraceError(f"{where}: field {fieldname}: type {t.name!r} is a {t.kind} type, not a {kind} type")
        return t

    def container(self, ident: str, where: str, fieldname: str) -> Container:
        c = self.containers.get(ident) or self.container_names.get(ident)
        if c is None:
            raise TraceError(f"{where}: field {fieldname}: unknown container {ident!r} (not created before "
                             f"this line)")
        return c

    def extras(self, d: EventDef, toks: list[str], base: dict[str, Any]) -> str:
        for name, i in d.extras:
            base[name] = toks[i]
        return json.dumps(base)

    def dispatch(self, d: EventDef, toks: list[str], where: str, t: float) -> None:
        k = d.kind
        ix = d.index
        if k.startswith("PajeDefine"):
            self._define(d, toks, where)
            return
        self.max_t = max(self.max_t, t)
        self.min_t = min(self.min_t, t)
        if k in ("PajeSetState", "PajePushState", "PajePopState", "PajeResetState"):
            c = self.container(toks[ix["Container"]], where, "Container")
            ty = self.ptype(toks[ix["Type"]], where, "Type", "state")
            stack = c.states.setdefault(ty.ident, [])
            now = self.ns(t)
            if k in ("PajeSetState", "PajeResetState"):
                self._close(c, ty, stack, now, len(stack))
            if k == "PajePopState":
                if not stack:
                    raise TraceError(f"{where}: PajePopState of type {ty.name!r} in container {c.name!r} "
                                     f"with no state to pop")
                self._close(c, ty, stack, now, 1)
                return
            if k == "PajeResetState":
                return
            v = toks[ix["Value"]]
            v = ty.values.get(v, v)
            depth = len(stack)
            parent = stack[-1][0] if stack else None
            self.span_id += 1
            stack.append([self.span_id, v, now, depth, parent, d, toks])
            return
        if k in ("PajeSetVariable", "PajeAddVariable", "PajeSubVariable"):
            c = self.container(toks[ix["Container"]], where, "Container")
            ty = self.ptype(toks[ix["Type"]], where, "Type", "variable")
            v = self._number(toks, d, ix["Value"], where)
            now = self.ns(t)
            key = (c.ident, ty.ident)
            cur = self.variables.get(key)
            if cur is None:
                if k == "PajeSubVariable":
                    raise TraceError(f"{where}: PajeSubVariable on variable {ty.name!r} of container "
                                     f"{c.name!r}, which has no value yet")
                self.variables[key] = [now, v if k != "PajeSubVariable" else -v, c, ty]
                return
            base = cur[1]
            new = v if k == "PajeSetVariable" else base + v if k == "PajeAddVariable" else base - v
            if cur[0] == now:
                cur[1] = new
                return
            self._emit_variable(cur)
            self.variables[key] = [now, new, c, ty]
            return
        if k == "PajeNewEvent":
            c = self.container(toks[ix["Container"]], where, "Container")
            ty = self.ptype(toks[ix["Type"]], where, "Type", "event")
            v = toks[ix["Value"]]
            v = ty.values.get(v, v)
            self.n["events"] += 1
            self.spool.row("logs", ts_ns=self.ns(t), resource_id=c.rid or None, level="info", category=ty.name,
                           message=v, attrs=self.extras(d, toks, {"paje_type": ty.name}))
            return
        if k in ("PajeStartLink", "PajeEndLink"):
            self._link(d, toks, where, t, k == "PajeStartLink")
            return
        if k == "PajeCreateContainer":
            ty = self.ptype(toks[ix["Type"]], where, "Type", "container")
            pident = toks[ix["Container"]]
            parent = self.container(pident, where, "Container")
            name = toks[ix["Name"]]
            alias = toks[ix["Alias"]] if "Alias" in ix else ""
            ident = alias or name
            if ident in self.containers:
                raise TraceError(f"{where}: field {'Alias' if alias else 'Name'}: container {ident!r} already "
                                 f"exists")
            rid = ident if self.flowscope else f"paje:{ident}"
            attrs = {"paje_type": ty.name}
            if alias:
                attrs["paje_alias"] = alias
            for fname_, i in d.extras:
                attrs[fname_] = toks[i]
            c = Container(ident, name, rid, ty.name, parent.rid or None, self.ns(t), attrs)
            parent.children.append(c)
            self.containers[ident] = c
            self.container_names.setdefault(name, c)
            return
        if k == "PajeDestroyContainer":
            c = self.container(toks[ix["Name"]], where, "Name")
            if c.end is not None:
                self.warn_once("destroyed-again", f"{where}: container {c.name!r} is destroyed again; it keeps its "
                                                  f"first end, its children created since end here (as pj_dump)")
            self._destroy(c, self.ns(t))
            return

    def _define(self, d: EventDef, toks: list[str], where: str) -> None:
        ix = d.index
        k = d.kind
        tyname = toks[ix["Type"]]
        if k == "PajeDefineEntityValue":
            ty = self.ptype(tyname, where, "Type")
            name = toks[ix["Name"]]
            alias = toks[ix["Alias"]] if "Alias" in ix else ""
            ty.values[alias or name] = name
            ty.values.setdefault(name, name)
            return
        parent = self.ptype(tyname, where, "Type", "container")
        name = toks[ix["Name"]]
        alias = toks[ix["Alias"]] if "Alias" in ix else ""
        ident = alias or name
        if ident in self.types:
            raise TraceError(f"{where}: type {ident!r} is already defined")
        kind = {"PajeDefineContainerType": "container", "PajeDefineStateType": "state",
                "PajeDefineEventType": "event", "PajeDefineVariableType": "variable",
                "PajeDefineLinkType": "link"}[k]
        if kind == "link":
            for f in ("StartContainerType", "EndContainerType"):
                self.ptype(toks[ix[f]], where, f, "container")
        t = PType(ident, name, kind, parent.ident)
        self.types[ident] = t
        self.type_names.setdefault(name, t)

    def _close(self, c: Container, ty: PType, stack: list[list], now: int, n: int) -> None:
        for _ in range(n):
            sid, v, start, depth, parent, d, toks = stack.pop()
            self.n["states"] += 1
            attrs = {"paje_type": ty.name, "depth": depth}
            kind = "state"
            task_key = None
            if self.flowscope:
                kind = _LANE.sub("", ty.name)
                attrs = {}
            for name, i in d.extras:
                if name == "TaskKey":
                    task_key = toks[i] or None
                else:
                    attrs[name] = toks[i]
            self.spool.row("spans", span_id=sid, parent_id=parent, resource_id=c.rid or None, kind=kind, name=v,
                           start_ns=start, end_ns=now, task_key=task_key, attrs=json.dumps(attrs) if attrs else None)

    def _emit_variable(self, cur: list) -> None:
        ts, value, c, ty = cur
        self.n["variables"] += 1
        ns_, name = ("paje", ty.name)
        if self.flowscope and ":" in ty.name:
            ns_, name = ty.name.split(":", 1)
        self.spool.row("metrics", ts_ns=ts, resource_id=c.rid or None, namespace=ns_, name=name, value=float(value))

    def _link(self, d: EventDef, toks: list[str], where: str, t: float, start: bool) -> None:
        ix = d.index
        c = self.container(toks[ix["Container"]], where, "Container")
        ty = self.ptype(toks[ix["Type"]], where, "Type", "link")
        endpoint = self.container(toks[ix["StartContainer" if start else "EndContainer"]], where,
                                  "StartContainer" if start else "EndContainer")
        v = toks[ix["Value"]]
        v = ty.values.get(v, v)
        key = (c.ident, ty.ident, toks[ix["Key"]])
        now = self.ns(t)
        half = self.links.pop(key, None)
        if half is None:
            if key in self.used_keys:
                self.warn_once("key-reuse", f"{where}: link key {key[2]!r} of type {ty.name!r} was already used "
                                            f"by a complete link; treated as a new link (pj_dump refuses it)")
            self.links[key] = [start, now, endpoint, v, d, toks, where]
            return
        was_start, then, other, v0, d0, toks0, where0 = half
        if was_start == start:
            raise TraceError(f"{where}: a second {'PajeStartLink' if start else 'PajeEndLink'} with key "
                             f"{key[2]!r} (the first is at {where0})")
        if v0 != v:
            self.warn_once("link-value", f"{where}: link {key[2]!r} has value {v!r} here and {v0!r} at {where0}")
        self.used_keys.add(key)
        s_t, s_c, s_d, s_toks = (now, endpoint, d, toks) if start else (then, other, d0, toks0)
        e_t, e_c, e_d, e_toks = (then, other, d0, toks0) if start else (now, endpoint, d, toks)
        self.n["links"] += 1
        self.transfer_id += 1
        attrs: dict[str, Any] = {"paje_type": ty.name, "value": v, "key": key[2], "container": c.name}
        for name, i in s_d.extras:
            attrs[name] = s_toks[i]
        for name, i in e_d.extras:
            attrs.setdefault(name, e_toks[i])
        kind = v if self.flowscope else "paje-link"
        self.spool.row("transfers", transfer_id=self.transfer_id, kind=kind, src_resource_id=s_c.rid or None,
                       dst_resource_id=e_c.rid or None, start_ns=s_t, end_ns=e_t, attrs=json.dumps(attrs))

    def _destroy(self, top: Container, now: int) -> None:
        """End ``top`` and every container below it not ended yet (their open states end too)."""
        todo = [top]
        while todo:
            c = todo.pop()
            todo.extend(c.children)
            if c.end is not None:
                continue
            c.end = now
            for tid, stack in c.states.items():
                if stack:
                    self._close(c, self.types[tid], stack, now, len(stack))
            if not c.rid:  # the root of a flowscope export: the format's frame, not a resource
                continue
            self.n["containers"] += 1
            start = self.origin_ns if c is self.root else c.start
            self.spool.row("resources", resource_id=c.rid, kind=c.kind, name=c.name, parent_id=c.parent_rid,
                           start_ns=start, end_ns=now, attrs=json.dumps(c.attrs))

    def finish(self) -> None:
        end = self.ns(self.max_t) if self.max_t > float("-inf") else self.origin_ns
        self._destroy(self.root, end)
        late = [(c, len(st)) for c in self.containers.values() for st in c.states.values() if st]
        if late:
            self.sink.warn(f"{sum(n for _, n in late)} state(s) set after their container was destroyed (e.g. in "
                           f"{late[0][0].name!r}) never end; not imported (pj_dump leaves them out too)")
        for cur in self.variables.values():
            self._emit_variable(cur)
        self.variables.clear()
        if self.links:
            first = min(h[6] for h in self.links.values())
            self.sink.warn(f"{len(self.links)} link(s) never completed (a PajeStartLink without its PajeEndLink or "
                           f"the reverse), e.g. at {first}; not imported (pj_dump refuses such a trace)")
        for key, n in self.warned.items():
            if n > 1:
                self.sink.warn(f"{n - 1} more warning(s) like the one above ({key.split(':')[0]})")
        if self.unit_ns is None:
            self._decide_unit()


class _ExternalSort:
    """A stable sort by time of (time, seq, where, line) records, in sorted runs on disk when large."""

    def __init__(self, tmpdir: str):
        self.tmpdir = tmpdir
        self.buf: list[tuple[float, int, str, str]] = []
        self.runs: list[str] = []

    def add(self, t: float, seq: int, where: str, line: str) -> None:
        self.buf.append((t, seq, where, line))
        if len(self.buf) >= SORT_CHUNK:
            self._spill()

    def _spill(self) -> None:
        self.buf.sort(key=lambda r: (r[0], r[1]))
        path = os.path.join(self.tmpdir, f"sort-{len(self.runs):05d}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f"{t!r}\t{seq}\t{where}\t{line}\n" for t, seq, where, line in self.buf)
        self.runs.append(path)
        self.buf = []

    @staticmethod
    def _read(path: str) -> Iterator[tuple[float, int, str, str]]:
        with open(path, encoding="utf-8") as f:
            for row in f:
                t, seq, where, line = row.rstrip("\n").split("\t", 3)
                yield float(t), int(seq), where, line

    def merged(self) -> Iterator[tuple[float, int, str, str]]:
        if not self.runs:
            self.buf.sort(key=lambda r: (r[0], r[1]))
            yield from self.buf
            return
        self._spill()
        yield from heapq.merge(*(self._read(p) for p in self.runs), key=lambda r: (r[0], r[1]))


def _starpu_beside(path: Path, reader: _Reader, sink: ImportSink):
    """When StarPU's tasks.rec sits beside the trace: a function that turns the states showing its tasks into
    task spans (and adds the DAG's dependencies to ``sink``); None otherwise."""
    from flowscope.importers import starpu

    if reader.flowscope:
        return None
    rec = starpu.records_beside(path)
    if rec is None:
        return None
    origin = reader.origin_ns

    def to_ns(ms: float) -> int:  # tasks.rec is in milliseconds whatever unit the trace was read in
        return origin + round(ms * 1e6)

    def spans(table: pa.Table) -> pa.Table:
        table, deps = starpu.annotate(table, rec, to_ns, sink.warn)
        if len(deps):
            sink.add("dependencies", pa.Table.from_pandas(deps, preserve_index=False))
        n_tasks = pc.sum(pc.equal(table.column("kind"), "task")).as_py() or 0
        sink.set_meta(starpu={"tasks_rec": rec.tasks_path.name, "dag": rec.dag_path.name if rec.dag_path else None,
                              "edges_from": rec.edges_from, "tasks": len(rec.tasks), "tasks_matched": n_tasks,
                              "dependencies": len(deps)})
        return table

    return spans


def read(path: Path, sink: ImportSink) -> None:
    """Read the Paje trace at ``path`` (and the files it includes) into ``sink``; StarPU's tasks.rec and
    dag.dot beside it, when there, give its tasks and their dependencies (:mod:`flowscope.importers.starpu`)."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="flowscope-paje-") as tmp:
        fast = None
        fallback = "off (FLOWSCOPE_PAJE_FAST=0)"
        if FAST:
            from flowscope.importers.paje_fast import Fallback, read_fast

            unordered = None
            for sorted_mode in (False, True):
                spool = _Spool(tempfile.mkdtemp(dir=tmp))
                reader = _Reader(path, sink, spool, sorted_mode=sorted_mode)
                try:
                    notes = read_fast(reader, unordered)
                    reader.sink = sink
                    for w in notes:
                        sink.warn(w)
                    fast = "vectorised"
                    break
                except _Unordered as exc:  # read again, sorted (only raised when not in sorted mode)
                    spool.close()
                    unordered = _Unordered(exc.where, exc.t, exc.prev)  # not its traceback: it holds the chunks
                except (Fallback, TraceError, ValueError, KeyError, IndexError, pa.ArrowException) as exc:
                    # anything unusual: the line simulator reads the file and reports what is wrong where
                    spool.close()
                    fast = None
                    fallback = f"{type(exc).__name__}: {exc}"[:300]
                    break
        if fast is None:
            spool = _Spool(tempfile.mkdtemp(dir=tmp))
            reader = _Reader(path, sink, spool, sorted_mode=False)
            try:
                reader.run()
            except _Unordered as exc:
                spool.close()
                sink.warn(f"{exc.where}: the trace is not time-ordered (time {exc.t!r} after {exc.prev!r}); it was "
                          f"imported after a stable sort of its events by time (pj_dump refuses traces whose events "
                          f"go back in time within a container and type)")
                spool = _Spool(tempfile.mkdtemp(dir=tmp))
                reader = _Reader(path, sink, spool, sorted_mode=True)
                reader.run()
        starpu = _starpu_beside(path, reader, sink)
        spool.replay(sink, {"spans": starpu} if starpu else None)
        spool.close()
    sink.advance(path.stat().st_size)
    sink.set_meta(time_unit="ms" if reader.unit_ns == 1e6 else "s", time_unit_reason=reader.unit_reason,
                  time_origin="flowscope export origin (absolute)" if reader.flowscope else
                  "trace start (Paje times are relative; ns counted from the epoch's zero)",
                  time_origin_ns=reader.origin_ns, paje_counts=dict(reader.n),
                  event_definitions=len(reader.defs), types=len(reader.types) - 1,
                  sorted_by_time=reader.sorted_mode, read_path=fast or "line simulator")
    if fast is None:
        sink.set_meta(vectorised_path_not_used=fallback)
    if reader.max_t > float("-inf"):
        sink.set_run_fields(start_ns=reader.ns(min(reader.min_t, 0.0) if not reader.flowscope else reader.min_t),
                            end_ns=reader.ns(reader.max_t))
