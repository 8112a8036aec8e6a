"""A run's live view, kept incrementally: each batch of a canonical table updates it once, and says what changed.

What the dashboard shows of a run while it runs, and of a run that finished (the same state, no longer
changing): progress by task group and tasks by state (the scheduler's transitions, else the task spans), the
task stream per executing resource (spans whose role is ``task`` or ``call`` under the run's semantic mappings,
and transfers), tasks finished per second (task spans by the second they ended in), CPU, memory, network and disk
per host (``hardware`` metrics) and the warnings and errors logged.

:class:`LiveRun` is fed with ``apply(table, segment_id, batch)``, once per segment: a segment applied twice
counts once, so a reader may replay the run's segments from disk and the collector's newly written ones in
any overlap. Every change gets the next sequence number; ``apply`` returns the change (a *delta*) and
``snapshot`` the whole state at the latest number, so that a delta with number ``seq + 1`` applies on top of a
snapshot (or delta) numbered ``seq``.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.analysis.instability import InstabilityDetector
from flowscope.model.namespaces import domain_of
from flowscope.model.provenance import run_facts
from flowscope.model.semantics import activity_sql, condition_sql, state_phases

#: the tables the live view reads; batches of the others are ignored
LIVE_TABLES = ("resources", "transitions", "spans", "transfers", "metrics", "logs")
#: where a task's scheduler transitions come from (transitions.observer)
SCHEDULER = "scheduler"
#: span roles drawn in the task stream
STREAM_ROLES = ("task", "call")
#: what the stream draws, by preference: a run's tasks and calls ("work"); with neither, its states (a Paje trace
#: of container states); with none of those, its other spans (Chrome async slices)
STREAM_CLASSES = {"work": STREAM_ROLES, "state": ("state",), "other": ("other",)}
SHOWN_ROLES = tuple(r for roles in STREAM_CLASSES.values() for r in roles)
#: host metrics drawn per panel, the first present of each choice (CPU and memory as the static report's hardware
#: chart; network and disk from the hardware sampler, docs/metrics.md)
HOST_METRICS = {"cpu": ("cpu.percent", "process.cpu.percent"), "memory": ("memory.used_bytes", "process.memory.rss_bytes"),
                "net_rx": ("net.rx_bytes_per_s",), "net_tx": ("net.tx_bytes_per_s",),
                "disk_read": ("disk.read_bytes_per_s",), "disk_write": ("disk.write_bytes_per_s",)}
#: numbers a program publishes into its own namespaces (application diagnostics: mass, energy, extrema...) drawn
#: live, the first this many (namespace, name) pairs of a run; each is watched by an instability detector
APP_SERIES_MAX = 8
APP_DOMAINS = ("application", None)  # SOMA's application-diagnostics domain, and namespaces of the program's own
#: warnings and errors kept with their text (the count covers all of them)
KEEP_WARNINGS = 200
#: points per host series in a snapshot (a longer series is thinned evenly; deltas carry every new point)
SNAPSHOT_POINTS = 2000
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
           "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#f7b6d2", "#9edae5", "#dbdb8d", "#393b79",
           "#637939", "#8c6d31", "#7b4173", "#3182bd")
OTHER_COLOR = "#c7c7c7"


def _short(address: str | None) -> str | None:
    return address.split("://", 1)[-1] if address else None


def _segment_cummax(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The running maximum of ``values`` restarted at every index where ``first`` is True (``first[0]`` must be)."""
    import pandas as pd

    return pd.Series(values).groupby(np.cumsum(first)).cummax().to_numpy()


class _Columns:
    """Growable columns of the task stream (start, end seconds since the run's start; row; group; key, Arrow
    strings)."""

    def __init__(self) -> None:
        self.start: list[np.ndarray] = []
        self.end: list[np.ndarray] = []
        self.row: list[np.ndarray] = []
        self.group: list[np.ndarray] = []
        self.key: list[pa.Array] = []

    def add(self, start, end, row, group, key: pa.Array) -> None:
        self.start.append(start)
        self.end.append(end)
        self.row.append(row)
        self.group.append(group)
        self.key.append(key)

    def __len__(self) -> int:
        return sum(len(a) for a in self.start)

    def arrays(self) -> dict:
        """The columns whole: numpy start, end (float64), row, group (int32); key (an Arrow string array)."""
        cat = (lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt))
        return {"start": cat(self.start, np.float64), "end": cat(self.end, np.float64),
                "row": cat(self.row, np.int32), "group": cat(self.group, np.int32),
                "key": pa.concat_arrays(self.key) if self.key else pa.array([], pa.string())}

    def as_json(self) -> dict:
        a = self.arrays()
        return {k: v.to_pylist() if k == "key" else v.tolist() for k, v in a.items()}


def _reads_attrs(when: dict) -> bool:
    return any(k.startswith("attrs.") for k in when)


