"""Where the makespan went: the run's wall time split into what the chain that bounded it was doing.

The wall time (run.json's start to end) is cut in three: the lead-in before the first task started, the task
phase (first task start to last task end) and the tail after the last task. The lead-in is the client's (graph
construction and submission) up to the graph-submission record, the scheduler's after it. The task phase is
the measured critical path (analysis/critical_path: contiguous steps of compute, transfer, I/O, wait, queue),
refined: a queue step is *queueing* while the task's own resource was running another task, *client
submission* while no task ran anywhere before a graph-submission record, and *scheduler overhead* otherwise
(inputs ready, a slot free, the task not started); from the path's compute the advisor carves the process
stalls the run records (logs of category ``gc`` / ``event-loop-unresponsive`` with ``attrs.duration_s``), the
runtime's own I/O (io-category spans that are not a task's or a call's: spilling) and timed I/O operations on
the task's resource (``io`` rows with a duration). Every category of :data:`CATEGORIES` is listed, with its
seconds, share of the makespan, a status (``measured``, ``estimated``, ``none recorded``, ``unknown``) and a
note saying how it was measured or what would supply it; the rows sum to the wall time.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from flowscope.analysis.advisor.facts import STALL_CATEGORIES, RunFacts
from flowscope.analysis.critical_path.steps import UNIT_STEP

#: the categories of the makespan, in the order they are listed
CATEGORIES = ("client_submission", "scheduler_overhead", "queueing", "transfers", "compute", "io",
              "gc_event_loop", "spilling", "wait", "idle", "after_last_task", "unattributed")
LABELS = {"client_submission": "client: graph construction and submission",
          "scheduler_overhead": "scheduler overhead (ready, not started)",
          "queueing": "queueing (waiting for a busy slot)", "transfers": "transfers", "compute": "compute",
          "io": "I/O", "gc_event_loop": "GC and event-loop stalls", "spilling": "spilling",
          "wait": "waiting for a dependency", "idle": "idle (resource ran nothing)",
          "after_last_task": "after the last task (results, teardown)",
          "unattributed": "task phase without a measured critical path"}
#: the critical path's components (analysis/critical_path/steps.py) -> the category they start as
_OF_COMPONENT = {"compute": "compute", "transfer": "transfers", "io": "io", "wait": "wait", "queue": "queue",
                 "idle": "idle"}
#: carving order inside a path step: what a stretch of it counts as when several intervals cover it
_CARVE_ORDER = ("gc_event_loop", "spilling", "io")

IO_TIME_NOTE = ("I/O time is measured only where records time each operation (Darshan DXT "
                "`flowscope import job.darshan --run RUN`, io-category spans or calls); per-task byte counters "
                "carry no time")


def _merge(iv: np.ndarray) -> np.ndarray:
    """Union of intervals (n x 2), sorted, disjoint; intervals that touch are joined."""
    if not len(iv):
        return np.asarray(iv, dtype=np.int64).reshape(0, 2)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    s, e = iv[:, 0], iv[:, 1]
    first = np.ones(len(iv), dtype=bool)
    first[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    at = np.flatnonzero(first)
    return np.column_stack([s[at], np.maximum.reduceat(e, at)]).astype(np.int64)


def _covered(iv: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each point of ``x``: the length of the disjoint sorted intervals ``iv`` that lies before it."""
    x = np.asarray(x, dtype=np.int64)
    if not len(iv):
        return np.zeros(x.shape, dtype=np.int64)
    lens = iv[:, 1] - iv[:, 0]
    before = np.concatenate([[0], np.cumsum(lens)])
    i = np.searchsorted(iv[:, 0], x, side="right")  # intervals starting at or before x
    last = np.maximum(i - 1, 0)
    part = np.where(i > 0, np.clip(x - iv[last, 0], 0, lens[last]), 0)
    return before[last] + part


