"""Write a run as a Paje trace that pajeng's ``pj_dump`` accepts.

Resources become containers (their nesting kept; one container type per resource kind under each
parent type), spans PajePushState/PajePopState states (one state type per span kind; spans that
overlap without nesting go to extra state types ``<kind>~2``, ``<kind>~3``... so every stack nests),
transfers links (their kind as the value), metrics variables (``namespace:name``), logs events (the
category as the event type, the message as the value). Times are seconds relative to the run's
start, written with nine decimals (exact nanoseconds); a leading comment records the origin so that
flowscope's Paje importer restores absolute times and the original resource ids.

The run is streamed: spans come from DuckDB in record batches ordered by resource, kind and time, a
pass assigns them to lanes and writes their push/pop records (text built per batch with Arrow
compute) to a Parquet temp file; DuckDB then merges those with links, variables and events, sorts
all by time (spilling to disk past its memory limit) and the lines are written batch by batch.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

NAME = "paje"
SUFFIX = ".paje"

HEADER = """\
%EventDef PajeDefineContainerType 0
% Alias string
% Type string
% Name string
%EndEventDef
%EventDef PajeDefineStateType 1
% Alias string
% Type string
% Name string
%EndEventDef
%EventDef PajeDefineEventType 2
% Alias string
% Type string
% Name string
%EndEventDef
%EventDef PajeDefineVariableType 3
% Alias string
% Type string
% Name string
%EndEventDef
%EventDef PajeDefineLinkType 4
% Alias string
% Type string
% StartContainerType string
% EndContainerType string
% Name string
%EndEventDef
%EventDef PajeCreateContainer 5
% Time date
% Alias string
% Type string
% Container string
% Name string
%EndEventDef
%EventDef PajeDestroyContainer 6
% Time date
% Type string
% Name string
%EndEventDef
%EventDef PajePushState 7
% Time date
% Type string
% Container string
% Value string
% TaskKey string
%EndEventDef
%EventDef PajePopState 8
% Time date
% Type string
% Container string
%EndEventDef
%EventDef PajeSetVariable 9
% Time date
% Type string
% Container string
% Value double
%EndEventDef
%EventDef PajeNewEvent 10
% Time date
% Type string
% Container string
% Value string
%EndEventDef
%EventDef PajeStartLink 11
% Time date
% Type string
% Container string
% Value string
% StartContainer string
% Key string
%EndEventDef
%EventDef PajeEndLink 12
% Time date
% Type string
% Container string
% Value string
% EndContainer string
% Key string
%EndEventDef
"""

# order of records at one instant: containers appear first, disappear last
_CREATE, _BODY, _DESTROY = 0, 1, 2
#: rows per record batch read from or written to DuckDB
BATCH = 200_000
#: DuckDB's memory limit while sorting the records (it spills to a temp folder beyond it)
SORT_MEMORY = "4GB"

_REC_SCHEMA = pa.schema([("t", pa.int64()), ("phase", pa.int8()), ("grp", pa.int64()), ("seq", pa.int64()),
                         ("code", pa.string()), ("tail", pa.string())])


def q(s: Any) -> str:
    """A Paje string field: always quoted; Paje has no escapes, so a double quote becomes a single one."""
    text = "" if s is None else str(s)
    return '"' + text.replace('"', "'").replace("\n", " ").replace("\r", " ") + '"'


def _q_arrow(a: pa.Array) -> pa.Array:
    """:func:`q` of every value of a string array."""
    a = pc.fill_null(a.cast(pa.string()), "")
    for old, new in (('"', "'"), ("\n", " "), ("\r", " ")):
        a = pc.replace_substring(a, old, new)
    return pc.binary_join_element_wise('"', a, '"', "")


def _q_sql(col: str) -> str:
    """:func:`q` as a DuckDB expression."""
    return (f"('\"' || replace(replace(replace(coalesce(CAST({col} AS VARCHAR), ''), '\"', ''''), "
            f"chr(10), ' '), chr(13), ' ') || '\"')")


class _Types:
    """Paje types created on demand, each defined once, in the order first needed."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ids: dict[tuple, str] = {}

    def get(self, key: tuple, line_for: Any) -> str:
        alias = self.ids.get(key)
        if alias is None:
            alias = self.ids[key] = f"T{len(self.ids) + 1}"
            self.lines.append(line_for(alias))
        return alias


