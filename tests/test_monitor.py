"""`flowscope monitor` (a node's hardware sampler as a process of its own, joining a run by address) and the
collector's Prometheus ``/metrics``, against a real `flowscope serve` on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

import flowscope
from flowscope.model import identifiers as ids

#: generous: on a saturated 2-core machine a child can wait long for its first slice of CPU
DEADLINE_S = 180.0


def _monitor(address: str, run_id: str, *extra: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:  # a file, not a pipe nobody reads
        return subprocess.Popen([sys.executable, "-m", "flowscope", "monitor", "--address", address, "--run", run_id,
                                 *extra], stdout=out, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items() if not k.startswith("FLOWSCOPE_")})


def _cpu_samples(run_dir: Path) -> list[int]:
    if not (run_dir / "metrics").is_dir():
        return []
    run = flowscope.open_run(run_dir)
    try:
        df = run.sql("SELECT ts_ns FROM metrics WHERE namespace = 'hardware' AND name = 'cpu.percent' "
                     f"AND resource_id = '{ids.host_id()}' ORDER BY ts_ns")
    finally:
        run.close()
    return [int(x) for x in df["ts_ns"]]


def _wait_for(what: str, check, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"monitor exited {proc.returncode} before {what}: {log.read_text() if log else ''}")
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {DEADLINE_S} s")


def _status(run_dir: Path) -> str:
    return flowscope.open_run(run_dir).meta.get("status")


def test_monitor_joins_a_run_samples_it_and_leaves_it_open(collector, tmp_path):
    owner = flowscope.Client(collector.address, name="script-pipeline")  # a non-Dask workflow: it opens the run
    run_dir = collector.store / owner.run_id
    owner.span("step", 1, 2, kind="task")
    owner.flush()
    log = tmp_path / "monitor.log"
    proc = _monitor(collector.address, owner.run_id, "--period", "0.2", log=log)
    try:
        _wait_for("three CPU samples", lambda: len(_cpu_samples(run_dir)) >= 3, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    samples = _cpu_samples(run_dir)
    assert samples == sorted(set(samples)), "one sample per instant, in time order"
    run = flowscope.open_run(run_dir)
    hosts = run.sql("SELECT resource_id, kind FROM resources WHERE kind = 'host'")
    assert ids.host_id() in set(hosts["resource_id"])
    assert _status(run_dir) == "running", "a monitor joins a run; only its owner closes it"
    text = log.read_text()
    assert owner.run_id in text and "samples" in text
    owner.close()
    assert _status(run_dir) == "finished"


def test_a_second_monitor_for_the_same_run_and_host_leaves_the_first_alone(collector, tmp_path):
    owner = flowscope.Client(collector.address, name="pipeline")
    run_dir = collector.store / owner.run_id
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _monitor(collector.address, owner.run_id, "--period", "0.2", log=first_log)
    try:
        _wait_for("the first monitor's samples", lambda: len(_cpu_samples(run_dir)) >= 1, first, first_log)
        second = _monitor(collector.address, owner.run_id, "--period", "0.2", log=second_log)
        assert second.wait(DEADLINE_S) == 0, second_log.read_text()
        assert "already" in second_log.read_text()
        assert first.poll() is None, "the first monitor goes on"
        before = len(_cpu_samples(run_dir))
        _wait_for("more samples from the first monitor", lambda: len(_cpu_samples(run_dir)) > before, first, first_log)
    finally:
        for p in (first,):
            p.send_signal(signal.SIGTERM)
            p.wait(DEADLINE_S)
    owner.close()


def test_the_monitor_stops_when_its_run_ends(collector, tmp_path):
    owner = flowscope.Client(collector.address, name="pipeline")
    run_dir = collector.store / owner.run_id
    log = tmp_path / "monitor.log"
    proc = _monitor(collector.address, owner.run_id, "--period", "0.2", "--check-every", "0.2", log=log)
    try:
        _wait_for("a CPU sample", lambda: len(_cpu_samples(run_dir)) >= 1, proc, log)
        owner.close()
        assert proc.wait(DEADLINE_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "finished" in log.read_text()


def test_the_monitor_names_what_is_wrong(collector, tmp_path):
    cases = [
        (["--address", collector.address, "--run", "no-such-run"], "no-such-run"),
        (["--address", "http://127.0.0.1:9", "--run", "r1"], "127.0.0.1:9"),
        (["--address", collector.address], "--run"),
        (["--address", collector.address, "--run", "r1", "--period", "0"], "--period"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWSCOPE_")}
    for argv, named in cases:
        p = subprocess.run([sys.executable, "-m", "flowscope", "monitor", *argv], capture_output=True, text=True,
                           env=env, timeout=DEADLINE_S)
        assert p.returncode != 0, argv
        assert named in p.stderr, (argv, p.stderr)


# ---- Prometheus --------------------------------------------------------------------------------------------------
def _families(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(families: dict, name: str, **labels) -> float:
    for fam in families.values():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(f"{name}{labels} not exposed")


def test_metrics_are_prometheus_text_that_counts_what_was_written(collector):
    before = _families(httpx.get(f"{collector.address}/metrics", timeout=30).text)
    spans_before = _sample(before, "flowscope_collector_rows_total", table="spans") \
        if any(s.labels.get("table") == "spans" for f in before.values() for s in f.samples) else 0.0
    client = flowscope.Client(collector.address, name="counted")
    for i in range(1234):
        client.span("work", i, i + 1, kind="task")
    client.close()
    r = httpx.get(f"{collector.address}/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    fams = _families(r.text)
    health = httpx.get(f"{collector.address}/v1/health", timeout=30).json()
    assert _sample(fams, "flowscope_collector_rows_total", table="spans") - spans_before == 1234
    assert _sample(fams, "flowscope_collector_batches_total") == health["batches"]
    assert _sample(fams, "flowscope_collector_refusals_total", reason="busy") == health["busy_refusals"]
    assert _sample(fams, "flowscope_collector_reserved_bytes") >= 0
    assert _sample(fams, "flowscope_collector_runs", status="finished") >= 1
    assert fams["flowscope_collector_rows"].type == "counter"


def test_metrics_need_the_token_when_the_collector_has_one(collector_factory):
    token = "prometheus-scrape-token"
    c = collector_factory("--token", token)
    assert httpx.get(f"{c.address}/metrics", timeout=30).status_code == 401
    r = httpx.get(f"{c.address}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200
    assert "flowscope_collector_batches_total" in r.text

