"""Reduced runs: keep only the anomalies, the calls in their windows, one normal exemplar per
anomalous function and step, and the per-function model; measure the reduction factor.

A reduced run directory holds:

* ``anomalies/`` -- the anomalies table (canonical ``anomalies`` schema), one row per anomaly, its
  ``window_before``/``window_after`` left empty: ``reduced_anomalies`` rebuilds them from the kept calls;
* ``anomaly_calls.parquet`` -- every kept call (anomalies, their window neighbours, exemplars) as a
  compact row: resource, position on the resource, call id, function, kind, task key, depth, children, gap to the
  previous kept call's exit (or the entry when the previous call on the resource was not kept), inclusive
  time and child time (inclusive - exclusive). ``window_calls`` expands it back into spans rows.
* ``anomaly_model.parquet`` -- the per-function model (count, mean, M2, min, max, sparse grid histogram)
  stored once, the detector configuration in the file's metadata; ``load_model`` reads it back.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flowscope.analysis.anomalies.config import AnomalyConfig
from flowscope.analysis.anomalies.detect import Detection, _exemplars, detect_run
from flowscope.analysis.anomalies.model import FINE_BINS, FunctionModel
from flowscope.model.schemas import dictionary_columns, schema
from flowscope.store.layout import RUN_JSON, segment_path, write_json_atomic

MODEL_FILE = "anomaly_model.parquet"
CALLS_FILE = "anomaly_calls.parquet"

CALLS_SCHEMA = pa.schema([
    pa.field("resource_id", pa.string(), False),
    pa.field("pos", pa.int64(), False),          # the call's ordinal among its resource's calls (entry order)
    pa.field("call_offset", pa.int64(), False),  # call_id - pos (constant per resource when ids are positions)
    pa.field("function", pa.string(), False),
    pa.field("kind", pa.string(), False),
    pa.field("task_key", pa.string()),
    pa.field("depth", pa.int64(), False),
    pa.field("children", pa.int64(), False),
    pa.field("start_ns", pa.int64()),            # set when the previous kept call on the resource is not pos - 1
    pa.field("gap_ns", pa.int64()),              # else: entry - previous call's exit
    pa.field("residual_ns", pa.int64(), False),  # scored time (config.metric) - its function's model mean, rounded
    pa.field("child_ns", pa.int64(), False),     # inclusive - exclusive
    pa.field("attrs", pa.string()),              # spans.attrs
])

MODEL_SCHEMA = pa.schema([
    pa.field("function", pa.string(), False), pa.field("count", pa.int64(), False),
    pa.field("mean", pa.float64(), False), pa.field("m2", pa.float64(), False),
    pa.field("min", pa.float64()), pa.field("max", pa.float64()),
    pa.field("bins", pa.list_(pa.int32()), False), pa.field("counts", pa.list_(pa.int64()), False),
])


def parquet_bytes(table: pa.Table) -> int:
    """Bytes of ``table`` written as the store writes segments (Parquet, zstd, a dictionary on the strings
    that repeat)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", use_dictionary=dictionary_columns(table.schema),
                   write_statistics=True)
    return sink.getvalue().size


def _write_compact(table: pa.Table, path: Path, delta: tuple[str, ...] = (), split: tuple[str, ...] = (),
                   metadata: dict | None = None) -> int:
    """Write ``table`` with zstd at a high level: strings dictionary-encoded, ``delta`` columns (near-sorted
    integers) delta-encoded, ``split`` columns (small numbers of either sign) byte-stream-split, the rest
    plain; returns the file size."""
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               **{k.encode(): v.encode() for k, v in metadata.items()}})
    strings = [f.name for f in table.schema
               if pa.types.is_string(f.type) or (pa.types.is_list(f.type) and pa.types.is_string(f.type.value_type))]
    enc = {c: "DELTA_BINARY_PACKED" for c in delta} | {c: "BYTE_STREAM_SPLIT" for c in split}
    enc |= {f.name: "PLAIN" for f in table.schema if f.name not in enc and f.name not in strings}
    pq.write_table(table, path, compression="zstd", compression_level=19, use_dictionary=strings,
                   column_encoding=enc, write_statistics=False)
    return path.stat().st_size


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


def _model_mean(model: FunctionModel, functions: pa.Array | pa.ChunkedArray, where: str) -> np.ndarray:
    idx = [model.index.get(f) for f in functions.to_pylist()]
    if None in idx:
        raise ValueError(f"{where}: function {functions[idx.index(None)].as_py()!r} is not in the model")
    return np.round(model.mean[np.asarray(idx, np.int64)]).astype(np.int64) if idx else np.zeros(0, np.int64)


