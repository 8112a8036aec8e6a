"""Workflow Critical Path (WCP): which chain of work and waiting decided when a workflow finished.

Two graphs, one module, used offline (over a stored run) and online (the collector, through
:class:`IncrementalDataStatePath`):

* the data-state graph of the Crux paper (vertices: ``data_states``; edges: ``mutations``). Every path between
  two timestamped states spans the same elapsed time, so the critical path is the *gating* chain: traced back
  from the final state, at each state the input that arrived last (:func:`data_state_path`);
* the task graph (``spans`` of kind task, ``dependencies``, ``transfers``): the *measured* path, traced back
  from the last task to finish through the gating input or the wait for a thread, and the *structural* path,
  the longest path through the DAG with the tasks' durations (:func:`task_graph_paths`); per-task slack,
  near-critical paths and what-if replays with scaled durations. When the task times were derived rather
  than measured (see :mod:`flowscope.analysis.timeline`), there were no waits to trace: only the structural
  path is given.

Every path is a :class:`CriticalPath`: a table of contiguous steps, each one component of the elapsed time
(compute, transfer, io, wait, queue), plus attribution helpers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa

from flowscope.analysis.graph_kernels import edge_arrays, longest_length, longest_to
from flowscope.analysis.timeline import MEASURED, task_timeline
from flowscope.model.idset import IdSet

__all__ = [
    "COMPONENTS", "CriticalPath", "TaskPaths", "IncrementalDataStatePath", "data_state_path", "task_graph_paths",
    "longest_path", "longest_path_length", "slack", "near_critical_paths", "what_if",
]

COMPONENTS = ("compute", "transfer", "io", "wait", "queue")
STEP_COLUMNS = ["id", "label", "kind", "start_ns", "end_ns", "duration_ns", "component", "location", "application"]
_COMPUTE_KINDS = {"CONVERT", "MERGE", "SPLIT", "APPEND"}


# ---- the result ----------------------------------------------------------------------------------------------

@dataclass
class CriticalPath:
    """A critical path as contiguous steps in time order.

    ``steps`` has one row per vertex reached (a state or a task, ``kind`` the mutation or "task") and one per
    wait, queue or transfer before it; ``duration_ns`` sums to ``length_ns``. ``ids`` lists the path's vertices
    in order (the first one, where the path starts, included)."""

    steps: pd.DataFrame
    length_ns: int
    ids: list[str] = field(default_factory=list)

    @property
    def start_ns(self) -> int | None:
        return int(self.steps["start_ns"].iloc[0]) if len(self.steps) else None

    @property
    def end_ns(self) -> int | None:
        return int(self.steps["end_ns"].iloc[-1]) if len(self.steps) else None

    def attribute(self, column: str) -> pd.DataFrame:
        """The path's time per value of ``column`` of ``steps``: ``duration_ns``, ``share`` (of the length),
        ``steps``; largest first."""
        if column not in self.steps.columns:
            raise KeyError(f"no column {column!r} in the critical path steps; known: {', '.join(self.steps.columns)}")
        s = self.steps[self.steps["duration_ns"] > 0]
        df = (s.groupby(s[column].fillna("(none)"), sort=False)["duration_ns"]
              .agg(["sum", "count"]).rename(columns={"sum": "duration_ns", "count": "steps"}).reset_index())
        df = df.rename(columns={column: column})
        df["duration_ns"] = df["duration_ns"].astype("int64")
        df["share"] = df["duration_ns"] / self.length_ns if self.length_ns > 0 else 0.0
        return df.sort_values("duration_ns", ascending=False, kind="stable").reset_index(drop=True)

    def by_kind(self) -> pd.DataFrame:
        """Time per mutation kind (TRANSFER, CONVERT, ..., "task", "WAIT", "QUEUE")."""
        return self.attribute("kind")

    def by_location(self) -> pd.DataFrame:
        """Time per location (a disk, a worker's memory, a thread)."""
        return self.attribute("location")

    def by_application(self) -> pd.DataFrame:
        """Time per application / task group."""
        return self.attribute("application")

    def by_component(self) -> pd.DataFrame:
        """Time split into compute / transfer / io / wait / queue (every component listed, zeros included)."""
        df = self.attribute("component").set_index("component")
        df = df.reindex(list(COMPONENTS) + [c for c in df.index if c not in COMPONENTS])
        df["duration_ns"] = df["duration_ns"].fillna(0).astype("int64")
        df["steps"] = df["steps"].fillna(0).astype("int64")
        df["share"] = df["share"].fillna(0.0)
        return df.reset_index()

    def to_dict(self) -> dict:
        """JSON-ready: length, vertex ids and steps (what the collector serves)."""
        return {"length_ns": int(self.length_ns), "ids": list(self.ids),
                "steps": json.loads(self.steps.to_json(orient="records"))}


def _steps_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=STEP_COLUMNS)
    for c in ("start_ns", "end_ns", "duration_ns"):
        df[c] = df[c].astype("int64")
    return df


