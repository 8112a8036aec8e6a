"""`flowscope lineage RUN KEY`: everything a run recorded about one task, on a real Dask run and on an
imported StarPU trace."""

from __future__ import annotations

import json

import pytest

import flowscope
from flowscope.analysis.critical_path import task_graph_paths, work_units
from flowscope.analysis.lineage import UnknownTask, lineage
from flowscope.cli.main import main
from flowscope.importers import import_paths


def _run(repeated_runs, i=0):
    return flowscope.open_run(repeated_runs["store"] / repeated_runs["run_ids"][i])


def test_lineage_of_a_dask_task_is_every_row_about_it(repeated_runs):
    run = _run(repeated_runs)
    lin = lineage(run, "work-3")
    assert lin.group == "work"
    table = run.table("transitions")
    want = table[table["task_key"] == "work-3"].sort_values("ts_ns", kind="stable")
    assert len(want) > 0
    assert list(lin.transitions["ts_ns"]) == list(want["ts_ns"])
    assert list(lin.transitions["to_state"]) == list(want["to_state"])
    assert list(lin.transitions["observer"].fillna("")) == list(want["observer"].fillna(""))
    assert "memory" in set(lin.transitions["to_state"])
    # one execution, on a worker thread
    assert len(lin.executions) == 1 and lin.executions["role"].iloc[0] == "task"
    assert lin.executions["resource_kind"].iloc[0] == "thread"
    assert list(lin.dependencies["key"]) == ["load-3"]
    assert sorted(lin.dependants["key"]) == ["combine-2", "combine-3"]
    assert set(lin.dependants["group"]) == {"combine"} and lin.dependants["resource_id"].notna().all()
    transfers = run.table("transfers")
    moved = transfers[[("work-3" in list(k)) if k is not None else False for k in transfers["keys"]]]
    assert sorted(lin.transfers["start_ns"]) == sorted(moved["start_ns"])
    io = run.table("io")
    assert len(lin.io) == int((io["task_key"] == "work-3").sum())
    assert lin.anomaly is not None and len(lin.anomaly["executions"]) == 1
    assert isinstance(lin.anomaly["flagged"], bool)
    assert lin.critical_path["on_structural"] in (True, False) and lin.critical_path["slack_ns"] >= 0


def test_the_last_task_is_on_both_critical_paths(repeated_runs):
    run = _run(repeated_runs)
    tp = task_graph_paths(work_units(run), run.table("dependencies"), run.table("transfers"))
    lin = lineage(run, "total")
    assert lin.critical_path["on_structural"] is True and lin.critical_path["slack_ns"] == 0
    assert lin.critical_path["on_measured"] is (tp.measured is not None and "total" in tp.measured.ids)
    assert lin.dependants.empty and len(lin.dependencies) == 12
    off = next(k for k in (f"load-{i}" for i in range(12)) if k not in tp.structural.ids)
    assert lineage(run, off).critical_path["on_structural"] is False


def test_cli_lineage_json_and_an_unknown_key(repeated_runs, capsys):
    store, run_id = str(repeated_runs["store"]), repeated_runs["run_ids"][1]
    assert main(["lineage", run_id, "combine-4", "--store", store, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["key"] == "combine-4" and doc["run_id"] == run_id
    assert sorted(d["key"] for d in doc["dependencies"]) == ["work-4", "work-5"]
    assert [d["key"] for d in doc["dependants"]] == ["total"]
    run = flowscope.open_run(repeated_runs["store"] / run_id)
    assert len(doc["transitions"]) == int(run.sql("SELECT count(*) AS n FROM transitions "
                                                  "WHERE task_key = 'combine-4'")["n"][0])
    assert main(["lineage", run_id, "combine-4", "--store", store]) == 0
    out = capsys.readouterr().out
    assert "combine-4" in out and "work-4" in out and "transitions" in out
    assert main(["lineage", run_id, "combin-4", "--store", store]) == 1
    err = capsys.readouterr().err
    assert "no task 'combin-4'" in err and "combine-4" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(UnknownTask):
        lineage(run, "nothing-like-it-at-all")


def test_lineage_of_an_imported_starpu_task(shared_data, tmp_path):
    res = import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], tmp_path / "store")
    run = flowscope.open_run(res.run_dir)
    deps = run.table("dependencies")
    key = deps["task_key"].value_counts().index[0]  # a task with the most inputs
    lin = lineage(run, key)
    assert len(lin.executions) == 1 and lin.executions["role"].iloc[0] == "task"
    assert lin.group == lin.executions["group"].iloc[0]
    assert sorted(lin.dependencies["key"]) == sorted(deps.loc[deps["task_key"] == key, "depends_on"])
    assert sorted(lin.dependants["key"]) == sorted(deps.loc[deps["depends_on"] == key, "task_key"])
    assert lin.dependencies["resource_id"].notna().all()
    assert lin.transitions.empty  # a Paje trace records no state changes of tasks
    tp = task_graph_paths(work_units(run), deps, run.table("transfers"))
    assert lin.critical_path["on_structural"] is (key in tp.structural.ids)
    on_path = tp.structural.ids[-1]
    assert lineage(run, on_path).critical_path == {**lineage(run, on_path).critical_path, "on_structural": True,
                                                   "slack_ns": 0}
    assert lin.anomaly is not None and len(lin.anomaly["executions"]) == 1


def test_lineage_of_an_imported_wfcommons_task(shared_data, tmp_path):
    """WfCommons tasks have derived times (no measured critical path): lineage says so instead of guessing."""
    path = sorted((shared_data / "wfinstances").glob("*.json"))[0]
    res = import_paths([path], tmp_path / "store")
    run = flowscope.open_run(res.run_dir)
    deps = run.table("dependencies")
    key = deps["task_key"].value_counts().index[0]
    lin = lineage(run, key)
    assert len(lin.executions) == 1 and lin.executions["role"].iloc[0] == "task"
    assert sorted(lin.dependencies["key"]) == sorted(deps.loc[deps["task_key"] == key, "depends_on"])
    assert sorted(lin.dependants["key"]) == sorted(deps.loc[deps["depends_on"] == key, "task_key"])
    assert lin.critical_path["on_measured"] is None and lin.critical_path["task_times"] == "derived"
    tp = task_graph_paths(work_units(run), deps, run.table("transfers"))
    assert lin.critical_path["on_structural"] is (key in tp.structural.ids)
