"""The report's anomaly views (Chimbuko's dashboard): resources ranked by anomaly statistics per step,
anomalies per step of selected resources, a function view with selectable axes, and the call stack of
the window around one anomaly with the transfers during it."""

from __future__ import annotations

import html
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from flowscope.store.layout import segment_files

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
STATS = ("mean", "std", "max", "min", "total")
AXES = ("entry", "exit", "inclusive", "exclusive", "function", "anomaly label", "children", "messages")


def _div(fig: go.Figure, name: str) -> str:
    payload = pio.to_json(fig, validate=False).replace("</", "<\\/")
    div = f"fig-anom-{name}"
    return (f'<div class="plot" id="{div}"></div>\n<script>(function(){{var f={payload};'
            f'Plotly.newPlot("{div}",f.data,f.layout,{json.dumps(PLOT_CONFIG)});}})();</script>')


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def resource_ranking(anomalies: pd.DataFrame, nsteps: int) -> pd.DataFrame:
    """Per resource: mean, std, max, min and total of its anomalies per step over the run's ``nsteps``
    steps (steps without anomalies count as 0)."""
    per = anomalies.groupby(["resource_id", "step"]).size().unstack(fill_value=0)
    per = per.reindex(columns=range(max(nsteps, 1)), fill_value=0)
    return pd.DataFrame({"mean": per.mean(axis=1), "std": per.std(axis=1, ddof=0), "max": per.max(axis=1),
                         "min": per.min(axis=1), "total": per.sum(axis=1)}).rename_axis("resource_id")


def _ranking_figure(rank: pd.DataFrame, top: int) -> go.Figure:
    fig = go.Figure()
    buttons = []
    choices = [(s, side) for s in STATS for side in ("top", "bottom")]
    for i, (stat, side) in enumerate(choices):
        r = rank.sort_values([stat, "total"], ascending=side == "bottom", kind="stable").head(top)
        fig.add_bar(x=r.index.tolist(), y=r[stat].tolist(), name=f"{side} {top} by {stat}", visible=i == 0,
                    customdata=r[list(STATS)].to_numpy().tolist(),
                    hovertemplate="%{x}<br>mean %{customdata[0]:.3g} std %{customdata[1]:.3g} max %{customdata[2]}"
                                  " min %{customdata[3]} total %{customdata[4]}<extra></extra>")
        buttons.append({"label": f"{side} {top} by {stat}", "method": "update",
                        "args": [{"visible": [j == i for j in range(len(choices))]},
                                 {"yaxis.title.text": f"anomalies per step: {stat}"}]})
    fig.update_layout(height=360, margin={"t": 40, "b": 90}, showlegend=False,
                      yaxis_title="anomalies per step: mean", xaxis_title="resource",
                      updatemenus=[{"buttons": buttons, "x": 0, "xanchor": "left", "y": 1.18, "yanchor": "top"}])
    return fig


def _steps_figure(anomalies: pd.DataFrame, rank: pd.DataFrame, nsteps: int, shown: int = 5,
                  limit: int = 20) -> go.Figure:
    fig = go.Figure()
    steps = np.arange(max(nsteps, 1))
    for i, rid in enumerate(rank.sort_values("total", ascending=False).index[:limit]):
        counts = anomalies[anomalies["resource_id"] == rid].groupby("step").size().reindex(steps, fill_value=0)
        fig.add_scatter(x=steps.tolist(), y=counts.tolist(), mode="lines+markers", name=str(rid),
                        visible=True if i < shown else "legendonly")
    fig.update_layout(height=340, margin={"t": 20}, xaxis_title="step", yaxis_title="anomalies")
    return fig


def _axis_values(points: pd.DataFrame, axis: str) -> list:
    col = {"entry": "entry_s", "exit": "exit_s", "inclusive": "inclusive_ms", "exclusive": "exclusive_ms",
           "function": "function", "anomaly label": "label", "children": "children", "messages": "messages"}[axis]
    return [None if isinstance(v, float) and np.isnan(v) else v for v in points[col].tolist()]


AXIS_TITLES = {"entry": "entry (s since the first kept call)", "exit": "exit (s)", "inclusive": "inclusive (ms)", "exclusive": "exclusive (ms)",
               "function": "function", "anomaly label": "anomaly label", "children": "children",
               "messages": "messages (transfers)"}
CATEGORICAL = {"function", "anomaly label"}


