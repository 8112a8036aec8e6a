"""Data states and mutations (the Workflow Critical Path graph): the rules a record must keep.

A data state is a vertex (a piece of data at a place and time); a mutation is an edge
between two states (TRANSFER, CONVERT, APPEND, SPLIT, MERGE, DELETE). The rules, enforced
by the producer's API (client/data_states.py) and by the collector's /v1/runs/{run}/states and
/mutations endpoints alike: a kind is one of MUTATION_KINDS, both ends of a mutation exist (in
the run or in the same batch), sizes are not negative, a mutation's destination is not older
than its source, and an id names one thing only (repeating a record unchanged is a no-op).
:class:`StateIndex` checks a batch as a whole, so a refused batch writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.model.arrow_values import texts
from flowscope.model.conform import SchemaError, conform, records_to_table
from flowscope.model.idset import IdSet, hash_ids
from flowscope.model.schemas import MUTATION_KINDS

STATES, MUTATIONS = "data_states", "mutations"
_KINDS = texts(MUTATION_KINDS)  # not pa.array(), which imports pandas


class DataStateError(SchemaError):
    """A state or mutation breaks a rule of the data-state graph; names the record and the field."""

    def __init__(self, table: str, field: str, message: str, record: int | None = None):
        self.table, self.column, self.field, self.record = table, field, field, record
        self.message = message
        where = f"{table}[{record}].{field}" if record is not None else f"{table}.{field}"
        ValueError.__init__(self, f"{where}: {message}")


def _attrs(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def as_table(table: str, data: pa.Table | Mapping[str, Any] | Iterable[Mapping[str, Any]] | None) -> pa.Table:
    """``data`` (one record, records, a dict of columns or an Arrow table) as a canonical table."""
    if data is None:
        return records_to_table(table, [])
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return conform(table, data)
    if isinstance(data, Mapping):
        if data and all(isinstance(v, (list, tuple)) for v in data.values()):
            return conform(table, pa.table({k: list(v) for k, v in data.items()}))
        data = [data]
    records = []
    for rec in data:
        if isinstance(rec, Mapping) and not isinstance(rec.get("attrs"), (str, type(None))):
            rec = {**rec, "attrs": _attrs(rec["attrs"])}
        records.append(rec)
    return records_to_table(table, records)


def _first(mask: pa.ChunkedArray | pa.Array) -> int:
    return pc.index(mask.fill_null(False), True).as_py()


def _objects(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A string column as a numpy object array (None for nulls)."""
    return col.to_numpy(zero_copy_only=False) if len(col) else np.empty(0, dtype=object)


