"""The rule API (flowscope.forecast.when): the callback runs once per frame whose predicted likelihood reaches
the threshold, on a finished run and on a live Dask run read through the collector, where it submits
back-fill work to the same cluster."""

from __future__ import annotations

import json
import time

import pytest

import flowscope
from flowscope.analysis.forecast import predict
from flowscope.importers import import_paths
from flowscope.store.run import open_run


@pytest.fixture(scope="module")
def starpu(tmp_path_factory, shared_data):
    res = import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], tmp_path_factory.mktemp("r") / "store")
    return open_run(res.run_dir)


def test_rule_fires_once_per_frame_when_the_likelihood_is_reached(starpu):
    want = predict(starpu, "idle", 0.5, window=9).as_dict()["next"]
    seen = []
    rule = flowscope.forecast.when(starpu.path, "idle", 0.5, likelihood=want["likelihood"], do=seen.append,
                                   window=9, start=False)
    frame = rule.check()
    assert frame is not None and seen == [frame] and rule.fired == [frame]
    assert {k: frame[k] for k in want} == want and frame["threshold"] == rule.last["threshold"]
    assert rule.check() is None and len(seen) == 1  # the same frame is acted on once
    if want["likelihood"] < 1.0:
        above = flowscope.forecast.when(starpu, "idle", 0.5, likelihood=min(1.0, want["likelihood"] + 1e-9),
                                        do=seen.append, window=9, start=False)
        assert above.check() is None and len(seen) == 1


def test_rule_refuses_bad_parameters(starpu):
    for kw, msg in [({"likelihood": 1.5}, "likelihood: must be within"), ({"fraction": -1}, "fraction: must be"),
                    ({"event": "dozing"}, "event: unknown event kind")]:
        with pytest.raises(ValueError, match=msg):
            flowscope.forecast.when(starpu, **{"do": print, **kw}, start=False)
    with pytest.raises(TypeError, match="do: expected a callable"):
        flowscope.forecast.when(starpu, do=None, start=False)
    with pytest.raises(TypeError, match="run: expected a run directory"):
        flowscope.forecast.when(42, do=print, start=False)


def _busy(i: int, s: float) -> int:
    time.sleep(s)
    return i


def _backfill(x: int) -> int:
    return x * x


def test_rule_on_a_live_dask_run_submits_backfill_work(collector):
    from dask import delayed
    from distributed import Client, LocalCluster

    from flowscope.sources import semantics
    from flowscope.sources.dask import register

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        fs = flowscope.Client(collector.address, name="forecast-rule",
                              meta={"capture_level": "standard", "semantics": [semantics.DASK_DISTRIBUTED]})
        register(client, fs.address, fs.run_id)
        backfill = []
        # any idle resource (fraction 0.5 of 2 workers' threads) with likelihood > 0: back-fill one task
        rule = flowscope.forecast.when((collector.address, fs.run_id), "idle", 0.5, likelihood=0.01,
                                       do=lambda frame: backfill.append(client.submit(_backfill, frame["frame"])),
                                       window=20, interval=0.2)
        try:
            deadline = time.monotonic() + 120
            wave = 0
            while not backfill:  # waves of uneven tasks leave workers idle between them
                assert rule.error is None, rule.error
                assert time.monotonic() < deadline, f"the rule never fired; last: {rule.last}"
                futures = client.compute([delayed(_busy, pure=False)(i, 0.02 * (1 + i % 3)) for i in range(6)])
                client.gather(futures)
                wave += 1
                time.sleep(0.3)
        finally:
            rule.stop()
        frame = rule.fired[0]
        assert frame["run_id"] == fs.run_id and frame["likelihood"] >= 0.01 and frame["resources"] >= 1
        assert backfill[0].result(timeout=60) == frame["frame"] ** 2
        fs.close()
    # every action the rule took has its audit row in the run's logs, with the frame it acted on
    run = open_run(collector.store / fs.run_id)
    audit = run.sql("SELECT message, attrs FROM logs WHERE category = 'feedback' ORDER BY ts_ns")
    acted = [json.loads(a) for a in audit["attrs"]]
    assert [a["frame"] for a in acted] == [f["frame"] for f in rule.fired]
    assert all(a["rule"] == "forecast" and a["outcome"] == "ok" and a["event"] == "idle" for a in acted)
    assert acted[0]["likelihood"] == rule.fired[0]["likelihood"] and "<lambda>" in acted[0]["action"]
