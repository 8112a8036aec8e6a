"""The canonical model and the run store, without a collector."""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flowscope
from flowscope.model.conform import SchemaError, conform, records_to_table
from flowscope.model.provenance import check_run_id, new_run_id
from flowscope.model.schemas import TABLES
from flowscope.service.collector import Collector
from flowscope.store.catalog import list_runs, resolve_run
from flowscope.store.layout import temp_path, write_segment
from flowscope.store.run import RunNotFound
from flowscope.store.writers import WriterId


def test_every_table_has_int64_ns_timestamps_and_documented_columns():
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "data-model.md")).read()
    for name, schema in TABLES.items():
        assert f"`{name}`" in doc, f"docs/data-model.md does not document table {name}"
        for field in schema:
            if field.name.endswith("_ns"):
                assert field.type == pa.int64(), f"{name}.{field.name}"
            assert f"`{field.name}`" in doc, f"docs/data-model.md does not document {name}.{field.name}"


def test_conform_casts_compatible_types_and_fills_optional_columns():
    t = pa.table({"resource_id": ["r"], "kind": pa.array(["call"]).dictionary_encode(), "name": ["f"],
                  "start_ns": pa.array([1], pa.int32()),
                  "end_ns": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)], pa.timestamp("us", "UTC"))})
    out = conform("spans", t)
    assert out.schema == TABLES["spans"]
    assert out.column("end_ns")[0].as_py() == 1767225600 * 10**9
    assert out.column("task_key").null_count == 1


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.append_column("extra", pa.array([1])), "spans.extra: unknown column(s) 'extra'"),
    (lambda t: t.drop_columns(["start_ns"]), "spans.start_ns: is required but missing"),
    (lambda t: t.set_column(3, "start_ns", pa.array(["soon"])), "spans.start_ns: has type string, expected int64"),
    (lambda t: t.set_column(3, "start_ns", pa.array([1.5])), "spans.start_ns: has type double, expected int64"),
    (lambda t: t.set_column(0, "resource_id", pa.array([None], pa.string())), "spans.resource_id: is required but row 0"),
])
def test_conform_names_table_column_and_problem(mutate, message):
    t = pa.table({"resource_id": ["r"], "kind": ["call"], "name": ["f"], "start_ns": [1], "end_ns": [2]})
    with pytest.raises(SchemaError) as err:
        conform("spans", mutate(t))
    assert message in str(err.value)


def test_records_to_table_points_at_the_record():
    with pytest.raises(SchemaError, match=r"metrics.value: record 1: expected a number, got str 'x'"):
        records_to_table("metrics", [{"ts_ns": 1, "resource_id": "r", "namespace": "n", "name": "a", "value": 1.0},
                                     {"ts_ns": 2, "resource_id": "r", "namespace": "n", "name": "a", "value": "x"}])
    with pytest.raises(SchemaError, match="record 0 is a list"):
        records_to_table("logs", [[1, 2]])


def test_run_ids_are_sortable_and_safe():
    a, b = new_run_id(1.0), new_run_id(2.0)
    assert a < b and check_run_id(a) == a
    for bad in ("", "..", "a/b", "../x", "x" * 200):
        with pytest.raises(ValueError):
            check_run_id(bad)


@pytest.fixture
def run_dir(tmp_path):
    c = Collector(tmp_path / "store")
    meta = c.open_run({"name": "unit", "command": "pytest"})
    c.shutdown()
    return tmp_path / "store" / meta["run_id"]


def test_run_json_carries_provenance(run_dir):
    meta = flowscope.open_run(run_dir).meta
    prov = meta["provenance"]
    for key in ("hostname", "cpu_model", "cpu_logical", "memory_bytes", "gpus", "python", "packages", "environment"):
        assert key in prov
    assert prov["packages"]["pyarrow"] == pa.__version__
    assert prov["memory_bytes"] > 0 and meta["status"] == "running" and meta["command"] == "pytest"


