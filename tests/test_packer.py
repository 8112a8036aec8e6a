"""The client's record packer: every table round-trips exactly, and bad values are named at the call."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from flowscope.client.packer import Packer
from flowscope.model.conform import SchemaError
from flowscope.model.schemas import TABLES

SAMPLE = {  # one full record and one with every optional column left out, per table
    "resources": ({"resource_id": "thread:h:1:2", "kind": "thread", "name": "main", "parent_id": "process:h:1",
                   "host": "h", "pid": 1, "tid": 2, "thread_ident": 140000000000, "address": None,
                   "start_ns": 5, "end_ns": 9, "attrs": '{"a": 1}'},
                  {"resource_id": "host:h", "kind": "host"}),
    "spans": ({"span_id": -3, "parent_id": 7, "resource_id": "r", "kind": "task", "name": "inc",
               "start_ns": 1_763_700_000_123_456_789, "end_ns": 1_763_700_000_123_456_999, "task_key": "inc-1",
               "attrs": '{"nbytes": 8}'},
              {"resource_id": "r", "kind": "call", "name": "f", "start_ns": 0, "end_ns": 0}),
    "transitions": ({"ts_ns": 3, "task_key": "k", "group": "g", "prefix": "p", "from_state": "waiting",
                     "to_state": "processing", "observer": "scheduler", "worker": "w", "stimulus_id": "s",
                     "attrs": None},
                    {"ts_ns": 3, "task_key": "k", "to_state": "released"}),
    "dependencies": ({"graph_id": "g1", "task_key": "b", "depends_on": "a", "ts_ns": 4},
                     {"task_key": "b", "depends_on": "a"}),
    "transfers": ({"transfer_id": 1, "kind": "dask-fetch", "src_resource_id": "w1", "dst_resource_id": "w2",
                   "nbytes": 2**40, "start_ns": 1, "end_ns": 2, "keys": ["a", "b"], "attrs": None},
                  {"kind": "mpi", "src_resource_id": "r0", "dst_resource_id": "r1", "start_ns": 1, "end_ns": 1}),
    "io": ({"resource_id": "t", "host": "h", "pid": 1, "tid": 2, "thread_ident": 3, "rank": 0, "source": "darshan-dxt",
            "op": "write", "path": "/x", "offset": 0, "nbytes": 4096, "start_ns": 1, "end_ns": 2, "task_key": "k",
            "attrs": None},
           {"source": "audit", "op": "open", "start_ns": 1}),
    "metrics": ({"ts_ns": 1, "resource_id": "host:h", "namespace": "hardware", "name": "cpu.percent", "value": 12.5},
                {"ts_ns": 1, "resource_id": "host:h", "namespace": "hardware", "name": "cpu.percent",
                 "value": float("nan")}),
    "namespace_values": ({"ts_ns": 1, "resource_id": "rank:3", "namespace": "application",
                          "name": "density/min/location", "item": 2, "value": 7.0, "text": None},
                         {"ts_ns": 2, "resource_id": "r", "namespace": "application", "name": "solver",
                          "text": "rk3"}),
    "logs": ({"ts_ns": 1, "resource_id": "w", "level": "warning", "category": "gc", "message": "gc took 1 s",
              "task_key": None, "attrs": '{"duration_s": 1.0}'},
             {"ts_ns": 1, "level": "info", "category": "x"}),
    "data_states": ({"state_id": "s1", "label": "a.h5", "size_bytes": 10, "ts_ns": 1, "origin": "sim",
                     "location": "node1:disk1", "attrs": None},
                    {"state_id": "s2", "ts_ns": 2}),
    "mutations": ({"mutation_id": "m1", "src_state_id": "s1", "dst_state_id": "s2", "kind": "MERGE",
                   "application": "merge.py", "attrs": None},
                  {"src_state_id": "s1", "dst_state_id": "s2", "kind": "DELETE"}),
}


def test_sample_covers_every_table():
    assert set(SAMPLE) == set(TABLES)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_table_round_trips_exactly(table):
    p = Packer(table)
    full, sparse = SAMPLE[table]
    for rec in (full, sparse, full):
        p.add(*(rec.get(c) for c in p.columns))
    assert len(p) == 3
    got = p.take()
    assert got.schema == TABLES[table]
    rows = got.to_pylist()
    for rec, row in zip((full, sparse, full), rows):
        for col in p.columns:
            want = rec.get(col)
            if isinstance(want, float) and want != want:
                assert row[col] != row[col]  # NaN stays NaN
            else:
                assert row[col] == want, (table, col)
    assert p.take() is None and len(p) == 0


def test_attrs_objects_become_json_and_buffers_are_reused_after_take():
    p = Packer("logs")
    p.add(1, "r", "info", "c", "m", None, {"n": 1, "path": "/x"})
    first = p.take()
    assert first.column("attrs")[0].as_py() == '{"n": 1, "path": "/x"}'
    p.add(2, "other", "error", "c", None, None, None)  # codes restart; the dictionary was cleared
    second = p.take().to_pylist()[0]
    assert second["resource_id"] == "other" and second["level"] == "error" and second["message"] is None


@pytest.mark.parametrize("values, message", [
    ((None, None, "r", "call", "f", "x", 2, None, None), "spans.start_ns: expected an int64 (ns), got str 'x'"),
    ((None, None, "r", "call", "f", 1.5, 2, None, None), "spans.start_ns: expected an int64 (ns), got float 1.5"),
    ((None, None, "r", "call", "f", 1, 2**70, None, None), "spans.end_ns: expected an int64 (ns)"),
    ((None, None, "r", "call", None, 1, 2, None, None), "spans.name: is required but was None"),
    ((None, None, "r", "call", 42, 1, 2, None, None), "spans.name: expected a string, got int 42"),
    ((None, None, "r", "call", "f", None, 2, None, None), "spans.start_ns: is required but was None"),
    (("id", None, "r", "call", "f", 1, 2, None, None), "spans.span_id: expected an int64, got str 'id'"),
])
def test_bad_values_are_named_and_leave_the_buffer_intact(values, message):
    p = Packer("spans")
    p.add(None, None, "r", "call", "ok", 1, 2, None, None)
    with pytest.raises(SchemaError) as err:
        p.add(*values)
    assert message in str(err.value)
    p.add(None, None, "r", "call", "ok2", 3, 4, None, None)
    assert p.take().column("name").to_pylist() == ["ok", "ok2"]


def test_list_columns_are_checked():
    p = Packer("transfers")
    with pytest.raises(SchemaError, match="transfers.keys: expected a list of strings"):
        p.add(None, "k", "a", "b", None, 1, 2, [1, 2], None)
    with pytest.raises(SchemaError, match="transfers.keys"):
        p.add(None, "k", "a", "b", None, 1, 2, "abc", None)


def test_take_while_another_thread_adds_loses_nothing():
    p = Packer("spans")
    n = 200_000
    taken: list[pa.Table] = []
    done = threading.Event()

    def producer() -> None:
        for i in range(n):
            p.add(i, None, "r", "call", "f", i, i + 1, f"k{i % 100}", None)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    while not done.is_set():
        got = p.take()
        if got is not None:
            taken.append(got)
    t.join()
    rest = p.take()
    if rest is not None:
        taken.append(rest)
    ids = pa.concat_tables(taken).column("span_id").to_pylist()
    assert ids == list(range(n))
    assert len(taken) > 1  # it really did take while the producer ran


RECORDER = '''
import sys
from flowscope.client.client import Client
fs = Client(sys.argv[1], name="no-pandas")
span = fs.row_writer("spans")
for i in range(100):
    span(None, None, fs.process_resource(), "task", "p", i, i + 1, f"k{i}", '{"a": 1}')
fs.emit("transfers", kind="dask-fetch", src_resource_id="w1", dst_resource_id="w2", nbytes=10, start_ns=1, end_ns=2,
        keys=["a", "b"])
fs.emit("io", source="proc-io", op="write", nbytes=5, start_ns=1, end_ns=2, tid=None)
fs.metric("m", 1.5)
fs.log("hello", category="x")
fs.close()
print("pandas" in sys.modules, "duckdb" in sys.modules)
'''


def test_a_process_that_records_imports_neither_pandas_nor_duckdb(collector, tmp_path):
    """A Dask worker or a traced program that records through a Client does not pay pandas' import (0.3 s of CPU,
    which pyarrow's pa.array() triggers on its first call) nor duckdb's; the records arrive all the same."""
    import subprocess
    import sys

    from flowscope.store.run import open_run

    out = subprocess.run([sys.executable, "-c", RECORDER, collector.address], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
    (run_dir,) = [p for p in (tmp_path / "store").iterdir() if (p / "run.json").exists()]
    counts = open_run(run_dir).counts()
    assert counts["spans"] == 100 and counts["transfers"] == 1 and counts["io"] == 1 and counts["metrics"] == 1
    keys = open_run(run_dir).sql("SELECT keys FROM transfers")["keys"][0]
    assert list(keys) == ["a", "b"]


def test_int64_extremes_round_trip_and_only_none_is_null():
    lo, hi = -(2**63), 2**63 - 1
    p = Packer("spans")
    p.add(lo, hi, "r", "c", "f", lo, hi, None, None)
    p.add(None, None, "r", "c", "f", 0, 0, None, None)
    got = p.take()
    assert got.column("span_id").to_pylist() == [lo, None]
    assert got.column("parent_id").to_pylist() == [hi, None]
    assert got.column("start_ns").to_pylist() == [lo, 0] and got.column("end_ns").to_pylist() == [hi, 0]


@pytest.mark.parametrize("values, message", [
    ((None, None, "r", "call", ["f"], 1, 2, None, None), "spans.name: expected a string, got list ['f']"),
    ((None, None, {"r": 1}, "call", "f", 1, 2, None, None), "spans.resource_id: expected a string, got dict"),
    ((None, None, "r", "call", "f", 1, 2, ["k"], None), "spans.task_key: expected a string, got list"),
])
def test_an_unhashable_value_for_a_string_column_is_named(values, message):
    p = Packer("spans")
    with pytest.raises(SchemaError) as err:
        p.add(*values)
    assert message in str(err.value)
    assert p.take() is None


def test_a_number_too_large_for_a_float_column_is_named():
    p = Packer("metrics")
    with pytest.raises(SchemaError, match=r"metrics\.value: expected a float, got int"):
        p.add(1, "r", "ns", "x", 2**1100)
    p.add(1, "r", "ns", "x", 3)  # an int that fits is a float
    assert p.take().column("value").to_pylist() == [3.0]