def _function_figure(points: pd.DataFrame, x: str = "entry", y: str = "exclusive") -> go.Figure:
    groups = [points[points["label"] == lab] for lab in ("anomaly", "normal")]
    fig = go.Figure()
    for lab, g, color in zip(("anomaly", "normal"), groups, ("#d62728", "#7f7f7f")):
        fig.add_scattergl(x=_axis_values(g, x), y=_axis_values(g, y), mode="markers", name=lab,
                          marker={"color": color, "size": 7 if lab == "anomaly" else 5},
                          text=[f"{f} on {r}, call {c}" for f, r, c in zip(g["function"], g["resource_id"],
                                                                           g["call_id"])],
                          hovertemplate="%{text}<br>x %{x}<br>y %{y}<extra>" + lab + "</extra>")
    menus = []
    for k, (axis_key, default, pos) in enumerate((("x", x, 0.0), ("y", y, 0.32))):
        buttons = [{"label": f"{axis_key}: {a}", "method": "update",
                    "args": [{axis_key: [_axis_values(g, a) for g in groups]},
                             {f"{axis_key}axis.title.text": AXIS_TITLES[a],
                              f"{axis_key}axis.type": "category" if a in CATEGORICAL else "linear"}]}
                   for a in AXES]
        menus.append({"buttons": buttons, "active": AXES.index(default), "x": pos, "xanchor": "left",
                      "y": 1.2, "yanchor": "top"})
    fig.update_layout(height=420, margin={"t": 60}, updatemenus=menus, xaxis_title=AXIS_TITLES[x],
                      yaxis_title=AXIS_TITLES[y], xaxis_type="category" if x in CATEGORICAL else "linear",
                      yaxis_type="category" if y in CATEGORICAL else "linear")
    return fig


