"""Dask's local schedulers (threads, processes, synchronous) observed through Dask's callbacks: by `flowscope run`
on an unmodified script, and by `flowscope.observe()` with no Client."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import flowscope
from flowscope.analysis.critical_path import task_graph_paths
from flowscope.report import write_report

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dask_local_workload as workload  # noqa: E402  (the script the runs execute, importable for observe())
from test_dashboard import WAIT_MS, browser  # noqa: E402,F401  (fixture)

SCHEDULERS = ("threads", "processes", "sync")


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSCOPE_", "DASK_"))}


def flowscope_run(tmp_path: Path, scheduler: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """`flowscope run -- python dask_local_workload.py SCHEDULER OUT FILES`: (process, what the script saw, run dir)."""
    out, files = tmp_path / "seen.json", tmp_path / "files"
    files.mkdir(exist_ok=True)
    store = tmp_path / "store"
    res = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(store), *extra, "--",
                          sys.executable, str(HERE / "dask_local_workload.py"), scheduler, str(out), str(files)],
                         cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    [run_dir] = [p for p in store.iterdir() if p.is_dir()]
    return res, json.loads(out.read_text()), run_dir


_FINALIZE = re.compile(r"finalizecompute-[0-9a-f]+")


def norm(key: str) -> str:
    """A task key without the token of ``dask.compute``'s finalize step, which is new at every compute call (the
    script's copy of the graph and the one it ran differ only there)."""
    return _FINALIZE.sub("finalizecompute-*", key)


