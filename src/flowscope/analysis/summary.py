"""A run at a glance: rows per table, time range, resources, where span time goes, the task graph's
critical path and how much of the capacity that ran tasks was used."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pandas as pd

from flowscope.analysis.timeline import DERIVED, task_timeline
from flowscope.model.schemas import DERIVED_TABLES
from flowscope.store.catalog import run_state
from flowscope.store.layout import segment_files
from flowscope.store.run import Run

#: utilisation a little above 1 is read as 1: task spans of one thread may overlap by microseconds (where
#: each span's end is taken); beyond this it means the capacity recorded does not cover what ran
UTILISATION_SLACK = 0.01


@dataclass
class Utilisation:
    """Task time over capacity: ``busy_ns / (slots * makespan_ns)``, in [0, 1].

    ``busy_ns`` sums the task spans' durations (each task holds one slot while it runs); ``slots`` is what
    the resources that ran tasks offer (a thread 1, a host its ``cpu_cores``, a worker its ``nthreads``);
    ``makespan_ns`` is the task spans' extent when their times were measured, the run's recorded duration
    when they were derived (their extent is then a schedule's, not the run's). ``value`` is None when one
    of them is unknown, with ``reason`` saying which."""

    busy_ns: int
    slots: int | None
    makespan_ns: int | None
    makespan_source: str | None
    value: float | None
    reason: str | None = None


def _slots(kind: str | None, attrs: str | None) -> int | None:
    """Task slots a resource offers: 1 for a thread, else its ``cpu_cores`` or ``nthreads`` attr."""
    if kind == "thread":
        return 1
    try:
        a = json.loads(attrs) if isinstance(attrs, str) else {}
    except ValueError:
        a = {}
    for k in ("cpu_cores", "nthreads"):
        v = a.get(k) if isinstance(a, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1 and v == int(v):
            return int(v)
    return None


def utilisation(run: Run) -> Utilisation | None:
    """How much of the capacity that ran ``run``'s tasks they used (see :class:`Utilisation`); None when the
    run has no task spans."""
    tasks = run.sql("""SELECT resource_id, sum(end_ns - start_ns) AS busy, min(start_ns) AS t0, max(end_ns) AS t1
                       FROM spans WHERE kind = 'task' GROUP BY resource_id""")
    if not len(tasks):
        return None
    busy = int(tasks["busy"].sum())
    res = run.sql("""SELECT resource_id, first(kind) AS kind, max(attrs) AS attrs FROM resources
                     GROUP BY resource_id""")
    info = {r: (k, a) for r, k, a in zip(res["resource_id"], res["kind"], res["attrs"])}
    slots = {r: _slots(*info.get(r, (None, None))) for r in tasks["resource_id"]}
    unknown = sorted(r for r, n in slots.items() if n is None)
    timeline = task_timeline(run.sql("SELECT kind, attrs FROM spans WHERE kind = 'task'"))
    meta = run.meta
    if timeline == DERIVED:
        start, end = meta.get("start_ns"), meta.get("end_ns")
        makespan = end - start if start is not None and end is not None else None
        source = "run"
    else:
        makespan = int(tasks["t1"].max()) - int(tasks["t0"].min())
        source = "task spans"
    capacity = None if unknown else sum(slots.values())
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
    #: task_times ("measured" or "derived"), measured_ns and measured_tasks (None when derived),
    #: structural_ns, structural_ids; None without task spans
    critical_path: dict | None = None
    utilisation: Utilisation | None = None

    @property
    def duration_ns(self) -> int | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return self.end_ns - self.start_ns

    def to_dict(self) -> dict:
        d = self.__dict__.copy()
        d["duration_ns"] = self.duration_ns
        d["utilisation"] = asdict(self.utilisation) if self.utilisation is not None else None
        return d


def task_critical_path(run: Run) -> dict | None:
    """The task graph's critical paths in brief (see :attr:`RunSummary.critical_path`); None without tasks."""
    from flowscope.analysis.critical_path import task_graph_paths

    spans = run.sql("SELECT * FROM spans WHERE kind = 'task'")
    if not len(spans):
        return None
    try:
        tp = task_graph_paths(spans, run.table("dependencies"), run.table("transfers"))
    except ValueError as exc:  # a table that breaks the analysis' rules must not cost the whole summary
        return {"task_times": task_timeline(spans), "error": str(exc)}
    m = tp.measured
    return {"task_times": tp.timeline,
            "measured_ns": int(m.length_ns) if m is not None else None,
            "measured_tasks": int((m.steps["kind"] == "task").sum()) if m is not None else None,
            "structural_ns": int(tp.structural.length_ns), "structural_ids": list(tp.structural.ids)}


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
    return RunSummary(
        run_id=meta["run_id"], name=meta.get("name"), status=run_state(meta), rows=rows,
        start_ns=start, end_ns=end,
        resources_by_kind=dict(zip(kinds["kind"], map(int, kinds["n"]))),
        top_spans=[{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                   for r in spans.to_dict("records")],
        logs_by_level=dict(zip(levels["level"], map(int, levels["n"]))),
        critical_path=task_critical_path(run),
        utilisation=utilisation(run),
    )


