"""Observing a real Dask LocalCluster (2 worker processes, 2 threads each) with Dask's default configuration:
every task counted exactly once, retries, a task that errs, a worker killed while it holds and runs tasks. The tests
of worker transitions and of each task's own I/O run at capture level ``full``, which records them; the others at
the default level (tests/test_dask_levels.py compares the two)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from dask import delayed
from dask.core import get_dependencies
from distributed import Client, LocalCluster

from flowscope import observe


def inc(x):
    time.sleep(0.01)
    return x + 1


def add(a, b):
    time.sleep(0.01)
    return a + b


def fail(x):
    raise ZeroDivisionError(f"secret payload {x}")


@pytest.fixture
def cluster():
    """Dask's default configuration (work stealing on): what users run."""
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        yield cl, client


def _graph():
    xs = [delayed(inc, pure=True)(i, dask_key_name=f"inc-{i}") for i in range(16)]
    ys = [delayed(add, pure=True)(xs[i], xs[(i + 5) % 16], dask_key_name=f"add-{i}") for i in range(16)]
    total = delayed(sum, pure=True)(ys, dask_key_name="total")
    return total


def test_every_task_is_one_execution_span_on_a_real_worker_thread(cluster, tmp_path):
    cl, client = cluster
    total = _graph()
    with observe(client, store=tmp_path, name="dask-test") as obs:
        assert client.compute(total).result() == sum(range(1, 17)) * 2
    assert obs.hook_errors and all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    run = obs.run
    graph = dict(total.__dask_graph__())
    spans = run.sql("SELECT * FROM spans WHERE kind = 'task'")
    assert Counter(spans["task_key"]) == Counter(list(graph))  # every task exactly once
    assert (spans["start_ns"] < spans["end_ns"]).all()

    # each span is on a thread resource of the worker process that ran it, with a real OS thread id
    threads = run.sql("""SELECT s.task_key, r.tid, r.thread_ident, r.pid, w.address
                         FROM spans s JOIN resources r ON s.resource_id = r.resource_id
                         JOIN resources w ON r.parent_id = w.resource_id
                         WHERE s.kind = 'task'""")
    assert len(threads) == len(graph)
    pids = client.run(lambda: __import__("os").getpid())
    assert set(threads["address"]) <= set(pids)
    for _, row in threads.iterrows():
        assert row["pid"] == pids[row["address"]]
    native = client.run(lambda: sorted(int(t) for t in __import__("os").listdir("/proc/self/task")))
    for _, row in threads.iterrows():
        assert row["tid"] in native[row["address"]], "the recorded tid is a thread of that worker process"

    # scheduler transitions form a valid lifecycle for every task
    trans = run.sql("""SELECT task_key, from_state, to_state FROM transitions
                       WHERE observer = 'scheduler' ORDER BY ts_ns""")
    for key, rows in trans.groupby("task_key"):
        states = list(zip(rows["from_state"], rows["to_state"]))
        for (a, b), (c, _) in zip(states, states[1:]):
            assert b == c, f"{key}: {states}"
        assert ("processing", "memory") in states, f"{key}: {states}"
    done = trans[(trans["from_state"] == "processing") & (trans["to_state"] == "memory")]
    assert Counter(done["task_key"]) == Counter(list(graph))  # each task computed once, stolen or not

    # dependencies equal the graph's, each edge recorded once
    deps = run.sql("SELECT task_key, depends_on FROM dependencies")
    want = {(k, d) for k in graph for d in get_dependencies(graph, k)}
    assert Counter(zip(deps["task_key"], deps["depends_on"])) == Counter(want)

    # a transfer exists wherever a task's input was computed on another worker
    where = dict(zip(threads["task_key"], threads["address"]))
    transfers = run.sql("SELECT src_resource_id, dst_resource_id, unnest(keys) AS key, nbytes FROM transfers")
    moved = {(r.key, r.src_resource_id, r.dst_resource_id) for r in transfers.itertuples()}
    needed = {(d, f"worker:{where[d]}", f"worker:{where[k]}") for k, d in want if where[d] != where[k]}
    assert needed, "the graph should make the two workers exchange data"
    assert needed <= moved
    assert (transfers["nbytes"] > 0).all()

    # these tasks do no I/O of their own, and the counters' own reads are not charged to them
    assert run.sql("SELECT count(*) AS n FROM io WHERE source = 'proc-io'")["n"][0] == 0

    # the breakdown and group statistics read the same tables
    from flowscope.analysis.breakdown import breakdown, task_groups

    b = breakdown(run)
    assert b.tasks == len(graph) and b.transfers == len(run.table("transfers"))
    assert b.communication_bytes == int(run.sql("SELECT sum(nbytes) AS b FROM transfers")["b"][0]) > 0
    assert 0 < b.compute_s and 0 < b.makespan_s < 60
    groups = task_groups(run).set_index("group")
    assert groups.loc["inc", "count"] == 16 and groups.loc["add", "count"] == 16
    assert groups.loc["inc", "mean_s"] >= 0.01  # each inc sleeps 10 ms

    # workers and the client joined; the run is finished
    logs = run.sql("SELECT category, count(*) AS n FROM logs GROUP BY 1")
    counts = dict(zip(logs["category"], logs["n"]))
    assert counts.get("graph-submitted", 0) >= 1
    assert run.meta["status"] == "finished"
    workers = run.sql("SELECT address FROM resources WHERE kind = 'worker'")
    assert set(workers["address"]) == set(pids)


