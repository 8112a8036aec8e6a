"""The three workflows of the Dask performance-provenance paper (section IV), at small scale, each on a local
cluster of 2 workers x 2 threads, knowing nothing of flowscope (bench/provenance_study.py runs them under
``flowscope run``). Prints one JSON line with what the workflow computed.

* ``image`` -- the image-processing pipeline (flowscope.workflows.image_pipeline: generate images on disk,
  then read, normalise, grayscale, Gaussian-filter, segment and write each, and per-batch means);
* ``batch`` -- a @delayed batch prediction (bench/_dask_workflows.py ``batch``: 240 batches of uneven size,
  each loaded, fitted by least squares and scored, the scores combined in groups);
* ``xgboost`` -- XGBoost trained on Dask as the paper's XGBOOST workflow is: a Parquet dataset read with
  dask.dataframe, a column assigned (Dask fuses both into ``read_parquet-fused-assign`` tasks), split at
  random, then ``xgboost.dask.train`` and ``xgboost.dask.predict`` on the held-out part. The dataset (200,000 rows,
  16 features, a label from a seeded linear rule with noise, 8 files) is written once by ``prepare DIR``.

    python bench/_provenance_workflows.py prepare DIR
    python bench/_provenance_workflows.py image|batch|xgboost DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

FEATURES = [f"f{i}" for i in range(16)]


def prepare(data: Path) -> None:
    """Write the XGBoost workflow's Parquet dataset into ``data``/xgboost (once)."""
    import pandas as pd

    out = data / "xgboost"
    if out.is_dir() and any(out.glob("*.parquet")):
        return
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    w = rng.standard_normal(len(FEATURES))
    for part in range(8):
        x = rng.standard_normal((25_000, len(FEATURES)))
        df = pd.DataFrame(x, columns=FEATURES)
        df["label"] = ((x @ w + rng.standard_normal(len(x))) > 0).astype("int32")
        df.to_parquet(out / f"part-{part}.parquet", index=False)


def image(client, data: Path) -> float:
    from flowscope.workflows.image_pipeline import run_pipeline

    return run_pipeline(client, data / "images", images=32, size=384).mean_intensity


def batch(client, data: Path) -> float:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _dask_workflows import batch_workflow

    return batch_workflow()


def xgboost_workflow(client, data: Path) -> float:
    import dask.dataframe as dd
    import xgboost as xgb
    import xgboost.dask  # noqa: F401  (xgb.dask)

    df = dd.read_parquet(str(data / "xgboost"))
    df = df.assign(f_sum=df["f0"] + df["f1"])
    feats = [*FEATURES, "f_sum"]
    train, test = df.random_split([0.8, 0.2], random_state=0)
    dtrain = xgb.dask.DaskDMatrix(client, train[feats], train["label"])
    out = xgb.dask.train(client, {"tree_method": "hist", "objective": "binary:logistic", "max_depth": 6,
                                  "eta": 0.3, "nthread": 2}, dtrain, num_boost_round=40)
    pred = xgb.dask.predict(client, out["booster"], test[feats])
    label = test["label"].to_dask_array(lengths=True)
    return float((((pred > 0.5).astype("int32")) == label).mean().compute())  # accuracy on the held-out rows


WORKFLOWS = {"image": image, "batch": batch, "xgboost": xgboost_workflow}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in (*WORKFLOWS, "prepare"):
        print(f"usage: python {sys.argv[0]} prepare|{'|'.join(WORKFLOWS)} DIR", file=sys.stderr)
        return 2
    data = Path(argv[1])
    if argv[0] == "prepare":
        prepare(data)
        return 0
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None) as cluster, Client(cluster) as client:
        value = WORKFLOWS[argv[0]](client, data)
    print(json.dumps({"workflow": argv[0], "value": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