def test_segments_are_atomic_and_named_by_batch(run_dir):
    spans = conform("spans", pa.table({"resource_id": ["r"] * 3, "kind": ["call"] * 3, "name": ["a", "b", "c"],
                                       "start_ns": [1, 2, 3], "end_ns": [5, 6, 7]}))
    assert write_segment(run_dir, "spans", "batch-1", spans) is True
    assert write_segment(run_dir, "spans", "batch-1", spans) is False  # a replay is a no-op
    # what a writer killed mid-write leaves behind: a partial temp file naming it (a process that is gone:
    # this pid, started a minute before this process)
    me = WriterId.current()
    dead = temp_path(run_dir / "spans" / "batch-2.parquet", WriterId(me.host, me.pid, me.started_ms - 60_000))
    dead.write_bytes(b"PAR1\x00\x00partial")
    run = flowscope.open_run(run_dir)
    assert run.counts()["spans"] == 3
    assert run.table("spans")["name"].tolist() == ["a", "b", "c"]
    assert int(run.sql("SELECT sum(end_ns - start_ns) AS d FROM spans")["d"][0]) == 12
    # anyone can read it without flowscope
    assert pq.read_table(run_dir / "spans" / "batch-1.parquet").num_rows == 3
    c = Collector(run_dir.parent)  # a collector starting cleans up temp files of a crashed writer
    assert c.temps_swept.wait(60) and c.removed_temps == 1
    c.shutdown()
    assert not list(run_dir.glob("*/.*.tmp"))


def test_segments_dictionary_encode_only_the_strings_that_repeat(run_dir):
    n = 1000
    trans = conform("transitions", pa.table({
        "ts_ns": list(range(n)), "task_key": [f"('add-{i}', {i})" for i in range(n)],
        "prefix": ["add"] * n, "from_state": ["ready"] * n, "to_state": ["executing"] * n,
        "observer": ["worker:a"] * n, "stimulus_id": [f"compute-task-{i}" for i in range(n)]}))
    write_segment(run_dir, "transitions", "batch-1", trans)
    meta = pq.ParquetFile(run_dir / "transitions" / "batch-1.parquet").metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}
    dictionary = {name for name, e in encodings.items() if "RLE_DICTIONARY" in e or "PLAIN_DICTIONARY" in e}
    assert {"prefix", "from_state", "to_state", "observer"} <= dictionary
    assert not dictionary & {"ts_ns", "task_key", "stimulus_id", "attrs"}
    assert flowscope.open_run(run_dir).table("transitions")["task_key"].tolist() == trans["task_key"].to_pylist()


def test_empty_tables_are_typed_views(run_dir):
    run = flowscope.open_run(run_dir)
    df = run.sql("SELECT count(*) AS n, sum(spans.end_ns - spans.start_ns) AS d FROM spans JOIN resources USING (resource_id)")
    assert int(df["n"][0]) == 0
    assert run.arrow("transfers").schema == TABLES["transfers"]
    assert list(run.table("metrics").columns) == TABLES["metrics"].names


def test_resources_declared_twice_merge(run_dir):
    first = conform("resources", pa.table({"resource_id": ["w1"], "kind": ["worker"], "name": ["w1"],
                                           "start_ns": [10]}))
    ended = conform("resources", pa.table({"resource_id": ["w1"], "kind": ["worker"], "end_ns": [99],
                                           "address": ["tcp://x:1"]}))
    write_segment(run_dir, "resources", "a", first)
    write_segment(run_dir, "resources", "b", ended)
    res = flowscope.open_run(run_dir).table("resources")
    assert len(res) == 1
    assert res.iloc[0][["start_ns", "end_ns", "address", "name"]].tolist() == [10, 99, "tcp://x:1", "w1"]


def test_catalog_lists_and_resolves_runs(tmp_path, run_dir):
    store = run_dir.parent
    runs = list_runs(store)
    assert [r["run_id"] for r in runs] == [run_dir.name]
    assert resolve_run("latest", store) == run_dir
    assert resolve_run(run_dir.name, store) == run_dir
    assert resolve_run(str(run_dir)) == run_dir
    (store / "broken").mkdir()
    (store / "broken" / "run.json").write_text("{not json")
    broken = [r for r in list_runs(store) if r["run_id"] == "broken"]
    assert len(broken) == 1 and "broken/run.json" in broken[0]["error"]
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        resolve_run("missing", store)
    with pytest.raises(RunNotFound):
        flowscope.open_run(tmp_path)


def test_nanosecond_timestamps_stay_exact_in_pandas(run_dir):
    t = 1_763_700_000_123_456_789  # beyond float64's 2**53: a float would round it
    io = conform("io", pa.table({"source": ["x", "x"], "op": ["read", "open"], "start_ns": [t, t + 1],
                                 "end_ns": pa.array([t + 7, None], pa.int64())}))
    write_segment(run_dir, "io", "one", io)
    run = flowscope.open_run(run_dir)
    df = run.table("io")
    assert df["end_ns"].iloc[0] == t + 7 and df["end_ns"].isna().iloc[1]
    assert run.sql("SELECT end_ns FROM io ORDER BY start_ns")["end_ns"].iloc[0] == t + 7