def _frame(t: pd.DataFrame | pa.Table, name: str, required: Iterable[str]) -> pd.DataFrame:
    df = t.to_pandas() if isinstance(t, pa.Table) else t
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{name}: expected a pandas DataFrame or a pyarrow Table, got {type(t).__name__}")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: missing column(s) {', '.join(missing)}; has {', '.join(map(str, df.columns))}")
    return df


def _attrs(text) -> dict:
    if text is None or (isinstance(text, float) and np.isnan(text)) or text is pd.NA:
        return {}
    try:
        v = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def _opt(v):
    return None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v


# ---- the data-state graph ------------------------------------------------------------------------------------

def _is_storage(location) -> bool:
    loc = str(location or "").lower()
    return "disk" in loc or loc.startswith(("fs", "file")) or ":fs" in loc or "nfs" in loc or "lustre" in loc


def _mutation_component(kind: str, attrs: dict, src_loc, dst_loc) -> str:
    comp = attrs.get("component")
    if comp in COMPONENTS:
        return comp
    kind = str(kind).upper()
    if kind == "TRANSFER":
        return "io" if _is_storage(src_loc) or _is_storage(dst_loc) else "transfer"
    if kind == "DELETE":
        return "io"
    return "compute"


class _StateIndex:
    """Numeric view of states + mutations: state index, ts, and each mutation's (src, dst) indices."""

    def __init__(self, states: pd.DataFrame, mutations: pd.DataFrame):
        ids = states["state_id"].astype(str).to_numpy()
        self.ids = ids
        self.ts = states["ts_ns"].to_numpy(dtype=np.int64)
        uniq, first = np.unique(ids, return_index=True)
        if len(uniq) != len(ids):
            dup = pd.Series(ids)[pd.Series(ids).duplicated()].iloc[0]
            raise ValueError(f"data_states: state_id {dup!r} appears more than once")
        self._sorted_ids, self._sorted_pos = uniq, first
        self.src = self.lookup(mutations["src_state_id"].astype(str).to_numpy(), "src_state_id")
        self.dst = self.lookup(mutations["dst_state_id"].astype(str).to_numpy(), "dst_state_id")

    def lookup(self, keys: np.ndarray, column: str) -> np.ndarray:
        if len(self._sorted_ids) == 0:
            if len(keys):
                raise ValueError(f"mutations: {column} {keys[0]!r} (row 0) names no known data state")
            return np.zeros(0, dtype=np.int64)
        pos = np.searchsorted(self._sorted_ids, keys)
        pos_c = np.minimum(pos, len(self._sorted_ids) - 1)
        bad = self._sorted_ids[pos_c] != keys
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"mutations: {column} {keys[row]!r} (row {row}) names no known data state")
        return self._sorted_pos[pos_c].astype(np.int64)


def _gating_predecessors(ts: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """For each state, the mutation (row index) whose source arrived last; -1 for states without inputs.
    Ties go to the later mutation row."""
    gate = np.full(n, -1, dtype=np.int64)
    if len(src) == 0:
        return gate
    rows = np.arange(len(src))
    order = np.lexsort((rows, ts[src], dst))          # by dst, then source time, then row
    d = dst[order]
    last = np.flatnonzero(np.r_[d[1:] != d[:-1], True])  # last of each dst group = latest arrival
    gate[d[last]] = order[last]
    return gate


def _check_times(ts: np.ndarray, src: np.ndarray, dst: np.ndarray, mutations: pd.DataFrame) -> None:
    bad = ts[dst] < ts[src]
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"mutations: row {row} ({mutations['src_state_id'].iloc[row]!r} -> {mutations['dst_state_id'].iloc[row]!r})"
            f": the destination state (ts_ns {ts[dst[row]]}) is older than its source (ts_ns {ts[src[row]]})")


