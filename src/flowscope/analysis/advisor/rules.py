"""The advisor's rules: each reads a run's facts (:class:`~flowscope.analysis.advisor.facts.RunFacts`) and
returns the findings it supports, each with the time it could recover, how that was estimated, its evidence
(the rows) and a concrete change.

Recoverable time is, unless a rule says otherwise, a replay (``what_if``): the task phase replayed with the
cause removed (the durations of the tasks it touches scaled) against the replay as observed; each task stays on
its resource in the observed order, so the estimate does not count a better placement the change might bring.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from flowscope.analysis.advisor.facts import RunFacts
from flowscope.analysis.critical_path.steps import UNIT_STEP

#: Dask's guidance: a task should take 100 ms or more to amortise the scheduler's per-task cost
MIN_TASK_S = 0.1
#: the output size above which a task's data is too large (Dask's chunk guidance; the provenance paper's finding)
MAX_OUTPUT_BYTES = 128 * 2**20
#: a group of small tasks is a finding only with at least this many tasks (and 4 per slot)
SMALL_TASKS_MIN = 50
#: a graph is large from this many tasks, and its submission a finding when the lead-in is this share of the run
LARGE_GRAPH_TASKS, LARGE_GRAPH_SHARE = 1_000, 0.05
#: a worker is slow in a group when its tasks' median is this many times the others' and the difference is
#: significant (one-sided Mann-Whitney U, Holm-adjusted over the tests, at SLOW_ALPHA)
SLOW_RATIO, SLOW_ALPHA, SLOW_MIN_TASKS = 1.5, 0.01, 3
#: a group's tasks are unbalanced when the largest takes this many times the median
SKEW_RATIO = 3.0
#: per-worker busy time over the mean busy time from which the load is called unbalanced
IMBALANCE_RATIO = 1.25
#: share of the measured critical path from which one group or the transfers dominate it
PATH_GROUP_SHARE, PATH_TRANSFER_SHARE, PATH_IO_SHARE = 0.5, 0.2, 0.2
#: a resource-idle forecast is a finding when at least this share of the resources is idle with this likelihood
IDLE_FRACTION, IDLE_LIKELIHOOD = 0.25, 0.8
#: findings recovering less than this share of the task phase are left out (unless the recoverable is unknown)
MIN_SHARE = 0.01


@dataclass
class Finding:
    """One cause (or symptom) the advisor found. ``rule`` names the rule; ``about`` what it is about (groups,
    workers, keys, paths) so that findings can be related; ``recoverable_s`` the estimated shortening of the
    makespan without the cause (None when it cannot be estimated), ``method`` how; ``evidence`` the rows."""

    rule: str
    title: str
    recoverable_s: float | None
    method: str
    change: str
    evidence: pd.DataFrame
    kind: str = "cause"
    about: dict = field(default_factory=dict)
    explained_by: str | None = None

    def to_dict(self) -> dict:
        ev = json.loads(self.evidence.to_json(orient="records", double_precision=15)) if len(self.evidence) else []
        return {"rule": self.rule, "kind": self.kind, "title": self.title, "recoverable_s": self.recoverable_s,
                "method": self.method, "change": self.change, "about": self.about, "explained_by": self.explained_by,
                "evidence": ev}


def _s(x: float) -> str:
    return f"{x * 1e3:.3g} ms" if abs(x) < 1 else f"{x:.3g} s"


def _mb(b: float) -> str:
    return f"{b / 1e6:,.0f} MB"


def _gaps(tasks: pd.DataFrame, dependencies: pd.DataFrame) -> pd.Series:
    """Per task: how long it waited to start once it could have (its resource free after the task before it
    there, its inputs done): the per-task cost of dispatching it. NaN for the first task of a resource."""
    t = tasks.sort_values(["resource_id", "start_ns"], kind="stable")
    latest = t.groupby("resource_id")["end_ns"].cummax()
    prev_end = latest.groupby(t["resource_id"]).shift(1)
    ready = pd.Series(np.nan, index=t.index)
    if len(dependencies):
        end = dict(zip(tasks["key"], tasks["end_ns"]))
        d = dependencies[["task_key", "depends_on"]].drop_duplicates()
        d = d.assign(end=d["depends_on"].map(end)).dropna(subset=["end"])
        ready = t["key"].map(d.groupby("task_key")["end"].max())
    free = np.fmax(prev_end.to_numpy(np.float64), ready.to_numpy(np.float64))
    gap = pd.Series(np.clip(t["start_ns"].to_numpy(np.float64) - free, 0, None), index=t.index)
    gap[prev_end.isna()] = np.nan
    return gap.reindex(tasks.index)


def small_tasks(f: RunFacts) -> list[Finding]:
    """Groups of many tasks far below :data:`MIN_TASK_S`: the scheduler's per-task cost dominates."""
    t = f.tasks
    if len(t) < SMALL_TASKS_MIN or f.slots < 1:
        return []
    t = t.assign(gap=_gaps(t, f.dependencies))
    out = []
    for group, g in t.groupby("group", sort=False):
        n = len(g)
        med = float(g["duration_ns"].median()) / 1e9
        if med >= MIN_TASK_S or n < max(SMALL_TASKS_MIN, 4 * f.slots):
            continue
        total = float(g["duration_ns"].sum()) / 1e9
        gap = float(g["gap"].mean()) / 1e9 if g["gap"].notna().any() else 0.0
        after = min(n, max(f.slots, math.ceil(total / MIN_TASK_S)))
        rec = min(gap * (n - after) / f.slots, f.task_phase_s)
        per = max(1, round(MIN_TASK_S / med)) if med > 0 else n
        ev = pd.DataFrame([{"group": group, "tasks": n, "median_task_s": med, "total_task_s": total,
                            "mean_wait_to_start_s": gap, "tasks_if_fused": after, "slots": f.slots,
                            "example_keys": list(g.nsmallest(5, "start_ns")["key"])}])
        out.append(Finding(
            "small_tasks",
            f"{n:,} tasks of {group} take {_s(med)} each (median): far below the ~100 ms a task needs to "
            f"amortise the scheduler's per-task cost",
            rec,
            "the mean time each of these tasks waited to start once its resource was free and its inputs done (the "
            "per-task cost paid) x the tasks that fusing them into tasks of >= 100 ms would remove "
            f"({n:,} -> {after:,}), over {f.slots} slots",
            f"Give each task more work: fuse about {per:,} {group} tasks into one (larger chunks: rechunk, fewer "
            f"partitions, or batch the delayed calls), about {after:,} tasks of >= 100 ms instead of {n:,}",
            ev, about={"groups": [group]}))
    return out


