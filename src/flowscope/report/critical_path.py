"""The critical-path view: the data-state graph with the path highlighted, the path's steps with their share of
the makespan, attribution charts, and GraphML / JSON export.

    from flowscope.report.critical_path import critical_path_section
    html = critical_path_section(states, mutations)      # an HTML fragment (plotly.js not included)
"""

from __future__ import annotations

import base64
import html as _html
import json
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from flowscope.analysis.critical_path import CriticalPath, data_state_path

__all__ = ["GraphLayout", "attribution_figure", "critical_path_section", "graph_figure", "graph_view", "steps_table", "to_graphml", "to_json"]


_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
            "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"]


class GraphLayout:
    """The data-state graph laid out for drawing: x = seconds since the first state, one lane (y) per group
    (application / step: the states' ``origin``, else ``color_by``), states sorted by group so each group is a
    contiguous range, and the mutations sorted by their destination's group. Vectorised throughout."""

    #: at most this many lanes: a lane per task (WfCommons names each state's task as its origin) drew a tick
    #: label per lane, and Chromium took 40 s to lay out 1,001 of them
    MAX_LANES = 64

    def __init__(self, states: pd.DataFrame, mutations: pd.DataFrame, path: CriticalPath, *,
                 group_by: str = "origin", color_by: str = "location"):
        self.asked = group_by                # the grouping asked for, and how many lanes it would have had
        self.asked_lanes = self._lanes(states, group_by)
        if not self.asked_lanes or self.asked_lanes > self.MAX_LANES:
            fallback = color_by if 0 < self._lanes(states, color_by) <= self.MAX_LANES else None
            group_by = fallback or "all"
        self.group_by, self.color_by = group_by, color_by
        grp = (states[group_by].fillna("(none)").astype(str) if group_by in states.columns
               else pd.Series("all", index=states.index))
        order = np.argsort(grp.to_numpy(), kind="stable")
        st = states.iloc[order].reset_index(drop=True)
        grp = grp.iloc[order].reset_index(drop=True)
        self.ids = st["state_id"].astype(str).to_numpy()
        codes, self.groups = pd.factorize(grp, sort=True)
        self.groups = [str(g) for g in self.groups]
        self.group = codes.astype(np.int64)
        self.start = np.searchsorted(self.group, np.arange(len(self.groups) + 1))   # group g: start[g]:start[g+1]
        ts = st["ts_ns"].to_numpy(dtype=np.int64)
        self.t0 = int(ts.min()) if len(ts) else 0
        self.x = (ts - self.t0) / 1e9
        rank = np.arange(len(st)) - self.start[self.group]
        self.y = self.group + (rank % 5) * 0.15
        loc = (st[color_by].fillna("(none)").astype(str) if color_by in st.columns
               else pd.Series("all", index=st.index))
        lcodes, locs = pd.factorize(loc, sort=True)
        self.loc, self.locations = lcodes.astype(np.int64), [str(v) for v in locs]
        index = pd.Index(self.ids)
        src = index.get_indexer(mutations["src_state_id"].astype(str).to_numpy())
        dst = index.get_indexer(mutations["dst_state_id"].astype(str).to_numpy())
        ok = (src >= 0) & (dst >= 0)
        src, dst = src[ok], dst[ok]
        eorder = np.lexsort((dst, self.group[dst]))
        self.src, self.dst = src[eorder].astype(np.int64), dst[eorder].astype(np.int64)
        self.estart = np.searchsorted(self.group[self.dst], np.arange(len(self.groups) + 1))
        self.path = index.get_indexer(np.asarray(path.ids, dtype=object)) if path.ids else np.zeros(0, np.int64)

    @staticmethod
    def _lanes(states: pd.DataFrame, column: str) -> int:
        """Lanes a grouping by ``column`` would have (0: no such column, or no value in it)."""
        if column not in states.columns or states[column].isna().all():
            return 0
        return int(states[column].fillna("(none)").astype(str).nunique())

    def lanes_note(self) -> str:
        """Why the lanes are not the grouping asked for ('' when they are)."""
        if self.group_by == self.asked or not self.asked_lanes:
            return ""
        return (f" ({self.asked_lanes:,} {self.asked}s: too many lanes to draw; "
                f"{'one lane' if self.group_by == 'all' else 'by ' + self.group_by} instead)")

    @property
    def n(self) -> int:
        return len(self.ids)

    def counts(self) -> np.ndarray:
        """States per group."""
        return np.diff(self.start)

    def group_edges(self) -> pd.DataFrame:
        """Mutations between groups, counted (``src``, ``dst`` group codes, ``n``)."""
        e = pd.DataFrame({"src": self.group[self.src], "dst": self.group[self.dst]})
        return e[e["src"] != e["dst"]].value_counts().rename("n").reset_index()