def _trace_states(states: pd.DataFrame, mutations: pd.DataFrame, ts: np.ndarray, src: np.ndarray,
                  gate: np.ndarray, target: int) -> CriticalPath:
    """Walk the gating chain back from ``target`` and lay it out as steps."""
    chain = [target]
    seen = {target}
    while gate[chain[-1]] >= 0:
        u = int(src[gate[chain[-1]]])
        if u in seen:
            raise ValueError(f"mutations: the gating chain of {states['state_id'].iloc[target]!r} has a cycle "
                             f"through {states['state_id'].iloc[u]!r}")
        seen.add(u)
        chain.append(u)
    chain.reverse()
    get = lambda col, i: _opt(states[col].iloc[i]) if col in states.columns else None  # noqa: E731
    rows: list[dict] = []
    first = chain[0]
    rows.append({"id": str(states["state_id"].iloc[first]), "label": get("label", first), "kind": "START",
                 "start_ns": int(ts[first]), "end_ns": int(ts[first]), "duration_ns": 0, "component": "wait",
                 "location": get("location", first), "application": get("origin", first)})
    for prev, v in zip(chain[:-1], chain[1:]):
        m = int(gate[v])
        mrow = mutations.iloc[m]
        attrs = _attrs(mrow.get("attrs"))
        kind = str(mrow["kind"]).upper()
        app = _opt(mrow.get("application")) or get("origin", v)
        t0, t1 = int(ts[prev]), int(ts[v])
        begin = attrs.get("start_ns")
        if isinstance(begin, (int, float)) and t0 < int(begin) <= t1:
            begin = int(begin)
            rows.append({"id": str(states["state_id"].iloc[v]), "label": get("label", v), "kind": "WAIT",
                         "start_ns": t0, "end_ns": begin, "duration_ns": begin - t0, "component": "wait",
                         "location": get("location", prev), "application": app})
            t0 = begin
        rows.append({"id": str(states["state_id"].iloc[v]), "label": get("label", v), "kind": kind,
                     "start_ns": t0, "end_ns": t1, "duration_ns": t1 - t0,
                     "component": _mutation_component(kind, attrs, get("location", prev), get("location", v)),
                     "location": get("location", v), "application": app})
    ids = [str(states["state_id"].iloc[i]) for i in chain]
    return CriticalPath(_steps_frame(rows), int(ts[chain[-1]] - ts[chain[0]]), ids)


def _target_index(states: pd.DataFrame, ts: np.ndarray, target: str | None, index: _StateIndex) -> int:
    if target is not None:
        return int(index.lookup(np.array([str(target)]), "target")[0])
    # the latest state; ties to the last row
    return int(len(ts) - 1 - np.argmax(ts[::-1]))


def data_state_path(states: pd.DataFrame | pa.Table, mutations: pd.DataFrame | pa.Table,
                    target: str | None = None) -> CriticalPath:
    """The Workflow Critical Path of a data-state graph, traced back from ``target`` (default: the latest
    state) through, at each state, the mutation whose source arrived last (at a MERGE, the input that arrived
    last). A mutation whose ``attrs`` carry ``start_ns`` (when the operation began) splits its edge into a
    wait (its input had arrived, nothing happened yet) and the operation itself. O(V + E)."""
    states = _frame(states, "data_states", ["state_id", "ts_ns"])
    mutations = _frame(mutations, "mutations", ["src_state_id", "dst_state_id", "kind"])
    if len(states) == 0:
        return CriticalPath(_steps_frame([]), 0, [])
    states = states.reset_index(drop=True)
    mutations = mutations.reset_index(drop=True)
    if states["ts_ns"].isna().any():
        raise ValueError(f"data_states: ts_ns is missing in row {int(np.flatnonzero(states['ts_ns'].isna())[0])}")
    index = _StateIndex(states, mutations)
    _check_times(index.ts, index.src, index.dst, mutations)
    gate = _gating_predecessors(index.ts, index.src, index.dst, len(states))
    return _trace_states(states, mutations, index.ts, index.src, gate,
                         _target_index(states, index.ts, target, index))