class _StreamRoles:
    """The role and group of spans under a run's mappings (``model.semantics``), decided once per distinct
    combination of the plain columns the rules test (kind, name, the resource's kind, ...), instead of one query
    per batch. A combination is decided when the first rule setting the role (and the group) whose ``when`` holds on
    those columns tests no ``attrs.KEY`` (and its group reads none); the spans of an undecided one go through the
    ``activity`` query as before. Every comparison is the rules' own SQL, over the columns as text as it casts them."""

    def __init__(self, mappings: list[dict]):
        rules = [r for m in mappings for r in m.get("spans", [])]
        self.role_rules = [r for r in rules if "role" in r]
        self.group_rules = [r for r in rules if "group" in r]

        def plain(when: dict) -> dict:  # the conditions on the span's own columns and its resource's kind
            return {k: v for k, v in when.items() if not k.startswith("attrs.")}

        self.columns = sorted({k for r in rules for k in plain(r.get("when", {}))})
        self._case = {name: ("CASE " + " ".join(f"WHEN {condition_sql(plain(r.get('when', {})), 's')} THEN {i}"
                                                for i, r in enumerate(rs)) + " ELSE -1 END") if rs else "-1"
                      for name, rs in (("role", self.role_rules), ("group", self.group_rules))}
        self._decided: dict[tuple, tuple] = {}  # combination -> (role, group refs); None where attrs decide
        refs = [x for r in self.group_rules for x in (r["group"] if isinstance(r["group"], list) else [r["group"]])]
        self.needs_kind = "resource_kind" in self.columns or "resource_kind" in refs

    def _decide(self, con: duckdb.DuckDBPyConnection, combos: list[tuple]) -> None:
        cols = self.columns
        t = pa.table({"__i": pa.array(range(len(combos)), pa.int64()),
                      **{c: pa.array([x[j] for x in combos], pa.string()) for j, c in enumerate(cols)}})
        kind = '"resource_kind"' if "resource_kind" in cols else "CAST(NULL AS VARCHAR)"
        con.register("combos", t)
        try:
            rel = con.sql(f"""SELECT {self._case['role']} AS role_rule, {self._case['group']} AS group_rule
                              FROM combos s JOIN (SELECT __i, {kind} AS kind FROM combos) r ON r.__i = s.__i
                              ORDER BY s.__i""")
            got = (getattr(rel, "to_arrow_table", None) or rel.arrow)()
        finally:
            con.unregister("combos")
        for combo, ri, gi in zip(combos, got["role_rule"].to_pylist(), got["group_rule"].to_pylist()):
            role = "other" if ri < 0 else (None if _reads_attrs(self.role_rules[ri].get("when", {}))
                                           else self.role_rules[ri]["role"])
            refs: tuple | None = ("name",)
            if gi >= 0:
                rule = self.group_rules[gi]
                refs = tuple(rule["group"] if isinstance(rule["group"], list) else [rule["group"]])
                if _reads_attrs(rule.get("when", {})) or any(str(x).startswith("attrs.") for x in refs):
                    refs = None
            self._decided[combo] = (role, refs)

    def spans(self, con: duckdb.DuckDBPyConnection, batch: pa.Table, kind_of) -> tuple[list[pa.Table], pa.Table]:
        """(decided, undecided): the spans of ``batch`` drawn in the stream, with their role and group (tables of
        STREAM_COLUMNS), and the spans whose role or group their attrs decide, as they came. ``kind_of(resource_id)``
        is the kind of a resource (None when unknown)."""
        n = batch.num_rows
        rk = None
        if self.needs_kind:
            rids, ridx = LiveRun._encoded(batch["resource_id"])
            rk = pa.array([kind_of(r) if r is not None else None for r in rids], pa.string()).take(pa.array(ridx))
        text = {c: rk if c == "resource_kind" else pc.cast(batch[c], pa.string()) for c in self.columns}
        # one code per distinct combination of the columns' values (nulls included), in numpy
        code, size = np.zeros(n, np.int64), 1
        for c in self.columns:
            distinct, idx = LiveRun._encoded(text[c])
            size *= max(1, len(distinct))
            if size >= 2 ** 62:  # too many combinations to number: the whole batch through the query
                return [], batch
            code = code * max(1, len(distinct)) + idx
        _, firsts, cidx = np.unique(code, return_index=True, return_inverse=True)
        cidx = cidx.ravel()
        combos = list(zip(*(text[c].take(pa.array(firsts)).to_pylist() for c in self.columns))) if self.columns \
            else [()] * len(firsts)
        new = [c for c in dict.fromkeys(combos) if c not in self._decided]
        if new:
            self._decide(con, new)
        decided = [self._decided[c] for c in combos]
        undecided_combo = np.array([d[0] is None or d[1] is None for d in decided], dtype=bool)
        shown = np.array([not u and d[0] in SHOWN_ROLES for d, u in zip(decided, undecided_combo)], dtype=bool)
        refs_ids = {r: i for i, r in enumerate(dict.fromkeys(d[1] for d, s in zip(decided, shown) if s))}
        combo_ref = np.array([refs_ids[d[1]] if s else -1 for d, s in zip(decided, shown)], np.int64)
        combo_role = [d[0] for d in decided]
        row_ref = combo_ref[cidx]
        parts = []
        for refs, i in refs_ids.items():
            sel = np.flatnonzero(row_ref == i)
            take = pa.array(sel)
            sub = batch.take(take)
            fields = [rk.take(take) if f == "resource_kind" else pc.cast(sub[f], pa.string()) for f in refs]
            roles = pa.array(combo_role, pa.string()).take(pa.array(cidx[sel]))
            parts.append(pa.table([sub["resource_id"], sub["start_ns"], sub["end_ns"], sub["task_key"], roles,
                                   pc.coalesce(*fields) if len(fields) > 1 else fields[0]], schema=STREAM_SCHEMA))
        undecided = undecided_combo[cidx]
        return parts, batch.filter(pa.array(undecided)) if undecided.any() else batch.slice(0, 0)


