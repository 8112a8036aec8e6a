"""Anomaly-detector throughput and reduction factor.

Measured, side by side in one process (alternating, medians):

* ``flowscope`` -- the vectorised detector on 10,000,000 synthetic function events (int function codes and
  exclusive times in ns, 50 functions), fed in batches of 1,000,000 as a detector next to a producer would
  get them: each batch is added to the per-function model (count, mean, M2, min, max, grid histogram) and
  every call in it is judged against the updated model. ``value`` = events/s of the SSTD detector (the rule
  the peer implements); HBOS is in ``params``.
* ``naive_python_sstd`` (the peer) -- a straightforward per-event Python loop doing the same: Welford update
  of the function's count/mean/M2 and the mean +- sigma*std test. It runs on a 300,000-event subsample and
  its rate is extrapolated to 10,000,000 events (a rate per event: the loop's cost is linear).

Reduction: offline detection (SSTD) over an Arrow spans table of 1,000,000 flat calls of 20 functions on 16
threads with 0.1 % planted anomalies (window 5), reduced as ``flowscope anomalies --reduce`` does. The factor
is the bytes of the full spans table as the store writes a segment (one Parquet file, zstd, dictionary
encoding, rows in completion order; span_id, parent_id, task_key and attrs null, so the full table is as small
as flowscope ever stores it) over the bytes of every file of the reduced run (anomalies, compact kept calls,
per-function model). ``row_factor`` is the same ratio in rows: its ceiling for isolated anomalies is
1 / (0.001 * (2 * window + 1)) = 90.9x, less where windows overlap, plus exemplars.

    python bench/anomalies.py            # full (about 5 s on the 2-core development VM)
    python bench/anomalies.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, git_commit, write_result  # noqa: E402

from flowscope.analysis.anomalies import AnomalyConfig, FunctionModel, detect, scorer  # noqa: E402
from flowscope.analysis.anomalies.reduce import write_reduced  # noqa: E402
from flowscope.model.schemas import schema  # noqa: E402

BENCH = "anomalies"
TARGET = 5_000_000
TARGET_REDUCTION = 100.0
MAIN_PEER = "naive_python_sstd"
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"


def events(n: int, nfunc: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, nfunc, n).astype(np.int64)
    base = np.exp(rng.uniform(8, 16, nfunc))
    v = np.maximum(rng.normal(base[codes], 0.05 * base[codes]), 1.0)
    hit = rng.choice(n, n // 1000, replace=False)
    v[hit] *= rng.uniform(5, 20, len(hit))
    return codes, v


def run_flowscope(codes: np.ndarray, v: np.ndarray, algo: str, batch: int) -> tuple[float, int]:
    names = [f"f{i}" for i in range(int(codes.max()) + 1)]
    config = AnomalyConfig(algo=algo)
    t0 = time.perf_counter()
    model = FunctionModel()
    model.codes(names)
    flagged = 0
    for i in range(0, len(codes), batch):
        c, x = codes[i:i + batch], v[i:i + batch]
        model.update(c, x)
        flagged += int(scorer(model, config).score(c, x)[1].sum())
    return time.perf_counter() - t0, flagged


def run_naive(codes: list[int], v: list[float], sigma: float = 6.0) -> tuple[float, int]:
    t0 = time.perf_counter()
    stats: dict[int, list[float]] = {}
    flagged = 0
    for c, x in zip(codes, v):
        s = stats.get(c)
        if s is None:
            s = stats[c] = [0, 0.0, 0.0]
        s[0] += 1
        d = x - s[1]
        s[1] += d / s[0]
        s[2] += d * (x - s[1])
        if s[0] > 1:
            std = math.sqrt(s[2] / (s[0] - 1))
            if std > 0 and abs(x - s[1]) > sigma * std:
                flagged += 1
    return time.perf_counter() - t0, flagged


def reduction(n: int, threads: int = 16, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    nfunc = 20
    func = rng.integers(0, nfunc, n)
    base = np.exp(rng.uniform(10, 15, nfunc))
    dur = np.maximum(rng.normal(base[func], 0.03 * base[func]), 1).astype(np.int64)
    hit = rng.choice(n, n // 1000, replace=False)
    dur[hit] = (dur[hit] * rng.uniform(5, 20, len(hit))).astype(np.int64)
    res = rng.integers(0, threads, n)
    start = np.zeros(n, np.int64)
    for t in range(threads):
        m = res == t
        start[m] = 1_763_700_000_000_000_000 + np.concatenate([[0], np.cumsum(dur[m][:-1] + 500)])
    spans = pa.table({"span_id": pa.nulls(n, pa.int64()), "parent_id": pa.nulls(n, pa.int64()),
                      "resource_id": pa.array([f"thread:bench:1:{t}" for t in range(threads)])
                      .take(pa.array(res)),
                      "kind": pa.array(["call"] * n), "name": pa.array([f"fn_{i}" for i in range(nfunc)])
                      .take(pa.array(func)), "start_ns": start, "end_ns": start + dur,
                      "task_key": pa.nulls(n, pa.string()), "attrs": pa.nulls(n, pa.string())}, schema=schema("spans"))
    det = detect(spans, AnomalyConfig(algo="sstd", window=5))
    with tempfile.TemporaryDirectory() as tmp:
        info = write_reduced(det, Path(tmp) / "reduced", full_spans=spans, meta={"run_id": "bench"})
    info["planted"] = int(len(hit))
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--naive-events", type=int, default=300_000)
    ap.add_argument("--reduction-calls", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.events, a.naive_events, a.reduction_calls, a.reps = 1_000_000, 50_000, 100_000, 1
    codes, v = events(a.events)
    nc, nv = codes[:a.naive_events].tolist(), v[:a.naive_events].tolist()
    times = {"sstd": [], "hbos": [], MAIN_PEER: []}
    for rep in range(a.reps):
        for name in (["sstd", "hbos", MAIN_PEER] if rep % 2 == 0 else [MAIN_PEER, "hbos", "sstd"]):
            if name == MAIN_PEER:
                times[name].append(run_naive(nc, nv)[0] * (a.events / a.naive_events))
            else:
                times[name].append(run_flowscope(codes, v, name, a.batch)[0])
    rate = {k: a.events / statistics.median(t) for k, t in times.items()}
    red = reduction(a.reduction_calls)
    result = {
        "benchmark": BENCH, "metric": "events_per_s", "value": rate["sstd"], "unit": "events/s", "target": TARGET,
        "meets_target": rate["sstd"] >= TARGET,
        "peers": {MAIN_PEER: {"value": rate[MAIN_PEER], "unit": "events/s",
                              "note": f"per-event Python loop on {a.naive_events} events, extrapolated to {a.events}"}},
        "ratio_vs_peer": rate["sstd"] / rate[MAIN_PEER],
        "params": {"events": a.events, "functions": 50, "batch": a.batch, "reps": a.reps,
                   "hbos_events_per_s": rate["hbos"], "anomaly_fraction": 0.001,
                   "reduction_factor": red["reduction_factor"], "reduction_target": TARGET_REDUCTION,
                   "reduction_meets_target": red["reduction_factor"] >= TARGET_REDUCTION, "reduction": red,
                   "window": 5, "cpu_model": cpu_model(), "commit": git_commit(), "single_core": True},
    }
    write_result(result, RESULTS)
    print(f"anomalies: sstd {rate['sstd'] / 1e6:.2f} M events/s, hbos {rate['hbos'] / 1e6:.2f} M events/s "
          f"(target {TARGET / 1e6:.0f} M), naive Python SSTD {rate[MAIN_PEER] / 1e6:.3f} M events/s "
          f"(extrapolated), {result['ratio_vs_peer']:.0f}x; reduction {red['reduction_factor']:.1f}x at window 5 "
          f"with 0.1 % anomalies (target {TARGET_REDUCTION:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
