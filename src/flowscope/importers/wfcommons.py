"""Read a WfCommons WfFormat instance (schema 1.4 or 1.5) into the canonical tables.

Tasks become spans, the task DAG becomes dependencies, machines become host resources, files
become data states and each task's reading of inputs and writing of outputs becomes mutations.

WfFormat records each task's runtime but not when it started. The importer therefore places
every task at its as-soon-as-possible (ASAP) start: the latest end of its parents (and of the
producers of its input files), counted from ``executedAt``. Every span and derived data state says
so in its attrs (``"time_source": "derived-asap"``), and run.json carries ``task_times:
"durations-only"``. Durations and dependencies are exact; absolute start times are not measured.
docs/formats/wfcommons.md explains the mapping and its limits.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.importers.sink import ImportSink
from flowscope.model.identifiers import host_id

NAME = "wfcommons"

#: what a WfCommons instance means (model/semantics.py): each task a unit of work grouped by its category,
#: run on a machine that executes as many at once as it has cores
SEMANTICS = {
    "source": "wfcommons",
    "spans": [{"when": {"kind": "task"}, "category": "compute", "role": "task", "group": "name"}],
    "resources": [{"when": {"kind": "host"}, "executes": True, "slots": "attrs.cpu_cores"}],
}
SUPPORTED_VERSIONS = ("1.4", "1.5")
TIME_SOURCE = "derived-asap"
#: location of files no task of the instance produced (they existed before the run started)
INPUT_LOCATION = "shared-fs"
#: resource of tasks whose machine the instance does not name, when it lists several machines
UNASSIGNED = "host:wfcommons-unassigned"

_PEGASUS_ID = re.compile(r"_ID\d+$")
#: executedAt as WfCommons' Pegasus and Makeflow parsers write it, e.g. "12-19-20T21:31:53Z" (month first)
_MDY = "%m-%d-%yT%H:%M:%S%z"
#: the largest time, in seconds, a runtime or makespan may have (its ns must fit int64 with room for a sum)
MAX_SECONDS = 1e9
_INT64_MAX = 2**63 - 1


def _error(path: Path, msg: str) -> Exception:
    from flowscope.importers import TraceError  # the package imports this module lazily

    return TraceError(f"{path}: {msg}")


# ---- detection -------------------------------------------------------------------------------
def sniff(path: Path, head: bytes) -> bool:
    """Whether ``head`` looks like a WfFormat instance: a JSON object with a ``workflow`` member and
    WfFormat's own keys (``schemaVersion``, ``makespanInSeconds``, ``runtimeInSeconds``, ...)."""
    text = head.lstrip()
    if not text.startswith(b"{") or b'"workflow"' not in head or b'"traceEvents"' in head:
        return False
    marks = (b'"schemaVersion"', b'"makespanInSeconds"', b'"runtimeInSeconds"', b'"inputFiles"',
             b'"runtimeSystem"', b'"wms"', b'"executedAt"')
    return sum(m in head for m in marks) >= 2


# ---- dates -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instant:
    """A parsed WfFormat date: nanoseconds since the UTC epoch, the form it was written in, and
    whether the text had no zone (then UTC is assumed)."""

    ns: int
    form: str
    assumed_utc: bool