def large_graph(f: RunFacts) -> list[Finding]:
    """A graph so large that building and submitting it holds the run before its first task."""
    t = f.tasks
    n = int(f.submissions["tasks"].fillna(0).sum()) if len(f.submissions) else 0
    n = max(n, len(t))
    if n < LARGE_GRAPH_TASKS or not len(t):
        return []
    lead = (f.task_start_ns - f.wall_start_ns) / 1e9
    if lead <= LARGE_GRAPH_SHARE * f.wall_s:
        return []
    total = float(t["duration_ns"].sum()) / 1e9
    after = min(n, max(f.slots, math.ceil(total / MIN_TASK_S)))
    rec = lead * (1 - after / n)
    groups = t["group"].value_counts()
    ev = pd.DataFrame([{"tasks": n, "graphs": len(f.submissions), "before_first_task_s": lead,
                        "share_of_run": lead / f.wall_s if f.wall_s > 0 else None,
                        "largest_groups": {str(k): int(v) for k, v in groups.head(3).items()},
                        "tasks_if_fused": after}])
    return [Finding(
        "large_graph",
        f"a graph of {n:,} tasks: {_s(lead)} ({100 * lead / f.wall_s:.0f} % of the run) pass before its first task "
        f"starts, building and submitting it",
        rec,
        "the time before the first task (graph construction, submission, the scheduler taking it in), assumed "
        f"proportional to the number of tasks, x the share fusing to >= 100 ms tasks removes ({n:,} -> {after:,})",
        f"Submit fewer, larger tasks (about {after:,}: bigger chunks or partitions); build the graph with "
        "high-level collections or map_partitions/map_blocks rather than one call per element, or submit it in parts",
        ev, about={"groups": list(groups.index[:3])})]