class IncrementalDataStatePath:
    """The data-state critical path maintained as states and mutations arrive in batches.

    ``add`` costs O(batch) (vectorised); ``current()`` walks the gating chain of the latest state. At any
    point ``current()`` equals :func:`data_state_path` over everything added so far. A mutation may arrive
    before its states; it waits until both are known."""

    def __init__(self) -> None:
        self._states: list[pd.DataFrame] = []
        self._mutations: list[pd.DataFrame] = []
        self._pos = IdSet()
        self._ts = np.zeros(0, dtype=np.int64)
        self._gate = np.zeros(0, dtype=np.int64)        # global mutation row of the gating input, or -1
        self._gate_ts = np.zeros(0, dtype=np.int64)     # arrival (source ts) of that input
        self._msrc = np.zeros(0, dtype=np.int64)        # per mutation row: src state index (-1 while unknown)
        self._mdst = np.zeros(0, dtype=np.int64)
        self._pending: np.ndarray = np.zeros(0, dtype=np.int64)  # mutation rows with an unknown state
        self._mids_src: list[np.ndarray] = []
        self._mids_dst: list[np.ndarray] = []
        self._cache: tuple[pd.DataFrame, pd.DataFrame] | None = None
        self._n_mut = 0

    def add(self, states: pd.DataFrame | pa.Table | None = None,
            mutations: pd.DataFrame | pa.Table | None = None) -> None:
        """Add a batch of states and/or mutations (canonical columns)."""
        if states is not None:
            st = _frame(states, "data_states", ["state_id", "ts_ns"]).reset_index(drop=True)
            if len(st):
                ids = st["state_id"].astype(str).to_numpy(dtype=object)
                again = self._pos.lookup(ids) >= 0
                dup = pd.Index(ids).duplicated()
                if again.any() or dup.any():
                    sid = ids[int(np.flatnonzero(again | dup)[0])]
                    raise ValueError(f"data_states: state_id {sid!r} was already added")
                self._pos.add(ids)
                self._states.append(st)
                self._ts = np.concatenate([self._ts, st["ts_ns"].to_numpy(dtype=np.int64)])
                self._gate = np.concatenate([self._gate, np.full(len(st), -1, dtype=np.int64)])
                self._gate_ts = np.concatenate([self._gate_ts, np.full(len(st), np.iinfo(np.int64).min)])
        new_rows = np.zeros(0, dtype=np.int64)
        if mutations is not None:
            mu = _frame(mutations, "mutations", ["src_state_id", "dst_state_id", "kind"]).reset_index(drop=True)
            if len(mu):
                self._mutations.append(mu)
                self._mids_src.append(mu["src_state_id"].astype(str).to_numpy(dtype=object))
                self._mids_dst.append(mu["dst_state_id"].astype(str).to_numpy(dtype=object))
                self._msrc = np.concatenate([self._msrc, np.full(len(mu), -1, dtype=np.int64)])
                self._mdst = np.concatenate([self._mdst, np.full(len(mu), -1, dtype=np.int64)])
                new_rows = np.arange(self._n_mut, self._n_mut + len(mu))
                self._n_mut += len(mu)
        self._cache = None
        self._resolve(np.concatenate([self._pending, new_rows]))

    def _resolve(self, rows: np.ndarray) -> None:
        if len(rows) == 0:
            self._pending = rows
            return
        src_ids = np.concatenate(self._mids_src)[rows]
        dst_ids = np.concatenate(self._mids_dst)[rows]
        s = self._pos.lookup(src_ids)
        d = self._pos.lookup(dst_ids)
        ok = (s >= 0) & (d >= 0)
        self._pending = rows[~ok]
        rows, s, d = rows[ok], s[ok], d[ok]
        if len(rows) == 0:
            return
        bad = self._ts[d] < self._ts[s]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"mutations: {src_ids[ok][i]!r} -> {dst_ids[ok][i]!r}: the destination state is older "
                             f"than its source")
        self._msrc[rows], self._mdst[rows] = s, d
        # per destination in this batch: the latest-arriving source, ties to the later row
        order = np.lexsort((rows, self._ts[s], d))
        dd = d[order]
        last = order[np.flatnonzero(np.r_[dd[1:] != dd[:-1], True])]
        cand_ts = self._ts[s[last]]
        better = cand_ts >= self._gate_ts[d[last]]      # >=: a later row wins a tie, as offline
        self._gate[d[last][better]] = rows[last][better]
        self._gate_ts[d[last][better]] = cand_ts[better]

    def _tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        if self._cache is None:
            st = pd.concat(self._states, ignore_index=True) if self._states else pd.DataFrame(
                {"state_id": [], "ts_ns": []})
            mu = pd.concat(self._mutations, ignore_index=True) if self._mutations else pd.DataFrame(
                {"src_state_id": [], "dst_state_id": [], "kind": []})
            self._cache = (st, mu)
        return self._cache

    @property
    def pending(self) -> int:
        """Mutations still waiting for one of their states."""
        return len(self._pending)

    def current(self, target: str | None = None) -> CriticalPath:
        """The critical path of everything added so far (to ``target``, default the latest state)."""
        if len(self._ts) == 0:
            return CriticalPath(_steps_frame([]), 0, [])
        states, mutations = self._tables()
        if target is not None:
            t = int(self._pos.lookup(np.array([str(target)], dtype=object))[0])
            if t < 0:
                raise ValueError(f"target: {target!r} names no known data state")
        else:
            t = int(len(self._ts) - 1 - np.argmax(self._ts[::-1]))
        return _trace_states(states, mutations, self._ts, self._msrc, self._gate, t)


# ---- longest paths on a weighted DAG (the structural critical path) -----------------------------------------

def _forward(n: int, src: np.ndarray, dst: np.ndarray, ew: np.ndarray, vw: np.ndarray) -> np.ndarray:
    """dist[v] = the longest path ending at v (vertex weights included)."""
    return longest_to(n, src, dst, ew, vw)


def longest_path_length(n: int, src, dst, edge_w=None, vertex_w=None) -> float:
    """Length of the longest path of a DAG of ``n`` vertices given as edge arrays, with weights on edges
    and/or vertices (a path's length sums both). Duplicate edges count with their largest weight. Weights
    must be finite; ValueError naming the edge for an endpoint that is not a vertex number,
    :class:`~flowscope.analysis.graph_kernels.GraphCycleError` (a ValueError) naming a vertex on a cycle.
    One compiled O(V + E) sweep, whatever the depth of the graph."""
    return longest_length(n, src, dst, edge_w, vertex_w)