def _worker_transition_log(dask_worker):
    """(key, start, final state, stimulus id) of each transition in Dask's own worker log."""
    return [(str(e[0]), e[1], e[3], e[5]) for e in dask_worker.state.log if len(e) == 7 and isinstance(e[4], dict)]


def test_worker_transitions_carry_the_group_and_the_stimulus_that_caused_them(cluster, tmp_path):
    from collections import Counter

    cl, client = cluster
    total = _graph()
    blocks = [delayed(inc, pure=True)(i, dask_key_name=("blk-7f3a", i)) for i in range(4)]  # group "blk-7f3a"
    with observe(client, store=tmp_path, level="full") as obs:
        assert client.compute(total).result() == sum(range(1, 17)) * 2
        assert client.gather(client.compute(blocks)) == [1, 2, 3, 4]
    dask_logs = client.run(_worker_transition_log)  # after the block: no transition recorded is missing from it
    run = obs.run
    rows = run.sql("SELECT task_key, \"group\", prefix, from_state, to_state, stimulus_id, observer "
                   "FROM transitions WHERE observer <> 'scheduler'")
    assert len(rows) > 0 and rows["stimulus_id"].notna().all() and rows["group"].notna().all()
    # the same group the scheduler gives the task
    sched = run.sql("SELECT DISTINCT task_key, \"group\" FROM transitions WHERE observer = 'scheduler'")
    want = dict(zip(sched["task_key"], sched["group"]))
    assert all(want[k] == g for k, g in zip(rows["task_key"], rows["group"]) if k in want)
    assert set(rows["group"]) == {"inc", "add", "total", "blk-7f3a"}
    assert set(rows.loc[rows["group"] == "blk-7f3a", "prefix"].dropna()) == {"blk"}
    # every worker transition recorded is one Dask's own worker log holds, with the same stimulus id
    for address, entries in dask_logs.items():
        mine = rows[rows["observer"] == f"worker:{address}"]
        assert len(mine) > 0
        got = Counter(zip(mine["task_key"], mine["from_state"], mine["to_state"], mine["stimulus_id"]))
        missing = got - Counter(entries)
        assert not missing, f"{address}: {list(missing.items())[:5]}"
    # a task's completion is its own event, not the one that started it
    done = rows[(rows["from_state"] == "executing") & (rows["to_state"] == "memory")]
    assert len(done) == 33 + 4 and done["stimulus_id"].str.startswith("task-finished").all()


def test_task_errors_record_the_type_not_the_payload(cluster, tmp_path):
    _, client = cluster
    with observe(client, store=tmp_path) as obs:
        fut = client.submit(fail, 7, key="fail-7")
        with pytest.raises(ZeroDivisionError):
            fut.result()
    errors = obs.run.sql("SELECT task_key, message, attrs FROM logs WHERE category = 'task-error'")
    assert errors["task_key"].tolist() == ["fail-7"]
    assert "ZeroDivisionError" in errors["message"][0] and "secret" not in errors["message"][0]
    assert "secret" not in errors["attrs"][0]