def _overlaps(iv: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per pair: the length of [s, e) covered by the disjoint sorted intervals ``iv`` (0 where e <= s)."""
    return np.where(e > s, _covered(iv, e) - _covered(iv, s), 0)


def _stalls(facts: RunFacts) -> pd.DataFrame:
    """Process stalls the run records: resource_id, start_ns, end_ns (from the log's time and duration)."""
    cats = ", ".join(f"'{c}'" for c in STALL_CATEGORIES)
    df = facts.run.sql(f"""
        SELECT resource_id, ts_ns, TRY_CAST(json_extract_string(attrs, '$.duration_s') AS DOUBLE) AS d
        FROM logs WHERE category IN ({cats})""")
    df = df[df["d"].notna() & (df["d"] > 0)]
    return pd.DataFrame({"resource_id": df["resource_id"],
                         "start_ns": (df["ts_ns"] - (df["d"] * 1e9).round()).astype("int64"),
                         "end_ns": df["ts_ns"].astype("int64")})


def _runtime_io(facts: RunFacts) -> pd.DataFrame:
    """The runtime's own I/O (spilling): io-category spans that are neither a task nor a call."""
    return facts.run.sql("""SELECT resource_id, start_ns, end_ns FROM activity
                            WHERE category = 'io' AND role NOT IN ('task', 'call') AND end_ns > start_ns""")


def _timed_io(facts: RunFacts) -> pd.DataFrame:
    """Timed I/O operations: ``io`` rows with a duration that are not aggregates, and io-category calls."""
    return facts.run.sql("""
        SELECT resource_id, start_ns, end_ns FROM io
        WHERE resource_id IS NOT NULL AND end_ns > start_ns
          AND NOT coalesce(TRY_CAST(json_extract_string(attrs, '$.aggregate') AS BOOLEAN), false)
        UNION ALL
        SELECT resource_id, start_ns, end_ns FROM activity WHERE category = 'io' AND role = 'call'
          AND end_ns > start_ns""")


def _by_resource(df: pd.DataFrame) -> dict[str, np.ndarray]:
    return {str(r): _merge(g[["start_ns", "end_ns"]].to_numpy(np.int64)) for r, g in df.groupby("resource_id")}


def _slot_waits(steps: pd.DataFrame, facts: RunFacts, span_of: dict, t0: int) -> dict:
    """Per compute step of the path (key, start): the stretch of it during which the next task on the path, which
    the path reaches through this one's resource rather than through its data, was already ready (its inputs
    done): that task was queued behind this one."""
    tasks = steps[(steps["kind"] == UNIT_STEP) & (steps["duration_ns"] > 0)]
    if len(tasks) < 2:
        return {}
    ids = tasks["id"].to_numpy(dtype=object)
    starts, ends = tasks["start_ns"].to_numpy(np.int64), tasks["end_ns"].to_numpy(np.int64)
    n = len(tasks) - 1  # pairs (p, v) of consecutive tasks on the path
    follows_data = np.zeros(n, dtype=bool)
    never = np.iinfo(np.int64).min
    ready = np.full(n, never, dtype=np.int64)
    deps = facts.dependencies
    if len(deps):  # the inputs of the path's tasks only: grouping every task's took seconds at 100,000 tasks
        d = deps[["task_key", "depends_on"]]
        d = d[d["task_key"].astype(str).isin(set(tasks["id"].astype(str)))].drop_duplicates().astype(str)
        pairs = pd.DataFrame({"i": np.arange(n), "p": ids[:-1].astype(str), "v": ids[1:].astype(str)})
        m = pairs.merge(d, left_on="v", right_on="task_key", how="inner")
        i = m["i"].to_numpy(np.int64)
        # the path went through v's data: v waited for p's output, not for a slot
        np.logical_or.at(follows_data, i, (m["depends_on"] == m["p"]).to_numpy(bool))
        known = pd.Index(list(span_of))
        at = known.get_indexer(m["depends_on"])
        input_end = np.array([e for _, e in span_of.values()], dtype=np.int64)
        has = at >= 0
        np.maximum.at(ready, i[has], input_end[at[has]])
    ready = np.where(ready == never, t0, ready)
    a = np.maximum(ready, starts[:-1])
    b = ends[:-1]
    keep = np.flatnonzero(~follows_data & (b > a))
    return {(ids[k], int(starts[k])): (int(a[k]), int(b[k])) for k in keep}


def attribute(facts: RunFacts) -> pd.DataFrame:
    """The makespan split into :data:`CATEGORIES`: category, label, seconds, share (of the wall time), status,
    note (see the module's docstring)."""
    ns = dict.fromkeys(CATEGORIES, 0)
    status: dict[str, str] = {}
    note: dict[str, str] = {}
    w0, w1 = facts.wall_start_ns, facts.wall_end_ns
    tasks = facts.tasks
    subs = facts.submissions["ts_ns"].to_numpy(np.int64) if len(facts.submissions) else np.zeros(0, np.int64)
    if not len(tasks):
        ns["unattributed"] = w1 - w0
        note["unattributed"] = "the run has no tasks"
        return _frame(ns, status, note, w1 - w0)
    t0, t1 = facts.task_start_ns, facts.task_end_ns
    # lead-in: the client's until the graph reached the scheduler, the scheduler's after
    first_sub = subs[(subs >= w0) & (subs <= t0)]
    if len(first_sub):
        s = int(first_sub[0])
        ns["client_submission"] += s - w0
        ns["scheduler_overhead"] += t0 - s
        note["client_submission"] = ("from the run's start to the graph-submission record, and gaps in which no "
                                     "task ran that end with one")
    else:
        ns["client_submission"] += t0 - w0
        status["client_submission"] = "estimated"
        note["client_submission"] = ("the run records no graph submission (a log of category graph-submitted): "
                                     "the time before the first task is counted as the client's")
    ns["after_last_task"] = max(w1 - t1, 0)
    paths = facts.paths
    if paths is None or paths.measured is None:
        ns["unattributed"] = t1 - t0
        note["unattributed"] = ("the task times were derived, not measured: no waits to trace"
                                if paths is not None else "the tasks' tables break the critical path's rules")
        return _frame(ns, status, note, w1 - w0)
    steps = paths.measured.steps
    # stretches where no task ran anywhere, and the submission inside each: the client was building the next graph
    busy = _merge(tasks[["start_ns", "end_ns"]].to_numpy(np.int64))
    gap_a, gap_b = busy[:-1, 1], busy[1:, 0]
    last = np.searchsorted(subs, gap_b, side="right") - 1  # the last submission at or before each gap's end
    inside = last >= 0
    inside[inside] = subs[last[inside]] > gap_a[inside]
    client_iv = np.column_stack([gap_a[inside], subs[last[inside]]]).astype(np.int64).reshape(-1, 2)
    res_of = dict(zip(tasks["key"], tasks["resource_id"]))
    worker_of = dict(zip(tasks["key"], tasks["worker"]))
    span_of = dict(zip(tasks["key"], zip(tasks["start_ns"].astype(int), tasks["end_ns"].astype(int))))
    by_res = {r: _merge(g[["start_ns", "end_ns"]].to_numpy(np.int64)) for r, g in tasks.groupby("resource_id")}
    stalls, spills, timed = _stalls(facts), _runtime_io(facts), _timed_io(facts)
    task_places = set(tasks["resource_id"]) | set(tasks["worker"])
    global_stalls = _merge(stalls[~stalls["resource_id"].isin(task_places)][["start_ns", "end_ns"]]
                           .to_numpy(np.int64))
    stall_at, spill_at, io_at = _by_resource(stalls), _by_resource(spills), _by_resource(timed)
    waited = _slot_waits(steps, facts, span_of, t0)
    s_all = steps["start_ns"].to_numpy(np.int64)
    e_all = steps["end_ns"].to_numpy(np.int64)
    cats = np.array([_OF_COMPONENT.get(c, "compute") for c in steps["component"]], dtype=object)
    keys = steps["id"].to_numpy(dtype=object)
    timed_step = e_all > s_all
    for cat in set(cats[timed_step]) - {"queue", "compute"}:
        on = timed_step & (cats == cat)
        ns[cat] += int((e_all[on] - s_all[on]).sum())
    _queue_steps(np.flatnonzero(timed_step & (cats == "queue")), s_all, e_all, keys, ns, client_iv, by_res,
                 res_of, span_of, global_stalls)
    _compute_steps(np.flatnonzero(timed_step & (cats == "compute")), s_all, e_all, keys, ns, res_of, worker_of,
                   waited, (global_stalls, stall_at, spill_at, io_at))
    # the path starts at the first task's start and ends at the last task's end: the sum is the wall time
    _notes(facts, ns, status, note, stalls, spills, timed)
    return _frame(ns, status, note, w1 - w0)


def _by_place(idx: np.ndarray, places: list) -> dict:
    """Step indices grouped by their place (a resource, or a pair of them)."""
    out: dict = {}
    for i, place in zip(idx, places):
        out.setdefault(place, []).append(i)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


def _queue_steps(idx: np.ndarray, s_all: np.ndarray, e_all: np.ndarray, keys: np.ndarray, ns: dict,
                 client_iv: np.ndarray, by_res: dict, res_of: dict, span_of: dict, global_stalls: np.ndarray) -> None:
    """Split the path's queue steps ``idx`` into client submission, queueing, stalls and scheduler overhead."""
    if not len(idx):
        return
    s, e = s_all[idx], e_all[idx]
    client = _overlaps(client_iv, s, e)
    own_busy = np.zeros(len(idx), dtype=np.int64)
    empty = np.zeros((0, 2), dtype=np.int64)
    for res, at in _by_place(np.arange(len(idx)), [res_of.get(k) for k in keys[idx]]).items():
        own_busy[at] = _overlaps(by_res.get(res, empty), s[at], e[at])
    # the task's own resource running other tasks (this one excluded)
    known = np.array([k in span_of for k in keys[idx]], dtype=bool)
    own = np.array([span_of[k] for k in keys[idx][known]], dtype=np.int64).reshape(-1, 2)
    own_busy[known] -= np.maximum(np.minimum(own[:, 1], e[known]) - np.maximum(own[:, 0], s[known]), 0)
    queued = np.maximum(np.minimum(own_busy, e - s - client), 0)
    rest = e - s - client - queued
    stall = np.minimum(_overlaps(global_stalls, s, e), rest)
    ns["client_submission"] += int(client.sum())
    ns["queueing"] += int(queued.sum())
    ns["gc_event_loop"] += int(stall.sum())
    ns["scheduler_overhead"] += int((rest - stall).sum())


def _compute_steps(idx: np.ndarray, s_all: np.ndarray, e_all: np.ndarray, keys: np.ndarray, ns: dict, res_of: dict,
                   worker_of: dict, waited: dict, carved_by: tuple) -> None:
    """Carve the path's compute steps ``idx``: stalls, spilling, I/O and slot queueing on the step's resource and
    worker, each stretch counted once, in that order of precedence; the rest is compute."""
    if not len(idx):
        return
    global_stalls, stall_at, spill_at, io_at = carved_by
    empty = np.zeros((0, 2), dtype=np.int64)
    s, e = s_all[idx], e_all[idx]
    got = np.zeros((4, len(idx)), dtype=np.int64)  # covered by the first 1, 2, 3, 4 labels together
    places = [(res_of.get(k), worker_of.get(k)) for k in keys[idx]]
    for place, at in _by_place(np.arange(len(idx)), places).items():
        here = [r for r in place if r is not None]
        union = global_stalls
        for j, labelled in enumerate((stall_at, spill_at, io_at)):
            union = _merge(np.vstack([union, *[labelled.get(r, empty) for r in here]]))
            got[j, at] = _overlaps(union, s[at], e[at])
        got[3, at] = got[2, at]
        # the slot wait of each step: one interval, its part not yet covered
        w = np.array([waited.get((k, int(t)), (0, 0)) for k, t in zip(keys[idx[at]], s[at])],
                     dtype=np.int64).reshape(-1, 2)
        has = np.array([(k, int(t)) in waited for k, t in zip(keys[idx[at]], s[at])], dtype=bool)
        wa, wb = np.maximum(w[:, 0], s[at]), np.minimum(w[:, 1], e[at])
        has &= wb > wa
        got[3, at[has]] += (wb - wa)[has] - _overlaps(union, wa[has], wb[has])
    ns["gc_event_loop"] += int(got[0].sum())
    ns["spilling"] += int((got[1] - got[0]).sum())
    ns["io"] += int((got[2] - got[1]).sum())
    ns["queueing"] += int((got[3] - got[2]).sum())
    ns["compute"] += int((e - s).sum() - got[3].sum())


def _notes(facts: RunFacts, ns: dict, status: dict, note: dict, stalls: pd.DataFrame, spills: pd.DataFrame,
           timed: pd.DataFrame) -> None:
    note.setdefault("scheduler_overhead", "critical-path waits of a task whose inputs were ready and whose resource "
                                          "was free, and the time from the graph's arrival to the first task")
    note["queueing"] = ("critical-path time during which the next task on the path was ready but queued behind "
                        "the task running on its resource (the path passes through that resource, not the data), "
                        "and path waits while a resource ran other tasks")
    note["transfers"] = "transfers on the measured critical path"
    if not len(facts.transfers) and facts.tasks["worker"].nunique() > 1:
        status["transfers"] = "none recorded"
        note["transfers"] = ("no transfers recorded although tasks ran in several places: rows of the transfers "
                             "table would supply them")
    note["compute"] = ("task execution on the measured critical path, less the stalls, spilling, I/O and queueing "
                       "within it")
    if not len(stalls):
        status["gc_event_loop"] = "none recorded"
        note["gc_event_loop"] = ("no stall records: logs of category gc or event-loop-unresponsive with "
                                 "attrs.duration_s (Dask capture writes them) would supply them")
    else:
        note["gc_event_loop"] = f"{len(stalls)} recorded stalls, where they overlap the critical path"
    if not len(spills):
        status["spilling"] = "none recorded"
        note["spilling"] = ("no runtime I/O spans (io-category spans that are not a task's or a call's: Dask "
                            "capture's disk-read / disk-write) overlap the run")
    else:
        note["spilling"] = "the runtime's own I/O spans on the critical path's resources"
    if not len(timed) and not ns["io"]:
        untimed = facts.run.sql("SELECT count(*) AS n FROM io WHERE op IN ('read', 'write')")["n"].iloc[0]
        if int(untimed):
            status["io"] = "unknown"
            note["io"] = "I/O recorded without durations: counted as compute. " + IO_TIME_NOTE
        else:
            status["io"] = "none recorded"
            note["io"] = "no I/O records. " + IO_TIME_NOTE
    else:
        note["io"] = "timed I/O operations on the critical path's resources while it ran there"
    note["wait"] = "critical-path waits for a dependency's output (after the transfer that brought it)"
    note["idle"] = "gaps of a critical path through a resource's own sequence of work"
    note["after_last_task"] = "from the last task's end to the run's end"


def _frame(ns: dict, status: dict, note: dict, wall_ns: int) -> pd.DataFrame:
    rows = []
    for c in CATEGORIES:
        v = int(ns.get(c, 0))
        if c == "unattributed" and not v:
            continue
        rows.append({"category": c, "label": LABELS[c], "seconds": v / 1e9,
                     "share": v / wall_ns if wall_ns > 0 else 0.0,
                     "status": status.get(c, "measured"), "note": note.get(c, "")})
    return pd.DataFrame(rows, columns=["category", "label", "seconds", "share", "status", "note"])


def capacity(facts: RunFacts) -> dict:
    """Idle resources over the task phase: slots, busy slot-seconds (task time), idle slot-seconds and the share
    of capacity left idle."""
    if not len(facts.tasks) or facts.task_phase_s <= 0:
        return {"slots": facts.slots, "busy_s": 0.0, "idle_s": 0.0, "idle_share": None}
    busy = float(facts.tasks["duration_ns"].sum()) / 1e9
    cap = facts.slots * facts.task_phase_s
    idle = max(cap - busy, 0.0)
    return {"slots": facts.slots, "busy_s": busy, "idle_s": idle, "idle_share": idle / cap if cap > 0 else None,
            "note": "slot-seconds over the task phase: slots x (last task end - first task start) minus task time"}


def attribution_json(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records", double_precision=15))
