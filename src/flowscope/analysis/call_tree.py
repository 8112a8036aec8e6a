"""Call-path profiles: the calling-context tree of nested spans per resource, with inclusive / exclusive time
and call counts per call path, and the same tree merged across resources (min / mean / max / imbalance).

A span's parent is the span its ``parent_id`` names, on a resource where spans carry ``parent_id``;
elsewhere it is the innermost span of the same resource that encloses it in time. A resource whose spans
overlap without nesting (work running side by side on one resource, not calls), or whose span times were
placed by a rule rather than observed (attrs ``time_source``), is profiled flat: each span is a root. A call path is the sequence of span names from a root down to a span; recursion gives deeper
paths (``f > f``), so a path's inclusive time never counts the same interval twice.

Merged statistics are taken over every resource of the profile, a resource that never reached a call path
counting 0 for it (as a CUBE profile holds 0 for a process that did not visit a call path).
``imbalance = (max - mean) / max`` (0 when max is 0): the share of the slowest resource's time that spreading
the work evenly would save it; it is CrayPat's "Imb. Time %" without its ``n / (n - 1)`` factor, and
``max / mean = 1 / (1 - imbalance)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from flowscope.store.run import Run

NESTING_PARENT_ID = "parent_id"   # the resource's spans name their parent
NESTING_TIME = "time"             # nested by time: the innermost enclosing span is the parent
NESTING_FLAT = "flat"             # spans overlap without nesting: each is a root
NESTING_DERIVED = "derived"       # span times placed by a rule (attrs time_source), not observed: each is a root

#: the derived table ``call_tree`` (``table()``): one row per call path per resource, and one per call path
#: merged across resources (``resource_id`` null)
CALL_TREE = pa.schema([
    ("resource_id", pa.string()),            # null on the rows merged across resources
    ("path_id", pa.int64()),                 # the call path, the same id on every resource
    ("parent_path_id", pa.int64()),          # null for a root
    ("depth", pa.int64()),                   # 0 for a root
    ("name", pa.string()),                   # the last name of the path
    ("call_path", pa.list_(pa.string())),    # names from the root down, ending with ``name``
    ("calls", pa.int64()),
    ("inclusive_ns", pa.int64()),            # merged rows: summed over resources
    ("exclusive_ns", pa.int64()),
    ("resources", pa.int64()),               # resources that reached the path (1 on a per-resource row)
    ("inclusive_min_ns", pa.int64()),        # merged rows: over every resource of the profile, 0 where absent
    ("inclusive_mean_ns", pa.float64()),
    ("inclusive_max_ns", pa.int64()),
    ("inclusive_imbalance", pa.float64()),   # (max - mean) / max
    ("exclusive_min_ns", pa.int64()),
    ("exclusive_mean_ns", pa.float64()),
    ("exclusive_max_ns", pa.int64()),
    ("exclusive_imbalance", pa.float64()),
])


class CallTreeError(ValueError):
    """The spans' parent links do not form a tree."""