def test_a_worker_that_joins_late_is_observed(cluster, tmp_path):
    cl, client = cluster
    with observe(client, store=tmp_path) as obs:
        client.submit(inc, 1, key="early").result()
        before = set(client.scheduler_info()["workers"])
        cl.scale(3)
        client.wait_for_workers(3, timeout=60)
        [late] = set(client.scheduler_info()["workers"]) - before
        futs = [client.submit(inc, i, key=f"late-{i}", workers=[late]) for i in range(4)]
        client.gather(futs)
    run = obs.run
    on_late = run.sql(f"""SELECT count(*) AS n FROM spans s JOIN resources r ON s.resource_id = r.resource_id
                          WHERE s.kind = 'task' AND r.parent_id = 'worker:{late}'""")
    assert int(on_late["n"][0]) == 4, run.sql("""SELECT s.task_key, s.resource_id, r.parent_id FROM spans s
        LEFT JOIN resources r ON s.resource_id = r.resource_id WHERE s.kind = 'task'""").to_string()
    joined = run.sql("SELECT resource_id FROM logs WHERE category = 'worker-joined'")
    assert f"worker:{late}" in set(joined["resource_id"])
    assert all(v == 0 for v in obs.hook_errors.values()) and late in obs.hook_errors


def write_file(path: str, nbytes: int) -> int:
    with open(path, "wb") as f:
        f.write(b"x" * nbytes)
    return nbytes


def read_file(path: str, _written: int) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def test_per_task_bytes_match_the_files_the_tasks_wrote(cluster, tmp_path):
    _, client = cluster
    sizes = {f"write-{i}": (i + 1) * 300_000 for i in range(6)}
    with observe(client, store=tmp_path / "store", level="full") as obs:
        written = {k: client.submit(write_file, str(tmp_path / f"{k}.bin"), n, key=k) for k, n in sizes.items()}
        reads = [client.submit(read_file, str(tmp_path / f"{k}.bin"), fut, key=f"read-{k}")
                 for k, fut in written.items()]
        assert client.gather(reads) == list(sizes.values())
    run = obs.run
    io = run.sql("""SELECT task_key, op, nbytes, tid, thread_ident, json_extract(attrs, '$.write_bytes') AS storage
                    FROM io WHERE source = 'proc-io'""")
    w = io[io["op"] == "write"].set_index("task_key")
    for key, n in sizes.items():
        # wchar counts every byte the task's thread wrote through system calls: the file, nothing else here
        assert n <= int(w.loc[key, "nbytes"]) < n + 64 * 1024, (key, w.loc[key, "nbytes"], n)
    r = io[io["op"] == "read"].set_index("task_key")
    for key, n in sizes.items():
        assert n <= int(r.loc[f"read-{key}", "nbytes"]) < n + 64 * 1024
    # the io rows join their task's execution span by thread and time (the span's on the local clock: less the
    # offset to the scheduler's clock Dask added)
    joined = run.sql("""SELECT count(*) AS n FROM io i JOIN spans s ON s.task_key = i.task_key AND s.kind = 'task'
                        JOIN resources r ON s.resource_id = r.resource_id,
                        LATERAL (SELECT CAST(json_extract(s.attrs, '$.clock_offset_ns') AS BIGINT) AS off)
                        WHERE i.source = 'proc-io' AND r.tid = i.tid AND r.thread_ident = i.thread_ident
                          AND i.start_ns = s.start_ns - off AND i.end_ns = s.end_ns - off""")
    assert int(joined["n"][0]) == len(io)
    # the audit hook saw each task open its file, on the task's own thread
    opens = run.sql("SELECT task_key, path, attrs FROM io WHERE source = 'audit' AND op = 'open'")
    mine = opens[opens["path"].str.endswith(".bin")]
    assert set(zip(mine["task_key"], mine["path"])) >= {(k, str(tmp_path / f"{k}.bin")) for k in sizes}
    assert all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors


def test_one_process_per_host_samples_the_hardware(cluster, tmp_path):
    _, client = cluster
    with observe(client, store=tmp_path) as obs:
        client.gather(client.map(inc, range(40)))
        time.sleep(2.5)  # a few sampling periods
    m = obs.run.sql("""SELECT resource_id, count(DISTINCT ts_ns) AS samples, count(*) AS n
                       FROM metrics WHERE namespace = 'hardware' AND name = 'cpu.percent' GROUP BY 1""")
    assert len(m) == 1 and m["resource_id"][0].startswith("host:")
    assert int(m["samples"][0]) == int(m["n"][0]) >= 2  # one sampler: no two samples share a timestamp
    cores = obs.run.sql("SELECT count(DISTINCT name) AS n FROM metrics WHERE name LIKE 'cpu.core%.percent'")
    assert int(cores["n"][0]) == __import__("os").cpu_count()


