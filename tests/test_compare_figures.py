"""The tables behind the comparison figures (analysis/compare_figures.py), on the real Dask runs of
tests/conftest.py's repeated_runs: each table is checked against the canonical tables it is made from."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import PLANTED_GROUP

import flowscope
from flowscope.analysis.compare_figures import (
    LONG_FACTOR,
    LONG_MIN_S,
    critical_paths,
    io_timeline,
    task_coordinates,
    transfer_costs,
    transfer_fit,
    warnings_and_long_tasks,
)


@pytest.fixture(scope="module")
def rs(repeated_runs):
    return flowscope.open_store(repeated_runs["store"])


def _starts(rs) -> dict:
    return dict(zip(rs.runs["run_id"], rs.runs["start_ns"].astype("int64")))


def test_transfer_costs_are_the_transfers_with_the_hosts_at_both_ends(rs):
    costs = transfer_costs(rs)
    raw = rs.sql("SELECT run_id, nbytes, end_ns - start_ns AS d FROM transfers")
    assert len(raw) > 0, "two worker processes exchanging combine inputs must transfer"
    assert costs.groupby("run_id").size().to_dict() == raw.groupby("run_id").size().to_dict()
    assert sorted(costs["seconds"].round(9)) == sorted((raw["d"] / 1e9).round(9))
    assert costs["nbytes"].sum() == raw["nbytes"].sum()
    # one machine: both ends of every transfer are on this host
    assert costs["src_host"].notna().all() and (costs["src_host"] == costs["dst_host"]).all()
    assert costs["locality"].eq("same host").all()


def test_transfer_fit_is_a_least_squares_line_per_run_and_locality(rs):
    costs = transfer_costs(rs)
    fit = transfer_fit(costs)
    assert set(fit["run_id"]) == set(costs["run_id"])
    for r in fit.itertuples():
        part = costs[(costs["run_id"] == r.run_id) & (costs["locality"] == r.locality)]
        assert r.transfers == len(part)
        if part["nbytes"].nunique() >= 2:
            slope, icpt = np.polyfit(part["nbytes"].astype(float), part["seconds"], 1)
            assert r.latency_s == pytest.approx(icpt) and r.seconds_per_byte == pytest.approx(slope)
        else:
            assert np.isnan(r.seconds_per_byte)
            assert r.latency_s == pytest.approx(part["seconds"].mean())


def test_task_coordinates_are_one_row_per_task_with_output_size(rs):
    coords = task_coordinates(rs)
    tasks = rs.sql("""SELECT run_id, task_key, "group", start_ns, end_ns,
                             CAST(json_extract(attrs, '$.nbytes') AS BIGINT) AS nbytes
                      FROM activity WHERE role = 'task'""")
    assert len(coords) == len(tasks) == 4 * 37
    m = coords.merge(tasks, on=["run_id", "task_key"], validate="one_to_one")
    starts = _starts(rs)
    assert np.allclose(m["elapsed_s"], (m["start_ns"] - m["run_id"].map(starts)) / 1e9)
    assert np.allclose(m["duration_s"], (m["end_ns"] - m["start_ns"]) / 1e9)
    assert (m["group_x"] == m["group_y"]).all()
    assert np.allclose(m["output_mb"], m["nbytes"] / 1e6)
    assert (m["elapsed_s"] >= 0).all() and m["thread"].notna().all()


def test_io_timeline_holds_every_io_record_of_a_thread_relative_to_its_run(rs):
    tl = io_timeline(rs)
    raw = rs.sql("SELECT run_id, resource_id, op, nbytes, start_ns, coalesce(end_ns, start_ns) AS e FROM io")
    assert len(tl) == len(raw)
    starts = _starts(rs)
    assert sorted(tl["start_s"].round(6)) == sorted(((raw["start_ns"] - raw["run_id"].map(starts)) / 1e9).round(6))
    assert (tl["end_s"] >= tl["start_s"]).all()


def test_warnings_line_up_with_the_long_tasks_of_the_planted_run(repeated_runs, rs):
    warns, long_tasks, summary = warnings_and_long_tasks(rs)
    planted = repeated_runs["planted"]
    # the planted run's work tasks collect a large heap: the workers log GC pauses, inside those tasks
    pw = warns[warns["run_id"] == planted]
    assert len(pw) > 0 and set(pw["category"]) >= {"gc"}
    lt = long_tasks[long_tasks["run_id"] == planted]
    assert PLANTED_GROUP in set(lt["group"])
    # long: at least LONG_FACTOR times the run's median task and LONG_MIN_S
    d = rs.sql(f"SELECT (end_ns - start_ns) / 1e9 AS d FROM activity WHERE role = 'task' AND run_id = '{planted}'")["d"]
    threshold = max(LONG_FACTOR * d.median(), LONG_MIN_S)
    assert len(lt) == int((d >= threshold).sum()) and (lt["duration_s"] >= threshold - 1e-9).all()
    s = summary.set_index("run_id").loc[planted]
    assert s["warnings"] == len(pw)
    # recomputed here: a warning is during a long task when one ran on its host at that moment
    hosts = rs.sql(f"SELECT resource_id, host FROM resources WHERE run_id = '{planted}'")
    during = 0
    for w in pw.itertuples():
        on = lt[(lt["start_s"] <= w.t_s) & (lt["end_s"] >= w.t_s)]
        if w.host is not None and not pd.isna(w.host):
            on = on[on["host"] == w.host]
        during += bool(len(on))
    assert s["during_long_tasks"] == during and during == (pw["during_long_task"]).sum()
    assert 0 < s["long_task_time_share"] < 1 and len(hosts)


def test_critical_paths_side_by_side_sum_to_their_lengths(repeated_runs, rs):
    cp = critical_paths(rs)
    assert list(cp.runs["run_id"]) == repeated_runs["run_ids"]
    for r in cp.runs.itertuples():
        comp = cp.components[cp.components["run_id"] == r.run_id]
        assert comp["seconds"].sum() == pytest.approx(r.length_s)
        grp = cp.groups[cp.groups["run_id"] == r.run_id]
        assert grp["seconds"].sum() <= r.length_s + 1e-9
    # the planted group holds more of the planted run's path than of any baseline run's
    g = cp.groups[cp.groups["group"] == PLANTED_GROUP].set_index("run_id")["seconds"]
    assert g.get(repeated_runs["planted"], 0) > max(g.get(i, 0) for i in repeated_runs["baseline"])
    json.dumps(cp.to_dict())  # JSON-ready


def test_a_task_thread_that_logs_before_its_first_task_ends_still_nests_in_its_worker(repeated_runs, rs):
    """The planted run's threads log GC pauses from inside their first tasks, before those tasks' spans are
    written: the threads are still the workers' (placement names only the workers), in every run."""
    rows = rs.sql("""SELECT a.run_id, r.resource_id, r.parent_id, p.kind AS parent_kind
                     FROM (SELECT DISTINCT run_id, resource_id FROM activity WHERE role = 'task') a
                     JOIN resources r ON r.run_id = a.run_id AND r.resource_id = a.resource_id
                     JOIN resources p ON p.run_id = r.run_id AND p.resource_id = r.parent_id""")
    assert set(rows["run_id"]) == set(repeated_runs["run_ids"])
    assert (rows["parent_kind"] == "worker").all(), rows[rows["parent_kind"] != "worker"]
    from flowscope.analysis.compare import placement

    assert placement(rs)["worker"].str.startswith("tcp://").all()
