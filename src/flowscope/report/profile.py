"""The report's call profile: a flame graph of the call tree (plotly icicle, root at the bottom) merged across
resources and per resource, and the call paths with the most exclusive time."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from flowscope.analysis.call_tree import CallTree

MAX_PATHS = 3000        # call paths drawn in the merged flame graph: the most inclusive time, with their callers
MAX_PATHS_RESOURCE = 1000  # in each per-resource flame graph
MAX_RESOURCES = 24      # per-resource flame graphs offered beside the merged one


def _kept(parent: np.ndarray, inclusive: np.ndarray, limit: int) -> np.ndarray:
    """The ``limit`` paths with the most inclusive time, and their ancestors (a boolean mask)."""
    keep = np.zeros(len(parent), bool)
    for p in np.argsort(-inclusive, kind="stable")[:limit]:
        while p >= 0 and not keep[p]:
            keep[p] = True
            p = parent[p]
    return keep


def _icicle(tree: CallTree, inclusive: np.ndarray, exclusive: np.ndarray, calls: np.ndarray,
            extra: list[np.ndarray] | None, present: np.ndarray, visible: bool, root_label: str,
            limit: int) -> go.Icicle:
    keep = present & _kept(tree.path_parent, np.where(present, inclusive, -1), limit)
    ids = np.flatnonzero(keep)
    parents = tree.path_parent[ids]
    names = [tree.names[c] for c in tree.path_name[ids]]
    # each box is its exclusive time plus its children's boxes; a box dropped by MAX_PATHS leaves a gap
    custom = np.column_stack([inclusive[ids] / 1e9, exclusive[ids] / 1e9, calls[ids],
                              *([e[ids] for e in extra] if extra else [])])
    hover = ("<b>%{label}</b><br>inclusive %{customdata[0]:.6f} s<br>exclusive %{customdata[1]:.6f} s"
             "<br>calls %{customdata[2]:,}")
    if extra:
        hover += ("<br>per resource: min %{customdata[3]:.6f} s, mean %{customdata[4]:.6f} s, "
                  "max %{customdata[5]:.6f} s<br>imbalance (max - mean) / max: %{customdata[6]:.1%}")
    # one base box under the roots, so that several roots (threads' tasks, ranks' main) share a floor
    root = ["all"]
    custom = np.vstack([np.full((1, custom.shape[1]), np.nan), custom])
    return go.Icicle(ids=root + [str(i) for i in ids], parents=[""] + ["all" if p < 0 else str(p) for p in parents],
                     labels=[root_label] + names, values=np.r_[0, exclusive[ids]], branchvalues="remainder",
                     customdata=custom,
                     hovertemplate=hover + "<extra></extra>", tiling={"orientation": "v", "flip": "y"},
                     root={"color": "white"}, maxdepth=-1, visible=visible, sort=False,
                     marker={"colors": np.r_[0, inclusive[ids]], "colorscale": "YlOrRd", "showscale": False})


def flame_graph(tree: CallTree, labels: dict[str, str] | None = None) -> go.Figure | None:
    """The call tree as a flame graph: merged across resources, with a menu to show one resource instead.
    None when there are no spans. Spans that nest in no other (tasks) are the roots: a flat profile."""
    if not len(tree):
        return None
    labels = labels or {}
    npaths = len(tree)
    m = tree.merged()
    traces = [_icicle(tree, m["inclusive_ns"], m["exclusive_ns"], m["calls"],
                      [m["inclusive_min_ns"] / 1e9, m["inclusive_mean_ns"] / 1e9, m["inclusive_max_ns"] / 1e9,
                       m["inclusive_imbalance"]], np.ones(npaths, bool), True,
                      f"all {len(tree.resources)} resources", MAX_PATHS)]
    names = [f"merged across {len(tree.resources)} resources"]
    for code, rid in enumerate(tree.resources[:MAX_RESOURCES] if len(tree.resources) > 1 else []):
        rows = tree.res == code
        inc, exc, calls = (np.zeros(npaths, np.int64) for _ in range(3))
        inc[tree.path[rows]], exc[tree.path[rows]] = tree.inclusive[rows], tree.exclusive[rows]
        calls[tree.path[rows]] = tree.calls[rows]
        present = np.zeros(npaths, bool)
        present[tree.path[rows]] = True
        traces.append(_icicle(tree, inc, exc, calls, None, present, False, labels.get(rid, rid),
                              MAX_PATHS_RESOURCE))
        names.append(labels.get(rid, rid))
    fig = go.Figure(traces)
    depth = int(tree.path_depth.max()) + 2
    fig.update_layout(height=min(160 + 34 * depth, 900), margin={"t": 40 if len(traces) > 1 else 10, "l": 10,
                                                                  "r": 10, "b": 10})
    if len(traces) > 1:
        fig.update_layout(updatemenus=[{
            "type": "dropdown", "x": 0, "y": 1.0, "xanchor": "left", "yanchor": "bottom", "showactive": True,
            "buttons": [{"label": n, "method": "update", "args": [{"visible": [j == i for j in range(len(traces))]}]}
                        for i, n in enumerate(names)]}])
    return fig


def hot_paths(tree: CallTree, limit: int = 20) -> list[dict]:
    """The ``limit`` call paths with the most exclusive time, merged across resources."""
    m = tree.merged()
    order = np.argsort(-m["exclusive_ns"], kind="stable")[:limit]
    return [{"call_path": tree.call_path(int(p)), **{k: v[p].item() for k, v in m.items()}} for p in order]
