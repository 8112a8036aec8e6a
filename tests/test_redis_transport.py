"""Producers and collectors joined by Redis Streams (a real redis-server, real `flowscope serve` processes and
producer processes): one run carried from several producer processes to several collector instances of one store,
at least once and without duplicates, also when a collector is killed between writing a batch and acknowledging it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import flowscope
from flowscope import Client
from conftest import CollectorProcess, _free_port, check_exactly_once, require_module

redis = require_module("redis", "the Redis Streams transport: pip install 'flowscope[redis]'")

PRODUCER = """
import sys
from flowscope import Client
url, run_id, first, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = Client(url, run_id=run_id, flush_records=250)
for i in range(first, first + n):
    c.span("work", i, i + (i % 1000), span_id=i)
c.close()
"""


def _stream_done(r, stream: str) -> bool:
    """Every entry of ``stream`` acknowledged (collectors delete what they acknowledged)."""
    groups = r.xinfo_groups(stream) if r.exists(stream) else []
    return r.xlen(stream) == 0 and all(g["pending"] == 0 for g in groups)


def _wait_done(r, stream: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not _stream_done(r, stream):
        assert time.monotonic() < deadline, (r.xlen(stream), r.xinfo_groups(stream))
        time.sleep(0.1)


def test_four_producer_processes_reach_two_collectors_through_redis_with_one_killed_mid_run(redis_url, tmp_path):
    """The first collector is alone on the stream and kills itself right after writing its third batch, before
    acknowledging it (and with more batches read ahead): the second, started after, claims what the first held,
    finds the third batch already on disk (a duplicate, not written twice) and writes the rest. Every row arrives
    exactly once, and the stream ends empty."""
    stream = "fs-kill"
    url = f"{redis_url}?stream={stream}"
    store = tmp_path / "store"
    first = CollectorProcess(store, tmp_path, ["--redis", url, "--redis-claim-idle", "1"],
                             {"FLOWSCOPE_TEST_KILL_AFTER_SEGMENTS": "3"}).start()
    owner = Client(url, name="through redis", spool_dir=tmp_path / "spool-owner")
    per, producers = 5000, 4
    procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, url, owner.run_id, str(k * per), str(per)],
                              env={**os.environ, "FLOWSCOPE_SPOOL": str(tmp_path / f"spool-{k}")})
             for k in range(producers)]
    for p in procs:
        assert p.wait(300) == 0
    first.proc.wait(120)  # it dies by its own hand after three segments
    assert first.proc.returncode == -9
    r = redis.Redis.from_url(redis_url)
    assert not _stream_done(r, stream)  # what it held is still pending in its name
    second = CollectorProcess(store, tmp_path, ["--redis", url, "--redis-claim-idle", "1"]).start()
    try:
        owner.close()
        _wait_done(r, stream)
        health = httpx.get(f"{second.address}/v1/health", timeout=10).json()
        assert health["duplicates"] >= 1, health  # the batch the first wrote but did not acknowledge
        run = flowscope.open_run(store / owner.run_id)
        check_exactly_once(run, producers * per)
        assert run.meta["status"] == "finished"
        assert run.meta["name"] == "through redis"
    finally:
        second.stop()


def test_a_batch_the_collector_refuses_goes_to_the_rejected_stream_with_the_reason(redis_url, tmp_path):
    """A producer does not hear from the collector over Redis: a batch the collector refuses for good (a table it
    does not know) is acknowledged and moved to ``<stream>:rejected`` with the reason, not retried for ever; the
    good rows around it are stored."""
    from flowscope.client.redis_transport import RedisTransport
    from flowscope.client.transport import ipc_bytes

    import pyarrow as pa

    stream = "fs-reject"
    url = f"{redis_url}?stream={stream}"
    store = tmp_path / "store"
    c = CollectorProcess(store, tmp_path, ["--redis", url]).start()
    try:
        owner = Client(url, name="reject", spool_dir=tmp_path / "spool")
        for i in range(100):
            owner.span("work", i, i + (i % 1000), span_id=i)
        owner.flush()
        RedisTransport(url).send(owner.run_id, "no_such_table", "seg-bad", ipc_bytes(pa.table({"x": [1, 2]})))
        owner.close()
        r = redis.Redis.from_url(redis_url)
        _wait_done(r, stream)
        rejected = r.xrange(f"{stream}:rejected")
        assert len(rejected) == 1
        fields = {k.decode(): v for k, v in rejected[0][1].items()}
        assert fields["table"] == b"no_such_table" and fields["segment"] == b"seg-bad"
        assert b"no_such_table" in fields["error"]
        check_exactly_once(flowscope.open_run(store / owner.run_id), 100)
    finally:
        c.stop()


def test_a_bad_redis_address_is_named(tmp_path):
    from flowscope.client.redis_transport import RedisTransport

    with pytest.raises(ValueError, match="redis://HOST:PORT"):
        RedisTransport("redis://")
    with pytest.raises(ValueError, match="stream"):
        RedisTransport("redis://127.0.0.1:6379/0?stream=")


def test_an_unreachable_redis_spools_and_says_so(tmp_path):
    """A producer whose broker is down keeps its rows in its spool, as with an unreachable collector."""
    url = f"redis://127.0.0.1:{_free_port()}/0"
    c = Client(url, name="nobody", spool_dir=tmp_path / "spool", busy_timeout=1)
    c.span("work", 0, 10, span_id=0)
    with pytest.raises(flowscope.FlowscopeError, match="could not be delivered"):
        c.close()
    assert any(Path(tmp_path / "spool").rglob("*.arrows"))


def test_a_dask_workflow_reaches_the_store_through_redis(redis_url, tmp_path):
    """The Dask capture's plugins, given the Redis address, send their batches through the stream: every task of a
    real LocalCluster run (worker processes) is one task span, with the graph's dependencies."""
    from distributed import Client as DaskClient
    from distributed import LocalCluster

    from flowscope.sources.dask import register, unregister

    stream = "fs-dask"
    url = f"{redis_url}?stream={stream}"
    store = tmp_path / "store"
    c = CollectorProcess(store, tmp_path, ["--redis", url]).start()
    try:
        owner = Client(url, name="dask through redis", spool_dir=tmp_path / "spool")
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                DaskClient(cluster) as dc:
            register(dc, url, owner.run_id)
            xs = [dc.submit(lambda i: i * i, i, key=f"square-{i}") for i in range(40)]
            total = dc.submit(sum, xs, key="total")
            assert total.result() == sum(i * i for i in range(40))
            errors = unregister(dc)
        assert not any(errors.values()), errors
        owner.close()
        _wait_done(redis.Redis.from_url(redis_url), stream)
        run = flowscope.open_run(store / owner.run_id)
        tasks = run.sql("SELECT task_key, count(*) AS n FROM spans WHERE kind = 'task' GROUP BY task_key")
        assert sorted(tasks["task_key"]) == sorted([f"square-{i}" for i in range(40)] + ["total"])
        assert set(tasks["n"]) == {1}
        deps = run.sql("SELECT count(*) AS n FROM dependencies WHERE task_key = 'total'").iloc[0]["n"]
        assert int(deps) == 40
    finally:
        c.stop()


def test_the_dask_preload_checks_a_redis_address_by_asking_redis(redis_url):
    from flowscope.sources.dask import _check_reachable

    _check_reachable(f"{redis_url}?stream=fs-preload")  # no error: Redis answers
    with pytest.raises(RuntimeError, match="FLOWSCOPE_ADDRESS=redis://"):
        _check_reachable(f"redis://127.0.0.1:{_free_port()}/0")
