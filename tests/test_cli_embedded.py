"""The command line and the embedded (single-machine) default."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import flowscope
from flowscope import Client
from flowscope.cli.main import build_parser

COMMANDS = ["demo", "run", "step", "simulate", "serve", "monitor", "ui", "runs", "show", "sql", "report", "explain", "lineage", "compare",
            "profile", "anomalies", "analyse", "forecast", "io", "semantics", "import", "export", "ingest-spool", "rm"]
ALIASES = {"analyze": "analyse"}


def fs(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowscope", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=cwd)


#: every command's --help through the command line's entry point, in one fresh interpreter (a process per command
#: cost a second each, most of it imports): {command: [exit code, what it printed]}
HELP_OF_EACH = """
import contextlib, io, json, sys
from flowscope.cli.main import main
out = {}
for cmd in sys.argv[1:]:
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = main([cmd, "--help"])
    except SystemExit as exc:
        code = exc.code
    out[cmd] = [code, printed.getvalue()]
print(json.dumps(out))
"""


def test_help_everywhere():
    assert fs("--help").returncode == 0
    assert "usage: flowscope run" in fs("run", "--help").stdout
    parser_commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert parser_commands == set(COMMANDS) | set(ALIASES)
    res = subprocess.run([sys.executable, "-c", HELP_OF_EACH, *COMMANDS, *ALIASES], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    helps = json.loads(res.stdout)
    assert set(helps) == set(COMMANDS) | set(ALIASES)
    for cmd, (code, printed) in helps.items():
        assert code in (0, None) and "usage: flowscope " + ALIASES.get(cmd, cmd) in printed, (cmd, code, printed[:200])


def test_demo_records_a_dask_run_that_runs_show_and_sql_read(tmp_path):
    store = tmp_path / "store"
    res = fs("demo", "--store", str(store), "--images", "6", "--size", "96")
    assert res.returncode == 0, res.stderr
    assert "image pipeline: 6 images" in res.stdout and "slowest task groups" in res.stdout
    runs = json.loads(fs("runs", str(store), "--json").stdout)
    assert len(runs) == 1 and runs[0]["status"] == "finished" and runs[0]["name"] == "demo"
    run_id = runs[0]["run_id"]
    show = json.loads(fs("show", "latest", "--store", str(store), "--json").stdout)
    # 6 x (generate, read, normalise, grayscale, gaussian, segment, write) + 2 batch means + summarise
    assert show["run_id"] == run_id
    q = fs("sql", run_id, "SELECT name, count(*) AS n FROM spans WHERE kind = 'task' GROUP BY 1 ORDER BY 1",
           "--store", str(store), "--json")
    assert q.returncode == 0, q.stderr
    counts = {r["name"]: r["n"] for r in json.loads(q.stdout)}
    assert counts == {"batch-mean": 2, "generate": 6, "gaussian": 6, "grayscale": 6, "normalise": 6, "read": 6,
                      "segment": 6, "summarise": 1, "write": 6}
    csv = fs("sql", str(store / run_id), "SELECT count(DISTINCT task_key) AS n FROM dependencies", "--csv")
    assert csv.stdout.split() == ["n", str(6 * 6 + 2 + 1)]  # every task but the generators has inputs


@pytest.mark.parametrize("args, words", [
    (["sql", "/nonexistent", "SELECT 1"], "not a run directory"),
    (["runs", "/nonexistent"], "no such store directory"),
    (["ingest-spool", "/nonexistent"], "no such spool directory"),
])
def test_errors_are_one_line_and_nonzero(args, words):
    res = fs(*args)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"flowscope {args[0]}: error:") and words in lines[0]


def _small_run(store) -> None:
    with Client(store=store, name="small") as c:
        c.span("x", 1, 2)


def test_bad_sql_is_one_line(tmp_path):
    _small_run(tmp_path)
    res = fs("sql", "latest", "SELEC nonsense", "--store", str(tmp_path))
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "query failed" in res.stderr


def test_sql_output_keeps_types_and_writes_nulls_as_null(tmp_path):
    _small_run(tmp_path)
    q = "SELECT 1 AS a, 2.5 AS b, NULL::DOUBLE AS c, 'nan'::DOUBLE AS d, NULL::BIGINT AS e"
    rows = json.loads(fs("sql", "latest", q, "--store", str(tmp_path), "--json").stdout)
    assert rows == [{"a": 1, "b": 2.5, "c": None, "d": None, "e": None}]
    table = fs("sql", "latest", q, "--store", str(tmp_path)).stdout
    assert "│ 1 " in table and "1.0" not in table and "nan" not in table.lower().replace("'nan'", "")


def test_demo_ignores_a_remote_collector_in_the_environment(tmp_path):
    res = fs("demo", "--store", str(tmp_path), "--images", "2", "--size", "64", "--no-report",
             env={"FLOWSCOPE_ADDRESS": "http://127.0.0.1:9"})
    assert res.returncode == 0, res.stderr


def test_usage_errors_exit_2():
    assert fs("sql").returncode == 2
    assert fs("frobnicate").returncode == 2


def test_embedded_client_with_http_lets_child_processes_join(tmp_path):
    child = (
        "import flowscope\n"
        "c = flowscope.Client()\n"  # FLOWSCOPE_ADDRESS and FLOWSCOPE_RUN from the parent
        "for i in range(1000): c.span('child', i, i + 1)\n"
        "c.close()\n"
    )
    with Client(store=tmp_path / "store", serve=True, name="parent") as parent:
        assert parent.address.startswith("http://127.0.0.1:")
        parent.span("parent", 0, 10)
        res = subprocess.run([sys.executable, "-c", child], env={**os.environ, **parent.env()},
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        run_dir = parent.run_dir
    run = flowscope.open_run(run_dir)
    counts = run.sql("SELECT name, count(*) AS n FROM spans GROUP BY 1 ORDER BY 1")
    assert counts.values.tolist() == [["child", 1000], ["parent", 1]]
    pids = run.sql("SELECT DISTINCT pid FROM resources WHERE kind = 'process'")["pid"].tolist()
    assert len(pids) == 2  # both processes declared themselves
    assert run.meta["status"] == "finished"  # the child joined, it did not close the parent's run


def test_default_store_is_flowscope_runs_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLOWSCOPE_STORE", raising=False)
    with Client(spool_dir=tmp_path / "spool") as c:
        c.log("x")
    assert (tmp_path / "flowscope-runs" / c.run_id / "run.json").is_file()
    monkeypatch.setenv("FLOWSCOPE_STORE", str(tmp_path / "elsewhere"))
    with Client(spool_dir=tmp_path / "spool") as c2:
        pass
    assert (tmp_path / "elsewhere" / c2.run_id / "run.json").is_file()


def test_flush_by_age_makes_records_visible_without_close(tmp_path):
    c = Client(store=tmp_path, flush_interval=0.2)
    c.metric("queue.depth", 3, namespace="workflow")
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not list((c.run_dir / "metrics").glob("*.parquet")):
        time.sleep(0.05)
    m = flowscope.open_run(c.run_dir).table("metrics")
    assert m[["namespace", "name", "value"]].values.tolist() == [["workflow", "queue.depth", 3.0]]
    c.close()


def test_an_idle_client_looks_for_due_records_four_times_an_interval_not_ten_times_a_second(tmp_path):
    import time

    with Client(store=tmp_path, flush_interval=1.0, live_flush_interval=0.2) as c:
        before, t0 = c.builder_wakes, time.monotonic()
        time.sleep(2.0)
        wakes, took = c.builder_wakes - before, time.monotonic() - t0
        # a quarter of the 1 s interval between looks (a busy machine only makes them rarer); it was every 0.1 s
        assert wakes <= took / 0.25 + 1, (wakes, took)
        c.watched = True  # a page follows the run: records may wait 0.2 s, so it looks every 0.05 s
        before, t0 = c.builder_wakes, time.monotonic()
        c.metric("queue.depth", 1, namespace="workflow")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not list((c.run_dir / "metrics").glob("*.parquet")):
            time.sleep(0.01)
        assert list((c.run_dir / "metrics").glob("*.parquet")), "a watched run's record was not sent within 10 s"
        assert c.builder_wakes - before >= 2


def test_age_flushes_of_many_threads_make_one_segment_per_table(tmp_path):
    import threading

    c = Client(store=tmp_path, flush_interval=0.5)
    go = threading.Barrier(8)

    def produce(k: int) -> None:
        go.wait()
        for i in range(100):
            c.span("s", i, i + 1, span_id=k * 100 + i)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.flush(timeout=30)
    segments = flowscope.open_run(c.run_dir).segments("spans")
    c.close()
    assert flowscope.open_run(c.run_dir).counts()["spans"] == 800
    assert len(segments) <= 2  # eight threads' buffers were merged (two if a flush fell between them)