def _first_of_each(keys: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """For each row, the first row with the same key."""
    import pandas as pd  # here: a collector imports this module, and only a batch of mutations needs it

    codes, _ = pd.factorize(hashes)
    _, first = np.unique(codes, return_index=True)
    rep = first[codes]
    differ = keys[rep] != keys
    if differ.any():                                       # a hash collision inside the batch: go exact
        codes, _ = pd.factorize(keys)
        _, first = np.unique(codes, return_index=True)
        rep = first[codes]
    return rep


def mutation_ids(data: pa.Table) -> pa.ChunkedArray:
    """Each mutation's id: its own, or ``src->dst:KIND`` where it has none."""
    mid = data.column("mutation_id")
    default = pc.binary_join_element_wise(
        pc.binary_join_element_wise(data.column("src_state_id").fill_null(""),
                                    data.column("dst_state_id").fill_null(""), "->"),
        data.column("kind").fill_null(""), ":")
    if mid.null_count == len(mid):
        return default
    missing = pc.or_kleene(pc.is_null(mid), pc.equal(mid, ""))
    return pc.if_else(missing, default, mid)


def _size_text(v: int) -> int | None:
    return None if v < 0 else int(v)


class StateIndex:
    """What a run's data-state graph holds already: each state's time and size, each mutation's ends.

    Checks a whole batch at once (vectorised: kinds by set membership, ids by a hash join against the
    known states and the batch itself, times compared through that join). Not thread-safe; the
    collector holds one per run under a lock.
    """

    def __init__(self) -> None:
        self._states = IdSet()
        self._ts = np.empty(0, dtype=np.int64)
        self._size = np.empty(0, dtype=np.int64)         # -1: unknown size (negative sizes are refused)
        self._muts = IdSet()
        self._ends = np.empty((0, 3), dtype=object)       # per mutation row: src, dst, kind
        self._checked_states = self._checked_muts = None  # what the last check returned, to record it cheaply

    def __len__(self) -> int:
        return len(self._states)

    @property
    def n_mutations(self) -> int:
        """How many mutations are known."""
        return len(self._muts)

    def get(self, state_id: str) -> tuple[int, int | None] | None:
        """``(ts_ns, size_bytes)`` of a known state, else None."""
        row = self._states.lookup(np.array([state_id], dtype=object))[0]
        return None if row < 0 else (int(self._ts[row]), _size_text(self._size[row]))

    def __contains__(self, state_id: str) -> bool:
        return self.get(state_id) is not None

    def check_states(self, data: pa.Table) -> pa.Table:
        """The rows of ``data`` to write (repeats of known states dropped); DataStateError if any is bad."""
        n = data.num_rows
        if not n:
            return data
        size = data.column("size_bytes")
        neg = pc.less(size, 0)
        if pc.any(neg).as_py():
            i = _first(neg)
            raise DataStateError(STATES, "size_bytes", f"negative size {size[i].as_py()} "
                                 f"(state {data.column('state_id')[i].as_py()!r})", i)
        ids = _objects(data.column("state_id").fill_null(""))
        empty = ids == ""
        ts_col = data.column("ts_ns")
        if ts_col.null_count:
            i = _first(pc.is_null(ts_col))
            if not empty[:i].any():
                raise DataStateError(STATES, "ts_ns", f"is missing (state {ids[i]!r}): a state has a time", i)
        if empty.any():
            raise DataStateError(STATES, "state_id", "is empty", int(np.argmax(empty)))
        ts = ts_col.to_numpy()
        sz = size.fill_null(-1).to_numpy()
        h = hash_ids(ids)
        rep = _first_of_each(ids, h)
        known = self._states.lookup(ids, h)
        k = known >= 0
        have_ts, have_sz = ts[rep], sz[rep]
        have_ts[k], have_sz[k] = self._ts[known[k]], self._size[known[k]]
        bad = (have_ts != ts) | (have_sz != sz)
        if bad.any():
            i = int(np.argmax(bad))
            raise DataStateError(STATES, "state_id", f"{ids[i]!r} exists already with ts_ns={have_ts[i]}, "
                                 f"size_bytes={_size_text(have_sz[i])}; this record has ts_ns={ts[i]}, "
                                 f"size_bytes={_size_text(sz[i])} (a state id names one state)", i)
        keep = (rep == np.arange(n)) & ~k
        out = data if keep.all() else data.filter(pa.array(keep))
        self._checked_states = (out, ids[keep], h[keep])
        return out

    def _times(self, keys: np.ndarray, col: pa.ChunkedArray, batch_ids: pa.Array | None,
               batch_ts: np.ndarray | None) -> np.ndarray:
        """The time of each state in ``keys`` (the batch's states first, then the known ones); -1 where unknown."""
        out = np.full(len(keys), -1, dtype=np.int64)
        miss = np.ones(len(keys), dtype=bool)
        if batch_ids is not None:
            pos = pc.index_in(col, value_set=batch_ids).to_numpy(zero_copy_only=False)
            found = ~np.isnan(pos) if pos.dtype.kind == "f" else pos >= 0
            out[found] = batch_ts[pos[found].astype(np.int64)]
            miss = ~found
        if miss.any():
            rows = self._states.lookup(keys[miss])
            t = np.full(len(rows), -1, dtype=np.int64)
            t[rows >= 0] = self._ts[rows[rows >= 0]]
            out[miss] = t
        return out

    def check_mutations(self, data: pa.Table, new_states: pa.Table | None = None) -> pa.Table:
        """The rows of ``data`` to write, with mutation ids filled in; DataStateError if any is bad.

        Source and destination must be states of the run or of ``new_states`` (the same batch)."""
        n = data.num_rows
        if not n:
            return data
        kind = data.column("kind")
        bad = pc.invert(pc.is_in(kind, value_set=_KINDS))
        if pc.any(bad).as_py():
            i = _first(bad)
            raise DataStateError(MUTATIONS, "kind", f"{kind[i].as_py()!r} is not a mutation kind; "
                                 f"kinds are {', '.join(MUTATION_KINDS)}", i)
        batch_ids = batch_ts = None
        if new_states is not None and new_states.num_rows:
            batch_ids = new_states.column("state_id").combine_chunks()
            batch_ts = new_states.column("ts_ns").fill_null(-1).to_numpy()
        src_col, dst_col = data.column("src_state_id").fill_null(""), data.column("dst_state_id").fill_null("")
        src, dst = _objects(src_col), _objects(dst_col)
        t_src = self._times(src, src_col, batch_ids, batch_ts)
        t_dst = self._times(dst, dst_col, batch_ids, batch_ts)
        mids = mutation_ids(data)
        mid = _objects(mids)
        kinds = _objects(kind)
        mh = hash_ids(mid)
        rep = _first_of_each(mid, mh)
        known = self._muts.lookup(mid, mh)
        k = known >= 0
        again = np.flatnonzero((rep != np.arange(n)) | k)      # ids seen before: the same mutation?
        have = np.empty((n, 3), dtype=object)
        have[:, 0], have[:, 1], have[:, 2] = src, dst, kinds
        if len(again):
            r = rep[again]
            have[again] = np.stack([src[r], dst[r], kinds[r]], axis=1)
            ka = again[k[again]]
            have[ka] = self._ends[known[ka]]
        errors = [  # in the order a record is checked
            (t_src < 0, "src_state_id", lambda i: f"unknown state {src[i]!r}: post the state first "
                                                  f"(or in the same request)"),
            (t_dst < 0, "dst_state_id", lambda i: f"unknown state {dst[i]!r}: post the state first "
                                                  f"(or in the same request)"),
            (src == dst, "dst_state_id", lambda i: f"is the source itself ({src[i]!r})"),
            (t_dst < t_src, "dst_state_id", lambda i: f"state {dst[i]!r} (ts_ns={t_dst[i]}) is older than "
                                                      f"its source {src[i]!r} (ts_ns={t_src[i]})"),
            ((have[:, 0] != src) | (have[:, 1] != dst) | (have[:, 2] != kinds), "mutation_id",
             lambda i: f"{mid[i]!r} exists already as {have[i, 0]!r} -> {have[i, 1]!r} ({have[i, 2]})"),
        ]
        firsts = [(int(np.argmax(m)), j) for j, (m, _, _) in enumerate(errors) if m.any()]
        if firsts:
            i, j = min(firsts)
            raise DataStateError(MUTATIONS, errors[j][1], errors[j][2](i), i)
        data = data.set_column(0, "mutation_id", mids)
        keep = (rep == np.arange(n)) & ~k
        out = data if keep.all() else data.filter(pa.array(keep))
        self._checked_muts = (out, mid[keep], mh[keep], have[keep])
        return out

    def add_states(self, data: pa.Table, *, checked: bool = True) -> None:
        """Record written states (``checked``: as returned by :meth:`check_states`, so new and distinct)."""
        if not data.num_rows:
            return
        cached = getattr(self, "_checked_states", None)
        if checked and cached is not None and cached[0] is data:
            ids, h = cached[1], cached[2]
        else:
            ids = _objects(data.column("state_id").fill_null(""))
            h = hash_ids(ids)
        if not checked:  # rows from disk: keep the first of each id not known yet
            new = (_first_of_each(ids, h) == np.arange(len(ids))) & (self._states.lookup(ids, h) < 0)
            data, ids, h = data.filter(pa.array(new)), ids[new], h[new]
        self._states.add(ids, h)
        self._ts = np.concatenate([self._ts, data.column("ts_ns").fill_null(0).to_numpy()])
        self._size = np.concatenate([self._size, data.column("size_bytes").fill_null(-1).to_numpy()])

    def add_mutations(self, data: pa.Table, *, checked: bool = True) -> None:
        """Record written mutations (``checked``: as returned by :meth:`check_mutations`)."""
        if not data.num_rows:
            return
        cached = getattr(self, "_checked_muts", None)
        if checked and cached is not None and cached[0] is data:
            mid, h, ends = cached[1], cached[2], cached[3]
        else:
            mid = _objects(mutation_ids(data))
            h = hash_ids(mid)
            if not checked:
                new = (_first_of_each(mid, h) == np.arange(len(mid))) & (self._muts.lookup(mid, h) < 0)
                data, mid, h = data.filter(pa.array(new)), mid[new], h[new]
            ends = np.stack([_objects(data.column(c).fill_null("")) for c in ("src_state_id", "dst_state_id",
                                                                             "kind")], axis=1) \
                if data.num_rows else np.empty((0, 3), dtype=object)
        self._muts.add(mid, h)
        self._ends = np.concatenate([self._ends, ends])
