"""The prediction phase (analysis/forecast/predict.py, `flowscope forecast predict`, the collector's
/v1/runs/{run}/forecast): frame-by-frame likelihoods and hits checked against a direct computation with
scipy, the fallback when no model fits, the route answering like the function on an imported trace and on a
live Dask run, and bad parameters refused."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import warnings

import httpx
import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp

from flowscope.analysis.forecast import CorpusEntry, build_model, predict, run_signal
from flowscope.analysis.forecast.model import DEFAULT_WINDOW, default_window
from flowscope.importers import import_paths
from flowscope.store.run import open_run


@pytest.fixture(scope="module")
def starpu(tmp_path_factory, shared_data):
    store = tmp_path_factory.mktemp("p") / "store"
    res = import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], store)
    return store, open_run(res.run_dir)


@pytest.mark.parametrize("event,fraction", [("idle", 0.25), ("idle", 0.5), ("compute", 0.5), ("idle", 0.0),
                                            ("compute", 1.0)])
def test_frames_hits_and_likelihoods_match_what_happened(starpu, event, fraction):
    _, run = starpu
    sig = run_signal(run, event)
    w = max(4, len(sig.counts) // 12)
    pred = predict(run, event, fraction, window=w)
    assert pred.window == w and pred.window_source == "given"
    k = math.ceil(fraction * sig.resources)
    assert pred.threshold == k
    m = len(sig.counts) // w
    assert len(pred.frames) == m >= 10
    t = sig.times_ns
    hits = []
    for i, f in enumerate(pred.frames.itertuples(index=False)):
        cur = sig.counts[i * w:(i + 1) * w]
        assert f.start_ns == t[i * w]  # the frame starts at its first sample
        assert f.observed == pytest.approx(np.mean(cur >= k))
        if i == 0:
            assert pd.isna(f.likelihood) and pd.isna(f.hit)
            continue
        prev = sig.counts[(i - 1) * w:i * w]
        assert f.likelihood == pytest.approx(np.mean(prev >= k))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = ks_2samp(prev, cur)
        assert bool(f.hit) == (r.pvalue >= 0.05) and f.ks_statistic == pytest.approx(r.statistic)
        hits.append(r.pvalue >= 0.05)
    assert pred.hit_rate == pytest.approx(np.mean(hits))
    doc = pred.as_dict()
    assert doc["judged"] == m - 1 and doc["hits"] == sum(hits)
    assert doc["next"]["frame"] == m and doc["next"]["likelihood"] == pytest.approx(np.mean(sig.counts[(m - 1) * w:m * w] >= k))
    json.dumps(doc, allow_nan=False)


def test_no_model_fitting_the_run_says_so_and_falls_back_to_the_default(starpu):
    _, run = starpu
    sig = run_signal(run, "idle")
    n = sig.resources
    ws = np.array([4, 8, 16, 32])
    corpus = [CorpusEntry(source="x", run_id="x", resources=n + 6, tasks=t, samples=1000, period_ns=1.0,
                          capped_by=None, curve=pd.DataFrame({"window": ws, "pairs": 9, "hits": 9, "hit_rate": 1.0}))
              for t in (10, 20, 30)]
    model = build_model(corpus, "idle")
    pred = predict(run, "idle", 0.25, model)
    assert pred.window_source == "default" and pred.window == default_window(len(sig.counts))
    assert pred.note.startswith(f"no model fits this run: the model has no surface for {n} resources")
    assert default_window(10**6) == DEFAULT_WINDOW and default_window(4000) == 500 and default_window(5) == 10
    # a model for this cluster size and DAG size is used
    tasks = pred.tasks
    fitting = build_model([CorpusEntry(source="y", run_id="y", resources=n, tasks=t, samples=1000, period_ns=1.0,
                                       capped_by=None, curve=pd.DataFrame({"window": ws, "pairs": 9, "hits": 9,
                                                                           "hit_rate": [1.0, 0.99, 0.97, 0.5]}))
                           for t in (tasks, tasks + 10)], "idle")
    used = predict(run, "idle", 0.25, fitting)
    assert used.window_source == "model" and 16 <= used.window < 32
    with pytest.raises(ValueError, match="model: built for event 'idle', asked for 'compute'"):
        predict(run, "compute", 0.25, fitting)


def _fitting_model(run, event: str = "idle"):
    """A window-size model with a surface for the run's cluster size and DAG size (its window lies in [16, 32))."""
    n, tasks = run_signal(run, event).resources, predict(run, event, 0.25).tasks
    ws = np.array([4, 8, 16, 32])
    return build_model([CorpusEntry(source="y", run_id="y", resources=n, tasks=t, samples=1000, period_ns=1.0,
                                    capped_by=None, curve=pd.DataFrame({"window": ws, "pairs": 9, "hits": 9,
                                                                        "hit_rate": [1.0, 0.99, 0.97, 0.5]}))
                        for t in (tasks, tasks + 10)], event)


