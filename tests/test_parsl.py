"""Parsl's monitoring database (``monitoring.db``) imported as a run: a real Parsl workflow (tests/parsl_workflow.py:
a local HighThroughputExecutor, monitoring on) run in a subprocess, then ``flowscope import`` on what it wrote."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_module

from flowscope.importers import TraceError, detect_format, import_paths
from flowscope.store.run import open_run

require_module("parsl", "the Parsl importer's tests run a real Parsl workflow: pip install -e '.[test]'")

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def parsl_db(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("parsl")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    p = subprocess.run([sys.executable, str(HERE / "parsl_workflow.py"), str(out)], capture_output=True, text=True,
                       env=env, cwd=out, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result == {"result": sum(2 * (i + 1) for i in range(6)), "failed": "planted failure"}
    return out / "monitoring.db", result


@pytest.fixture(scope="module")
def parsl_run(parsl_db, tmp_path_factory):
    return open_run(import_paths([parsl_db[0]], tmp_path_factory.mktemp("store")).run_dir)


def _db(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        return c.execute(sql).fetchall()


def test_the_monitoring_database_is_detected_as_parsl(parsl_db, tmp_path):
    assert detect_format(parsl_db[0]) == "parsl"
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE task (task_id INTEGER, name TEXT)")
    assert detect_format(other) != "parsl"


def test_every_task_is_a_span_on_the_worker_pool_that_ran_it(parsl_db, parsl_run):
    db = parsl_db[0]
    tasks = _db(db, "SELECT task_id, task_func_name FROM task")
    spans = parsl_run.sql("SELECT * FROM activity WHERE role = 'task'")
    assert len(spans) == len(tasks) == 14  # 6 work, 6 double, total, boom
    assert sorted(spans["group"]) == sorted(name for _, name in tasks)
    # each span is the try's execution: from "running" to "running_ended" as Parsl's database has them
    rows = _db(db, """SELECT s1.task_id, s1.timestamp, s2.timestamp FROM status s1 JOIN status s2
                      ON s1.task_id = s2.task_id AND s1.try_id = s2.try_id
                      WHERE s1.task_status_name = 'running' AND s2.task_status_name = 'running_ended'""")
    assert len(rows) == 14
    by_key = spans.set_index("task_key")
    import pandas as pd

    for tid, t0, t1 in rows:
        name = dict(tasks)[tid]
        s = by_key.loc[f"{name}-{tid}"]
        assert s["start_ns"] == pd.Timestamp(t0, tz="UTC").value and s["end_ns"] == pd.Timestamp(t1, tz="UTC").value
    work = spans[spans["group"] == "work"]
    assert ((work["end_ns"] - work["start_ns"]) >= 50e6).all()  # the apps' own sleeps
    # each ran on the worker process Parsl's resource monitor saw it on: the pool's two processes, one task at a time
    pids = dict(((f"{dict(tasks)[t]}-{t}"), pid) for t, pid in
                _db(db, "SELECT task_id, min(psutil_process_pid) FROM resource GROUP BY task_id"))
    res = parsl_run.table("resources").set_index("resource_id")
    assert {k: int(res.loc[r, "pid"]) for k, r in zip(spans["task_key"], spans["resource_id"])} == pids
    ex = parsl_run.sql("SELECT resource_id, executes, slots FROM executors WHERE executes")
    used = set(spans["resource_id"])
    assert len(used) == 2 and used <= set(ex["resource_id"])
    assert (ex.set_index("resource_id").loc[sorted(used), "slots"] == 1).all()
    pool = {res.loc[r, "parent_id"] for r in used}
    assert len(pool) == 1 and json.loads(res.loc[pool.pop(), "attrs"])["nthreads"] == 2
    for r in used:  # one task at a time on each process
        on = spans[spans["resource_id"] == r].sort_values("start_ns")
        assert (on["start_ns"].to_numpy()[1:] >= on["end_ns"].to_numpy()[:-1]).all()
    assert spans["category"].eq("compute").all()


def test_dependencies_are_the_workflows_and_every_task_starts_after_what_it_needs(parsl_run):
    deps = parsl_run.table("dependencies")
    spans = parsl_run.sql("SELECT task_key, start_ns, end_ns FROM spans WHERE kind = 'task'").set_index("task_key")
    edges = set(zip(deps["task_key"], deps["depends_on"]))
    double = sorted(k for k in spans.index if k.startswith("double-"))
    work = sorted(k for k in spans.index if k.startswith("work-"))
    total = [k for k in spans.index if k.startswith("total-")]
    assert len(edges) == 12 and len(total) == 1
    assert {p for c, p in edges if c == total[0]} == set(double)
    assert {c for c, p in edges if p in work} == set(double)
    for child, parent in edges:
        assert spans.loc[child, "start_ns"] >= spans.loc[parent, "end_ns"]


def test_the_failed_task_is_logged_and_its_span_says_so(parsl_run):
    logs = parsl_run.sql("SELECT * FROM logs WHERE level = 'error'")
    assert len(logs) == 1 and logs["task_key"].iloc[0].startswith("boom-")
    span = parsl_run.sql("SELECT attrs FROM spans WHERE task_key LIKE 'boom-%'")
    assert json.loads(span["attrs"].iloc[0])["state"] == "failed"
    trans = parsl_run.table("transitions")
    assert trans[trans["task_key"].str.startswith("boom-")]["to_state"].iloc[-1] == "failed"


def test_transitions_carry_every_state_change_and_the_analyses_run(parsl_db, parsl_run):
    trans = parsl_run.table("transitions")
    assert len(trans) == _db(parsl_db[0], "SELECT count(*) FROM status")[0][0]
    first = trans.sort_values("ts_ns", kind="stable").drop_duplicates("task_key")
    assert first["from_state"].isna().all() and first["to_state"].eq("pending").all()
    from flowscope.analysis.critical_path import task_graph_paths

    spans = parsl_run.table("spans")
    paths = task_graph_paths(spans[spans["kind"] == "task"], parsl_run.table("dependencies"))
    ids = paths.measured.ids  # the measured path (Parsl's times are observed), from the first task to the last
    assert ids[-1].startswith("total-") and ids[-2].startswith("double-")
    at = spans.set_index("task_key")
    for a, b in zip(ids[:-1], ids[1:]):  # a chain of inputs and of waits for a worker process
        assert at.loc[b, "start_ns"] >= at.loc[a, "end_ns"], (a, b)
    shown = subprocess.run([sys.executable, "-m", "flowscope", "show", str(parsl_run.path), "--json"],
                           capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(shown.stdout)
    assert doc["critical_path"]["measured_ns"] == paths.measured.length_ns


def test_a_truncated_or_foreign_database_is_refused_saying_which_file(parsl_db, tmp_path):
    cut = tmp_path / "cut.db"
    data = parsl_db[0].read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(TraceError, match=r"cut\.db"):
        import_paths([cut], tmp_path / "s1", fmt="parsl")
    empty = tmp_path / "empty.db"
    shutil.copy(parsl_db[0], empty)
    with sqlite3.connect(empty) as c:
        c.execute("DELETE FROM workflow")
    with pytest.raises(TraceError, match=r"empty\.db: no workflow run"):
        import_paths([empty], tmp_path / "s2", fmt="parsl")


def test_the_dashboards_progress_reads_parsls_states_through_the_runs_semantics(parsl_run):
    """The overview's progress and the runs list count a task done, running or erred by the phase its state maps
    to (model/semantics.py ``transitions``), not by Dask's state names: Parsl's exec_done and failed count."""
    import pyarrow.parquet as pq

    from flowscope.analysis.live import LiveRun, pending_segments
    from flowscope.model.schemas import schema
    from flowscope.service.dashboard_routes import _cold_counts

    live = LiveRun(parsl_run.meta, parsl_run.mappings())
    for table, sid, path in pending_segments(parsl_run.path, live):
        live.apply(table, sid, pq.read_table(path, schema=schema(table)))
    progress = live.snapshot()["progress"]
    assert progress == {"work": {"total": 6, "done": 6, "running": 0, "erred": 0},
                        "double": {"total": 6, "done": 6, "running": 0, "erred": 0},
                        "total": {"total": 1, "done": 1, "running": 0, "erred": 0},
                        "boom": {"total": 1, "done": 1, "running": 0, "erred": 1}}
    assert _cold_counts(parsl_run.path, {}) == {"tasks": 14, "done": 14, "warnings": 1}


def test_tasks_by_phase_over_time_are_the_transitions_integrated_per_bin(parsl_run):
    """The resource-utilisation view of the SOMA dissertation (tasks waiting, queued, running over time, against
    the slots and how many are busy), from the run's transitions and timeline: each bin's mean count equals the
    phase intervals' overlap with the bin, integrated here interval by interval."""
    from flowscope.analysis.task_phases import phases_over_time
    from flowscope.model.semantics import state_phases

    bins = 40
    got = phases_over_time(parsl_run, bins=bins)
    assert len(got) == bins and list(got.columns[:5]) == ["start_ns", "end_ns", "waiting", "queued", "running"]
    t = parsl_run.table("transitions").sort_values(["task_key", "ts_ns"], kind="stable")
    phase = state_phases(parsl_run.mappings(), t["to_state"].unique())
    t0, t1 = int(got["start_ns"].iloc[0]), int(got["end_ns"].iloc[-1])
    assert t0 == int(t["ts_ns"].min()) and t1 == int(t["ts_ns"].max())
    edges = np.linspace(0, t1 - t0, bins + 1)
    want = {p: np.zeros(bins) for p in ("waiting", "queued", "running")}
    for _, g in t.groupby("task_key"):
        ts, st = g["ts_ns"].to_numpy() - t0, g["to_state"].to_numpy()  # ns from t0: exact as floats
        for a, b, s in zip(ts[:-1], ts[1:], st[:-1]):  # each state lasts until the task's next one
            p = phase[s]
            if p in want:
                for i in range(bins):
                    lo, hi = edges[i], edges[i + 1]
                    want[p][i] += max(0.0, min(b, hi) - max(a, lo)) / (hi - lo)
    for p, w in want.items():
        assert np.allclose(got[p].to_numpy(), w, atol=1e-6), p
    assert got["running"].max() > 1  # two worker processes ran tasks side by side
    assert (got["slots"] == 2).all()  # the two worker processes
    assert ((got["busy"] >= 0) & (got["busy"] <= 2 + 1e-9)).all() and got["busy"].max() > 1