def large_outputs(f: RunFacts) -> list[Finding]:
    """Tasks whose output (or whose inputs together) exceed :data:`MAX_OUTPUT_BYTES`."""
    t = f.tasks
    if not t["nbytes"].notna().any():
        return []
    size = dict(zip(t["key"], t["nbytes"]))
    deps = f.dependencies
    inputs = pd.Series(dtype=np.float64)
    if len(deps):
        d = deps[["task_key", "depends_on"]].drop_duplicates()
        d = d.assign(b=d["depends_on"].map(size))
        inputs = d.groupby("task_key")["b"].sum(min_count=1)
    t = t.assign(inputs=t["key"].map(inputs))
    big = t[(t["nbytes"] > MAX_OUTPUT_BYTES) | (t["inputs"] > MAX_OUTPUT_BYTES)]
    if not len(big):
        return []
    data = np.fmax(big["nbytes"].fillna(0).to_numpy(), big["inputs"].fillna(0).to_numpy())
    pieces = np.ceil(data / MAX_OUTPUT_BYTES)
    side_by_side = min(f.slots, f.cores) if f.cores else f.slots  # array pieces need a core each, not only a slot
    factor = np.maximum(1.0 / pieces, 1.0 / max(side_by_side, 1))
    rec = f.gain_s(scale_tasks=dict(zip(big["key"], factor)))
    producers = big[big["nbytes"] > MAX_OUTPUT_BYTES]
    largest = float(t["nbytes"].max())
    ev = big.assign(output_mb=big["nbytes"] / 1e6, inputs_mb=big["inputs"] / 1e6, duration_s=big["duration_ns"] / 1e9)[
        ["key", "group", "worker", "output_mb", "inputs_mb", "duration_s"]].sort_values("output_mb", ascending=False)
    groups = list(dict.fromkeys(producers["group"])) or list(dict.fromkeys(big["group"]))
    return [Finding(
        "large_outputs",
        f"{len(producers)} task(s) of {', '.join(groups)} produce outputs of up to {_mb(largest)}, far above the "
        f"128 MB a chunk should stay under ({len(big)} tasks produce or consume such data)",
        rec,
        "replay with each of these tasks split into ceil(size / 128 MiB) pieces run side by side (its duration "
        f"x max(1 / pieces, 1 / {side_by_side}: the {f.slots} slots"
        + (f", at most the hosts' {f.cores} cores))" if f.cores else "))"),
        f"Rechunk / repartition so each piece is about 100-128 MB (arrays: chunks= so a chunk is <= 128 MB; "
        "dataframes: repartition(partition_size='100MB')); the largest is "
        f"{_mb(largest)}, about {math.ceil(largest / MAX_OUTPUT_BYTES)} pieces",
        ev.reset_index(drop=True), about={"groups": groups, "keys": list(producers["key"])})]


