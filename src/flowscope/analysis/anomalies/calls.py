"""Function calls from spans: ordered per resource, with inclusive and exclusive time, parent, depth
and children count derived from ``parent_id`` where spans nest.

Spans without nesting (Dask task spans) are calls whose function is the span name (the task prefix)
and whose exclusive time is their inclusive time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class CallTreeError(ValueError):
    """The spans' parent links do not form a tree."""


@dataclass
class Calls:
    """One row per call, sorted by (resource, start, end descending, function): the calls of one
    resource are contiguous and in entry order, an enclosing call before the calls it encloses."""

    table: pa.Table            # the spans of the calls, in this order (canonical schema)
    call_id: np.ndarray        # spans.span_id when every call has one, else the row position
    resources: list[str]
    resource: np.ndarray       # code into ``resources``
    functions: list[str]
    func: np.ndarray           # code into ``functions``
    start: np.ndarray
    end: np.ndarray
    inclusive: np.ndarray
    exclusive: np.ndarray
    parent: np.ndarray         # row of the enclosing call, -1 for a root
    depth: np.ndarray
    children: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def metric(self, name: str) -> np.ndarray:
        return self.exclusive if name == "exclusive" else self.inclusive

    def resource_start(self) -> np.ndarray:
        """Per row, the row where its resource's calls begin."""
        first = np.flatnonzero(np.r_[True, self.resource[1:] != self.resource[:-1]]) if len(self) else \
            np.zeros(0, np.int64)
        run = np.cumsum(np.r_[True, self.resource[1:] != self.resource[:-1]]) - 1 if len(self) else first
        return first[run]

    def resource_end(self) -> np.ndarray:
        """Per row, one past the row where its resource's calls end."""
        if not len(self):
            return np.zeros(0, np.int64)
        change = np.r_[self.resource[1:] != self.resource[:-1], True]
        last = np.flatnonzero(change) + 1
        run = np.cumsum(np.r_[True, self.resource[1:] != self.resource[:-1]]) - 1
        return last[run]


def dictionary_codes(arr: pa.ChunkedArray | pa.Array) -> tuple[list, np.ndarray]:
    """The distinct values of ``arr`` in order of first appearance (a null as None) and each row's index into
    them."""
    enc = pc.dictionary_encode(arr, null_encoding="encode")
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks() if enc.num_chunks != 1 else enc.chunk(0)
    if isinstance(enc, pa.ChunkedArray):  # combine_chunks of a dictionary may give a chunked array back
        enc = enc.chunk(0)
    return enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def calls_from_spans(spans: pa.Table, kinds: tuple[str, ...] | None = ("task", "call", "state")) -> Calls:
    """The function calls among ``spans`` of the ``kinds`` given (all if None): the rows' ``role`` when they
    are ``activity`` rows (model/semantics.py), else their ``kind`` (a live source's own spans)."""
    if kinds is not None:
        column = "role" if "role" in spans.column_names else "kind"
        spans = spans.filter(pc.is_in(spans[column], value_set=pa.array(list(kinds), pa.string())))
    spans = spans.sort_by([("resource_id", "ascending"), ("start_ns", "ascending"), ("end_ns", "descending"),
                           ("name", "ascending")]).combine_chunks()
    n = spans.num_rows
    start = spans["start_ns"].to_numpy().astype(np.int64)
    end = spans["end_ns"].to_numpy().astype(np.int64)
    bad = np.flatnonzero(end < start)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"spans: {len(bad)} span(s) end before they start, e.g. {spans['name'][i].as_py()!r} on "
                         f"{spans['resource_id'][i].as_py()!r} start_ns={start[i]} end_ns={end[i]}")
    inclusive = end - start
    resources, resource = dictionary_codes(spans["resource_id"])
    functions, func = dictionary_codes(spans["name"])
    sid_col, pid_col = spans["span_id"], spans["parent_id"]
    have_ids = n > 0 and sid_col.null_count == 0
    call_id = sid_col.to_numpy().astype(np.int64) if have_ids else np.arange(n, dtype=np.int64)
    parent = np.full(n, -1, np.int64)
    exclusive = inclusive.copy()
    children = np.zeros(n, np.int64)
    depth = np.zeros(n, np.int64)
    if n and pid_col.null_count < n and sid_col.null_count < n:
        sid = np.asarray(sid_col.fill_null(np.iinfo(np.int64).min).to_numpy(), np.int64)
        has_parent = ~pc.is_null(pid_col).to_numpy(zero_copy_only=False)
        pid = np.asarray(pc.fill_null(pid_col, 0).to_numpy(), np.int64)
        order = np.argsort(sid, kind="stable")
        pos = np.searchsorted(sid[order], pid)
        pos = np.minimum(pos, n - 1)
        found = has_parent & (sid[order][pos] == pid)
        parent[found] = order[pos[found]]
        rows = np.flatnonzero(found)
        children = np.bincount(parent[rows], minlength=n).astype(np.int64)
        child_time = np.bincount(parent[rows], weights=inclusive[rows], minlength=n)
        exclusive = np.maximum(inclusive - child_time.astype(np.int64), 0)
        cur = parent.copy()
        for _ in range(n + 1):
            live = cur >= 0
            if not live.any():
                break
            depth[live] += 1
            cur[live] = parent[cur[live]]
        else:
            i = int(np.flatnonzero(cur >= 0)[0])
            raise CallTreeError(f"spans: parent_id links form a cycle through span_id {int(call_id[i])}")
    return Calls(spans, call_id, resources, resource, functions, func, start, end, inclusive, exclusive,
                 parent, depth, children)