def check_run(run, seen: dict, scheduler: str) -> None:
    """The run holds what the script really did: every task once, on the thread and process that ran it, with
    the graph's dependencies."""
    expected = Counter(norm(k) for g in seen["graphs"] for k in g["tasks"])
    spans = run.sql("""SELECT s.task_key, s.name, s.start_ns, s.end_ns, s.attrs, r.kind AS rkind, r.pid, r.tid,
                              r.parent_id FROM spans s LEFT JOIN resources r USING (resource_id)
                       WHERE s.kind = 'task'""")
    assert Counter(map(norm, spans["task_key"])) == expected  # every task exactly once
    assert (spans["start_ns"] <= spans["end_ns"]).all()
    assert (spans["rkind"] == "thread").all(), "every span is on a declared thread resource"

    # on the very process and OS thread the task itself reported
    truth = {r["key"]: (r["pid"], r["tid"]) for r in seen["records"]}
    on = {k: (int(p), int(t)) for k, p, t in zip(spans["task_key"], spans["pid"], spans["tid"])}
    for key, where in truth.items():
        assert on[key] == where, (key, on[key], where)
    pids = {int(p) for p in spans["pid"]}
    if scheduler == "processes":
        assert seen["main_pid"] not in pids, "tasks ran in worker processes, not in the script's"
        procs = run.sql("SELECT resource_id, pid, parent_id FROM resources WHERE kind = 'process'")
        child = procs[procs["pid"].isin(pids)]
        assert set(child["pid"]) == pids and (child["parent_id"].str.startswith("process:")).all(), \
            "each worker process is declared, nested in the scheduler's process"
    else:
        assert pids == {seen["main_pid"]}
        tids = {int(t) for t in spans["tid"]}
        if scheduler == "sync":
            assert tids == {seen["main_tid"]}
        else:
            assert seen["main_tid"] not in tids, "the threaded scheduler runs tasks on its pool's threads"
    attrs = [json.loads(a) for a in spans["attrs"]]
    assert {a["scheduler"] for a in attrs} == {scheduler}
    assert all(a["nbytes"] > 0 for a in attrs), "result sizes are recorded"
    groups = dict(zip(spans["task_key"], [a["group"] for a in attrs]))
    assert groups["load-3"] == "load" and spans.set_index("task_key").loc["combine-2", "name"] == "combine"

    # dependencies equal Dask's own graph of each computation
    deps = run.sql("SELECT task_key, depends_on FROM dependencies")
    assert Counter((norm(a), norm(b)) for a, b in zip(deps["task_key"], deps["depends_on"])) == \
        Counter((norm(a), norm(b)) for g in seen["graphs"] for a, b in g["edges"])
    graphs = run.sql("SELECT count(DISTINCT graph_id) AS n FROM dependencies")
    assert int(graphs["n"][0]) == 2

    # per-task I/O: the bytes the write task wrote, on the thread that ran it, attributed to it
    if "written" in seen:
        io = run.sql("""SELECT task_key, source, op, nbytes, tid, pid, path FROM io
                        WHERE task_key = 'write'""")
        wrote = io[(io["source"] == "proc-io") & (io["op"] == "write")]
        assert len(wrote) == 1 and int(wrote["nbytes"].iloc[0]) >= seen["written"]["write"]
        # the default level, standard: a task of 1 ms or more is read at its own end, and the tasks before it on
        # its thread (5 ms each) were read at theirs
        assert groups and json.loads(spans.set_index("task_key").loc["write", "attrs"])["io"] == "own"
        assert json.loads(run.sql("SELECT attrs FROM io WHERE task_key = 'write' AND source = 'proc-io' "
                                  "AND op = 'write'")["attrs"][0])["tasks"] == 1
        assert (int(wrote["pid"].iloc[0]), int(wrote["tid"].iloc[0])) == truth["write"]
        opens = io[(io["source"] == "audit") & (io["op"] == "open")]
        assert any(str(p).endswith("out.bin") for p in opens["path"]), "the file the task opened"
        other = run.sql("""SELECT sum(nbytes) AS b FROM io WHERE source = 'proc-io' AND op = 'write'
                           AND task_key <> 'write'""")
        assert not (other["b"].iloc[0] or 0) >= seen["written"]["write"], "the write is not charged to other tasks"


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_flowscope_run_records_an_unmodified_script_on_a_local_scheduler(tmp_path, scheduler):
    res, seen, run_dir = flowscope_run(tmp_path, scheduler, "--no-report", "--sample-period", "0.2")
    run = flowscope.open_run(run_dir)
    assert run.meta["status"] == "finished"
    check_run(run, seen, scheduler)
    n = sum(len(g["tasks"]) for g in seen["graphs"])
    assert f"{n} tasks" in res.stderr + res.stdout
    assert "0 tasks" not in res.stderr + res.stdout
    cpu = run.sql("SELECT count(*) AS n FROM metrics WHERE name = 'cpu.percent'")
    assert int(cpu["n"][0]) >= 2, "the hardware sampler ran beside the command"


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_observe_without_a_client_records_local_scheduler_tasks(tmp_path, scheduler):
    files = tmp_path / "files"
    files.mkdir()
    out = tmp_path / "seen.json"
    with flowscope.observe(store=tmp_path / "store", name=f"local-{scheduler}") as obs:
        workload.main(scheduler, str(out), str(files))
    assert obs.hook_errors == {"local": 0}, obs.hook_errors
    run = obs.run
    assert run.meta["status"] == "finished" and run.meta["name"] == f"local-{scheduler}"
    check_run(run, json.loads(out.read_text()), scheduler)


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_rows_written_while_graphs_run_are_written_once(tmp_path, monkeypatch, scheduler):
    """Rows go out every second while a graph runs (and at its end): with a flush after every task, each
    task, each I/O row and each opened file is still recorded once."""
    from flowscope.sources.dask import local

    monkeypatch.setattr(local, "FLUSH_SECONDS", 0.0)
    files = tmp_path / "files"
    files.mkdir()
    out = tmp_path / "seen.json"
    with flowscope.observe(store=tmp_path / "store") as obs:
        workload.main(scheduler, str(out), str(files))
    assert obs.hook_errors == {"local": 0}
    check_run(obs.run, json.loads(out.read_text()), scheduler)
    opens = obs.run.sql("SELECT count(*) AS n FROM io WHERE source = 'audit' AND path LIKE '%out.bin'")
    assert int(opens["n"][0]) == 1


