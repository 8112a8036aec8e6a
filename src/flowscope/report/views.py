"""The dashboard's analysis views of a run as JSON documents: the advisor's explanation (where the time went, the
findings ranked by recoverable time), the critical path with its attribution and the data-state graph, the time
breakdown with per-group statistics and the call profile, the anomalies in Chimbuko's views, and the logs with
their tasks.

Each view is computed by the analysis functions the report and ``flowscope show`` call, over the run's tables
as they are on disk now (a running run: as far as it got), so a page shows the same figures as they do. Every
view reads only the model's vocabulary (``activity`` roles and groups, ``transfers``, ``data_states``), never
one source's names, so the same pages serve a Dask run, an imported Paje trace and an OTF2 trace.

    doc = VIEWS["critical-path"](run)        # JSON-ready dict
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flowscope.report.pages import PAGES  # noqa: F401 - the pages' names, with their views here
from flowscope.store.layout import RUN_JSON, read_json, segment_files
from flowscope.store.run import Run

log = logging.getLogger("flowscope.dashboard")

#: steps of a path listed (the attribution covers all of them)
STEP_LIMIT = 500
#: up to this many data states each state is drawn; above, each group (origin) is one mark
GRAPH_STATES = 2000
#: anomalies listed with their call-stack window (the ranking and the steps count all of them)
ANOMALY_LIMIT = 500
#: normal calls drawn in the function scatter beside the anomalies (evenly thinned above)
NORMAL_POINTS = 5000
#: log records listed, latest first (the counts cover all of them)
LOG_LIMIT = 2000


def _num(v: Any) -> Any:
    """A JSON-safe number: NaN and infinities become None, numpy scalars plain Python."""
    if v is None:
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return None if math.isnan(f) or math.isinf(f) else f
    return v


def _text(v: Any) -> str | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def json_safe(doc: Any) -> Any:
    """``doc`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: json_safe(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [json_safe(v) for v in doc]
    return doc


def _t0(run: Run) -> int:
    return int(run.meta.get("start_ns") or 0)


# ---- critical path -------------------------------------------------------------------------------------------

def _attribution(df: pd.DataFrame, column: str) -> list[dict]:
    return [{"name": _text(r[column]), "seconds": int(r["duration_ns"]) / 1e9, "share": _num(r["share"]),
             "steps": int(r["steps"])} for r in df.to_dict("records")]


def path_doc(path, t0_ns: int, limit: int = STEP_LIMIT) -> dict:
    """A critical path (:class:`flowscope.analysis.critical_path.CriticalPath`) as the page shows it: its length,
    its time per component, application and location (``CriticalPath.by_*``) and its first ``limit`` steps."""
    from flowscope.analysis.summary import TASK_STEP

    s = path.steps
    length = int(path.length_ns)
    steps = [{"id": _text(r["id"]), "label": _text(r["label"]), "kind": _text(r["kind"]),
              "component": _text(r["component"]), "application": _text(r["application"]),
              "location": _text(r["location"]), "start_s": (int(r["start_ns"]) - t0_ns) / 1e9,
              "seconds": int(r["duration_ns"]) / 1e9,
              "share": int(r["duration_ns"]) / length if length else 0.0}
             for r in s.head(limit).to_dict("records")]
    return {"length_s": length / 1e9, "vertices": len(path.ids), "tasks": int((s["kind"] == TASK_STEP).sum()),
            "start_s": (path.start_ns - t0_ns) / 1e9 if path.start_ns is not None else None,
            "components": _attribution(path.by_component(), "component"),
            "applications": _attribution(path.by_application(), "application"),
            "locations": _attribution(path.by_location(), "location"),
            "steps": steps, "steps_total": len(s)}


def _graph_doc(g, path) -> dict:
    """The data-state graph laid out as the report lays it out (report.critical_path.GraphLayout ``g``): x seconds
    since the first state, one lane per group; every state up to GRAPH_STATES, else one mark per group (each group's
    states are then fetched on demand: :func:`graph_group_doc`)."""
    p = g.path[g.path >= 0]
    doc: dict[str, Any] = {"group_by": g.group_by, "groups": g.groups, "locations": g.locations,
                           "path": {"x": g.x[p].tolist(), "y": g.y[p].tolist(), "ids": g.ids[p].tolist()}}
    if g.n <= GRAPH_STATES:
        doc.update(mode="states", x=g.x.tolist(), y=g.y.tolist(), ids=g.ids.tolist(), loc=g.loc.tolist(),
                   src=g.src.tolist(), dst=g.dst.tolist())
    else:
        counts = g.counts()
        first = [float(g.x[a:b].min()) if b > a else 0.0 for a, b in zip(g.start[:-1], g.start[1:])]
        last = [float(g.x[a:b].max()) if b > a else 0.0 for a, b in zip(g.start[:-1], g.start[1:])]
        ge = g.group_edges()
        doc.update(mode="groups", counts=counts.tolist(), first=first, last=last,
                   edges={"src": ge["src"].tolist(), "dst": ge["dst"].tolist(), "n": ge["n"].tolist()})
    return doc


def data_state_graph(run: Run) -> dict | None:
    """The run's data-state graph as the critical-path page draws it: ``states`` and ``mutations`` (counts),
    ``derived`` (the states derived from the tasks, the run recording none), ``path`` (its critical path) and
    ``layout`` (:class:`flowscope.report.critical_path.GraphLayout`); None without states and mutations. Computed
    once per state of the run. ValueError: the graph's critical path cannot be computed."""
    return run.memo("data_state_graph", lambda: _data_state_graph(run))


def _data_state_graph(run: Run) -> dict | None:
    from flowscope.analysis.critical_path import data_state_path
    from flowscope.analysis.dataflow import data_states_from_tasks
    from flowscope.report.critical_path import GraphLayout

    states, mutations = run.table("data_states"), run.table("mutations")
    derived = False
    if states.empty:
        from flowscope.analysis.critical_path.task_paths import run_units

        if not int(run_units(run)["task_key"].notna().sum()):
            return None
        states, mutations = data_states_from_tasks(run)
        derived = True
    if states.empty or mutations.empty:
        return None
    path = data_state_path(states, mutations)
    return {"states": len(states), "mutations": len(mutations), "derived": derived, "path": path,
            "layout": GraphLayout(states, mutations, path)}


def graph_group_doc(g, group: str) -> dict:
    """One group of the laid-out data-state graph ``g`` (a GraphLayout) in full, for the page to draw in place of its
    mark: the group's states (x, y, ids, location codes into ``locations``) and the mutations ending there (their
    ends' x and y). The y of a state is its lane in ``groups`` plus its offset within the lane. KeyError: no such
    group."""
    try:
        k = g.groups.index(group)
    except ValueError:
        raise KeyError(group) from None
    a, b = int(g.start[k]), int(g.start[k + 1])
    e0, e1 = int(g.estart[k]), int(g.estart[k + 1])
    src, dst = g.src[e0:e1], g.dst[e0:e1]
    return {"group": group, "groups": g.groups, "locations": g.locations, "x": g.x[a:b].tolist(),
            "y": g.y[a:b].tolist(), "ids": g.ids[a:b].tolist(), "loc": g.loc[a:b].tolist(),
            "inputs": {"x0": g.x[src].tolist(), "y0": g.y[src].tolist(), "x1": g.x[dst].tolist(),
                       "y1": g.y[dst].tolist()}}


def critical_path_view(run: Run) -> dict:
    """The task graph's critical path (measured, else structural), the path through messages with its wait states
    (runs whose transfers link calls), and the data-state graph with its path (recorded data states, else those
    derived from the tasks), as the report's critical-path section computes them; with none of them, ``reason``:
    why the run has no critical path (:func:`flowscope.analysis.critical_path.missing_path_reason`)."""
    from flowscope.analysis.critical_path.task_paths import run_task_paths, run_units
    from flowscope.analysis.message_path import LATE_RECEIVER, LATE_SENDER, message_path
    from flowscope.analysis.summary import UNITS_NAMED

    t0 = _t0(run)
    out: dict[str, Any] = {"task_path": None, "message_path": None, "data_states": None, "errors": []}
    units = run_units(run)
    tasks = int(units["task_key"].notna().sum())
    if tasks:
        try:
            tp = run_task_paths(run)
        except ValueError as exc:
            out["errors"].append(f"the task graph's critical path: {exc}")
        else:
            chosen = tp.measured if tp.measured is not None else tp.structural
            doc = path_doc(chosen, t0)
            doc.update(kind="measured" if tp.measured is not None else "structural",
                       structural_s=tp.structural.length_ns / 1e9,
                       difference_s=None if tp.difference_ns is None else tp.difference_ns / 1e9,
                       # what the path runs through (tasks, outermost spans, I/O operations), and the resource it
                       # ends on (a measured path's: the one that finished last)
                       units=UNITS_NAMED[str(units["unit"].iloc[0])],
                       end_location=_text(chosen.steps["location"].iloc[-1])
                       if tp.measured is not None and len(chosen.steps) else None)
            out["task_path"] = doc
    try:
        dsg = data_state_graph(run)
    except ValueError as exc:
        out["errors"].append(f"the data-state graph's critical path: {exc}")
    else:
        if dsg is not None:
            out["data_states"] = {"states": dsg["states"], "mutations": dsg["mutations"], "derived": dsg["derived"],
                                  "path": path_doc(dsg["path"], t0), "graph": _graph_doc(dsg["layout"], dsg["path"])}
    transfers = run.sql("SELECT * FROM transfers WHERE attrs LIKE '%\"dst_call\"%'")
    if len(transfers):
        try:
            mp = message_path(run.table("spans"), transfers)
        except ValueError as exc:
            out["errors"].append(f"the critical path through messages: {exc}")
        else:
            if mp is not None:
                w = mp.wait_totals()
                doc = path_doc(mp.path, t0)
                doc.update(messages=mp.messages, resources=len(set(mp.path.ids)), waits=len(mp.waits),
                           late_sender_s=w[LATE_SENDER] / 1e9, late_receiver_s=w[LATE_RECEIVER] / 1e9,
                           waits_by_resource=[{"resource": _text(r.resource_id), "kind": r.kind,
                                               "count": int(r.count), "seconds": int(r.wait_ns) / 1e9}
                                              for r in mp.waits_by_resource().head(50).itertuples(index=False)])
                out["message_path"] = doc
    if not (out["task_path"] or out["message_path"] or out["data_states"] or out["errors"]):
        from flowscope.analysis.critical_path import missing_path_reason

        out["reason"] = missing_path_reason(run)  # what the run holds instead, and what would supply a path
    return out


def graph_layout_doc(g) -> dict:
    """The whole laid-out data-state graph ``g`` (a GraphLayout) in the arrays :func:`graph_group_doc` slices: an
    offline file holds this, and its page cuts each group out of it as the server would (ui/static/offline.js)."""
    return {"groups": g.groups, "locations": g.locations, "x": g.x.round(9).tolist(), "y": g.y.round(2).tolist(),
            "ids": g.ids.tolist(), "loc": g.loc.tolist(), "start": g.start.tolist(), "src": g.src.tolist(),
            "dst": g.dst.tolist(), "estart": g.estart.tolist()}


# ---- profile and breakdown ---------------------------------------------------------------------------------

def profile_view(run: Run) -> dict:
    """Where the time went (:func:`flowscope.analysis.breakdown.breakdown`), the run's utilisation
    (:func:`flowscope.analysis.summary.utilisation`; ``run_utilisation``, None without executing resources' work),
    per-group statistics (:func:`~flowscope.analysis.breakdown.task_groups`) and the call paths with the most
    exclusive time (:func:`flowscope.report.profile.hot_paths`), as ``flowscope show`` and the report give them."""
    from flowscope.analysis.breakdown import IO_TIME_UNKNOWN, breakdown, task_groups
    from flowscope.analysis.summary import utilisation

    b = breakdown(run)
    groups = task_groups(run)
    u = utilisation(run)
    out: dict[str, Any] = {
        "run_utilisation": None if u is None else {
            "value": _num(u.value), "slots": u.slots, "busy_s": u.busy_ns / 1e9,
            "makespan_s": None if u.makespan_ns is None else u.makespan_ns / 1e9,
            "over": "run" if u.makespan_source == "run" else "makespan", "reason": u.reason},
        "makespan_s": b.makespan_s, "tasks": b.tasks, "transfers": b.transfers, "executors": b.executors,
        "transfer_s": b.transfer_s, "io_untimed": b.io_untimed,
        "io_note": IO_TIME_UNKNOWN if b.io_s is None else None,
        "breakdown": [{"category": r["category"], "seconds": _num(r["seconds"]), "bytes": _num(r["bytes"]),
                       "count": _num(r["count"])} for r in b.to_frame().to_dict("records")],
        "groups": [{"group": _text(r["group"]), "role": _text(r["role"]), "category": _text(r["category"]),
                    "count": int(r["count"]), "total_s": _num(r["total_s"]), "mean_s": _num(r["mean_s"]),
                    "std_s": _num(r["std_s"]), "cv": _num(r["cv"]), "max_s": _num(r["max_s"])}
                   for r in groups.to_dict("records")],
        "hot_paths": [], "errors": [], "flame": None, "utilisation": None,
    }
    from flowscope.report.chart_sections import utilisation_table
    from flowscope.report.context import Context

    ctx = Context.of(run)
    u = utilisation_table(ctx)
    if u is not None:
        out["utilisation"] = {"columns": u[0], "rows": [[_text(v) for v in r] for r in u[2]], "more": u[3]}
    if run.counts().get("spans"):
        from flowscope.analysis.call_tree import NESTING_DERIVED, NESTING_FLAT, run_call_tree
        from flowscope.report.profile import hot_paths

        try:
            tree = run_call_tree(run)
        except ValueError as exc:
            out["errors"].append(f"the call tree: {exc}")
        else:
            import json

            from flowscope.report.profile import flame_graph

            lab = ctx.rows(tree.resources)
            out["flame"] = json.loads(flame_graph(tree, dict(zip(lab["resource_id"], lab["label"]))).to_json())
            # why the tree may be flat: resources whose spans overlap without nesting, or whose times were placed
            # by a rule; whether any span nests at all
            how = list(tree.nesting.values())
            out["nesting"] = {"flat": how.count(NESTING_FLAT), "derived": how.count(NESTING_DERIVED),
                              "nested": bool((tree.path_depth > 0).any())}
            out["hot_paths"] = [{"call_path": [str(n) for n in r["call_path"]], "calls": int(r["calls"]),
                                 "exclusive_s": r["exclusive_ns"] / 1e9, "inclusive_s": r["inclusive_ns"] / 1e9,
                                 "exclusive_mean_s": r["exclusive_mean_ns"] / 1e9,
                                 "exclusive_max_s": r["exclusive_max_ns"] / 1e9,
                                 "imbalance": _num(r["exclusive_imbalance"])} for r in hot_paths(tree)]
    return out


# ---- anomalies -----------------------------------------------------------------------------------------------

def run_anomalies(run: Run) -> tuple[pd.DataFrame, int, str, int | None]:
    """The run's anomalies (most severe first), its number of steps, where they come from and the step length:
    the anomalies table when the run has one (as the report reads it), else the offline detector
    (:func:`flowscope.analysis.anomalies.detect_run`, Chimbuko's defaults) over its calls as they are now."""
    from flowscope.store.layout import segment_files

    if segment_files(run.path, "anomalies"):
        from flowscope.report.anomalies import _read_anomalies

        a = _read_anomalies(run)
        step_ns = None
        try:
            from flowscope.analysis.anomalies.reduce import load_model

            step_ns = load_model(run.path)[0].step_ns
        except (ValueError, OSError):
            pass
        nsteps = int(a["step"].max()) + 1 if len(a) else 0
        return a, nsteps, "recorded", step_ns
    from flowscope.analysis.anomalies.detect import detect_run

    det = detect_run(run)
    a = det.anomalies.to_pandas()
    nsteps = int(det.step.max()) + 1 if len(det.step) else 0
    return a, nsteps, "detected", det.config.step_ns


def anomalies_view(run: Run) -> dict:
    """Chimbuko's views of the run's anomalies (:func:`run_anomalies`): per resource its anomalies per step and
    their statistics (:func:`flowscope.report.anomalies.resource_ranking`), the anomalies with their call stack
    and the calls around them, and the function scatter's points (anomalies and normal calls)."""
    from flowscope.analysis.anomalies.config import AnomalyConfig
    from flowscope.report.anomalies import _kept_calls, resource_ranking

    a, nsteps, source, step_ns = run_anomalies(run)
    out: dict[str, Any] = {"source": source, "step_s": None if step_ns is None else step_ns / 1e9,
                           "anomalies": len(a), "steps": nsteps, "ranking": [], "per_step": {}, "list": [],
                           "points": None, "config": None}
    if a.empty:
        return out
    out["config"] = f"{a['algo'].iloc[0]} on {a['metric'].iloc[0]} time"
    rank = resource_ranking(a, nsteps)
    out["ranking"] = [{"resource": _text(rid), **{k: _num(r[k]) for k in ("mean", "std", "max", "min", "total")}}
                      for rid, r in rank.iterrows()]
    per = a.groupby(["resource_id", "step"]).size()
    for (rid, step), n in per.items():
        out["per_step"].setdefault(str(rid), {})[int(step)] = int(n)
    calls = _kept_calls(run, a)
    t0 = min(int(a["start_ns"].min()), int(calls["start_ns"].min()) if len(calls) else int(a["start_ns"].min()))
    out["t0_ns"] = t0
    by_res = {rid: c.sort_values("pos") for rid, c in calls.groupby("resource_id")} if len(calls) else {}
    for row in a.head(ANOMALY_LIMIT).to_dict("records"):
        win = []
        c = by_res.get(row["resource_id"])
        if c is not None:
            me = c[c["call_id"] == row["call_id"]]
            if len(me):
                p = int(me["pos"].iloc[0])
                w = c[(c["pos"] >= p - len(row["window_before"])) & (c["pos"] <= p + len(row["window_after"]))]
                win = [{"call_id": int(x["call_id"]), "function": _text(x["function"]), "depth": int(x["depth"]),
                        "entry_s": (int(x["start_ns"]) - t0) / 1e9,
                        "seconds": (int(x["end_ns"]) - int(x["start_ns"])) / 1e9} for x in w.to_dict("records")]
        out["list"].append({
            "anomaly_id": int(row["anomaly_id"]), "call_id": int(row["call_id"]), "resource": _text(row["resource_id"]),
            "function": _text(row["function"]), "task_key": _text(row.get("task_key")), "step": int(row["step"]),
            "entry_s": (int(row["start_ns"]) - t0) / 1e9, "exit_s": (int(row["end_ns"]) - t0) / 1e9,
            "inclusive_ms": int(row["inclusive_ns"]) / 1e6, "exclusive_ms": int(row["exclusive_ns"]) / 1e6,
            "score": _num(row["score"]), "severity_ms": int(row["severity_ns"]) / 1e6,
            "children": int(row["children"]), "messages": int(row["messages"]),
            "call_stack": [str(s) for s in (row["call_stack"] if row["call_stack"] is not None else [])],
            "window": win})
    anom = set(a["call_id"].tolist())
    normal = calls[~calls["call_id"].isin(anom)] if len(calls) else calls
    thinned = len(normal) > NORMAL_POINTS
    if thinned:
        normal = normal.iloc[np.linspace(0, len(normal) - 1, NORMAL_POINTS).astype(np.int64)]

    origin = int(run.meta.get("start_ns") or t0)
    every_ns = step_ns or AnomalyConfig().step_ns

    def pts(df: pd.DataFrame, messages, label: str, steps=None) -> dict:
        if steps is None:  # a normal call's step, counted as the detector counts it (steps_of)
            steps = (np.maximum(df["start_ns"].to_numpy(np.int64) - origin, 0) // every_ns).tolist()
        return {"step": steps, "label": [label] * len(df),
                "entry": ((df["start_ns"] - t0) / 1e9).tolist(), "exit": ((df["end_ns"] - t0) / 1e9).tolist(),
                "inclusive": (df["inclusive_ns"] / 1e6).tolist(), "exclusive": (df["exclusive_ns"] / 1e6).tolist(),
                "function": [str(f) for f in df["function"]], "children": [int(x) for x in df["children"]],
                "messages": messages, "resource": [str(r) for r in df["resource_id"]],
                "call_id": [int(x) for x in df["call_id"]]}

    out["points"] = {"anomaly": pts(a, [int(m) for m in a["messages"]], "anomaly", [int(x) for x in a["step"]]),
                     "normal": pts(normal, [None] * len(normal), "normal"), "normal_thinned": thinned,
                     "normal_total": int((~calls["call_id"].isin(anom)).sum()) if len(calls) else 0}
    return out


# ---- logs ----------------------------------------------------------------------------------------------------

def logs_view(run: Run) -> dict:
    """The run's log records, latest first (at most LOG_LIMIT), each with the task it names (its group, resource,
    start and duration, from the ``activity`` view), and the count per level."""
    t0 = _t0(run)
    counts = run.sql("SELECT level, count(*) AS n FROM logs GROUP BY level ORDER BY n DESC")
    df = run.sql(f"""
        WITH l AS (SELECT ts_ns, level, category, message, task_key, resource_id FROM logs
                   ORDER BY ts_ns DESC LIMIT {LOG_LIMIT}),
             t AS (SELECT task_key, arg_max("group", end_ns) AS grp, arg_max(resource_id, end_ns) AS res,
                          max(end_ns) AS end_ns, arg_max(start_ns, end_ns) AS start_ns
                   FROM activity WHERE role = 'task' AND task_key IN (SELECT task_key FROM l) GROUP BY task_key)
        SELECT l.*, t.grp, t.res, t.start_ns AS task_start_ns, t.end_ns AS task_end_ns
        FROM l LEFT JOIN t USING (task_key) ORDER BY l.ts_ns DESC""")
    rows = []
    for r in df.to_dict("records"):
        has_task = r["task_start_ns"] is not None and not pd.isna(r["task_start_ns"])
        rows.append({"t": (int(r["ts_ns"]) - t0) / 1e9, "level": _text(r["level"]), "category": _text(r["category"]),
                     "message": _text(r["message"]), "task_key": _text(r["task_key"]),
                     "resource": _text(r["resource_id"]),
                     "task": {"group": _text(r["grp"]), "resource": _text(r["res"]),
                              "start_s": (int(r["task_start_ns"]) - t0) / 1e9,
                              "seconds": (int(r["task_end_ns"]) - int(r["task_start_ns"])) / 1e9}
                     if has_task else None})
    return {"counts": {str(k): int(n) for k, n in zip(counts["level"], counts["n"])},
            "total": int(counts["n"].sum()) if len(counts) else 0, "records": rows}


def memory_view(run: Run) -> dict:
    """Memory over time per executing process (:func:`flowscope.analysis.memory.process_memory_parts`): per process
    its label and its samples, seconds since the run's start and resident bytes, with ``managed`` and ``spilled``
    (the runtime's data in memory and on disk, sampled with them; None for a sample without) where the source
    records them."""
    from flowscope.analysis.memory import MEMORY_PARTS, PROCESS_MEMORY, process_memory_parts

    t0 = _t0(run)
    df = process_memory_parts(run)
    procs = []
    for rid, part in df.groupby("resource_id", sort=True):
        doc = {"resource_id": rid, "label": str(part["label"].iloc[0]),
               "t": ((part["ts_ns"].to_numpy() - t0) / 1e9).tolist(), "bytes": part["bytes"].astype(float).tolist()}
        for col in MEMORY_PARTS:
            if part[col].notna().any():
                doc[col] = [None if v != v else v for v in part[col].tolist()]
        procs.append(doc)
    return {"metric": PROCESS_MEMORY, "processes": procs}


#: evidence rows listed per finding of the advisor (its estimate covers all of them)
EVIDENCE_LIMIT = 20


def advisor_view(run: Run) -> dict:
    """What ``flowscope explain`` says of the run (:func:`flowscope.analysis.advisor.explain`): where the makespan
    went, the idle capacity, and the findings ranked by recoverable time, each with its change and its evidence
    (the first EVIDENCE_LIMIT rows; ``evidence_rows`` counts them all); for a run that recorded no work, why and
    what to do (``nothing_observed``: :func:`flowscope.analysis.nothing_observed.why_nothing_observed`)."""
    from flowscope.analysis.advisor import explain
    from flowscope.analysis.nothing_observed import why_nothing_observed

    doc = explain(run).to_dict()
    doc["nothing_observed"] = [{"code": r.code, "why": r.why, "what_to_do": r.what_to_do}
                               for r in why_nothing_observed(run)]
    for f in doc["findings"]:
        f["evidence_rows"] = len(f["evidence"])
        f["evidence"] = f["evidence"][:EVIDENCE_LIMIT]
    return doc


def charts_view(run: Run) -> dict:
    """The report's charts over time and size (report/chart_sections.py: tasks by state, I/O per thread,
    communication, warnings): per chart its title, help, plotly figure (None: the run has none, and ``nodata`` or
    ``no_chart`` says why) and table."""
    import json

    from flowscope.report.chart_sections import CHART_SECTIONS
    from flowscope.report.context import Context

    ctx = Context.of(run)
    out = []
    for sid, c in CHART_SECTIONS.items():
        fig, table = c.figure(ctx), c.table(ctx)
        out.append({"id": sid, "title": c.title, "help": c.help, "nodata": c.nodata, "no_chart": c.no_chart,
                    "figure": json.loads(fig.to_json()) if fig is not None else None,
                    "table": None if table is None else {
                        "columns": table[0], "text": sorted(range(table[1]) if isinstance(table[1], int) else table[1]),
                        "rows": [[_text(v) for v in r] for r in table[2]]}})
    from flowscope.report.io_summary import HELP, io_summary_blocks

    absent, blocks = io_summary_blocks(ctx)
    for b in blocks:
        if b["kind"] == "figures":
            b["figures"] = [{"id": i, "figure": json.loads(f.to_json())} for i, f in b["figures"]]
        elif b["kind"] == "table":
            b["rows"] = [[_text(v) for v in r] for r in b["rows"]]
    return {"sections": out, "io_summary": {"title": "I/O summary", "help": HELP, "absent": absent,
                                            "blocks": blocks}}


#: view name -> (the function computing it, the tables whose new segments change it)
VIEWS: dict[str, tuple[Callable[[Run], dict], tuple[str, ...]]] = {
    "critical-path": (critical_path_view, ("spans", "dependencies", "transfers", "data_states", "mutations",
                                           "resources")),
    "profile": (profile_view, ("spans", "transfers", "io", "resources")),
    "anomalies": (anomalies_view, ("spans", "anomalies", "transfers", "logs", "resources")),
    "logs": (logs_view, ("logs", "spans")),
    "memory": (memory_view, ("metrics", "resources")),
    "charts": (charts_view, ("spans", "transitions", "io", "transfers", "logs", "metrics", "resources")),
    "advisor": (advisor_view, ("spans", "transitions", "transfers", "dependencies", "logs", "io", "metrics",
                               "resources")),
}


def view_signature(run_dir: Path, view: str) -> tuple:
    """What ``view`` of the run depends on: the run's status, then the number of segments of each table it reads."""
    try:
        status = read_json(run_dir / RUN_JSON).get("status")
    except (OSError, ValueError):
        status = None
    return (status, *(len(segment_files(run_dir, t)) for t in VIEWS[view][1]))


def view_document(run_dir: Path, view: str, signature: tuple, run: Run | None = None) -> dict:
    """``view`` of the run as a dashboard page receives it: the view's JSON (or ``failed``: why it could not be
    computed), with ``view``, ``compute_s``, ``status`` and ``segments`` (per table read, from ``signature``, taken
    by :func:`view_signature` before computing), and ``cost_s``: the smaller of the wall time and the process's CPU time
    over the computation, what it cost the process when other programs take the cores (wall time grows then, CPU
    time does not) and when the process's other threads are busy (CPU time grows then). ``run``: the run opened
    already, for a caller computing several views (what one view memoises, the next reuses); it is left open."""
    fn, tables = VIEWS[view]
    own = run is None
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    run = Run(run_dir) if own else run
    try:
        doc = json_safe(fn(run))
    except Exception as exc:  # a run the analysis cannot read says why, on its page
        log.exception("the %s view of %s failed", view, run_dir.name)
        doc = {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    finally:
        if own:
            run.close()
    doc["view"] = view
    doc["compute_s"] = time.perf_counter() - t0
    doc["cost_s"] = min(doc["compute_s"], time.process_time() - cpu0)
    doc["status"] = signature[0]
    doc["segments"] = dict(zip(tables, signature[1:]))
    return doc