def longest_path(n: int, src, dst, edge_w=None, vertex_w=None) -> tuple[float, list[int]]:
    """The longest path of a DAG given as edge arrays: (length, vertices in order). See
    :func:`longest_path_length`."""
    if n == 0:
        return 0.0, []
    src, dst, ew, vw = edge_arrays(n, src, dst, edge_w, vertex_w)
    dist = _forward(n, src, dst, ew, vw)
    pred = _predecessors(n, src, dst, ew, vw, dist)
    end = int(np.argmax(dist))
    return float(dist[end]), _walk(pred, end)


def _predecessors(n, src, dst, ew, vw, dist) -> np.ndarray:
    """pred[v] = the in-neighbour realising dist[v] (-1 for path starts)."""
    pred = np.full(n, -1, dtype=np.int64)
    if len(src):
        cand = dist[src] + ew + vw[dst]
        tight = np.isclose(cand, dist[dst], rtol=1e-12, atol=1e-9)
        pred[dst[tight]] = src[tight]
    return pred


def _walk(pred: np.ndarray, end: int) -> list[int]:
    path = [end]
    while pred[path[-1]] >= 0:
        path.append(int(pred[path[-1]]))
    path.reverse()
    return path


# ---- the task graph ------------------------------------------------------------------------------------------

@dataclass
class _TaskGraph:
    tasks: pd.DataFrame      # key, group, start_ns, end_ns, resource_id, worker; index = vertex number
    src: np.ndarray          # dependency edges (vertex numbers)
    dst: np.ndarray
    xfer_start: np.ndarray   # per edge: the transfer that brought src's output to dst's worker (-1: none)
    xfer_end: np.ndarray

    @property
    def n(self) -> int:
        return len(self.tasks)

    @property
    def duration(self) -> np.ndarray:
        return (self.tasks["end_ns"] - self.tasks["start_ns"]).to_numpy(dtype=np.int64)

    @property
    def xfer_time(self) -> np.ndarray:
        return np.where(self.xfer_start >= 0, self.xfer_end - self.xfer_start, 0).astype(np.int64)

    @property
    def arrival(self) -> np.ndarray:
        """Per edge: when src's output was available on dst's worker."""
        end = self.tasks["end_ns"].to_numpy(dtype=np.int64)[self.src]
        return np.where(self.xfer_start >= 0, np.maximum(end, self.xfer_end), end)


def _worker_of(attrs: pd.Series) -> pd.Series:
    def one(text):
        w = _attrs(text).get("worker")
        return f"worker:{w}" if w and not str(w).startswith("worker:") else w
    return attrs.map(one)


def _task_graph(spans, dependencies, transfers=None) -> _TaskGraph:
    spans = _frame(spans, "spans", ["kind", "name", "start_ns", "end_ns", "task_key"])
    t = spans[(spans["kind"] == "task") & spans["task_key"].notna()]
    # a task that ran twice (a retry, a lost worker): its last execution is the one that counted
    t = t.sort_values("end_ns", kind="stable").drop_duplicates("task_key", keep="last")
    t = t.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    worker = _worker_of(t["attrs"]) if "attrs" in t.columns else pd.Series([None] * len(t))
    tasks = pd.DataFrame({"key": t["task_key"].astype(str), "group": t["name"].astype(str),
                          "start_ns": t["start_ns"].astype("int64"), "end_ns": t["end_ns"].astype("int64"),
                          "resource_id": t["resource_id"].astype(str) if "resource_id" in t.columns else None,
                          "worker": worker.astype(object)})
    if (tasks["end_ns"] < tasks["start_ns"]).any():
        row = tasks[tasks["end_ns"] < tasks["start_ns"]].iloc[0]
        raise ValueError(f"spans: task {row['key']!r} ends before it starts")
    pos = pd.Series(np.arange(len(tasks)), index=tasks["key"])
    deps = _frame(dependencies, "dependencies", ["task_key", "depends_on"])
    deps = deps[["task_key", "depends_on"]].astype(str).drop_duplicates()
    deps = deps[deps["task_key"].isin(pos.index) & deps["depends_on"].isin(pos.index)]
    src = pos.reindex(deps["depends_on"]).to_numpy(dtype=np.int64)
    dst = pos.reindex(deps["task_key"]).to_numpy(dtype=np.int64)
    # a dependent that started before its dependency did is another execution than the one kept: drop the edge
    starts = tasks["start_ns"].to_numpy(dtype=np.int64)
    ok = starts[dst] >= starts[src]
    src, dst = src[ok], dst[ok]
    xs = np.full(len(src), -1, dtype=np.int64)
    xe = np.full(len(src), -1, dtype=np.int64)
    if transfers is not None and len(src):
        tr = _frame(transfers, "transfers", ["dst_resource_id", "start_ns", "end_ns", "keys"])
        if len(tr):
            tr = tr[["dst_resource_id", "start_ns", "end_ns", "keys"]].explode("keys").dropna(subset=["keys"])
            # the first copy of a key to reach a worker is the one its dependents used
            tr = tr.sort_values("end_ns", kind="stable").drop_duplicates(["keys", "dst_resource_id"])
            edges = pd.DataFrame({"key": tasks["key"].to_numpy()[src],
                                  "worker": tasks["worker"].to_numpy()[dst], "row": np.arange(len(src))})
            m = edges.merge(tr, left_on=["key", "worker"], right_on=["keys", "dst_resource_id"], how="inner")
            if len(m):
                rows = m["row"].to_numpy()
                xs[rows] = m["start_ns"].to_numpy(dtype=np.int64)
                xe[rows] = m["end_ns"].to_numpy(dtype=np.int64)
    return _TaskGraph(tasks, src, dst, xs, xe)


