"""What the advisor reads from one run, gathered once: its tasks (in the model's vocabulary), the graph's edges,
the transfers, the run's wall-clock extent, its graph submissions, the measured critical path, and a replay of
the run with scaled task durations (:func:`~flowscope.analysis.critical_path.what_if`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from flowscope.store.run import Run

#: the log category a source writes when a task graph reaches its scheduler (docs/data-model.md, ``logs``)
GRAPH_SUBMITTED = "graph-submitted"
#: log categories of pauses that stall a whole process: a garbage collection, an unresponsive event loop
#: (``attrs.duration_s`` says how long; docs/data-model.md, ``logs``)
STALL_CATEGORIES = ("gc", "event-loop-unresponsive")


@dataclass
class RunFacts:
    """One run as the advisor reads it.

    ``tasks``: one row per task key (its last execution): key, group, resource_id (what ran it), worker (the
    resource that resource nests in, e.g. a worker process; else itself), start_ns, end_ns, duration_ns,
    category, nbytes (the size of its output when the source records it, ``attrs.nbytes``; else NaN).
    ``slots``: how many tasks the resources that ran tasks can run at once (the ``executors`` view).
    ``cores``: the CPU cores of the hosts those resources sit on (:func:`host_cores`), None where not known.
    ``wall_start_ns`` / ``wall_end_ns``: the run's recorded start and end (run.json), else its records' extent.
    ``submissions``: the graph-submission logs (ts_ns, tasks)."""

    run: Run
    tasks: pd.DataFrame
    units: pd.DataFrame
    dependencies: pd.DataFrame
    transfers: pd.DataFrame
    slots: int
    wall_start_ns: int
    wall_end_ns: int
    submissions: pd.DataFrame
    cores: int | None = None
    #: the run's state (``Run.state``) when these facts were read: while it holds, the run's memoised task graph
    #: and paths are these facts' own
    state: tuple | None = None
    _replays: dict = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return (self.wall_end_ns - self.wall_start_ns) / 1e9

    @property
    def task_start_ns(self) -> int | None:
        return int(self.tasks["start_ns"].min()) if len(self.tasks) else None

    @property
    def task_end_ns(self) -> int | None:
        return int(self.tasks["end_ns"].max()) if len(self.tasks) else None

    @property
    def task_phase_s(self) -> float:
        return (self.task_end_ns - self.task_start_ns) / 1e9 if len(self.tasks) else 0.0

    @cached_property
    def paths(self):
        """The task graph's critical paths (:class:`~flowscope.analysis.critical_path.TaskPaths`), None without
        units of work or when the tables break the analysis' rules."""
        from flowscope.analysis.critical_path import task_graph_paths
        from flowscope.analysis.critical_path.task_paths import run_task_paths

        if not len(self.units):
            return None
        try:
            if self._unchanged():
                return run_task_paths(self.run)
            return task_graph_paths(self.units, self.dependencies, self.transfers)
        except ValueError:
            return None

    def _unchanged(self) -> bool:
        """Whether the run is as it was when these facts were read (then what it memoised is theirs)."""
        return self.state is not None and self.run.state() == self.state

    def replay_s(self, scale: Mapping[str, float] | None = None,
                 scale_tasks: Mapping[str, float] | None = None, placement: str = "observed") -> float | None:
        """The task phase's length (s) in a replay of the run with scaled durations (``what_if``: each task on
        its thread in the observed order, started when its inputs have arrived and its thread is free, plus
        the lag it was observed to wait beyond that; ``placement="any"``: on whichever thread is free first);
        None when the run has no measured task times."""
        from flowscope.analysis.critical_path.task_paths import replay

        if self.paths is None or self.paths.measured is None:
            return None
        memo = (tuple(sorted((scale or {}).items())), tuple(sorted((scale_tasks or {}).items())), placement)
        if memo not in self._replays:
            self._replays[memo] = replay(self.task_graph, scale=dict(scale or {}), scale_tasks=scale_tasks,
                                         placement=placement) / 1e9
        return self._replays[memo]

    @cached_property
    def task_graph(self):
        """The task graph every replay of this run starts from (built once: a build reads every unit's attrs)."""
        from flowscope.analysis.critical_path.task_graph import _task_graph
        from flowscope.analysis.critical_path.task_paths import run_task_graph

        if self._unchanged():
            return run_task_graph(self.run)
        return _task_graph(self.units, self.dependencies, self.transfers)

    def gain_s(self, scale: Mapping[str, float] | None = None,
               scale_tasks: Mapping[str, float] | None = None, placement: str = "observed") -> float | None:
        """How much shorter the replay with these factors is than the replay as observed (s, >= 0), both with
        ``placement`` (``what_if``)."""
        base, new = self.replay_s(placement=placement), self.replay_s(scale, scale_tasks, placement)
        if base is None or new is None:
            return None
        return max(base - new, 0.0)

    @cached_property
    def flagged(self) -> pd.DataFrame:
        """The task executions the anomaly detector flags (analysis/anomalies; HBOS with Chimbuko's defaults):
        key, group, resource_id, severity_ns (time above the group's mean)."""
        from flowscope.analysis.anomalies.detect import detect_run

        try:
            det = detect_run(self.run)
        except ValueError:
            return pd.DataFrame(columns=["key", "group", "resource_id", "severity_ns"])
        a = det.anomalies.to_pandas() if det.anomalies is not None else pd.DataFrame()
        if not len(a):
            return pd.DataFrame(columns=["key", "group", "resource_id", "severity_ns"])
        a = a[a["task_key"].isin(set(self.tasks["key"]))]
        return a.rename(columns={"task_key": "key", "function": "group"})[
            ["key", "group", "resource_id", "severity_ns"]].reset_index(drop=True)