def slow_workers(f: RunFacts) -> list[Finding]:
    """A worker whose tasks of one group run significantly slower than the same group's elsewhere."""
    t = f.tasks
    pairs = []  # (group, worker, its durations, the others' durations, their medians)
    for group, g in t.groupby("group", sort=True):
        if g["worker"].nunique() < 2:
            continue
        for w, mine in g.groupby("worker", sort=True):
            rest = g[g["worker"] != w]
            if len(mine) < SLOW_MIN_TASKS or len(rest) < SLOW_MIN_TASKS:
                continue
            x, y = mine["duration_ns"].to_numpy(np.float64), rest["duration_ns"].to_numpy(np.float64)
            pairs.append((group, w, x, y, float(np.median(x)), float(np.median(y))))
    if not any(my > 0 and mx >= SLOW_RATIO * my for *_, mx, my in pairs):
        return []  # every finding needs that: the tests (and importing scipy.stats, 0.8 s) would change nothing
    from scipy.stats import mannwhitneyu

    from flowscope.analysis.compare import holm

    tests = [(group, w, float(mannwhitneyu(x, y, alternative="greater", method="asymptotic").pvalue), mx, my)
             for group, w, x, y, mx, my in pairs]
    padj = holm(np.array([x[2] for x in tests]))
    flagged = f.flagged
    out = []
    for (group, w, p, mx, my), pa in zip(tests, padj):
        if pa >= SLOW_ALPHA or my <= 0 or mx < SLOW_RATIO * my:
            continue
        mine = t[(t["group"] == group) & (t["worker"] == w)]
        factor = np.minimum(1.0, my / np.maximum(mine["duration_ns"].to_numpy(np.float64), 1.0))
        # a worker back to speed also takes back the share of the work the others took on while it was slow:
        # replayed on whichever thread is free first, not where each task ran
        rec = f.gain_s(scale_tasks=dict(zip(mine["key"], factor)), placement="any")
        n_flag = int(flagged["key"].isin(set(mine["key"])).sum()) if len(flagged) else 0
        ev = mine.assign(duration_s=mine["duration_ns"] / 1e9,
                         flagged_anomalous=mine["key"].isin(set(flagged["key"])) if len(flagged) else False)[
            ["key", "group", "worker", "resource_id", "start_ns", "duration_s", "flagged_anomalous"]]
        out.append(Finding(
            "slow_worker",
            f"{w} runs {group} tasks {mx / my:.1f}x slower than the other workers (median {_s(mx / 1e9)} against "
            f"{_s(my / 1e9)}; {len(mine)} tasks, {n_flag} flagged by the anomaly detector)",
            rec,
            f"replay with {w}'s {group} tasks at the other workers' median duration, each task on the thread free "
            f"first (one-sided Mann-Whitney U, Holm-adjusted p = {pa:.2g})",
            f"Find what slows {w} on {group}: its host's other load, its memory or disk, its data (flowscope lineage "
            f"RUN KEY on one of its tasks); restart it or keep {group} off it (worker resources / restrictions)",
            ev.sort_values("duration_s", ascending=False).reset_index(drop=True),
            about={"groups": [group], "workers": [w]}))
    return out


def anomalies(f: RunFacts, covered: set[tuple[str, str]]) -> list[Finding]:
    """Tasks the anomaly detector flags, per group and worker (those a slow-worker finding covers left out)."""
    a = f.flagged
    if not len(a):
        return []
    t = f.tasks.set_index("key")
    a = a.assign(worker=a["key"].map(t["worker"]), duration_ns=a["key"].map(t["duration_ns"]))
    a = a[a["severity_ns"] > 0]
    out = []
    for (group, w), g in a.groupby(["group", "worker"], sort=True):
        if (group, w) in covered:
            continue
        d = g["duration_ns"].to_numpy(np.float64)
        factor = np.clip((d - g["severity_ns"].to_numpy(np.float64)) / np.maximum(d, 1.0), 0.0, 1.0)
        rec = f.gain_s(scale_tasks=dict(zip(g["key"], factor)))
        ev = g.assign(duration_s=g["duration_ns"] / 1e9, above_mean_s=g["severity_ns"] / 1e9)[
            ["key", "group", "worker", "resource_id", "duration_s", "above_mean_s"]]
        out.append(Finding(
            "anomalies",
            f"{len(g)} {group} task(s) on {w} flagged anomalous by the detector, {_s(float(g['severity_ns'].sum()) / 1e9)} "
            f"above their group's mean in all",
            rec, "replay with each flagged task at its group's mean duration",
            f"Look at what these tasks did differently (flowscope lineage RUN {g['key'].iloc[0]}): their inputs, "
            f"their worker's load and warnings while they ran",
            ev.sort_values("above_mean_s", ascending=False).reset_index(drop=True),
            about={"groups": [group], "workers": [w], "keys": list(g["key"])}))
    return out


