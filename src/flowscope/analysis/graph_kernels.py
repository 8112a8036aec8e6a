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

__all__ = ["MAX_SIZE", "GraphCycleError", "edge_arrays", "longest_length", "longest_to"]

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
    weights are zeros), with their sizes checked (below :data:`MAX_SIZE`, 1-D arrays of matching lengths).
    Endpoints and weights are checked by the sweep, which reads them anyway."""
    src, dst, ew, vw = _arrays(n, src, dst, edge_w, vertex_w)
    return src, dst, ew, np.zeros(n) if vw is None else vw


def _arrays(n: int, src, dst, edge_w, vertex_w) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    if not 0 <= n < MAX_SIZE:
        raise ValueError(f"the graph has {n:,} vertices; the longest path handles 0 to {MAX_SIZE - 1:,}")
    src = np.ascontiguousarray(src, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"src and dst must be 1-D arrays of the same length, got {src.shape} and {dst.shape}")
    if len(src) >= MAX_SIZE:
        raise ValueError(f"the graph has {len(src):,} edges; the longest path handles 0 to {MAX_SIZE - 1:,}")
    ew = np.zeros(len(src)) if edge_w is None else np.ascontiguousarray(edge_w, dtype=np.float64)
    vw = None if vertex_w is None else np.ascontiguousarray(vertex_w, dtype=np.float64)
    if ew.shape != src.shape:
        raise ValueError(f"edge weights: expected {len(src)} values, got {ew.shape}")
    if vw is not None and vw.shape != (n,):
        raise ValueError(f"vertex weights: expected {n} values, got {vw.shape}")
    return src, dst, ew, vw


def longest_to(n: int, src, dst, edge_w=None, vertex_w=None) -> np.ndarray:
    """dist[v] = the length of the longest path ending at v (a path's length sums the weights of its vertices
    and edges; duplicate edges count with their largest weight). Weights must be finite. ValueError naming the
    edge or vertex for an endpoint that is not a vertex number or a weight that is not finite;
    :class:`GraphCycleError` naming a vertex on a cycle when the graph has one."""
    src, dst, ew, vw = _arrays(n, src, dst, edge_w, vertex_w)
    dist = np.empty(n, dtype=np.float64)
    _sweep(n, src, dst, ew, vw, dist)
    return dist


def longest_length(n: int, src, dst, edge_w=None, vertex_w=None) -> float:
    """The length of the longest path (0.0 for no vertices); the same rules and errors as :func:`longest_to`,
    without handing out a length per vertex."""
    src, dst, ew, vw = _arrays(n, src, dst, edge_w, vertex_w)
    if n == 0 and len(src) == 0:
        return 0.0
    return _sweep(n, src, dst, ew, vw, None)


def _sweep(n: int, src: np.ndarray, dst: np.ndarray, ew: np.ndarray, vw: np.ndarray | None,
           dist: np.ndarray | None) -> float:
    status, i, reached, longest = _graph_kernels.longest(n, src, dst, ew, vw, dist)
    if status == 1:
        end = int(src[i]) if not 0 <= src[i] < n else int(dst[i])
        raise ValueError(f"edge {i} ({int(src[i])} -> {int(dst[i])}): {end} is not a vertex number in [0, {n})")
    if status == 2:
        raise ValueError(f"edge weights: edge {i} has weight {float(ew[i])!r}; weights must be finite")
    if status == 3:
        raise ValueError(f"vertex weights: vertex {i} has weight {float(vw[i])!r}; weights must be finite")
    if reached < n:
        if dist is None:
            dist = np.empty(n, dtype=np.float64)
            _graph_kernels.longest(n, src, dst, ew, vw, dist)
        raise _cycle_error(n, src, dst, ~np.isnan(dist))
    return float(longest)


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