@dataclass
class CallTree:
    """A profile: call paths, their times per resource and merged across resources."""

    names: list[str]                  # the distinct span names; ``path_name`` codes into it
    path_parent: np.ndarray           # per path, the parent path or -1
    path_name: np.ndarray             # per path, code into ``names``
    path_depth: np.ndarray
    resources: list[str]              # every resource of the profile
    nesting: dict[str, str]           # per resource: parent_id | time | flat
    res: np.ndarray = field(repr=False)         # per (resource, path) row: code into ``resources``
    path: np.ndarray = field(repr=False)        # per row: the path
    calls: np.ndarray = field(repr=False)
    inclusive: np.ndarray = field(repr=False)
    exclusive: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.path_parent)

    def call_path(self, p: int) -> list[str]:
        """Names from the root down to path ``p``."""
        out = []
        while p >= 0:
            out.append(self.names[self.path_name[p]])
            p = int(self.path_parent[p])
        return out[::-1]

    def _call_paths(self) -> list[list[str]]:
        paths: list[list[str]] = [[] for _ in range(len(self))]
        for p in np.argsort(self.path_depth, kind="stable"):  # parents first
            parent = self.path_parent[p]
            paths[p] = [*(paths[parent] if parent >= 0 else []), self.names[self.path_name[p]]]
        return paths

    def merged(self) -> dict[str, np.ndarray]:
        """Per path: calls, resources, inclusive / exclusive sums and their min / mean / max / imbalance over
        every resource of the profile."""
        npaths, nres = len(self), max(len(self.resources), 1)
        out: dict[str, np.ndarray] = {
            "calls": np.bincount(self.path, weights=self.calls, minlength=npaths).astype(np.int64),
            "resources": np.bincount(self.path, minlength=npaths).astype(np.int64)}
        present = out["resources"]
        for metric, values in (("inclusive", self.inclusive), ("exclusive", self.exclusive)):
            total = np.bincount(self.path, weights=values, minlength=npaths)
            mx = np.zeros(npaths, np.int64)
            np.maximum.at(mx, self.path, values)
            mn = np.full(npaths, np.iinfo(np.int64).max, np.int64)
            np.minimum.at(mn, self.path, values)
            mn = np.where(present < nres, 0, mn)  # a resource without the path counts 0
            mean = total / nres
            out[f"{metric}_ns"] = np.rint(total).astype(np.int64)
            out[f"{metric}_min_ns"], out[f"{metric}_max_ns"], out[f"{metric}_mean_ns"] = mn, mx, mean
            with np.errstate(divide="ignore", invalid="ignore"):
                out[f"{metric}_imbalance"] = np.where(mx > 0, (mx - mean) / np.maximum(mx, 1), 0.0)
        return out

    def table(self) -> pa.Table:
        """The profile as the derived table ``call_tree`` (schema ``CALL_TREE``): per-resource rows, then the
        rows merged across resources (``resource_id`` null), each in (resource, path) order."""
        paths = self._call_paths()
        npaths, n = len(self), len(self.path)
        parent = pa.array(self.path_parent, mask=self.path_parent < 0)
        names = np.asarray(self.names, dtype=object)
        m = self.merged()
        null_i, null_f = pa.nulls(n, pa.int64()), pa.nulls(n, pa.float64())
        per_resource = pa.table({
            "resource_id": pa.array(np.asarray(self.resources, dtype=object)[self.res] if n else [], pa.string()),
            "path_id": self.path, "parent_path_id": parent.take(self.path), "depth": self.path_depth[self.path],
            "name": pa.array(names[self.path_name[self.path]] if n else [], pa.string()),
            "call_path": pa.array([paths[p] for p in self.path], pa.list_(pa.string())),
            "calls": self.calls, "inclusive_ns": self.inclusive, "exclusive_ns": self.exclusive,
            "resources": np.ones(n, np.int64),
            **{c: (null_f if c.endswith(("mean_ns", "imbalance")) else null_i)
               for c in CALL_TREE.names[10:]}}, schema=CALL_TREE)
        ids = np.arange(npaths, dtype=np.int64)
        merged = pa.table({
            "resource_id": pa.nulls(npaths, pa.string()), "path_id": ids, "parent_path_id": parent,
            "depth": self.path_depth, "name": pa.array(names[self.path_name] if npaths else [], pa.string()),
            "call_path": pa.array(paths, pa.list_(pa.string())),
            **{c: m[c] for c in CALL_TREE.names[6:]}}, schema=CALL_TREE)
        return pa.concat_tables([per_resource, merged])


# ---- building the tree ---------------------------------------------------------------------------------------

