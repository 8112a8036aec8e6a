"""Longest paths of a weighted DAG given as edge arrays, as a length or with its vertices in order (the structural
critical path's core; the sweep itself is :mod:`flowscope.analysis.graph_kernels`)."""

from __future__ import annotations

import numpy as np

from flowscope.analysis.graph_kernels import edge_arrays, longest_length, longest_to


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
