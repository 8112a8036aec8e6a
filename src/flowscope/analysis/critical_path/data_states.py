"""The Workflow Critical Path of a data-state graph (the Crux paper; vertices ``data_states``, edges ``mutations``):
traced back from a state through, at each state, the input that arrived last; offline over the tables
(:func:`data_state_path`) and maintained as batches arrive (:class:`IncrementalDataStatePath`, the collector's)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from flowscope.analysis.critical_path.steps import (
    COMPONENTS,
    CriticalPath,
    _steps_frame,
)
from flowscope.analysis.critical_path.tables import _attrs, _frame, _opt
from flowscope.model.idset import IdSet

_COMPUTE_KINDS = {"CONVERT", "MERGE", "SPLIT", "APPEND"}


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
