"""Critical paths through a task graph: the measured path (traced back from the last task to finish through what
it waited for), the structural path (the longest path with the tasks' durations), per-task slack, near-critical
paths and what-if replays with scaled durations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from flowscope.analysis.critical_path.longest import (
    _forward,
    _predecessors,
    _walk,
    longest_path,
    longest_path_length,
)
from flowscope.analysis.critical_path.steps import (
    IDLE_COMPONENT,
    CriticalPath,
    _step,
    _steps_frame,
)
from flowscope.analysis.critical_path.task_graph import (
    TASK_UNIT,
    _task_graph,
    _TaskGraph,
    work_units,
)
from flowscope.analysis.timeline import MEASURED, task_timeline


@dataclass
class TaskPaths:
    """The measured and the structural critical path of a task graph (see :func:`task_graph_paths`).
    ``measured`` is None when the task times were derived, not measured (``timeline`` says which)."""

    measured: CriticalPath | None
    structural: CriticalPath
    timeline: str = MEASURED

    @property
    def difference_ns(self) -> int | None:
        """Measured minus structural length: what scheduling and contention for workers cost (None without a
        measured path)."""
        if self.measured is None:
            return None
        return int(self.measured.length_ns - self.structural.length_ns)


def _measured_path(g: _TaskGraph) -> CriticalPath:
    tasks = g.tasks
    if g.n == 0:
        return CriticalPath(_steps_frame([]), 0, [])
    start = tasks["start_ns"].to_numpy(dtype=np.int64)
    end = tasks["end_ns"].to_numpy(dtype=np.int64)
    t0 = int(start.min())
    arrival = g.arrival
    # per task: the input edge that arrived last (ties: later row)
    gate = np.full(g.n, -1, dtype=np.int64)
    if len(g.src):
        rows = np.arange(len(g.src))
        order = np.lexsort((rows, arrival, g.dst))
        d = g.dst[order]
        last = np.flatnonzero(np.r_[d[1:] != d[:-1], True])
        gate[d[last]] = order[last]
    # per task: the input that finished last (when all inputs existed, so the scheduler could place it)
    gate_end = np.full(g.n, -1, dtype=np.int64)
    if len(g.src):
        order = np.lexsort((rows, end[g.src], g.dst))
        d = g.dst[order]
        last = np.flatnonzero(np.r_[d[1:] != d[:-1], True])
        gate_end[d[last]] = order[last]
    # per task: the task that ran before it on the same thread
    prev_on_thread = np.full(g.n, -1, dtype=np.int64)
    res = tasks["resource_id"].to_numpy()
    if res is not None:
        o = np.lexsort((start, pd.factorize(pd.Series(res, dtype=object))[0]))
        same = np.r_[False, res[o][1:] == res[o][:-1]]
        prev_on_thread[o[same]] = o[np.flatnonzero(same) - 1]
    v = int(np.argmax(end))     # ties: the first to finish among equals is fine (same end time)
    rows: list[dict] = []
    chain = [v]
    cursor = int(end[v])
    keys, groups, locations = tasks["key"].to_numpy(), tasks["group"].to_numpy(), _locations(tasks)
    component = _unit_components(tasks)
    # units that are a resource's own sequence (its outermost spans, its I/O operations), not tasks a scheduler
    # placed: the time between two of them is the resource running none (idle, as the resource-state timeline
    # calls it), not queueing
    gap_kind, gap_component = ("QUEUE", "queue") if _scheduled(tasks) else ("IDLE", IDLE_COMPONENT)
    while True:
        key, grp, loc = keys[v], groups[v], locations[v]
        s = min(int(start[v]), cursor)
        rows.append(_step(key, grp, "task", s, cursor, component[v], loc, grp))
        cursor = s
        e = int(gate[v])
        data_ready = int(arrival[e]) if e >= 0 else t0
        p = int(prev_on_thread[v])
        thread_free = int(end[p]) if p >= 0 else t0
        if e >= 0 and data_ready >= thread_free:
            # the inputs were the last thing it waited for; after they arrived it queued for the scheduler
            q = min(data_ready, cursor)
            if q < cursor:
                rows.append(_step(key, grp, "QUEUE", q, cursor, "queue", loc, grp))
            cursor = q
            u = int(g.src[e])
            if g.xfer_start[e] >= 0:
                xs, xe = max(int(g.xfer_start[e]), int(end[u])), min(int(g.xfer_end[e]), cursor)
                xs = min(xs, xe)
                if xe < cursor:
                    rows.append(_step(key, grp, "QUEUE", xe, cursor, "queue", loc, grp))
                rows.append(_step(keys[u], groups[u], "TRANSFER", xs, xe, "transfer", loc, groups[u]))
                cursor = xs
                # a fetch starts once the task is placed, i.e. after its last input finished: that input
                # (not necessarily the one fetched last) is what the path continues through
                u = int(g.src[gate_end[v]])
                if int(end[u]) < cursor:
                    rows.append(_step(keys[u], groups[u], "WAIT", min(int(end[u]), cursor), cursor, "wait",
                                      loc, groups[u]))
                    cursor = min(int(end[u]), cursor)
            v = u
            chain.append(v)
            continue
        if p >= 0 and thread_free > t0:
            # ready earlier (or no inputs) but its thread was busy with another task: queueing
            q = min(thread_free, cursor)
            if q < cursor:
                rows.append(_step(key, grp, gap_kind, q, cursor, gap_component, loc, grp))
            cursor = q
            v = p
            chain.append(v)
            continue
        if cursor > t0:
            rows.append(_step(key, grp, gap_kind, t0, cursor, gap_component, loc, grp))
        break
    rows.reverse()
    chain.reverse()
    return CriticalPath(_steps_frame(rows), int(end.max()) - t0, [str(keys[i]) for i in chain])


#: a unit's category (model/semantics.py) -> the component of the path its step is; any other category computes
_COMPONENT_OF = {"io": "io", "communication": "transfer", "wait": "wait"}


def _unit_components(tasks: pd.DataFrame) -> np.ndarray:
    """Per unit, the component of its step: from its category when the rows carry one (:func:`work_units`),
    else compute."""
    cat = tasks["category"] if "category" in tasks.columns else None
    if cat is None or cat.isna().all():
        return np.full(len(tasks), "compute", dtype=object)
    return cat.map(lambda c: _COMPONENT_OF.get(c, "compute")).to_numpy(dtype=object)


def _locations(tasks: pd.DataFrame) -> np.ndarray:
    """Per unit, where it ran: its Dask worker when the rows name one, else its resource (a StarPU worker, an MPI
    location, a WfCommons host, a Darshan rank)."""
    worker = tasks["worker"].to_numpy(dtype=object)
    res = tasks["resource_id"].to_numpy(dtype=object)
    return np.where(pd.notna(worker), worker, res)


def _scheduled(tasks: pd.DataFrame) -> bool:
    """Whether the units are tasks a scheduler placed (the gaps before them are queueing): unless the rows say
    they are a resource's own spans or I/O operations (:func:`work_units`' ``unit``)."""
    unit = tasks["unit"] if "unit" in tasks.columns else None
    return unit is None or unit.isna().all() or bool((unit == TASK_UNIT).any())


def _structural_path(g: _TaskGraph) -> CriticalPath:
    if g.n == 0:
        return CriticalPath(_steps_frame([]), 0, [])
    dur, xt = g.duration, g.xfer_time
    length, path = longest_path(g.n, g.src, g.dst, xt.astype(np.float64), dur.astype(np.float64))
    keys, groups = g.tasks["key"].to_numpy(), g.tasks["group"].to_numpy()
    locs = _locations(g.tasks)
    component = _unit_components(g.tasks)
    edge_of = {}
    if len(path) > 1:
        want = set(zip(path[:-1], path[1:]))
        for i, (a, b) in enumerate(zip(g.src.tolist(), g.dst.tolist())):
            if (a, b) in want:
                edge_of[(a, b)] = max(edge_of.get((a, b), 0), int(xt[i]))
    rows: list[dict] = []
    t = 0
    for i, v in enumerate(path):
        if i:
            w = edge_of.get((path[i - 1], v), 0)
            if w:
                rows.append(_step(keys[path[i - 1]], groups[path[i - 1]], "TRANSFER", t, t + w, "transfer",
                                  locs[v], groups[path[i - 1]]))
                t += w
        rows.append(_step(keys[v], groups[v], "task", t, t + int(dur[v]), component[v], locs[v], groups[v]))
        t += int(dur[v])
    return CriticalPath(_steps_frame(rows), int(round(length)), [str(keys[v]) for v in path])


def task_graph_paths(spans: pd.DataFrame | pa.Table, dependencies: pd.DataFrame | pa.Table,
                     transfers: pd.DataFrame | pa.Table | None = None) -> TaskPaths:
    """The measured critical path (traced back from the last task to finish: at each task its gating input,
    with the transfer that brought it, or the task before it on its thread when the inputs were ready earlier)
    and the structural one (the longest path through the dependency DAG with the tasks' durations and transfer
    times as weights: the makespan with unlimited workers). Times in ``steps`` of the structural path are
    offsets from 0. When any task span's times were derived rather than measured (its attrs' ``time_source``),
    there is no measured path (None): a derived timeline has no observed waits to trace through."""
    return _paths(_task_graph(spans, dependencies, transfers), task_timeline(spans) or MEASURED)


def _paths(g: _TaskGraph, timeline: str) -> TaskPaths:
    return TaskPaths(_measured_path(g) if timeline == MEASURED else None, _structural_path(g), timeline)


def run_units(run) -> pd.DataFrame:
    """:func:`work_units` of ``run``, read once per state of the run (``Run.memo``): the frame is shared, callers
    must not change it."""
    return run.memo("work_units", lambda: work_units(run))


def run_task_graph(run) -> _TaskGraph:
    """The task graph of ``run``'s units of work, dependencies and transfers, built once per state of the run
    (``Run.memo``; a build reads every unit's attrs): what :func:`run_task_paths` and every replay of the run
    start from."""
    return run.memo("task_graph", lambda: _task_graph(run_units(run), run.table("dependencies"),
                                                      run.table("transfers")))


def run_task_paths(run) -> TaskPaths:
    """:func:`task_graph_paths` of ``run``'s units of work, dependencies and transfers, computed once per state of
    the run (``Run.memo``): the critical-path page and the advisor share it."""
    return run.memo("task_paths", lambda: _paths(run_task_graph(run), task_timeline(run_units(run)) or MEASURED))


def slack(spans: pd.DataFrame | pa.Table, dependencies: pd.DataFrame | pa.Table,
          transfers: pd.DataFrame | pa.Table | None = None) -> pd.DataFrame:
    """Per task, how much longer it could have taken without lengthening the structural critical path:
    columns key, group, duration_ns, slack_ns (0 on the critical path), sorted by slack."""
    g = _task_graph(spans, dependencies, transfers)
    if g.n == 0:
        return pd.DataFrame({"key": [], "group": [], "duration_ns": [], "slack_ns": []})
    dur = g.duration.astype(np.float64)
    xt = g.xfer_time.astype(np.float64)
    to = _forward(g.n, g.src, g.dst, xt, dur)             # longest path ending at v, v included
    frm = _forward(g.n, g.dst, g.src, xt, dur)            # longest path starting at v, v included
    length = to.max()
    sl = length - (to + frm - dur)
    out = pd.DataFrame({"key": g.tasks["key"], "group": g.tasks["group"], "duration_ns": g.duration,
                        "slack_ns": np.maximum(np.rint(sl), 0).astype(np.int64)})
    return out.sort_values(["slack_ns", "key"], kind="stable").reset_index(drop=True)


def near_critical_paths(spans: pd.DataFrame | pa.Table, dependencies: pd.DataFrame | pa.Table,
                        transfers: pd.DataFrame | pa.Table | None = None, k: int = 5) -> list[tuple[int, list[str]]]:
    """Up to ``k`` distinct long paths of the structural graph, longest first, as (length_ns, task keys).
    The first is the critical path; each next one is the longest path through a dependency edge not on any
    path listed before (so the second is exactly the second-longest path)."""
    g = _task_graph(spans, dependencies, transfers)
    if g.n == 0 or k <= 0:
        return []
    dur = g.duration.astype(np.float64)
    xt = g.xfer_time.astype(np.float64)
    to = _forward(g.n, g.src, g.dst, xt, dur)
    frm = _forward(g.n, g.dst, g.src, xt, dur)
    pred = _predecessors(g.n, g.src, g.dst, xt, dur, to)
    succ = _predecessors(g.n, g.dst, g.src, xt, dur, frm)
    keys = g.tasks["key"].to_numpy()
    end = int(np.argmax(to))
    first = _walk(pred, end)
    out = [(int(round(to[end])), [str(keys[v]) for v in first])]
    used = set(zip(first[:-1], first[1:]))
    through = to[g.src] + xt + frm[g.dst]
    for e in np.argsort(-through, kind="stable"):
        if len(out) >= k:
            break
        a, b = int(g.src[e]), int(g.dst[e])
        if (a, b) in used:
            continue
        path = _walk(pred, a) + list(reversed(_walk(succ, b)))
        edges = set(zip(path[:-1], path[1:]))
        used |= edges
        out.append((int(round(through[e])), [str(keys[v]) for v in path]))
    return out


def what_if(spans: pd.DataFrame | pa.Table, dependencies: pd.DataFrame | pa.Table,
            transfers: pd.DataFrame | pa.Table | None = None, scale: dict[str, float] | None = None,
            scale_tasks: Mapping[str, float] | None = None, placement: str = "observed") -> int:
    """The makespan (ns) a replay of the run would have with scaled durations: ``scale`` maps a task group
    to a factor for its tasks' durations, and "transfer" / "queue" to factors for all transfer times / all
    observed queueing; ``scale_tasks`` maps a task key to a factor for that task's duration (on top of its
    group's; keys the graph does not have are ignored).

    ``placement="observed"``: the replay keeps each task on its thread in the observed order and starts it when
    its inputs have arrived and its thread is free, plus the lag it was observed to wait beyond that; so with every
    factor 1.0 it returns the measured makespan exactly. ``placement="any"``: a scheduler free to rebalance --
    each task, in the observed start order, runs on whichever thread is free first, once its inputs (and their
    transfers, scaled by "transfer") have arrived; the observed lags are not replayed, so compare two such
    replays (a gain) rather than one with the measured makespan."""
    return replay(_task_graph(spans, dependencies, transfers), scale, scale_tasks, placement)


def replay(g: _TaskGraph, scale: dict[str, float] | None = None, scale_tasks: Mapping[str, float] | None = None,
           placement: str = "observed") -> int:
    """:func:`what_if` of a task graph already built (``_task_graph``): for callers that replay one run many
    times (the advisor), so that the graph is built once."""
    if placement not in ("observed", "any"):
        raise ValueError(f"what_if: placement must be 'observed' or 'any', not {placement!r}")
    scale = dict(scale or {})
    if g.n == 0:
        return 0
    groups = g.tasks["group"].to_numpy()
    unknown = [k for k in scale if k not in ("transfer", "queue") and k not in set(groups)]
    if unknown:
        raise ValueError(f"what_if: no task group {unknown[0]!r}; groups: {', '.join(sorted(set(groups)))}")
    for k, f in scale.items():
        if not (isinstance(f, (int, float)) and f >= 0):
            raise ValueError(f"what_if: scale[{k!r}] must be a number >= 0, got {f!r}")
    start = g.tasks["start_ns"].to_numpy(dtype=np.int64)
    end = g.tasks["end_ns"].to_numpy(dtype=np.int64)
    t0 = int(start.min())
    n = g.n
    factor = np.array([float(scale.get(x, 1.0)) for x in groups])
    if scale_tasks:
        per_key = pd.Series(scale_tasks, dtype=np.float64)
        if (per_key < 0).any() or per_key.isna().any():
            bad = per_key[(per_key < 0) | per_key.isna()].index[0]
            raise ValueError(f"what_if: scale_tasks[{bad!r}] must be a number >= 0")
        factor = factor * per_key.reindex(g.tasks["key"]).fillna(1.0).to_numpy()
    dur = (end - start) * factor
    fx, fq = float(scale.get("transfer", 1.0)), float(scale.get("queue", 1.0))
    if placement == "any":
        return _list_schedule(g, start, dur, g.xfer_time * fx)
    # constraints u -> v with lag: v may start lag after u ends. Vertex n is the run's start (weight 0).
    # a fetch starts only once its dependent is placed (after its last input): only the transfer itself
    # sits on the edge; the wait before it is part of the dependent's observed extra wait
    xt = g.xfer_time
    arrival = end[g.src] + xt
    data_lag = xt * fx
    res = g.tasks["resource_id"].to_numpy()
    o = np.lexsort((start, pd.factorize(pd.Series(res, dtype=object))[0]))
    same = np.r_[False, res[o][1:] == res[o][:-1]]
    t_src, t_dst = o[np.flatnonzero(same) - 1], o[same]
    # how long each task waited past its binding constraint: kept (scaled by "queue") on that constraint
    ready = np.full(n, t0, dtype=np.int64)
    if len(g.src):
        np.maximum.at(ready, g.dst, np.minimum(arrival, start[g.dst]))
    if len(t_src):
        np.maximum.at(ready, t_dst, np.minimum(end[t_src], start[t_dst]))
    extra = np.maximum(start - ready, 0) * fq
    # spans of one thread may overlap by a few microseconds (where the end is taken), and clocks of two
    # processes differ: a constraint that the observed start violates gets a negative lag, so that with
    # every factor 1.0 the replay starts each task exactly when it started
    over_d = np.maximum(arrival - start[g.dst], 0) if len(g.src) else np.zeros(0)
    over_t = np.maximum(end[t_src] - start[t_dst], 0)
    src = np.concatenate([g.src, t_src, np.full(n, n)])
    dst = np.concatenate([g.dst, t_dst, np.arange(n)])
    w = np.concatenate([data_lag - over_d, -over_t.astype(np.float64), np.zeros(n)])  # all released at t0
    # the extra wait sits on the vertex, before it runs
    vw = np.concatenate([dur + extra, [0.0]])
    return int(round(longest_path_length(n + 1, src, dst, w, vw)))


def _list_schedule(g: _TaskGraph, start: np.ndarray, dur: np.ndarray, data_lag: np.ndarray) -> int:
    """The makespan (ns from the run's start) of the tasks run in their observed start order, each on the thread free first
    (as many threads as the run had executing resources) once its inputs have arrived (``data_lag`` per edge)."""
    import heapq

    n = g.n
    slots = max(1, int(g.tasks["resource_id"].nunique()))
    by_dst = np.argsort(g.dst, kind="stable")
    src, lag = g.src[by_dst].tolist(), data_lag[by_dst].astype(np.float64).tolist()
    bounds = np.searchsorted(g.dst[by_dst], np.arange(n + 1)).tolist()
    durations = dur.astype(np.float64).tolist()
    # times relative to t0: ns since the epoch are past float64's exact range
    done = [0.0] * n
    free = [0.0] * slots
    for v in np.argsort(start, kind="stable").tolist():  # a task's inputs started, so were placed, before it
        ready = 0.0
        for e in range(bounds[v], bounds[v + 1]):
            ready = max(ready, done[src[e]] + lag[e])
        at = max(ready, heapq.heappop(free))
        done[v] = at + durations[v]
        heapq.heappush(free, done[v])
    return int(round(max(done))) if n else 0