def write(run: Any, out: str | Path) -> dict[str, int]:
    """Write ``run`` (a :class:`flowscope.store.run.Run`) to ``out`` as a Paje trace; returns counts of
    containers, states, links, variables and events written (and spans skipped)."""
    con = run.connection()
    old_limit = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    with tempfile.TemporaryDirectory(prefix="flowscope-paje-") as tmp:
        spill = str(Path(tmp) / "duckdb").replace("'", "''")
        con.execute(f"SET memory_limit = '{SORT_MEMORY}'")
        old_order = con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
        con.execute(f"SET temp_directory = '{spill}'")
        con.execute("SET preserve_insertion_order = false")  # lets the sort spill instead of failing
        try:
            return _write(run, con, Path(out), Path(tmp))
        finally:
            con.execute(f"SET memory_limit = '{old_limit}'")
            con.execute(f"SET preserve_insertion_order = {str(old_order).lower()}")


def _write(run: Any, con: Any, out: Path, tmp: Path) -> dict[str, int]:
    res = run.arrow("resources").to_pylist()
    # every resource referenced anywhere gets a container, alive from its first to its last record
    known = {r["resource_id"]: r for r in res}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    used = con.execute("""
        SELECT rid, min(t0), max(t1) FROM (
            SELECT resource_id AS rid, start_ns AS t0, end_ns AS t1 FROM spans WHERE end_ns >= start_ns
            UNION ALL SELECT src_resource_id, start_ns, start_ns FROM transfers WHERE end_ns >= start_ns
            UNION ALL SELECT dst_resource_id, end_ns, end_ns FROM transfers WHERE end_ns >= start_ns
            UNION ALL SELECT resource_id, ts_ns, ts_ns FROM metrics
            UNION ALL SELECT resource_id, ts_ns, ts_ns FROM logs)
        WHERE rid IS NOT NULL GROUP BY rid""").fetchall()
    for rid, t0, t1 in used:
        if rid not in known:
            known[rid] = {"resource_id": rid, "kind": "unknown", "name": rid, "parent_id": None,
                          "start_ns": None, "end_ns": None}
        first[rid], last[rid] = t0, t1
    n_skipped = con.execute("SELECT count(*) FROM spans WHERE end_ns < start_ns").fetchall()[0][0]

    times = [t for r in known.values() for t in (r.get("start_ns"), r.get("end_ns")) if t is not None]
    times += list(first.values()) + list(last.values())
    meta = run.meta
    origin = min([t for t in [meta.get("start_ns")] if t is not None] + times, default=0)
    horizon = max(times + [t for t in [meta.get("end_ns")] if t is not None], default=origin)

    # parents that exist, without cycles
    def parent(rid: str) -> str | None:
        p = known[rid].get("parent_id")
        return p if p in known and p != rid else None

    depth: dict[str, int] = {}
    for rid in known:
        chain, cur = [], rid
        while cur is not None and cur not in depth and cur not in chain:
            chain.append(cur)
            cur = parent(cur)
        base = depth.get(cur, -1) if cur is not None and cur not in chain else -1
        if cur is not None and cur in chain:  # a cycle: cut it where it closes
            known[cur] = {**known[cur], "parent_id": None}
            base = -1
            chain = chain[: chain.index(cur) + 1]
        for i, r in enumerate(reversed(chain)):
            depth[r] = base + 1 + i
    order = sorted(known, key=lambda r: (depth[r], r))

    types = _Types()
    ctype: dict[str, str] = {}
    for rid in order:
        p = parent(rid)
        ptype = ctype[p] if p else "0"
        kind = known[rid].get("kind") or "unknown"
        ctype[rid] = types.get(("c", ptype, kind), lambda a, pt=ptype, k=kind: f"0 {a} {pt} {q(k)}")

    created: dict[str, int] = {}
    ended: dict[str, int] = {}
    for rid in order:
        r = known[rid]
        cands = [t for t in (r.get("start_ns"), first.get(rid)) if t is not None]
        created[rid] = min(cands) if cands else origin
        ends = [t for t in (r.get("end_ns"), last.get(rid)) if t is not None]
        ended[rid] = max(max(ends) if ends else horizon, created[rid])
    for rid in reversed(order):  # a container must exist before its children
        p = parent(rid)
        if p and created[rid] < created[p]:
            created[p] = created[rid]
    for rid in order:
        p = parent(rid)
        if p and ended[p] < ended[rid]:
            ended[p] = ended[rid]

    cont: dict[str, list] = {k: [] for k in _REC_SCHEMA.names}
    for seq, rid in enumerate(order):
        p = parent(rid)
        name = known[rid].get("name") or rid
        for row in ((created[rid], _CREATE, -10, seq, "5", f"{q(rid)} {ctype[rid]} {q(p) if p else '0'} {q(name)}"),
                    (ended[rid], _DESTROY, -10, seq, "6", f"{ctype[rid]} {q(rid)}")):
            for k, v in zip(_REC_SCHEMA.names, row):
                cont[k].append(v)

    n_states = _states(con, types, ctype, tmp / "states.parquet")

    # links, variables and events: their types from the distinct keys, their lines built in SQL
    links = con.execute("SELECT DISTINCT src_resource_id, dst_resource_id FROM transfers "
                    "WHERE end_ns >= start_ns").fetchall()
    link_t = {"src": [a for a, _ in links], "dst": [b for _, b in links],
              "lt": [types.get(("l", ctype[a], ctype[b]),
                               lambda x, s=ctype[a], d=ctype[b]: f"4 {x} 0 {s} {d} {q('transfer')}")
                     for a, b in links]}
    variables = con.execute("SELECT DISTINCT resource_id, namespace, name FROM metrics").fetchall()
    var_t = {"rid": [v[0] for v in variables], "ns": [v[1] for v in variables], "nm": [v[2] for v in variables],
             "vt": [types.get(("v", ctype[r], f"{ns}:{nm}"),
                              lambda x, ct=ctype[r], n=f"{ns}:{nm}": f"3 {x} {ct} {q(n)}")
                    for r, ns, nm in variables]}
    events = con.execute("SELECT DISTINCT resource_id, category FROM logs").fetchall()
    ev_t = {"rid": [r for r, _ in events], "cat": [c for _, c in events],
            "et": [types.get(("e", ctype[r] if r else "0", c),
                             lambda x, ct=(ctype[r] if r else "0"), c=c: f"2 {x} {ct} {q(c)}")
                   for r, c in events]}
    tables = {"_paje_containers": pa.table(cont, schema=_REC_SCHEMA),
              "_paje_link_t": pa.table(link_t, schema=pa.schema([(k, pa.string()) for k in link_t])),
              "_paje_var_t": pa.table(var_t, schema=pa.schema([(k, pa.string()) for k in var_t])),
              "_paje_ev_t": pa.table(ev_t, schema=pa.schema([(k, pa.string()) for k in ev_t]))}
    for name, t in tables.items():
        con.register(name, t)
    states_src = str(tmp / "states.parquet").replace("'", "''")
    counts = con.execute("SELECT (SELECT count(*) FROM transfers WHERE end_ns >= start_ns), "
                     "(SELECT count(*) FROM metrics), (SELECT count(*) FROM logs)").fetchall()[0]
    d = f"(t - {int(origin)})"
    query = f"""
        WITH tr AS (SELECT row_number() OVER () - 1 AS k, kind, src_resource_id AS src, dst_resource_id AS dst,
                           start_ns, end_ns FROM transfers WHERE end_ns >= start_ns),
        recs AS (
            SELECT * FROM _paje_containers
            UNION ALL SELECT * FROM read_parquet('{states_src}')
            UNION ALL SELECT start_ns, 1, -1, 2 * k, '11',
                   lt || ' 0 ' || {_q_sql('kind')} || ' ' || {_q_sql('src')} || ' k' || k
                   FROM tr JOIN _paje_link_t USING (src, dst)
            UNION ALL SELECT end_ns, 1, -1, 2 * k + 1, '12',
                   lt || ' 0 ' || {_q_sql('kind')} || ' ' || {_q_sql('dst')} || ' k' || k
                   FROM tr JOIN _paje_link_t USING (src, dst)
            UNION ALL SELECT m.ts_ns, 1, -2, 0, '9', vt || ' ' || {_q_sql('m.resource_id')} || ' ' ||
                   CAST(CAST(m.value AS DOUBLE) AS VARCHAR)
                   FROM metrics m JOIN _paje_var_t v ON m.resource_id = v.rid
                   AND m.namespace IS NOT DISTINCT FROM v.ns AND m.name IS NOT DISTINCT FROM v.nm
            UNION ALL SELECT g.ts_ns, 1, -3, 0, '10', et || ' ' ||
                   (CASE WHEN g.resource_id IS NULL THEN '0' ELSE {_q_sql('g.resource_id')} END) || ' ' ||
                   {_q_sql('g.message')}
                   FROM logs g JOIN _paje_ev_t e ON g.resource_id IS NOT DISTINCT FROM e.rid
                   AND g.category IS NOT DISTINCT FROM e.cat)
        SELECT code || ' ' || CAST({d} // 1000000000 AS VARCHAR) || '.' ||
               lpad(CAST({d} % 1000000000 AS VARCHAR), 9, '0') || ' ' || tail || chr(10) AS line
        FROM recs ORDER BY t, phase, grp, seq"""
    try:
        reader = con.sql(query).to_arrow_reader(BATCH)
        with open(out, "wb") as f:
            f.write(f"# flowscope paje export: time_origin_ns={origin}\n".encode())
            f.write(f"# run {json.dumps(meta.get('run_id'))} {json.dumps(meta.get('name'))}; times are seconds "
                    f"from the origin above\n".encode())
            f.write(HEADER.encode())
            f.write("".join(line + "\n" for line in types.lines).encode())
            for b in reader:
                _write_lines(f, b.column(0))
    finally:
        for name in tables:
            con.unregister(name)
    return {"containers": len(known), "states": n_states, "links": counts[0], "variables": counts[1],
            "events": counts[2], "spans_skipped": n_skipped}