def _codes(arr: pa.ChunkedArray | pa.Array) -> tuple[list[str], np.ndarray]:
    enc = pc.dictionary_encode(arr)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.chunk(0) if enc.num_chunks else pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), [])
    return enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _parents_by_link(res: np.ndarray, sid: np.ndarray, has_sid: np.ndarray, pid: np.ndarray,
                     linked: np.ndarray) -> np.ndarray:
    """Per row, the row whose span_id is the row's parent_id (only for ``linked`` rows), else -1. A parent on
    the row's own resource wins: span ids from two imports into one run may repeat."""
    n = len(sid)
    parent = np.full(n, -1, np.int64)
    cand = np.flatnonzero(has_sid)
    rows = np.flatnonzero(linked)
    if not len(cand) or not len(rows):
        return parent
    usid, first, code = np.unique(sid[cand], return_index=True, return_inverse=True)
    pos = np.minimum(np.searchsorted(usid, pid[rows]), len(usid) - 1)
    found = usid[pos] == pid[rows]
    width = len(usid)
    keys = res[cand] * width + code
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    q = res[rows] * width + pos
    at = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
    same = found & (keys[at] == q)
    parent[rows[same]] = cand[order[at[same]]]
    other = found & ~same  # a parent on another resource: the first span with that id
    parent[rows[other]] = cand[first[pos[other]]]
    parent[parent == np.arange(n)] = -1  # a span naming itself has no parent
    return parent


def _derived_times(spans: pa.Table) -> np.ndarray:
    """Per span, whether its attrs say a rule placed its times (``time_source`` other than ``measured``)."""
    if "attrs" not in spans.column_names:
        return np.zeros(spans.num_rows, bool)
    attrs = spans["attrs"]
    tagged = pc.fill_null(pc.match_substring(attrs, '"time_source"'), False)
    measured = pc.fill_null(pc.match_substring_regex(attrs, r'"time_source"\s*:\s*"measured"'), False)
    return pc.and_(tagged, pc.invert(measured)).to_numpy(zero_copy_only=False)


def _depths(parent: np.ndarray, call_id: np.ndarray) -> np.ndarray:
    """Per row, the number of ancestors (work: the sum of the depths)."""
    depth = np.zeros(len(parent), np.int64)
    live = np.flatnonzero(parent >= 0)
    cur = parent[live]
    for _ in range(len(parent) + 1):
        if not len(live):
            return depth
        depth[live] += 1
        cur = parent[cur]
        keep = cur >= 0
        live, cur = live[keep], cur[keep]
    raise CallTreeError(f"spans: parent_id links form a cycle through span_id {int(call_id[live[0]])}")


