"""The breakdown, per-group statistics and anomaly detection of a run too large for one process, computed by Dask.

The run's spans are read from its Parquet segments in parts of about ``rows_per_partition`` rows (each part given
the run's own semantic mappings, model/semantics.py), regrouped by resource with Dask's shuffle, and written as
parts that each hold whole resources. Each part then goes through the single-process analyses' own functions (the
state timeline, the call table, the anomaly detector), and the parts' results are merged exactly: slot-time and
counts add up, per-group moments and the anomaly model merge by Chan's pairwise update, the anomalies are ordered
and given their exemplars over the whole run. A worker holds one part at a time, so memory is bounded by the part
size (and by the largest resource: one resource's spans are never split), not by the run.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flowscope.analysis.anomalies.calls import calls_from_spans, dictionary_codes
from flowscope.analysis.anomalies.config import AnomalyConfig
from flowscope.analysis.anomalies.detect import detect, steps_of
from flowscope.analysis.anomalies.model import FunctionModel, scorer
from flowscope.analysis.breakdown import GROUPED_ROLES, Breakdown, breakdown_of
from flowscope.analysis.timeline import (
    IO_UNIT,
    MEASURED,
    resource_states,
    span_time_sources,
    utilisation_by_resource,
    utilisation_table,
    work_state_totals,
    work_unit_kind,
)
from flowscope.model.schemas import schema
from flowscope.model.semantics import IDLE, activity_sql, executors_sql
from flowscope.store.run import DamagedSegment, Run, open_run

if TYPE_CHECKING:
    from distributed import Client

#: rows of spans per part, when not told (docs/partitioned.md measures a smaller part with a worker memory limit)
ROWS_PER_PARTITION = 2_000_000

#: what a part carries to the per-resource analyses (``activity`` ``a`` joined to ``executors`` ``e``): every span
#: with its category, role and group, whether its resource executes work and its slots; a task span's ``attrs``
#: only where they say how its times were obtained (``time_source``), ``'{}'`` for the other task spans
PART_SQL = """
    SELECT a.span_id, a.parent_id, a.resource_id, a.kind, a.name, a.start_ns, a.end_ns, a.task_key, a.category,
           a.role, a."group", coalesce(e.executes, TRUE) AS executes, e.slots,
           CASE WHEN a.role = 'task' THEN coalesce(CASE WHEN contains(a.attrs, '"time_source"') THEN a.attrs END,
                                                   '{}') END AS time_attrs
    FROM activity a LEFT JOIN executors e ON e.resource_id = a.resource_id"""

_INT64 = {pa.int64(): pd.Int64Dtype()}
#: what a part's columns become in pandas while Dask moves it: exact integers, strings kept in Arrow
_PART_TYPES = {pa.int64(): pd.Int64Dtype(), pa.string(): pd.StringDtype("pyarrow")}


@dataclass
class PartitionedAnalysis:
    """What :func:`analyse` computed: equal to the single-process :func:`~flowscope.analysis.breakdown.breakdown`,
    :func:`~flowscope.analysis.breakdown.task_groups` and :func:`~flowscope.analysis.anomalies.detect.detect_run`
    of the same run."""

    run_id: str
    breakdown: Breakdown
    task_groups: pd.DataFrame
    anomalies: pa.Table
    model: FunctionModel
    rows: int                  # spans read
    partitions: int
    timings_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "rows": self.rows, "partitions": self.partitions,
                "timings_s": self.timings_s, "breakdown": self.breakdown.to_dict(),
                "task_groups": self.task_groups.to_dict("records"), "anomalies": self.anomalies.num_rows,
                "functions": len(self.model)}


# ---- reading a run in parts -------------------------------------------------------------------------------

def file_groups(files: Sequence[Path], rows_per_partition: int) -> tuple[list[list[str]], int]:
    """The segment ``files`` in groups of about ``rows_per_partition`` rows (from their footers, in order), and the
    rows they hold."""
    groups: list[list[str]] = []
    current: list[str] = []
    n = total = 0
    for f in files:
        try:
            rows = pq.ParquetFile(f).metadata.num_rows
        except (pa.ArrowInvalid, OSError) as exc:
            raise DamagedSegment(Path(f), str(exc)) from None
        if current and n + rows > rows_per_partition:
            groups.append(current)
            current, n = [], 0
        current.append(str(f))
        n += rows
        total += rows
    if current:
        groups.append(current)
    return groups, total


def read_part(files: Sequence[str], run_path: str, mappings: list[dict]) -> pd.DataFrame:
    """The rows of :data:`PART_SQL` over the spans of the segment ``files`` of the run at ``run_path``, given the
    run's semantic ``mappings``."""
    import duckdb

    target = schema("spans")
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f, schema=target))
        except (pa.ArrowInvalid, OSError) as exc:
            raise DamagedSegment(Path(f), str(exc)) from None
    spans = pa.concat_tables(tables) if tables else target.empty_table()
    resources = open_run(run_path).arrow("resources")
    con = duckdb.connect(":memory:")
    try:
        con.register("spans", spans)
        con.register("resources", resources)
        con.execute(f"CREATE VIEW activity AS {activity_sql(mappings)}")
        con.execute(f"CREATE VIEW executors AS {executors_sql(mappings)}")
        return con.sql(PART_SQL).to_arrow_table().to_pandas(types_mapper=_PART_TYPES.get)
    finally:
        con.close()


