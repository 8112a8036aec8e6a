"""Distributed anomaly detection on a real Dask LocalCluster: a detector on each worker, the collector as
the parameter server, post-pruning, and agreement with the offline pass (`flowscope anomalies`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from distributed import Client, LocalCluster

from flowscope import observe
from flowscope.analysis.anomalies import AnomalyConfig, detect
from flowscope.sources.dask.anomaly_plugin import NAME, PRUNED, distributed_anomalies

# calls of `work` slowed 10- to 30-fold, each by a different amount: HBOS flags the rarest bins, and equal
# slowdowns sharing one bin would score lower than a lone call of the noise (docs/anomalies.md)
SLOW = {37: 0.15, 111: 0.25, 190: 0.35, 260: 0.45}


def work(i):
    time.sleep(SLOW.get(i, 0.01 + 0.002 * ((i * 7919) % 5)))
    return i


def other(i):
    time.sleep(0.005)
    return i


@pytest.fixture(scope="module")
def cluster():
    """Two workers, one of them with an estimate of its offset to the scheduler's clock 0.8 s off (as a heartbeat
    answered late on a loaded host leaves it): the detector's times must still be the spans' times."""
    from test_dask_capture import _set_offset_estimate

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        client.run(_set_offset_estimate, 0.8, workers=[sorted(client.scheduler_info()["workers"])[1]])
        yield client


def _judged(dask_worker) -> int:
    """How many calls this worker's detector has judged so far, once what it recorded has reached the collector."""
    plugin = dask_worker.plugins[NAME]
    with plugin._lock:  # not in the middle of a batch: its verdicts and its sync are both done
        judged = plugin.stats["calls"]
    plugin.fs.flush(30)
    return judged


def _model_state(dask_worker) -> tuple[int, int, int]:
    """This worker's detector: the functions of its local statistics not yet sent to the parameter server, the
    version of the global model it holds, the calls it keeps to judge again (what it flagged late is flushed to
    the collector first)."""
    plugin = dask_worker.plugins[NAME]
    with plugin._lock:  # not in the middle of a batch or a sync: its re-judging is done
        state = int((plugin.detector.local.count > 0).sum()), plugin.version, len(plugin._pending)
    plugin.fs.flush(30)
    return state


