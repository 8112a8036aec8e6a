"""Dask capture levels (docs/dask.md, "Capture levels") on a real LocalCluster with Dask's default configuration:
``standard`` (the default) records scheduler transitions, execution spans on threads, transfers and per-task I/O
of calls of 1 ms or more (shorter calls' I/O is charged to the next measured call on that thread, and the rows say
how many calls they carry), with no transition hook on the workers; ``full`` keeps every worker transition too.
A second ``observe()`` in the same process reuses the collector process of the first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from flowscope import observe
from flowscope.store.run import open_run

SHORT_BYTES = 1_000
LONG_BYTES = 200_000
SHORT_TASKS = 20


def write_bytes(path: str, n: int, *_deps) -> int:
    """Append ``n`` bytes to ``path`` (unbuffered: one write call)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * n)
    finally:
        os.close(fd)
    return n


def write_slowly(path: str, n: int, *_deps) -> int:
    time.sleep(0.02)  # far above the 1 ms below which a call's I/O is charged to the next call
    return write_bytes(path, n)


def inc(x: int) -> int:
    return x + 1


@pytest.fixture
def one_thread_cluster():
    """Two worker processes of one thread each, Dask's default configuration: the tasks pinned to a worker run
    one after the other on the same thread."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        yield cl, client


def _workload(client, folder: Path) -> dict:
    """On worker A: SHORT_TASKS short writes, one long write after them, one short write after that; on worker B a
    task that needs a result of worker A (a transfer). Returns the keys and what was written."""
    a, b = sorted(client.scheduler_info()["workers"])
    path = str(folder / "out.bin")
    shorts = [client.submit(write_bytes, path, SHORT_BYTES, i, key=f"short-{i}", workers=[a], pure=False)
              for i in range(SHORT_TASKS)]
    long = client.submit(write_slowly, path, LONG_BYTES, *shorts, key="long", workers=[a])
    tail = client.submit(write_bytes, path, SHORT_BYTES, long, key="tail", workers=[a])
    x = client.submit(inc, 1, key="x", workers=[a])
    y = client.submit(inc, x, key="y", workers=[b])
    assert tail.result() == SHORT_BYTES and y.result() == 3
    written = (SHORT_TASKS + 1) * SHORT_BYTES + LONG_BYTES
    assert os.path.getsize(path) == written
    return {"a": a, "b": b, "written": written, "keys": {f"short-{i}" for i in range(SHORT_TASKS)} | {"long", "tail", "x", "y"}}


def _has_transition_hook(dask_worker=None) -> dict:
    """Per plugin: whether Dask's worker calls its ``transition`` on every worker transition (it calls it on every
    plugin that has the attribute, WorkerPlugin's own no-op included), and whether the class overrides that no-op."""
    return {name: (hasattr(p, "transition"), getattr(type(p), "transition", None) is not WorkerPlugin.transition)
            for name, p in dask_worker.plugins.items()}


def test_standard_level_records_spans_transfers_and_scheduler_transitions_with_no_worker_transition_hook(
        one_thread_cluster, tmp_path):
    _cl, client = one_thread_cluster
    with observe(client, store=tmp_path / "store", name="levels") as obs:  # the default level: standard
        hooks = client.run(_has_transition_hook)
        done = _workload(client, tmp_path)
    assert obs.hook_errors and all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    # the worker plugin is there, and Dask calls no per-transition hook on it (not even WorkerPlugin's no-op)
    for per_worker in hooks.values():
        assert per_worker.get("flowscope-worker", (None,))[0] is False, hooks
    run = obs.run
    assert run.meta["capture_level"] == "standard"

    # every task: one execution span on a thread resource of the worker process that ran it
    spans = run.sql("""SELECT s.task_key, s.start_ns, s.end_ns, s.attrs, r.kind AS rkind, r.tid, r.pid,
                              json_extract_string(s.attrs, '$.worker') AS address
                       FROM spans s JOIN resources r ON s.resource_id = r.resource_id WHERE s.kind = 'task'""")
    assert Counter(spans["task_key"]) == Counter(done["keys"])
    assert set(spans["rkind"]) == {"thread"} and spans["tid"].notna().all()
    pids = client.run(os.getpid)
    assert all(pid == pids[address] for pid, address in zip(spans["pid"], spans["address"]))
    assert dict(zip(spans["task_key"], spans["address"]))["y"] == done["b"]
    assert (spans[spans["task_key"] != "y"]["address"] == done["a"]).all()

    # scheduler transitions for every task, none from the workers
    trans = run.sql("SELECT task_key, from_state, to_state, observer FROM transitions")
    assert set(trans["observer"]) == {"scheduler"}
    finished = trans[(trans["from_state"] == "processing") & (trans["to_state"] == "memory")]
    assert Counter(finished["task_key"]) == Counter(done["keys"])

    # the transfer of x from worker A to worker B
    transfers = run.sql("SELECT * FROM transfers")
    moved = [k for keys in transfers["keys"] for k in keys]
    assert "x" in moved

    # per-task I/O: a call shorter than 1 ms is not measured ("io": "next"); its I/O goes to the next measured call
    # on that thread, whose rows say how many calls they carry ("tasks"); what is still pending at the end is
    # recorded then, with no task. Nothing is lost, and the counts agree with the spans.
    attrs = {k: json.loads(a) for k, a in zip(spans["task_key"], spans["attrs"])}
    assert {a["io"] for a in attrs.values()} <= {"own", "next"}
    assert attrs["long"]["io"] == "own"
    io = run.sql("""SELECT task_key, op AS direction, nbytes AS bytes, attrs FROM io WHERE source = 'proc-io' AND resource_id IN
                    (SELECT resource_id FROM spans WHERE kind = 'task' AND task_key = 'long')""")
    writes = io[io["direction"] == "write"]
    assert writes["bytes"].sum() >= done["written"]
    carried = {k: json.loads(a)["tasks"] for k, a in zip(writes["task_key"], writes["attrs"])}
    order = spans[spans["address"] == done["a"]].sort_values("start_ns")["task_key"].tolist()
    deferred = 0
    for key in order:
        if attrs[key]["io"] == "next":
            deferred += 1
        elif key in carried:
            assert carried[key] == deferred + 1, (key, carried[key], deferred)
            deferred = 0
        else:  # measured, wrote nothing: its own and the deferred calls' I/O had no write
            deferred = 0
    if deferred:
        assert writes["task_key"].isna().any(), "the calls still pending at the end are recorded then"
    assert any(a["io"] == "next" for a in attrs.values()), "20 one-write tasks: some took under 1 ms"
    assert carried["long"] > 1


