"""Write a run as a Paje trace that pajeng's ``pj_dump`` accepts.

Resources become containers (their nesting kept; one container type per resource kind under each
parent type), spans PajePushState/PajePopState states (one state type per span kind; spans that
overlap without nesting go to extra state types ``<kind>~2``, ``<kind>~3``... so every stack nests),
transfers links (their kind as the value), metrics variables (``namespace:name``), logs events (the
category as the event type, the message as the value). Times are seconds relative to the run's
start, written with nine decimals (exact nanoseconds); a leading comment records the origin so that
flowscope's Paje importer restores absolute times and the original resource ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def q(s: Any) -> str:
    """A Paje string field: always quoted; Paje has no escapes, so a double quote becomes a single one."""
    text = "" if s is None else str(s)
    return '"' + text.replace('"', "'").replace("\n", " ").replace("\r", " ") + '"'


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
    res = run.arrow("resources").to_pylist()
    spans = run.arrow("spans", ["resource_id", "kind", "name", "start_ns", "end_ns", "task_key"]).to_pylist()
    transfers = run.arrow("transfers", ["kind", "src_resource_id", "dst_resource_id", "start_ns",
                                        "end_ns"]).to_pylist()
    metrics = run.arrow("metrics").to_pylist()
    logs = run.arrow("logs", ["ts_ns", "resource_id", "category", "message"]).to_pylist()

    # every resource referenced anywhere gets a container
    known = {r["resource_id"]: r for r in res}
    first: dict[str, int] = {}
    last: dict[str, int] = {}

    def use(rid: str | None, t0: int, t1: int) -> None:
        if rid is None:
            return
        if rid not in known:
            known[rid] = {"resource_id": rid, "kind": "unknown", "name": rid, "parent_id": None,
                          "start_ns": None, "end_ns": None}
        if rid not in first or t0 < first[rid]:
            first[rid] = t0
        if rid not in last or t1 > last[rid]:
            last[rid] = t1

    skipped = [s for s in spans if s["end_ns"] < s["start_ns"]]
    spans = [s for s in spans if s["end_ns"] >= s["start_ns"]]
    for s in spans:
        use(s["resource_id"], s["start_ns"], s["end_ns"])
    transfers = [t for t in transfers if t["end_ns"] >= t["start_ns"]]
    for t in transfers:
        use(t["src_resource_id"], t["start_ns"], t["start_ns"])
        use(t["dst_resource_id"], t["end_ns"], t["end_ns"])
    for m in metrics:
        use(m["resource_id"], m["ts_ns"], m["ts_ns"])
    for lg in logs:
        use(lg["resource_id"], lg["ts_ns"], lg["ts_ns"])

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

    recs: list[tuple[int, int, int, str]] = []
    seq = 0

    def rec(t: int, phase: int, text: str) -> None:
        nonlocal seq
        seq += 1
        recs.append((t, phase, seq, text))

    # secs() is applied when writing; records carry ns
    for rid in order:
        p = parent(rid)
        r = known[rid]
        rec(created[rid], _CREATE, f"5 @ {q(rid)} {ctype[rid]} {q(p) if p else '0'} {q(r.get('name') or rid)}")
        rec(ended[rid], _DESTROY, f"6 @ {ctype[rid]} {q(rid)}")

    # spans: per resource and kind, lanes in which every pair of spans nests or is disjoint
    by_stream: dict[tuple[str, str], list[dict]] = {}
    for s in spans:
        by_stream.setdefault((s["resource_id"], s["kind"]), []).append(s)
    n_states = 0
    for (rid, kind), items in sorted(by_stream.items()):
        items.sort(key=lambda s: (s["start_ns"], -s["end_ns"]))
        lanes: list[list[int]] = []  # per lane: the ends of its open spans (a stack)
        lane_events: list[list[tuple[int, str]]] = []
        stype: list[str] = []
        for s in items:
            st, en = s["start_ns"], s["end_ns"]
            chosen = -1
            for i, stack in enumerate(lanes):
                # close what ended by now (deepest first), then fit if it nests in what is open
                while stack and stack[-1] <= st:
                    lane_events[i].append((stack.pop(), f"8 @ {stype[i]} {q(rid)}"))
                if not stack or en <= stack[-1]:
                    chosen = i
                    break
            if chosen < 0:
                chosen = len(lanes)
                lanes.append([])
                lane_events.append([])
                name = kind if chosen == 0 else f"{kind}~{chosen + 1}"
                ct = ctype[rid]
                stype.append(types.get(("s", ct, name), lambda a, ct=ct, n=name: f"1 {a} {ct} {q(n)}"))
            lanes[chosen].append(en)
            lane_events[chosen].append((st, f"7 @ {stype[chosen]} {q(rid)} {q(s['name'])} {q(s['task_key'])}"))
            n_states += 1
        for i, stack in enumerate(lanes):
            while stack:
                lane_events[i].append((stack.pop(), f"8 @ {stype[i]} {q(rid)}"))
            for t, text in lane_events[i]:
                rec(t, _BODY, text)

    for i, t in enumerate(transfers):
        src, dst = t["src_resource_id"], t["dst_resource_id"]
        lt = types.get(("l", ctype[src], ctype[dst]),
                       lambda a, s=ctype[src], d=ctype[dst]: f"4 {a} 0 {s} {d} {q('transfer')}")
        rec(t["start_ns"], _BODY, f"11 @ {lt} 0 {q(t['kind'])} {q(src)} k{i}")
        rec(t["end_ns"], _BODY, f"12 @ {lt} 0 {q(t['kind'])} {q(dst)} k{i}")

    for m in metrics:
        rid = m["resource_id"]
        name = f"{m['namespace']}:{m['name']}"
        vt = types.get(("v", ctype[rid], name), lambda a, ct=ctype[rid], n=name: f"3 {a} {ct} {q(n)}")
        rec(m["ts_ns"], _BODY, f"9 @ {vt} {q(rid)} {float(m['value'])!r}")

    for lg in logs:
        rid = lg["resource_id"]
        ct = ctype[rid] if rid else "0"
        cat = lg["category"]
        et = types.get(("e", ct, cat), lambda a, ct=ct, c=cat: f"2 {a} {ct} {q(c)}")
        rec(lg["ts_ns"], _BODY, f"10 @ {et} {q(rid) if rid else '0'} {q(lg['message'])}")

    recs.sort(key=lambda r: (r[0], r[1], r[2]))
    out = Path(out)
    with open(out, "w", encoding="utf-8") as f:
        f.write(f"# flowscope paje export: time_origin_ns={origin}\n")
        f.write(f"# run {json.dumps(meta.get('run_id'))} {json.dumps(meta.get('name'))}; times are seconds "
                f"from the origin above\n")
        f.write(HEADER)
        f.writelines(line + "\n" for line in types.lines)
        for t, _phase, _seq, text in recs:
            d = t - origin
            f.write(text.replace("@", f"{d // 1_000_000_000}.{d % 1_000_000_000:09d}", 1) + "\n")
    return {"containers": len(known), "states": n_states, "links": len(transfers), "variables": len(metrics),
            "events": len(logs), "spans_skipped": len(skipped)}
