"""Longest paths of weighted DAGs given as edge arrays (vertices numbered 0..n-1), in one compiled O(V + E)
sweep whose cost does not depend on the depth of the graph.

The sweep is C (``_graph_kernels.c``, built with the package; it runs without the GIL). Why not a library:
rustworkx has to build its graph from Python tuples and call a Python weight function per edge, scipy.sparse.csgraph
has no longest path on a DAG, and numba, compiling the same loop, would add about 200 MB to an install and a
JIT-cache load to the first call in every process; docs/performance.md ("Longest path of a large DAG") has the
measurements.
"""

from __future__ import annotations

import numpy as np

from flowscope.analysis import _graph_kernels

__all__ = ["MAX_SIZE", "GraphCycleError", "edge_arrays", "longest_to"]

MAX_SIZE = 2**32 - 1     # vertices and edges: the sweep keeps 32-bit vertex numbers and edge positions


class GraphCycleError(ValueError):
    """The graph has a cycle. ``cycle`` lists the vertices of one cycle in edge order, from its smallest vertex
    number (the last one has an edge back to the first); ``vertex`` is that first vertex."""

    def __init__(self, message: str, cycle: list[int]):
        super().__init__(message)
        self.cycle = cycle
        self.vertex = cycle[0]


def edge_arrays(n: int, src, dst, edge_w=None, vertex_w=None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                       np.ndarray]:
    """The edges as contiguous int64 / float64 arrays (src, dst, edge weights, vertex weights; missing
    weights are zeros), checked: sizes below :data:`MAX_SIZE`, 1-D arrays of matching lengths, finite weights.
    Endpoints are checked by :func:`longest_to`."""
    if not 0 <= n < MAX_SIZE:
        raise ValueError(f"the graph has {n:,} vertices; the longest path handles 0 to {MAX_SIZE - 1:,}")
    src = np.ascontiguousarray(src, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"src and dst must be 1-D arrays of the same length, got {src.shape} and {dst.shape}")
    if len(src) >= MAX_SIZE:
        raise ValueError(f"the graph has {len(src):,} edges; the longest path handles 0 to {MAX_SIZE - 1:,}")
    ew = np.zeros(len(src)) if edge_w is None else np.ascontiguousarray(edge_w, dtype=np.float64)
    vw = np.zeros(n) if vertex_w is None else np.ascontiguousarray(vertex_w, dtype=np.float64)
    if ew.shape != src.shape:
        raise ValueError(f"edge weights: expected {len(src)} values, got {ew.shape}")
    if vw.shape != (n,):
        raise ValueError(f"vertex weights: expected {n} values, got {vw.shape}")
    for what, w in (("edge", ew), ("vertex", vw)):
        bad = ~np.isfinite(w)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{what} weights: {what} {i} has weight {float(w[i])!r}; weights must be finite")
    return src, dst, ew, vw


def longest_to(n: int, src, dst, edge_w=None, vertex_w=None) -> np.ndarray:
    """dist[v] = the length of the longest path ending at v (a path's length sums the weights of its vertices
    and edges; duplicate edges count with their largest weight). ValueError naming the edge when an endpoint
    is not a vertex number; :class:`GraphCycleError` naming a vertex on a cycle when the graph has one."""
    src, dst, ew, vw = edge_arrays(n, src, dst, edge_w, vertex_w)
    dist = np.empty(n, dtype=np.float64)
    # no vertex weights: the sweep skips reading n zeros at random places
    reached = _graph_kernels.longest_to(n, src, dst, ew, vw if vertex_w is not None else None, dist)
    if reached < 0:
        i = -reached - 2
        end = int(src[i]) if not 0 <= src[i] < n else int(dst[i])
        raise ValueError(f"edge {i} ({int(src[i])} -> {int(dst[i])}): {end} is not a vertex number in [0, {n})")
    if reached < n:
        raise _cycle_error(n, src, dst, ~np.isnan(dist))
    return dist


def _cycle_error(n: int, src: np.ndarray, dst: np.ndarray, reached: np.ndarray) -> GraphCycleError:
    """The sweep stopped with vertices left, each with an in-edge from another one left: walking such edges
    backwards from any of them must come round to a vertex already passed, which is on a cycle."""
    left = ~reached
    both = left[src] & left[dst]
    pred = np.full(n, -1, dtype=np.int64)
    pred[dst[both]] = src[both]
    step = np.full(n, -1, dtype=np.int64)
    v = int(np.flatnonzero(left)[0])
    walk: list[int] = []
    while step[v] < 0:
        step[v] = len(walk)
        walk.append(v)
        v = int(pred[v])
    cycle = walk[int(step[v]):][::-1]
    first = cycle.index(min(cycle))
    cycle = cycle[first:] + cycle[:first]
    shown = " -> ".join(map(str, cycle[:10] + [cycle[0]])) if len(cycle) <= 10 else \
        " -> ".join(map(str, cycle[:10])) + f" -> ... ({len(cycle)} vertices)"
    return GraphCycleError(f"the graph has a cycle through vertex {cycle[0]} ({shown}); {int(left.sum())} of {n} "
                           f"vertices are on a cycle or behind one", cycle)