def test_tasks_computed_before_the_run_do_not_leak_into_it(cluster, tmp_path):
    """A result computed before observe() and released inside it brings no execution span along."""
    _, client = cluster
    before = client.submit(inc, 1, key="before-1")
    assert before.result() == 2
    with observe(client, store=tmp_path) as obs:
        during = client.submit(inc, 10, key="during-10")
        assert during.result() == 11
        del before  # released (and forgotten) while the run records
        deadline = time.monotonic() + 60
        while any(client.run(lambda dask_worker: "before-1" in dask_worker.state.tasks).values()):
            assert time.monotonic() < deadline, "the workers still hold before-1 after 60 s"
            time.sleep(0.02)
    spans = obs.run.sql("SELECT task_key FROM spans WHERE kind = 'task'")
    assert spans["task_key"].tolist() == ["during-10"]


def _scheduler_log_length(dask_scheduler=None):
    return dask_scheduler.transition_log.maxlen


def _worker_log_length(dask_worker=None):
    return dask_worker.state.log.maxlen


def _noop(x):
    return x


def test_no_transition_is_lost_when_a_burst_outgrows_dasks_own_logs(cluster, tmp_path):
    """Dask keeps its own transition logs (Scheduler.transition_log, WorkerState.log) to their last 1,000
    entries; one graph of 3,000 tasks logs more than that on the scheduler at once. flowscope records each
    transition as it happens, so every task's lifecycle is complete from its first transition, on the
    scheduler with the worker that ran it and on that worker; Dask's logs are left as they were."""
    _, client = cluster
    n = 3000
    limits = {"scheduler": client.run_on_scheduler(_scheduler_log_length), **client.run(_worker_log_length)}
    assert set(limits.values()) == {1000}
    with observe(client, store=tmp_path, level="full") as obs:
        assert sum(client.gather(client.map(_noop, range(n), key=[f"noop-{i}" for i in range(n)]))) == \
            n * (n - 1) // 2
    assert all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    assert {"scheduler": client.run_on_scheduler(_scheduler_log_length), **client.run(_worker_log_length)} == limits
    run = obs.run
    keys = {f"noop-{i}" for i in range(n)}

    sched = run.sql("""SELECT task_key, "group", prefix, from_state, to_state, worker FROM transitions
                       WHERE observer = 'scheduler' ORDER BY ts_ns""")
    assert set(sched["task_key"]) == keys
    ran = sched[(sched["from_state"] == "processing") & (sched["to_state"] == "memory")]
    assert Counter(ran["task_key"]) == Counter(keys)
    for key, rows in sched.groupby("task_key"):
        states = list(zip(rows["from_state"], rows["to_state"]))
        assert states[0] == ("released", "waiting"), f"{key}: {states}"  # the first one too: none lost
        assert all(b == c for (_, b), (c, _) in zip(states, states[1:])), f"{key}: {states}"
        assert ("processing", "memory") in states, f"{key}: {states}"
    assert (sched["prefix"] == "noop").all() and sched["group"].notna().all()
    assert ran["worker"].str.startswith("worker:").all()

    spans = run.sql("SELECT task_key, r.parent_id AS worker FROM spans s JOIN resources r USING (resource_id) "
                    "WHERE s.kind = 'task'")
    assert Counter(spans["task_key"]) == Counter(keys)
    where = dict(zip(spans["task_key"], spans["worker"]))
    assert dict(zip(ran["task_key"], ran["worker"])) == where  # the scheduler's worker is the one that ran it

    work = run.sql("""SELECT task_key, from_state, to_state, observer, worker FROM transitions
                      WHERE observer <> 'scheduler' ORDER BY ts_ns""")
    assert (work["observer"] == work["worker"]).all()
    executed = work[(work["from_state"] == "executing") & (work["to_state"] == "memory")]
    assert Counter(executed["task_key"]) == Counter(keys)  # on one worker, once
    for key, rows in work[work["task_key"].isin(keys)].groupby("task_key"):
        on = rows[rows["observer"] == where[key]]
        states = list(zip(on["from_state"], on["to_state"]))
        assert ("executing", "memory") in states, f"{key}: {states}"
        assert all(b == c for (_, b), (c, _) in zip(states, states[1:])), f"{key}: {states}"


# ---- retries, errors, a lost worker, a transition Dask was asked for but did not make --------------------------