def _write_part(part: pd.DataFrame, path: str) -> int:
    pq.write_table(pa.Table.from_pandas(part, preserve_index=False), path)
    return len(part)


def _read_written(path: str, columns: Sequence[str] | None = None) -> pa.Table:
    return pq.read_table(path, columns=list(columns) if columns is not None else None)


#: the columns the detector reads of a part's spans
_CALL_COLUMNS = ["span_id", "parent_id", "resource_id", "kind", "name", "start_ns", "end_ns", "task_key", "role"]
#: the columns of the timeline's rows (TIMED_SPANS_SQL)
_WORK_COLUMNS = ["resource_id", "span_id", "parent_id", "start_ns", "end_ns", "category", "role", "group", "slots"]


# ---- per part: what the timeline, the groups and the model need ------------------------------------------

@dataclass
class PartSummary:
    """One part's contribution (whole resources): slot-time per (resource, slot, state) with the slot's extent,
    per-group moments, the time sources of its task spans, the model of its calls."""

    states: pd.DataFrame       # resource_id, slot, state, ns, rows, t0, t1
    slots: pd.DataFrame        # resource_id, slots
    groups: pd.DataFrame       # role, group, count, sum_ns, mean, m2, max_ns
    categories: pd.DataFrame   # role, group, category, n
    roles: set[str]
    time_sources: set[str] | None
    model: FunctionModel
    max_step: int
    calls: dict[str, int]      # calls per resource
    ids_complete: bool         # every call has a span id


