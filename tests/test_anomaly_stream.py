"""Streaming detection as a producer runs it: detectors fed step by step, synced through a parameter server
that sends back only what changed, keeping the calls a grown model could still flag, give at the end the
same anomalies as one pass over the whole run; SSTD detectors keep no histograms, and a model without them
never merges silently into one with them."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from flowscope.analysis.anomalies import AnomalyConfig, Detector, FunctionModel, ParameterServer, scorer


def _calls(n: int, nfunc: int, seed: int):
    """Calls of ``nfunc`` functions with skewed counts (a few hot ones, a long tail), log-normal times per
    function and 0.1 % of calls slowed 5-50x; returns (names, codes, values)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, nfunc + 1) ** 1.1
    codes = rng.choice(nfunc, n, p=p / p.sum())
    mu = rng.uniform(np.log(1e4), np.log(1e7), nfunc)
    v = np.exp(rng.normal(mu[codes], rng.uniform(0.02, 0.2, nfunc)[codes]))
    hit = rng.choice(n, n // 1000, replace=False)
    v[hit] *= rng.uniform(5, 50, len(hit))
    return [f"fn_{i}" for i in range(nfunc)], codes, np.round(v)


def _one_shot(names, codes, values, config) -> np.ndarray:
    """The positions one model of all the calls flags."""
    model = FunctionModel.of(names, codes, values)
    return np.flatnonzero(scorer(model, config).score(codes, values)[1])


@pytest.mark.parametrize("algo", ["sstd", "hbos"])
def test_streamed_final_verdict_equals_one_pass_over_the_whole_run(algo):
    names, codes, values = _calls(120_000, 300, seed=3)
    config = AnomalyConfig(algo=algo)
    server = ParameterServer()
    dets = [Detector(config, keep=True) for _ in range(4)]
    online = 0
    for step, lo in enumerate(range(0, len(codes), 3_000)):  # 40 steps; each producer gets a quarter of a step
        for p, det in enumerate(dets):
            part = np.arange(lo + p, min(lo + 3_000, len(codes)), 4)
            _, flagged = det.process(names, codes[part], values[part], ids=part)
            online += int(flagged.sum())
        for det in dets:
            det.sync(server)
    final = server.snapshot()
    got = np.sort(np.concatenate([det.final(final) for det in dets]))
    want = _one_shot(names, codes, values, config)
    assert len(want) >= 100
    np.testing.assert_array_equal(got, want)
    assert online > 0
    whole = FunctionModel.of(names, codes, values)
    idx = final.codes(whole.names)
    np.testing.assert_array_equal(final.count[idx], whole.count)
    np.testing.assert_allclose(final.mean[idx], whole.mean, rtol=1e-12)
    if algo == "hbos":
        np.testing.assert_array_equal(final.hist[idx], whole.hist)
    last = dets[-1].view  # synced last: it has everything, histogram increments of the others included
    vidx = last.codes(whole.names)
    np.testing.assert_array_equal(last.count[vidx], whole.count)
    np.testing.assert_array_equal(last.hist[vidx], whole.hist if algo == "hbos" else whole.hist[:, :0])


def test_sync_sends_back_only_what_changed_and_leaves_the_view_equal_to_the_global_model():
    names, codes, values = _calls(40_000, 500, seed=5)
    config = AnomalyConfig(algo="sstd")
    server = ParameterServer()
    a, b = Detector(config), Detector(config)
    a.process(names, codes[:20_000], values[:20_000])
    a.sync(server)
    b.process(names[:10], codes[20_000:][codes[20_000:] < 10], values[20_000:][codes[20_000:] < 10])
    version, delta = server.exchange_since(b.take_local(), a.synced_version)
    assert version == 2 and sorted(delta.names) == sorted(set(names[:10]) & set(server.snapshot().names))
    b.sync(server)
    a.sync(server)  # a gets b's ten functions back
    for det in (a, b):
        glob = server.snapshot()
        idx = det.view.codes(glob.names)
        np.testing.assert_array_equal(det.view.count[idx], glob.count)
        for x, y in ((det.view.mean[idx], glob.mean), (det.view.m2[idx], glob.m2), (det.view.min[idx], glob.min),
                     (det.view.max[idx], glob.max)):
            np.testing.assert_array_equal(x, y)


def test_sstd_detectors_keep_no_histograms_and_a_model_without_them_is_refused_by_one_with_them(collector):
    names, codes, values = _calls(5_000, 20, seed=1)
    sstd, hbos = Detector(AnomalyConfig(algo="sstd")), Detector(AnomalyConfig(algo="hbos"))
    sstd.process(names, codes, values)
    hbos.process(names, codes, values)
    assert not sstd.view.histograms and sstd.view.hist.shape == (20, 0)
    assert hbos.view.histograms and hbos.view.hist.sum() == len(codes)
    with_hist = FunctionModel.of(names, codes, values)
    with pytest.raises(ValueError, match="histograms"):
        with_hist.merge_in(sstd.take_local())
    with pytest.raises(ValueError, match="HBOS needs"):
        scorer(sstd.view, AnomalyConfig(algo="hbos"))
    # through the collector's parameter server: refused with a 400 naming it, nothing merged
    client = httpx.Client(base_url=collector.address, timeout=30)
    for run_id in ("r", "s"):
        client.post("/v1/runs", json={"run_id": run_id, "name": run_id}).raise_for_status()
    r = client.post("/v1/runs/r/anomaly-model", content=json.dumps({"model": with_hist.to_dict()}))
    assert r.status_code == 200
    doc = FunctionModel.of(names, codes, values, histograms=False).to_dict()
    assert doc["histograms"] is False and "bins" not in doc["functions"][0]
    r = client.post("/v1/runs/r/anomaly-model", content=json.dumps({"model": doc}))
    assert r.status_code == 400 and "histograms" in r.json()["error"]
    assert client.get("/v1/runs/r/anomaly-model").json()["version"] == 1
    # an SSTD run's models travel without histograms and merge exactly
    for part in (slice(0, 2_000), slice(2_000, None)):
        local = FunctionModel.of(names, codes[part], values[part], histograms=False)
        r = client.post("/v1/runs/s/anomaly-model", content=json.dumps({"model": local.to_dict()}))
        assert r.status_code == 200
    got = FunctionModel.from_dict(client.get("/v1/runs/s/anomaly-model").json()["model"])
    idx = got.codes(with_hist.names)
    assert not got.histograms
    np.testing.assert_array_equal(got.count[idx], with_hist.count)
    np.testing.assert_allclose(got.m2[idx], with_hist.m2, rtol=1e-12)