def _wall(run: Run, tasks: pd.DataFrame) -> tuple[int, int]:
    """The run's recorded start and end (run.json), widened to its tasks; without them, its records' extent."""
    meta = run.meta
    start, end = meta.get("start_ns"), meta.get("end_ns")
    if start is None or end is None:
        ext = run.sql("""SELECT min(t0) AS t0, max(t1) AS t1 FROM (
                             SELECT min(start_ns) AS t0, max(end_ns) AS t1 FROM spans
                             UNION ALL SELECT min(ts_ns), max(ts_ns) FROM logs
                             UNION ALL SELECT min(ts_ns), max(ts_ns) FROM transitions)""").iloc[0]
        if pd.isna(ext["t0"]):
            return 0, 0
        start = int(ext["t0"]) if start is None else start
        end = int(ext["t1"]) if end is None else end
    start, end = int(start), int(end)
    if len(tasks):
        start, end = min(start, int(tasks["start_ns"].min())), max(end, int(tasks["end_ns"].max()))
    return start, end


def run_facts(run: Run) -> RunFacts:
    """Gather what the advisor reads from ``run`` (:class:`RunFacts`)."""
    from flowscope.analysis.critical_path.task_paths import run_units

    state = run.state()
    units = run_units(run)
    # the units of work (tasks; else a resource's outermost spans or timed I/O operations), the last execution of
    # each key (a retried task, a lost worker's: the one that counted), with where they ran
    u = units.sort_values("end_ns", kind="stable").drop_duplicates("task_key", keep="last")
    parent = run.sql("SELECT resource_id, parent_id FROM resources").set_index("resource_id")["parent_id"]
    size = run.sql("""SELECT task_key, max(TRY_CAST(json_extract_string(attrs, '$.nbytes') AS DOUBLE)) AS nbytes
                      FROM activity WHERE role = 'task' AND task_key IS NOT NULL GROUP BY task_key""")
    size = size.set_index("task_key")["nbytes"]
    res = u["resource_id"].astype(object)
    tasks = pd.DataFrame({
        "key": u["task_key"].astype(str), "group": u["name"].astype(str), "resource_id": res,
        "worker": res.map(parent).where(lambda w: w.notna(), res).astype(object),
        "start_ns": u["start_ns"].astype("int64"), "end_ns": u["end_ns"].astype("int64"),
        "duration_ns": (u["end_ns"] - u["start_ns"]).astype("int64"), "category": u["category"].astype(object),
        "nbytes": u["task_key"].map(size).astype(np.float64)})
    tasks = tasks.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    slots = run.sql("SELECT resource_id, slots FROM executors").set_index("resource_id")["slots"]
    ran = pd.Series(tasks["resource_id"].dropna().unique())
    # a resource the run never declared, or whose slots are unknown, still ran its tasks: one slot at least
    n_slots = int(pd.to_numeric(ran.map(slots), errors="coerce").fillna(1).clip(lower=1).sum())
    subs = run.sql(f"""SELECT ts_ns, TRY_CAST(json_extract_string(attrs, '$.tasks') AS BIGINT) AS tasks
                       FROM logs WHERE category = '{GRAPH_SUBMITTED}' ORDER BY ts_ns""")
    w0, w1 = _wall(run, tasks)
    return RunFacts(run=run, tasks=tasks, units=units, dependencies=run.table("dependencies"),
                    transfers=run.table("transfers"), slots=n_slots, wall_start_ns=w0, wall_end_ns=w1,
                    submissions=subs, cores=host_cores(run, ran, parent),
                    state=state if run.state() == state else None)


#: a per-core CPU metric (``cpu.core3.percent``, docs/data-model.md): a host sampled with one per core
CORE_METRIC = r"^cpu\.core[0-9]+\.percent$"


def host_cores(run: Run, resources: pd.Series, parent: pd.Series) -> int | None:
    """The CPU cores of the hosts ``resources`` sit on (their nearest ancestor, or themselves, whose cores are
    known: its ``attrs.cpu_cores``, else how many per-core CPU metrics it was sampled with), summed over the distinct
    hosts; None when one of them sits on no such host."""
    declared = run.sql("""SELECT resource_id, TRY_CAST(json_extract_string(attrs, '$.cpu_cores') AS BIGINT) AS n
                          FROM resources WHERE TRY_CAST(json_extract_string(attrs, '$.cpu_cores') AS BIGINT) > 0""")
    sampled = run.sql("SELECT resource_id, count(DISTINCT name) AS n FROM metrics WHERE regexp_matches(name, ?) "
                      "GROUP BY resource_id", [CORE_METRIC])
    cores = {**dict(zip(sampled["resource_id"], sampled["n"])), **dict(zip(declared["resource_id"], declared["n"]))}
    if not cores or not len(resources):
        return None
    parents = parent.to_dict()
    hosts = set()
    for rid in resources:
        seen = set()
        while rid not in cores:
            if not isinstance(rid, str) or rid in seen:  # the top of the tree, or a cycle in bad input
                return None
            seen.add(rid)
            rid = parents.get(rid)
        hosts.add(rid)
    return int(sum(int(cores[h]) for h in hosts))