def test_full_level_keeps_every_worker_transition_and_per_task_io(one_thread_cluster, tmp_path):
    _cl, client = one_thread_cluster
    with observe(client, store=tmp_path / "store", name="levels", level="full") as obs:
        hooks = client.run(_has_transition_hook)
        done = _workload(client, tmp_path)
    assert obs.hook_errors and all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    for per_worker in hooks.values():
        assert per_worker.get("flowscope-worker") == (True, True), hooks
    run = obs.run
    assert run.meta["capture_level"] == "full"
    trans = run.sql("SELECT task_key, to_state, observer FROM transitions WHERE observer <> 'scheduler'")
    for key in done["keys"]:  # every task's execution, as its worker saw it
        assert ((trans["task_key"] == key) & (trans["to_state"] == "memory")).any(), key
    # each task's own I/O, short or long
    io = run.sql("SELECT task_key, sum(nbytes) AS b FROM io WHERE source = 'proc-io' AND op = 'write' "
                 "GROUP BY task_key")
    got = dict(zip(io["task_key"], io["b"]))
    assert got["long"] >= LONG_BYTES and all(got[f"short-{i}"] >= SHORT_BYTES for i in range(SHORT_TASKS))
    spans = run.sql("SELECT task_key FROM spans WHERE kind = 'task'")
    assert Counter(spans["task_key"]) == Counter(done["keys"])


def test_a_second_observe_in_the_process_reuses_the_collector_and_both_runs_are_complete(one_thread_cluster,
                                                                                        tmp_path):
    _cl, client = one_thread_cluster
    pids, runs = [], []
    for i in range(2):
        with observe(client, store=tmp_path / "store", name=f"block-{i}") as obs:
            futures = client.map(inc, range(50), key=[f"inc-{i}-{j}" for j in range(50)])
            assert sum(client.gather(futures)) == sum(range(1, 51))
            del futures
        pids.append(obs.collector_pid)
        runs.append(obs.run)
    assert pids[0] is not None and pids[0] == pids[1]
    for i, run in enumerate(runs):
        assert run.meta["status"] == "finished"
        spans = run.sql("SELECT task_key FROM spans WHERE kind = 'task'")
        assert Counter(spans["task_key"]) == Counter(f"inc-{i}-{j}" for j in range(50))
        done = run.sql("SELECT DISTINCT task_key FROM transitions WHERE to_state = 'memory'")
        assert set(done["task_key"]) == {f"inc-{i}-{j}" for j in range(50)}


def test_an_unknown_level_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="level.*'fast'.*standard.*full"), observe(store=tmp_path, level="fast"):
        pass


def test_flowscope_run_level_is_stored_in_run_json(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("print('hello')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSCOPE_", "DASK_"))}
    res = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(tmp_path / "store"), "--no-report",
                          "--quiet", "--level", "full", "--", sys.executable, str(script)],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    (run_dir,) = [p for p in (tmp_path / "store").iterdir() if (p / "run.json").exists()]
    assert open_run(run_dir).meta["capture_level"] == "full"
    bad = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(tmp_path / "store"),
                          "--level", "fast", "--", sys.executable, str(script)],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode != 0 and "fast" in bad.stderr
