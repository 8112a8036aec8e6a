"""End to end through a real collector process on loopback: exactly-once delivery, live queries, backpressure."""

from __future__ import annotations

import threading
import time

import httpx
import psutil

import flowscope
from conftest import check_exactly_once
from flowscope import Client

N_THREADS = 4


def _produce(client: Client, thread_no: int, count: int) -> None:
    base = thread_no * count
    span = client.span
    for i in range(base, base + count):
        span("work", i, i + (i % 1000), kind="call", span_id=i, task_key=f"t{thread_no}")


def test_million_records_from_four_threads_arrive_exactly_once(collector, tmp_path):
    n = 1_000_000
    client = Client(collector.address, name="million", spool_dir=tmp_path / "spool")
    threads = [threading.Thread(target=_produce, args=(client, t, n // N_THREADS)) for t in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    assert client.stats["batches_spooled"] == 0
    run = flowscope.open_run(collector.store / client.run_id)
    assert run.meta["status"] == "finished"
    check_exactly_once(run, n)
    per_thread = run.sql("SELECT task_key, count(*) AS n FROM spans GROUP BY 1 ORDER BY 1")
    assert per_thread["n"].tolist() == [n // N_THREADS] * N_THREADS


def test_run_is_queryable_while_live(collector, tmp_path):
    client = Client(collector.address, name="live", spool_dir=tmp_path / "spool", flush_interval=0.1)
    for i in range(1000):
        client.span("step" if i % 2 else "other", i, i + 5, span_id=i)
    assert client.flush(timeout=30)
    url = f"{collector.address}/v1/runs/{client.run_id}"
    info = httpx.get(url).json()
    assert info["status"] == "running" and info["rows"]["spans"] == 1000
    res = httpx.get(f"{url}/tables/spans", params={"name": "step", "span_id__gte": 990, "order_by": "span_id"})
    assert res.status_code == 200, res.text
    assert [r["span_id"] for r in res.json()["rows"]] == [991, 993, 995, 997, 999]
    live = flowscope.open_run(collector.store / client.run_id)
    assert live.counts()["spans"] == 1000
    client.close()
    assert flowscope.open_run(collector.store / client.run_id).meta["status"] == "finished"


def test_backpressure_bounds_collector_memory_and_loses_nothing(collector_factory, tmp_path):
    queue_mb = 8
    # a slow file system: every segment write takes 0.15 s longer
    slow = collector_factory("--queue-mb", str(queue_mb), "--max-request-mb", "4", "--writer-delay", "0.15")
    proc = psutil.Process(slow.pid)
    baseline = proc.memory_info().rss
    peak = baseline
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    n = 1_600_000
    # four clients sending at once ask for more than the budget, so some of them are told to wait
    clients = [Client(slow.address, name="pressure", flush_records=20_000, max_buffer_records=40_000,
                      spool_dir=tmp_path / f"spool{k}", busy_timeout=60) for k in range(N_THREADS)]
    t0 = time.monotonic()
    threads = [threading.Thread(target=_produce, args=(clients[t], t, n // N_THREADS)) for t in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    produce_s = time.monotonic() - t0
    for c in clients:
        c.close()
    stop.set()
    watcher.join()
    health = httpx.get(f"{slow.address}/v1/health").json()
    # the write budget was never exceeded, producers were slowed down (not dropped), and the
    # collector's resident memory grew by less than the budget plus a fixed allowance for the
    # Parquet writers and the allocator, far below the ~100 MiB of Arrow data that went through it
    assert health["peak_reserved_bytes"] <= queue_mb * 2**20
    assert health["busy_refusals"] > 0
    assert sum(c.stats["busy_retries"] for c in clients) > 0
    growth_mib = (peak - baseline) / 2**20
    print(f"collector RSS growth {growth_mib:.1f} MiB, producers took {time.monotonic() - t0:.1f} s")
    assert growth_mib < 2 * queue_mb + 48, f"collector RSS grew by {growth_mib:.0f} MiB"
    rows = sum(flowscope.open_run(slow.store / c.run_id).counts()["spans"] for c in clients)
    assert rows == n
    assert produce_s > 1.0  # producers were held back by the slow writer


def test_two_clients_share_one_run(collector, tmp_path):
    owner = Client(collector.address, name="shared", spool_dir=tmp_path / "a")
    joiner = Client(collector.address, run_id=owner.run_id, spool_dir=tmp_path / "b")
    assert not joiner.owns_run
    for i in range(5000):
        (owner if i % 2 else joiner).span("x", i, i + (i % 1000), span_id=i)
    joiner.close()
    owner.close()
    run = flowscope.open_run(collector.store / owner.run_id)
    check_exactly_once(run, 5000)
    assert run.counts()["resources"] == 3  # host, process and the main thread, declared by both, stored per client


def test_clients_spread_over_collector_instances_listed_in_an_address_file(collector_factory, tmp_path):
    store = tmp_path / "shared-store"  # one store on a shared file system, several collector instances
    addr_file = tmp_path / "collectors"
    first = collector_factory(store=store)  # each found through its own `serve --address-file`
    second = collector_factory(store=store)
    addr_file.write_text(f"# collectors of this job\n{first.address}\n{second.address}\n")
    owner = Client(address_file=addr_file, name="spread", spool_dir=tmp_path / "s0")
    joiners = [Client(address_file=addr_file, run_id=owner.run_id, spool_dir=tmp_path / f"s{k}") for k in (1, 2, 3)]
    used = {c.address for c in [owner, *joiners]}
    assert used == {first.address, second.address}
    for k, c in enumerate([owner, *joiners]):
        for i in range(k * 1000, (k + 1) * 1000):
            c.span("work", i, i + (i % 1000), span_id=i)
    for c in [*joiners, owner]:
        c.close()
    run = flowscope.open_run(store / owner.run_id)
    check_exactly_once(run, 4000)
    assert run.meta["status"] == "finished"


def test_a_joiner_that_arrives_before_the_run_is_opened_waits_for_it(collector, tmp_path):
    """A joining client (a worker's plugin, another collector instance's producer) may send before the run's owner
    has opened it: the collector answers 404 "unknown run", which the joiner treats like a busy collector (it retries,
    then spools) instead of refusing its rows for good. Here the run is opened only after the joiner's first attempt
    was refused; every row arrives once."""
    from flowscope.client.transport import HttpTransport
    from flowscope.model.provenance import new_run_id

    run_id = new_run_id()
    joiner = Client(collector.address, run_id=run_id, spool_dir=tmp_path / "spool", flush_records=500)
    for i in range(2000):
        joiner.span("work", i, i + (i % 1000), span_id=i)
    flushed = threading.Thread(target=joiner.flush, daemon=True)
    flushed.start()
    deadline = time.monotonic() + 120
    while not (joiner.stats["busy_retries"] or joiner.stats["rows_rejected"]):  # its first batch was answered
        assert time.monotonic() < deadline, joiner.stats
        time.sleep(0.01)
    assert joiner.stats["rows_rejected"] == 0, joiner.errors
    HttpTransport(collector.address).open_run({"run_id": run_id, "name": "late-open"})
    flushed.join(120)
    joiner.close()
    assert joiner.stats["rows_rejected"] == 0 and not joiner.errors, joiner.errors
    check_exactly_once(flowscope.open_run(collector.store / run_id), 2000)


def test_a_bad_address_file_is_named(tmp_path):
    import pytest

    f = tmp_path / "collectors"
    f.write_text("http://127.0.0.1:1\nnot-an-address\n")
    with pytest.raises(ValueError, match=r"collectors:2: not a collector address: 'not-an-address'"):
        Client(address_file=f)
    with pytest.raises(ValueError, match="cannot read the collector address file"):
        Client(address_file=tmp_path / "missing")
