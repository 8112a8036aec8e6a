"""The critical-path view: the data-state graph with the path highlighted, the path's steps with their share of
the makespan, attribution charts, and GraphML / JSON export.

    from flowscope.report.critical_path import critical_path_section
    html = critical_path_section(states, mutations)      # an HTML fragment (plotly.js not included)
"""

from __future__ import annotations

import html as _html
import json
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from flowscope.analysis.critical_path import CriticalPath, data_state_path

__all__ = ["graph_figure", "attribution_figure", "steps_table", "critical_path_section", "to_json", "to_graphml"]


def _collapse(states: pd.DataFrame, mutations: pd.DataFrame, by: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    key = states[by].fillna("(none)").astype(str)
    of = dict(zip(states["state_id"].astype(str), key))
    nodes = (states.assign(_k=key).groupby("_k").agg(ts_ns=("ts_ns", "min"), n=("state_id", "size")).reset_index()
             .rename(columns={"_k": "state_id"}))
    nodes[by] = nodes["state_id"]
    e = pd.DataFrame({"src_state_id": mutations["src_state_id"].astype(str).map(of),
                      "dst_state_id": mutations["dst_state_id"].astype(str).map(of)})
    e = e[e["src_state_id"] != e["dst_state_id"]].drop_duplicates()
    return nodes, e


def graph_figure(states: pd.DataFrame, mutations: pd.DataFrame, path: CriticalPath | None = None, *,
                 color_by: str = "location", max_vertices: int = 2000) -> go.Figure:
    """The graph laid out by time (x) and colour group (y), the critical path drawn on top in red. Above
    ``max_vertices`` states the graph is collapsed to one vertex per ``color_by`` value."""
    path = path or data_state_path(states, mutations)
    on_path = set(path.ids)
    if len(states) > max_vertices:
        states, mutations = _collapse(states, mutations, color_by)
        on_path = set()
    t0 = int(states["ts_ns"].min()) if len(states) else 0
    group = states[color_by].fillna("(none)").astype(str) if color_by in states else pd.Series(["all"] * len(states))
    lanes = {g: i for i, g in enumerate(sorted(set(group)))}
    x = (states["ts_ns"].to_numpy(dtype=np.int64) - t0) / 1e9
    rank = states.groupby(group.to_numpy()).cumcount().to_numpy()
    y = np.array([lanes[g] for g in group]) + (rank % 5) * 0.15
    pos = {sid: (xi, yi) for sid, xi, yi in zip(states["state_id"].astype(str), x, y)}
    fig = go.Figure()
    ex, ey = [], []
    for s, d in zip(mutations["src_state_id"].astype(str), mutations["dst_state_id"].astype(str)):
        if s in pos and d in pos:
            ex += [pos[s][0], pos[d][0], None]
            ey += [pos[s][1], pos[d][1], None]
    fig.add_trace(go.Scattergl(x=ex, y=ey, mode="lines", line=dict(color="#bbb", width=1), name="mutations",
                               hoverinfo="skip"))
    for g, i in lanes.items():
        m = (group == g).to_numpy()
        fig.add_trace(go.Scattergl(x=x[m], y=y[m], mode="markers", name=g, marker=dict(size=7),
                                   text=states["state_id"].astype(str)[m], hoverinfo="text+x"))
    px = [pos[i][0] for i in path.ids if i in pos and i in on_path]
    py = [pos[i][1] for i in path.ids if i in pos and i in on_path]
    fig.add_trace(go.Scattergl(x=px, y=py, mode="lines+markers", name="critical path",
                               line=dict(color="crimson", width=3), marker=dict(color="crimson", size=9)))
    fig.update_layout(title=f"Data-state graph ({len(states):,} vertices), critical path in red",
                      xaxis_title="seconds since the first state",
                      yaxis=dict(tickvals=list(lanes.values()), ticktext=list(lanes.keys())), height=420)
    return fig


def attribution_figure(path: CriticalPath) -> go.Figure:
    """Bars: the path's time per component, per application and per location."""
    fig = go.Figure()
    for name, df, col in (("component", path.by_component(), "component"),
                          ("application", path.by_application(), "application"),
                          ("location", path.by_location(), "location")):
        fig.add_trace(go.Bar(x=df["duration_ns"] / 1e9, y=[f"{name}: {v}" for v in df[col]], orientation="h",
                             name=name, text=[f"{s:.0%}" for s in df["share"]]))
    fig.update_layout(title="Where the critical path's time goes", xaxis_title="seconds", height=420,
                      yaxis=dict(autorange="reversed"))
    return fig


def steps_table(path: CriticalPath, limit: int = 500) -> str:
    """The path's steps as an HTML table with each one's share of the path's length."""
    rows = []
    for r in path.steps.head(limit).itertuples(index=False):
        share = r.duration_ns / path.length_ns if path.length_ns else 0.0
        rows.append("<tr>" + "".join(f"<td>{_html.escape(str(v))}</td>" for v in (
            r.id, r.kind, r.component, r.application, r.location, f"{r.duration_ns / 1e9:.3f}", f"{share:.1%}")) +
            "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("state / task", "kind", "component", "application", "location",
                                              "seconds", "share"))
    more = f"<p>{len(path.steps) - limit:,} more steps not shown</p>" if len(path.steps) > limit else ""
    return f"<table class='cp-steps'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"


def critical_path_section(states: pd.DataFrame, mutations: pd.DataFrame, *, color_by: str = "location") -> str:
    """An HTML fragment: graph, steps table, attribution chart (expects plotly.js already on the page)."""
    path = data_state_path(states, mutations)
    parts = [f"<h2>Workflow critical path</h2><p>{len(path.ids)} states, {path.length_ns / 1e9:.3f} s</p>",
             graph_figure(states, mutations, path, color_by=color_by).to_html(full_html=False, include_plotlyjs=False),
             steps_table(path),
             attribution_figure(path).to_html(full_html=False, include_plotlyjs=False)]
    return "\n".join(parts)


def to_json(states: pd.DataFrame, mutations: pd.DataFrame, out: str | Path | None = None) -> dict:
    """The graph and its critical path as JSON-ready dict (written to ``out`` when given)."""
    path = data_state_path(states, mutations)
    doc = {"states": json.loads(states.to_json(orient="records")),
           "mutations": json.loads(mutations.to_json(orient="records")), "critical_path": path.to_dict()}
    if out is not None:
        Path(out).write_text(json.dumps(doc))
    return doc


def to_graphml(states: pd.DataFrame, mutations: pd.DataFrame, out: str | Path) -> Path:
    """Write the graph as GraphML; vertices and edges on the critical path carry ``critical=true``."""
    import networkx as nx

    path = data_state_path(states, mutations)
    on = set(path.ids)
    on_edges = set(zip(path.ids[:-1], path.ids[1:]))
    g = nx.MultiDiGraph()
    for r in states.itertuples(index=False):
        attrs = {k: v for k, v in r._asdict().items() if k != "state_id" and v is not None and not pd.isna(v)}
        g.add_node(str(r.state_id), **{k: (int(v) if isinstance(v, (np.integer,)) else v) for k, v in attrs.items()},
                   critical=str(r.state_id) in on)
    for r in mutations.itertuples(index=False):
        s, d = str(r.src_state_id), str(r.dst_state_id)
        g.add_edge(s, d, kind=str(r.kind), critical=(s, d) in on_edges)
    out = Path(out)
    nx.write_graphml(g, out)
    return out