def _write_lines(f: Any, col: pa.Array) -> None:
    """Write a string array whose values each end with a newline, from its data buffer when it can."""
    if not len(col):
        return
    if col.type == pa.string() and col.null_count == 0:
        offs = np.frombuffer(col.buffers()[1], dtype=np.int32, count=col.offset + len(col) + 1)
        f.write(memoryview(col.buffers()[2])[offs[col.offset]:offs[-1]])
    else:
        f.write("".join(col.to_pylist()).encode())


def _states(con: Any, types: _Types, ctype: dict[str, str], path: Path) -> int:
    """Push/pop records of every span to ``path``; per resource and kind, lanes in which every pair of
    spans nests or is disjoint (a span that overlaps without nesting opens the next lane, a state type
    ``<kind>~N``). Returns the number of spans."""
    reader = con.sql("SELECT resource_id, kind, name, start_ns, end_ns, task_key FROM spans "
                     "WHERE end_ns >= start_ns ORDER BY resource_id, kind, start_ns, end_ns DESC"
                     ).to_arrow_reader(BATCH)
    prefix: list[str] = []       # per lane: "<state type> <container>"
    cur = None
    lanes: list[list[int]] = []  # per lane of the current stream: the ends of its open spans (a stack)
    lane_ids: list[int] = []
    seq = 0
    n = 0
    with pq.ParquetWriter(path, _REC_SCHEMA) as w:

        def flush(ev_t: list, ev_grp: list, ev_ref: list, b: pa.RecordBatch | None) -> None:
            """Records of one batch: a push names its span (ref = its row), a pop (ref -1) only its lane."""
            nonlocal seq
            if not ev_t:
                return
            ref = np.asarray(ev_ref, dtype=np.int64)
            push = pa.array(ref >= 0)
            tail = pa.array(prefix, pa.string()).take(pa.array(ev_grp, pa.int64()))
            if b is not None:
                value = pc.binary_join_element_wise(_q_arrow(b.column(2)), _q_arrow(b.column(5)), " ")
                value = value.take(pa.array(np.maximum(ref, 0)))
                tail = pc.if_else(push, pc.binary_join_element_wise(tail, value, " "), tail)
            m = len(ev_t)
            w.write_batch(pa.record_batch([
                pa.array(ev_t, pa.int64()), pa.array(np.ones(m, np.int8)), pa.array(ev_grp, pa.int64()),
                pa.array(np.arange(seq, seq + m, dtype=np.int64)),
                pc.if_else(push, pa.scalar("7"), pa.scalar("8")), tail], schema=_REC_SCHEMA))
            seq += m

        for b in reader:
            ev_t: list[int] = []
            ev_grp: list[int] = []
            ev_ref: list[int] = []
            for i, (rid, kind, s, e) in enumerate(zip(b.column(0).to_pylist(), b.column(1).to_pylist(),
                                                      b.column(3).to_pylist(), b.column(4).to_pylist())):
                if (rid, kind) != cur:
                    for li, stack in enumerate(lanes):
                        while stack:
                            ev_t.append(stack.pop()); ev_grp.append(lane_ids[li]); ev_ref.append(-1)
                    cur, lanes, lane_ids = (rid, kind), [], []
                chosen = -1
                for li, stack in enumerate(lanes):
                    # close what ended by now (deepest first), then fit if it nests in what is open
                    while stack and stack[-1] <= s:
                        ev_t.append(stack.pop()); ev_grp.append(lane_ids[li]); ev_ref.append(-1)
                    if not stack or e <= stack[-1]:
                        chosen = li
                        break
                if chosen < 0:
                    chosen = len(lanes)
                    lanes.append([])
                    name = kind if chosen == 0 else f"{kind}~{chosen + 1}"
                    ct = ctype[rid]
                    alias = types.get(("s", ct, name), lambda a, ct=ct, nm=name: f"1 {a} {ct} {q(nm)}")
                    lane_ids.append(len(prefix))
                    prefix.append(f"{alias} {q(rid)}")
                lanes[chosen].append(e)
                ev_t.append(s); ev_grp.append(lane_ids[chosen]); ev_ref.append(i)
            n += b.num_rows
            flush(ev_t, ev_grp, ev_ref, b)
        ev_t, ev_grp, ev_ref = [], [], []
        for li, stack in enumerate(lanes):
            while stack:
                ev_t.append(stack.pop()); ev_grp.append(lane_ids[li]); ev_ref.append(-1)
        flush(ev_t, ev_grp, ev_ref, None)
    return n