def parse_timestamp(text: str) -> Instant:
    """Parse a WfFormat ``executedAt`` / ``createdAt`` value.

    Accepted: ISO 8601 extended or basic form, with or without fraction and zone
    (``2023-03-29T10:02:36-10:00``, ``2020-04-13T11:44:18.284754Z``, ``20200413T165420+0000``,
    ``2020-12-30T02:24:13.540715``) and WfCommons' month-first short form ``MM-DD-YYTHH:MM:SSZ``.
    A value without a zone is read as UTC (``assumed_utc``). ValueError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"not a date: {text!r}")
    s = text.strip()
    dt: datetime | None = None
    form = ""
    try:
        dt = datetime.fromisoformat(s)
        form = "iso8601-basic" if re.match(r"^\d{8}T", s) else "iso8601"
    except ValueError:
        for fmt, name in ((_MDY, "mm-dd-yy"), (_MDY[:-2], "mm-dd-yy")):
            try:
                dt = datetime.strptime(s, fmt)
                form = name
                break
            except ValueError:
                continue
    if dt is None:
        raise ValueError(f"unrecognised date format: {text!r}")
    naive = dt.tzinfo is None
    if naive:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    ns = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
    return Instant(ns, form, naive)


# ---- the instance, normalised across schema versions -----------------------------------------
@dataclass
class _Task:
    key: str                       # the id other tasks refer to it by
    name: str
    category: str
    runtime_ns: int
    runtime_s: float
    parents: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    machine: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Instance:
    version: str
    tasks: list[_Task]
    files: dict[str, int | None]   # file id -> size (insertion order = first mention)
    machines: list[dict]
    executed_at: Any
    makespan: Any
    runtime_system: dict | None
    warnings: list[str]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Reader:
    """Checks field types while normalising, so every complaint names the file, task and field."""

    def __init__(self, path: Path):
        self.path = path
        self.warnings: list[str] = []

    def fail(self, msg: str) -> Exception:
        return _error(self.path, msg)

    def obj(self, v: Any, where: str) -> dict:
        if not isinstance(v, dict):
            raise self.fail(f"{where} must be an object, got {type(v).__name__}")
        return v

    def arr(self, v: Any, where: str) -> list:
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.fail(f"{where} must be an array, got {type(v).__name__}")
        return v

    def string(self, v: Any, where: str) -> str:
        if not isinstance(v, str) or not v:
            raise self.fail(f"{where} must be a non-empty string, got {json.dumps(v)[:60]}")
        return v

    def strings(self, v: Any, where: str) -> list[str]:
        items = self.arr(v, where)
        if all(type(x) is str and x for x in items):  # the common case, without a message per item
            return list(items)
        return [self.string(x, f"{where}[{i}]") for i, x in enumerate(items)]

    def number(self, v: Any, where: str, *, required: bool = False, minimum: float | None = None,
               maximum: float | None = None) -> float | None:
        if v is None:
            if required:
                raise self.fail(f"{where} is missing")
            return None
        if not _is_number(v):
            raise self.fail(f"{where} must be a number, got {type(v).__name__} {json.dumps(v)[:60]}")
        if not math.isfinite(v):
            raise self.fail(f"{where} must be a finite number, got {v}")
        if minimum is not None and v < minimum:
            raise self.fail(f"{where} must be >= {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise self.fail(f"{where} must be <= {maximum:g}, got {v:g}")
        return v

    def integer(self, v: Any, where: str) -> int | None:
        """A non-negative int64 (a byte count); an integral float such as 1024.0 is accepted."""
        n = self.number(v, where, minimum=0, maximum=_INT64_MAX)
        if n is None:
            return None
        if n != int(n):
            raise self.fail(f"{where} must be an integer, got {n}")
        return int(n)

    def runtime(self, t: dict, where: str) -> tuple[float, int]:
        key = "runtimeInSeconds" if "runtimeInSeconds" in t else "runtime"
        rt = self.number(t.get(key), f"{where}.{key}", required=True, minimum=0, maximum=MAX_SECONDS)
        return float(rt), round(rt * 1e9)

    def task_attrs(self, t: dict, where: str) -> dict[str, Any]:
        """The execution facts of one task, under flowscope's attr names."""
        out: dict[str, Any] = {}
        for src, dst in (("coreCount", "cores"), ("cores", "cores"), ("avgCPU", "avg_cpu_percent"),
                         ("readBytes", "read_bytes"), ("writtenBytes", "written_bytes"),
                         ("memoryInBytes", "memory_bytes"), ("energyInKWh", "energy_kwh"),
                         ("energy", "energy_kwh"), ("avgPowerInW", "avg_power_w"), ("avgPower", "avg_power_w"),
                         ("priority", "priority")):
            if src in t:
                out[dst] = self.number(t[src], f"{where}.{src}")
        cmd = t.get("command")
        if cmd is not None:
            cmd = self.obj(cmd, f"{where}.command")
            out["command"] = {"program": cmd.get("program"),
                              "arguments": [str(a) for a in self.arr(cmd.get("arguments"), f"{where}.command.arguments")]}
        return out

    def machine_of(self, t: dict, where: str) -> str | None:
        ms = t.get("machines")
        if ms is not None:
            names = self.strings(ms, f"{where}.machines")
            if len(names) > 1:
                self.warnings.append(f"{self.path}: {where} lists {len(names)} machines; "
                                     f"its span is placed on the first, {names[0]!r}")
            return names[0] if names else None
        if t.get("machine") is not None:
            return self.string(t["machine"], f"{where}.machine")
        return None


