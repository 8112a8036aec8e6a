"""Write a run as Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing open.

Each process- or host-level resource becomes a pid and each resource that has records (thread,
worker, scheduler, ...) a tid inside its process, both named by ``M`` metadata events. Spans are
``X`` slices (a resource whose spans overlap without nesting gets extra numbered tracks, since a
viewer's thread track must nest); transfers are flow arrows (``s`` on the source, ``f`` on the
destination); metrics are ``C`` counters; logs, and anomalies when the run has an ``anomalies``
table, are ``i`` instants. Timestamps are microseconds from the run's earliest record with
nanosecond decimals; the origin (epoch ns) is kept in the top-level ``flowscope`` object, and each
event carries what flowscope needs to read the file back to the same rows (``args.flowscope``).
The file is written event by event (docs/formats/chrome-perfetto.md).
"""

from __future__ import annotations

import gc
import gzip
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

NAME = "perfetto"
SUFFIX = ".perfetto.json"

#: resource kinds that become a pid (the rest become a tid inside the nearest such ancestor)
PROCESS_KINDS = {"process", "host", "rank", "container", "device"}
BATCH = 65_536
#: DuckDB's memory limit while it sorts a table for export (it spills to a temp folder beyond it)
SORT_MEMORY = "4GB"
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode


def _us(ns: int, origin: int) -> str:
    """Nanoseconds since the origin as exact decimal microseconds."""
    d = ns - origin
    sign = "-" if d < 0 else ""
    q, r = divmod(abs(d), 1000)
    return f"{sign}{q}.{r:03d}" if r else f"{sign}{q}"


def _attrs(s: str | None) -> dict:
    if not s:
        return {}
    try:
        v = json.loads(s)
    except ValueError:
        return {"attrs": s}
    return v if isinstance(v, dict) else {"attrs": v}


class _Tracks:
    """pid/tid numbering of resources, and the M events that name them."""

    def __init__(self, resources: pa.Table, emit):
        self.res = {r["resource_id"]: r for r in resources.to_pylist()}
        self.emit = emit
        self.pids: dict[str, int] = {}         # group resource id -> pid
        self.used_pids: set[int] = set()
        self.tids: dict[tuple[str, int], tuple[int, int]] = {}  # (resource id, lane) -> (pid, tid)
        self.used_tids: dict[int, set[int]] = {}
        self.next_synthetic = 1 << 22

    def _fresh(self, want: Any, used: set[int]) -> int:
        if isinstance(want, int) and want > 0 and want not in used:
            used.add(want)
            return want
        while self.next_synthetic in used:
            self.next_synthetic += 1
        used.add(self.next_synthetic)
        return self.next_synthetic

    def group(self, rid: str) -> str:
        """The process- or host-level resource ``rid`` is shown under."""
        seen = set()
        cur = rid
        while cur in self.res and cur not in seen:
            seen.add(cur)
            r = self.res[cur]
            if r["kind"] in PROCESS_KINDS:
                return cur
            parent = r.get("parent_id")
            if not parent or parent not in self.res:
                return cur
            cur = parent
        return cur

    def _describe(self, rid: str) -> dict:
        r = self.res.get(rid) or {"resource_id": rid, "kind": rid.split(":", 1)[0] or "resource"}
        return {k: r.get(k) for k in ("resource_id", "kind", "name", "parent_id", "host", "address", "attrs")
                if r.get(k) is not None}

    def pid(self, rid: str) -> int:
        g = self.group(rid)
        p = self.pids.get(g)
        if p is None:
            r = self.res.get(g, {})
            p = self.pids[g] = self._fresh(r.get("pid"), self.used_pids)
            self.used_tids[p] = set()
            name = r.get("name") or g
            if r.get("kind") and r.get("kind") not in ("process",):
                name = f"{r['kind']} {name}"
            self.emit({"ph": "M", "pid": p, "tid": 0, "name": "process_name",
                       "args": {"name": name, "flowscope": self._describe(g)}})
            self.emit({"ph": "M", "pid": p, "tid": 0, "name": "process_sort_index",
                       "args": {"sort_index": len(self.pids)}})
        return p

    def track(self, rid: str, lane: int = 0) -> tuple[int, int]:
        """(pid, tid) of lane ``lane`` of resource ``rid``."""
        t = self.tids.get((rid, lane))
        if t is not None:
            return t
        p = self.pid(rid)
        r = self.res.get(rid, {})
        want = p if rid == self.group(rid) and lane == 0 else (r.get("tid") if lane == 0 else None)
        tid = self._fresh(want, self.used_tids[p])
        self.tids[(rid, lane)] = (p, tid)
        name = r.get("name") or rid
        if r.get("kind") and r["kind"] != "thread":
            name = f"{r['kind']} {name}"
        if lane:
            name = f"{name} #{lane + 1}"
        self.emit({"ph": "M", "pid": p, "tid": tid, "name": "thread_name",
                   "args": {"name": name, "flowscope": self._describe(rid)}})
        self.emit({"ph": "M", "pid": p, "tid": tid, "name": "thread_sort_index",
                   "args": {"sort_index": len(self.tids)}})
        return p, tid