def _nest_by_time(res: np.ndarray, start: np.ndarray, end: np.ndarray, rows: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parents and depths of ``rows`` (in resource, start, end-descending order) by time nesting on each
    resource, and per row whether its resource's spans cross (overlap without nesting)."""
    n = len(rows)
    parent, depth, crossed = np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    if not n:
        return parent, depth, crossed
    r, s, e = res[rows], start[rows], end[rows]
    # dense ranks of the times make (resource, time) one sortable int64 key
    times, inv = np.unique(np.concatenate([s, e]), return_inverse=True)
    span = len(times) + 1
    ks, ke = r * span + inv[:n], r * span + inv[n:]
    idx = np.arange(n, dtype=np.int64)
    first = np.searchsorted(r, r, side="left")                     # each resource's first row
    closed = np.searchsorted(np.sort(ke), ks, side="right") - first  # rows of the resource ended by my start
    # rows from me on that ended by my start: the zero-length spans at my start (me too), sorted last among
    # the spans that start when I do
    grp_first = np.searchsorted(ks, ks, side="left")
    grp_last = np.searchsorted(ks, ks, side="right") - 1
    cz = np.r_[0, np.cumsum(e == s)]
    later = np.minimum(cz[grp_last + 1] - cz[grp_first], grp_last - idx + 1)
    depth = (idx - first) - (closed - later)
    bad = depth < 0  # cannot happen with nested spans; kept as a crossing rather than trusted
    depth = np.maximum(depth, 0)
    # the parent is the last row before me one level up: levels in row order, from one stable sort
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
    for d in range(1, int(depth.max()) + 1):
        at, above = order[bounds[d]:bounds[d + 1]], order[bounds[d - 1]:bounds[d]]
        pos = np.searchsorted(above, at) - 1
        ok = pos >= 0
        parent[at[ok]] = above[pos[ok]]
    bad |= (parent >= 0) & ((e > e[np.maximum(parent, 0)]) | (r != r[np.maximum(parent, 0)]))
    if bad.any():
        crossed = np.isin(r, np.unique(r[bad]))
    return np.where(parent >= 0, rows[np.maximum(parent, 0)], -1), depth, crossed


def call_tree(spans: pa.Table, kinds: tuple[str, ...] | list[str] | None = None) -> CallTree:
    """The profile of ``spans`` (canonical spans schema), of the span ``kinds`` given (all if None)."""
    if kinds is not None:
        spans = spans.filter(pc.is_in(spans["kind"], value_set=pa.array(list(kinds), pa.string())))
    spans = spans.sort_by([("resource_id", "ascending"), ("start_ns", "ascending"), ("end_ns", "descending"),
                           ("name", "ascending")]).combine_chunks()
    n = spans.num_rows
    start = spans["start_ns"].to_numpy().astype(np.int64)
    end = spans["end_ns"].to_numpy().astype(np.int64)
    if n and (end < start).any():
        i = int(np.flatnonzero(end < start)[0])
        raise ValueError(f"spans: a span ends before it starts: {spans['name'][i].as_py()!r} on "
                         f"{spans['resource_id'][i].as_py()!r} start_ns={start[i]} end_ns={end[i]}")
    resources, res = _codes(spans["resource_id"]) if n else ([], np.zeros(0, np.int64))
    names, name = _codes(spans["name"]) if n else ([], np.zeros(0, np.int64))
    has_sid = ~pc.is_null(spans["span_id"]).to_numpy(zero_copy_only=False) if n else np.zeros(0, bool)
    has_pid = ~pc.is_null(spans["parent_id"]).to_numpy(zero_copy_only=False) if n else np.zeros(0, bool)
    sid = np.asarray(pc.fill_null(spans["span_id"], 0).to_numpy(), np.int64) if n else np.zeros(0, np.int64)
    pid = np.asarray(pc.fill_null(spans["parent_id"], 0).to_numpy(), np.int64) if n else np.zeros(0, np.int64)

    # a resource is linked when any of its spans names a parent
    linked_res = np.bincount(res, weights=has_pid, minlength=len(resources)) > 0
    linked = linked_res[res] if n else np.zeros(0, bool)
    parent = _parents_by_link(res, sid, has_sid, pid, linked & has_pid)
    # times a rule placed say nothing about nesting (tasks laid out as soon as possible overlap by construction)
    derived = _derived_times(spans) if n else np.zeros(0, bool)
    derived_res = (np.bincount(res, weights=derived, minlength=len(resources)) > 0) & ~linked_res
    timed = np.flatnonzero(~linked & ~derived_res[res])
    tparent, _, crossed = _nest_by_time(res, start, end, timed)
    parent[timed] = np.where(crossed, -1, tparent)
    nesting = {}
    for code, rid in enumerate(resources):
        nesting[rid] = NESTING_PARENT_ID if linked_res[code] else NESTING_DERIVED if derived_res[code] \
            else NESTING_TIME
    for code in np.unique(res[timed[crossed]]):
        nesting[resources[int(code)]] = NESTING_FLAT
    depth = _depths(parent, np.where(has_sid, sid, np.arange(n)))

    inclusive = end - start
    kids = np.flatnonzero(parent >= 0)
    child_time = np.bincount(parent[kids], weights=inclusive[kids], minlength=n).astype(np.int64)
    exclusive = np.maximum(inclusive - child_time, 0)

    # call paths level by level: a path is (parent path, name)
    path = np.full(n, -1, np.int64)
    path_parent: list[np.ndarray] = []
    path_name: list[np.ndarray] = []
    path_depth: list[np.ndarray] = []
    npaths, nnames = 0, max(len(names), 1)
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2 if n else 1))
    for d in range(len(bounds) - 1):
        rows = order[bounds[d]:bounds[d + 1]]
        if not len(rows):
            continue
        pp = path[parent[rows]] if d else np.full(len(rows), -1, np.int64)
        key = (pp + 1) * nnames + name[rows]
        uniq, inv = np.unique(key, return_inverse=True)
        path[rows] = npaths + inv
        path_parent.append(uniq // nnames - 1)
        path_name.append(uniq % nnames)
        path_depth.append(np.full(len(uniq), d, np.int64))
        npaths += len(uniq)

    # per (resource, path): calls, inclusive, exclusive
    key = res * max(npaths, 1) + path
    uniq, inv = np.unique(key, return_inverse=True)
    cat = (lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return CallTree(
        names=names, path_parent=cat(path_parent), path_name=cat(path_name), path_depth=cat(path_depth),
        resources=resources, nesting=nesting, res=uniq // max(npaths, 1), path=uniq % max(npaths, 1),
        calls=np.bincount(inv, minlength=len(uniq)).astype(np.int64),
        inclusive=np.bincount(inv, weights=inclusive, minlength=len(uniq)).astype(np.int64),
        exclusive=np.bincount(inv, weights=exclusive, minlength=len(uniq)).astype(np.int64))


def run_call_tree(run: Run, kinds: tuple[str, ...] | list[str] | None = None) -> CallTree:
    """The profile of the spans of ``run``."""
    return call_tree(run.arrow("spans", ["span_id", "parent_id", "resource_id", "kind", "name", "start_ns",
                                         "end_ns", "attrs"]), kinds)


def call_tree_table(run: Run, kinds: tuple[str, ...] | list[str] | None = None) -> pa.Table:
    """The derived table ``call_tree`` of ``run`` (schema ``CALL_TREE``)."""
    return run_call_tree(run, kinds).table()


def query(run: Run, sql: str, kinds: tuple[str, ...] | list[str] | None = None):
    """Run ``sql`` over ``run``'s tables plus the view ``call_tree``; returns a pandas DataFrame."""
    con = run.connection()
    con.register("call_tree", call_tree_table(run, kinds))
    return con.sql(sql).df()


# ---- Hatchet -------------------------------------------------------------------------------------------------

def to_hatchet(run: Run | CallTree, kinds: tuple[str, ...] | list[str] | None = None) -> Any:
    """The call tree of ``run`` as a Hatchet ``GraphFrame``: one node per call path, frames
    ``{"name", "type": "function"}``, the dataframe indexed by (node, rank) where ``rank`` numbers the
    resources in ``resources`` order (column ``resource_id`` names them); metrics ``time`` (exclusive,
    seconds), ``time (inc)`` and ``calls``. Needs llnl-hatchet (``pip install 'flowscope[profiles]'``)."""
    try:
        import hatchet
        from hatchet.frame import Frame
        from hatchet.graph import Graph
        from hatchet.node import Node
    except ImportError as exc:
        raise ImportError(f"to_hatchet needs llnl-hatchet, which cannot be imported ({exc}): "
                          f"pip install 'flowscope[profiles]' (or pip install llnl-hatchet)") from None
    import pandas as pd

    tree = run if isinstance(run, CallTree) else run_call_tree(run, kinds)
    nodes = []
    for p in range(len(tree)):
        nodes.append(Node(Frame({"name": tree.names[tree.path_name[p]], "type": "function"}), None, hnid=p,
                          depth=int(tree.path_depth[p])))
    roots = []
    for p in range(len(tree)):
        q = int(tree.path_parent[p])
        if q >= 0:
            nodes[q].add_child(nodes[p])
            nodes[p].add_parent(nodes[q])
        else:
            roots.append(nodes[p])
    graph = Graph(roots)
    graph.enumerate_traverse()
    df = pd.DataFrame({
        "node": [nodes[p] for p in tree.path], "rank": tree.res.astype(np.int64),
        "name": [tree.names[tree.path_name[p]] for p in tree.path],
        "resource_id": [tree.resources[r] for r in tree.res],
        "time": tree.exclusive / 1e9, "time (inc)": tree.inclusive / 1e9, "calls": tree.calls})
    df = df.set_index(["node", "rank"]).sort_index()
    return hatchet.GraphFrame(graph, df, exc_metrics=["time", "calls"], inc_metrics=["time (inc)"],
                              default_metric="time", metadata={"flowscope.nesting": tree.nesting})
