"""A collector killed mid-run, a collector that is not there, and replaying spools: nothing lost, nothing twice."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import flowscope
from conftest import check_exactly_once
from flowscope import Client, FlowscopeError
from flowscope.model.conform import SchemaError


def collector_health(address: str) -> dict:
    import httpx

    return httpx.get(f"{address}/v1/health", timeout=30).json()


def _flowscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowscope", *args], capture_output=True, text=True, timeout=120)


def test_sigkill_mid_send_then_restart_loses_and_duplicates_nothing(collector, tmp_path):
    n = 300_000
    client = Client(collector.address, name="killed", spool_dir=tmp_path / "spool", flush_records=5_000,
                    flush_interval=0.05)
    sent = 0
    killed = threading.Event()

    def produce() -> None:
        nonlocal sent
        for i in range(n):
            client.span("work", i, i + (i % 1000), span_id=i)
            sent = i + 1
            if i % 2000 == 0:
                time.sleep(0.002)  # a steady stream rather than one burst

    producer = threading.Thread(target=produce)
    producer.start()
    while sent < n // 3:
        time.sleep(0.005)
    collector.kill()  # SIGKILL while batches are in flight
    killed.set()
    sent_at_kill = sent
    deadline = time.monotonic() + 60  # the client notices, spools, keeps accepting records
    while client.stats["batches_spooled"] == 0:
        assert time.monotonic() < deadline, "the client spooled nothing in 60 s with its collector gone"
        time.sleep(0.01)
    collector.start()  # same port, same store
    producer.join()
    client.close()  # replays whatever is still spooled
    assert sent_at_kill < n
    assert client.stats["batches_replayed"] > 0
    assert not client.spool.pending(client.run_id)
    run = flowscope.open_run(collector.store / client.run_id)
    check_exactly_once(run, n)
    assert run.meta["status"] == "finished"
    while collector_health(collector.address)["dead_temps_removed"] is None:  # its sweep at start is done
        time.sleep(0.02)
    assert not list(run.path.glob("*/.*.tmp"))  # a restarted collector cleans up temp files of the killed one


def test_a_batch_on_disk_but_not_acknowledged_is_replayed_as_a_duplicate(collector_factory, tmp_path):
    """The collector is killed right after a segment is renamed into place and before its batch is
    acknowledged (a test-only fault injection point): the client keeps the batch, replays it to the
    restarted collector, which answers that it has it already, and every record is stored once."""
    import httpx

    n = 60_000
    doomed = collector_factory(env={"FLOWSCOPE_TEST_KILL_AFTER_SEGMENTS": "3"})
    client = Client(doomed.address, name="killed-after-rename", spool_dir=tmp_path / "spool",
                    flush_records=5_000, flush_interval=0.05)
    for i in range(n):
        client.span("work", i, i + (i % 1000), span_id=i)
    assert doomed.proc.wait(60) == -signal.SIGKILL
    assert client.flush(timeout=60)  # everything emitted is delivered or spooled
    assert client.stats["batches_spooled"] > 0
    assert "test fault injection: killing the collector after segment" in doomed.log_path.read_text()
    doomed.start(env={})  # same port and store, no fault injection
    client.close()  # replays the spool
    assert client.stats["batches_replayed"] > 0
    assert httpx.get(f"{doomed.address}/v1/health").json()["duplicates"] >= 1
    run = flowscope.open_run(doomed.store / client.run_id)
    check_exactly_once(run, n)
    assert run.meta["status"] == "finished"


def test_unreachable_collector_spools_everything_and_ingest_spool_delivers_it(collector_factory, tmp_path):
    spool = tmp_path / "spool"
    client = Client("http://127.0.0.1:9", name="offline", spool_dir=spool, flush_records=1000)  # port 9: nothing
    for i in range(10_000):
        client.span("work", i, i + (i % 1000), span_id=i)
    client.metric("m", 1.5)
    with pytest.raises(FlowscopeError, match="ingest-spool"):
        client.close()
    assert len(client.spool.pending(client.run_id)) >= 10
    assert (spool / client.run_id / "close.json").is_file()
    backup = tmp_path / "spool-copy"
    shutil.copytree(spool, backup)

    collector = collector_factory()
    res = _flowscope("ingest-spool", str(spool), "--address", collector.address, "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["rows"] == 10_000 + 1 + 3 and report["closed_runs"] == 1 and report["duplicates"] == 0
    assert not (spool / client.run_id).exists()
    run = flowscope.open_run(collector.store / client.run_id)
    check_exactly_once(run, 10_000)
    assert run.meta["status"] == "finished" and run.meta["name"] == "offline"

    # replaying the same batches again (say, a copy someone kept) adds nothing
    res = _flowscope("ingest-spool", str(backup), "--address", collector.address, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["duplicates"] == json.loads(res.stdout)["batches"] > 0
    check_exactly_once(run, 10_000)


def test_ingest_spool_straight_into_a_store(tmp_path):
    spool = tmp_path / "spool"
    client = Client("http://127.0.0.1:9", name="offline", spool_dir=spool)
    client.log("hello", level="warning", category="test")
    with pytest.raises(FlowscopeError):
        client.close()
    res = _flowscope("ingest-spool", str(spool / client.run_id), "--store", str(tmp_path / "store"))
    assert res.returncode == 0, res.stderr
    logs = flowscope.open_run(tmp_path / "store" / client.run_id).table("logs")
    assert logs[["message", "level", "category"]].values.tolist() == [["hello", "warning", "test"]]


def test_a_record_that_does_not_fit_is_refused_in_the_callers_own_call(tmp_path):
    client = Client(store=tmp_path / "store", spool_dir=tmp_path / "spool")
    client.span("good", 1, 2)
    with pytest.raises(SchemaError, match="spans.start_ns: expected an int64 \\(ns\\), got str 'not-a-time'"):
        client.span("bad", "not-a-time", 3)
    with pytest.raises(SchemaError, match="logs.category: is required but was None"):
        client.log("x", category=None)
    client.span("good", 3, 4)
    client.close()  # nothing else was affected
    run = flowscope.open_run(tmp_path / "store" / client.run_id)
    assert run.table("spans")["name"].tolist() == ["good", "good"]
    assert run.counts()["logs"] == 0


def test_sigterm_drains_the_queue_and_exits_cleanly(collector_factory):
    """SIGTERM while batches are provably queued (a slow writer, eight batches sent at once without
    waiting for one another): every batch is still acknowledged, stored, and the collector exits 0."""
    import httpx
    from test_collector_memory import arrow_body, post

    slow = collector_factory("--writer-delay", "0.5", "--writers", "1")
    assert httpx.post(f"{slow.address}/v1/runs", json={"run_id": "term"}).status_code == 201
    k, rows = 8, 2_000
    bodies = [arrow_body(i * rows, rows) for i in range(k)]
    answers: dict[int, tuple[int, bytes]] = {}

    def send(i: int) -> None:
        answers[i] = post(slow.address, "/v1/runs/term/tables/spans", bodies[i],
                          "application/vnd.apache.arrow.stream", f"term-{i}", chunked=False)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(k)]
    for t in senders:
        t.start()
    deadline = time.monotonic() + 60
    while (queued := httpx.get(f"{slow.address}/v1/health").json()["queued_batches"]) < 4:
        assert time.monotonic() < deadline and not answers, f"batches never queued up ({answers})"
        time.sleep(0.02)
    slow.proc.send_signal(signal.SIGTERM)
    for t in senders:
        t.join(60)
    assert slow.proc.wait(30) == 0
    assert queued >= 4
    acknowledged = [i for i, (status, _) in answers.items() if status == 200]
    assert sorted(acknowledged) == list(range(k)), answers
    run = flowscope.open_run(slow.store / "term")
    assert sorted(p.stem for p in (run.path / "spans").glob("*.parquet")) == sorted(f"term-{i}" for i in range(k))
    got = run.sql("SELECT count(*) AS n, count(DISTINCT span_id) AS ids, sum(span_id) AS id_sum FROM spans").iloc[0]
    n = k * rows
    assert (int(got["n"]), int(got["ids"]), int(got["id_sum"])) == (n, n, n * (n - 1) // 2)


def test_a_store_that_cannot_be_written_spools_instead_of_losing_records(tmp_path):
    store = tmp_path / "store"
    client = Client(store=store, spool_dir=tmp_path / "spool", busy_timeout=0.5)
    client.span("before", 0, 1)
    assert client.flush(timeout=30)
    (client.run_dir / "logs").write_text("a file where the logs folder should be")
    client.log("kept", level="error", category="test")
    client.span("after", 1, 2)
    with pytest.raises(FlowscopeError, match="ingest-spool"):
        client.close()
    assert len(client.spool.pending(client.run_id)) == 1  # the logs batch; the spans went through
    (client.run_dir / "logs").unlink()
    res = _flowscope("ingest-spool", str(tmp_path / "spool"), "--store", str(store), "--json")
    assert res.returncode == 0, res.stderr
    run = flowscope.open_run(client.run_dir)
    assert run.table("logs")["message"].tolist() == ["kept"]
    assert sorted(run.table("spans")["name"]) == ["after", "before"]


def test_the_same_batch_twice_at_once_is_written_once(tmp_path):
    from flowscope.service.collector import Collector
    from flowscope.client.packer import Packer

    c = Collector(tmp_path, writer_delay=0.2)
    run_id = c.open_run({"name": "dup"})["run_id"]
    p = Packer("spans")
    for i in range(10):
        p.add(i, None, "r", "call", "f", i, i + 1, None, None)
    batch = p.take()
    first = c.submit(run_id, "spans", "seg-1", batch)
    second = c.submit(run_id, "spans", "seg-1", batch)
    assert (first.result(10).duplicate, second.result(10).duplicate) == (False, True)
    c.shutdown()
    assert c.stats["rows"] == 10
    assert flowscope.open_run(tmp_path / run_id).counts()["spans"] == 10


def test_a_collector_that_logs_a_lot_keeps_answering(collector):
    """Every failed segment write logs a traceback (about 1.6 KB); 100 of them are more than a pipe
    holds (64 KiB), so a fixture that never reads the collector's output would freeze it here."""
    import httpx

    runs = f"{collector.address}/v1/runs"
    assert httpx.post(runs, json={"run_id": "noisy"}).status_code == 201
    (collector.store / "noisy" / "spans").write_text("a file where the spans folder should be")
    span = [{"resource_id": "x", "kind": "task", "name": "n", "start_ns": 1, "end_ns": 2}]
    for _ in range(100):  # a new connection each time: uvicorn closes one after an internal error
        res = httpx.post(f"{runs}/noisy/tables/spans", json=span, timeout=30)
        assert res.status_code == 500 and "FileExistsError" in res.json()["error"]
    log = [{"ts_ns": 1, "resource_id": "x", "level": "info", "category": "test", "message": "still here"}]
    res = httpx.post(f"{runs}/noisy/tables/logs", json=log, timeout=30)
    assert res.status_code == 200, res.text
    assert collector.log_path.stat().st_size > 64 * 1024
    assert collector.log_path.read_text().count("FileExistsError") >= 100