def test_observe_records_nothing_after_its_block_and_each_block_is_a_whole_run(tmp_path):
    import dask
    from dask import delayed

    runs = []
    for block in ("first", "second"):  # the same pool threads run the tasks of both blocks
        with flowscope.observe(store=tmp_path / "store") as obs:
            assert delayed(sum)([1, 2], dask_key_name=block).compute(scheduler="threads") == 3
        assert not dask.callbacks.Callback.active, "the callback is removed when the block ends"
        runs.append(obs.run)
    assert delayed(sum)([1, 2], dask_key_name="after").compute(scheduler="threads") == 3
    for run, block in zip(runs, ("first", "second")):
        spans = run.sql("""SELECT s.task_key, r.kind, r.tid FROM spans s LEFT JOIN resources r USING (resource_id)
                           WHERE s.kind = 'task'""")
        assert list(spans["task_key"]) == [block]
        assert list(spans["kind"]) == ["thread"] and spans["tid"].notna().all(), "its thread is declared in each run"


def test_a_failing_task_is_recorded_as_an_error_span_and_the_exception_reaches_the_caller(tmp_path):
    from dask import delayed

    def boom(x):
        raise ZeroDivisionError(f"secret {x}")

    with flowscope.observe(store=tmp_path / "store") as obs:
        with pytest.raises(ZeroDivisionError, match="secret 1"):
            delayed(boom)(delayed(abs)(-1, dask_key_name="abs"), dask_key_name="boom").compute(scheduler="threads")
    spans = obs.run.sql("SELECT task_key, attrs FROM spans WHERE kind = 'task' ORDER BY task_key")
    assert list(spans["task_key"]) == ["abs", "boom"]
    states = {k: json.loads(a)["state"] for k, a in zip(spans["task_key"], spans["attrs"])}
    assert states == {"abs": "memory", "boom": "erred"}
    err = obs.run.sql("SELECT task_key, attrs FROM logs WHERE category = 'task-error'")
    assert list(err["task_key"]) == ["boom"] and json.loads(err["attrs"][0])["exception_type"] == "ZeroDivisionError"
    assert "secret" not in obs.run.sql("SELECT string_agg(message, ' ') AS m FROM logs")["m"][0]


def test_the_report_of_a_local_run_draws_the_task_stream_and_the_critical_path(tmp_path, browser):  # noqa: F811
    """`flowscope run` writes the run's report (its dashboard pages, opened from disk): the overview's stream has
    every task, and the critical-path page shows what the analysis computes."""
    from test_dashboard_pages import check_critical_path_page
    from test_run_pages_offline import _open

    _, seen, run_dir = flowscope_run(tmp_path, "threads", "--sample-period", "0.2")
    run = flowscope.open_run(run_dir)
    path = run_dir / "report.html"
    assert path.is_file(), "flowscope run writes the report"
    tasks = int(run.sql("SELECT count(*) AS n FROM activity WHERE role = 'task'")["n"].iloc[0])
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _open(context, path.as_uri())
    pg.wait_for_function(f"() => {{ const s = window.flowscopeLive && flowscopeLive.summary(); return s && "
                         f"s.status === 'finished' && s.stream >= {tasks}; }}", timeout=WAIT_MS)
    assert pg.evaluate("() => flowscopeLive.summary().stream") == tasks
    text = pg.locator("body").inner_text()
    for group in ("load", "combine", "write"):
        assert group in text, group
    cp = _open(context, f"{path.as_uri()}#critical-path")
    cp.wait_for_function("() => window.flowscopeView && flowscopeView.doc", timeout=WAIT_MS)
    exp = check_critical_path_page(cp, run_dir)
    assert exp["task"] is not None, "a measured critical path"
    assert pg.errors == [] and cp.errors == [] and pg.outside == [] and cp.outside == []
    context.close()
    spans = run.table("spans")
    tp = task_graph_paths(spans[spans["kind"] == "task"], run.table("dependencies"), run.table("transfers"))
    # the structural path is a chain of the graph's own edges
    edges = {(norm(a), norm(b)) for g in seen["graphs"] for a, b in g["edges"]}
    chain = [norm(k) for k in tp.structural.steps["id"] if k in set(spans["task_key"])]
    assert len(chain) >= 3 and all((b, a) in edges for a, b in zip(chain, chain[1:])), chain
    assert write_report(run) == path