def compact_calls(det: Detection, rows: np.ndarray) -> pa.Table:
    """The kept ``rows`` of ``det.calls`` (sorted) as ``CALLS_SCHEMA`` rows; times are stored as residuals
    from the function's model mean, which makes them small numbers that compress well."""
    c = det.calls
    rows = np.asarray(rows, np.int64)
    pos = rows - c.resource_start()[rows]
    start, end = c.start[rows], c.end[rows]
    chained = np.r_[False, (c.resource[rows[1:]] == c.resource[rows[:-1]]) & (pos[1:] == pos[:-1] + 1)]
    gap = start - np.r_[0, end[:-1]]
    take = pa.array(rows, pa.int64())
    function = pa.array(c.functions, pa.string()).take(pa.array(c.func[rows]))
    metric = c.metric(det.config.metric)[rows]
    return pa.table({
        "resource_id": pa.array(c.resources, pa.string()).take(pa.array(c.resource[rows])),
        "pos": pos, "call_offset": c.call_id[rows] - pos, "function": function,
        "kind": c.table["kind"].take(take), "task_key": c.table["task_key"].take(take),
        "depth": c.depth[rows], "children": c.children[rows],
        "start_ns": pa.array(start, pa.int64(), mask=chained),
        "gap_ns": pa.array(gap, pa.int64(), mask=~chained),
        "residual_ns": metric - _model_mean(det.model, function, "compact_calls"),
        "child_ns": c.inclusive[rows] - c.exclusive[rows], "attrs": c.table["attrs"].take(take),
    }, schema=CALLS_SCHEMA)


def expand_calls(calls: pa.Table, config: AnomalyConfig, model: FunctionModel) -> pa.Table:
    """Entry, exit, inclusive and exclusive time of compact call rows judged with ``config`` and ``model``:
    ``calls`` plus ``start_ns`` (filled), ``end_ns``, ``inclusive_ns`` and ``exclusive_ns``."""
    n = calls.num_rows
    metric = calls["residual_ns"].to_numpy().astype(np.int64) + _model_mean(model, calls["function"], CALLS_FILE)
    child = calls["child_ns"].to_numpy().astype(np.int64)
    incl = metric + child if config.metric == "exclusive" else metric
    has_start = ~pc.is_null(calls["start_ns"]).to_numpy(zero_copy_only=False)
    if n and not has_start[0]:
        raise ValueError(f"{CALLS_FILE}: row 0 has neither start_ns nor a previous call")
    step = np.where(has_start, calls["start_ns"].fill_null(0).to_numpy(),
                    calls["gap_ns"].fill_null(0).to_numpy() + np.r_[0, incl[:-1]]).astype(np.int64)
    # start_i = start of the chain's head + sum of (previous inclusive + gap) since: a cumulative sum reset at heads
    csum = np.cumsum(np.where(has_start, 0, step))
    head = np.maximum.accumulate(np.where(has_start, np.arange(n), 0)) if n else np.zeros(0, np.int64)
    start = step[head] + csum - csum[head]
    t = calls.set_column(calls.schema.get_field_index("start_ns"), "start_ns", pa.array(start, pa.int64()))
    t = t.append_column("call_id", pc.add(t["pos"], t["call_offset"]))
    return (t.append_column("end_ns", pa.array(start + incl, pa.int64()))
            .append_column("inclusive_ns", pa.array(incl, pa.int64()))
            .append_column("exclusive_ns", pa.array(incl - child, pa.int64())))