def _wait_for(condition, what: str, timeout: float = 120.0) -> None:
    """Wait until ``condition()`` holds (a state of the cluster, not a duration); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(0.02)


def _attrs(spans) -> list[dict]:
    return [json.loads(a) for a in spans["attrs"]]


def flaky(folder: str) -> int:
    """Fails the first two times it runs, then returns the attempt number (attempts are counted in files of
    ``folder``: they run one after the other, each after the previous one failed)."""
    d = Path(folder)
    n = len(list(d.glob("attempt-*")))
    (d / f"attempt-{n}").touch()
    if n < 2:
        raise RuntimeError(f"secret attempt {n}")
    return n


def test_a_retried_task_has_one_span_and_one_set_of_transitions_per_attempt(cluster, tmp_path):
    _, client = cluster
    (tmp_path / "attempts").mkdir()
    with observe(client, store=tmp_path / "store", level="full") as obs:
        assert client.submit(flaky, str(tmp_path / "attempts"), key="flaky-1", retries=2).result() == 2
    assert all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    run = obs.run
    spans = run.sql("SELECT task_key, resource_id, start_ns, end_ns, attrs FROM spans WHERE kind = 'task' "
                    "ORDER BY start_ns")
    assert Counter(spans["task_key"]) == {"flaky-1": 3}  # each attempt once
    attrs = _attrs(spans)
    assert [a["state"] for a in attrs] == ["error", "error", "memory"]
    assert len({a["attempt_id"] for a in attrs}) == 3  # Dask's run id of each attempt tells them apart
    # why each failed attempt failed: the exception's type, never its message
    assert [a.get("exception_type") for a in attrs] == ["RuntimeError", "RuntimeError", None]
    assert not any("secret" in a for a in spans["attrs"])
    # one after the other where one clock measured both: an attempt on another worker carries that worker's clock
    # offset estimate, whose error (a fraction of a millisecond under load) can make two attempts appear to overlap
    rid = spans["resource_id"].to_numpy()
    same_thread = rid[1:] == rid[:-1]
    assert (spans["start_ns"].to_numpy()[1:] >= spans["end_ns"].to_numpy()[:-1])[same_thread].all()

    work = run.sql("SELECT from_state, to_state FROM transitions WHERE task_key = 'flaky-1' "
                   "AND observer <> 'scheduler'")
    moves = Counter(zip(work["from_state"], work["to_state"]))
    assert moves[("ready", "executing")] == 3 and moves[("executing", "error")] == 2
    assert moves[("executing", "memory")] == 1
    sched = run.sql("SELECT from_state, to_state, worker, stimulus_id FROM transitions WHERE task_key = 'flaky-1' "
                    "AND observer = 'scheduler' ORDER BY ts_ns")
    states = list(zip(sched["from_state"], sched["to_state"]))
    assert all(b == c for (_, b), (c, _) in zip(states, states[1:])), states
    assert Counter(states)[("waiting", "processing")] == 3
    retried = sched[(sched["from_state"] == "processing") & (sched["to_state"] == "released")]
    assert len(retried) == 2 and retried["stimulus_id"].str.startswith("task-erred").all()
    assert ("processing", "erred") not in states
    # the last attempt's result; after it only the client letting the key go (memory -> released / forgotten),
    # which may or may not reach the scheduler before the run ends
    done = states.index(("processing", "memory"))
    assert all(a == "memory" or a == "released" for a, _ in states[done + 1:]), states
    # the task did not fail in the end: no task-error
    assert run.sql("SELECT count(*) AS n FROM logs WHERE category = 'task-error'")["n"][0] == 0


def test_a_task_that_errs_and_its_dependent(cluster, tmp_path):
    _, client = cluster
    failing = delayed(fail, pure=True)(7, dask_key_name="fail-7")
    after = delayed(inc, pure=True)(failing, dask_key_name="after-7")  # one graph: both known before either runs
    with observe(client, store=tmp_path, level="full") as obs, pytest.raises(ZeroDivisionError):
        client.compute(after).result()
    assert all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    run = obs.run
    spans = run.sql("SELECT task_key, attrs FROM spans WHERE kind = 'task'")
    assert Counter(spans["task_key"]) == {"fail-7": 1}  # the dependent never ran
    [attrs] = _attrs(spans)
    assert attrs["state"] == "error" and attrs["exception_type"] == "ZeroDivisionError"
    sched = run.sql("SELECT task_key, from_state, to_state, worker FROM transitions WHERE observer = 'scheduler' "
                    "ORDER BY ts_ns")
    by_key = {k: list(zip(g["from_state"], g["to_state"])) for k, g in sched.groupby("task_key")}
    assert by_key["fail-7"] == [("released", "waiting"), ("waiting", "processing"), ("processing", "erred")]
    # the dependent waits, then errs with its input (through released, as Dask goes), never placed on a worker
    assert by_key["after-7"][0] == ("released", "waiting") and by_key["after-7"][-1][1] == "erred", by_key
    assert not any("processing" in t for t in by_key["after-7"]), by_key
    erred = sched[(sched["task_key"] == "fail-7") & (sched["to_state"] == "erred")]
    assert erred["worker"].iloc[0].startswith("worker:")
    work = run.sql("SELECT from_state, to_state, observer FROM transitions WHERE task_key = 'fail-7' "
                   "AND observer <> 'scheduler'")
    assert Counter(zip(work["from_state"], work["to_state"]))[("executing", "error")] == 1
    assert set(work["observer"]) == {erred["worker"].iloc[0]}
    # one error, on the task that raised it, with the type and not the payload
    errors = run.sql("SELECT task_key, resource_id, message, attrs FROM logs WHERE category = 'task-error'")
    assert errors["task_key"].tolist() == ["fail-7"] and errors["resource_id"][0] == erred["worker"].iloc[0]
    assert json.loads(errors["attrs"][0]) == {"exception_type": "ZeroDivisionError"}
    assert "secret" not in errors["message"][0]


def hold(folder: str, *inputs: int) -> int:
    """The first time it runs: note its worker's pid and wait for a file nobody writes (the test kills that
    worker). Any later time: return at once."""
    d = Path(folder)
    if not (d / "started").exists():
        (d / "started").write_text(str(os.getpid()))
        while not (d / "never").exists():
            time.sleep(0.01)
    return sum(inputs)


def _flush_worker_plugin(dask_worker) -> bool:
    return dask_worker.plugins["flowscope-worker"].flush(30)


def test_a_worker_killed_while_it_holds_and_runs_tasks(tmp_path, monkeypatch):
    """Four results held by worker W and a task running on W that waits for ever; W's process is killed (SIGKILL).
    The scheduler recomputes the four on another worker and runs the waiting task again: each recomputed task has
    one span per attempt, on the worker of that attempt; the killed attempt has its transitions and no span.

    W is the cluster's only worker while the tasks are placed (so work stealing has nowhere to move them); a second
    one joins before the kill. W held the host's hardware lease: the lock file it could not remove is removed when
    the observation ends."""
    locks = tmp_path / "locks"
    monkeypatch.setenv("FLOWSCOPE_LOCK_DIR", str(locks))  # the workers' processes inherit it
    (tmp_path / "hold").mkdir()
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client, \
            observe(client, store=tmp_path / "store", level="full") as obs:
        [w] = client.scheduler_info()["workers"]
        xs = [client.submit(inc, i, key=f"in-{i}") for i in range(4)]
        client.gather(xs)
        h = client.submit(hold, str(tmp_path / "hold"), *xs, key="hold-0")
        _wait_for((tmp_path / "hold" / "started").exists, "hold-0 started on its worker")
        cl.scale(2)
        client.wait_for_workers(2, timeout=120)
        # what W recorded so far reaches the collector first: a killed process takes its unsent records along
        assert client.run(_flush_worker_plugin, workers=[w])[w]
        os.kill(int((tmp_path / "hold" / "started").read_text()), signal.SIGKILL)
        assert h.result() == sum(range(1, 5))
    assert all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    assert locks.is_dir() and list(locks.iterdir()) == []
    run = obs.run
    wid = f"worker:{w}"
    spans = run.sql("""SELECT s.task_key, r.parent_id AS worker, s.attrs FROM spans s
                       JOIN resources r USING (resource_id) WHERE s.kind = 'task' ORDER BY s.start_ns""")
    assert Counter(spans["task_key"]) == {**{f"in-{i}": 2 for i in range(4)}, "hold-0": 1}
    for key, rows in spans.groupby("task_key"):
        attempts = _attrs(rows)
        assert len({a["attempt_id"] for a in attempts}) == len(rows), key
        if key.startswith("in-"):  # first on W, then, recomputed, on a worker that is not W
            assert rows["worker"].iloc[0] == wid and rows["worker"].iloc[1] != wid, rows
    assert spans.loc[spans["task_key"] == "hold-0", "worker"].iloc[0] != wid

    sched = run.sql("SELECT task_key, from_state, to_state, worker, stimulus_id FROM transitions "
                    "WHERE observer = 'scheduler' ORDER BY ts_ns")
    for key, rows in sched.groupby("task_key"):
        states = list(zip(rows["from_state"], rows["to_state"]))
        assert all(b == c for (_, b), (c, _) in zip(states, states[1:])), (key, states)
    done = sched[(sched["from_state"] == "processing") & (sched["to_state"] == "memory")]
    assert Counter(done["task_key"]) == {**{f"in-{i}": 2 for i in range(4)}, "hold-0": 1}
    lost = sched[sched["stimulus_id"].str.startswith("handle-worker-cleanup")]
    assert Counter(zip(lost["task_key"], lost["from_state"], lost["to_state"])) >= Counter(
        {**{(f"in-{i}", "memory", "released"): 1 for i in range(4)}, ("hold-0", "processing", "released"): 1})
    placed = sched[(sched["task_key"] == "hold-0") & (sched["to_state"] == "processing")]
    assert placed["worker"].iloc[0] == wid and (placed["worker"].iloc[1:] != wid).all()
    # on W, the killed attempt began and never ended
    on_w = run.sql(f"SELECT from_state, to_state FROM transitions WHERE task_key = 'hold-0' AND observer = '{wid}'")
    moves = set(zip(on_w["from_state"], on_w["to_state"]))
    assert ("ready", "executing") in moves and not moves & {("executing", "memory"), ("executing", "error")}
    left = run.sql("SELECT resource_id FROM logs WHERE category = 'worker-left'")
    assert wid in set(left["resource_id"])
    ended = run.sql(f"SELECT max(end_ns) AS e FROM resources WHERE resource_id = '{wid}'")["e"][0]
    assert ended is not None and ended > 0


class Gate:
    """A task's result whose pickling -- when another worker fetches it -- waits until a file exists."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        while not os.path.exists(self.path):
            time.sleep(0.01)
        return Gate, (self.path,)