def skewed_tasks(f: RunFacts, covered_groups: set[str]) -> list[Finding]:
    """A group whose tasks are very uneven (unbalanced partitions): the largest far above the median."""
    out = []
    for group, g in f.tasks.groupby("group", sort=True):
        if group in covered_groups or len(g) < max(4, f.slots):
            continue
        d = g["duration_ns"].to_numpy(np.float64)
        med, mean = float(np.median(d)), float(d.mean())
        if med <= 0 or d.max() < SKEW_RATIO * med:
            continue
        rec = f.gain_s(scale_tasks=dict(zip(g["key"], mean / np.maximum(d, 1.0))))
        if rec is None or rec < MIN_SHARE * f.task_phase_s:
            continue
        top = g.nlargest(5, "duration_ns")
        ev = top.assign(duration_s=top["duration_ns"] / 1e9, output_mb=top["nbytes"] / 1e6,
                        times_median=top["duration_ns"] / med)[
            ["key", "group", "worker", "duration_s", "times_median", "output_mb"]]
        sizes = ""
        if g["nbytes"].notna().all() and g["nbytes"].median() > 0:
            sizes = (f"; outputs up to {_mb(float(g['nbytes'].max()))} against a median of "
                     f"{_mb(float(g['nbytes'].median()))}")
        out.append(Finding(
            "unbalanced_tasks",
            f"the {group} tasks are unbalanced: the largest takes {_s(d.max() / 1e9)}, {d.max() / med:.0f}x the "
            f"median {_s(med / 1e9)}{sizes}",
            rec,
            f"replay with every {group} task at the group's mean duration (the same total work, evenly split)",
            f"Partition evenly so no piece dominates: repartition (dataframes: repartition(partition_size=...), "
            f"bags: repartition(npartitions=...), arrays: rechunk to equal chunks), split the largest inputs "
            f"({top['key'].iloc[0]} first)",
            ev.reset_index(drop=True), about={"groups": [group], "keys": list(top["key"])}))
    return out


def imbalance(f: RunFacts) -> list[Finding]:
    """Workers whose busy time per slot differs widely (a symptom: the work or its placement is uneven)."""
    t = f.tasks
    if t["worker"].nunique() < 2:
        return []
    by = t.groupby("worker").agg(tasks=("key", "size"), busy_ns=("duration_ns", "sum"),
                                 resources=("resource_id", "nunique")).reset_index()
    by["busy_per_slot_s"] = by["busy_ns"] / by["resources"] / 1e9
    mean = float(by["busy_per_slot_s"].mean())
    hi = by.loc[by["busy_per_slot_s"].idxmax()]
    if mean <= 0 or hi["busy_per_slot_s"] < IMBALANCE_RATIO * mean:
        return []
    rec = min(float(hi["busy_per_slot_s"]) - mean, f.task_phase_s)
    mine = t[t["worker"] == hi["worker"]]
    heavy = mine.groupby("group")["duration_ns"].sum().sort_values(ascending=False)
    ev = by.assign(busy_s=by["busy_ns"] / 1e9)[["worker", "tasks", "resources", "busy_s", "busy_per_slot_s"]] \
        .sort_values("busy_per_slot_s", ascending=False).reset_index(drop=True)
    return [Finding(
        "load_imbalance",
        f"load imbalance: {hi['worker']} was busy {_s(float(hi['busy_per_slot_s']))} per slot, "
        f"{float(hi['busy_per_slot_s']) / mean:.1f}x the mean over {len(by)} workers (most of it {heavy.index[0]})",
        rec, "the busiest worker's busy time per slot minus the mean over workers (what an even spread saves)",
        "Even out the work: more, evenly sized tasks so the scheduler can balance them; check placement "
        "constraints (worker restrictions, resources, data locality) that pin work to one worker",
        ev, kind="symptom", about={"workers": [str(hi["worker"])], "groups": [str(heavy.index[0])]})]


