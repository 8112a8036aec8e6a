"""What a run tells its reader beyond the tasks: why it holds none (instead of a table of zeros), a hardware
curve that covers the whole run, and I/O time shown as unknown where only byte counters exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from conftest import require_module

import flowscope
from flowscope.analysis.breakdown import breakdown
from flowscope.report import write_report

HERE = Path(__file__).resolve().parent


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSCOPE_", "DASK_"))}


def flowscope_run(tmp_path: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess, flowscope.Run]:
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    store = tmp_path / "store"
    res = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(store), "--sample-period", "0.2",
                          "--", sys.executable, "script.py", *args],
                         cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    [run_dir] = [p for p in store.iterdir() if p.is_dir()]
    return res, flowscope.open_run(run_dir)


def show(run) -> tuple[str, dict]:
    text = subprocess.run([sys.executable, "-m", "flowscope", "show", str(run.path)], capture_output=True,
                          text=True, timeout=120, env=_clean_env())
    js = subprocess.run([sys.executable, "-m", "flowscope", "show", str(run.path), "--json"], capture_output=True,
                        text=True, timeout=120, env=_clean_env())
    assert text.returncode == 0 and js.returncode == 0, text.stderr + js.stderr
    return text.stdout, json.loads(js.stdout)


def report_text(run) -> str:
    """What the run's report (its pages file) shows on the advisor page (the run's explanation) and the profile
    page (where the time went), drawn by the dashboard's scripts in headless Chromium."""
    from test_report import view_text

    path = write_report(run)
    out = []
    for view in ("advisor", "profile"):
        text, errors = view_text(path, view)
        assert not errors, errors
        out.append(text)
    return "\n".join(out)


def why_nothing_observed(run):
    from flowscope.analysis.nothing_observed import why_nothing_observed

    return why_nothing_observed(run)


def _codes(run) -> list[str]:
    return [r.code for r in why_nothing_observed(run)]


# ---- 2. a run with no tasks says why -----------------------------------------------------------------------

def test_a_script_that_uses_no_dask_is_explained_everywhere(tmp_path):
    res, run = flowscope_run(tmp_path, """
        import json, sys
        print(json.dumps({"answer": sum(range(10))}))
    """)
    out = res.stdout + res.stderr
    assert "0 tasks" not in out and "makespan 0" not in out, out
    assert "No Dask scheduler was used" in out and "imported dask" in out, out
    assert _codes(run) == ["no-dask"]
    text, js = show(run)
    assert "No Dask scheduler was used" in text
    assert [r["code"] for r in js["nothing_observed"]] == ["no-dask"]
    page = report_text(run)
    assert "No Dask scheduler was used" in page and "--trace" in page


