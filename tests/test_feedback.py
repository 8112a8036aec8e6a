"""Ready-made feedback actions (flowscope.feedback) run by a forecast rule on a live run: a signal reaches a real
process, a process is stopped, a real Dask cluster is scaled down directly and through its adaptive API; every
action leaves one audit row (its name, its outcome, what it changed) in the run's logs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

import flowscope
from flowscope.feedback import adapt_cluster, scale_cluster, signal_process, stop_process
from flowscope.store.run import open_run

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def _live_run(tmp_path):
    """A live run (embedded collector) whose two threads take turns with a gap between them (a: 0-4 ms, b: 5-9 ms of
    every 10 ms), so that one or both are idle at every moment: "at least half idle" is certain for the next frame."""
    fs = flowscope.Client(store=tmp_path / "store", name="feedback")
    for r in ("a", "b"):
        fs.resource("thread", r)
    for k in range(40):
        fs.span(f"a{k}", T0 + (10 * k) * MS, T0 + (10 * k + 4) * MS, kind="task", resource_id="a")
        fs.span(f"b{k}", T0 + (10 * k + 5) * MS, T0 + (10 * k + 9) * MS, kind="task", resource_id="b")
    fs.flush()
    return fs


def _audit(fs) -> list[dict]:
    fs.close()
    run = open_run(fs.run_dir)
    rows = run.sql("SELECT message, attrs FROM logs WHERE category = 'feedback' ORDER BY ts_ns")
    return [{**json.loads(a), "message": m} for m, a in zip(rows["message"], rows["attrs"])]


_WAITER = """
import signal, sys, time
def got(sig, frame):
    open(sys.argv[1], "w").write(str(sig))
    sys.exit(0)