def test_a_damaged_segment_is_named_by_every_reader(run_dir):
    from flowscope.store.run import DamagedSegment

    spans = conform("spans", pa.table({"resource_id": ["r"], "kind": ["call"], "name": ["a"], "start_ns": [1],
                                       "end_ns": [2]}))
    write_segment(run_dir, "spans", "good", spans)
    write_segment(run_dir, "spans", "hurt", spans)
    hurt = run_dir / "spans" / "hurt.parquet"
    hurt.write_bytes(hurt.read_bytes()[:40])  # truncated, as a failing disk or a partial copy leaves it
    run = flowscope.open_run(run_dir)
    for read in (run.counts, lambda: run.table("spans"), lambda: run.sql("SELECT count(*) FROM spans")):
        with pytest.raises(DamagedSegment, match=r"hurt\.parquet: damaged segment .*move it out"):
            read()
    hurt.rename(run_dir / "hurt.parquet.bad")
    assert run.counts()["spans"] == 1


def test_run_json_round_trips_text_beyond_ascii_and_integers_beyond_64_bits(tmp_path):
    from flowscope.store.layout import read_json, write_json_atomic

    obj = {"name": "café ✓ 数据", "big": 2**70, "small": -1, "nested": {"b": [1.5, None], "a": True}}
    path = tmp_path / "run.json"
    write_json_atomic(path, obj)  # beyond 64 bits: the standard library writes it
    assert read_json(path) == obj
    del obj["big"]
    write_json_atomic(path, obj)
    assert read_json(path) == obj
    text = path.read_bytes().decode("utf-8")
    assert text.endswith("\n") and text.index('"name"') < text.index('"nested"') < text.index('"small"')


def test_one_run_object_sees_a_table_gain_its_first_segments_and_lose_its_last(run_dir):
    """The run's DuckDB views are kept between queries (made again only when a table gains its first segment or
    loses its last, or the mappings change): every query still sees the segments as they are then."""
    run = flowscope.open_run(run_dir)

    def n(table: str) -> int:
        return int(run.sql(f"SELECT count(*) AS n FROM {table}")["n"].iloc[0])

    assert n("spans") == 0 and n("io") == 0
    spans = conform("spans", pa.table({"resource_id": ["r"], "kind": ["call"], "name": ["a"], "start_ns": [1],
                                       "end_ns": [2]}))
    write_segment(run_dir, "spans", "one", spans)
    assert n("spans") == 1 and n("io") == 0
    write_segment(run_dir, "spans", "two", spans)  # a second segment: the same view finds it
    assert n("spans") == 2
    assert list(run.sql("SELECT name FROM spans")["name"]) == ["a", "a"]
    for f in (run_dir / "spans").glob("*.parquet"):
        f.unlink()
    assert n("spans") == 0  # no segment left: the empty view again, not an error
    io = conform("io", pa.table({"source": ["x"], "op": ["read"], "start_ns": [5], "end_ns": [6]}))
    write_segment(run_dir, "io", "one", io)
    assert n("io") == 1 and n("spans") == 0


def test_a_runs_memo_is_computed_once_per_state_of_its_segments_and_mappings(run_dir):
    from flowscope.analysis.timeline import resource_states

    run = flowscope.open_run(run_dir)
    calls = []

    def spans_now():
        calls.append(1)
        return run.counts()["spans"]

    assert run.memo("spans now", spans_now) == 0 and run.memo("spans now", spans_now) == 0 and len(calls) == 1
    spans = conform("spans", pa.table({"resource_id": ["r"] * 3, "kind": ["call"] * 3, "name": ["a", "b", "c"],
                                       "start_ns": [1, 2, 3], "end_ns": [5, 6, 7]}))
    write_segment(run_dir, "spans", "batch-1", spans)  # a new segment: computed again
    assert run.memo("spans now", spans_now) == 3 and len(calls) == 2
    logs = conform("logs", pa.table({"resource_id": ["r"], "ts_ns": [4], "level": ["info"], "category": ["note"],
                                     "message": ["m"]}))
    write_segment(run_dir, "logs", "batch-1", logs)  # any table's: analyses read several
    assert run.memo("spans now", spans_now) == 3 and len(calls) == 3
    assert run.memo("spans now", spans_now) == 3 and len(calls) == 3
    flowscope.open_run(run_dir).memo("spans now", spans_now)  # another Run object: its own memo
    assert len(calls) == 4

    # a memoised analysis hands each caller its own frame
    first = resource_states(run)
    first["state"] = "spoiled"
    assert "spoiled" not in set(resource_states(run)["state"])
