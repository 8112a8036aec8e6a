"""Offline detection over a finished run, the prescriptive-provenance record of each anomaly, and
post-pruning of a stream's verdicts against the final model."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from flowscope.analysis.anomalies.calls import Calls, calls_from_spans
from flowscope.analysis.anomalies.config import AnomalyConfig
from flowscope.analysis.anomalies.model import FunctionModel, Scorer, scorer
from flowscope.model.schemas import ANOMALIES

PROVENANCE_KEYS = ("run_id", "name", "command", "status", "start_ns", "end_ns", "host", "user", "cwd")


@dataclass
class Detection:
    """The verdict on every call of a run, and the anomalies table built from it."""

    config: AnomalyConfig
    calls: Calls
    model: FunctionModel
    scorer: Scorer
    codes: np.ndarray          # per call: its function's index in ``model``
    values: np.ndarray         # per call: the scored metric (ns)
    score: np.ndarray
    flagged: np.ndarray
    step: np.ndarray
    anomalies: pa.Table        # ANOMALIES schema, most severe first

    @property
    def rows(self) -> np.ndarray:
        """Rows of ``calls`` that are anomalies, in the order of ``anomalies``."""
        return self._rows

    _rows: np.ndarray = None  # type: ignore[assignment]


def provenance(meta: dict | None) -> str | None:
    """The run's provenance reference an anomaly carries (a few fields of run.json, as JSON)."""
    if not meta:
        return None
    return json.dumps({k: meta[k] for k in PROVENANCE_KEYS if k in meta}, default=str)


def steps_of(calls: Calls, config: AnomalyConfig, run_start_ns: int | None) -> np.ndarray:
    origin = run_start_ns if run_start_ns is not None else (int(calls.start.min()) if len(calls) else 0)
    return np.maximum(calls.start - origin, 0) // config.step_ns


def detect(spans: pa.Table, config: AnomalyConfig | None = None, *, transfers: pa.Table | None = None,
           resources: pa.Table | None = None, meta: dict | None = None, model: FunctionModel | None = None,
           judge: Scorer | None = None, positions: dict[str, int] | None = None) -> Detection:
    """Judge every function call among ``spans`` against the model of all of them (a finished run). ``model``
    and its ``judge`` (:func:`~flowscope.analysis.anomalies.model.scorer`) are given when ``spans`` are a part
    of the calls judged, every resource's calls whole (analysis/partitioned.py); they must know every function
    among ``spans``, and ``positions`` too when the run's spans lack span ids (a call's id is then its row in the
    run's calls): for each resource, the row its calls begin at."""
    config = config or AnomalyConfig()
    calls = calls_from_spans(spans, config.kinds)
    if positions is not None and len(calls):
        base = np.fromiter((positions[r] for r in calls.resources), np.int64, len(calls.resources))
        calls.call_id = base[calls.resource] + (np.arange(len(calls), dtype=np.int64) - calls.resource_start())
    values = calls.metric(config.metric).astype(np.float64)
    if model is None:
        model = FunctionModel()
        codes = model.codes(calls.functions)[calls.func] if len(calls) else np.zeros(0, np.int64)
        model.update(codes, values)
    else:
        index = model.index
        missing = [f for f in calls.functions if f not in index]
        if missing:
            raise ValueError(f"the model given does not know {len(missing)} of the calls' functions, "
                             f"e.g. {missing[0]!r}")
        codes = (np.fromiter(map(index.__getitem__, calls.functions), np.int64, len(calls.functions))[calls.func]
                 if len(calls) else np.zeros(0, np.int64))
    sc = judge if judge is not None else scorer(model, config)
    score, flagged = sc.score(codes, values)
    step = steps_of(calls, config, (meta or {}).get("start_ns"))
    rows = np.flatnonzero(flagged)
    table, order = anomaly_records(calls, rows, codes, values, score, flagged, step, sc, transfers=transfers,
                                   resources=resources, meta=meta)
    det = Detection(config, calls, model, sc, codes, values, score, flagged, step, table)
    det._rows = rows[order]
    return det


def detect_run(run, config: AnomalyConfig | None = None) -> Detection:
    """``detect`` over a run on disk (``flowscope.open_run``)."""
    return detect(run.sql_arrow("SELECT * FROM activity"), config, transfers=run.arrow("transfers"),
                  resources=run.arrow("resources"), meta=run.meta)


def post_prune(rows: np.ndarray, codes: np.ndarray, values: np.ndarray, final: Scorer) -> np.ndarray:
    """The rows among ``rows`` (flagged while streaming) that the final model still flags."""
    rows = np.asarray(rows, np.int64)
    _, keep = final.score(codes[rows], values[rows])
    return rows[keep]


def _messages(calls: Calls, rows: np.ndarray, transfers: pa.Table | None, resources: pa.Table | None) -> np.ndarray:
    """Per anomaly row: transfers whose source or destination is the call's resource or its parent
    resource (a Dask worker for a thread) and whose interval overlaps the call."""
    out = np.zeros(len(rows), np.int64)
    if transfers is None or transfers.num_rows == 0 or not len(rows):
        return out
    parent_of = {}
    if resources is not None and resources.num_rows:
        parent_of = dict(zip(resources["resource_id"].to_pylist(), resources["parent_id"].to_pylist()))
    t_start = transfers["start_ns"].to_numpy().astype(np.int64)
    t_end = transfers["end_ns"].to_numpy().astype(np.int64)
    by_res: dict[str, list[int]] = {}
    for i, (s, d) in enumerate(zip(transfers["src_resource_id"].to_pylist(), transfers["dst_resource_id"].to_pylist())):
        by_res.setdefault(s, []).append(i)
        if d != s:
            by_res.setdefault(d, []).append(i)
    idx = {k: np.asarray(v, np.int64) for k, v in by_res.items()}
    for j, r in enumerate(rows):
        rid = calls.resources[calls.resource[r]]
        cand = [idx[x] for x in (rid, parent_of.get(rid)) if x in idx]
        if not cand:
            continue
        c = np.unique(np.concatenate(cand))
        out[j] = int(np.count_nonzero((t_start[c] <= calls.end[r]) & (t_end[c] >= calls.start[r])))
    return out


