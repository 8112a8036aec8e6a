"""The live view's update per batch (analysis/live.py) and its deltas as pages receive them (service/live_hub.py),
fed with the batches of a real Dask run recorded by flowscope.observe."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowscope.analysis.live import LiveRun, pending_segments
from flowscope.model.schemas import schema
from flowscope.store.run import Run


def _inc(x):
    return x + 1


def _add(a, b):
    return a + b


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real Dask run's directory: three task groups over 2 worker processes x 2 threads, with dependencies
    (transfers between workers), its scheduler's transitions and the hardware sampler's metrics."""
    from distributed import Client, LocalCluster

    import flowscope

    store = tmp_path_factory.mktemp("live-view") / "store"
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client, \
            flowscope.observe(client, store=store, name="live-view", hardware_period=0.2) as obs:
        xs = [client.submit(_inc, i, key=f"inc-{i}") for i in range(60)]
        ys = [client.submit(_add, xs[i], xs[-1 - i], key=f"add-{i}") for i in range(60)]
        total = client.submit(sum, ys, key="total-0")
        assert total.result() == 60 * 61
    return obs.run.path


def _segments(run_dir: Path) -> list[tuple[str, str, pa.Table]]:
    run = Run(run_dir)
    probe = LiveRun(run.meta, run.mappings())
    return [(table, sid, pq.read_table(path, schema=schema(table))) for table, sid, path in pending_segments(run_dir, probe)]


def test_a_delta_is_encoded_once_and_the_same_message_goes_to_every_page(recorded, tmp_path):
    """Every page that is up to date receives the very same message text (encoded once, not once per page);
    a page that missed deltas gets them in one message, numbered without gaps."""
    from flowscope.service.collector import Collector
    from flowscope.service.live_hub import LiveHub

    src = Run(recorded)
    collector = Collector(tmp_path / "store")
    try:
        hub = LiveHub(collector.store, collector)
        doc = collector.open_run({"name": "replay", "start_ns": src.meta["start_ns"],
                                  "semantics": src.meta.get("semantics")})
        w = hub.watch(doc["run_id"])
        kind, snap = w.since(None, None)
        assert kind == "snapshot" and snap["seq"] == 0
        segs = _segments(recorded)
        seen = 0  # the seq two pages that keep up have applied; a third stays at 0
        for table, sid, data in segs:
            collector.ingest(doc["run_id"], table, sid, data, timeout=60)
            bodies = [w.since(w.epoch, seen) for _ in range(2)]
            if w.live.seq == seen:
                assert all(b == ("deltas", None) for b in bodies)
                continue
            (k0, (m0, s0)), *others = bodies
            assert k0 == "deltas" and s0 == w.live.seq
            for k, (m, s) in others:
                assert k == "deltas" and s == s0 and m is m0  # one string object for every page
            msg = json.loads(m0)
            assert set(msg) == {"type", "epoch", "deltas"} and msg["type"] == "deltas" and msg["epoch"] == w.epoch
            assert [d["seq"] for d in msg["deltas"]] == list(range(seen + 1, s0 + 1))
            if table == "spans":
                assert msg["deltas"][-1]["tasks"]["key"] == w.live._tasks.key[-1]
            seen = s0
        kind, (missed, last) = w.since(w.epoch, 0)
        msg = json.loads(missed)
        assert kind == "deltas" and last == w.live.seq
        assert [d["seq"] for d in msg["deltas"]] == list(range(1, last + 1))
    finally:
        collector.shutdown()