def _show(args: dict, fs: dict, key: str, value: Any) -> None:
    """Show a column in the viewer's args panel, remembering that flowscope added it (not an attr)."""
    if key not in args:
        args[key] = value
        fs.setdefault("added", []).append(key)


def _batches(run, query: str) -> Iterator[pa.RecordBatch]:
    yield from run.connection().sql(query).to_arrow_reader(BATCH)


def write(run, out_path: Path) -> dict:
    """Write ``run`` to ``out_path`` as Chrome trace-event JSON (gzip when the name has ``.gz``);
    returns the number of events written per kind."""
    out_path = Path(out_path)
    origin_q = " UNION ALL ".join(f"SELECT min({c}) AS t FROM {t}" for t, c in
                                  (("spans", "start_ns"), ("transfers", "start_ns"), ("metrics", "ts_ns"),
                                   ("logs", "ts_ns")))
    origin = run.sql_arrow(f"SELECT min(t) AS t FROM ({origin_q})").column("t")[0].as_py()
    if origin is None:
        origin = run.meta.get("start_ns") or 0
    counts = {"spans": 0, "flows": 0, "counters": 0, "instants": 0, "anomalies": 0, "metadata": 0}
    opener = gzip.open if ".gz" in out_path.suffixes else open
    con = run.connection()
    old_limit = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    # the event dicts are short-lived and acyclic: cycle collections would only rescan what is alive
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with tempfile.TemporaryDirectory(prefix="flowscope-perfetto-") as tmp:
            spill = str(Path(tmp) / "duckdb").replace("'", "''")
            con.execute(f"SET memory_limit = '{SORT_MEMORY}'")
            con.execute(f"SET temp_directory = '{spill}'")
            with opener(out_path, "wt", encoding="utf-8") as f:
                _write(run, f, origin, counts)
    finally:
        con.execute(f"SET memory_limit = '{old_limit}'")
        if gc_was_enabled:
            gc.enable()
    return counts


