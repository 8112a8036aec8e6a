"""A run at a glance, for any source: rows per table, time range, resources, where span time goes, the
breakdown by category, the critical path, how much of the executing resources' capacity was used, and the
top findings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from flowscope.analysis.breakdown import Breakdown, breakdown
from flowscope.analysis.timeline import (
    DERIVED,
    UTILISATION_SLACK,
    capacity_window,
    resource_states,
    task_timeline,
    utilisation_by_resource,
)
from flowscope.model.schemas import DERIVED_TABLES
from flowscope.store.catalog import run_state
from flowscope.store.layout import segment_files
from flowscope.store.run import Run

#: the kind of a critical path's step that is a unit of work (analysis/critical_path.py)
TASK_STEP = "task"
#: what the critical path runs through, per kind of unit of work (critical_path.work_units' ``unit``)
UNITS_NAMED = {"task": "tasks", "span": "outermost spans", "io operation": "I/O operations"}


@dataclass
class Utilisation:
    """Busy time over capacity: ``busy_ns / (slots * makespan_ns)``, in [0, 1].

    ``busy_ns`` is the executing resources' slot-time not idle (their state timeline,
    :func:`~flowscope.analysis.timeline.resource_states`); ``slots`` is what they offer (the ``executors``
    view: a thread 1, a host its ``cpu_cores``, a worker its ``nthreads``); ``makespan_ns`` is the extent of
    their timed work (``makespan_source``: "task spans", or "I/O operations" in a run whose only timed work is I/O
    operations) when the task times were measured, the run's recorded duration when they were derived (their extent is then a schedule's, not the run's). ``value`` is None when one
    of them is unknown, with ``reason`` saying which."""

    busy_ns: int
    slots: int | None
    makespan_ns: int | None
    makespan_source: str | None
    value: float | None
    reason: str | None = None


def utilisation(run: Run) -> Utilisation | None:
    """How much of the capacity of ``run``'s executing resources (the ``executors`` view) their work used (see
    :class:`Utilisation`); None when no executing resource has activity."""
    states = resource_states(run)
    if not len(states):
        return None
    util = utilisation_by_resource(run, states)
    busy = int(util["busy_ns"].sum())
    slots = dict(zip(util["resource_id"], util["slots"]))
    unknown = sorted(r for r, n in slots.items() if n is None or pd.isna(n))
    makespan, source = capacity_window(run, states)
    capacity = None if unknown else int(sum(slots.values()))
    u = Utilisation(busy, capacity, makespan, source, None)
    if unknown:
        u.reason = (f"{len(unknown)} of the {len(slots)} resources that ran tasks have no known core count "
                    f"(e.g. {unknown[0]!r})")
    elif makespan is None:
        u.reason = "the task times are derived and the run records no duration"
    elif makespan <= 0:
        u.reason = "the tasks span no time"
    else:
        value = busy / (capacity * makespan)
        if value > 1 + UTILISATION_SLACK:
            u.reason = (f"the tasks ran {busy / 1e9:.6g} s, more than {capacity} slots x {makespan / 1e9:.6g} s "
                        f"hold: the capacity recorded does not cover what ran")
        else:
            u.value = min(value, 1.0)
    return u


@dataclass
class RunSummary:
    run_id: str
    name: str | None
    status: str | None
    rows: dict[str, int]
    start_ns: int | None
    end_ns: int | None
    resources_by_kind: dict[str, int] = field(default_factory=dict)
    top_spans: list[dict] = field(default_factory=list)   # name, kind, count, total_ns, mean_ns, max_ns
    logs_by_level: dict[str, int] = field(default_factory=dict)
    #: task_times ("measured" or "derived"), measured_ns, measured_tasks, measured_components and
    #: measured_end_location (None when derived), structural_ns, structural_ids, units ("tasks", "outermost
    #: spans", "I/O operations": what the path runs through) with units of work; messages: the path through
    #: messages (length_ns, resources, messages, wait_ns per late-sender / late-receiver, wait_states, steps)
    #: where transfers link calls; with neither, data_states (length_ns, states) when the run records data
    #: states; with none, ``{"path": None, "reason": ...}`` saying why and what would supply a path
    critical_path: dict | None = None
    utilisation: Utilisation | None = None
    #: where the executing resources' time went (analysis/breakdown.py), for any source
    breakdown: Breakdown | None = None
    #: the few facts a reader should see first: dicts with ``what`` (a short key), ``message``, ``value``
    findings: list[dict] = field(default_factory=list)

    @property
    def duration_ns(self) -> int | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return self.end_ns - self.start_ns

    def to_dict(self) -> dict:
        d = self.__dict__.copy()
        d["duration_ns"] = self.duration_ns
        d["utilisation"] = asdict(self.utilisation) if self.utilisation is not None else None
        d["breakdown"] = self.breakdown.to_dict() if self.breakdown is not None else None
        return d


def messages_critical_path(run: Run) -> dict | None:
    """The critical path through the run's messages and their wait states in brief
    (:meth:`~flowscope.analysis.message_path.MessagePath.to_dict`); None when no transfer links two calls."""
    from flowscope.analysis.message_path import message_path

    transfers = run.sql("SELECT * FROM transfers WHERE attrs LIKE '%\"dst_call\"%'")
    if not len(transfers):
        return None
    spans = run.sql("SELECT * FROM spans WHERE resource_id IN (SELECT resource_id FROM spans WHERE task_key IN "
                    "(SELECT json_extract_string(attrs, '$.dst_call') FROM transfers UNION "
                    "SELECT json_extract_string(attrs, '$.src_call') FROM transfers))")
    try:
        mp = message_path(spans, transfers)
    except ValueError as exc:
        return {"error": str(exc)}
    return mp.to_dict() if mp is not None else None


def data_state_critical_path(run: Run) -> dict | None:
    """The data-state graph's critical path in brief (``length_ns``, ``states``: how many it passes); None
    without recorded data states and mutations."""
    from flowscope.analysis.critical_path import data_state_path

    counts = run.counts()
    if not counts.get("data_states") or not counts.get("mutations"):
        return None
    try:
        p = data_state_path(run.table("data_states"), run.table("mutations"))
    except ValueError as exc:
        return {"error": str(exc)}
    return {"length_ns": int(p.length_ns), "states": len(p.ids)}


def task_critical_path(run: Run) -> dict:
    """The critical paths in brief (see :attr:`RunSummary.critical_path`): the task graph's, and under
    ``messages`` the path through messages where transfers link calls; with neither, under ``data_states`` the
    data-state graph's path; with none of them ``{"path": None, "reason": ...}``
    (:func:`~flowscope.analysis.critical_path.missing_path_reason`: why, and what would supply one)."""
    from flowscope.analysis.critical_path import missing_path_reason

    messages = messages_critical_path(run)
    out = _task_graph_path(run)
    if messages is not None:
        out = dict(out or {})
        out["messages"] = messages
    if out is None:
        states = data_state_critical_path(run)
        out = {"data_states": states} if states is not None else {"path": None, "reason": missing_path_reason(run)}
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def findings(run: Run, b: Breakdown, u: Utilisation | None, cp: dict | None, top: int = 5) -> list[dict]:
    """The few facts about ``run`` a reader should see first, most telling first: where the executing
    resources' time went, the group that took most of it, how unevenly the resources were used, what bounds
    the makespan, what is unknown."""
    from flowscope.analysis.breakdown import task_groups

    out: list[dict] = []
    cats = {c: v for c, v in b.categories.items() if c != "io" or b.io_s is not None}
    total = sum(cats.values())
    if total > 0:
        ranked = sorted(cats.items(), key=lambda kv: -kv[1])
        c, v = ranked[0]
        rest = ", ".join(f"{k} {_pct(x / total)}" for k, x in ranked[1:3])
        out.append({"what": "time", "value": v / total,
                    "message": f"{c} takes {_pct(v / total)} of the time recorded"
                               + (f" ({rest})" if rest else "")})
    groups = task_groups(run)
    if len(groups) and groups["total_s"].sum() > 0:
        g = groups.iloc[0]
        share = float(g["total_s"] / groups["total_s"].sum())
        out.append({"what": "group", "value": share,
                    "message": f"{g['group']} ({g['category']}, {int(g['count']):,} {g['role']}s) takes "
                               f"{_pct(share)} of the {g['role']} time"})
    util = utilisation_by_resource(run)
    derived = cp is not None and cp.get("task_times") == DERIVED  # a schedule's concurrency, not the run's
    if len(util) >= 2 and util["utilisation"].notna().all() and not derived:
        lo, hi = util.loc[util["utilisation"].idxmin()], util.loc[util["utilisation"].idxmax()]
        out.append({"what": "imbalance", "value": float(hi["utilisation"] - lo["utilisation"]),
                    "message": f"busiest executing resource {hi['resource_id']} at {_pct(hi['utilisation'])}, "
                               f"least busy {lo['resource_id']} at {_pct(lo['utilisation'])}"})
    elif u is not None and u.value is not None:
        out.append({"what": "utilisation", "value": u.value,
                    "message": f"the executing resources were busy {_pct(u.value)} of their capacity"})
    if cp and not cp.get("error") and not cp.get("reason") and b.makespan_s > 0:
        length = cp.get("measured_ns") or cp.get("structural_ns") or 0
        kind = "measured" if cp.get("measured_ns") else "structural"
        out.append({"what": "critical_path", "value": length / 1e9,
                    "message": f"critical path ({kind}, through {cp.get('units', 'tasks')}): {length / 1e9:.6g} s, "
                               f"{_pct(length / 1e9 / b.makespan_s)} of the makespan"})
    if b.io_s is None:
        out.append({"what": "io_unknown", "value": None, "message": "I/O time unknown: only byte counters exist"})
    return out[:top]


def _task_graph_path(run: Run) -> dict | None:
    """The task graph's critical paths in brief, over the run's units of work
    (:func:`~flowscope.analysis.critical_path.work_units`); None without any."""
    from flowscope.analysis.critical_path import task_graph_paths, work_units

    spans = work_units(run)
    if not len(spans):
        return None
    try:
        tp = task_graph_paths(spans, run.table("dependencies"), run.table("transfers"))
    except ValueError as exc:  # a table that breaks the analysis' rules must not cost the whole summary
        return {"task_times": task_timeline(spans), "error": str(exc)}
    m = tp.measured
    by = m.by_component() if m is not None else None
    return {"task_times": tp.timeline,
            "measured_ns": int(m.length_ns) if m is not None else None,
            "measured_tasks": int((m.steps["kind"] == TASK_STEP).sum()) if m is not None else None,
            # where the measured path's time went (compute, transfer, io, wait, queue; idle between the units of a
            # resource's own sequence), and the resource it ends on (the one that finished last)
            "measured_components": ({c: int(d) for c, d in zip(by["component"], by["duration_ns"]) if d}
                                    if by is not None else None),
            "measured_end_location": (str(m.steps["location"].iloc[-1])
                                      if m is not None and len(m.steps) and m.steps["location"].iloc[-1] is not None
                                      else None),
            "structural_ns": int(tp.structural.length_ns), "structural_ids": list(tp.structural.ids),
            "units": UNITS_NAMED[str(spans["unit"].iloc[0])]}


def summarize(run: Run, top: int = 10) -> RunSummary:
    """Summarise ``run``: counts per table, observed time range, the span names with most total time, the
    task graph's critical path and the utilisation of what ran the tasks."""
    meta = run.meta
    rows = run.counts()
    for name in DERIVED_TABLES:  # e.g. the anomalies a reduced run keeps
        if segment_files(run.path, name):
            rows[name] = int(run.sql(f'SELECT count(*) AS n FROM "{name}"')["n"].iloc[0])
    first_last = run.sql("""
        SELECT min(t0) AS t0, max(t1) AS t1 FROM (
            SELECT min(start_ns) AS t0, max(end_ns) AS t1 FROM spans
            UNION ALL SELECT min(ts_ns), max(ts_ns) FROM metrics
            UNION ALL SELECT min(ts_ns), max(ts_ns) FROM logs
            UNION ALL SELECT min(ts_ns), max(ts_ns) FROM transitions)""").iloc[0]
    start = meta.get("start_ns")
    end = meta.get("end_ns")
    if not pd.isna(first_last["t0"]):  # some table has rows (NaN or NA when none has)
        start = int(first_last["t0"]) if start is None else min(start, int(first_last["t0"]))
        end = int(first_last["t1"]) if end is None else max(end, int(first_last["t1"]))
    kinds = run.sql("SELECT kind, count(*) AS n FROM resources GROUP BY kind ORDER BY n DESC")
    spans = run.sql(f"""
        SELECT name, kind, count(*) AS count, CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns,
               avg(end_ns - start_ns) AS mean_ns, max(end_ns - start_ns) AS max_ns
        FROM spans GROUP BY name, kind ORDER BY total_ns DESC LIMIT {int(top)}""")
    levels = run.sql("SELECT level, count(*) AS n FROM logs GROUP BY level ORDER BY n DESC")
    b, cp, u = breakdown(run), task_critical_path(run), utilisation(run)
    return RunSummary(
        run_id=meta["run_id"], name=meta.get("name"), status=run_state(meta), rows=rows,
        start_ns=start, end_ns=end,
        resources_by_kind=dict(zip(kinds["kind"], map(int, kinds["n"]))),
        top_spans=[{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                   for r in spans.to_dict("records")],
        logs_by_level=dict(zip(levels["level"], map(int, levels["n"]))),
        critical_path=cp,
        utilisation=u,
        breakdown=b,
        findings=findings(run, b, u, cp),
    )