def _category(name: str, explicit: Any) -> str:
    if isinstance(explicit, str) and explicit:
        return explicit
    return _PEGASUS_ID.sub("", name) or name


def _read_15(r: _Reader, doc: dict, version: str) -> _Instance:
    wf = r.obj(doc.get("workflow"), "workflow")
    spec = r.obj(wf.get("specification"), "workflow.specification")
    execution = r.obj(wf.get("execution"), "workflow.execution")
    exec_by_id: dict[str, dict] = {}
    for i, et in enumerate(r.arr(execution.get("tasks"), "workflow.execution.tasks")):
        et = r.obj(et, f"workflow.execution.tasks[{i}]")
        exec_by_id[r.string(et.get("id"), f"workflow.execution.tasks[{i}].id")] = et
    files: dict[str, int | None] = {}
    for i, f in enumerate(r.arr(spec.get("files"), "workflow.specification.files")):
        if type(f) is dict and type(fid := f.get("id")) is str and fid and \
                ((size := f.get("sizeInBytes")) is None or (type(size) is int and 0 <= size <= _INT64_MAX)):
            files[fid] = size  # the common case, checked without building messages
            continue
        f = r.obj(f, f"workflow.specification.files[{i}]")
        fid = r.string(f.get("id"), f"workflow.specification.files[{i}].id")
        files[fid] = r.integer(f.get("sizeInBytes"), f"file {fid!r} (workflow.specification.files[{i}]).sizeInBytes")
    tasks: list[_Task] = []
    for i, st in enumerate(r.arr(spec.get("tasks"), "workflow.specification.tasks")):
        where = f"workflow.specification.tasks[{i}]"
        st = r.obj(st, where)
        tid = r.string(st.get("id"), f"{where}.id")
        where = f"task {tid!r} ({where})"
        name = r.string(st.get("name", tid), f"{where}.name")
        et = exec_by_id.pop(tid, None)
        if et is None:
            raise r.fail(f"{where} has no entry in workflow.execution.tasks (no runtime)")
        ewhere = f"task {tid!r} (workflow.execution.tasks)"
        rt_s, rt_ns = r.runtime(et, ewhere)
        tasks.append(_Task(
            key=tid, name=name, category=_category(name, st.get("category")), runtime_ns=rt_ns, runtime_s=rt_s,
            parents=r.strings(st.get("parents"), f"{where}.parents"),
            children=r.strings(st.get("children"), f"{where}.children"),
            inputs=r.strings(st.get("inputFiles"), f"{where}.inputFiles"),
            outputs=r.strings(st.get("outputFiles"), f"{where}.outputFiles"),
            machine=r.machine_of(et, ewhere), attrs=r.task_attrs(et, ewhere)))
    for tid in exec_by_id:
        r.warnings.append(f"{r.path}: workflow.execution.tasks has task {tid!r} that the specification lacks; "
                          f"ignored")
    machines = [r.obj(m, f"workflow.execution.machines[{i}]")
                for i, m in enumerate(r.arr(execution.get("machines"), "workflow.execution.machines"))]
    return _Instance(version, tasks, files, machines, execution.get("executedAt"),
                     execution.get("makespanInSeconds"), doc.get("runtimeSystem") or doc.get("wms"), r.warnings)