def test_a_command_whose_python_cannot_import_flowscope_is_explained(tmp_path):
    """The command runs another interpreter (here the one this virtual environment was made from), which
    honours PYTHONPATH but has no flowscope installed."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    if not base.exists() or subprocess.run([str(base), "-c", "import flowscope"], capture_output=True,
                                           env=_clean_env()).returncode == 0:
        pytest.skip(f"no Python without flowscope at {base}")
    (tmp_path / "script.py").write_text("print(6 * 7)\n")
    store = tmp_path / "store"
    res = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(store), "--no-report", "--",
                          str(base), "script.py"], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "42" in res.stdout, res.stderr
    assert f"{base} cannot import flowscope" in res.stderr
    [run_dir] = [p for p in store.iterdir() if p.is_dir()]
    assert _codes(flowscope.open_run(run_dir)) == ["no-flowscope"]
    assert "cannot import flowscope" in res.stdout + res.stderr and "Install flowscope" in res.stdout + res.stderr


def test_a_script_that_forks_its_workers_is_explained(tmp_path):
    res, run = flowscope_run(tmp_path, """
        import multiprocessing
        import dask  # a Dask user, whose work happens in forked processes nonetheless

        def square(x):
            return x * x

        if __name__ == "__main__":
            with multiprocessing.get_context("fork").Pool(2) as pool:
                assert sum(pool.map(square, range(10))) == 285
    """)
    out = res.stdout + res.stderr
    assert "forked 2 processes without exec" in out, out
    assert "spawn" in out
    assert "forked" in _codes(run)


def test_a_script_that_computes_on_a_cluster_started_outside_flowscope_run_is_explained(tmp_path):
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", dashboard_address=":0") as cluster:
        res, run = flowscope_run(tmp_path, """
            import sys
            from dask import delayed
            from distributed import Client

            with Client(sys.argv[1]) as client:
                assert delayed(sum)([1, 2, 3]).compute() == 6
        """, cluster.scheduler_address)
        address = cluster.scheduler_address
    out = res.stdout + res.stderr
    assert f"The work went to the Dask cluster at {address}" in out, out
    assert "--preload flowscope.dask" in out
    assert _codes(run) == ["unobserved-cluster"]
    assert f"The work went to the Dask cluster at {address}" in report_text(run)


def test_observe_without_a_client_while_a_distributed_client_computes_warns_why(tmp_path):
    from dask import delayed
    from flowscope.sources.dask import NothingObservedWarning
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        with pytest.warns(NothingObservedWarning, match="pass it|Pass the client") as rec:
            with flowscope.observe(store=tmp_path / "store") as obs:
                assert delayed(sum)([1, 2, 3]).compute() == 6  # goes to the default client, not a local scheduler
        address = client.scheduler.address
    assert address in str(rec[0].message) and "before observe()" in str(rec[0].message)
    assert [r.code for r in obs.nothing_observed] == ["unobserved-cluster"]
    assert "unobserved-cluster" in _codes(obs.run)


def test_observe_with_nothing_computed_warns_and_a_block_with_tasks_does_not(tmp_path):
    from dask import delayed
    from flowscope.sources.dask import NothingObservedWarning

    with pytest.warns(NothingObservedWarning, match="No Dask scheduler was used"):
        with flowscope.observe(store=tmp_path / "store"):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error", NothingObservedWarning)
        with flowscope.observe(store=tmp_path / "store") as obs:
            delayed(sum)([1, 2]).compute(scheduler="sync")
    assert obs.nothing_observed == [] and why_nothing_observed(obs.run) == []


def test_observe_of_a_cluster_that_computed_nothing_says_so(tmp_path):
    from dask import delayed
    from distributed import Client, LocalCluster

    from flowscope.sources.dask import NothingObservedWarning

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", dashboard_address=":0") \
            as cluster, Client(cluster) as client:
        with pytest.warns(NothingObservedWarning, match="Nothing ran on the Dask cluster") as rec:
            with flowscope.observe(client, store=tmp_path / "store") as obs:
                assert delayed(sum)([1, 2]).compute(scheduler="sync") == 3  # not on the cluster
        assert client.scheduler.address in str(rec[0].message)
    assert [r.code for r in obs.nothing_observed] == ["no-graph"]
    assert "without a client" in obs.nothing_observed[0].what_to_do


def test_a_run_with_work_is_not_explained_away(tmp_path):
    fs = flowscope.Client("embedded", store=tmp_path / "store", name="work")
    fs.span("solve", 1, 2, kind="call")
    fs.close()
    run = flowscope.open_run(fs.run_dir)
    assert why_nothing_observed(run) == []
    _, js = show(run)
    assert js["nothing_observed"] == []


# ---- 3. the hardware sampler covers the run from its start ---------------------------------------------------

def test_the_hardware_sampler_samples_soon_after_it_starts_and_once_more_when_it_stops(tmp_path):
    from flowscope.sources.hardware import HardwareSampler

    fs = flowscope.Client("embedded", store=tmp_path / "store", name="hw")
    sampler = HardwareSampler(fs, period=60.0).start()
    deadline = time.monotonic() + 20  # far less than the period: the first sample does not wait for it
    while sampler.samples < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sampler.samples == 1, "a first sample well before the first period ends"
    time.sleep(0.2)
    sampler.stop(timeout=10)
    assert sampler.samples == 2, "and one more at the end"
    fs.close()
    cpu = flowscope.open_run(fs.run_dir).sql("SELECT ts_ns FROM metrics WHERE name = 'cpu.percent' ORDER BY ts_ns")
    assert len(cpu) == 2


def test_a_short_local_run_has_cpu_samples_before_its_first_task_ends_and_after_its_last(tmp_path):
    from dask import delayed

    def slow(i):
        time.sleep(0.4)
        return i

    with flowscope.observe(store=tmp_path / "store", hardware_period=30.0) as obs:
        assert delayed(sum)([delayed(slow)(i) for i in range(2)]).compute(scheduler="sync") == 1
    run = obs.run
    span = run.sql("SELECT min(start_ns) AS t0, max(end_ns) AS t1 FROM spans WHERE kind = 'task'").iloc[0]
    cpu = run.sql("SELECT ts_ns FROM metrics WHERE name = 'cpu.percent' ORDER BY ts_ns")["ts_ns"]
    assert len(cpu) >= 2
    assert cpu.iloc[-1] >= span["t1"], "a sample when the run ends"
    assert cpu.iloc[0] <= span["t1"], "the curve starts while the tasks run, not a period later"


# ---- 4. I/O time is unknown where only byte counters exist ---------------------------------------------------

def test_io_time_is_unknown_when_only_byte_counters_exist(tmp_path):
    """A task that wrote a file, recorded the way the per-task capture records it: the thread's /proc counters
    before and after (bytes, no time), and the open the audit hook saw."""
    import threading

    from flowscope.model import identifiers as ids
    from flowscope.sources.thread_io import OpenAudit, io_rows, read_thread_io

    fs = flowscope.Client("embedded", store=tmp_path / "store", name="io")
    tid = threading.get_native_id()
    t0, before = time.time_ns(), read_thread_io(tid)
    with OpenAudit(lambda row: fs.emit("io", **{**row, "task_key": "write-1"})):
        with open(tmp_path / "out.bin", "wb") as f:
            f.write(b"x" * 100_000)
    after, t1 = read_thread_io(tid), time.time_ns()
    fs.span("write", t0, t1, kind="task", task_key="write-1", resource_id=ids.thread_id(tid))
    for row in io_rows(after - before, tid=tid, start_ns=t0, end_ns=t1, task_key="write-1"):
        fs.emit("io", **row)
    fs.close()
    run = flowscope.open_run(fs.run_dir)
    b = breakdown(run)
    assert b.io_write_bytes >= 100_000
    assert b.io_s is None, "bytes from counters, no time"
    row = b.to_frame().set_index("category").loc["io"]
    assert row["seconds"] is None or row["seconds"] != row["seconds"]
    from test_report import open_view

    page = report_text(run)
    section = page[page.index("Where the time went"):]
    assert "unknown" in section and "Darshan" in section, section[:600]
    # the I/O row of the profile page's breakdown: bytes, and its time unknown (not 0)
    with open_view(write_report(run), "profile") as (pg, _console, errors):
        io = pg.evaluate("() => { const tr = document.querySelector('table.breakdown tr[data-category=\"io\"]'); "
                         "return [tr.querySelector('td.seconds').textContent, tr.querySelector('td.seconds').dataset.value, "
                         "Number(tr.querySelector('td.bytes').dataset.value)]; }")
        assert not errors, errors
    assert io[0] == "unknown" and io[1] is None and io[2] >= 100_000
    from flowscope.cli.output import console
    from flowscope.cli.summary import print_run_summary

    with console.capture() as cap:
        print_run_summary(run)
    assert "I/O time unknown" in cap.get(), cap.get()


def test_io_time_from_darshan_dxt_is_timed(shared_data, tmp_path):
    require_module("darshan", "PyDarshan reads Darshan logs: pip install -e '.[test]'")
    from flowscope.importers import import_paths

    log = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    res = import_paths([log], tmp_path / "store")
    b = breakdown(flowscope.open_run(res.run_dir))
    assert b.io_s is not None and b.io_s > 0