def path_findings(f: RunFacts) -> list[Finding]:
    """The measured critical path dominated by one group, by transfers, or by I/O."""
    paths = f.paths
    if paths is None or paths.measured is None or paths.measured.length_ns <= 0:
        return []
    m = paths.measured
    steps = m.steps[m.steps["duration_ns"] > 0]
    length = m.length_ns
    out = []
    tasks = steps[steps["kind"] == UNIT_STEP]
    if len(tasks):
        by = tasks.groupby("application")["duration_ns"].agg(["sum", "count"]).sort_values("sum", ascending=False)
        g, share = str(by.index[0]), float(by["sum"].iloc[0]) / length
        if share >= PATH_GROUP_SHARE:
            rec = f.gain_s(scale={g: 0.5}) if g in set(f.units["name"]) else None
            ev = tasks[tasks["application"] == g].nlargest(10, "duration_ns")[
                ["id", "label", "location", "start_ns", "duration_ns"]].rename(columns={"id": "key", "label": "group"})
            out.append(Finding(
                "path_group",
                f"the critical path is {100 * share:.0f} % {g} ({int(by['count'].iloc[0])} tasks on it): that group "
                f"sets the makespan",
                rec, f"replay with the {g} tasks twice as fast (what halving that group's time is worth)",
                f"Speed up {g} or split its tasks so more of them run side by side; the other groups are not what "
                f"the run waits for",
                ev.reset_index(drop=True), kind="symptom", about={"groups": [g]}))
    xfer = steps[steps["component"] == "transfer"]
    xs = float(xfer["duration_ns"].sum()) / length if len(xfer) else 0.0
    if xs >= PATH_TRANSFER_SHARE:
        ev = xfer.nlargest(10, "duration_ns")[["id", "label", "location", "start_ns", "duration_ns"]] \
            .rename(columns={"id": "key", "label": "group", "location": "to"})
        out.append(Finding(
            "path_transfers",
            f"transfers are {100 * xs:.0f} % of the critical path ({len(xfer)} on it)",
            f.gain_s(scale={"transfer": 0.0}), "replay with every transfer taking no time",
            "Move less data between workers: reduce before moving (aggregate per partition first), keep dependent "
            "tasks where their inputs are, persist data that several steps reuse",
            ev.reset_index(drop=True), about={"keys": list(ev["key"])}))
    io = steps[steps["component"] == "io"]
    ios = float(io["duration_ns"].sum()) / length if len(io) else 0.0
    if ios >= PATH_IO_SHARE:
        ev = io.nlargest(10, "duration_ns")[["id", "label", "location", "start_ns", "duration_ns"]] \
            .rename(columns={"id": "key", "label": "op"})
        out.append(Finding(
            "io_on_path", f"I/O is {100 * ios:.0f} % of the critical path ({len(io)} operations on it)",
            float(io["duration_ns"].sum()) / 1e9, "the I/O time on the measured critical path (an upper bound)",
            "Read and write less or faster on the path: larger sequential accesses, a columnar format, read once "
            "and reuse, overlap I/O with compute (prefetch the next input)",
            ev.reset_index(drop=True), about={"keys": list(ev["key"])}))
    return out