STREAM_SCHEMA = pa.schema([("resource_id", pa.string()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                           ("task_key", pa.string()), ("role", pa.string()), ("group", pa.string())])


class LiveRun:
    """The live view of one run (see the module's docstring); thread-safe."""

    def __init__(self, meta: dict, mappings: list[dict]):
        self.run_id = meta["run_id"]
        self.name = meta.get("name") or self.run_id
        self.facts = run_facts(meta)
        self.t0_ns = int(meta.get("start_ns") or 0)
        self._activity = activity_sql(mappings)
        self._roles = _StreamRoles(mappings)
        self._mappings = mappings
        self._phase: dict = {}  # a task state -> its phase under the run's mappings (model.semantics.PHASES)
        self._lock = threading.Lock()
        self.seq = 0
        self._segments: set[tuple[str, str]] = set()
        self.last_ns = self.t0_ns
        # resources: kind, name, parent, address, tid per id (for row labels)
        self._res: dict[str, dict] = {}
        # progress: per task key its group and latest state, whether it ever finished
        self._state: dict[str, list] = {}     # key -> [ts_ns, state, group]
        self._done: set[str] = set()
        self._by_state: Counter = Counter()
        self._groups: dict[str, Counter] = {}  # group -> Counter(total, done, running, erred)
        self._span_tasks: Counter = Counter()  # group -> task spans seen (runs without scheduler transitions)
        self._finished: Counter = Counter()    # second since the run's start -> task spans that ended in it
        # task stream
        self._rows: list[str] = []
        self._row_of: dict[str, int] = {}
        self._labels: list[str] = []
        self._stream_groups: list[str] = []
        self._group_of: dict[str, int] = {}
        self._tasks = _Columns()
        self._drawn: str | None = None  # what the stream holds: a class of STREAM_CLASSES
        self._xfers: list[tuple[np.ndarray, ...]] = []
        # host metrics: (panel, resource_id) -> (ts list, value list)
        self._metric_names: dict[str, str] = {}
        self._series: dict[tuple[str, str], tuple[list, list]] = {}
        # application diagnostics: "namespace:name" -> resource -> (ts list, value list); a detector per series
        self._app: dict[str, dict[str, tuple[list, list]]] = {}
        self._detectors: dict[tuple[str, str], InstabilityDetector] = {}
        # warnings
        self._warnings: list[dict] = []
        self._warning_count = 0
        self._con = duckdb.connect(":memory:")

    # ---- feeding -------------------------------------------------------------------------------------------
    def apply(self, table: str, segment_id: str, batch: pa.Table) -> dict | None:
        """Take one segment of ``table``; returns the delta (with its ``seq``), or None when it changes nothing
        (a table the view does not read, an empty batch, a segment already applied)."""
        if table not in LIVE_TABLES or not batch.num_rows:
            return None
        with self._lock:
            if (table, segment_id) in self._segments:
                return None
            self._segments.add((table, segment_id))
            delta: dict[str, Any] = {}
            getattr(self, f"_apply_{table}")(batch, delta)
            if not delta:
                return None
            self.seq += 1
            delta["seq"] = self.seq
            delta["last_s"] = (self.last_ns - self.t0_ns) / 1e9
            return delta

    def close(self) -> None:
        """Release the view's DuckDB connection (a view closed this way takes no more batches)."""
        with self._lock:
            self._con.close()

    def applied(self, table: str, segment_id: str) -> bool:
        with self._lock:
            return (table, segment_id) in self._segments

    def _label(self, rid: str) -> str:
        r = self._res.get(rid)
        if r is None:
            return _short(rid.split(":", 1)[-1] if rid.startswith(("worker:", "host:")) else rid) or rid
        if r["kind"] == "thread":
            p = self._res.get(r["parent_id"]) if r["parent_id"] else None
            owner = self._owner(p, r["parent_id"]) if r["parent_id"] else \
                ":".join(str(x) for x in (r["host"], r["pid"]) if x is not None) or "threads"
            name, tid = r["name"], r["tid"]
            sub = name if name and len(name) <= 20 else (f"tid {tid}" if tid is not None else (name or rid))
            return f"{owner} / {sub}"
        return self._owner(r, rid)

    @staticmethod
    def _owner(r: dict | None, rid: str | None) -> str:
        if r is None:
            return _short(rid.split(":", 1)[-1] if rid and rid.startswith("worker:") else rid) or "unknown"
        address = _short(r["address"])
        if r["kind"] == "worker":
            return f"worker {address or r['name'] or rid}"
        return r["name"] or address or str(rid)

    def _apply_resources(self, batch: pa.Table, delta: dict) -> None:
        for r in batch.select(["resource_id", "kind", "name", "parent_id", "host", "pid", "tid", "address"]).to_pylist():
            old = self._res.get(r["resource_id"])
            self._res[r["resource_id"]] = {k: (v if v is not None else (old or {}).get(k)) for k, v in r.items()}
        relabel = {}
        for i, rid in enumerate(self._rows):
            label = self._label(rid)
            if label != self._labels[i]:
                self._labels[i] = label
                relabel[i] = label
        if relabel:
            delta["relabel"] = relabel

    def _rows_added(self, delta: dict, new_rows: list[str]) -> None:
        """Put the rows a batch added (their labels, in order) into ``delta``, with the resource each is of."""
        if new_rows:
            delta["rows"], delta["row_ids"] = new_rows, self._rows[-len(new_rows):]

    def _row(self, rid: str, new_rows: list) -> int:
        i = self._row_of.get(rid)
        if i is None:
            i = self._row_of[rid] = len(self._rows)
            self._rows.append(rid)
            self._labels.append(self._label(rid))
            new_rows.append(self._labels[-1])
        return i

    def _group(self, name: str, new_groups: list) -> int:
        g = self._group_of.get(name)
        if g is None:
            g = self._group_of[name] = len(self._stream_groups)
            self._stream_groups.append(name)
            new_groups.append({"name": name, "color": self._color(g)})
        return g

    @staticmethod
    def _color(g: int) -> str:
        return PALETTE[g] if g < len(PALETTE) else OTHER_COLOR

    def _apply_transitions(self, batch: pa.Table, delta: dict) -> None:
        t = batch.filter(pc.equal(batch["observer"], SCHEDULER))
        if not t.num_rows:
            return
        grp = pc.coalesce(t["prefix"], t["group"], t["task_key"])
        new_groups: list[dict] = []
        gnames, gidx = self._encoded(grp)
        for g in gnames:  # colour fixed when first known, in order of first appearance
            if g not in self._group_of:
                self._group(g, new_groups)
        if new_groups:
            delta["groups"] = new_groups
        # A key's transition is taken when it is not older than the key's latest one (a late, older one is
        # ignored); only its last taken state and its first taken finished state matter, so the batch is reduced
        # to those per key with numpy and the Python work is per task, not per transition.
        keys, kidx = self._encoded(t["task_key"])
        states, sidx = self._encoded(t["to_state"])
        ts = np.asarray(t["ts_ns"].to_numpy(), dtype=np.int64)
        order = np.lexsort((np.arange(len(ts)), kidx))  # by key, then in the batch's order
        k, tso = kidx[order], ts[order]
        first = np.ones(len(k), dtype=bool)
        first[1:] = k[1:] != k[:-1]
        state_rows = [self._state.get(key) for key in keys]
        before = np.array([cur[0] if cur is not None else np.iinfo(np.int64).min for cur in state_rows], np.int64)
        # the latest time seen of the row's key before the row: its state's, then the batch's earlier rows'
        running_max = _segment_cummax(np.maximum(tso, before[k]), first)
        prior = np.empty_like(tso)
        prior[first] = before[k[first]]
        prior[~first] = running_max[np.flatnonzero(~first) - 1]
        taken = tso >= prior
        rows = order[taken]
        tk = kidx[rows]
        head = np.ones(len(tk), dtype=bool)  # a key's first taken row
        head[1:] = tk[1:] != tk[:-1]
        last = np.ones(len(tk), dtype=bool)  # and its last
        last[:-1] = tk[:-1] != tk[1:]
        new_states = [st for st in states if st not in self._phase]
        if new_states:
            self._phase.update(state_phases(self._mappings, new_states))
        phase = self._phase
        done_state = np.isin(sidx[rows], [i for i, st in enumerate(states) if phase[st] in ("done", "erred")])
        first_done = np.full(len(keys), -1, np.int64)
        dk, dpos = tk[done_state], np.flatnonzero(done_state)
        if len(dk):
            dhead = np.ones(len(dk), dtype=bool)
            dhead[1:] = dk[1:] != dk[:-1]
            first_done[dk[dhead]] = sidx[rows[dpos[dhead]]]
        first_row = np.full(len(keys), -1, np.int64)
        first_row[tk[head]] = rows[head]
        changed = set()
        for key_i, row_i in zip(tk[last].tolist(), rows[last].tolist()):
            key, cur = keys[key_i], state_rows[key_i]
            if cur is None:
                g = gnames[gidx[first_row[key_i]]]
                cur = self._state[key] = [0, None, g]
                counts = self._groups.get(g)
                if counts is None:
                    counts = self._groups[g] = Counter()
                counts["total"] += 1
            counts = self._groups.get(cur[2])
            if counts is None:  # (not setdefault: it would build a Counter per task to throw away)
                counts = self._groups[cur[2]] = Counter()
            old, state = cur[1], states[sidx[row_i]]
            if old is not None:
                self._by_state[old] -= 1
                if phase[old] == "running":
                    counts["running"] -= 1
            cur[0], cur[1] = int(ts[row_i]), state
            self._by_state[state] += 1
            if phase[state] == "running":
                counts["running"] += 1
            fd = first_done[key_i]
            if fd >= 0 and key not in self._done:
                self._done.add(key)
                counts["done"] += 1
                if phase[states[fd]] == "erred":
                    counts["erred"] += 1
            changed.add(cur[2])
        self.last_ns = max(self.last_ns, int(ts.max()))
        delta["progress"] = self._progress(changed)
        delta["states"] = self._states()

    def _progress(self, groups) -> dict:
        """Per group (in name order: the same view however its batches came), its tasks known, done, running and
        erred."""
        groups = sorted(groups, key=str)
        if self._state:
            return {g: {"total": c["total"], "done": c["done"], "running": c["running"], "erred": c["erred"]}
                    for g in groups for c in (self._groups[g],)}
        return {g: {"total": self._span_tasks[g], "done": self._span_tasks[g], "running": 0, "erred": 0}
                for g in groups}

    def _states(self) -> dict:
        if self._state:  # in name order, as _progress
            return {s: n for s, n in sorted(self._by_state.items(), key=lambda kv: str(kv[0])) if n}
        return {"finished": sum(self._span_tasks.values())} if self._span_tasks else {}

    def _stream_spans(self, batch: pa.Table) -> pa.Table:
        """The spans of ``batch`` drawn in the task stream, with their role and group (the run's mappings), in a
        fixed order: DuckDB may return a join's rows in any order, and new groups take their colours in order."""
        res = self._res
        parts, undecided = self._roles.spans(self._con, batch, lambda rid: (res.get(rid) or {}).get("kind"))
        if undecided.num_rows:
            parts.append(self._activity_spans(undecided).cast(STREAM_SCHEMA))
        a = pa.concat_tables(parts) if parts else STREAM_SCHEMA.empty_table()
        return a.sort_by([(c, "ascending") for c in ("start_ns", "end_ns", "resource_id", "task_key", "group")])

    def _activity_spans(self, batch: pa.Table) -> pa.Table:
        """The spans of ``batch`` drawn in the task stream, with their role and group, by the ``activity`` query."""
        self._con.register("spans", batch)
        self._con.register("resources", pa.table({"resource_id": list(self._res),
                                                  "kind": [r["kind"] for r in self._res.values()]},
                                                 schema=pa.schema([("resource_id", pa.string()), ("kind", pa.string())])))
        try:
            roles = ", ".join(f"'{r}'" for r in SHOWN_ROLES)
            # ordered: DuckDB may return a join's rows in any order, and new groups take their colours in order
            rel = self._con.sql(f"""SELECT resource_id, start_ns, end_ns, task_key, role, "group"
                                    FROM ({self._activity}) WHERE role IN ({roles})
                                    ORDER BY start_ns, end_ns, resource_id, task_key, "group" """)
            a = (getattr(rel, "to_arrow_table", None) or rel.arrow)()
        finally:
            self._con.unregister("spans")
            self._con.unregister("resources")
        return a

    def _restart_stream(self) -> None:
        """Empty the stream (its rows, groups and spans), keeping the transfers on the rows of their resources."""
        old = self._rows
        self._rows, self._row_of, self._labels = [], {}, []
        self._stream_groups, self._group_of = [], {}
        self._tasks = _Columns()
        if self._xfers:
            used = np.unique(np.concatenate([np.concatenate([x[2], x[3]]) for x in self._xfers]))
            where = np.full(len(old), -1, np.int32)
            for i in used.tolist():
                where[i] = self._row(old[i], [])
            self._xfers = [(s, e, where[src], where[dst]) for s, e, src, dst in self._xfers]

    def _drawn_spans(self, a: pa.Table, delta: dict) -> pa.Table:
        """The spans of ``a`` the stream draws: those of the first class of :data:`STREAM_CLASSES` the run has
        shown. When a batch brings spans of a class before the one drawn (a run's first task after its states were
        drawn), the stream starts again with them (``delta["reset"]``: every page takes a new snapshot)."""
        order = list(STREAM_CLASSES)
        masks = {c: pc.is_in(a["role"], pa.array(STREAM_CLASSES[c])) for c in order}
        best = next((c for c in order if pc.any(masks[c]).as_py()), None)
        if best is not None and (self._drawn is None or order.index(best) < order.index(self._drawn)):
            if self._drawn is not None:
                self._restart_stream()
                delta["reset"] = True
            self._drawn = delta["drawn"] = best
        return a.filter(masks[self._drawn]) if self._drawn is not None else a.slice(0, 0)

    def _apply_spans(self, batch: pa.Table, delta: dict) -> None:
        a = self._stream_spans(batch)
        if a.num_rows:
            a = self._drawn_spans(a, delta)
        if not a.num_rows:
            return
        new_rows: list[str] = []
        new_groups: list[dict] = []
        row = self._indices(a["resource_id"], lambda r: self._row(r, new_rows))
        group = self._indices(pc.fill_null(a["group"], "?"), lambda g: self._group(g, new_groups))
        start = (a["start_ns"].to_numpy() - self.t0_ns) / 1e9
        end = (a["end_ns"].to_numpy() - self.t0_ns) / 1e9
        keys = a["task_key"].combine_chunks()
        if not pa.types.is_string(keys.type):
            keys = keys.cast(pa.string())
        self._tasks.add(start, end, row, group, keys)
        self.last_ns = max(self.last_ns, int(pc.max(a["end_ns"]).as_py()))
        tasks = a.filter(pc.equal(a["role"], "task"))
        changed = set()
        if tasks.num_rows:
            names, counts = self._counts(tasks["group"])
            for g, n in zip(names, counts):
                self._span_tasks[g] += n
                changed.add(g)
            secs = (tasks["end_ns"].to_numpy() - self.t0_ns) // 1_000_000_000
            s, n = np.unique(secs, return_counts=True)
            for sec, k in zip(s.tolist(), n.tolist()):
                self._finished[sec] += k
            delta["throughput"] = {str(sec): self._finished[sec] for sec in s.tolist()}
        self._rows_added(delta, new_rows)
        if new_groups:
            delta["groups"] = new_groups
        # columns as they are: the live channel sends them as binary buffers (service/frames.py)
        delta["tasks"] = {"start": start, "end": end, "row": row, "group": group, "key": keys}
        if changed and not self._state:
            delta["progress"] = self._progress(changed)
            delta["states"] = self._states()

    @staticmethod
    def _encoded(values) -> tuple[list, np.ndarray]:
        """The distinct ``values`` (None for a null) in order of first appearance, and each value's index in them."""
        d = pc.dictionary_encode(values, null_encoding="encode")
        if isinstance(d, pa.ChunkedArray):
            d = d.unify_dictionaries().combine_chunks() if d.num_chunks != 1 else d.chunk(0)
        return d.dictionary.to_pylist(), d.indices.to_numpy(zero_copy_only=False)

    @classmethod
    def _indices(cls, values, index_of) -> np.ndarray:
        """``index_of(v)`` for every value, called once per distinct value in order of first appearance."""
        distinct, idx = cls._encoded(values)
        return np.array([index_of(v) for v in distinct], dtype=np.int32)[idx]

    @classmethod
    def _counts(cls, values) -> tuple[list, list]:
        """The distinct ``values`` (None for a null) in order of first appearance and how many times each occurs."""
        distinct, idx = cls._encoded(values)
        return distinct, np.bincount(idx, minlength=len(distinct)).tolist()

    def _apply_transfers(self, batch: pa.Table, delta: dict) -> None:
        new_rows: list[str] = []
        src = self._indices(batch["src_resource_id"], lambda r: self._row(r, new_rows))
        dst = self._indices(batch["dst_resource_id"], lambda r: self._row(r, new_rows))
        start = (batch["start_ns"].to_numpy() - self.t0_ns) / 1e9
        end = (batch["end_ns"].to_numpy() - self.t0_ns) / 1e9
        self._xfers.append((start, end, src, dst))
        self._rows_added(delta, new_rows)
        delta["transfers"] = {"start": start, "end": end, "src": src, "dst": dst}

    def _apply_metrics(self, batch: pa.Table, delta: dict) -> None:
        self._apply_app_metrics(batch, delta)
        hw = batch.filter(pc.equal(batch["namespace"], "hardware"))
        if not hw.num_rows:
            return
        names = set(pc.unique(hw["name"]).to_pylist())
        points: dict[str, dict[str, dict]] = {}
        for panel, choices in HOST_METRICS.items():
            name = self._metric_names.get(panel) or next((n for n in choices if n in names), None)
            if name is None or name not in names:
                continue
            self._metric_names[panel] = name
            m = hw.filter(pc.and_(pc.equal(hw["name"], name), pc.is_finite(hw["value"])))  # JSON has no NaN
            if not m.num_rows:
                continue
            rids, idx = self._encoded(m["resource_id"])
            t = (m["ts_ns"].to_numpy() - self.t0_ns) / 1e9
            v = m["value"].to_numpy()
            order = np.argsort(idx, kind="stable")  # each resource's points together, in the batch's order
            bounds = np.cumsum(np.bincount(idx, minlength=len(rids)))
            panel_points = points.setdefault(panel, {})
            for rid, lo, hi in zip(rids, [0, *bounds[:-1].tolist()], bounds.tolist()):
                ts, vs = t[order[lo:hi]].tolist(), v[order[lo:hi]].tolist()
                xs, ys = self._series.setdefault((panel, rid), ([], []))
                xs.extend(ts)
                ys.extend(vs)
                panel_points[rid] = {"label": self._label(rid), "t": ts, "v": vs}
            self.last_ns = max(self.last_ns, int(pc.max(m["ts_ns"]).as_py()))
        if points:
            delta["metrics"] = {"names": dict(self._metric_names), "series": points}

    def _apply_app_metrics(self, batch: pa.Table, delta: dict) -> None:
        """A program's own numbers (namespaces of the application domain, or of no domain: not the performance,
        hardware or workflow ones flowscope's sources fill): the first APP_SERIES_MAX series, each point also fed to
        its series' instability detector, whose verdict becomes a warning of the view."""
        spaces = [x for x in pc.unique(batch["namespace"]).to_pylist() if x is not None and domain_of(x) in APP_DOMAINS]
        if not spaces:
            return
        app = batch.filter(pc.is_in(batch["namespace"], pa.array(spaces, pa.string())))
        key = pc.binary_join_element_wise(app["namespace"], app["name"], ":")
        if len(self._app) < APP_SERIES_MAX:  # series first seen in this batch, in the order they were published
            order = pc.sort_indices(app, [("ts_ns", "ascending")])
            for panel in pc.unique(key.take(order)).to_pylist():
                if len(self._app) >= APP_SERIES_MAX:
                    break
                self._app.setdefault(panel, {})
        # only the drawn series' rows go on, in Python, to the detectors (a program may publish many more)
        app = app.append_column("panel", key).filter(pc.is_in(key, pa.array(list(self._app), pa.string())))
        if not app.num_rows:
            return
        app = app.sort_by([("ts_ns", "ascending")])
        points: dict[str, dict[str, dict]] = {}
        found: list[dict] = []
        cols = zip(app["namespace"].to_pylist(), app["name"].to_pylist(), app["panel"].to_pylist(),
                   app["resource_id"].to_pylist(), app["ts_ns"].to_pylist(), app["value"].to_pylist())
        for space, name, panel, rid, ts, value in cols:
            series = self._app[panel]
            xs, ys = series.setdefault(rid, ([], []))
            t = (ts - self.t0_ns) / 1e9
            finite = value is not None and np.isfinite(value)
            if finite:  # JSON has no NaN: a non-finite value is left out of the chart, not of the detector
                xs.append(t)
                ys.append(value)
                got = points.setdefault(panel, {}).setdefault(rid, {"label": self._label(rid), "t": [], "v": []})
                got["t"].append(t)
                got["v"].append(value)
            det = self._detectors.setdefault((panel, rid), InstabilityDetector())
            verdict = det.update(len(ys) + (0 if finite else 1), value if value is not None else float("nan"))
            if verdict is not None:
                what = (f"grew {verdict['growth']:.3g}x over its last {det.window} publications "
                        f"({verdict['rate']:.3g}x each)" if verdict["reason"] == "geometric growth"
                        else "is no longer a finite number")
                found.append({"t": t, "level": "warning", "category": "instability",
                              "message": f"{space} {name} {what}: an instability (analysis/instability.py)",
                              "task_key": None, "resource": self._label(rid) if rid else None})
            self.last_ns = max(self.last_ns, ts)
        if points:
            delta["diagnostics"] = points
        if found:
            self._warning_count += len(found)
            self._warnings = (self._warnings + found)[-KEEP_WARNINGS:]
            delta["warnings"] = delta.get("warnings", []) + found
            delta["warning_count"] = self._warning_count

    def _apply_logs(self, batch: pa.Table, delta: dict) -> None:
        w = batch.filter(pc.is_in(batch["level"], pa.array(["warning", "error"])))
        if not w.num_rows:
            return
        rows = w.select(["ts_ns", "level", "category", "message", "task_key", "resource_id"]).to_pylist()
        out = [{"t": (r["ts_ns"] - self.t0_ns) / 1e9, "level": r["level"], "category": r["category"],
                "message": (r["message"] or "")[:500], "task_key": r["task_key"],
                "resource": self._label(r["resource_id"]) if r["resource_id"] else None} for r in rows]
        self._warning_count += len(out)
        self._warnings = (self._warnings + out)[-KEEP_WARNINGS:]
        delta["warnings"] = out[-KEEP_WARNINGS:]
        delta["warning_count"] = self._warning_count

    # ---- reading -------------------------------------------------------------------------------------------
    def counts(self) -> dict:
        """Tasks known and done, and warnings, for a list of runs."""
        with self._lock:
            if self._state:
                total, done = len(self._state), len(self._done)
            else:
                total = done = sum(self._span_tasks.values())
            return {"tasks": total, "done": done, "warnings": self._warning_count,
                    "last_s": (self.last_ns - self.t0_ns) / 1e9}

    def _thinned(self, rid: str, xs: list, ys: list) -> dict:
        """One series of a snapshot: its label and at most SNAPSHOT_POINTS points, evenly thinned."""
        step = max(1, -(-len(xs) // SNAPSHOT_POINTS))
        return {"label": self._label(rid), "t": xs[::step], "v": ys[::step]}

    def snapshot(self, columns: bool = False) -> dict:
        """The whole view at sequence number ``seq``; with ``columns``, the stream's tasks and transfers as arrays
        (numpy; the keys an Arrow string array) rather than lists."""
        with self._lock:
            series: dict[str, dict] = {}
            for (panel, rid), (xs, ys) in self._series.items():
                series.setdefault(panel, {})[rid] = self._thinned(rid, xs, ys)
            xf = self._xfers

            def cat(i: int, dtype) -> Any:
                a = np.concatenate([x[i] for x in xf]).astype(dtype) if xf else np.zeros(0, dtype)
                return a if columns else a.tolist()
            return {
                "seq": self.seq, "run_id": self.run_id, "name": self.name, "facts": self.facts, "t0_ns": self.t0_ns,
                "last_s": (self.last_ns - self.t0_ns) / 1e9,
                "progress": self._progress(self._groups if self._state else self._span_tasks),
                "states": self._states(),
                "rows": list(self._labels),
                "row_ids": list(self._rows),  # the resource of each row (a page's ?resource= finds its row)
                "groups": [{"name": g, "color": self._color(i)} for i, g in enumerate(self._stream_groups)],
                "tasks": self._tasks.arrays() if columns else self._tasks.as_json(),
                "drawn": self._drawn,  # what the stream holds: a class of STREAM_CLASSES, None before any
                "transfers": {"start": cat(0, np.float64), "end": cat(1, np.float64), "src": cat(2, np.int32),
                              "dst": cat(3, np.int32)},
                "metrics": {"names": dict(self._metric_names), "series": series},
                "diagnostics": {panel: {rid: self._thinned(rid, xs, ys) for rid, (xs, ys) in by_rid.items()}
                                for panel, by_rid in self._app.items()},
                "warnings": list(self._warnings), "warning_count": self._warning_count,
                "throughput": {str(sec): n for sec, n in sorted(self._finished.items())},
            }


def pending_segments(run_dir: Path, live: LiveRun) -> list[tuple[str, str, Path]]:
    """The segments of ``run_dir`` (of the tables the view reads) that ``live`` has not applied, resources
    first (they label the rows), each as (table, segment id, path)."""
    from flowscope.store.layout import SEGMENT_SUFFIX, segment_files

    out = []
    for table in LIVE_TABLES:
        for path in segment_files(run_dir, table):
            sid = path.name[: -len(SEGMENT_SUFFIX)]
            if not live.applied(table, sid):
                out.append((table, sid, path))
    return out


#: how many segments :func:`read_pending` reads ahead of the one being applied
READ_AHEAD = 8


def read_pending(run_dir: Path, live: LiveRun, ahead: int = READ_AHEAD) -> Iterator[tuple[str, str, Path, Any]]:
    """:func:`pending_segments`, each with its rows read (an Arrow table with the table's schema), in that order;
    up to ``ahead`` are read in parallel while the caller applies the one before (pyarrow reads without holding
    the GIL: a finished run's thousand segments are read in about half the time). A segment that cannot be read
    comes with the exception instead of rows, in its place; the rest are still read."""
    import pyarrow.parquet as pq

    from flowscope.model.schemas import schema

    def read(item: tuple[str, str, Path]) -> Any:
        try:
            return pq.read_table(item[2], schema=schema(item[0]))
        except (OSError, pa.ArrowInvalid) as exc:
            return exc

    pending = iter(pending_segments(run_dir, live))
    with ThreadPoolExecutor(max_workers=min(4, max(1, ahead)), thread_name_prefix="flowscope-read") as pool:
        queued = collections.deque((item, pool.submit(read, item)) for item in itertools.islice(pending, ahead))
        while queued:
            item, future = queued.popleft()
            nxt = next(pending, None)
            if nxt is not None:
                queued.append((nxt, pool.submit(read, nxt)))
            yield (*item, future.result())