def _read_14(r: _Reader, doc: dict, version: str) -> _Instance:
    wf = r.obj(doc.get("workflow"), "workflow")
    raw = [r.obj(t, f"workflow.tasks[{i}]") for i, t in enumerate(r.arr(wf.get("tasks"), "workflow.tasks"))]
    # Schema 1.4 tasks refer to their parents by name (the id is a bare "ID0000001"); the name is
    # the key, and a reference that matches only an id is resolved through it.
    keys = [r.string(t.get("name") or t.get("id"), f"workflow.tasks[{i}].name") for i, t in enumerate(raw)]
    by_id = {t["id"]: k for t, k in zip(raw, keys) if isinstance(t.get("id"), str)}
    known = set(keys)

    def resolve(refs: list[str]) -> list[str]:
        return [x if x in known else by_id.get(x, x) for x in refs]

    files: dict[str, int | None] = {}
    tasks: list[_Task] = []
    for i, (t, key) in enumerate(zip(raw, keys)):
        where = f"task {key!r} (workflow.tasks[{i}])"
        rt_s, rt_ns = r.runtime(t, where)
        inputs: list[str] = []
        outputs: list[str] = []
        for j, f in enumerate(r.arr(t.get("files"), f"{where}.files")):
            fwhere = f"{where}.files[{j}]"
            f = r.obj(f, fwhere)
            fid = r.string(f.get("name"), f"{fwhere}.name")
            if isinstance(f.get("path"), str):
                fid = f["path"] + fid
            size = r.integer(f.get("sizeInBytes", f.get("size")), f"{fwhere}.sizeInBytes")
            if fid in files and size is not None and files[fid] is not None and files[fid] != size:
                r.warnings.append(f"{r.path}: {fwhere}: file {fid!r} has size {size} here and {files[fid]} "
                                  f"elsewhere; the first is kept")
            elif files.get(fid) is None:
                files[fid] = size
            link = str(f.get("link", "")).lower()
            if link == "input":
                inputs.append(fid)
            elif link == "output":
                outputs.append(fid)
            else:
                raise r.fail(f"{fwhere}.link must be 'input' or 'output', got {f.get('link')!r}")
        attrs = r.task_attrs(t, where)
        if isinstance(t.get("type"), str):
            attrs["type"] = t["type"]
        if isinstance(t.get("id"), str):
            attrs["wf_id"] = t["id"]
        tasks.append(_Task(
            key=key, name=key, category=_category(key, t.get("category")), runtime_ns=rt_ns, runtime_s=rt_s,
            parents=resolve(r.strings(t.get("parents"), f"{where}.parents")),
            children=resolve(r.strings(t.get("children"), f"{where}.children")),
            inputs=inputs, outputs=outputs, machine=r.machine_of(t, where), attrs=attrs))
    machines = [r.obj(m, f"workflow.machines[{i}]") for i, m in enumerate(r.arr(wf.get("machines"), "workflow.machines"))]
    return _Instance(version, tasks, files, machines, wf.get("executedAt"), wf.get("makespanInSeconds"),
                     doc.get("wms") or doc.get("runtimeSystem"), r.warnings)


def load(path: Path) -> tuple[dict, _Instance]:
    """The instance's JSON document and its normalised tasks, files and machines; TraceError on
    malformed JSON (with line, column and offset) or a field of the wrong type (with task and field)."""
    data = Path(path).read_bytes()
    try:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:  # the standard library says where, and reads what orjson refuses (NaN)
            doc = json.loads(data)
    except UnicodeDecodeError as exc:
        raise _error(path, f"not UTF-8 text at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise _error(path, f"invalid JSON at line {exc.lineno} column {exc.colno} (character {exc.pos} "
                           f"of {len(exc.doc)}): {exc.msg}") from None
    r = _Reader(path)
    doc = r.obj(doc, "the top-level value")
    version = str(doc.get("schemaVersion", ""))
    wf = r.obj(doc.get("workflow"), "workflow")
    if "specification" in wf:
        reader = _read_15
    elif "tasks" in wf:
        reader = _read_14
    else:
        raise r.fail("workflow has neither 'specification' (schema 1.5) nor 'tasks' (schema 1.4)")
    if version not in SUPPORTED_VERSIONS:
        r.warnings.append(f"{path}: schemaVersion {version!r} is not one of {', '.join(SUPPORTED_VERSIONS)}; "
                          f"read with the schema {'1.5' if reader is _read_15 else '1.4'} layout it has")
    return doc, reader(r, doc, version)


# ---- the schedule ----------------------------------------------------------------------------
def asap_schedule(keys: list[str], runtimes_ns: list[int], preds: dict[str, set[str]]) -> dict[str, tuple[int, int]]:
    """Each task's (start, end) offset in ns when it starts as soon as all of ``preds`` have ended.

    Raises graphlib.CycleError when the predecessors form a cycle."""
    rt = dict(zip(keys, runtimes_ns))
    out: dict[str, tuple[int, int]] = {}
    for k in TopologicalSorter({k: preds.get(k, ()) for k in keys}).static_order():
        start = max((out[p][1] for p in preds.get(k, ())), default=0)
        out[k] = (start, start + rt[k])
    return out


# ---- read ------------------------------------------------------------------------------------
def _dumps(d: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in d.items() if v is not None}, separators=(",", ":"))