def repeated_reads(f: RunFacts) -> list[Finding]:
    """A file that several tasks open or read (read it once and reuse what was read)."""
    df = f.run.sql("""
        SELECT path, task_key AS key, op, min(start_ns) AS start_ns, count(*) AS records, sum(nbytes) AS nbytes,
               any_value(attrs) AS attrs
        FROM io WHERE path IS NOT NULL AND task_key IS NOT NULL AND op IN ('open', 'read')
        GROUP BY path, task_key, op""")
    if not len(df):
        return []
    def reading(a) -> bool:  # opened for reading only (no write, append, create or read-write mode)
        try:
            d = json.loads(a) if isinstance(a, str) else {}
        except ValueError:
            d = {}
        mode, flags = d.get("mode"), d.get("flags")
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            return False
        return not (isinstance(flags, int) and flags & 3)
    df = df[(df["op"] == "read") | df["attrs"].map(reading)]
    per_task_files = df.groupby("key")["path"].nunique()
    t = f.tasks.set_index("key")
    out = []
    for path, g in df.groupby("path", sort=True):
        g = g.sort_values("start_ns", kind="stable").drop_duplicates("key")
        if len(g) < 2:
            continue
        later = g.iloc[1:]
        keys = [k for k in later["key"] if k in t.index]
        factor = {k: 1.0 - 1.0 / max(int(per_task_files.get(k, 1)), 1) for k in keys}
        rec = f.gain_s(scale_tasks=factor)
        ev = g.assign(group=g["key"].map(t["group"]), worker=g["key"].map(t["worker"]),
                      duration_s=g["key"].map(t["duration_ns"]) / 1e9,
                      files_opened_by_task=g["key"].map(per_task_files))[
            ["path", "key", "group", "worker", "start_ns", "duration_s", "files_opened_by_task"]]
        out.append(Finding(
            "repeated_reads",
            f"{path} is read by {len(g)} tasks ({', '.join(map(str, g['key'].head(4)))}): the same data read "
            f"{len(g)} times",
            rec,
            "replay without the later readers' reading, each taken as its duration / the number of files it read",
            f"Read {path} once and pass the result to every task that needs it (one load task whose output the "
            "others depend on; persist the loaded collection; or cache it)",
            ev.reset_index(drop=True), about={"paths": [path], "keys": list(g["key"]),
                                               "groups": list(dict.fromkeys(ev["group"].dropna()))}))
    return out


def repeated_transfers(f: RunFacts) -> list[Finding]:
    """The same key moved to the same destination more than once."""
    tr = f.transfers
    if not len(tr):
        return []
    x = tr[["dst_resource_id", "src_resource_id", "start_ns", "end_ns", "nbytes", "keys"]].explode("keys") \
        .dropna(subset=["keys"])
    x = x.assign(d=x["end_ns"] - x["start_ns"])
    by = x.groupby(["keys", "dst_resource_id"]).agg(copies=("d", "size"), seconds=("d", "sum"),
                                                    first=("d", "first")).reset_index()
    rep = by[by["copies"] > 1]
    if not len(rep):
        return []
    extra = float((rep["seconds"] - rep["first"]).sum()) / 1e9
    rec = min(extra / max(f.slots, 1), f.task_phase_s)
    ev = rep.rename(columns={"keys": "key", "dst_resource_id": "to"}) \
        .assign(seconds=rep["seconds"] / 1e9)[["key", "to", "copies", "seconds"]] \
        .sort_values("seconds", ascending=False).reset_index(drop=True)
    return [Finding(
        "repeated_transfers",
        f"{len(rep)} key(s) moved to the same place more than once ({int(rep['copies'].sum() - len(rep))} extra copies, "
        f"{_s(extra)} in flight)",
        rec, f"the extra copies' time in flight over {f.slots} slots (an upper bound: transfers overlap other work)",
        "Keep data where it is used: persist the reused result, avoid releasing and re-fetching it (hold a "
        "reference), or co-locate its consumers",
        ev.head(20), about={"keys": list(ev["key"].head(20))})]


