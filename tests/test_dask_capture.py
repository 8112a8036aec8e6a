"""Observing a real Dask LocalCluster (2 worker processes, 2 threads each)."""

from __future__ import annotations

import time

import pytest

import dask
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
    with dask.config.set({"distributed.scheduler.work-stealing": False}):
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
    assert sorted(spans["task_key"]) == sorted(graph)  # every task exactly once
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
    assert set(trans["task_key"]) >= set(graph)

    # dependencies equal the graph's
    deps = run.sql("SELECT task_key, depends_on FROM dependencies")
    want = {(k, d) for k in graph for d in get_dependencies(graph, k)}
    assert set(zip(deps["task_key"], deps["depends_on"])) == want

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
    with observe(client, store=tmp_path) as obs:
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
    with observe(client, store=tmp_path / "store") as obs:
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
        time.sleep(0.5)
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
    with observe(client, store=tmp_path) as obs:
        assert sum(client.gather(client.map(_noop, range(n), key=[f"noop-{i}" for i in range(n)]))) == \
            n * (n - 1) // 2
    assert all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    assert {"scheduler": client.run_on_scheduler(_scheduler_log_length), **client.run(_worker_log_length)} == limits
    run = obs.run
    keys = {f"noop-{i}" for i in range(n)}

    sched = run.sql("""SELECT task_key, "group", prefix, from_state, to_state, worker FROM transitions
                       WHERE observer = 'scheduler' ORDER BY ts_ns""")
    assert set(sched["task_key"]) == keys
    for key, rows in sched.groupby("task_key"):
        states = list(zip(rows["from_state"], rows["to_state"]))
        assert states[0] == ("released", "waiting"), f"{key}: {states}"  # the first one too: none lost
        assert all(b == c for (_, b), (c, _) in zip(states, states[1:])), f"{key}: {states}"
        assert ("processing", "memory") in states, f"{key}: {states}"
    assert (sched["prefix"] == "noop").all() and sched["group"].notna().all()
    ran = sched[(sched["from_state"] == "processing") & (sched["to_state"] == "memory")]
    assert ran["worker"].str.startswith("worker:").all()

    spans = run.sql("SELECT task_key, r.parent_id AS worker FROM spans s JOIN resources r USING (resource_id) "
                    "WHERE s.kind = 'task'")
    where = dict(zip(spans["task_key"], spans["worker"]))
    assert set(where) == keys
    assert dict(zip(ran["task_key"], ran["worker"])) == where  # the scheduler's worker is the one that ran it

    work = run.sql("""SELECT task_key, from_state, to_state, observer, worker FROM transitions
                      WHERE observer <> 'scheduler' ORDER BY ts_ns""")
    assert (work["observer"] == work["worker"]).all()
    for key, rows in work[work["task_key"].isin(keys)].groupby("task_key"):
        on = rows[rows["observer"] == where[key]]
        states = list(zip(on["from_state"], on["to_state"]))
        assert ("executing", "memory") in states, f"{key}: {states}"
        assert all(b == c for (_, b), (c, _) in zip(states, states[1:])), f"{key}: {states}"