@dataclass
class TaskPaths:
    """The measured and the structural critical path of a task graph (see :func:`task_graph_paths`).
    ``measured`` is None when the task times were derived, not measured (``timeline`` says which)."""

    measured: CriticalPath | None
    structural: CriticalPath
    timeline: str = MEASURED

    @property
    def difference_ns(self) -> int | None:
        """Measured minus structural length: what scheduling and contention for workers cost (None without a
        measured path)."""
        if self.measured is None:
            return None
        return int(self.measured.length_ns - self.structural.length_ns)


def _step(id_, label, kind, start, end, component, location, application) -> dict:
    return {"id": id_, "label": label, "kind": kind, "start_ns": int(start), "end_ns": int(end),
            "duration_ns": int(end - start), "component": component, "location": location,
            "application": application}


def _measured_path(g: _TaskGraph) -> CriticalPath:
    tasks = g.tasks
    if g.n == 0:
        return CriticalPath(_steps_frame([]), 0, [])
    start = tasks["start_ns"].to_numpy(dtype=np.int64)
    end = tasks["end_ns"].to_numpy(dtype=np.int64)
    t0 = int(start.min())
    arrival = g.arrival
    # per task: the input edge that arrived last (ties: later row)
    gate = np.full(g.n, -1, dtype=np.int64)
    if len(g.src):
        rows = np.arange(len(g.src))
        order = np.lexsort((rows, arrival, g.dst))
        d = g.dst[order]
        last = np.flatnonzero(np.r_[d[1:] != d[:-1], True])
        gate[d[last]] = order[last]
    # per task: the input that finished last (when all inputs existed, so the scheduler could place it)
    gate_end = np.full(g.n, -1, dtype=np.int64)
    if len(g.src):
        order = np.lexsort((rows, end[g.src], g.dst))
        d = g.dst[order]
        last = np.flatnonzero(np.r_[d[1:] != d[:-1], True])
        gate_end[d[last]] = order[last]
    # per task: the task that ran before it on the same thread
    prev_on_thread = np.full(g.n, -1, dtype=np.int64)
    res = tasks["resource_id"].to_numpy()
    if res is not None:
        o = np.lexsort((start, pd.factorize(pd.Series(res, dtype=object))[0]))
        same = np.r_[False, res[o][1:] == res[o][:-1]]
        prev_on_thread[o[same]] = o[np.flatnonzero(same) - 1]
    v = int(np.argmax(end))     # ties: the first to finish among equals is fine (same end time)
    rows: list[dict] = []
    chain = [v]
    cursor = int(end[v])
    keys, groups, workers = tasks["key"].to_numpy(), tasks["group"].to_numpy(), tasks["worker"].to_numpy()
    while True:
        key, grp, loc = keys[v], groups[v], workers[v] if workers[v] is not None else res[v]
        s = min(int(start[v]), cursor)
        rows.append(_step(key, grp, "task", s, cursor, "compute", loc, grp))
        cursor = s
        e = int(gate[v])
        data_ready = int(arrival[e]) if e >= 0 else t0
        p = int(prev_on_thread[v])
        thread_free = int(end[p]) if p >= 0 else t0
        if e >= 0 and data_ready >= thread_free:
            # the inputs were the last thing it waited for; after they arrived it queued for the scheduler
            q = min(data_ready, cursor)
            if q < cursor:
                rows.append(_step(key, grp, "QUEUE", q, cursor, "queue", loc, grp))
            cursor = q
            u = int(g.src[e])
            if g.xfer_start[e] >= 0:
                xs, xe = max(int(g.xfer_start[e]), int(end[u])), min(int(g.xfer_end[e]), cursor)
                xs = min(xs, xe)
                if xe < cursor:
                    rows.append(_step(key, grp, "QUEUE", xe, cursor, "queue", loc, grp))
                rows.append(_step(keys[u], groups[u], "TRANSFER", xs, xe, "transfer", loc, groups[u]))
                cursor = xs
                # a fetch starts once the task is placed, i.e. after its last input finished: that input
                # (not necessarily the one fetched last) is what the path continues through
                u = int(g.src[gate_end[v]])
                if int(end[u]) < cursor:
                    rows.append(_step(keys[u], groups[u], "WAIT", min(int(end[u]), cursor), cursor, "wait",
                                      loc, groups[u]))
                    cursor = min(int(end[u]), cursor)
            v = u
            chain.append(v)
            continue
        if p >= 0 and thread_free > t0:
            # ready earlier (or no inputs) but its thread was busy with another task: queueing
            q = min(thread_free, cursor)
            if q < cursor:
                rows.append(_step(key, grp, "QUEUE", q, cursor, "queue", loc, grp))
            cursor = q
            v = p
            chain.append(v)
            continue
        if cursor > t0:
            rows.append(_step(key, grp, "QUEUE", t0, cursor, "queue", loc, grp))
        break
    rows.reverse()
    chain.reverse()
    return CriticalPath(_steps_frame(rows), int(end.max()) - t0, [str(keys[i]) for i in chain])


