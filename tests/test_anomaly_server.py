"""The collector's anomaly parameter server: producers' local statistics posted over HTTP merge exactly into
the run's global model; bad bodies get a 400 saying what is wrong. Through a real collector process on loopback."""

from __future__ import annotations

import json

import httpx
import numpy as np

from flowscope.analysis.anomalies import FunctionModel


def _data(n: int = 30_000, seed: int = 7):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 4, n)
    values = rng.lognormal(12 + codes, 0.3)
    return ["load", "parse", "solve", "store"], codes, values


def test_posted_local_models_merge_exactly_into_the_global_model(collector):
    names, codes, values = _data()
    client = httpx.Client(base_url=collector.address, timeout=30)
    assert client.get("/v1/runs/r1/anomaly-model").json()["model"]["functions"] == []
    cuts = [0, 1_234, 9_000, 22_222, len(codes)]
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):  # four producers, each a different part of the calls
        local = FunctionModel.of(names, codes[a:b], values[a:b])
        r = client.post("/v1/runs/r1/anomaly-model", content=json.dumps({"model": local.to_dict()}))
        assert r.status_code == 200 and r.json()["version"] == i + 1
    got = FunctionModel.from_dict(client.get("/v1/runs/r1/anomaly-model").json()["model"])
    whole = FunctionModel.of(names, codes, values)
    idx = got.codes(whole.names)
    assert np.array_equal(got.count[idx], whole.count) and np.array_equal(got.hist[idx], whole.hist)
    for a, b in ((got.mean[idx], whole.mean), (got.m2[idx], whole.m2), (got.min[idx], whole.min),
                 (got.max[idx], whole.max)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # runs are separate
    assert client.get("/v1/runs/other/anomaly-model").json()["model"]["functions"] == []


def test_bad_bodies_say_what_is_wrong(collector):
    names, codes, values = _data(2_000)
    client = httpx.Client(base_url=collector.address, timeout=30)
    body = json.dumps({"model": FunctionModel.of(names, codes, values).to_dict()})
    r = client.post("/v1/runs/r/anomaly-model", content=body[: len(body) // 2])  # truncated
    assert r.status_code == 400 and "not JSON" in r.json()["error"] and "char" in r.json()["error"]
    doc = json.loads(body)
    doc["model"]["functions"][2]["count"] = "many"  # wrong-typed field
    r = client.post("/v1/runs/r/anomaly-model", content=json.dumps(doc))
    assert r.status_code == 400 and "function 2 ('solve')" in r.json()["error"]
    doc["model"]["grid"]["per_octave"] = 64
    r = client.post("/v1/runs/r/anomaly-model", content=json.dumps(doc))
    assert r.status_code == 400 and "grid" in r.json()["error"]
    assert client.post("/v1/runs/r/anomaly-model", content=b"[1]").status_code == 400
    assert client.get("/v1/runs/r/anomaly-model").json()["version"] == 0  # nothing bad was merged