def _codes(arr: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    values, codes = dictionary_codes(arr)
    return np.asarray(values, dtype=object), codes


def group_moments(role: pa.ChunkedArray, group: pa.ChunkedArray, category: pa.ChunkedArray, d: np.ndarray
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (role, group) of the spans with durations ``d`` (ns): count, exact sum, mean, M2 (sum of squared
    deviations from the mean) and max; and per (role, group, category) the count."""
    if not len(d):
        return (pd.DataFrame(columns=["role", "group", "count", "sum_ns", "mean", "m2", "max_ns"]),
                pd.DataFrame(columns=["role", "group", "category", "n"]))
    roles, rc = _codes(role)
    groups, gc = _codes(group)
    cats, cc = _codes(category)
    key = rc * len(groups) + gc
    keys, k = np.unique(key, return_inverse=True)
    count = np.bincount(k, minlength=len(keys))
    total = np.zeros(len(keys), np.int64)
    np.add.at(total, k, d)
    mean = total / np.maximum(count, 1)
    dev = d - mean[k]
    m2 = np.bincount(k, weights=dev * dev, minlength=len(keys))
    top = np.full(len(keys), np.iinfo(np.int64).min)
    np.maximum.at(top, k, d)
    moments = pd.DataFrame({"role": roles[keys // len(groups)], "group": groups[keys % len(groups)],
                            "count": count, "sum_ns": total, "mean": mean, "m2": m2, "max_ns": top})
    ck, n = np.unique(k * len(cats) + cc, return_counts=True)
    categories = pd.DataFrame({"role": moments["role"].to_numpy()[ck // len(cats)],
                               "group": moments["group"].to_numpy()[ck // len(cats)],
                               "category": cats[ck % len(cats)], "n": n})
    return moments, categories


def summarise_part(path: str, config: AnomalyConfig, run_start_ns: int | None) -> PartSummary:
    """:class:`PartSummary` of the part written at ``path``."""
    part = _read_written(path, [*dict.fromkeys([*_CALL_COLUMNS, *_WORK_COLUMNS, "executes", "time_attrs"])])
    d = pc.subtract(part["end_ns"], part["start_ns"]).to_numpy().astype(np.int64)
    busy = pc.fill_null(part["executes"], True).to_numpy(zero_copy_only=False) & (d > 0)
    work = part.select(_WORK_COLUMNS).filter(pa.array(busy))
    sums = work_state_totals(work)
    slots = (work.group_by("resource_id", use_threads=False).aggregate([("slots", "first")])
             .rename_columns(["resource_id", "slots"])
             .to_pandas(types_mapper=_INT64.get) if work.num_rows else pd.DataFrame(columns=["resource_id", "slots"]))
    groups, categories = group_moments(part["role"], part["group"], part["category"], d)
    tasks = part["time_attrs"].filter(pc.equal(part["role"], "task").fill_null(False))
    tagged = tasks.filter(pc.not_equal(tasks, "{}"))  # '{}': a task span that does not say (PART_SQL)
    time_attrs = pd.Series([*tagged.to_pylist(), *(["{}"] if len(tagged) < len(tasks) else [])], dtype=object)
    calls = calls_from_spans(part.select([c for c in _CALL_COLUMNS if c not in ("kind", "task_key")]), config.kinds)
    values = calls.metric(config.metric).astype(np.float64)
    model = FunctionModel.of(calls.functions, calls.func, values)
    step = steps_of(calls, config, run_start_ns)
    per_resource = np.bincount(calls.resource, minlength=len(calls.resources)) if len(calls) else []
    roles = {r for r in pc.unique(part["role"]).to_pylist() if r is not None}
    return PartSummary(sums, slots, groups, categories, roles,
                       span_time_sources(time_attrs) if len(time_attrs) else None, model,
                       int(step.max()) if len(step) else -1,
                       dict(zip(calls.resources, map(int, per_resource))), calls.table["span_id"].null_count == 0)


def judge_part(path: str, model: FunctionModel, config: AnomalyConfig, run_path: str, meta: dict,
               positions: dict[str, int] | None = None) -> tuple[pa.Table, pd.DataFrame]:
    """The anomalies among the calls of the part at ``path`` judged against the run's ``model``, and for each
    (function, step) of the part its first call judged normal (``step`` -1: of any step), the candidates for
    an anomaly's exemplar. ``positions``: where each resource's calls begin in the run's, when calls are
    numbered by position (spans without ids)."""
    part = _read_written(path, _CALL_COLUMNS)
    run = open_run(run_path)
    ids = sorted(r for r in pc.unique(part["resource_id"]).to_pylist() if r is not None)
    resources = run.arrow("resources")
    mine = set(ids)
    parents = [p for r, p in zip(resources["resource_id"].to_pylist(), resources["parent_id"].to_pylist())
               if r in mine and p is not None]
    near = sorted(set(ids) | set(parents))
    transfers = run.sql_arrow("SELECT * FROM transfers WHERE list_contains(?::VARCHAR[], src_resource_id) "
                              "OR list_contains(?::VARCHAR[], dst_resource_id)", [near, near]) if near else None
    det = detect(part, config, transfers=transfers, resources=resources, meta=meta, model=model,
                 judge=scorer(model, config), positions=positions)
    calls = det.calls
    normal = np.flatnonzero(~det.flagged)
    func, step = calls.func[normal].astype(np.int64), det.step[normal].astype(np.int64)
    width = int(step.max()) + 2 if len(step) else 1
    _, same = np.unique(func * width + step, return_index=True)   # the first row of each (function, step)
    _, any_ = np.unique(func, return_index=True)                  # of each function
    rows = normal[np.concatenate([same, any_])]
    first = pd.DataFrame({"function": np.asarray(calls.functions, dtype=object)[calls.func[rows]],
                          "step": np.concatenate([step[same], np.full(len(any_), -1, np.int64)]),
                          "resource_id": np.asarray(calls.resources, dtype=object)[calls.resource[rows]],
                          "call_id": calls.call_id[rows], "value": det.values[rows]})
    return det.anomalies, first


# ---- merging the parts ------------------------------------------------------------------------------------

def merge_groups(groups: pd.DataFrame, categories: pd.DataFrame, roles: set[str]) -> pd.DataFrame:
    """:func:`~flowscope.analysis.breakdown.task_groups` from the parts' per-group moments."""
    role = next((r for r in GROUPED_ROLES if r in roles), "task")
    g = groups[groups["role"] == role]
    key = ["role", "group"]
    n = g.groupby(key, dropna=False, sort=False)["count"].transform("sum").to_numpy(np.float64)
    total = g.groupby(key, dropna=False, sort=False)["sum_ns"].transform("sum").to_numpy(np.float64)
    mean = total / n
    spread = g["m2"].to_numpy(np.float64) + g["count"].to_numpy(np.float64) * (g["mean"].to_numpy() - mean) ** 2
    merged = (g.assign(spread=spread).groupby(key, dropna=False, sort=False)
              .agg(count=("count", "sum"), sum_ns=("sum_ns", "sum"), m2=("spread", "sum"), max_ns=("max_ns", "max"))
              .reset_index())
    cats = categories[categories["role"] == role].groupby([*key, "category"], dropna=False, sort=False)["n"].sum()
    cats = cats.reset_index().sort_values(["n", "category"], ascending=[False, True], kind="stable")
    mode = cats.drop_duplicates(key).set_index(key)["category"]
    count = merged["count"].astype("int64")
    out = pd.DataFrame({
        "group": merged["group"], "role": merged["role"],
        "category": [mode.get((r, gr)) for r, gr in zip(merged["role"], merged["group"])],
        "count": count, "total_s": merged["sum_ns"].astype("int64") / 1e9,
        "mean_s": merged["sum_ns"].astype("int64") / count / 1e9,
        "std_s": np.where(count > 1, np.sqrt(merged["m2"] / np.maximum(count - 1, 1)), 0.0) / 1e9,
        "max_s": merged["max_ns"].astype("int64") / 1e9})
    out = out.sort_values(["total_s", "group"], ascending=[False, True], kind="stable").reset_index(drop=True)
    out["cv"] = (out["std_s"] / out["mean_s"]).where(out["mean_s"] > 0, 0.0)
    return out


def merge_states(states: pd.DataFrame) -> tuple[pd.DataFrame, int, int, int]:
    """Slot-time per resource (index) and state (columns), counting the idle time of each slot before its first
    and after its last span up to the run's extent; that extent (t0, t1) and the number of ``io`` state rows."""
    lanes = states.drop_duplicates(["resource_id", "slot"])
    t0, t1 = int(lanes["t0"].min()), int(lanes["t1"].max())
    by = states.pivot_table(index="resource_id", columns="state", values="ns", aggfunc="sum", fill_value=0)
    edge = ((lanes["t0"] - t0) + (t1 - lanes["t1"])).groupby(lanes["resource_id"]).sum()
    by[IDLE] = (by[IDLE] if IDLE in by.columns else 0) + edge.reindex(by.index, fill_value=0)
    io_rows = int(states.loc[states["state"] == "io", "rows"].sum())
    return by, t0, t1, io_rows


def _order_anomalies(table: pa.Table, model: FunctionModel, max_step: int,
                     candidates: pd.DataFrame) -> pa.Table:
    """The parts' anomalies as one table: most severe first (ties in the calls' order: resource, start, end
    latest first, function), numbered, each with the run's exemplar (the first normal call of its function in
    its step, else in any step) from ``candidates``, one per (function, step) (:func:`merge_candidates`)."""
    if not table.num_rows:
        return table
    res = pd.factorize(np.asarray(table["resource_id"].to_pylist(), dtype=object), sort=True)[0]
    fn = pd.factorize(np.asarray(table["function"].to_pylist(), dtype=object), sort=True)[0]
    order = np.lexsort((fn, -table["end_ns"].to_numpy(), table["start_ns"].to_numpy(), res,
                        -table["score"].to_numpy(), -table["severity_ns"].to_numpy()))
    table = table.take(pa.array(order))
    first = {(f, int(s)): (int(c), v) for f, s, c, v in zip(candidates["function"], candidates["step"],
                                                             candidates["call_id"], candidates["value"])}
    same_step = len(model) * (max_step + 1) <= 50_000_000  # as detect's exemplars
    ex_id, ex_ns = [], []
    for f, s in zip(table["function"].to_pylist(), table["step"].to_pylist()):
        hit = (first.get((f, int(s))) if same_step else None) or first.get((f, -1))
        ex_id.append(hit[0] if hit else None)
        ex_ns.append(int(hit[1]) if hit else None)
    cols = {"anomaly_id": pa.array(np.arange(table.num_rows, dtype=np.int64)),
            "exemplar_call_id": pa.array(ex_id, pa.int64()), "exemplar_ns": pa.array(ex_ns, pa.int64())}
    for name, arr in cols.items():
        table = table.set_column(table.schema.get_field_index(name), table.schema.field(name), arr)
    return table


def merge_candidates(*frames: pd.DataFrame) -> pd.DataFrame:
    """The parts' exemplar candidates (:func:`judge_part`) as one: per (function, step), the run's first, which is
    the candidate of the first resource (the parts hold disjoint resources, and the calls are in resource order)."""
    return (_concat(list(frames)).sort_values("resource_id", kind="stable")
            .drop_duplicates(["function", "step"]).reset_index(drop=True))


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The parts' frames as one; the empty ones (parts without such rows) only give their columns."""
    full = [f for f in frames if len(f)]
    return pd.concat(full, ignore_index=True) if full else frames[0].iloc[:0]


def _merge_models(models: list[FunctionModel]) -> FunctionModel:
    out = FunctionModel()
    for m in models:
        out.merge_in(m)
    return out


# ---- the whole -------------------------------------------------------------------------------------------

Progress = Callable[[str, int, int], None]


def _run_stage(client: Client, name: str, tasks: list, progress: Progress | None) -> list:
    from distributed import as_completed

    futures = client.compute(tasks)
    index = {f.key: i for i, f in enumerate(futures)}
    out: list[Any] = [None] * len(futures)
    done = 0
    if progress:
        progress(name, 0, len(futures))
    for fut in as_completed(futures):
        out[index[fut.key]] = fut.result()
        done += 1
        if progress:
            progress(name, done, len(futures))
    return out


def analyse(run: Run | str | Path, client: Client, *, config: AnomalyConfig | None = None,
            rows_per_partition: int = ROWS_PER_PARTITION, scratch: str | Path | None = None,
            progress: Progress | None = None) -> PartitionedAnalysis:
    """The breakdown, per-group statistics and anomalies of ``run`` computed on the Dask cluster of ``client``.

    ``scratch``: a folder every worker can write and read, for the run regrouped by resource (about the size of
    its spans; removed afterwards); default: a new folder beside the run (its store, which the workers read
    already). ``progress(stage, done, total)`` is called as the parts of each stage finish."""
    import time

    import dask
    import dask.dataframe as dd

    run = run if isinstance(run, Run) else open_run(run)
    config = config or AnomalyConfig()
    meta = run.meta
    timings: dict[str, float] = {}
    rows_per_partition = max(1, int(rows_per_partition))
    groups_of_files, rows = file_groups(run.segments("spans"), rows_per_partition)
    parts = max(1, len(groups_of_files), -(-rows // rows_per_partition))
    mappings = run.mappings()
    made = Path(tempfile.mkdtemp(prefix=".flowscope-partitioned-", dir=scratch or run.path.parent))
    try:
        t = time.perf_counter()
        meta_frame = read_part([], str(run.path), mappings)
        frame = dd.from_map(read_part, groups_of_files or [[]], run_path=str(run.path), mappings=mappings,
                            meta=meta_frame, enforce_metadata=False)
        regrouped = frame.shuffle("resource_id", npartitions=parts)
        paths = [str(made / f"part-{i:06d}.parquet") for i in range(parts)]
        write = [dask.delayed(_write_part)(p, path) for p, path in zip(regrouped.to_delayed(), paths)]
        _run_stage(client, "regroup by resource", write, progress)
        timings["regroup_s"] = time.perf_counter() - t

        t = time.perf_counter()
        summaries: list[PartSummary] = _run_stage(
            client, "timeline, groups and model",
            [dask.delayed(summarise_part)(p, config, meta.get("start_ns")) for p in paths], progress)
        model = _merge_models([s.model for s in summaries])
        timings["summarise_s"] = time.perf_counter() - t

        t = time.perf_counter()
        kind = work_unit_kind(run)
        if kind == IO_UNIT:  # the timeline is the run's timed I/O operations: read in one process
            states = resource_states(run)
            util = utilisation_by_resource(run, states)
            window_ns = int(states["end_ns"].max() - states["start_ns"].min()) if len(states) else 0
            io_rows = int((states["state"] == "io").sum()) if len(states) else 0
        else:
            util, window_ns, io_rows = _utilisation(summaries, meta)
        b = breakdown_of(run, util, window_ns, io_rows)
        roles = set().union(*(s.roles for s in summaries)) if summaries else set()
        groups = merge_groups(_concat([s.groups for s in summaries]), _concat([s.categories for s in summaries]),
                              roles)
        timings["merge_s"] = time.perf_counter() - t

        t = time.perf_counter()
        positions = None
        if not all(s.ids_complete for s in summaries if s.calls):  # calls numbered by their row in the run's
            per = dict(sorted((r, n) for s in summaries for r, n in s.calls.items()))
            positions = dict(zip(per, np.cumsum([0, *per.values()])[:-1].tolist()))
        shared = client.scatter(model, broadcast=True)  # once to each worker, not in every task
        judged = [dask.delayed(judge_part, nout=2)(p, shared, config, str(run.path), meta, positions) for p in paths]
        found = [a for a, _ in judged]
        # each part's exemplar candidates (functions x steps rows) merged on the cluster, not in this process
        candidates = [c for _, c in judged]
        while len(candidates) > 1:
            candidates = [dask.delayed(merge_candidates)(*candidates[i:i + 8]) for i in range(0, len(candidates), 8)]
        *found, first = _run_stage(client, "anomalies", [*found, candidates[0]], progress)
        max_step = max((s.max_step for s in summaries), default=-1)
        anomalies = _order_anomalies(pa.concat_tables(found), model, max_step, first)
        timings["anomalies_s"] = time.perf_counter() - t
    finally:
        shutil.rmtree(made, ignore_errors=True)
    return PartitionedAnalysis(meta["run_id"], b, groups, anomalies, model, rows, parts, timings)


def _utilisation(summaries: list[PartSummary], meta: dict) -> tuple[pd.DataFrame, int, int]:
    states = _concat([s.states for s in summaries])
    if not len(states):
        return utilisation_table(pd.DataFrame(), pd.Series(dtype=object), 0), 0, 0
    by, t0, t1, io_rows = merge_states(states)
    slots = _concat([s.slots for s in summaries]).set_index("resource_id")["slots"]
    sources = set().union(*(s.time_sources for s in summaries if s.time_sources is not None))
    window: int | None = t1 - t0
    if sources - {MEASURED}:  # some task's times were derived: capacity over the run's duration, as the timeline
        start, end = meta.get("start_ns"), meta.get("end_ns")
        window = end - start if start is not None and end is not None else None
    return utilisation_table(by, slots, t1 - t0 if window is None else window), t1 - t0, io_rows