def make_gate(path: str) -> Gate:
    return Gate(path)


def use(_gate: Gate, i: int) -> int:
    return i


def _state(key: str, dask_worker=None) -> str | None:
    ts = dask_worker.state.tasks.get(key)
    return ts.state if ts is not None else None


def _log_of(key: str, dask_worker=None) -> list[tuple]:
    """(start, state asked for, state reached, stimulus id) of each transition of ``key`` in Dask's worker log."""
    return [(e[1], e[2], e[3], e[5]) for e in dask_worker.state.log if len(e) == 7 and e[0] == key]


def test_a_transition_asked_for_but_not_made_is_not_recorded(cluster, tmp_path):
    """Worker B is fetching x from A (held in flight: A's pickling of x waits for a file) when a second task
    needing x arrives; Dask asks for x: flight -> fetch, a no-op while the fetch runs (x stays in flight, and
    Dask's log says so). The transitions table holds only the transitions x really made on B."""
    _, client = cluster
    a, b = sorted(client.scheduler_info()["workers"])
    gate = str(tmp_path / "open")
    with observe(client, store=tmp_path / "store", level="full") as obs:
        x = client.submit(make_gate, gate, key="x", workers=[a])
        _wait_for(lambda: client.run(_state, "x", workers=[a])[a] == "memory", "x in memory on A")
        d1 = client.submit(use, x, 1, key="d-1", workers=[b])
        _wait_for(lambda: client.run(_state, "x", workers=[b])[b] == "flight", "x in flight to B")
        d2 = client.submit(use, x, 2, key="d-2", workers=[b])
        _wait_for(lambda: client.run(_state, "d-2", workers=[b])[b] == "waiting", "d-2 waiting for x on B")
        Path(gate).touch()
        assert client.gather([d1, d2]) == [1, 2]
    # Dask's log read once the capture stopped, so that it holds every transition the capture could see (x may
    # make more later: the active memory manager drops B's replica whenever its next pass comes)
    dask_log = client.run(_log_of, "x", workers=[b])[b]
    assert all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    assert ("flight", "fetch", "flight") in {e[:3] for e in dask_log}  # the no-op happened
    made = [(e[0], e[2], e[3]) for e in dask_log if e[2] != e[0]]
    rows = obs.run.sql(f"SELECT from_state, to_state, stimulus_id FROM transitions WHERE task_key = 'x' "
                       f"AND observer = 'worker:{b}' ORDER BY ts_ns")
    recorded = list(zip(rows["from_state"], rows["to_state"], rows["stimulus_id"]))
    assert len(recorded) >= 3 and recorded == made[:len(recorded)], (recorded, made)
    assert [(f, t) for f, t, _ in recorded[:3]] == [("released", "fetch"), ("fetch", "flight"), ("flight", "memory")]