def _exemplars(calls: Calls, rows: np.ndarray, codes: np.ndarray, flagged: np.ndarray, step: np.ndarray
               ) -> np.ndarray:
    """Per anomaly row: the first normal call (in resource, entry order) of the same function in the same
    step, else of the same function in any step; -1 when the function has no normal call."""
    out = np.full(len(rows), -1, np.int64)
    if not len(rows):
        return out
    nf = int(codes.max()) + 1
    nsteps = int(step.max()) + 1
    normal = np.flatnonzero(~flagged)
    first_any = np.full(nf, len(codes), np.int64)
    np.minimum.at(first_any, codes[normal], normal)
    if nf * nsteps <= 50_000_000:
        key = codes[normal] * nsteps + step[normal]
        first = np.full(nf * nsteps, len(codes), np.int64)
        np.minimum.at(first, key, normal)
        same = first[codes[rows] * nsteps + step[rows]]
    else:
        same = np.full(len(rows), len(codes), np.int64)
    pick = np.where(same < len(codes), same, first_any[codes[rows]])
    out[pick < len(codes)] = pick[pick < len(codes)]
    return out


def _stack(calls: Calls, r: int) -> list[str]:
    names = []
    while r >= 0 and len(names) < 512:
        names.append(calls.functions[calls.func[r]])
        r = int(calls.parent[r])
    return names[::-1]


def anomaly_records(calls: Calls, rows: np.ndarray, codes: np.ndarray, values: np.ndarray, score: np.ndarray,
                    flagged: np.ndarray, step: np.ndarray, sc: Scorer, *, transfers: pa.Table | None = None,
                    resources: pa.Table | None = None, meta: dict | None = None) -> tuple[pa.Table, np.ndarray]:
    """The anomalies table for the flagged ``rows`` (most severe first) and the order applied to ``rows``."""
    cfg = sc.config
    rows = np.asarray(rows, np.int64)
    severity = (values[rows] - sc.model.mean[codes[rows]]).round().astype(np.int64)
    order = np.lexsort((-score[rows], -severity))
    rows, severity = rows[order], severity[order]
    k = cfg.window
    rstart, rend = calls.resource_start(), calls.resource_end()
    before, after = [], []
    for r in rows:
        before.append(calls.call_id[max(int(rstart[r]), r - k):r].tolist())
        after.append(calls.call_id[r + 1:min(int(rend[r]), r + 1 + k)].tolist())
    ex = _exemplars(calls, rows, codes, flagged, step)
    has_ex = ex >= 0
    parents = calls.parent[rows]
    prov = provenance(meta)
    run_id = (meta or {}).get("run_id")
    n = len(rows)
    cols = {
        "anomaly_id": np.arange(n, dtype=np.int64),
        "call_id": calls.call_id[rows],
        "resource_id": [calls.resources[i] for i in calls.resource[rows]],
        "function": [calls.functions[i] for i in calls.func[rows]],
        "kind": calls.table["kind"].take(pa.array(rows)),
        "task_key": calls.table["task_key"].take(pa.array(rows)),
        "start_ns": calls.start[rows],
        "end_ns": calls.end[rows],
        "inclusive_ns": calls.inclusive[rows],
        "exclusive_ns": calls.exclusive[rows],
        "metric": [cfg.metric] * n,
        "algo": [cfg.algo] * n,
        "score": score[rows],
        "threshold": sc.threshold[codes[rows]],
        "severity_ns": severity,
        "step": step[rows],
        "depth": calls.depth[rows],
        "parent_call_id": pa.array(np.where(parents >= 0, calls.call_id[np.maximum(parents, 0)], 0),
                                   mask=parents < 0, type=pa.int64()),
        "call_stack": [_stack(calls, int(r)) for r in rows],
        "children": calls.children[rows],
        "messages": _messages(calls, rows, transfers, resources),
        "window_before": pa.array(before, pa.list_(pa.int64())),
        "window_after": pa.array(after, pa.list_(pa.int64())),
        "exemplar_call_id": pa.array(np.where(has_ex, calls.call_id[np.maximum(ex, 0)], 0), mask=~has_ex,
                                     type=pa.int64()),
        "exemplar_ns": pa.array(np.where(has_ex, values[np.maximum(ex, 0)], 0).astype(np.int64), mask=~has_ex,
                                type=pa.int64()),
        "model": [json.dumps(sc.explain(int(codes[r]), float(values[r]))) for r in rows],
        "run_id": [run_id] * n,
        "provenance": [prov] * n,
    }
    arrays = [pa.array(cols[f.name], type=f.type) if not isinstance(cols[f.name], (pa.Array, pa.ChunkedArray))
              else cols[f.name] for f in ANOMALIES]
    arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    return pa.Table.from_arrays(arrays, schema=ANOMALIES), order