def _structural_path(g: _TaskGraph) -> CriticalPath:
    if g.n == 0:
        return CriticalPath(_steps_frame([]), 0, [])
    dur, xt = g.duration, g.xfer_time
    length, path = longest_path(g.n, g.src, g.dst, xt.astype(np.float64), dur.astype(np.float64))
    keys, groups = g.tasks["key"].to_numpy(), g.tasks["group"].to_numpy()
    locs = g.tasks["worker"].to_numpy()
    edge_of = {}
    if len(path) > 1:
        want = set(zip(path[:-1], path[1:]))
        for i, (a, b) in enumerate(zip(g.src.tolist(), g.dst.tolist())):
            if (a, b) in want:
                edge_of[(a, b)] = max(edge_of.get((a, b), 0), int(xt[i]))
    rows: list[dict] = []
    t = 0
    for i, v in enumerate(path):
        if i:
            w = edge_of.get((path[i - 1], v), 0)
            if w:
                rows.append(_step(keys[path[i - 1]], groups[path[i - 1]], "TRANSFER", t, t + w, "transfer",
                                  locs[v], groups[path[i - 1]]))
                t += w
        rows.append(_step(keys[v], groups[v], "task", t, t + int(dur[v]), "compute", locs[v], groups[v]))
        t += int(dur[v])
    return CriticalPath(_steps_frame(rows), int(round(length)), [str(keys[v]) for v in path])


def task_graph_paths(spans: pd.DataFrame | pa.Table, dependencies: pd.DataFrame | pa.Table,
                     transfers: pd.DataFrame | pa.Table | None = None) -> TaskPaths:
    """The measured critical path (traced back from the last task to finish: at each task its gating input,
    with the transfer that brought it, or the task before it on its thread when the inputs were ready earlier)
    and the structural one (the longest path through the dependency DAG with the tasks' durations and transfer
    times as weights: the makespan with unlimited workers). Times in ``steps`` of the structural path are
    offsets from 0. When any task span's times were derived rather than measured (its attrs' ``time_source``),
    there is no measured path (None): a derived timeline has no observed waits to trace through."""
    timeline = task_timeline(spans) or MEASURED
    g = _task_graph(spans, dependencies, transfers)
    return TaskPaths(_measured_path(g) if timeline == MEASURED else None, _structural_path(g), timeline)


def slack(spans: pd.DataFrame | pa.Table, dependencies: pd.DataFrame | pa.Table,
          transfers: pd.DataFrame | pa.Table | None = None) -> pd.DataFrame:
    """Per task, how much longer it could have taken without lengthening the structural critical path:
    columns key, group, duration_ns, slack_ns (0 on the critical path), sorted by slack."""
    g = _task_graph(spans, dependencies, transfers)
    if g.n == 0:
        return pd.DataFrame({"key": [], "group": [], "duration_ns": [], "slack_ns": []})
    dur = g.duration.astype(np.float64)
    xt = g.xfer_time.astype(np.float64)
    to = _forward(g.n, g.src, g.dst, xt, dur)             # longest path ending at v, v included
    frm = _forward(g.n, g.dst, g.src, xt, dur)            # longest path starting at v, v included
    length = to.max()
    sl = length - (to + frm - dur)
    out = pd.DataFrame({"key": g.tasks["key"], "group": g.tasks["group"], "duration_ns": g.duration,
                        "slack_ns": np.maximum(np.rint(sl), 0).astype(np.int64)})
    return out.sort_values(["slack_ns", "key"], kind="stable").reset_index(drop=True)