def _segments(x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Line segments as one polyline with gaps (NaN) between them."""
    xs = np.column_stack([x0, x1, np.full(len(x0), np.nan)]).ravel()
    ys = np.column_stack([y0, y1, np.full(len(y0), np.nan)]).ravel()
    return xs, ys


def graph_figure(states: pd.DataFrame, mutations: pd.DataFrame, path: CriticalPath | None = None, *,
                 color_by: str = "location", group_by: str = "origin", max_vertices: int = 2000,
                 layout: GraphLayout | None = None) -> go.Figure:
    """The graph laid out by time (x) and group (y), the critical path drawn on top in red, always in full.
    Up to ``max_vertices`` states every state is drawn (coloured by ``color_by``); above, each group is one
    vertex (sized by its states) with the mutations between groups, and :func:`graph_view` expands groups."""
    path = path or data_state_path(states, mutations)
    g = layout or GraphLayout(states, mutations, path, group_by=group_by, color_by=color_by)
    fig = go.Figure()
    collapsed = g.n > max_vertices
    if collapsed:
        counts = g.counts()
        first = np.array([g.x[a:b].min() if b > a else 0.0 for a, b in zip(g.start[:-1], g.start[1:])])
        last = np.array([g.x[a:b].max() if b > a else 0.0 for a, b in zip(g.start[:-1], g.start[1:])])
        gy = np.arange(len(g.groups), dtype=float)
        ge = g.group_edges()
        xs, ys = _segments(last[ge["src"]], gy[ge["src"]], first[ge["dst"]], gy[ge["dst"]])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#bbb", "width": 1},
                                   name="mutations between groups", hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            x=((first + last) / 2).tolist(), y=gy.tolist(), mode="markers", name="groups (collapsed)",
            error_x={"type": "data", "array": ((last - first) / 2).tolist(), "thickness": 6, "width": 0, "color": "#9ecae1"},
            marker={"size": np.clip(6 + 3 * np.log2(np.maximum(counts, 1)), 6, 40).tolist(), "color": "#4292c6",
                        "line": {"color": "#08519c", "width": 1}},
            text=[f"{name}: {c:,} states" for name, c in zip(g.groups, counts)], hoverinfo="text"))
    else:
        xs, ys = _segments(g.x[g.src], g.y[g.src], g.x[g.dst], g.y[g.dst])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#bbb", "width": 1}, name="mutations",
                                   hoverinfo="skip"))
        for code, name in enumerate(g.locations):
            m = g.loc == code
            fig.add_trace(go.Scattergl(x=g.x[m], y=g.y[m], mode="markers", name=name,
                                       marker={"size": 7, "color": _PALETTE[code % len(_PALETTE)]},
                                       text=g.ids[m], hoverinfo="text+x"))
    p = g.path[g.path >= 0]
    fig.add_trace(go.Scattergl(x=g.x[p].tolist(), y=g.y[p].tolist(), mode="lines+markers", name="critical path",
                               line={"color": "crimson", "width": 3}, marker={"color": "crimson", "size": 9},
                               text=None if collapsed else g.ids[p].tolist(), hoverinfo="text+x"))
    what = (f"{g.n:,} states in {len(g.groups):,} groups by {g.group_by} (collapsed)" if collapsed
            else f"{g.n:,} states{g.lanes_note()}")
    fig.update_layout(title=f"Data-state graph ({what}), critical path in red",
                      xaxis_title="seconds since the first state", showlegend=True,
                      yaxis={"tickvals": list(range(len(g.groups))), "ticktext": g.groups},
                      height=max(420, min(900, 60 + 28 * len(g.groups))))
    return fig


_EXPAND_JS = """
(function(){
var M=%(meta)s, Z=%(blob)s, div=%(div)s, P=%(palette)s, D=null, shown={};
function load(){  // the detail, deflated: decompressed once, on the first expand
  if(D)return D;
  var b=atob(Z),u=new Uint8Array(b.length);for(var i=0;i<b.length;i++)u[i]=b.charCodeAt(i);
  D=new Response(new Blob([u]).stream().pipeThrough(new DecompressionStream("deflate"))).arrayBuffer().then(
    function(buf){var n=M.n,ne=M.ne,o=0,r={};
      r.X=new Float32Array(buf,o,n);o+=4*n;r.L=new Int32Array(buf,o,n);o+=4*n;
      r.S=new Int32Array(buf,o,ne);o+=4*ne;r.T=new Int32Array(buf,o,ne);o+=4*ne;
      r.ids=new TextDecoder().decode(new Uint8Array(buf,o)).split("\\n");
      r.G=new Int32Array(n);for(var g=0;g<M.groups.length;g++)for(var k=M.start[g];k<M.start[g+1];k++)r.G[k]=g;
      return r;});
  return D;
}
function ypos(r,k){var g=r.G[k];return g+((k-M.start[g])%%5)*0.15;}
function expand(g){
  if(shown[g]!==undefined)return Promise.resolve();
  shown[g]=true;
  return load().then(function(r){
    var a=M.start[g],b=M.start[g+1],ea=M.estart[g],eb=M.estart[g+1],n=b-a,ne=eb-ea;
    var mx=new Array(n),my=new Array(n),mc=new Array(n),mt=new Array(n);
    for(var i=0;i<n;i++){mx[i]=r.X[a+i];my[i]=ypos(r,a+i);mc[i]=P[r.L[a+i]%%P.length];
      mt[i]=r.ids[a+i]+" ("+M.locations[r.L[a+i]]+")";}
    var step=Math.max(1,Math.ceil(ne/M.max_edges)),m=Math.ceil(ne/step);  // SVG lines: regl is slow with gaps
    var lx=new Array(3*m),ly=new Array(3*m);
    for(var k=0;k<m;k++){var j=ea+k*step,s=r.S[j],t=r.T[j];lx[3*k]=r.X[s];lx[3*k+1]=r.X[t];lx[3*k+2]=null;
      ly[3*k]=ypos(r,s);ly[3*k+1]=ypos(r,t);ly[3*k+2]=null;}
    var el=document.getElementById(div),at=el.data.length;
    for(var q=0;q<el.data.length;q++)if(el.data[q].name==="critical path"){at=q;break;}  // the path stays on top
    return Plotly.addTraces(el,[{type:"scatter",mode:"lines",x:lx,y:ly,hoverinfo:"skip",
        name:M.groups[g]+": inputs"+(step>1?" (1 in "+step+" drawn)":""),line:{color:"#999",width:1},
        meta:"expanded:"+g},
      {type:"scattergl",mode:"markers",x:mx,y:my,text:mt,hoverinfo:"text+x",name:M.groups[g]+" ("+n+")",
        marker:{size:6,color:mc},meta:"expanded:"+g}],[at,at+1]);
  });
}
function collapse(g){
  var el=document.getElementById(div),rm=[];
  for(var q=0;q<el.data.length;q++)if(el.data[q].meta==="expanded:"+g)rm.push(q);
  if(rm.length)Plotly.deleteTraces(el,rm);delete shown[g];
}
var sel=document.getElementById(div+"-group");
document.getElementById(div+"-expand").onclick=function(){expand(+sel.value);};
document.getElementById(div+"-collapse").onclick=function(){collapse(+sel.value);};
document.getElementById(div+"-collapse-all").onclick=function(){Object.keys(shown).forEach(function(g){collapse(+g);});};
load().then(function(r){  // the path's hover text: its ids travel with the others, compressed
  var el=document.getElementById(div);
  for(var q=0;q<el.data.length;q++)if(el.data[q].name==="critical path")
    Plotly.restyle(el,{text:[M.path.map(function(k){return r.ids[k];})]},[q]);
});
window.flowscopeGraph=window.flowscopeGraph||{};window.flowscopeGraph[div]={expand:expand,collapse:collapse,
  shown:shown,groups:M.groups};
})();
"""


def graph_view(states: pd.DataFrame, mutations: pd.DataFrame, path: CriticalPath | None = None, *,
               div_id: str = "fig-critical-path-graph", color_by: str = "location", group_by: str = "origin",
               max_vertices: int = 2000, max_edges: int = 30_000, plot_config: dict | None = None) -> str:
    """The graph as an HTML fragment (plotly.js expected on the page). Above ``max_vertices`` states it opens
    collapsed by group, with a control that expands one group at a time into its states (coloured by
    ``color_by``) and the mutations ending in them (at most ``max_edges`` drawn, evenly sampled, as the trace's
    name says); the critical path is always drawn in full."""
    path = path or data_state_path(states, mutations)
    g = GraphLayout(states, mutations, path, group_by=group_by, color_by=color_by)
    fig = graph_figure(states, mutations, path, max_vertices=max_vertices, layout=g)
    payload = pio.to_json(fig, validate=False).replace("</", "<\\/")
    cfg = json.dumps(plot_config or {"displaylogo": False, "responsive": True})
    out = [f'<div class="plot" id="{div_id}"></div>',
           f'<script>(function(){{var f={payload};Plotly.newPlot("{div_id}",f.data,f.layout,{cfg});}})();</script>']
    if g.n > max_vertices:
        counts = g.counts()
        options = "".join(f'<option value="{i}">{_html.escape(name)} ({c:,} states)</option>'
                          for i, (name, c) in enumerate(zip(g.groups, counts)))
        blob = b"".join([g.x.astype("<f4").tobytes(), g.loc.astype("<i4").tobytes(), g.src.astype("<i4").tobytes(),
                         g.dst.astype("<i4").tobytes(), "\n".join(g.ids).encode()])
        meta = {"n": g.n, "ne": len(g.src), "groups": g.groups, "locations": g.locations, "start": g.start.tolist(),
                "estart": g.estart.tolist(), "max_edges": max_edges, "path": g.path[g.path >= 0].tolist()}
        js = _EXPAND_JS % {"meta": json.dumps(meta).replace("</", "<\\/"),
                           "blob": json.dumps(base64.b64encode(zlib.compress(blob, 6)).decode()),
                           "div": json.dumps(div_id), "palette": json.dumps(_PALETTE)}
        out.insert(0, f'<p class="cp-controls">Collapsed: one vertex per {_html.escape(g.group_by)} '
                      f'({g.n:,} states){_html.escape(g.lanes_note())}. Expand a group: <select id="{div_id}-group">{options}</select> '
                      f'<button id="{div_id}-expand">expand</button> <button id="{div_id}-collapse">collapse'
                      f'</button> <button id="{div_id}-collapse-all">collapse all</button></p>')
        out.append(f"<script>{js}</script>")
    return "\n".join(out)


def attribution_figure(path: CriticalPath) -> go.Figure:
    """Bars: the path's time per component, per application and per location."""
    fig = go.Figure()
    for name, df, col in (("component", path.by_component(), "component"),
                          ("application", path.by_application(), "application"),
                          ("location", path.by_location(), "location")):
        fig.add_trace(go.Bar(x=df["duration_ns"] / 1e9, y=[f"{name}: {v}" for v in df[col]], orientation="h",
                             name=name, text=[f"{s:.0%}" for s in df["share"]]))
    fig.update_layout(title="Where the critical path's time goes", xaxis_title="seconds", height=420,
                      yaxis={"autorange": "reversed"})
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


def critical_path_section(states: pd.DataFrame, mutations: pd.DataFrame, *, color_by: str = "location",
                          group_by: str = "origin", max_vertices: int = 2000) -> str:
    """An HTML fragment: graph (collapsed by group above ``max_vertices``, expandable), steps table, attribution
    chart (expects plotly.js already on the page)."""
    path = data_state_path(states, mutations)
    parts = [f"<h2>Workflow critical path</h2><p>{len(path.ids)} states, {path.length_ns / 1e9:.3f} s</p>",
             graph_view(states, mutations, path, color_by=color_by, group_by=group_by, max_vertices=max_vertices),
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


_GRAPHML_NS = "http://graphml.graphdrawing.org/xmlns"
_STATE_KEYS = {"label": "string", "size_bytes": "long", "ts_ns": "long", "origin": "string", "location": "string",
               "attrs": "string"}
_MUTATION_KEYS = {"mutation_id": "string", "kind": "string", "application": "string", "attrs": "string"}


def to_graphml(states: pd.DataFrame, mutations: pd.DataFrame, out: str | Path) -> Path:
    """Write the graph as GraphML (vertices: states, edges: mutations, with their columns as data); the states
    and the mutations of the critical path carry ``critical=true``."""
    path = data_state_path(states, mutations)
    on = pd.Index(np.asarray(path.ids, dtype=object))
    on_edges = set(zip(path.ids[:-1], path.ids[1:]))
    ET.register_namespace("", _GRAPHML_NS)
    root = ET.Element("graphml", xmlns=_GRAPHML_NS)
    keys = [("node", k, t) for k, t in _STATE_KEYS.items() if k in states.columns] + [("node", "critical", "boolean")]
    keys += [("edge", k, t) for k, t in _MUTATION_KEYS.items() if k in mutations.columns]
    keys += [("edge", "critical", "boolean")]
    for i, (where, name, typ) in enumerate(keys):
        ET.SubElement(root, "key", {"id": f"d{i}", "for": where, "attr.name": name, "attr.type": typ})
    kid = {(w, n): f"d{i}" for i, (w, n, _) in enumerate(keys)}
    graph = ET.SubElement(root, "graph", id="data-states", edgedefault="directed")

    def data(elem: ET.Element, where: str, row: dict) -> None:
        for name, value in row.items():
            if value is None or (not isinstance(value, str) and pd.isna(value)):
                continue
            text = ("true" if value else "false") if isinstance(value, (bool, np.bool_)) else (
                str(int(value)) if isinstance(value, (int, np.integer, float)) and name != "attrs" else str(value))
            ET.SubElement(elem, "data", key=kid[(where, name)]).text = text

    cols = [c for c in _STATE_KEYS if c in states.columns]
    crit = on.get_indexer(states["state_id"].astype(str).to_numpy()) >= 0 if len(on) else np.zeros(len(states), bool)
    for sid, flag, *vals in zip(states["state_id"].astype(str), crit, *(states[c] for c in cols)):
        node = ET.SubElement(graph, "node", id=sid)
        data(node, "node", {**dict(zip(cols, vals)), "critical": bool(flag)})
    mcols = [c for c in _MUTATION_KEYS if c in mutations.columns]
    for i, (s, d, *vals) in enumerate(zip(mutations["src_state_id"].astype(str), mutations["dst_state_id"].astype(str),
                                          *(mutations[c] for c in mcols))):
        edge = ET.SubElement(graph, "edge", id=f"e{i}", source=s, target=d)
        data(edge, "edge", {**dict(zip(mcols, vals)), "critical": (s, d) in on_edges})
    out = Path(out)
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    return out