def window_calls(reduced_dir: str | Path) -> pa.Table:
    """The kept calls of a reduced run (anomalies, window neighbours, exemplars), expanded: ``CALLS_SCHEMA``
    columns plus ``end_ns``, ``inclusive_ns`` and ``exclusive_ns``, in (resource, position) order."""
    path = Path(reduced_dir) / CALLS_FILE
    try:
        t = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ValueError(f"{path}: not a readable reduced-run calls file: {exc}") from None
    missing = [f.name for f in CALLS_SCHEMA if f.name not in t.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    config, model = load_model(reduced_dir)
    return expand_calls(t.select(CALLS_SCHEMA.names), config, model)


def reduced_anomalies(reduced_dir: str | Path) -> pa.Table:
    """The anomalies table of a reduced run, most severe first, with ``window_before`` and ``window_after``
    rebuilt from the kept calls (the calls within ``window`` positions of the anomaly on its resource)."""
    reduced_dir = Path(reduced_dir)
    files = sorted((reduced_dir / "anomalies").glob("*.parquet"))
    if not files:
        raise ValueError(f"{reduced_dir}: no anomalies/ table (not a reduced run?)")
    a = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("anomaly_id")
    config, _ = load_model(reduced_dir)
    calls = window_calls(reduced_dir)
    res = calls["resource_id"].to_pylist()
    pos = calls["pos"].to_numpy()
    cid = calls["call_id"].to_numpy()
    where = {c: i for i, c in enumerate(cid.tolist())}
    k = config.window
    before, after = [], []
    for c, r in zip(a["call_id"].to_pylist(), a["resource_id"].to_pylist()):
        i = where.get(c)
        if i is None or res[i] != r:
            raise ValueError(f"{reduced_dir / CALLS_FILE}: anomaly call_id {c} on {r!r} is not among the kept calls")
        lo, hi = i, i
        while lo > 0 and res[lo - 1] == r and pos[lo - 1] >= pos[i] - k:
            lo -= 1
        while hi + 1 < len(cid) and res[hi + 1] == r and pos[hi + 1] <= pos[i] + k:
            hi += 1
        before.append(cid[lo:i].tolist())
        after.append(cid[i + 1:hi + 1].tolist())
    for col, vals in (("window_before", before), ("window_after", after)):
        i = a.schema.get_field_index(col)
        a = a.set_column(i, a.schema.field(i), pa.array(vals, pa.list_(pa.int64())))
    return a


def model_table(model: FunctionModel) -> pa.Table:
    """The per-function model as one row per function (histograms as sparse bin/count lists)."""
    nz = [np.flatnonzero(h) for h in model.hist]
    fin = lambda a: pa.array(a, pa.float64(), mask=~np.isfinite(a))  # noqa: E731
    return pa.table({"function": model.names, "count": model.count, "mean": model.mean, "m2": model.m2,
                     "min": fin(model.min), "max": fin(model.max),
                     "bins": pa.array([b.astype(np.int32) for b in nz], pa.list_(pa.int32())),
                     "counts": pa.array([model.hist[i, b] for i, b in enumerate(nz)], pa.list_(pa.int64()))},
                    schema=MODEL_SCHEMA)


def load_model(reduced_dir: str | Path) -> tuple[AnomalyConfig, FunctionModel]:
    """The detector configuration and per-function model a reduced run was judged with."""
    path = Path(reduced_dir) / MODEL_FILE
    try:
        t = pq.read_table(path)
        meta = json.loads((t.schema.metadata or {})[b"flowscope.anomaly_config"])
    except (OSError, pa.ArrowInvalid, KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable anomaly model: {exc!r}") from None
    meta["kinds"] = tuple(meta.get("kinds", ()))
    config = AnomalyConfig(**meta)
    m = FunctionModel()
    m.codes(t["function"].to_pylist())
    m.count = t["count"].to_numpy().astype(np.int64)
    m.mean, m.m2 = t["mean"].to_numpy().astype(float), t["m2"].to_numpy().astype(float)
    m.min = t["min"].fill_null(np.inf).to_numpy().astype(float)
    m.max = t["max"].fill_null(-np.inf).to_numpy().astype(float)
    for i, (b, c) in enumerate(zip(t["bins"].to_pylist(), t["counts"].to_pylist())):
        if b and (min(b) < 0 or max(b) >= FINE_BINS):
            raise ValueError(f"{path}: function {i} ({m.names[i]!r}): bin out of range 0..{FINE_BINS - 1}")
        m.hist[i, b] = c
    return config, m


def write_reduced(det: Detection, out: str | Path, *, full_spans: pa.Table, meta: dict | None = None) -> dict:
    """Write the reduced run of ``det`` to directory ``out``; returns sizes and the reduction factor:
    the Parquet bytes of ``full_spans`` in completion (exit) order, written as the store writes a segment,
    over the bytes of every file of the reduced run except run.json."""
    out = Path(out)
    if (out / RUN_JSON).exists():
        raise FileExistsError(f"{out}: a run is already there")
    out.mkdir(parents=True, exist_ok=True)
    rows = kept_rows(det)
    _write_compact(compact_calls(det, rows), out / CALLS_FILE, delta=("pos", "call_offset", "depth", "children"),
                   split=("residual_ns",))
    # stored in (resource, entry) order, where entries, call ids and windows are near-sorted (anomaly_id keeps the
    # severity rank)
    by_place = det.anomalies.sort_by([("resource_id", "ascending"), ("start_ns", "ascending")])
    for col in ("window_before", "window_after"):  # rebuilt from the calls' positions by ``reduced_anomalies``
        i = by_place.schema.get_field_index(col)
        by_place = by_place.set_column(i, by_place.schema.field(i), pa.nulls(by_place.num_rows, by_place.schema.field(i).type))
    (out / "anomalies").mkdir(exist_ok=True)
    _write_compact(by_place, segment_path(out, "anomalies", "reduced"),
                   delta=("call_id", "start_ns", "end_ns", "exemplar_call_id"),
                   split=("inclusive_ns", "exclusive_ns", "severity_ns", "exemplar_ns", "score"))
    _write_compact(model_table(det.model), out / MODEL_FILE, delta=("bins",),
                   metadata={"flowscope.anomaly_config": json.dumps(det.config.as_dict())})
    full = parquet_bytes(full_spans.sort_by([("end_ns", "ascending")]))
    files = {str(f.relative_to(out)): f.stat().st_size for f in sorted(out.rglob("*")) if f.is_file()}
    kept = sum(files.values())
    info = {"full_spans_rows": full_spans.num_rows, "full_spans_bytes": full, "kept_calls_rows": int(len(rows)),
            "anomalies": det.anomalies.num_rows, "kept_bytes": kept, "kept_files": files,
            "reduction_factor": full / kept if kept else float("inf"),
            "row_factor": full_spans.num_rows / len(rows) if len(rows) else float("inf")}
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


__all__ = ["CALLS_FILE", "CALLS_SCHEMA", "MODEL_FILE", "compact_calls", "expand_calls", "kept_rows", "load_model",
           "model_table", "parquet_bytes", "reduce_run", "reduced_anomalies", "window_calls", "write_reduced"]