signal.signal(signal.SIGUSR1, got)
print("ready", flush=True)
time.sleep(120)
"""


def _waiting_process(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WAITER, str(tmp_path / "got-signal")], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_signal_reaches_a_real_process_and_the_action_is_audited(tmp_path):
    proc = _waiting_process(tmp_path)
    fs = _live_run(tmp_path)
    action = signal_process(proc.pid, signal.SIGUSR1)
    rule = flowscope.forecast.when(fs, "idle", 0.5, likelihood=0.5, do=action, window=4, start=False)
    frame = rule.check()
    assert frame is not None and rule.check() is None  # acted on once
    assert proc.wait(timeout=60) == 0 and (tmp_path / "got-signal").read_text() == str(int(signal.SIGUSR1))
    rule.stop()
    [row] = _audit(fs)
    assert row["rule"] == "forecast" and row["outcome"] == "ok" and row["frame"] == frame["frame"]
    assert row["action"] == f"signal_process(pid={proc.pid}, signal=SIGUSR1)"
    assert row["result"] == {"pid": proc.pid, "signal": "SIGUSR1"}


def test_stop_process_ends_it_and_a_failed_action_is_audited_with_its_error(tmp_path):
    proc = _waiting_process(tmp_path)
    fs = _live_run(tmp_path)
    rule = flowscope.forecast.when(fs, "idle", 0.5, likelihood=0.5, do=stop_process(proc.pid), window=4,
                                   start=False)
    rule.check()
    assert proc.wait(timeout=60) == -signal.SIGTERM
    # the process is gone: signalling it again fails, the caller hears it and the audit row says so
    again = flowscope.forecast.when(fs, "idle", 0.5, likelihood=0.5, do=stop_process(proc.pid), window=4,
                                    start=False)
    with pytest.raises(ProcessLookupError):
        again.check()
    rule.stop()
    again.stop()
    rows = _audit(fs)
    assert [r["outcome"] for r in rows] == ["ok", "ProcessLookupError"]
    assert rows[0]["action"] == f"stop_process(pid={proc.pid}, signal=SIGTERM)" and "result" not in rows[1]


def test_bad_actions_are_refused_with_the_parameter_named():
    with pytest.raises(ValueError, match="pid: expected a positive process id"):
        signal_process(0)
    with pytest.raises(ValueError, match="by: expected a non-zero number of workers"):
        scale_cluster(object(), by=0)
    with pytest.raises(ValueError, match="minimum: must be <= maximum"):
        adapt_cluster(object(), minimum=3, maximum=1)


def _workers(client) -> int:
    return len(client.scheduler_info(n_workers=-1)["workers"])


def _wait_for(pred, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["scale", "adapt"])
def test_a_real_dask_cluster_is_scaled_down_when_idleness_is_predicted(tmp_path, how):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        _wait_for(lambda: _workers(client) == 2, "the cluster never had its 2 workers")
        fs = _live_run(tmp_path)
        action = (scale_cluster(cluster, by=-1, minimum=1) if how == "scale"
                  else adapt_cluster(cluster, minimum=1, maximum=1, interval="100ms", wait_count=1))
        rule = flowscope.forecast.when(fs, "idle", 0.5, likelihood=0.5, do=action, window=4, start=False)
        assert rule.check() is not None
        _wait_for(lambda: _workers(client) == 1, f"{how}: the cluster kept {_workers(client)} workers")
        rule.stop()
        [row] = _audit(fs)
    assert row["outcome"] == "ok"
    if how == "scale":
        assert row["action"] == "scale_cluster(LocalCluster, by=-1, minimum=1, maximum=None)"
        assert row["result"] == {"workers_before": 2, "workers_after": 1}
    else:
        assert row["action"] == "adapt_cluster(LocalCluster, minimum=1, maximum=1)"
        assert row["result"] == {"minimum": 1, "maximum": 1}


# ---- rules on the anomaly detector's verdicts (flowscope.anomalies.when) -----------------------------------------
SLOWED = {40: 0.3, 120: 0.4}


def _work(i):
    time.sleep(SLOWED.get(i, 0.01))
    return i


def test_an_anomaly_rule_acts_once_per_anomaly_of_a_live_dask_run_and_on_a_finished_one(tmp_path):
    from distributed import Client, LocalCluster

    from flowscope.analysis.anomalies import AnomalyConfig

    acted: list[dict] = []
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        with flowscope.observe(client, store=tmp_path / "store", name="anomaly-rule",
                               anomalies={"config": AnomalyConfig(algo="sstd"), "period": 0.3, "mature": 50}) as obs:
            rule = flowscope.anomalies.when(obs.client, do=acted.append, interval=0.2)
            client.gather(client.map(_work, range(200), key=[f"work-{i}" for i in range(200)]))
            deadline = time.monotonic() + 120
            while not any(a["task_key"] == "work-120" for a in acted):  # the live verdicts reach the rule
                assert rule.error is None, rule.error
                assert time.monotonic() < deadline, f"the rule saw {[a['task_key'] for a in acted]}"
                time.sleep(0.1)
            rule.stop()
    ids = [a["anomaly_id"] for a in acted]
    assert len(ids) == len(set(ids))  # once per anomaly
    assert all(a["function"] == "work" and a["score"] >= a["threshold"] for a in acted)
    run = open_run(obs.run_dir)
    rows = run.sql("SELECT attrs FROM logs WHERE category = 'feedback'")["attrs"]
    audit = [json.loads(a) for a in rows]
    assert sorted(a["anomaly_id"] for a in audit) == sorted(ids)
    assert all(a["rule"] == "anomaly" and a["outcome"] == "ok" and a["action"].endswith("append") for a in audit)
    # on the finished run, read from its directory: every anomaly row once, filtered; nothing is written to it
    seen: list[dict] = []
    later = flowscope.anomalies.when(obs.run_dir, do=seen.append, min_severity_ns=250_000_000, start=False)
    later.check()
    later.check()
    flagged = run.sql("SELECT task_key FROM anomalies WHERE severity_ns >= 250000000")["task_key"]
    assert sorted(a["task_key"] for a in seen) == sorted(set(flagged)) and "work-120" in set(flagged)
    assert len(run.sql("SELECT attrs FROM logs WHERE category = 'feedback'")) == len(audit)