def _scheduler_plugin_counts(dask_scheduler) -> dict:
    plugin = dask_scheduler.plugins["flowscope-scheduler"]
    return {"errors": plugin.errors, "late_hooks": getattr(plugin, "late_hooks", None)}


def test_scheduler_hooks_after_the_plugin_closed_are_counted_not_failed(cluster, tmp_path):
    """The plugin is closed before Dask unregisters it; hooks firing in between (a graph, its transitions, a
    client leaving) do nothing and are counted, instead of failing on the closed client."""
    from flowscope.sources.dask import _close_scheduler_plugin

    _, client = cluster
    with observe(client, store=tmp_path) as obs:
        assert client.submit(inc, 1, key="before-close").result() == 2
        assert client.run_on_scheduler(_close_scheduler_plugin)[0] == 0  # (errors, tasks finished)
        assert client.submit(inc, 2, key="after-close").result() == 3
        counts = client.run_on_scheduler(_scheduler_plugin_counts)
    assert counts["errors"] == 0, counts
    assert counts["late_hooks"] > 0  # update_graph and the transitions of "after-close" at least
    assert obs.hook_errors["scheduler"] == 0
    keys = set(obs.run.sql("SELECT DISTINCT task_key FROM transitions WHERE observer = 'scheduler'")["task_key"])
    assert "before-close" in keys and "after-close" not in keys