def test_the_dashboards_forecast_uses_the_window_model_it_was_given(starpu, tmp_path):
    """`flowscope ui --forecast-model FILE`: the forecast route (the overview's panel) takes its frame size from the
    model for the event asked, as `flowscope forecast predict --model FILE` does; an event without a model gets the
    default, saying so; a file that is not a model stops the server at its start, naming the file."""
    from test_dashboard import flowscope_ui

    store, run = starpu
    model = _fitting_model(run)
    path = model.save(tmp_path / "idle-model.json")
    with flowscope_ui(store, "--forecast-model", str(path)) as address:
        url = f"{address}/v1/runs/{run.run_id}/forecast"
        r = httpx.get(url, params={"event": "idle", "fraction": "0.25"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["window_source"] == "model"
        assert r.json() == json.loads(json.dumps(predict(run, "idle", 0.25, model).as_dict()))
        other = httpx.get(url, params={"event": "compute", "fraction": "0.5"}, timeout=60).json()
        assert other["window_source"] == "default" and other["note"].startswith("no window-size model given")
        given = httpx.get(url, params={"event": "idle", "window": "9"}, timeout=60).json()
        assert (given["window_source"], given["window"]) == ("given", 9)
    bad = tmp_path / "bad-model.json"
    bad.write_text("{", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "flowscope", "ui", str(store), "--port", "0", "--no-open",
                          "--forecast-model", str(bad)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and f"{bad}: not JSON" in out.stderr, out.stderr
    twice = subprocess.run([sys.executable, "-m", "flowscope", "ui", str(store), "--port", "0", "--no-open",
                            "--forecast-model", str(path), "--forecast-model", str(path)],
                           capture_output=True, text=True, timeout=120)
    assert twice.returncode != 0 and "two window-size models for event 'idle'" in twice.stderr, twice.stderr


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan"), "lots"])
def test_fraction_outside_zero_one_is_refused(starpu, fraction):
    _, run = starpu
    with pytest.raises(ValueError, match=r"fraction: "):
        predict(run, "idle", fraction)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowscope", "forecast", *args], check=False, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("event,fraction", [("idle", 0.5), ("compute", 0.5), ("idle", 1.0)])
def test_calibration_is_the_per_sample_brier_score_beside_the_run_so_far_frequency(starpu, event, fraction):
    _, run = starpu
    sig = run_signal(run, event)
    w = max(4, len(sig.counts) // 40)
    pred = predict(run, event, fraction, window=w)
    k, m = pred.threshold, len(sig.counts) // w
    ours, clim = [], []
    for i in range(1, m):  # each sample of frame i against the forecasts made before it
        outcome = (sig.counts[i * w:(i + 1) * w] >= k).astype(float)
        ours.append((np.mean(sig.counts[(i - 1) * w:i * w] >= k) - outcome) ** 2)
        clim.append((np.mean(sig.counts[:i * w] >= k) - outcome) ** 2)
    cal = pred.as_dict()["calibration"]
    assert cal["frames"] == m - 1 >= 30
    assert cal["brier"] == pytest.approx(np.mean(ours)) and cal["brier_climatology"] == pytest.approx(np.mean(clim))
    assert cal["brier_skill"] == pytest.approx(1 - np.mean(ours) / np.mean(clim))
    text = _cli("predict", str(run.path), "--event", event, "--fraction", str(fraction), "--window", str(w))
    assert text.returncode == 0, text.stderr
    assert f"Brier score {np.mean(ours):.4f} (climatological forecast, the run-so-far frequency: " \
           f"{np.mean(clim):.4f}" in text.stdout.replace("\n", " ")


def test_cli_predict_prints_the_functions_answer_and_one_line_errors(starpu, tmp_path):
    store, run = starpu
    p = _cli("predict", run.run_id, "--store", str(store), "--event", "idle", "--fraction", "0.5", "--window", "7",
             "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == json.loads(json.dumps(predict(run, "idle", 0.5, window=7).as_dict()))
    text = _cli("predict", str(run.path), "--fraction", "0.5")
    assert text.returncode == 0, text.stderr
    assert "no window-size model given: default window of" in text.stderr and "hit rate" in text.stdout
    for args, msg in [(("--fraction", "1.5"), "fraction: must be within [0, 1], got '1.5'"),
                      (("--event", "napping"), "event: unknown event kind 'napping'"),
                      (("--model", str(tmp_path / "missing.json")), "missing.json")]:
        bad = _cli("predict", str(run.path), *args)
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and msg in bad.stderr, bad.stderr
    unknown = _cli("predict", "no-such-run", "--store", str(store))
    assert unknown.returncode == 1 and "no-such-run" in unknown.stderr and unknown.stderr.count("\n") == 1


def test_route_answers_as_the_function_and_refuses_bad_parameters(starpu, collector_factory):
    store, run = starpu
    c = collector_factory(store=store)
    url = f"{c.address}/v1/runs/{run.run_id}/forecast"
    r = httpx.get(url, params={"event": "idle", "fraction": "0.25"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == json.loads(json.dumps(predict(run, "idle", 0.25).as_dict()))
    r = httpx.get(url, params={"event": "compute", "fraction": "0.5", "window": "9"}, timeout=60)
    assert r.json() == json.loads(json.dumps(predict(run, "compute", 0.5, window=9).as_dict()))
    for params, field in [({"fraction": "2"}, "fraction"), ({"fraction": "x"}, "fraction"),
                          ({"event": "nap"}, "event"), ({"window": "0"}, "window"), ({"windw": "3"}, "windw")]:
        bad = httpx.get(url, params=params, timeout=60)
        assert bad.status_code == 400 and bad.json()["field"] == field, (params, bad.text)
        assert field in bad.json()["error"]
    missing = httpx.get(f"{c.address}/v1/runs/no-such-run/forecast", timeout=60)
    assert missing.status_code == 404 and "no-such-run" in missing.json()["error"]


def _sleep_task(i: int, s: float) -> int:
    time.sleep(s)
    return i


def test_route_forecasts_a_live_dask_run_as_the_function_does(collector):
    from dask import delayed
    from distributed import Client, LocalCluster

    import flowscope
    from flowscope.sources import semantics
    from flowscope.sources.dask import register
    from flowscope.store.run import Run

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        fs = flowscope.Client(collector.address, name="forecast-live",
                              meta={"capture_level": "standard", "semantics": [semantics.DASK_DISTRIBUTED]})
        register(client, fs.address, fs.run_id)
        url = f"{collector.address}/v1/runs/{fs.run_id}/forecast"
        # tasks of uneven lengths in waves, so that workers sit idle between waves
        for _wave in range(3):
            futures = client.compute([delayed(_sleep_task, pure=False)(i, 0.01 * (1 + i % 4)) for i in range(12)])
            assert sorted(client.gather(futures)) == list(range(12))
        run = Run(collector.store / fs.run_id)
        deadline = time.monotonic() + 60
        while run.sql("SELECT count(*) AS n FROM activity WHERE role = 'task'")["n"].iloc[0] < 36:
            assert time.monotonic() < deadline, "the task spans did not reach the collector"
            time.sleep(0.2)
        spans = "SELECT count(*) AS n FROM spans"
        for _ in range(20):  # compare at a moment when no span arrived between the route's answer and ours
            before = run.sql(spans)["n"].iloc[0]
            r = httpx.get(url, params={"event": "idle", "fraction": "0.5"}, timeout=60)
            assert r.status_code == 200, r.text
            mine = json.loads(json.dumps(predict(run, "idle", 0.5).as_dict()))
            if run.sql(spans)["n"].iloc[0] == before:
                break
            time.sleep(0.5)
        doc = r.json()
        assert doc["tasks"] == 36 and doc["resources"] >= 2 and len(doc["frames"]) >= 2  # threads (lanes: more if spans overlap)
        assert doc["window_source"] == "default" and doc["judged"] == len(doc["frames"]) - 1
        assert doc == mine
        assert httpx.get(f"{collector.address}/v1/runs/{fs.run_id}", timeout=30).json()["status"] == "running"
        fs.close()


def _grow(run, address: str) -> None:
    """The run grows through the collector at ``address``: its last ten tasks again, on the same workers, after its
    end."""
    import flowscope

    tail = run.sql("SELECT resource_id, kind, name, start_ns, end_ns, task_key, attrs FROM spans WHERE kind = 'task' "
                   "ORDER BY end_ns DESC LIMIT 10")
    shift = int(run.sql("SELECT max(end_ns) - min(start_ns) AS d FROM spans")["d"].iloc[0])
    fs = flowscope.Client(address, run_id=run.run_id)
    fs.write("spans", tail.assign(start_ns=tail["start_ns"] + shift, end_ns=tail["end_ns"] + shift,
                                  task_key=[f"again-{i}" for i in range(len(tail))]))
    fs.close()


def test_route_keeps_its_answer_until_the_run_changes_and_serves_an_older_one_only_when_asked(
        shared_data, tmp_path, collector_factory):
    store = tmp_path / "store"
    run = open_run(import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], store).run_dir)
    c = collector_factory(store=store)
    url = f"{c.address}/v1/runs/{run.run_id}/forecast"
    q = {"event": "idle", "fraction": "0.25"}
    first = httpx.get(url, params=q, timeout=60)
    assert first.status_code == 200 and "age" not in first.headers
    assert first.json() == json.loads(json.dumps(predict(run, "idle", 0.25).as_dict()))
    _grow(run, c.address)
    now = json.loads(json.dumps(predict(run, "idle", 0.25).as_dict()))
    assert now["tasks"] == first.json()["tasks"] + 10
    older = httpx.get(url, params={**q, "max_age": "3600"}, timeout=60)  # an older answer is acceptable: kept one
    assert older.status_code == 200 and older.json() == first.json() and int(older.headers["age"]) >= 0
    fresh = httpx.get(url, params=q, timeout=60)  # without max_age: what the run holds now
    assert fresh.json() == now and "age" not in fresh.headers
    again = httpx.get(url, params={**q, "max_age": "3600"}, timeout=60)  # the run has not changed since: exact
    assert again.json() == now and "age" not in again.headers
    auto = httpx.get(url, params={**q, "max_age": "auto"}, timeout=60)
    assert auto.status_code == 200 and auto.json() == now
    for bad in ("-1", "soon", "nan"):
        r = httpx.get(url, params={**q, "max_age": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["field"] == "max_age", r.text


def test_the_live_route_sends_the_forecast_and_again_when_the_run_grew(shared_data, tmp_path, collector_factory):
    """``/v1/runs/RUN/forecast/live?event&fraction`` (a WebSocket, what the dashboard's panel opens): the route's
    answer at once; when batches grow the run, the new answer without being asked; a refused query or an unknown
    run is said so and the socket closed."""
    from websockets.sync.client import connect

    store = tmp_path / "store"
    run = open_run(import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], store).run_dir)
    c = collector_factory(store=store)
    ws_base = c.address.replace("http://", "ws://") + f"/v1/runs/{run.run_id}/forecast/live"
    with connect(f"{ws_base}?event=idle&fraction=0.25", open_timeout=60) as ws:
        first = json.loads(ws.recv(timeout=120))
        assert first["type"] == "forecast" and first["status"] == 200
        assert first["doc"] == json.loads(json.dumps(predict(run, "idle", 0.25).as_dict()))
        _grow(run, c.address)
        grown = json.loads(ws.recv(timeout=120))  # sent without asking: the run moved on
        assert grown["type"] == "forecast" and grown["doc"]["tasks"] == first["doc"]["tasks"] + 10
        assert grown["doc"] == json.loads(json.dumps(predict(run, "idle", 0.25).as_dict()))
    for query, field in (("event=sleepy", "event"), ("fraction=2", "fraction"), ("window=0", "window"),
                         ("max_age=1", "max_age")):
        with connect(f"{ws_base}?{query}", open_timeout=60) as ws:
            said = json.loads(ws.recv(timeout=60))
            assert (said["type"], said["status"], said["field"]) == ("refused", 400, field), said
    with connect(c.address.replace("http://", "ws://") + "/v1/runs/19700101-000000-abcdef/forecast/live",
                 open_timeout=60) as ws:
        said = json.loads(ws.recv(timeout=60))
        assert (said["type"], said["status"], said["field"]) == ("refused", 404, "run"), said


def test_a_run_whose_forecast_is_read_is_followed_live(collector):
    """A client reading a run's forecast (a flowscope.forecast.when rule, the dashboard's panel) follows the run
    like a page does: the collector's acknowledgements then say "watched", and producers send more often."""
    run_id = httpx.post(f"{collector.address}/v1/runs", json={"name": "followed"}, timeout=30).json()["run_id"]
    span = [{"resource_id": "thread:h:1:1", "kind": "task", "name": "t", "start_ns": 1, "end_ns": 2}]

    def ack() -> dict:
        r = httpx.post(f"{collector.address}/v1/runs/{run_id}/tables/spans", json=span, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    assert ack()["watched"] is False
    httpx.get(f"{collector.address}/v1/runs/{run_id}/forecast", timeout=60)  # answered or 409: read all the same
    assert ack()["watched"] is True
