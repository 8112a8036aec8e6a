"""`flowscope run -- python script.py` on a script that knows nothing of flowscope."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import flowscope

SCRIPT = textwrap.dedent('''
    import sys
    from dask import delayed
    from distributed import Client, LocalCluster

    def inc(x):
        return x + 1

    if __name__ == "__main__":
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cl, \\
                Client(cl) as c:
            xs = [delayed(inc)(i, dask_key_name=f"inc-{i}") for i in range(20)]
            total = delayed(sum)(xs, dask_key_name="total")
            assert c.compute(total).result() == 210
        sys.exit(int(sys.argv[1]))
''')


def _run(tmp_path, code: int) -> subprocess.CompletedProcess:
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSCOPE_", "DASK_"))}
    return subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(tmp_path / "store"),
                           "--no-report", "--sample-period", "0.2", "--", sys.executable, "script.py", str(code)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_an_unmodified_dask_script_produces_a_complete_run(tmp_path):
    res = _run(tmp_path, 0)
    assert res.returncode == 0, res.stderr
    [meta] = json.loads(subprocess.run([sys.executable, "-m", "flowscope", "runs", str(tmp_path / "store"), "--json"],
                                       capture_output=True, text=True).stdout)
    run = flowscope.open_run(meta["path"])
    assert meta["status"] == "finished" and "script.py" in meta["command"]
    tasks = run.sql("SELECT task_key FROM spans WHERE kind = 'task'")["task_key"]
    assert sorted(tasks) == sorted([f"inc-{i}" for i in range(20)] + ["total"])
    deps = run.sql("SELECT task_key, depends_on FROM dependencies")
    assert sorted(zip(deps["task_key"], deps["depends_on"])) == sorted(("total", f"inc-{i}") for i in range(20))
    done = run.sql("""SELECT count(DISTINCT task_key) AS n FROM transitions
                      WHERE observer = 'scheduler' AND to_state = 'memory'""")
    assert int(done["n"][0]) == 21
    workers = run.sql("SELECT count(*) AS n FROM resources WHERE kind = 'worker'")
    assert int(workers["n"][0]) == 2
    step = run.sql("SELECT name, attrs FROM spans WHERE kind = 'step'")
    assert step["name"].tolist() == [os.path.basename(sys.executable)]
    assert json.loads(step["attrs"][0])["exit_code"] == 0


def test_the_exit_status_is_the_commands(tmp_path):
    res = _run(tmp_path, 3)
    assert res.returncode == 3, res.stderr
    [meta] = json.loads(subprocess.run([sys.executable, "-m", "flowscope", "runs", str(tmp_path / "store"), "--json"],
                                       capture_output=True, text=True).stdout)
    assert meta["status"] == "failed"


def test_a_command_that_cannot_start_is_one_clear_line(tmp_path):
    """... and leaves nothing behind: the hardware sampler it started is stopped and its host lease let go (the
    lock file named after the run removed), as when a command ends."""
    locks = tmp_path / "locks"
    res = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(tmp_path), "--no-report", "--",
                          "no-such-program-xyz"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FLOWSCOPE_LOCK_DIR": str(locks)})
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == ["flowscope run: error: cannot start 'no-such-program-xyz': "
                                               "No such file or directory"]
    assert locks.is_dir() and list(locks.iterdir()) == []  # the lease was taken, then let go
