"""Reduced runs: keep only the anomalies, the calls in their windows, one normal exemplar per
anomalous function and step, and the per-function model; measure the reduction factor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flowscope.analysis.anomalies.detect import Detection, _exemplars, detect_run
from flowscope.store.layout import RUN_JSON, write_json_atomic, write_segment

MODEL_FILE = "anomaly_model.json"


def parquet_bytes(table: pa.Table) -> int:
    """Bytes of ``table`` written as the store writes segments (Parquet, zstd, dictionary encoding)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", use_dictionary=True, write_statistics=True)
    return sink.getvalue().size


def kept_rows(det: Detection) -> np.ndarray:
    """Rows of ``det.calls`` a reduced run keeps: anomalies, the ``window`` calls on each side of each
    on the same resource, and the exemplars."""
    rows = det.rows
    if not len(rows):
        return np.zeros(0, np.int64)
    k = det.config.window
    lo = det.calls.resource_start()[rows]
    hi = det.calls.resource_end()[rows]
    offs = np.arange(-k, k + 1, dtype=np.int64)
    cand = rows[:, None] + offs[None, :]
    ok = (cand >= lo[:, None]) & (cand < hi[:, None])
    ex = _exemplars(det.calls, rows, det.codes, det.flagged, det.step)
    return np.unique(np.concatenate([cand[ok], ex[ex >= 0]]))


def write_reduced(det: Detection, out: str | Path, *, full_spans: pa.Table, meta: dict | None = None) -> dict:
    """Write the reduced run of ``det`` to directory ``out``; returns sizes and the reduction factor
    (Parquet bytes of ``full_spans`` over the bytes written)."""
    out = Path(out)
    if (out / RUN_JSON).exists():
        raise FileExistsError(f"{out}: a run is already there")
    out.mkdir(parents=True, exist_ok=True)
    rows = kept_rows(det)
    spans = det.calls.table.take(pa.array(rows, pa.int64()))
    ids = pa.array(det.calls.call_id[rows], pa.int64())
    spans = spans.set_column(spans.schema.get_field_index("span_id"), spans.schema.field("span_id"),
                             pc.coalesce(spans["span_id"], ids))  # window and exemplar ids resolve in the reduced run
    write_segment(out, "spans", "reduced", spans)
    write_segment(out, "anomalies", "reduced", det.anomalies)
    (out / MODEL_FILE).write_text(json.dumps({"config": det.config.as_dict(), "model": det.model.to_dict()}))
    full = parquet_bytes(full_spans)
    kept = sum(f.stat().st_size for f in (out / "spans" / "reduced.parquet", out / "anomalies" / "reduced.parquet",
                                          out / MODEL_FILE))
    info = {"full_spans_rows": full_spans.num_rows, "full_spans_bytes": full, "kept_spans_rows": int(len(rows)),
            "anomalies": det.anomalies.num_rows, "kept_bytes": kept,
            "reduction_factor": full / kept if kept else float("inf")}
    m = dict(meta or {})
    m.setdefault("run_id", out.name)
    m["reduced_from"] = m.get("run_id")
    m["anomaly_reduction"] = info
    write_json_atomic(out / RUN_JSON, m)
    return info


def reduce_run(run, out: str | Path, config=None) -> dict:
    """Detect anomalies in ``run`` and write its reduced run to ``out``; returns the reduction figures."""
    det = detect_run(run, config)
    return write_reduced(det, out, full_spans=run.arrow("spans"), meta=run.meta)
