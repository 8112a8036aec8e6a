"""Two Dask workflows of our own, on a local cluster of 2 workers x 2 threads, knowing nothing of flowscope (the
benchmarks run them under ``flowscope run``). Prints one JSON line with what the workflow computed.

* ``array`` -- a dask.array pipeline: a 6,000 x 6,000 random matrix in 750 x 750 chunks, ``x @ x.T``, then a
  rechunk to row panels and per-row norms, reduced to one figure (blocked matrix product, rechunk, tree reductions).
* ``batch`` -- a @delayed batch-prediction job: 240 batches of uneven size (a seeded draw of 500-6,000 rows), each
  "loaded" (generated), fitted by least squares on 40 features and scored; the scores combined in groups of 12,
  then into one (uneven task durations, so workers go idle and busy in turn).

    python bench/_dask_workflows.py array
    flowscope run -- python bench/_dask_workflows.py batch
"""

from __future__ import annotations

import json
import sys

import numpy as np


def array_workflow() -> float:
    import dask.array as da

    x = da.random.RandomState(0).random_sample((6_000, 6_000), chunks=(750, 750))
    y = (x @ x.T).rechunk((250, 6_000))
    return float(da.sqrt((y ** 2).sum(axis=1)).mean().compute())


def _load(i: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    rows = int(rng.integers(500, 6_000))
    a = rng.standard_normal((rows, 40))
    return a, a @ np.linspace(-1, 1, 40) + rng.standard_normal(rows) * 0.1


def _fit_and_score(batch: tuple[np.ndarray, np.ndarray]) -> float:
    a, b = batch
    coef = np.linalg.lstsq(a, b, rcond=None)[0]
    for _ in range(20):  # refits on bootstrap halves: the work grows with the batch
        idx = np.random.default_rng(len(b)).integers(0, len(b), len(b) // 2)
        coef = 0.5 * coef + 0.5 * np.linalg.lstsq(a[idx], b[idx], rcond=None)[0]
    return float(np.mean((a @ coef - b) ** 2))


def _combine(*scores: float) -> float:
    return float(np.mean(scores))


def batch_workflow() -> float:
    from dask import delayed

    # pure: the keys are the same in every run, so runs can be compared task by task (scheduling order)
    scores = [delayed(_fit_and_score, pure=True)(delayed(_load, pure=True)(i)) for i in range(240)]
    groups = [delayed(_combine, pure=True)(*scores[i:i + 12]) for i in range(0, len(scores), 12)]
    return float(delayed(_combine, pure=True)(*groups).compute())


WORKFLOWS = {"array": array_workflow, "batch": batch_workflow}


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in WORKFLOWS:
        print(f"usage: python {sys.argv[0]} {'|'.join(WORKFLOWS)}", file=sys.stderr)
        return 2
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None) as cluster, Client(cluster):
        value = WORKFLOWS[sys.argv[1]]()
    print(json.dumps({"workflow": sys.argv[1], "value": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