_NO_PANDAS_SCRIPT = """
import json, sys
import dask
from dask.threaded import get


def inc(x):
    return x + 1


dsk = {("inc", i): (inc, i) for i in range(300)}
dsk["total"] = (sum, [("inc", i) for i in range(300)])
before = "pandas" in sys.modules
if sys.argv[1] == "observe":
    from flowscope.sources.dask import observe

    with observe(store=sys.argv[2], hardware_period=0.05) as obs:
        assert get(dsk, "total") == sum(range(1, 301))
        assert get(dsk, "total") == sum(range(1, 301))
    run_dir = str(obs.run_dir)
else:  # under flowscope run: the capture is flowscope's, loaded at start; it writes its last rows at exit
    assert get(dsk, "total") == sum(range(1, 301))
    assert get(dsk, "total") == sum(range(1, 301))
    run_dir = None
print(json.dumps({"before": before, "after": "pandas" in sys.modules, "run_dir": run_dir,
                  "unused": [m for m in ("pyarrow.parquet", "flowscope.client.redis_transport", "redis")
                             if m in sys.modules]}))
"""


@pytest.mark.parametrize("how", ["observe", "flowscope run"])
def test_an_observed_process_that_never_imported_pandas_does_not_import_it(tmp_path, how):
    """pyarrow imports pandas (0.24 s, ~29,000 objects the garbage collector then walks at every full collection)
    the first time it converts Python objects or a numpy array; the capture builds its batches without that, so
    a user's process that did not load pandas does not get it from being observed. Nor does it get what only other
    paths use: Parquet (the collector, another process, writes the segments) and the Redis transport (no Redis
    address given). The rows are all there (under flowscope run the last ones are written at the script's exit)."""
    store = tmp_path / "store"
    script = tmp_path / "no_pandas.py"
    script.write_text(_NO_PANDAS_SCRIPT)
    cmd = [sys.executable, str(script), "observe", str(store)]
    if how == "flowscope run":
        cmd = [sys.executable, "-m", "flowscope", "run", "--store", str(store), "--sample-period", "0.05", "--",
               sys.executable, str(script), "run"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    assert got["before"] is False and got["after"] is False
    assert got["unused"] == []
    run = flowscope.open_run(got["run_dir"] or next(p for p in store.iterdir() if p.is_dir()))
    spans = run.sql("SELECT task_key, attrs FROM spans WHERE kind = 'task'")
    assert len(spans) == 2 * 301 and spans["task_key"].value_counts().max() == 2
    assert int(run.sql("SELECT count(*) AS n FROM dependencies")["n"][0]) == 2 * 300
    assert all(json.loads(a)["nbytes"] > 0 for a in spans["attrs"])
    assert int(run.sql("SELECT count(*) AS n FROM metrics")["n"][0]) > 0  # the hardware sampler's rows too


@pytest.mark.parametrize("compiled", ["1", "0"])
def test_a_spool_folder_is_made_only_when_worker_processes_run_tasks(tmp_path, monkeypatch, compiled):
    """The processes scheduler's worker processes append their measurements to a spool folder under a temporary
    one. A graph run by threads makes none (a process killed while it ran would leave it behind), and the one made
    for worker processes is removed when observing ends."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("FLOWSCOPE_COMPILED", compiled)
    files = tmp_path / "files"
    files.mkdir()

    def spools() -> list[str]:
        return sorted(p.name for p in tmp.iterdir() if p.name.startswith("flowscope-local-"))

    seen = {}
    with flowscope.observe(store=tmp_path / "store") as obs:
        workload.main("threads", str(tmp_path / "threads.json"), str(files))
        seen["threads"] = spools()
        workload.main("processes", str(tmp_path / "processes.json"), str(files))
        seen["processes"] = len(spools())
    seen["after"] = spools()
    assert obs.hook_errors == {"local": 0} and obs.local_compiled == (compiled == "1")
    assert seen == {"threads": [], "processes": 1, "after": []}
    # the worker processes' measurements came through the spool: no task kept the scheduler's view of its times
    by = obs.run.sql("""SELECT json_extract_string(attrs, '$.timing') AS timing, count(*) AS n FROM spans
                        WHERE kind = 'task' AND json_extract_string(attrs, '$.scheduler') = 'processes'
                        GROUP BY timing""")
    assert by["timing"].isna().all() and int(by["n"].sum()) > 0, by
