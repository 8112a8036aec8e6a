"""Explaining across runs: how repeated runs of a workflow differ (the provenance paper's section IV).

Plain functions over a :class:`~flowscope.store.run_set.RunSet` (any source: the tables' ``run_id`` and the
model's vocabulary, never one source's names):

* :func:`phase_times` / :func:`phase_summary`: computation, communication, I/O and total time per run, and their
  mean and spread across the runs of each name (the paper's Fig. 3, error bars included);
* :func:`group_durations`: per run and task group, the duration distribution (count, mean, median, std, CV);
* :func:`changed_groups`: which groups' task durations changed between two sets of runs, by a two-sided
  Mann-Whitney U test per group with Holm's correction for testing every group, and a minimum effect so that
  a significant but negligible shift is not reported;
* :func:`scheduling_order`: Kendall's tau between the start orders of the task keys two runs share;
* :func:`placement`: where each group's tasks ran (host, worker) in each run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from flowscope.store.run_set import RunSet

#: what :func:`changed_groups` calls a change unless told otherwise: significance level after correction, and the
#: least relative change of the median (0.2: 20 % slower or faster) and least absolute shift of the median
ALPHA, MIN_CHANGE, MIN_SHIFT_S = 0.01, 0.2, 0.001
PHASES = ("computation", "communication", "io", "total")


def phase_times(runs: RunSet) -> pd.DataFrame:
    """Per run (oldest first): its name, computation, communication and I/O seconds (the breakdown of
    analysis/breakdown.py: slot-time of the executing resources, transfer time, timed I/O; ``io_s`` NaN when the
    run's I/O records carry no durations) and total, the run's wall time from run.json (else its makespan)."""
    from flowscope.analysis.breakdown import breakdown

    rows = []
    catalogue = runs.runs.set_index("run_id")
    for run_id in runs.run_ids:
        b = breakdown(runs.run(run_id))
        wall = catalogue.at[run_id, "duration_s"]
        rows.append({"run_id": run_id, "name": catalogue.at[run_id, "name"],
                     "computation_s": b.compute_s, "communication_s": b.communication_s,
                     "io_s": math.nan if b.io_s is None else b.io_s,
                     "total_s": float(wall) if pd.notna(wall) else b.makespan_s,
                     "tasks": b.tasks, "transfers": b.transfers,
                     "io_bytes": b.io_read_bytes + b.io_write_bytes})
    return pd.DataFrame(rows, columns=["run_id", "name", "computation_s", "communication_s", "io_s", "total_s",
                                       "tasks", "transfers", "io_bytes"])


def phase_summary(phases: pd.DataFrame, by: str = "name") -> pd.DataFrame:
    """Per value of ``by`` (a workflow's name) and phase: runs, mean, std (the error bar), min, max and CV of the
    phase's seconds across the runs; I/O whose time is unknown counts no run."""
    long = phases.melt(id_vars=["run_id", by], value_vars=[f"{p}_s" for p in PHASES], var_name="phase",
                       value_name="seconds").dropna(subset=["seconds"])
    long["phase"] = long["phase"].str.removesuffix("_s")
    out = (long.groupby([by, "phase"], sort=False)["seconds"]
           .agg(runs="count", mean_s="mean", std_s="std", min_s="min", max_s="max").reset_index())
    out["std_s"] = out["std_s"].fillna(0.0)
    out["cv"] = (out["std_s"] / out["mean_s"]).where(out["mean_s"] > 0, 0.0)
    out["phase"] = pd.Categorical(out["phase"], PHASES, ordered=True)
    return out.sort_values([by, "phase"], kind="stable").reset_index(drop=True).astype({"phase": str})


def _in(ids: list[str]) -> str:
    return "(" + ", ".join("'" + i.replace("'", "''") + "'" for i in ids) + ")"


def task_durations(runs: RunSet, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Every task's duration: run_id, group, task_key, resource_id, start_ns, duration_ns (``activity`` rows of
    role ``task``)."""
    where = f" AND run_id IN {_in(run_ids)}" if run_ids is not None else ""
    return runs.sql(f"""SELECT run_id, "group", task_key, resource_id, start_ns, end_ns - start_ns AS duration_ns
                        FROM activity WHERE role = 'task'{where} ORDER BY run_id, start_ns""")


def group_durations(runs: RunSet) -> pd.DataFrame:
    """Per run and task group: tasks, total, mean, median, std, max seconds and CV (std / mean), largest total
    first within each run."""
    df = runs.sql("""
        SELECT run_id, "group", count(*) AS tasks, sum(d) / 1e9 AS total_s, avg(d) / 1e9 AS mean_s,
               median(d) / 1e9 AS median_s, coalesce(stddev_samp(d), 0) / 1e9 AS std_s, max(d) / 1e9 AS max_s
        FROM (SELECT run_id, "group", end_ns - start_ns AS d FROM activity WHERE role = 'task')
        GROUP BY ALL""")
    df["cv"] = (df["std_s"] / df["mean_s"]).where(df["mean_s"] > 0, 0.0)
    order = {r: i for i, r in enumerate(runs.run_ids)}
    df["_o"] = df["run_id"].map(order)
    return df.sort_values(["_o", "total_s", "group"], ascending=[True, False, True], kind="stable") \
        .drop(columns="_o").reset_index(drop=True)


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment of the p-values ``p`` (family-wise error rate)."""
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


def changed_groups(runs: RunSet, before: list[str], after: list[str], *, alpha: float = ALPHA,
                   min_change: float = MIN_CHANGE, min_shift_s: float = MIN_SHIFT_S) -> pd.DataFrame:
    """Per task group present in both sets of runs: the task durations of the runs ``before`` against those of
    the runs ``after`` (each set's tasks pooled), a two-sided Mann-Whitney U test, Holm's adjustment over the
    groups tested, and ``changed``: adjusted p below ``alpha`` and the median moved by at least ``min_change``
    of the earlier median and ``min_shift_s`` seconds. Columns: group, tasks before / after, median and mean
    seconds before / after, ratio (after / before median), shift_s (of the median), delta_total_s (change of the
    group's mean total per run), u, p, p_adjusted, changed, direction ('slower' / 'faster' / ''). Changed groups
    first, the largest change of total time first."""
    from scipy.stats import mannwhitneyu

    cols = ["group", "tasks_before", "tasks_after", "median_before_s", "median_after_s", "mean_before_s",
            "mean_after_s", "ratio", "shift_s", "delta_total_s", "u", "p", "p_adjusted", "changed", "direction"]
    if not before or not after:
        return pd.DataFrame(columns=cols)
    d = task_durations(runs, [*before, *after])
    d["side"] = np.where(d["run_id"].isin(after), "after", "before")
    rows = []
    for group, g in d.groupby("group", sort=True):
        x = g.loc[g["side"] == "before", "duration_ns"].to_numpy(np.float64) / 1e9
        y = g.loc[g["side"] == "after", "duration_ns"].to_numpy(np.float64) / 1e9
        if not len(x) or not len(y):
            continue
        res = mannwhitneyu(x, y, alternative="two-sided", method="asymptotic")
        mx, my = float(np.median(x)), float(np.median(y))
        rows.append({"group": group, "tasks_before": len(x), "tasks_after": len(y), "median_before_s": mx,
                     "median_after_s": my, "mean_before_s": float(x.mean()), "mean_after_s": float(y.mean()),
                     "ratio": my / mx if mx > 0 else math.inf if my > 0 else 1.0, "shift_s": my - mx,
                     "delta_total_s": float(y.sum()) / len(after) - float(x.sum()) / len(before),
                     "u": float(res.statistic), "p": float(res.pvalue)})
    out = pd.DataFrame(rows, columns=cols[:-3])
    out["p_adjusted"] = holm(out["p"].to_numpy())
    big = (out["shift_s"].abs() >= min_shift_s) & (out["shift_s"].abs() >= min_change * out["median_before_s"])
    out["changed"] = (out["p_adjusted"] < alpha) & big
    out["direction"] = np.where(~out["changed"], "", np.where(out["shift_s"] > 0, "slower", "faster"))
    out["_key"] = out["delta_total_s"].abs()
    return out.sort_values(["changed", "_key", "group"], ascending=[False, False, True], kind="stable") \
        .drop(columns="_key").reset_index(drop=True)


def scheduling_order(runs: RunSet) -> pd.DataFrame:
    """Per pair of runs: how many task keys both ran, and Kendall's tau (tau-b) between the orders in which
    those tasks started (1: the same order, 0: unrelated, -1: reversed; NaN with fewer than 2 shared keys)."""
    from scipy.stats import kendalltau

    starts = runs.sql("""SELECT run_id, task_key, min(start_ns) AS start_ns FROM activity
                         WHERE role = 'task' AND task_key IS NOT NULL GROUP BY ALL""")
    wide = starts.pivot(index="task_key", columns="run_id", values="start_ns")
    rows = []
    for a, b in itertools.combinations([r for r in runs.run_ids if r in wide.columns], 2):
        both = wide[[a, b]].dropna()
        tau = float(kendalltau(both[a].to_numpy(np.int64), both[b].to_numpy(np.int64)).statistic) \
            if len(both) >= 2 else math.nan
        rows.append({"run_a": a, "run_b": b, "common_tasks": len(both), "kendall_tau": tau})
    return pd.DataFrame(rows, columns=["run_a", "run_b", "common_tasks", "kendall_tau"])


def placement(runs: RunSet) -> pd.DataFrame:
    """Where each group's tasks ran in each run: run_id, group, host, worker (the executing resource's parent,
    e.g. a Dask worker process, else the resource itself), tasks, busy seconds and the share of the group's
    tasks of that run."""
    df = runs.sql("""
        SELECT a.run_id, a."group", coalesce(r.host, p.host) AS host,
               coalesce(p.address, p.name, p.resource_id, r.name, a.resource_id) AS worker,
               count(*) AS tasks, sum(a.end_ns - a.start_ns) / 1e9 AS busy_s
        FROM activity a
        LEFT JOIN resources r ON r.run_id = a.run_id AND r.resource_id = a.resource_id
        LEFT JOIN resources p ON p.run_id = a.run_id AND p.resource_id = r.parent_id
        WHERE a.role = 'task' GROUP BY ALL""")
    df["share"] = df["tasks"] / df.groupby(["run_id", "group"])["tasks"].transform("sum")
    return df.sort_values(["run_id", "group", "tasks", "worker"], ascending=[True, True, False, True],
                          kind="stable").reset_index(drop=True)


@dataclass
class Comparison:
    """Runs compared (see the module's functions for each table). ``before`` / ``after``: the two sets
    :attr:`changes` tests (the later runs against the earlier ones)."""

    runs: pd.DataFrame
    before: list[str]
    after: list[str]
    phases: pd.DataFrame
    phase_summary: pd.DataFrame
    groups: pd.DataFrame
    changes: pd.DataFrame
    order: pd.DataFrame
    placement: pd.DataFrame
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready."""
        import json

        def rows(df: pd.DataFrame) -> list[dict]:
            return json.loads(df.to_json(orient="records", double_precision=15)) if len(df) else []

        keep = ["run_id", "name", "status", "start_ns", "end_ns", "duration_s", "command", "host", "script_sha256",
                "dask_version", "distributed_version", "python", "capture_level"]
        return {"runs": rows(self.runs[keep]), "before": self.before, "after": self.after,
                "settings": self.settings, "phases": rows(self.phases), "phase_summary": rows(self.phase_summary),
                "groups": rows(self.groups), "changes": rows(self.changes), "order": rows(self.order),
                "placement": rows(self.placement)}


def choose(runs: RunSet, ids: list[str] = (), names: list[str] = (), against: list[str] = (),
           against_names: list[str] = ()) -> tuple[RunSet, list[str]]:
    """The runs of ``runs`` to compare -- those of ``ids`` and ``names`` and the baseline's -- and the baseline:
    the runs of ``against`` and those named in ``against_names`` (empty: none given). ValueError when nothing is
    named, or naming what matches no run."""
    if not (ids or names or against or against_names):
        raise ValueError("name the runs to compare: run ids, or names")
    chosen = runs.select([*ids, *against], [*names, *against_names])
    named = dict(zip(chosen.runs["run_id"], chosen.runs["name"]))
    baseline = [i for i in chosen.run_ids if i in against or named[i] in against_names]
    return chosen, baseline


def compare(runs: RunSet, before: list[str] | None = None, after: list[str] | None = None, *,
            alpha: float = ALPHA, min_change: float = MIN_CHANGE, min_shift_s: float = MIN_SHIFT_S) -> Comparison:
    """Compare the runs of ``runs``. The sets whose task durations are tested: ``after`` against ``before``;
    by default the latest run against all the others (none with a single run)."""
    ids = runs.run_ids
    if not ids:
        raise ValueError("no runs to compare")
    if after is None and before is None:
        after, before = ids[-1:], ids[:-1]
    elif after is None:
        after = [i for i in ids if i not in before]
    elif before is None:
        before = [i for i in ids if i not in after]
    overlap = sorted(set(before) & set(after))
    if overlap:
        raise ValueError(f"run {overlap[0]} is in both sets compared")
    phases = phase_times(runs)
    return Comparison(runs=runs.runs, before=list(before), after=list(after), phases=phases,
                      phase_summary=phase_summary(phases), groups=group_durations(runs),
                      changes=changed_groups(runs, list(before), list(after), alpha=alpha, min_change=min_change,
                                             min_shift_s=min_shift_s),
                      order=scheduling_order(runs), placement=placement(runs),
                      settings={"alpha": alpha, "min_change": min_change, "min_shift_s": min_shift_s,
                                "test": "Mann-Whitney U (two-sided), Holm-adjusted over groups"})