def _offline(run_dir, store, algo: str) -> set[str]:
    """Task keys `flowscope anomalies` flags on the finished run (same algorithm, default parameters)."""
    out = subprocess.run([sys.executable, "-m", "flowscope", "anomalies", str(run_dir), "--store", str(store),
                          "--algo", algo, "--json", "--top", "100000"], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert len(doc["top"]) == doc["anomalies"]
    return {row["task_key"] for row in doc["top"]}


@pytest.mark.parametrize("case,algo,period,mature", [(0, "hbos", 1.0, 1000), (1, "sstd", 0.5, 1000),
                                                     (2, "hbos", 0.5, 100)])
def test_workers_flag_slowed_tasks_online_and_agree_with_offline(cluster, tmp_path, case, algo, period, mature):
    client = cluster
    n = 300
    deadline = time.monotonic() + 20  # the cluster forgets the tasks of the case before (released asynchronously)
    while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    with observe(client, store=tmp_path, name="anomalies", anomalies={"config": AnomalyConfig(algo=algo), "period": period, "mature": mature}) as obs:
        # keys of their own per case (the task prefix stays `work` / `other`): no result of another case is reused
        a = client.map(work, range(n), key=[f"work-{i}-{case}" for i in range(n)])
        b = client.map(other, range(n), key=[f"other-{i}-{case}" for i in range(n)])
        client.gather(a + b)
        del a, b
        # the verdicts made during the run, before the end's final re-judging: once every call has been judged
        # on its worker (each worker judges and syncs on its own period, so their syncs are staggered)
        deadline = time.monotonic() + 120
        while (judged := sum(client.run(_judged).values())) < 2 * n:
            assert time.monotonic() < deadline, f"the workers judged {judged} of {2 * n} calls in 120 s"
            time.sleep(0.1)
        # ... and re-judged what each worker kept to judge again against the model of every worker's calls: once
        # each has synced its last calls' statistics (the version then is the model of all of them), each worker
        # still holding calls must adopt that model (or a later one) while the run goes on
        while True:
            now = client.run(_model_state)
            if all(unsent == 0 for unsent, _, _ in now.values()):
                break
            assert time.monotonic() < deadline, f"the workers did not sync their last calls in 120 s: {now}"
            time.sleep(0.1)
        complete = max(v for _, v, _ in now.values())
        while True:
            now = client.run(_model_state)
            if all(v >= complete or not pending for _, v, pending in now.values()):
                break
            assert time.monotonic() < deadline, f"a worker kept calls but never adopted model {complete}: {now}"
            time.sleep(0.1)
        during = set(obs.run.arrow("anomalies")["task_key"].to_pylist())
    assert all(v == 0 for v in obs.hook_errors.values()), obs.hook_errors
    stats = obs.anomaly_stats
    assert len(stats) == 2 and all(s["errors"] == 0 for s in stats.values()), stats
    assert sum(s["calls"] for s in stats.values()) == 2 * n  # every task judged once, on its worker
    # the model was synced through the collector more than once on each worker (the run lasts several periods)
    assert all(s["syncs"] >= 2 for s in stats.values()), stats

    run = obs.run
    raw = run.arrow("anomalies")
    online = distributed_anomalies(run)
    spans = run.sql("SELECT task_key, start_ns, end_ns FROM spans WHERE kind = 'task'").set_index("task_key")
    slowed = {f"work-{i}-{case}" for i in SLOW}
    if algo == "sstd":  # the SSTD rule over all `work` calls, worked out here: its std is inflated by the
        # slowdowns themselves (masking), so the mildest may stay within 6 std
        work_ns = (spans["end_ns"] - spans["start_ns"])[spans.index.str.startswith("work-")].astype(float)
        mean, std = work_ns.mean(), work_ns.std(ddof=1)
        slowed = {k for k in slowed if abs(work_ns[k] - mean) > 6 * std}
        assert len(slowed) >= 2
    else:  # HBOS flags the calls alone in the rarest bins of the calls' measured durations: a busy machine can
        # stretch a normal call into a slowed call's bin, which is then no longer rare (the rule over all
        # `work` calls, run here on the measured spans, says which slowed calls stand alone)
        rule = detect(run.arrow("spans"), AnomalyConfig(algo="hbos")).anomalies
        slowed &= set(rule["task_key"].to_pylist())
        assert slowed
    # each slowed call was flagged by its worker: online against the model of that moment, or later (`late`)
    # when that model held fewer than `mature` calls of its function
    assert slowed <= set(raw["task_key"].to_pylist())
    for row in raw.to_pylist():
        m = json.loads(row["model"])
        assert m["online"] is True and m["algo"] == algo and m["worker"] in stats
        assert row["score"] >= row["threshold"]
        assert row["inclusive_ns"] == row["end_ns"] - row["start_ns"]
    # ... and survives post-pruning
    assert slowed <= set(online["task_key"].to_pylist())
    # ranked by time lost: the call's duration minus the mean of the model it was judged against. (Whether the
    # slowed calls lose the most time is up to the machine: a saturated one stretched a normal 10 ms call by
    # 0.3 s here, beyond the least slowdown.)
    for row in raw.to_pylist():
        assert row["severity_ns"] == round(row["inclusive_ns"] - json.loads(row["model"])["mean"]), row

    # post-pruning removed exactly what the workers logged as pruned
    pruned = run.sql(f"SELECT task_key FROM logs WHERE category = '{PRUNED}'")
    assert raw.num_rows - online.num_rows == len(pruned) == sum(s["pruned"] for s in stats.values())

    # the online times are the spans' times: the same call, the same nanoseconds
    for row in online.to_pylist():
        assert (spans.loc[row["task_key"], "start_ns"], spans.loc[row["task_key"], "end_ns"]) == \
            (row["start_ns"], row["end_ns"])

    offline = _offline(obs.run_dir, tmp_path, algo)
    dist = set(online["task_key"].to_pylist())
    recall = len(during & offline) / len(offline)
    print(f"{algo}: online flagged {raw.num_rows} ({len(during)} during the run), after post-pruning {len(dist)}, "
          f"offline {len(offline)}; recall of the verdicts made during the run {recall:.3f}; "
          f"late {sum(s['late'] for s in stats.values())}, calls kept to judge again "
          f"at most {max(s['pending_max'] for s in stats.values())} per worker")
    assert slowed <= offline
    # during the run, before the end re-judged anything against the final model, the workers had flagged every
    # slowed call (against the global model of their moment)
    assert slowed <= during, sorted(slowed - during)
    # after post-pruning, the flagged set is the offline pass's exactly: no call in one set only
    assert dist == offline, (sorted(dist - offline), sorted(offline - dist))
    # pruned anomalies are ones the offline pass (the model of the whole run) does not flag
    assert not set(pruned["task_key"]) & offline
    # and the report's anomalies page shows the anomalies that stand, not those post-pruning withdrew
    from flowscope.report.views import anomalies_view

    shown = anomalies_view(run)
    assert shown["source"] == "recorded" and shown["anomalies"] == online.num_rows


SCRIPT = '''
import time
from distributed import Client, LocalCluster

SLOW = {SLOW!r}

def work(i):
    time.sleep(SLOW.get(i, 0.01 + 0.002 * ((i * 7919) % 5)))
    return i

if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as c:
        c.gather(c.map(work, range(200), key=[f"work-{{i}}" for i in range(200)]))
'''


def test_flowscope_run_anomalies_option(tmp_path):
    """`flowscope run --anomalies`: workers started by the command get the detector through the Dask preload and
    post-prune on teardown."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(SLOW={37: 0.6, 111: 0.9, 190: 1.2}))  # far beyond what load stretches a 10 ms call to
    store = tmp_path / "store"
    out = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(store), "--no-report", "--quiet",
                          "--sample-period", "0", "--anomalies", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = [p for p in store.iterdir() if (p / "run.json").exists()]
    import flowscope

    run = flowscope.open_run(run_dir)
    raw = run.arrow("anomalies")
    # the slowed calls that stand alone in the rarest bins of the measured durations (a busy machine can stretch
    # a normal call into a slowed call's bin): the rule over the whole run, worked out here
    slowed = {"work-37", "work-111", "work-190"} & set(detect(run.arrow("spans")).anomalies["task_key"].to_pylist())
    assert slowed
    assert slowed <= set(raw["task_key"].to_pylist())
    assert all(json.loads(m)["online"] for m in raw["model"].to_pylist())
    online = distributed_anomalies(run)
    assert slowed <= set(online["task_key"].to_pylist())
    assert raw.num_rows - online.num_rows == \
        run.sql(f"SELECT count(*) AS n FROM logs WHERE category = '{PRUNED}'")["n"][0]


def test_collector_ingests_anomalies_rows_and_names_a_wrong_typed_field(collector):
    """The workers' rows reach the run through the collector's ingest route, which checks them like any table."""
    import httpx
    import pyarrow as pa

    import flowscope
    from flowscope.client.transport import ARROW_STREAM, ipc_bytes

    http = httpx.Client(base_url=collector.address, timeout=30)
    run_id = http.post("/v1/runs", json={"name": "t"}).json()["run_id"]
    row = {"anomaly_id": 1, "call_id": -1, "resource_id": "thread:1", "function": "work", "kind": "task",
           "task_key": "work-1", "start_ns": 10, "end_ns": 30, "inclusive_ns": 20, "exclusive_ns": 20,
           "metric": "exclusive", "algo": "hbos", "score": 9.0, "threshold": 8.0, "severity_ns": 5, "step": 0,
           "depth": 0, "children": 0, "messages": 0, "model": "{}"}
    ok = http.post(f"/v1/runs/{run_id}/tables/anomalies", content=ipc_bytes(pa.Table.from_pylist([row])),
                   headers={"Content-Type": ARROW_STREAM})
    assert ok.status_code == 200 and ok.json()["rows"] == 1
    bad = http.post(f"/v1/runs/{run_id}/tables/anomalies", json=[{**row, "score": "high"}])
    assert bad.status_code == 422 and "score" in bad.json()["error"]
    assert http.get(f"/v1/runs/{run_id}/tables/anomalies").json()
    collector.stop()
    got = flowscope.open_run(collector.store / run_id).arrow("anomalies")
    assert got.num_rows == 1 and got["task_key"][0].as_py() == "work-1"


def test_bad_plugin_options_are_refused():
    from flowscope.sources.dask.anomaly_plugin import AnomalyWorkerPlugin

    with pytest.raises(ValueError, match="period"):
        AnomalyWorkerPlugin("http://127.0.0.1:1", "r", period=0)
    with pytest.raises(ValueError, match="mature"):
        AnomalyWorkerPlugin("http://127.0.0.1:1", "r", mature=-1)