def _window_figure(windows: list[tuple[dict, pd.DataFrame, pd.DataFrame]], t0: int) -> go.Figure:
    fig = go.Figure()
    buttons = []
    per = 3
    for i, (a, calls, transfers) in enumerate(windows):
        is_a = calls["call_id"] == a["call_id"]
        for lab, part, color in (("window", calls[~is_a], "#9ecae1"), ("anomaly", calls[is_a], "#d62728")):
            fig.add_bar(base=((part["start_ns"] - t0) / 1e9).tolist(),
                        x=((part["end_ns"] - part["start_ns"]) / 1e9).tolist(),
                        y=[f"depth {d}" for d in part["depth"]], orientation="h", name=lab, visible=i == 0,
                        marker={"color": color, "line": {"color": "#333", "width": 0.5}},
                        text=part["function"].tolist(), textposition="inside", insidetextanchor="middle",
                        customdata=part[["call_id"]].to_numpy().tolist(),
                        hovertemplate="%{text} (call %{customdata[0]})<br>entry %{base:.6f} s, "
                                      "%{x:.6f} s<extra>" + lab + "</extra>")
        fig.add_bar(base=((transfers["start_ns"] - t0) / 1e9).tolist(),
                    x=((transfers["end_ns"] - transfers["start_ns"]) / 1e9).tolist(),
                    y=["transfers"] * len(transfers), orientation="h", name="transfers", visible=i == 0,
                    marker={"color": "#ff7f0e"},
                    text=[f"{s} → {d}, {n} B" for s, d, n in zip(transfers["src_resource_id"],
                                                                  transfers["dst_resource_id"],
                                                                  transfers["nbytes"])],
                    hovertemplate="%{text}<extra>transfer</extra>")
        label = f"#{a['anomaly_id']} {a['function']} on {a['resource_id']}"
        buttons.append({"label": label, "method": "update",
                        "args": [{"visible": [j // per == i for j in range(per * len(windows))]},
                                 {"title.text": f"{label}: {a['messages']} transfer(s) during the call"}]})
    a0 = windows[0][0]
    fig.update_layout(height=380, margin={"t": 80}, barmode="overlay", showlegend=False,
                      title=f"#{a0['anomaly_id']} {a0['function']} on {a0['resource_id']}: {a0['messages']} "
                            "transfer(s) during the call",
                      xaxis_title="seconds since the first kept call", yaxis={"autorange": "reversed"},
                      updatemenus=[{"buttons": buttons, "x": 0, "xanchor": "left", "y": 1.32, "yanchor": "top"}])
    return fig


def _kept_calls(run, anomalies: pd.DataFrame) -> pd.DataFrame:
    """The calls around the anomalies with entry, exit, times, depth, children, function, resource, call id and
    position on the resource: the reduced run's kept calls, else every call of the run."""
    from flowscope.analysis.anomalies.reduce import CALLS_FILE, window_calls

    if (run.path / CALLS_FILE).exists():
        return window_calls(run.path).to_pandas()
    from flowscope.analysis.anomalies import calls_from_spans

    c = calls_from_spans(run.sql_arrow("SELECT * FROM activity"))
    pos = np.arange(len(c)) - c.resource_start()
    return pd.DataFrame({"resource_id": np.asarray(c.resources, object)[c.resource], "pos": pos,
                         "call_id": c.call_id, "function": np.asarray(c.functions, object)[c.func],
                         "depth": c.depth, "children": c.children, "start_ns": c.start, "end_ns": c.end,
                         "inclusive_ns": c.inclusive, "exclusive_ns": c.exclusive})


def _read_anomalies(run) -> pd.DataFrame:
    from flowscope.analysis.anomalies.reduce import CALLS_FILE, MODEL_FILE, reduced_anomalies

    if (run.path / CALLS_FILE).exists() and (run.path / MODEL_FILE).exists():
        return reduced_anomalies(run.path).to_pandas()
    from flowscope.analysis.anomalies.stream import unpruned_anomalies

    # online anomalies that post-pruning withdrew are not shown
    return unpruned_anomalies(run).to_pandas().sort_values("anomaly_id")


def anomaly_section(run, top: int = 10, windows: int = 20) -> str | None:
    """The report's anomaly section of ``run`` as an HTML fragment, or None when the run has no anomalies
    table."""
    if not segment_files(run.path, "anomalies"):
        return None
    a = _read_anomalies(run)
    head = ('<section id="anomalies">\n<h2>Anomalies</h2>\n<p class="help">Function calls judged anomalous '
            "against their function's model (<code>flowscope anomalies</code>; docs/anomalies.md).</p>")
    if a.empty:
        return head + '\n<p class="nodata">No data: the anomalies table is empty.</p>\n</section>'
    calls = _kept_calls(run, a)
    t0 = min(int(a["start_ns"].min()), int(calls["start_ns"].min()) if len(calls) else int(a["start_ns"].min()))
    nsteps = int(a["step"].max()) + 1
    step_ns = None
    try:
        from flowscope.analysis.anomalies.reduce import load_model
        step_ns = load_model(run.path)[0].step_ns
    except ValueError:
        pass
    rank = resource_ranking(a, nsteps)
    parts = [head]
    cfg = f"{a['algo'].iloc[0]} on {a['metric'].iloc[0]} time"
    parts.append(f'<p class="note">{len(a)} anomalies ({_e(cfg)}) on {len(rank)} resources over {nsteps} '
                 f"step(s){'' if step_ns is None else f' of {step_ns / 1e9:g} s'}.</p>")
    parts.append('<h3>Resources ranked by anomalies per step</h3><p class="help">Pick the statistic and the top '
                 "or bottom of the ranking with the menu.</p>")
    parts.append(_div(_ranking_figure(rank, top), "ranking"))
    parts.append('<h3>Anomalies per step</h3><p class="help">The resources with the most anomalies; click a '
                 "legend entry to show or hide a resource.</p>")
    parts.append(_div(_steps_figure(a, rank, nsteps), "steps"))

    # function view: the anomalies and the normal calls kept around them
    anom_ids = set(a["call_id"].tolist())
    normal = calls[~calls["call_id"].isin(anom_ids)]
    pts = pd.concat([
        pd.DataFrame({"call_id": a["call_id"], "resource_id": a["resource_id"], "function": a["function"],
                      "start_ns": a["start_ns"], "end_ns": a["end_ns"], "inclusive_ns": a["inclusive_ns"],
                      "exclusive_ns": a["exclusive_ns"], "children": a["children"], "messages": a["messages"],
                      "label": "anomaly"}),
        pd.DataFrame({"call_id": normal["call_id"], "resource_id": normal["resource_id"],
                      "function": normal["function"], "start_ns": normal["start_ns"], "end_ns": normal["end_ns"],
                      "inclusive_ns": normal["inclusive_ns"], "exclusive_ns": normal["exclusive_ns"],
                      "children": normal["children"], "messages": np.nan, "label": "normal"}),
    ], ignore_index=True)
    pts["entry_s"] = (pts["start_ns"] - t0) / 1e9
    pts["exit_s"] = (pts["end_ns"] - t0) / 1e9
    pts["inclusive_ms"] = pts["inclusive_ns"] / 1e6
    pts["exclusive_ms"] = pts["exclusive_ns"] / 1e6
    parts.append('<h3>Function view</h3><p class="help">Each anomaly (red) and each normal call kept around the '
                 "anomalies (grey); choose the x and y axes with the menus. Messages are counted for anomalies "
                 "only.</p>")
    parts.append(_div(_function_figure(pts), "functions"))

    # call stack of the window around each of the most severe anomalies
    transfers = run.table("transfers") if run.counts().get("transfers") else pd.DataFrame(
        columns=["start_ns", "end_ns", "src_resource_id", "dst_resource_id", "nbytes"])
    parent_of = {}
    res = run.table("resources") if run.counts().get("resources") else None
    if res is not None and len(res):
        parent_of = dict(zip(res["resource_id"], res["parent_id"]))
    wins = []
    for row in a.head(windows).to_dict("records"):
        c = calls[calls["resource_id"] == row["resource_id"]]
        me = c[c["call_id"] == row["call_id"]]
        if me.empty:
            continue
        p = int(me["pos"].iloc[0])
        w = c[(c["pos"] >= p - len(row["window_before"])) & (c["pos"] <= p + len(row["window_after"]))]
        lo, hi = int(w["start_ns"].min()), int(w["end_ns"].max())
        who = {row["resource_id"], parent_of.get(row["resource_id"])} - {None}
        tr = transfers[(transfers["src_resource_id"].isin(who) | transfers["dst_resource_id"].isin(who))
                       & (transfers["start_ns"] <= hi) & (transfers["end_ns"] >= lo)]
        wins.append((row, w, tr))
    if wins:
        parts.append('<h3>Call stack around an anomaly</h3><p class="help">The calls before and after the anomaly '
                     "on its resource (rows are nesting depths) and the transfers to or from the resource during "
                     "them; pick the anomaly with the menu (most severe first). A reduced run keeps the count of "
                     "transfers, not the transfers.</p>")
        parts.append(_div(_window_figure(wins, t0), "window"))
    parts.append("</section>")
    return "\n".join(parts)