def test_the_report_of_a_parsl_run_draws_its_tasks_by_state(parsl_run, tmp_path):
    from test_report import open_view

    from flowscope.report import write_report

    html = write_report(parsl_run, tmp_path / "report.html")
    with open_view(html, "charts") as (page, _console, errors):  # the charts page of the pages file
        got = page.evaluate("""() => {
          const s = document.querySelector('section#ch-task-states'), gd = s.querySelector('.js-plotly-plot');
          return {nodata: s.querySelectorAll('p.nodata').length,
                  traces: gd ? gd._fullData.map(t => [t.name, Array.from(t.y).filter(v => v > 0).length]) : null};
        }""")
        assert not errors, errors
    assert got["nodata"] == 0 and got["traces"] is not None
    traces = dict(got["traces"])
    assert set(traces) == {"tasks running", "tasks queued", "tasks waiting", "slots busy", "slots (2)"}
    assert traces["tasks running"] > 0 and traces["slots busy"] > 0 and traces["tasks queued"] > 0


def test_the_resource_monitors_samples_are_the_worker_processes_metrics(parsl_db, parsl_run):
    """Parsl's resource table (psutil samples of the worker process around each try) becomes hardware metrics of
    the process that ran it: resident memory as every source writes it (process.memory.rss_bytes, which the memory
    analyses read) and the process's CPU seconds."""
    from flowscope.model.semantics import PROCESS_MEMORY

    rows = _db(parsl_db[0], """SELECT timestamp, psutil_process_pid, psutil_process_memory_resident,
                                      psutil_process_time_user + psutil_process_time_system FROM resource""")
    m = parsl_run.sql("SELECT m.*, r.pid FROM metrics m JOIN resources r ON r.resource_id = m.resource_id "
                      "WHERE m.namespace = 'hardware'")
    import pandas as pd

    for name, col in ((PROCESS_MEMORY, 2), ("process.cpu.seconds", 3)):
        got = m[m["name"] == name]
        assert len(got) == len(rows), name
        want = sorted((pd.Timestamp(r[0], tz="UTC").value, int(r[1]), float(r[col])) for r in rows)
        assert sorted(zip(got["ts_ns"].astype(int), got["pid"].astype(int), got["value"].astype(float))) == want, name


def test_the_advisor_splits_the_lead_in_at_parsls_first_submission(parsl_db, parsl_run):
    """A Parsl run's lead-in is the client's only until the first task was submitted (a graph-submitted log at
    the first task's invocation), the scheduler's after: the executor's start is not the client's work. Which of
    the two is longer depends on the machine's load, so only the split is checked."""
    import pandas as pd

    from flowscope.analysis.advisor.attribution import attribute
    from flowscope.analysis.advisor.facts import run_facts

    facts = run_facts(parsl_run)
    first = min(pd.Timestamp(r[0], tz="UTC").value for r in _db(parsl_db[0], "SELECT task_time_invoked FROM task"))
    assert list(facts.submissions["ts_ns"]) == [first]
    a = attribute(facts).set_index("category")["seconds"]
    assert a["client_submission"] == pytest.approx((first - facts.wall_start_ns) / 1e9, abs=1e-9)
    assert a["scheduler_overhead"] >= (facts.task_start_ns - first) / 1e9 - 1e-9