def near_critical_paths(spans: pd.DataFrame | pa.Table, dependencies: pd.DataFrame | pa.Table,
                        transfers: pd.DataFrame | pa.Table | None = None, k: int = 5) -> list[tuple[int, list[str]]]:
    """Up to ``k`` distinct long paths of the structural graph, longest first, as (length_ns, task keys).
    The first is the critical path; each next one is the longest path through a dependency edge not on any
    path listed before (so the second is exactly the second-longest path)."""
    g = _task_graph(spans, dependencies, transfers)
    if g.n == 0 or k <= 0:
        return []
    dur = g.duration.astype(np.float64)
    xt = g.xfer_time.astype(np.float64)
    to = _forward(g.n, g.src, g.dst, xt, dur)
    frm = _forward(g.n, g.dst, g.src, xt, dur)
    pred = _predecessors(g.n, g.src, g.dst, xt, dur, to)
    succ = _predecessors(g.n, g.dst, g.src, xt, dur, frm)
    keys = g.tasks["key"].to_numpy()
    end = int(np.argmax(to))
    first = _walk(pred, end)
    out = [(int(round(to[end])), [str(keys[v]) for v in first])]
    used = set(zip(first[:-1], first[1:]))
    through = to[g.src] + xt + frm[g.dst]
    for e in np.argsort(-through, kind="stable"):
        if len(out) >= k:
            break
        a, b = int(g.src[e]), int(g.dst[e])
        if (a, b) in used:
            continue
        path = _walk(pred, a) + list(reversed(_walk(succ, b)))
        edges = set(zip(path[:-1], path[1:]))
        used |= edges
        out.append((int(round(through[e])), [str(keys[v]) for v in path]))
    return out


def what_if(spans: pd.DataFrame | pa.Table, dependencies: pd.DataFrame | pa.Table,
            transfers: pd.DataFrame | pa.Table | None = None, scale: dict[str, float] | None = None) -> int:
    """The makespan (ns) a replay of the run would have with scaled durations: ``scale`` maps a task group
    to a factor for its tasks' durations, and "transfer" / "queue" to factors for all transfer times / all
    observed queueing. The replay keeps each task on its thread in the observed order and starts it when
    its inputs have arrived and its thread is free, plus the lag it was observed to wait beyond that; so
    with every factor 1.0 it returns the measured makespan exactly."""
    scale = dict(scale or {})
    g = _task_graph(spans, dependencies, transfers)
    if g.n == 0:
        return 0
    groups = g.tasks["group"].to_numpy()
    unknown = [k for k in scale if k not in ("transfer", "queue") and k not in set(groups)]
    if unknown:
        raise ValueError(f"what_if: no task group {unknown[0]!r}; groups: {', '.join(sorted(set(groups)))}")
    for k, f in scale.items():
        if not (isinstance(f, (int, float)) and f >= 0):
            raise ValueError(f"what_if: scale[{k!r}] must be a number >= 0, got {f!r}")
    start = g.tasks["start_ns"].to_numpy(dtype=np.int64)
    end = g.tasks["end_ns"].to_numpy(dtype=np.int64)
    t0 = int(start.min())
    n = g.n
    factor = np.array([float(scale.get(x, 1.0)) for x in groups])
    dur = (end - start) * factor
    fx, fq = float(scale.get("transfer", 1.0)), float(scale.get("queue", 1.0))
    # constraints u -> v with lag: v may start lag after u ends. Vertex n is the run's start (weight 0).
    # a fetch starts only once its dependent is placed (after its last input): only the transfer itself
    # sits on the edge; the wait before it is part of the dependent's observed extra wait
    xt = g.xfer_time
    arrival = end[g.src] + xt
    data_lag = xt * fx
    res = g.tasks["resource_id"].to_numpy()
    o = np.lexsort((start, pd.factorize(pd.Series(res, dtype=object))[0]))
    same = np.r_[False, res[o][1:] == res[o][:-1]]
    t_src, t_dst = o[np.flatnonzero(same) - 1], o[same]
    # how long each task waited past its binding constraint: kept (scaled by "queue") on that constraint
    ready = np.full(n, t0, dtype=np.int64)
    if len(g.src):
        np.maximum.at(ready, g.dst, np.minimum(arrival, start[g.dst]))
    if len(t_src):
        np.maximum.at(ready, t_dst, np.minimum(end[t_src], start[t_dst]))
    extra = np.maximum(start - ready, 0) * fq
    # spans of one thread may overlap by a few microseconds (where the end is taken), and clocks of two
    # processes differ: a constraint that the observed start violates gets a negative lag, so that with
    # every factor 1.0 the replay starts each task exactly when it started
    over_d = np.maximum(arrival - start[g.dst], 0) if len(g.src) else np.zeros(0)
    over_t = np.maximum(end[t_src] - start[t_dst], 0)
    src = np.concatenate([g.src, t_src, np.full(n, n)])
    dst = np.concatenate([g.dst, t_dst, np.arange(n)])
    w = np.concatenate([data_lag - over_d, -over_t.astype(np.float64), np.zeros(n)])  # all released at t0
    # the extra wait sits on the vertex, before it runs
    vw = np.concatenate([dur + extra, [0.0]])
    return int(round(longest_path_length(n + 1, src, dst, w, vw)))