def small_io(f: RunFacts) -> list[Finding]:
    """Many small accesses or a metadata storm in I/O records that count operations (Darshan's counters)."""
    df = f.run.sql("""
        SELECT op, path, TRY_CAST(json_extract_string(attrs, '$.ops') AS BIGINT) AS ops, nbytes,
               TRY_CAST(json_extract_string(attrs, '$.busy_ns') AS BIGINT) AS busy_ns,
               json_extract_string(attrs, '$.sizes') AS sizes
        FROM io WHERE coalesce(TRY_CAST(json_extract_string(attrs, '$.aggregate') AS BOOLEAN), false)
          AND coalesce(TRY_CAST(json_extract_string(attrs, '$.in_totals') AS BOOLEAN), true)""")
    if not len(df):
        return []
    out = []
    data = df[df["op"].isin(["read", "write"]) & df["sizes"].notna()]
    if len(data):
        hist = np.zeros(10, dtype=np.int64)
        for s in data["sizes"]:
            try:
                h = json.loads(s)
                hist[: len(h)] += np.asarray(h[:10], dtype=np.int64)
            except (ValueError, TypeError):
                continue
        total, small = int(hist.sum()), int(hist[:3].sum())   # up to 10 KiB
        busy = float(data["busy_ns"].fillna(0).sum()) / 1e9
        if total >= 1000 and small >= 0.5 * total:
            ev = data.assign(busy_s=data["busy_ns"] / 1e9).nlargest(10, "ops")[["op", "path", "ops", "nbytes", "busy_s"]]
            out.append(Finding(
                "small_io", f"{100 * small / total:.0f} % of {total:,} data accesses are 10 KiB or smaller",
                busy * small / total if busy else None,
                "the data-access time spent in accesses of 10 KiB or less (their share of the operations x the "
                "time of all), an upper bound", "Aggregate accesses into large ones (buffer writes, read whole "
                "blocks; MPI-IO collective buffering; a library's chunk cache)",
                ev.reset_index(drop=True), about={"paths": list(ev["path"].dropna())}))
    meta = df[df["op"] == "metadata"]
    if len(meta):
        mops = int(meta["ops"].fillna(0).sum())
        mt = float(meta["busy_ns"].fillna(0).sum()) / 1e9
        dt = float(data["busy_ns"].fillna(0).sum()) / 1e9 if len(data) else 0.0
        files = meta["path"].nunique()
        if mops >= 1000 and (mt > dt or mops >= 10 * max(files, 1)):
            ev = meta.assign(busy_s=meta["busy_ns"] / 1e9).nlargest(10, "ops")[["path", "ops", "busy_s"]]
            out.append(Finding(
                "metadata_storm", f"a metadata storm: {mops:,} metadata operations on {files:,} files, "
                                  f"{_s(mt)} against {_s(dt)} of data access",
                mt or None, "the time in metadata operations (an upper bound: they would not all go)",
                "Open and stat each file once: keep files open, fewer and larger files, avoid per-access stat/seek",
                ev.reset_index(drop=True), about={"paths": list(ev["path"].dropna())}))
    return out


def predicted_idle(f: RunFacts) -> list[Finding]:
    """Resources the forecast (analysis/forecast: windowed ECDFs, the frequency-analysis paper) predicts idle:
    frames in which at least IDLE_FRACTION of them are idle with likelihood IDLE_LIKELIHOOD or more."""
    from flowscope.analysis.forecast.predict import predict

    if len(f.tasks) < 2:
        return []
    try:
        p = predict(f.run, "idle", IDLE_FRACTION)
    except (ValueError, KeyError):
        return []
    fr = p.frames
    if len(fr) < 3 or "likelihood" not in fr.columns:
        return []
    likely = fr[fr["likelihood"] >= IDLE_LIKELIHOOD]
    if len(likely) < max(2, 0.25 * len(fr)):
        return []
    frame_s = p.window * p.signal.period_ns / 1e9
    ev = likely[["frame", "start_ns", "end_ns", "likelihood", "observed"]].reset_index(drop=True)
    return [Finding(
        "predicted_idle",
        f"at least {100 * IDLE_FRACTION:.0f} % of the {p.resources} resources are predicted idle (likelihood >= "
        f"{IDLE_LIKELIHOOD}) in {len(likely)} of {len(fr)} frames of {_s(frame_s)}",
        None, "not a makespan saving: idle resources cost capacity (the forecast's per-frame likelihoods, "
              "analysis/forecast; the idle slot-seconds are in the explanation's capacity)",
        "Release or shrink the resources in those stretches (adaptive scaling), or give them work: submit "
        "independent work earlier, split the long tasks the others wait for",
        ev, kind="symptom")]


#: the rules without cross-dependencies, in the order they run
SIMPLE_RULES: tuple[Callable[[RunFacts], list[Finding]], ...] = (
    small_tasks, large_graph, large_outputs, repeated_reads, repeated_transfers, path_findings, imbalance, small_io,
    predicted_idle)
