"""What changed between runs, and how much of the difference in wall time each change explains.

Each run's wall time is split the same way (:func:`~flowscope.analysis.advisor.attribution.attribute`), with
the critical path's compute further split by task group; the mean of each part over the earlier runs is set
against its mean over the later ones. The parts sum to the wall time, so their differences sum to the difference
of the mean wall times: each part's share of it is how much of the difference it explains. Task groups carry the
verdict of :func:`flowscope.analysis.compare.changed_groups` (Mann-Whitney U per group, Holm-adjusted), so a
group whose path time moved but whose task durations did not is told apart from one that really got slower; the
other parts changed when the later mean lies more than 3 standard deviations of the earlier runs away. What
changed comes first, the largest change first; then the parts whose change is within the noise.
"""

from __future__ import annotations

import pandas as pd

from flowscope.analysis.advisor.attribution import LABELS, attribute
from flowscope.analysis.advisor.facts import run_facts
from flowscope.store.run_set import RunSet

#: a part of the wall time (not a group) changed when its later mean differs from its earlier mean by more than
#: this many standard deviations of the earlier runs (with two or more of them) and by MIN_PART_CHANGE_S
NOISE_SIGMAS, MIN_PART_CHANGE_S = 3.0, 0.01
CHANGE_COLUMNS = ["what", "category", "group", "before_s", "after_s", "delta_s", "share_of_difference",
                  "significant", "direction", "p_adjusted", "median_before_s", "median_after_s"]


def parts(facts) -> dict[tuple[str, str | None], float]:
    """One run's wall time in parts: (category, None) per category of the attribution, the compute split into
    (``compute``, group) by the critical path's compute steps of each group."""
    att = attribute(facts)
    out: dict[tuple[str, str | None], float] = {}
    compute = 0.0
    for r in att.itertuples(index=False):
        if r.category == "compute":
            compute = float(r.seconds)
        else:
            out[(r.category, None)] = float(r.seconds)
    paths = facts.paths
    steps = paths.measured.steps if paths is not None and paths.measured is not None else None
    if steps is not None:
        c = steps[(steps["component"] == "compute") & (steps["duration_ns"] > 0)]
        by = c.groupby("application")["duration_ns"].sum()
        total = float(by.sum())
        for g, v in by.items():
            out[("compute", str(g))] = compute * float(v) / total if total > 0 else 0.0
        if total <= 0:
            out[("compute", None)] = compute
    else:
        out[("compute", None)] = compute
    return out


def what_changed(runs: RunSet, before: list[str], after: list[str]) -> tuple[pd.DataFrame, dict]:
    """The parts of the wall time (:func:`parts`) before and after (means over each set of runs), their
    difference and the share of the wall-time difference each explains, largest first; and a summary (runs,
    mean wall times, difference)."""
    from flowscope.analysis.compare import changed_groups

    if not before or not after:
        raise ValueError("what changed needs runs on both sides: give two or more runs")
    per: dict[str, dict] = {}
    walls: dict[str, float] = {}
    for rid in [*before, *after]:
        f = run_facts(runs.run(rid))
        per[rid] = parts(f)
        walls[rid] = f.wall_s
    keys = sorted({k for p in per.values() for k in p}, key=lambda k: (k[0], k[1] or ""))

    def mean(ids: list[str], k) -> float:
        return sum(per[i].get(k, 0.0) for i in ids) / len(ids)

    wb = sum(walls[i] for i in before) / len(before)
    wa = sum(walls[i] for i in after) / len(after)
    diff = wa - wb
    tests = changed_groups(runs, before, after).set_index("group")
    rows = []
    for cat, group in keys:
        b, a = mean(before, (cat, group)), mean(after, (cat, group))
        row = {"what": f"compute in {group}" if group else LABELS.get(cat, cat), "category": cat, "group": group,
               "before_s": b, "after_s": a, "delta_s": a - b,
               "share_of_difference": (a - b) / diff if diff else None,
               "significant": None, "direction": None, "p_adjusted": None,
               "median_before_s": None, "median_after_s": None}
        if group is None and len(before) >= 2:
            # a part of the wall time changed when the later mean lies beyond the earlier runs' spread
            vals = [per[i].get((cat, group), 0.0) for i in before]
            spread = NOISE_SIGMAS * float(pd.Series(vals).std(ddof=1))
            row.update(significant=bool(abs(a - b) > max(spread, MIN_PART_CHANGE_S)),
                       direction=("slower" if a > b else "faster") if abs(a - b) > max(spread, MIN_PART_CHANGE_S)
                       else "unchanged")
        if group is not None and group in tests.index:
            t = tests.loc[group]
            row.update(significant=bool(t["changed"]), direction=t["direction"] or "unchanged",
                       p_adjusted=float(t["p_adjusted"]), median_before_s=float(t["median_before_s"]),
                       median_after_s=float(t["median_after_s"]))
        rows.append(row)
    df = pd.DataFrame(rows, columns=CHANGE_COLUMNS)
    # what changed beyond the noise first (a group's test, a part beyond the earlier runs' spread), largest first
    order = pd.DataFrame({"sig": df["significant"].fillna(False).astype(bool), "size": df["delta_s"].abs()})
    df = df.reindex(order.sort_values(["sig", "size"], ascending=[False, False], kind="stable").index) \
        .reset_index(drop=True)
    return df, {"before": list(before), "after": list(after), "wall_before_s": wb, "wall_after_s": wa,
                "difference_s": diff}
