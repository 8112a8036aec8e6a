"""`flowscope compare`: repeated runs of one workflow side by side, and which task groups changed, on real
Dask runs where one run has a planted slowdown in one group (tests/conftest.py, repeated_runs)."""

from __future__ import annotations

import itertools
import json
import socket

import numpy as np
import pytest
from conftest import PLANTED_SLEEP_S

import flowscope
from flowscope.analysis.compare import (
    changed_groups,
    compare,
    group_durations,
    holm,
    phase_summary,
    phase_times,
    placement,
    scheduling_order,
)
from flowscope.cli.main import main

#: the least shift of a group's median the tests call a change: a quarter of the planted sleep, far above what a
#: busy machine does to tasks of a millisecond or less, far below what the planted sleep does
MIN_SHIFT_S = PLANTED_SLEEP_S / 4


@pytest.fixture(scope="module")
def rs(repeated_runs):
    return flowscope.open_store(repeated_runs["store"])


def test_the_planted_group_is_reported_changed_first_and_the_others_not(repeated_runs, rs):
    ch = changed_groups(rs, repeated_runs["baseline"], [repeated_runs["planted"]], min_shift_s=MIN_SHIFT_S)
    assert set(ch["group"]) == {"load", "work", "combine", "total"}
    assert ch["group"].iloc[0] == repeated_runs["group"]
    assert bool(ch["changed"].iloc[0]) and ch["direction"].iloc[0] == "slower"
    assert not ch["changed"].iloc[1:].any(), ch
    work = ch.iloc[0]
    assert work["tasks_before"] == 36 and work["tasks_after"] == 12
    assert work["median_after_s"] >= PLANTED_SLEEP_S and work["p_adjusted"] < 0.01
    # the default comparison (the latest run against the others) finds the same
    c = compare(rs, min_shift_s=MIN_SHIFT_S)
    assert c.after == [repeated_runs["planted"]] and c.before == repeated_runs["baseline"]
    assert c.changes["group"].iloc[0] == "work" and c.changes["changed"].sum() == 1
    # among the baseline runs alone nothing changed
    base = rs.select(repeated_runs["baseline"])
    assert not compare(base, min_shift_s=MIN_SHIFT_S).changes["changed"].any()


def test_holm_adjustment():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4*0.005, 3*0.01, 2*0.03, 1*0.04, made monotone
    assert holm(p).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_phases_per_run_and_their_spread_across_runs(repeated_runs, rs):
    phases = phase_times(rs)
    assert list(phases["run_id"]) == repeated_runs["run_ids"]
    planted = phases.set_index("run_id").loc[repeated_runs["planted"]]
    assert planted["computation_s"] >= 12 * PLANTED_SLEEP_S  # twelve tasks each slept that long
    assert (phases["tasks"] == 37).all()
    assert (phases["total_s"] > 0).all()
    s = phase_summary(phases).set_index("phase")
    for phase in ("computation", "communication", "total"):
        col = phases[f"{phase}_s"]
        assert s.at[phase, "runs"] == 4
        assert s.at[phase, "mean_s"] == pytest.approx(col.mean())
        assert s.at[phase, "std_s"] == pytest.approx(col.std(ddof=1))
        assert s.at[phase, "min_s"] == col.min() and s.at[phase, "max_s"] == col.max()
    assert list(s.index) == [p for p in ("computation", "communication", "io", "total") if p in s.index]


def test_group_distributions_per_run(repeated_runs, rs):
    g = group_durations(rs)
    work = g[g["group"] == "work"].set_index("run_id")
    assert (work["tasks"] == 12).all()
    assert work.at[repeated_runs["planted"], "median_s"] >= PLANTED_SLEEP_S
    d = rs.sql("SELECT run_id, \"group\", end_ns - start_ns AS d FROM activity WHERE role = 'task'")
    for (run_id, group), x in d.groupby(["run_id", "group"]):
        row = g[(g["run_id"] == run_id) & (g["group"] == group)].iloc[0]
        v = x["d"].to_numpy(np.float64) / 1e9
        assert row["mean_s"] == pytest.approx(v.mean()) and row["tasks"] == len(v)
        std = v.std(ddof=1) if len(v) > 1 else 0.0
        assert row["cv"] == pytest.approx(std / v.mean() if v.mean() > 0 else 0.0, abs=1e-12)


