"""Streaming anomaly detection: planted anomalies found, thresholds as specified, exact merges, distributed
agrees with single-instance detection, post-pruning, provenance records, reduced runs, a real Dask run."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import flowscope
from conftest import alone_in_hbos_bin
from flowscope.analysis.anomalies import (AnomalyConfig, CallTreeError, Detector, FunctionModel, ParameterServer,
                                          calls_from_spans, detect, detect_run, post_prune, scorer)
from flowscope.analysis.anomalies.model import FINE_BINS, batch_stats, fine_bin
from flowscope.analysis.anomalies.reduce import (compact_calls, kept_rows, load_model,
                                                 reduced_anomalies, window_calls, write_reduced)
from flowscope.cli import anomalies as cli_anomalies
from flowscope.model.schemas import ANOMALIES, schema

MEANS = {"load": 2_000_000, "parse": 300_000, "solve": 5_000_000, "store": 800_000, "tiny": 20_000}


def synthetic(n: int = 60_000, threads: int = 8, planted: int = 40, seed: int = 0, factors=(4.0, 40.0)):
    """Flat call spans on ``threads`` resources, durations ~N(mean, 3 % of mean) per function, and
    ``planted`` calls slowed by a factor drawn uniformly from ``factors``; returns (spans, planted positions
    as (resource, start) pairs, rng)."""
    rng = np.random.default_rng(seed)
    names = np.array(list(MEANS))
    func = rng.integers(0, len(names), n)
    mean = np.array([MEANS[f] for f in names])[func]
    dur = np.maximum(rng.normal(mean, 0.03 * mean), 1).astype(np.int64)
    hit = rng.choice(n, planted, replace=False)
    dur[hit] = (dur[hit] * rng.uniform(*factors, planted)).astype(np.int64)
    res = rng.integers(0, threads, n)
    start = np.zeros(n, np.int64)
    for t in range(threads):  # calls of one thread back to back, 1 us apart
        m = res == t
        start[m] = 1_700_000_000_000_000_000 + np.concatenate([[0], np.cumsum(dur[m][:-1] + 1_000)])
    spans = _spans(res, names[func], start, start + dur)
    return spans, {(f"thread:h:1:{res[i]}", int(start[i])) for i in hit}


def _spans(res, names, start, end, span_id=None, parent_id=None, kind="call") -> pa.Table:
    n = len(start)
    return pa.table({"span_id": pa.array(span_id, pa.int64()) if span_id is not None else pa.nulls(n, pa.int64()),
                     "parent_id": pa.array(parent_id, pa.int64()) if parent_id is not None else pa.nulls(n, pa.int64()),
                     "resource_id": [r if isinstance(r, str) else f"thread:h:1:{r}" for r in res],
                     "kind": [kind] * n, "name": list(names), "start_ns": start, "end_ns": end,
                     "task_key": pa.nulls(n, pa.string()), "attrs": pa.nulls(n, pa.string())}, schema=schema("spans"))


def _found(det) -> set:
    a = det.anomalies
    return set(zip(a["resource_id"].to_pylist(), a["start_ns"].to_pylist()))


@pytest.mark.parametrize("algo", ["sstd", "hbos"])
def test_planted_anomalies_recall_and_precision(algo):
    spans, planted = synthetic()
    det = detect(spans, AnomalyConfig(algo=algo))
    found = _found(det)
    recall = len(found & planted) / len(planted)
    precision = len(found & planted) / max(len(found), 1)
    print(f"{algo}: recall {recall:.3f} precision {precision:.3f} ({len(found)} flagged, {len(planted)} planted)")
    assert recall >= 0.95 and precision >= 0.95, (algo, recall, precision)
    # the most severe anomaly is the planted call that lost the most time
    a = det.anomalies.to_pylist()
    assert (a[0]["resource_id"], a[0]["start_ns"]) in planted
    assert [r["severity_ns"] for r in a] == sorted((r["severity_ns"] for r in a), reverse=True)


def test_sstd_threshold_is_mean_plus_minus_sigma_std():
    rng = np.random.default_rng(3)
    v = np.concatenate([rng.normal(1e6, 1e4, 5000), [1e6 + 7e4, 1e6 - 7e4, 1e6 + 4e4]])
    codes = np.zeros(len(v), np.int64)
    m = FunctionModel.of(["f"], codes, v)
    mean, std = v.mean(), v.std(ddof=1)
    for sigma in (6.0, 3.0):
        _, flagged = scorer(m, AnomalyConfig(algo="sstd", sigma=sigma)).score(codes, v)
        np.testing.assert_array_equal(flagged, np.abs(v - mean) > sigma * std)
    assert scorer(m, AnomalyConfig(algo="sstd", sigma=6.0)).score(codes, v)[1].sum() == 2
    assert scorer(m, AnomalyConfig(algo="sstd", sigma=3.0)).score(codes, v)[1].sum() > 3


def test_hbos_threshold_is_fraction_of_bin_score_range():
    # 1000 calls at 1 ms, 10 at 2 ms, 1 at 5 ms: bin scores -log2(1000/1011), -log2(10/1011), -log2(1/1011)
    v = np.array([1e6] * 1000 + [2e6] * 10 + [5e6], np.float64)
    codes = np.zeros(len(v), np.int64)
    m = FunctionModel.of(["f"], codes, v)
    s = -np.log2(np.array([1000, 10, 1]) / 1011 + AnomalyConfig().alpha)
    for frac, want in ((0.99, 1), (0.6, 11), (0.75, 1)):
        sc = scorer(m, AnomalyConfig(algo="hbos", threshold=frac))
        score, flagged = sc.score(codes, v)
        assert sc.threshold[0] == pytest.approx(s[0] + frac * (s[2] - s[0]), rel=1e-12)
        np.testing.assert_allclose(np.unique(score), np.sort(s), rtol=1e-12)
        assert flagged.sum() == want, frac
        assert 1 <= sc.nbins[0] <= 200
    # a function whose calls all take the same time has one bin: nothing is flagged
    same = FunctionModel.of(["g"], np.zeros(50, np.int64), np.full(50, 3e5))
    assert not scorer(same, AnomalyConfig()).score(np.zeros(50, np.int64), np.full(50, 3e5))[1].any()


def test_hbos_uses_at_most_max_bins():
    rng = np.random.default_rng(5)
    v = rng.exponential(1e6, 200_000)
    codes = np.zeros(len(v), np.int64)
    sc = scorer(FunctionModel.of(["f"], codes, v), AnomalyConfig())
    assert sc.nbins[0] == 200
    assert scorer(FunctionModel.of(["f"], codes, v), AnomalyConfig(max_bins=50)).nbins[0] == 50


def _assert_models_equal(a: FunctionModel, b: FunctionModel):
    order = b.codes(a.names)
    np.testing.assert_array_equal(a.count, b.count[order])
    for x, y in ((a.mean, b.mean[order]), (a.m2, b.m2[order]), (a.min, b.min[order]), (a.max, b.max[order])):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(a.hist, b.hist[order])


def test_merge_of_any_split_equals_the_whole():
    rng = np.random.default_rng(7)
    n = 200_000
    names = [f"f{i}" for i in range(30)]
    codes = rng.integers(0, 30, n)
    v = rng.lognormal(12, 1.5, n) * (1 + codes)
    whole = FunctionModel.of(names, codes, v)
    # the whole against numpy
    for i in (0, 7, 29):
        x = v[codes == i]
        assert whole.count[i] == len(x)
        assert whole.mean[i] == pytest.approx(x.mean(), rel=1e-12)
        assert whole.m2[i] == pytest.approx(((x - x.mean()) ** 2).sum(), rel=1e-12)
        assert whole.min[i] == x.min() and whole.max[i] == x.max()
        np.testing.assert_array_equal(whole.hist[i], np.bincount(fine_bin(x), minlength=FINE_BINS))
    for trial in range(5):
        parts = rng.integers(0, 2 + trial * 3, n)  # 2 .. 14 parts, each with its own name order
        models = []
        for p in np.unique(parts):
            m = parts == p
            perm = rng.permutation(30)
            local = [names[j] for j in perm]
            inv = np.argsort(perm)
            models.append(FunctionModel.of(local, inv[codes[m]], v[m]))
        merged = FunctionModel()
        for m in rng.permutation(len(models)):
            merged.merge_in(models[m])
        _assert_models_equal(whole, merged)
        # tree-shaped merging and the JSON exchange form give the same
        tree = models[0]
        for m in models[1:]:
            tree = FunctionModel.from_dict(json.loads(tree.merge(m).to_json()))
        _assert_models_equal(whole, tree)
    # chunked batch statistics equal one pass
    one = batch_stats(codes[:1000], v[:1000], 30)
    assert one[0].sum() == 1000


def with_rare_function(spans: pa.Table, planted: set, threads: int = 8, per_thread: int = 30,
                       slowed_at: tuple = (0.55, 0.7, 0.85), factor: float = 8.0, seed: int = 1):
    """``spans`` plus calls of a function ``rare`` on threads of their own (``per_thread`` calls each, ~1 ms with
    3 % noise, spread over the run), one call slowed ``factor``-fold at each fraction of the run in ``slowed_at``
    (each on another thread); returns (spans, planted positions including the new ones).

    A producer that sees ``per_thread`` calls of a function can never find one of them 6 standard deviations
    out (at most (n - 1) / sqrt(n), 5.3 for 30): only the global model, 8 producers' calls merged, can flag
    these during the run."""
    rng = np.random.default_rng(seed)
    t0, t1 = pa.compute.min(spans["start_ns"]).as_py(), pa.compute.max(spans["end_ns"]).as_py()
    n = threads * per_thread
    res = np.repeat(np.arange(threads) + 100, per_thread)
    start = (t0 + np.tile(np.arange(per_thread) / per_thread, threads) * (t1 - t0)).astype(np.int64)
    start += rng.integers(0, 1000, n)
    dur = np.maximum(rng.normal(1e6, 3e4, n), 1).astype(np.int64)
    hit = np.array([int(f * per_thread) + per_thread * (i % threads) for i, f in enumerate(slowed_at)])
    dur[hit] = (dur[hit] * factor).astype(np.int64)
    rare = _spans(res, ["rare"] * n, start, start + dur)
    return (pa.concat_tables([spans, rare]),
            planted | {(f"thread:h:1:{res[i]}", int(start[i])) for i in hit})


def _stream(spans: pa.Table, config: AnomalyConfig, producers: int, sync_every: int = 1):
    """Stream the calls step by step through ``producers`` detectors (calls partitioned by resource) and a
    parameter server. Producer p syncs after step s when (s + p) % sync_every == sync_every - 1 -- with
    ``sync_every`` > 1 the producers sync at staggered steps, each judging against a global model of its own
    age -- and every producer syncs once more at the end. Returns (calls, codes into the final model, values,
    the rows flagged during the stream (before the end and before pruning), the final model)."""
    calls = calls_from_spans(spans, config.kinds)
    values = calls.metric(config.metric).astype(np.float64)
    step = (calls.start - calls.start.min()) // config.step_ns
    server = ParameterServer()
    dets = [Detector(config) for _ in range(producers)]
    owner = calls.resource % producers
    flagged = np.zeros(len(calls), bool)
    for s in range(int(step.max()) + 1):
        for p, d in enumerate(dets):
            rows = np.flatnonzero((step == s) & (owner == p))
            if len(rows):
                _, f = d.process(calls.functions, calls.func[rows], values[rows])
                flagged[rows] = f
            if (s + p) % sync_every == sync_every - 1:
                d.sync(server)
    for d in dets:  # the end of the run: the last statistics of every producer
        d.sync(server)
    final = server.snapshot()
    codes = final.codes(calls.functions)[calls.func]
    return calls, codes, values, np.flatnonzero(flagged), final


def _f1(a: set, b: set) -> float:
    """F1 of one flagged set against the other (0 when both are empty: no agreement on nothing)."""
    return 2 * len(a & b) / (len(a) + len(b)) if a or b else 0.0


@pytest.mark.parametrize("algo", ["sstd", "hbos"])
def test_distributed_agrees_with_single_instance(algo):
    """8 producers syncing at staggered steps against one detector that sees everything: the same final model,
    the same anomalies after post-pruning (compared as flagged sets: almost every call is normal, so agreement
    of labels would say nothing), and the verdicts made during the run, before the final model exists, already
    find what the offline pass over the finished run finds -- the rare function's anomalies included, which no
    producer could flag from its own calls."""
    spans, planted = with_rare_function(*synthetic(n=80_000, threads=8, planted=80, seed=11))
    config = AnomalyConfig(algo=algo, step_ns=20_000_000)  # ~40 steps over the trace
    calls, codes, values, single, final1 = _stream(spans, config, producers=1)
    _, _, _, dist, final8 = _stream(spans, config, producers=8, sync_every=3)
    _assert_models_equal(final1, final8)  # the global models end identical
    sc = scorer(final1, config)
    single_p, dist_p = set(post_prune(single, codes, values, sc)), set(post_prune(dist, codes, values, sc))
    offline = detect(spans, config)
    off = set(np.flatnonzero(np.isin(calls.call_id, offline.anomalies["call_id"].to_pylist())).tolist())
    at = {(calls.resources[calls.resource[i]], int(calls.start[i])): i for i in range(len(calls))}
    rare = {at[k] for k in planted if k[0].endswith(tuple(f":{r}" for r in range(100, 108)))}
    during = set(dist.tolist())
    recall = len(during & off) / len(off)
    print(f"{algo}: post-pruned flagged sets F1 {_f1(single_p, dist_p):.4f}, {len(single_p ^ dist_p)} calls in "
          f"one set only ({len(single_p)} single, {len(dist_p)} distributed); verdicts during the run: "
          f"{len(during)}, recall against the offline pass's {len(off)} {recall:.4f}")
    assert len(rare) == 3 and rare <= off  # what the offline pass finds on the whole run
    assert _f1(single_p, dist_p) >= 0.98 and len(single_p ^ dist_p) <= 2
    assert recall >= 0.98
    assert rare <= during
    # post-pruned streaming verdicts are a subset of what the offline detector flags on the whole run
    assert single_p <= off and dist_p <= off


def test_post_pruning_removes_what_the_final_model_no_longer_flags():
    # early: tight durations; later: the same function becomes much more variable; early "outliers" are
    # normal for the final model
    rng = np.random.default_rng(2)
    early = rng.normal(1e6, 1e3, 3000)
    early[::500] = 1.02e6  # 20 std out early, 0.2 std out of the final model
    late = rng.normal(1e6, 1e5, 20000)
    v = np.concatenate([early, late])
    n = len(v)
    start = np.arange(n, dtype=np.int64) * 2_000_000
    spans = _spans(np.zeros(n, int), ["f"] * n, start, start + v.astype(np.int64))
    config = AnomalyConfig(algo="sstd", step_ns=1_000_000_000)
    calls, codes, values, cand, final = _stream(spans, config, producers=1)
    kept = post_prune(cand, codes, values, scorer(final, config))
    pruned = set(cand) - set(kept)
    assert {int(i) for i in np.flatnonzero(np.isin(calls.start, start[:3000:500]))} <= set(cand)
    assert pruned >= {int(i) for i in np.flatnonzero(np.isin(calls.start, start[:3000:500]))}
    _, still = scorer(final, config).score(codes[list(pruned)], values[list(pruned)])
    assert not still.any()
    _, kept_flag = scorer(final, config).score(codes[kept], values[kept])
    assert kept_flag.all()


def test_nesting_gives_exclusive_time_depth_children_and_stack():
    # main(0..100) > [a(10..40) > b(15..25)], c(50..90); every time in ns
    spans = _spans(["t"] * 4, ["main", "a", "b", "c"], np.array([0, 10, 15, 50]), np.array([100, 40, 25, 90]),
                   span_id=[1, 2, 3, 4], parent_id=[None, 1, 2, 1])
    c = calls_from_spans(spans)
    by = {c.functions[f]: i for i, f in enumerate(c.func)}
    assert c.exclusive[by["main"]] == 100 - 30 - 40
    assert c.exclusive[by["a"]] == 30 - 10 and c.exclusive[by["b"]] == 10 and c.exclusive[by["c"]] == 40
    assert c.depth[by["b"]] == 2 and c.children[by["main"]] == 2 and c.children[by["b"]] == 0
    assert c.call_id[by["b"]] == 3
    cyc = _spans(["t"] * 2, ["x", "y"], np.array([0, 1]), np.array([5, 4]), span_id=[1, 2], parent_id=[2, 1])
    with pytest.raises(CallTreeError, match="cycle"):
        calls_from_spans(cyc)


def test_anomaly_record_carries_window_exemplar_stack_and_model():
    # one thread: 40 calls of "work" inside "step" parents, one of them 50x slower
    n = 40
    dur = np.full(n, 1000, np.int64)
    dur[20] = 50_000
    start = np.concatenate([[0], np.cumsum(dur[:-1] + 100)]) + 10
    parents_start = start - 5
    spans = _spans(["t"] * (2 * n), ["step"] * n + ["work"] * n, np.concatenate([parents_start, start]),
                   np.concatenate([start + dur + 5, start + dur]), span_id=list(range(1, 2 * n + 1)),
                   parent_id=[None] * n + list(range(1, n + 1)))
    det = detect(spans, AnomalyConfig(algo="sstd", window=3), meta={"run_id": "r1", "name": "x", "command": "c"})
    work = [r for r in det.anomalies.to_pylist() if r["function"] == "work"]
    assert len(work) == 1
    r = work[0]
    assert r["call_id"] == n + 21 and r["parent_call_id"] == 21 and r["depth"] == 1
    assert r["call_stack"] == ["step", "work"] and r["inclusive_ns"] == 50_000 and r["exclusive_ns"] == 50_000
    # the k calls before and after on the thread, in entry order (parents and children interleave)
    assert r["window_before"] == [20, n + 20, 21][-3:] and r["window_after"] == [22, n + 22, 23]
    ex = r["exemplar_call_id"]
    assert ex != r["call_id"] and ex in set(range(n + 1, 2 * n + 1)) and r["exemplar_ns"] == 1000
    m = json.loads(r["model"])
    assert m["count"] == n and m["sigma"] == 6.0 and m["upper"] < 50_000
    assert json.loads(r["provenance"])["run_id"] == "r1" and r["run_id"] == "r1"
    assert det.anomalies.schema == ANOMALIES


def test_bad_input_is_named():
    bad = _spans(["t"], ["f"], np.array([10]), np.array([5]))
    with pytest.raises(ValueError, match=r"end before they start.*'f'.*start_ns=10"):
        detect(bad)
    good = FunctionModel.of(["f"], np.zeros(3, np.int64), np.array([1.0, 2.0, 3.0])).to_dict()
    good["functions"][0]["count"] = "many"
    with pytest.raises(ValueError, match=r"function 0 \('f'\)"):
        FunctionModel.from_dict(good)
    with pytest.raises(ValueError, match="algo must be one of"):
        AnomalyConfig(algo="lof")


def test_every_anomalies_column_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "data-model.md").read_text()
    assert "### `anomalies`" in doc
    section = doc.split("### `anomalies`", 1)[1].split("\n## ", 1)[0]
    for f in ANOMALIES:
        assert f"| `{f.name}` |" in section, f.name


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli_anomalies.register(sub)
    args = parser.parse_args(["anomalies", *argv])
    return args.func(args)


def test_reduced_run_and_cli(tmp_path, capsys):
    spans, planted = synthetic(n=30_000, threads=4, planted=30, seed=4)
    fs = flowscope.Client("embedded", store=tmp_path / "store", name="synthetic")
    fs.write("spans", spans)
    fs.close()
    assert _cli([str(fs.run_dir), "--algo", "sstd", "--json", "--reduce", str(tmp_path / "reduced")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["anomalies"] >= 0.9 * len(planted)
    assert all("std above the mean" in t["why"] for t in out["top"])
    red = out["reduction"]
    reduced = flowscope.open_run(tmp_path / "reduced")
    a = reduced_anomalies(tmp_path / "reduced")
    assert reduced.arrow("anomalies").num_rows == a.num_rows  # the stored table is a readable derived table
    kept = window_calls(tmp_path / "reduced")
    assert set(zip(a["resource_id"].to_pylist(), a["start_ns"].to_pylist())) <= planted
    assert a.num_rows == out["anomalies"] and kept.num_rows == red["kept_calls_rows"]
    ids = set(kept["call_id"].to_pylist())  # every window and exemplar id resolves in the reduced run
    for r in a.to_pylist():
        assert {r["call_id"], r["exemplar_call_id"], *r["window_before"], *r["window_after"]} <= ids
        assert len(r["window_before"]) == 5 and len(r["window_after"]) == 5
    assert kept.num_rows <= len(planted) * 12
    assert red["reduction_factor"] == pytest.approx(red["full_spans_bytes"] / red["kept_bytes"])
    assert red["kept_bytes"] == sum(f.stat().st_size for f in (tmp_path / "reduced").rglob("*.parquet"))
    assert red["reduction_factor"] > 10
    assert reduced.meta["anomaly_reduction"]["anomalies"] == a.num_rows
    assert _cli([str(fs.run_dir), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "top 3 anomalies" in text and "histogram bin" in text


# ---- a real Dask run --------------------------------------------------------------------------------------

def work(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i


def other(x: int) -> int:
    time.sleep(0.01)
    return x + 1


def test_dask_slowed_tasks_are_found_and_ranked_by_time_lost(tmp_path):
    """Both detectors with their default parameters, on a real Dask run with three tasks slowed by 0.5 to 0.7 s
    among 400 of 10 ms, judged against what the run's own durations say by each detector's definition, worked out
    here with pandas: SSTD flags exactly the calls more than 6 sample standard deviations from their function's
    mean; HBOS flags every call that no other call of its function comes within one bin width of (Scott's rule
    over the function's calls, docs/anomalies.md), as such a call is alone in its bin and a bin of one is the
    rarest there is. On a quiet machine that is all three slowed tasks for both (the mildest sits about 9.5 sigma
    out). A busy machine stretches other calls too (a Python GC pause inside a task is 40 ms quiet, far more on a
    saturated machine); stretched far enough, they widen the bins until two slowed tasks share one and raise the
    std past what 0.5 s clears, as in one CI run -- and then the definitions, not this test, say which stand out."""
    from distributed import Client as DaskClient
    from distributed import LocalCluster

    n, slow = 400, {7: 0.5, 93: 0.6, 171: 0.7}
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", worker_dashboard_address=None,
                      processes=True) as cluster, DaskClient(cluster) as client:
        with flowscope.observe(client, store=tmp_path / "store", name="anomaly-test") as obs:
            xs = [client.submit(work, i, slow.get(i, 0.01), key=f"work-{i}") for i in range(n)]
            ys = [client.submit(other, x, key=f"other-{i}") for i, x in enumerate(xs)]
            client.gather(ys)
    run = obs.run
    spans = run.sql("SELECT task_key, name, (end_ns - start_ns)::DOUBLE AS d FROM spans WHERE kind = 'task'")
    assert len(spans) == 2 * n
    by = spans.groupby("name")["d"]
    mean, std = by.transform("mean"), by.transform("std")
    lost = dict(zip(spans["task_key"], spans["d"] - mean))  # time lost by each task against its task group
    z = (spans["d"] - mean).abs() / std
    clear = (z - 6.0).abs() > 1e-6  # calls on the boundary itself are left to rounding
    sstd_flags = set(spans["task_key"][(z > 6.0) & clear])
    alone = set(spans["task_key"][alone_in_hbos_bin(spans["name"], spans["d"])])
    planted = {f"work-{i}" for i in slow}
    for algo in ("hbos", "sstd"):
        config = AnomalyConfig(algo=algo)
        assert config.sigma == 6.0
        rows = detect_run(run, config).anomalies.to_pylist()
        found = {r["task_key"] for r in rows}
        if algo == "sstd":
            assert found & set(spans["task_key"][clear]) == sstd_flags, (sorted(found ^ sstd_flags), rows[:5])
        else:
            assert alone <= found, (sorted(alone - found), rows[:5])
        # ranked by time lost, most first
        assert [r["severity_ns"] for r in rows] == sorted((r["severity_ns"] for r in rows), reverse=True)
        for r in rows:
            assert abs(r["severity_ns"] - lost[r["task_key"]]) <= 1, (r, lost[r["task_key"]])
        mine = [r for r in rows if r["task_key"] in planted]
        assert all(r["function"] == "work" and r["severity_ns"] > 400_000_000 for r in mine), mine
        assert all(r["resource_id"].startswith("thread:") for r in mine)
        assert all(json.loads(r["provenance"])["run_id"] == run.meta["run_id"] for r in mine)


# ---- reduced runs keep everything they claim ----------------------------------------------------------------

@pytest.mark.parametrize("metric", ["exclusive", "inclusive"])
def test_reduced_run_round_trips_anomalies_windows_and_model(tmp_path, metric):
    """A reduced run gives back the detection's anomalies table, the kept calls' entry, exit, inclusive and
    exclusive times and ids, and the model, exactly -- on nested calls (exclusive != inclusive) too."""
    spans, _ = synthetic(n=6_000, threads=3, planted=8, seed=9)
    n = spans.num_rows
    # nest every third call under a parent call that encloses it
    parents = spans.slice(0, n // 3)
    pid = np.arange(n // 3, dtype=np.int64) + 10_000_000
    ps = parents["start_ns"].to_numpy() - 500
    pe = parents["end_ns"].to_numpy() + 700
    outer = _spans(parents["resource_id"].to_pylist(), ["outer"] * len(pid), ps, pe, span_id=pid)
    child_ids = np.arange(n, dtype=np.int64) + 1
    child_parent = np.r_[pid, np.full(n - len(pid), -1)]
    inner = _spans(spans["resource_id"].to_pylist(), spans["name"].to_pylist(), spans["start_ns"].to_numpy(),
                   spans["end_ns"].to_numpy(), span_id=child_ids,
                   parent_id=[int(p) if p >= 0 else None for p in child_parent])
    full = pa.concat_tables([outer, inner])
    det = detect(full, AnomalyConfig(algo="sstd", metric=metric, window=3), meta={"run_id": "x", "start_ns": 0})
    assert det.anomalies.num_rows > 0
    info = write_reduced(det, tmp_path / "r", full_spans=full, meta={"run_id": "x"})
    assert reduced_anomalies(tmp_path / "r").equals(det.anomalies)
    rows = kept_rows(det)
    w = window_calls(tmp_path / "r")
    c = det.calls
    for col, want in (("call_id", c.call_id), ("start_ns", c.start), ("end_ns", c.end),
                      ("inclusive_ns", c.inclusive), ("exclusive_ns", c.exclusive), ("depth", c.depth)):
        assert np.array_equal(w[col].to_numpy(), want[rows]), col
    assert (c.exclusive[rows] != c.inclusive[rows]).any()
    config, model = load_model(tmp_path / "r")
    assert config == det.config
    for a, b in zip(model.arrays, det.model.arrays):
        assert np.array_equal(a, b)
    assert info["row_factor"] == pytest.approx(full.num_rows / len(rows))


def test_reduced_run_bad_files_say_which(tmp_path):
    spans, _ = synthetic(n=3_000, threads=2, planted=5, seed=2)
    det = detect(spans, AnomalyConfig(algo="sstd"))
    write_reduced(det, tmp_path / "r", full_spans=spans)
    calls = tmp_path / "r" / "anomaly_calls.parquet"
    calls.write_bytes(calls.read_bytes()[: calls.stat().st_size // 2])  # truncated
    with pytest.raises(ValueError, match="anomaly_calls.parquet"):
        window_calls(tmp_path / "r")
    write_reduced(det, tmp_path / "s", full_spans=spans)
    t = compact_calls(det, kept_rows(det)).drop_columns(["residual_ns"])
    import pyarrow.parquet as pq
    pq.write_table(t, tmp_path / "s" / "anomaly_calls.parquet")
    with pytest.raises(ValueError, match="missing column.*residual_ns"):
        window_calls(tmp_path / "s")
    model = tmp_path / "s" / "anomaly_model.parquet"
    model.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="anomaly_model.parquet"):
        load_model(tmp_path / "s")
    with pytest.raises(FileExistsError):
        write_reduced(det, tmp_path / "r", full_spans=spans)