def _plain(v: Any) -> str | int | float | None:
    """``v`` when it is text or a finite number (what a descriptive field may hold), else None."""
    if isinstance(v, str) or (_is_number(v) and math.isfinite(v)):
        return v
    return None


def _mutations(tasks: list[_Task], code: dict[str, int], files: pa.Array) -> tuple[pa.Table, int]:
    """The mutations table (every input x output pair of each task, inputs first, ids ``<task key>#<n>``) and
    the number of tasks that read without writing. The pairs are built as columns: per task only its file
    codes and one attrs string are made in Python, the rows (a task's ins x outs) by numpy and Arrow."""
    ins_flat: list[int] = []
    outs_flat: list[int] = []
    nin: list[int] = []
    nout: list[int] = []
    keys: list[str] = []
    kinds: list[str] = []
    attrs: list[str] = []
    no_outputs = 0
    for t in tasks:
        outs = list(dict.fromkeys(t.outputs))
        written = set(outs)
        ins = [f for f in dict.fromkeys(t.inputs) if f not in written]
        if ins and not outs:
            no_outputs += 1
        if not ins or not outs:
            continue
        ins_flat.extend(map(code.__getitem__, ins))
        outs_flat.extend(map(code.__getitem__, outs))
        nin.append(len(ins))
        nout.append(len(outs))
        keys.append(t.key)
        kinds.append("MERGE" if len(ins) > 1 else ("SPLIT" if len(outs) > 1 else "CONVERT"))
        attrs.append(_dumps({"task_key": t.key, "group": t.category, "time_source": TIME_SOURCE}))
    ni, no = np.array(nin, np.int64), np.array(nout, np.int64)
    pairs = ni * no
    task = np.repeat(np.arange(len(keys), dtype=np.int64), pairs)      # the task of each row
    n = np.arange(len(task), dtype=np.int64) - np.repeat(np.cumsum(pairs) - pairs, pairs)  # its number in the task
    width = no[task]
    src = np.asarray(ins_flat, np.int64)[(np.cumsum(ni) - ni)[task] + n // width]
    dst = np.asarray(outs_flat, np.int64)[(np.cumsum(no) - no)[task] + n % width]
    task_rows = pa.array(task)
    key_col = pa.array(keys, pa.string()).take(task_rows)
    return pa.table({
        "mutation_id": pc.binary_join_element_wise(key_col, pc.cast(pa.array(n), pa.string()), "#"),
        "src_state_id": files.take(pa.array(src)), "dst_state_id": files.take(pa.array(dst)),
        "kind": pa.array(kinds, pa.string()).take(task_rows), "application": key_col,
        "attrs": pa.array(attrs, pa.string()).take(task_rows),
    }), no_outputs


def _machine_resource(m: dict, declared: bool) -> dict:
    name = m["nodeName"]
    cpu = m.get("cpu") if isinstance(m.get("cpu"), dict) else {}
    attrs = {"system": m.get("system"), "architecture": m.get("architecture"), "release": m.get("release"),
             "cpu_cores": cpu.get("coreCount", cpu.get("count")),
             "cpu_speed_mhz": cpu.get("speedInMHz", cpu.get("speed")), "cpu_vendor": cpu.get("vendor"),
             "memory_bytes": m.get("memoryInBytes")}
    attrs = {k: _plain(v) for k, v in attrs.items()}
    if not declared:
        attrs["declared"] = False
    return {"resource_id": host_id(name), "kind": "host", "name": name, "host": name, "attrs": _dumps(attrs)}


def read(path: Path, sink: ImportSink) -> None:
    """Import one WfFormat instance into ``sink`` (see the module docstring for the mapping)."""
    path = Path(path)
    doc, inst = load(path)
    for w in inst.warnings:
        sink.warn(w)
    size = path.stat().st_size
    sink.advance(size // 2)

    graph_id = doc.get("name") if isinstance(doc.get("name"), str) else path.stem
    if inst.executed_at is None:
        field = "workflow.execution.executedAt" if "execution" in (doc.get("workflow") or {}) else "workflow.executedAt"
        raise _error(path, f"{field} is missing (the run has no start time)")
    try:
        executed = parse_timestamp(inst.executed_at)
    except ValueError as exc:
        raise _error(path, f"executedAt: {exc}") from None
    t0 = executed.ns
    if not 0 <= t0 < 2**62:
        raise _error(path, f"executedAt {inst.executed_at!r} is outside the years 1970-2116 that int64 ns hold")
    makespan = _Reader(path).number(inst.makespan, "makespanInSeconds", minimum=0, maximum=MAX_SECONDS)
    tasks = inst.tasks
    if not tasks:
        raise _error(path, "the instance has no tasks")
    by_key: dict[str, _Task] = {}
    for t in tasks:
        if t.key in by_key:
            raise _error(path, f"task id {t.key!r} appears twice")
        by_key[t.key] = t

    # -- dependencies: parents and children lists, union (they normally mirror each other)
    edges: dict[tuple[str, str], None] = {}
    for t in tasks:
        for p in t.parents:
            if p not in by_key:
                sink.warn(f"{path}: task {t.key!r}: parent {p!r} is not a task of the instance; edge dropped")
            elif p == t.key:
                sink.warn(f"{path}: task {t.key!r} lists itself as parent; edge dropped")
            else:
                edges[(p, t.key)] = None
        for c in t.children:
            if c not in by_key:
                sink.warn(f"{path}: task {t.key!r}: child {c!r} is not a task of the instance; edge dropped")
            elif c != t.key:
                edges[(t.key, c)] = None

    # -- files: producers, consumers; a file a task both reads and writes is an update, not an input
    producer: dict[str, str] = {}
    consumers: dict[str, int] = {}
    undeclared: list[str] = []
    for t in tasks:
        for f in t.outputs:
            if f in producer and producer[f] != t.key:
                sink.warn(f"{path}: file {f!r} is written by tasks {producer[f]!r} and {t.key!r}; "
                          f"its data state's origin is the first")
                continue
            producer.setdefault(f, t.key)
        for f in t.inputs:
            consumers[f] = consumers.get(f, 0) + 1
        for f in (*t.inputs, *t.outputs):
            if f not in inst.files:
                inst.files[f] = None
                undeclared.append(f)
    if undeclared:
        sink.warn(f"{path}: {len(undeclared)} file(s) used by tasks are missing from the file list (no size), "
                  f"e.g. {undeclared[0]!r}")

    preds: dict[str, set[str]] = {k: set() for k in by_key}
    for p, c in edges:
        preds[c].add(p)
    implied = 0
    for t in tasks:
        for f in t.inputs:
            p = producer.get(f)
            if p is not None and p != t.key and p not in preds[t.key]:
                preds[t.key].add(p)
                implied += 1
    if implied:
        sink.warn(f"{path}: {implied} task(s) read a file whose producer is not among their parents; "
                  f"the derived schedule makes them wait for the producer")
    try:
        sched = asap_schedule([t.key for t in tasks], [t.runtime_ns for t in tasks], preds)
    except CycleError as exc:
        cycle = " -> ".join(map(str, exc.args[1])) if len(exc.args) > 1 else "?"
        raise _error(path, f"the task graph has a cycle: {cycle}") from None
    last = max(end for _, end in sched.values())
    if t0 + last > _INT64_MAX:
        raise _error(path, f"the derived schedule lasts {last / 1e9:g} s, beyond what int64 ns hold")

    # -- resources
    machine_names: dict[str, dict] = {}
    for i, m in enumerate(inst.machines):
        if not isinstance(m.get("nodeName"), str) or not m["nodeName"]:
            raise _error(path, f"machines[{i}].nodeName must be a non-empty string")
        machine_names.setdefault(m["nodeName"], m)
    resources = [_machine_resource(m, True) for m in machine_names.values()]
    only = next(iter(machine_names)) if len(machine_names) == 1 else None
    unassigned = False
    for t in tasks:
        if t.machine is not None:
            t.attrs["machine_source"] = "task"
            if t.machine not in machine_names:
                machine_names[t.machine] = {"nodeName": t.machine}
                resources.append(_machine_resource(machine_names[t.machine], False))
        elif only is not None:
            t.machine = only
            t.attrs["machine_source"] = "only-machine"
        else:
            t.attrs["machine_source"] = "unknown"
            unassigned = True
    if unassigned:
        resources.append({"resource_id": UNASSIGNED, "kind": "host", "name": "machine not recorded",
                          "attrs": _dumps({"declared": False})})
        sink.warn(f"{path}: some tasks name no machine and the instance lists {len(inst.machines)} machines; "
                  f"they are placed on {UNASSIGNED!r}")
    sink.add("resources", resources)

    # -- spans
    starts = [t0 + sched[t.key][0] for t in tasks]
    ends = [t0 + sched[t.key][1] for t in tasks]
    sink.add("spans", {
        "span_id": list(range(len(tasks))),
        "resource_id": [host_id(t.machine) if t.machine else UNASSIGNED for t in tasks],
        "kind": ["task"] * len(tasks),
        "name": [t.category for t in tasks],
        "start_ns": starts,
        "end_ns": ends,
        "task_key": [t.key for t in tasks],
        "attrs": [_dumps({"time_source": TIME_SOURCE, "task_name": t.name, "category": t.category,
                          "runtime_s": t.runtime_s, "machine": t.machine, **t.attrs}) for t in tasks],
    })
    sink.add("dependencies", {"graph_id": [graph_id] * len(edges), "task_key": [c for _, c in edges],
                              "depends_on": [p for p, _ in edges]})

    # -- data states: a file is one state, at its producer's machine when its producer ends
    end_of = {t.key: t0 + sched[t.key][1] for t in tasks}
    machine_of = {t.key: t.machine for t in tasks}
    fids = list(inst.files)
    ts, origin, location, sattrs = [], [], [], []
    state_attrs = {(src, role): _dumps({"time_source": src, "role": role})  # eight distinct strings, made once
                   for src in ("run-start", TIME_SOURCE) for role in ("intermediate", "output", "input", "unused")}
    for f in fids:
        p = producer.get(f)
        role = ("intermediate" if consumers.get(f) else "output") if p else ("input" if consumers.get(f) else "unused")
        origin.append(p)
        if p is None:
            ts.append(t0)
            location.append(INPUT_LOCATION)
            sattrs.append(state_attrs["run-start", role])
        else:
            ts.append(end_of[p])
            location.append(machine_of[p] or "unknown")
            sattrs.append(state_attrs[TIME_SOURCE, role])
    sink.add("data_states", {"state_id": fids, "label": [posixpath.basename(f.rstrip("/")) or f for f in fids],
                             "size_bytes": [inst.files[f] for f in fids], "ts_ns": ts, "origin": origin,
                             "location": location, "attrs": sattrs})

    # -- mutations: every (input, output) pair of a task; the kind follows the task's cardinality
    mutations, no_outputs = _mutations(tasks, {f: i for i, f in enumerate(fids)}, pa.array(fids, pa.string()))
    sink.add("mutations", mutations)

    # -- run metadata
    asap_ns = max(sched[t.key][1] for t in tasks)
    meta: dict[str, Any] = {
        "instance": graph_id, "schema_version": inst.version, "description": doc.get("description"),
        "task_times": "durations-only", "time_source": TIME_SOURCE,
        "executed_at": inst.executed_at, "executed_at_ns": t0, "executed_at_form": executed.form,
        "executed_at_assumed_utc": executed.assumed_utc,
        "makespan_s": makespan, "asap_makespan_s": asap_ns / 1e9,
        "tasks": len(tasks), "edges": len(edges), "files": len(fids), "machines": len(machine_names),
        "mutations": mutations.num_rows, "tasks_reading_without_writing": no_outputs,
    }
    if isinstance(doc.get("createdAt"), str):
        meta["created_at"] = doc["createdAt"]
        try:
            c = parse_timestamp(doc["createdAt"])
            meta["created_at_ns"], meta["created_at_assumed_utc"] = c.ns, c.assumed_utc
        except ValueError:
            sink.warn(f"{path}: createdAt {doc['createdAt']!r} is not a date flowscope reads; kept as text")
    rs = inst.runtime_system if isinstance(inst.runtime_system, dict) else {}
    meta["wms"] = {k: _plain(rs.get(k)) for k in ("name", "version", "url") if _plain(rs.get(k)) is not None} or None
    if isinstance(doc.get("author"), dict):
        meta["author"] = {k: v for k, v in doc["author"].items() if isinstance(v, str)}
    wf = doc.get("workflow") or {}
    for k, out in (("repo", "repo"), ("runName", "run_name")):
        if isinstance(wf.get(k), str):
            meta[out] = wf[k]
    sink.set_meta(**{k: v for k, v in meta.items() if v is not None})
    end = t0 + (round(makespan * 1e9) if makespan is not None else asap_ns)
    sink.set_run_fields(start_ns=t0, end_ns=max(end, t0 + asap_ns), task_times="durations-only",
                        time_source=TIME_SOURCE)
    sink.advance(size)