def _set_offset_estimate(seconds: float, dask_worker=None) -> None:
    """Stop the worker's heartbeats and set its estimate of its offset to the scheduler's clock, as a heartbeat
    answered late on a loaded host does (0.72 s was seen with two CPU-bound processes beside the suite)."""
    dask_worker.periodic_callbacks["heartbeat"].stop()
    dask_worker.scheduler_delay = seconds


@pytest.mark.parametrize("level", ["standard", "full"])
def test_a_wrong_offset_estimate_on_the_schedulers_host_does_not_reorder_tasks(tmp_path, level):
    """On the scheduler's own host the clocks are one: Dask's estimate of the offset (``scheduler_delay``) is
    noise, and under load a large one. A task that ran on a worker whose estimate is 0.8 s off must still lie
    between the task it depends on and the task that depends on it, transfers included."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        client.run(_set_offset_estimate, 0.8, workers=[b])
        with observe(client, store=tmp_path, name="skewed", level=level) as obs:
            x = client.submit(inc, 0, key="x", workers=[a])
            y = client.submit(inc, x, key="y", workers=[b])
            z = client.submit(inc, y, key="z", workers=[a])
            assert z.result() == 3
    spans = obs.run.sql("SELECT task_key, start_ns, end_ns, json_extract_string(attrs, '$.worker') AS worker "
                        "FROM spans WHERE kind = 'task'").set_index("task_key")
    assert spans.loc["y", "worker"] == b and spans.loc["x", "worker"] == spans.loc["z", "worker"] == a
    assert spans.loc["x", "end_ns"] <= spans.loc["y", "start_ns"], spans.to_dict("index")
    assert spans.loc["y", "end_ns"] <= spans.loc["z", "start_ns"], spans.to_dict("index")
    # y's input came from a; z's from b: each fetch lies between the task that made the data and the one that used it
    fetches = obs.run.sql("SELECT keys, start_ns, end_ns FROM transfers")
    assert len(fetches) == 2, fetches
    for row in fetches.itertuples():
        (made,) = list(row.keys)
        used = {"x": "y", "y": "z"}[made]
        assert spans.loc[made, "end_ns"] <= row.start_ns <= row.end_ns <= spans.loc[used, "start_ns"], (row, spans)


def test_the_clock_setting_is_checked_where_the_plugins_are_made():
    import dask

    from flowscope.sources.dask import worker_plugin

    with dask.config.set({"flowscope.clock": "scheduler"}):
        assert worker_plugin("http://127.0.0.1:1", "r").clock == "scheduler"
    assert worker_plugin("http://127.0.0.1:1", "r").clock == "auto"
    with dask.config.set({"flowscope.clock": "utc"}), pytest.raises(ValueError, match="flowscope.clock.*'utc'"):
        worker_plugin("http://127.0.0.1:1", "r")
