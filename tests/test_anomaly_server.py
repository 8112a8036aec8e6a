"""The collector's anomaly parameter server: producers' local statistics posted over HTTP merge exactly into
the run's global model, which is kept with the run and survives a collector restart; bad bodies, bad run ids
and oversized bodies get a 4xx saying what is wrong. Through a real collector process on loopback."""

from __future__ import annotations

import json
import select
import socket
from urllib.parse import urlsplit

import httpx
import numpy as np

from flowscope.analysis.anomalies import FunctionModel


def _open(client: httpx.Client, run_id: str) -> str:
    client.post("/v1/runs", json={"run_id": run_id, "name": run_id}).raise_for_status()
    return run_id


def _assert_same_model(got: FunctionModel, want: FunctionModel) -> None:
    idx = got.codes(want.names)
    assert len(got) == len(want)
    assert np.array_equal(got.count[idx], want.count) and np.array_equal(got.hist[idx], want.hist)
    for a, b in ((got.mean[idx], want.mean), (got.m2[idx], want.m2), (got.min[idx], want.min),
                 (got.max[idx], want.max)):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def _data(n: int = 30_000, seed: int = 7):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 4, n)
    values = rng.lognormal(12 + codes, 0.3)
    return ["load", "parse", "solve", "store"], codes, values


def test_posted_local_models_merge_exactly_into_the_global_model(collector):
    names, codes, values = _data()
    client = httpx.Client(base_url=collector.address, timeout=30)
    _open(client, "r1")
    _open(client, "other")
    assert client.get("/v1/runs/r1/anomaly-model").json()["model"]["functions"] == []
    cuts = [0, 1_234, 9_000, 22_222, len(codes)]
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):  # four producers, each a different part of the calls
        local = FunctionModel.of(names, codes[a:b], values[a:b])
        r = client.post("/v1/runs/r1/anomaly-model", content=json.dumps({"model": local.to_dict()}))
        assert r.status_code == 200 and r.json()["version"] == i + 1
    got = FunctionModel.from_dict(client.get("/v1/runs/r1/anomaly-model").json()["model"])
    _assert_same_model(got, FunctionModel.of(names, codes, values))
    # runs are separate
    assert client.get("/v1/runs/other/anomaly-model").json()["model"]["functions"] == []


def test_bad_bodies_say_what_is_wrong(collector):
    names, codes, values = _data(2_000)
    client = httpx.Client(base_url=collector.address, timeout=30)
    _open(client, "r")
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


def test_a_bad_or_unknown_run_id_is_refused_and_leaves_nothing_behind(collector):
    names, codes, values = _data(1_000)
    body = json.dumps({"model": FunctionModel.of(names, codes, values).to_dict()})
    client = httpx.Client(base_url=collector.address, timeout=30)
    for method in ("GET", "POST"):
        r = client.request(method, "/v1/runs/no%20such%20run!/anomaly-model", content=body)
        assert r.status_code == 400 and "invalid run id 'no such run!'" in r.json()["error"], (method, r.text)
        r = client.request(method, "/v1/runs/20990101-000000-absent/anomaly-model", content=body)
        assert r.status_code == 404 and "unknown run '20990101-000000-absent'" in r.json()["error"], (method, r.text)
    assert not collector.store.exists() or not any(collector.store.iterdir())


def test_the_global_model_survives_a_collector_killed_and_restarted(collector_factory, tmp_path):
    names, codes, values = _data(40_000, seed=11)
    cuts = [0, 5_000, 17_000, 30_000, len(codes)]
    parts = [FunctionModel.of(names, codes[a:b], values[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    first = collector_factory(store=tmp_path / "store")
    client = httpx.Client(base_url=first.address, timeout=30)
    run_id = _open(client, "20260101-000000-restart")
    for i, local in enumerate(parts[:2]):
        r = client.post(f"/v1/runs/{run_id}/anomaly-model", content=json.dumps({"model": local.to_dict()}))
        assert r.status_code == 200 and r.json()["version"] == i + 1
    before = client.get(f"/v1/runs/{run_id}/anomaly-model").json()
    client.close()
    first.kill()  # SIGKILL: nothing gets a chance to be saved on the way out

    second = collector_factory(store=tmp_path / "store")
    client = httpx.Client(base_url=second.address, timeout=30)
    after = client.get(f"/v1/runs/{run_id}/anomaly-model").json()
    assert after["version"] == 2 and after["model"] == before["model"]  # what post-pruning will judge against
    for i, local in enumerate(parts[2:]):
        r = client.post(f"/v1/runs/{run_id}/anomaly-model", content=json.dumps({"model": local.to_dict()}))
        assert r.status_code == 200 and r.json()["version"] == 3 + i
    got = FunctionModel.from_dict(client.get(f"/v1/runs/{run_id}/anomaly-model").json()["model"])
    _assert_same_model(got, FunctionModel.of(names, codes, values))


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def test_an_oversized_body_is_refused_while_it_streams_in(collector_factory):
    """A chunked body (no Content-Length) over the collector's request limit is refused once the limit is
    passed: the 413 arrives while the sender is still sending, and the collector never holds the body."""
    limit_mb = 1
    collector = collector_factory("--max-request-mb", str(limit_mb))
    client = httpx.Client(base_url=collector.address, timeout=30)
    run_id = _open(client, "20260101-000000-big")
    url = urlsplit(collector.address)
    chunk = b" " * 2**20  # JSON whitespace: a body that would parse, were it not too large
    chunks = 128  # far more than the limit plus every socket buffer between the two processes
    peak_before = _peak_rss(collector.pid)
    answered_after = None  # chunks sent when the answer could first be read
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(f"POST /v1/runs/{run_id}/anomaly-model HTTP/1.1\r\nHost: {url.netloc}\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        for i in range(chunks):
            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            if answered_after is None and select.select([sock], [], [], 0)[0]:
                answered_after = i + 1
        sock.sendall(b"0\r\n\r\n")
        answer = sock.recv(65536)
    assert answered_after is not None and answered_after < chunks, "no answer before the whole body was sent"
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"over the limit of %d bytes" % (limit_mb * 2**20) in answer
    assert _peak_rss(collector.pid) - peak_before < 32 * 2**20  # the body was never held (it is 128 MiB)
    assert client.get(f"/v1/runs/{run_id}/anomaly-model").json()["version"] == 0