def _write(run, f: IO[str], origin: int, counts: dict) -> None:
    meta = run.meta
    head = {"displayTimeUnit": "ns",
            "flowscope": {"time_origin_ns": int(origin), "run_id": meta.get("run_id"), "name": meta.get("name"),
                          "format": 1}}
    f.write(_dumps(head)[:-1] + ',"traceEvents":[\n')
    first = [True]

    def emit(event: dict) -> None:
        f.write(("" if first[0] else ",\n") + _dumps(event))
        first[0] = False
        if event["ph"] == "M":
            counts["metadata"] += 1

    def emit_text(events: list[str], what: str) -> None:
        """Write events already formatted as JSON text, counted as ``what``."""
        if events:
            f.write(("" if first[0] else ",\n") + ",\n".join(events))
            first[0] = False
            counts[what] += len(events)

    tracks = _Tracks(run.arrow("resources"), emit)

    # spans, per resource in time order, longest first, so nesting and lanes are decided in one pass
    cur, lanes = None, []
    for b in _batches(run, "SELECT resource_id, kind, name, start_ns, end_ns, task_key, attrs FROM spans "
                           "ORDER BY resource_id, start_ns, end_ns DESC"):
        out = []
        for rid, kind, name, s, e, tk, attrs in zip(*(b.column(i).to_pylist() for i in range(7))):
            if rid != cur:
                cur, lanes = rid, []
            lane = None
            for k, stack in enumerate(lanes):
                while stack and stack[-1] <= s:
                    stack.pop()
                if not stack or e <= stack[-1]:
                    lane = k
                    break
            if lane is None:
                lane = len(lanes)
                lanes.append([])
            lanes[lane].append(e)
            pid, tid = tracks.track(rid, lane)
            args = _attrs(attrs)
            fs: dict[str, Any] = {"kind": kind}
            if tk is not None:
                fs["task_key"] = tk
                _show(args, fs, "task_key", tk)
            args["flowscope"] = fs
            out.append(f'{{"ph":"X","pid":{pid},"tid":{tid},"ts":{_us(s, origin)},"dur":{_us(e, s)},'
                       f'"name":{_dumps(name)},"cat":{_dumps(kind)},"args":{_dumps(args)}}}')
        emit_text(out, "spans")

    # transfers as flow arrows from the source resource to the destination
    n = 0
    for b in _batches(run, "SELECT kind, src_resource_id, dst_resource_id, nbytes, start_ns, end_ns, keys, attrs "
                           "FROM transfers ORDER BY start_ns"):
        for kind, src, dst, nbytes, s, e, keys, attrs in zip(*(b.column(i).to_pylist() for i in range(8))):
            n += 1
            sp, st = tracks.track(src)
            dp, dt = tracks.track(dst)
            args = _attrs(attrs)
            fs = {"kind": kind}
            if nbytes is not None:
                fs["nbytes"] = nbytes
                _show(args, fs, "nbytes", nbytes)
            if keys is not None:
                fs["keys"] = keys
            args["flowscope"] = fs
            emit({"ph": "s", "pid": sp, "tid": st, "ts": _num(s, origin), "id": n, "cat": "transfer",
                  "name": kind, "args": args})
            emit({"ph": "f", "bp": "e", "pid": dp, "tid": dt, "ts": _num(e, origin), "id": n, "cat": "transfer",
                  "name": kind})
    counts["flows"] = n

    # metrics as counters: one track per process and name; a resource below the process adds its id
    for b in _batches(run, "SELECT ts_ns, resource_id, namespace, name, value FROM metrics "
                           "ORDER BY resource_id, namespace, name, ts_ns"):
        out = []
        for ts, rid, ns, name, value in zip(*(b.column(i).to_pylist() for i in range(5))):
            pid = tracks.pid(rid)
            ident = "" if tracks.group(rid) == rid else f',"id":{_dumps(rid)}'
            out.append(f'{{"ph":"C","pid":{pid},"tid":0,"ts":{_us(ts, origin)},"name":{_dumps(name)},'
                       f'"cat":{_dumps(ns)}{ident},"args":{{"value":{_dumps(value) if value == value else "null"}}}}}')
        emit_text(out, "counters")

    # logs as instants on their resource (global when they have none)
    for b in _batches(run, "SELECT ts_ns, resource_id, level, category, message, task_key, attrs FROM logs "
                           "ORDER BY ts_ns"):
        for ts, rid, level, cat, msg, tk, attrs in zip(*(b.column(i).to_pylist() for i in range(7))):
            args = _attrs(attrs)
            fs = {"level": level, "category": cat}
            _show(args, fs, "level", level)
            if tk is not None:
                fs["task_key"] = tk
                _show(args, fs, "task_key", tk)
            args["flowscope"] = fs
            ev = {"ph": "i", "ts": _num(ts, origin), "name": msg if msg is not None else cat, "cat": cat,
                  "args": args}
            if rid is None:
                ev.update(s="g", pid=0, tid=0)
            else:
                ev["pid"], ev["tid"] = tracks.track(rid)
                ev["s"] = "t"
            emit(ev)
            counts["instants"] += 1

    _anomalies(run, emit, tracks, origin, counts)
    f.write("\n]}\n")


def _num(ns: int, origin: int) -> float | int:
    """Microseconds from the origin as a JSON number (ns decimals)."""
    d = ns - origin
    return d // 1000 if d % 1000 == 0 else d / 1000


def _anomalies(run, emit, tracks: _Tracks, origin: int, counts: dict) -> None:
    """Anomalies (a derived table some runs have) as instants; nothing when the run has none."""
    folder = Path(run.path) / "anomalies"
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    for path in files:
        for b in pq.ParquetFile(path).iter_batches(BATCH):
            for row in b.to_pylist():
                ts = row.get("ts_ns", row.get("start_ns"))
                if ts is None:
                    continue
                rid = row.get("resource_id")
                name = row.get("name") or row.get("function") or "anomaly"
                ev = {"ph": "i", "ts": _num(int(ts), origin), "name": f"anomaly: {name}", "cat": "anomaly",
                      "args": {k: v for k, v in row.items() if v is not None}}
                if rid:
                    ev["pid"], ev["tid"] = tracks.track(rid)
                    ev["s"] = "t"
                else:
                    ev.update(s="g", pid=0, tid=0)
                emit(ev)
                counts["anomalies"] += 1