def test_scheduling_order_is_kendall_tau_over_the_shared_keys(repeated_runs, rs):
    order = scheduling_order(rs)
    assert len(order) == 6 and (order["common_tasks"] == 37).all()
    starts = rs.sql("SELECT run_id, task_key, start_ns FROM activity WHERE role = 'task'")
    by_run = {r: dict(zip(x["task_key"], x["start_ns"])) for r, x in starts.groupby("run_id")}
    for row in order.itertuples():
        a, b = by_run[row.run_a], by_run[row.run_b]
        keys = sorted(a)
        conc = disc = tied_a = tied_b = pairs = 0
        for k1, k2 in itertools.combinations(keys, 2):  # tau-b's definition, pair by pair
            da, db = np.sign(a[k1] - a[k2]), np.sign(b[k1] - b[k2])
            pairs += 1
            conc += da * db > 0
            disc += da * db < 0
            tied_a += da == 0  # two tasks can start in the same nanosecond (Dask's times are float seconds)
            tied_b += db == 0
        assert row.kendall_tau == pytest.approx((conc - disc) / np.sqrt((pairs - tied_a) * (pairs - tied_b)))


def test_where_tasks_ran(repeated_runs, rs):
    p = placement(rs)
    assert set(p["host"]) == {socket.gethostname()}
    for run_id, x in p.groupby("run_id"):
        assert x["tasks"].sum() == 37
        assert set(x["worker"]) <= set(rs.sql(f"SELECT address FROM resources WHERE run_id = '{run_id}' "
                                              "AND kind = 'worker'")["address"])
        assert x.groupby("group")["share"].sum().round(12).eq(1.0).all()


def test_cli_compare_by_name_and_by_sets(repeated_runs, capsys):
    store = str(repeated_runs["store"])
    assert main(["compare", "--name", "pipeline", "--store", store, "--min-shift", str(MIN_SHIFT_S), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in doc["runs"]] == repeated_runs["run_ids"]
    assert doc["after"] == [repeated_runs["planted"]]
    assert doc["changes"][0]["group"] == "work" and doc["changes"][0]["changed"] is True
    assert [c["group"] for c in doc["changes"] if c["changed"]] == ["work"]
    assert {r["phase"] for r in doc["phase_summary"]} >= {"computation", "communication", "total"}
    # the figures' tables too (analysis/compare_figures.py): the critical paths, the transfers' fit, the warnings
    from flowscope.analysis.compare_figures import critical_paths, warnings_and_long_tasks

    rs = flowscope.open_store(repeated_runs["store"])
    assert [r["length_s"] for r in doc["figures"]["critical_paths"]["runs"]] == \
        pytest.approx(list(critical_paths(rs).runs["length_s"]), rel=1e-9)
    summary = warnings_and_long_tasks(rs)[2]
    assert [r["warnings"] for r in doc["figures"]["warning_summary"]] == list(summary["warnings"])
    assert {r["run_id"] for r in doc["figures"]["transfer_fit"]} <= set(repeated_runs["run_ids"])
    assert main(["compare", repeated_runs["planted"], "--against", *repeated_runs["baseline"], "--store", store,
                 "--min-shift", str(MIN_SHIFT_S)]) == 0
    out = capsys.readouterr().out
    changed = [line for line in out.splitlines() if line.startswith("changed: ")]
    assert len(changed) == 1 and changed[0].startswith("changed: work slower (median ")
    for title in ("critical paths side by side", "warnings against long tasks", "communication: latency"):
        assert title in out, title
    assert main(["compare", "--name", "nope", "--store", store]) == 1
    err = capsys.readouterr().err
    assert "no run named 'nope'" in err and len(err.strip().splitlines()) == 1


NO_SCRIPT_RUN = """
import dask, flowscope
from dask import delayed
with flowscope.observe(store={store!r}, name="from-stdin"):
    dask.compute(sum(delayed(abs)(-i) for i in range(20)), scheduler="threads")
"""


def test_runs_without_a_main_script_are_compared(tmp_path, capsys):
    """Runs recorded from a session with no main script (a notebook, a REPL, ``python -``, a pytest-xdist worker)
    have no script hash; comparing them says so instead of failing on the missing value."""
    import subprocess
    import sys

    store = tmp_path / "store"
    for _ in range(2):
        subprocess.run([sys.executable, "-"], input=NO_SCRIPT_RUN.format(store=str(store)), text=True, check=True,
                       timeout=300, capture_output=True)
    rs = flowscope.open_store(store)
    assert len(rs.runs) == 2 and rs.runs["script_sha256"].isna().all()
    capsys.readouterr()
    assert main(["compare", "--name", "from-stdin", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert all(r in out for r in rs.runs["run_id"])
