"""Values that do not fit the model are refused where they enter (REST, Client.write, Client.span,
run open and close), naming the table, row and column (or the run field); what was stored stays."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pyarrow as pa
import pytest

import flowscope
from flowscope.client.transport import ipc_bytes
from flowscope.embedded import EmbeddedTransport
from flowscope.model.conform import SchemaError, records_to_table
from flowscope.model.schemas import TABLES, schema
from flowscope.service.collector import Collector
from flowscope.store.catalog import list_runs

ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}
T0 = 1_700_000_000_000_000_000


def _span(i: int, **over) -> dict:
    rec = {"span_id": i, "resource_id": "thread:h:1:1", "kind": "call", "name": "f",
           "start_ns": T0 + 10 * i, "end_ns": T0 + 10 * i + 5}
    rec.update(over)
    return rec


def _open(base: str, **meta) -> str:
    res = httpx.post(f"{base}/v1/runs", json=meta)
    assert res.status_code == 201, res.text
    return res.json()["run_id"]


def _rows(base: str, run_id: str, table: str) -> int:
    return httpx.get(f"{base}/v1/runs/{run_id}").json()["rows"][table]


# ---- item 3: a JSON value of the wrong kind in an integer (or float) column is refused, not truncated ----------------

@pytest.mark.parametrize("table, record, column, words", [
    ("spans", _span(1, start_ns=1.5), "start_ns", "1.5"),
    ("spans", _span(1, end_ns=float(T0 + 20)), "end_ns", "float"),        # integral, but a float all the same
    ("spans", _span(1, span_id=True), "span_id", "bool"),
    ("spans", _span(1, parent_id=2**63), "parent_id", "9223372036854775808"),
    ("spans", _span(1, end_ns=-(2**63) - 1), "end_ns", "int64"),
    ("metrics", {"ts_ns": T0, "resource_id": "r", "namespace": "n", "name": "x", "value": True}, "value", "bool"),
    ("metrics", {"ts_ns": 1e18, "resource_id": "r", "namespace": "n", "name": "x", "value": 1.0}, "ts_ns", "float"),
    ("io", {"source": "s", "op": "read", "start_ns": T0, "nbytes": 4096.5}, "nbytes", "4096.5"),
    ("resources", {"resource_id": "r", "kind": "host", "pid": False}, "pid", "bool"),
])
def test_a_json_value_that_is_not_an_integer_is_refused_naming_table_row_and_column(collector, table, record, column,
                                                                                   words):
    base = collector.address
    run_id = _open(base, name="json-types")
    good = _span(0) if table == "spans" else {**record, column: None} if schema(table).field(column).nullable \
        else {**record, column: 7}
    res = httpx.post(f"{base}/v1/runs/{run_id}/tables/{table}", json=[good, record])
    assert res.status_code == 422, res.text
    error = res.json()["error"]
    assert error.startswith(f"{table}.{column}:"), error
    assert "record 1" in error and words in error, error
    assert _rows(base, run_id, table) == 0                   # the good record of the refused batch is not stored either
    ok = httpx.post(f"{base}/v1/runs/{run_id}/tables/{table}", json=[good])
    assert ok.status_code == 200 and ok.json()["rows"] == 1


def test_row_dicts_from_python_take_numpy_integers_but_not_numpy_floats_or_bools():
    rec = {"resource_id": "r", "kind": "call", "name": "f", "start_ns": np.int64(T0), "end_ns": T0 + 1,
           "span_id": np.int32(3)}
    t = records_to_table("spans", [rec])
    assert t.column("start_ns").to_pylist() == [T0] and t.column("span_id").to_pylist() == [3]
    with pytest.raises(SchemaError, match=r"spans\.end_ns: record 0: expected an integer \(int64\), got float64"):
        records_to_table("spans", [{**rec, "end_ns": np.float64(T0 + 1)}])
    with pytest.raises(SchemaError, match=r"spans\.span_id: record 1: expected an integer \(int64\), got bool"):
        records_to_table("spans", [rec, {**rec, "span_id": np.bool_(True)}])


def test_an_arrow_timestamp_beyond_int64_ns_is_a_422_not_a_500(collector):
    base = collector.address
    run_id = _open(base, name="ts-overflow")
    t = pa.table({"resource_id": ["r"], "kind": ["call"], "name": ["f"],
                  "start_ns": pa.array([2**62], pa.timestamp("s")), "end_ns": pa.array([2**62], pa.timestamp("s"))})
    res = httpx.post(f"{base}/v1/runs/{run_id}/tables/spans", content=ipc_bytes(t), headers=ARROW)
    assert res.status_code == 422, res.text
    assert res.json()["error"].startswith("spans.start_ns: row 0:"), res.json()
    ids = pa.table({"span_id": pa.array([1, 2**63, 3], pa.uint64()), "resource_id": ["r"] * 3, "kind": ["call"] * 3,
                    "name": ["f"] * 3, "start_ns": [T0] * 3, "end_ns": [T0] * 3})
    res = httpx.post(f"{base}/v1/runs/{run_id}/tables/spans", content=ipc_bytes(ids), headers=ARROW)
    assert res.status_code == 422, res.text
    assert res.json()["error"].startswith("spans.span_id: row 1:") and "9223372036854775808" in res.json()["error"]
    assert _rows(base, run_id, "spans") == 0


def test_client_emit_refuses_a_bool_for_an_integer_column(tmp_path):
    fs = flowscope.Client(store=tmp_path / "store", spool_dir=tmp_path / "spool", name="bools")
    with pytest.raises(SchemaError, match=r"spans\.span_id: expected an int64, got bool True"):
        fs.emit("spans", span_id=True, resource_id="r", kind="call", name="f", start_ns=T0, end_ns=T0 + 1)
    with pytest.raises(SchemaError, match=r"spans\.start_ns: expected an int64 \(ns\), got bool False"):
        fs.span("f", False, T0)
    with pytest.raises(SchemaError, match=r"metrics\.value: expected a float, got bool True"):
        fs.metric("x", True)
    fs.span("f", T0, T0 + 1)
    fs.close()
    assert flowscope.open_run(fs.run_dir).counts()["spans"] == 1


# ---- item 6: an interval that ends before it starts is refused at ingest ------------------------------------------------

INTERVAL_TABLES = [t for t, s in TABLES.items() if "start_ns" in s.names and "end_ns" in s.names]


def _minimal(table: str, start: int, end: int | None) -> dict:
    """One valid row of ``table`` (required columns only) with the interval [start, end]."""
    rec = {}
    for f in schema(table):
        if f.name in ("start_ns", "end_ns"):
            continue
        if not f.nullable:
            rec[f.name] = 1 if pa.types.is_integer(f.type) else 1.0 if pa.types.is_floating(f.type) else f"v-{f.name}"
    return {**rec, "start_ns": start, "end_ns": end}


def test_every_table_with_an_interval_is_checked():
    assert set(INTERVAL_TABLES) == {"resources", "spans", "transfers", "io"}


@pytest.mark.parametrize("table", INTERVAL_TABLES)
def test_rest_ingest_refuses_an_interval_that_ends_before_it_starts(collector, table):
    base = collector.address
    run_id = _open(base, name="intervals")
    records = [_minimal(table, T0, T0 + 5), _minimal(table, T0, T0), _minimal(table, T0 + 9, T0 + 3)]
    res = httpx.post(f"{base}/v1/runs/{run_id}/tables/{table}", json=records)
    assert res.status_code == 422, res.text
    error = res.json()["error"]
    assert error.startswith(f"{table}.end_ns:") and "row 2" in error, error
    assert str(T0 + 3) in error and str(T0 + 9) in error, error
    arrow = pa.Table.from_pylist(records, schema=schema(table).remove_metadata())
    res = httpx.post(f"{base}/v1/runs/{run_id}/tables/{table}", content=ipc_bytes(arrow), headers=ARROW)
    assert res.status_code == 422 and "row 2" in res.json()["error"], res.text
    assert _rows(base, run_id, table) == 0
    # open intervals (a null end or start, where the column allows it) are not a misordering
    ok = [_minimal(table, T0, T0 + 1)]
    if schema(table).field("end_ns").nullable:
        ok.append(_minimal(table, T0, None))
    res = httpx.post(f"{base}/v1/runs/{run_id}/tables/{table}", json=ok)
    assert res.status_code == 200 and res.json()["rows"] == len(ok), res.text


def test_client_write_refuses_a_reversed_interval_naming_the_row(tmp_path):
    fs = flowscope.Client(store=tmp_path / "store", spool_dir=tmp_path / "spool", name="write")
    data = pa.table({"resource_id": ["r"] * 3, "kind": ["call"] * 3, "name": ["f"] * 3,
                     "start_ns": [T0, T0 + 10, T0 + 20], "end_ns": [T0 + 1, T0 + 11, T0 + 19]})
    with pytest.raises(SchemaError, match=r"spans\.end_ns: row 2 ends before it starts"):
        fs.write("spans", data)
    fs.write("spans", data.slice(0, 2))
    fs.close()
    assert flowscope.open_run(fs.run_dir).counts()["spans"] == 2


def test_client_span_refuses_a_reversed_interval_in_the_call(tmp_path):
    fs = flowscope.Client(store=tmp_path / "store", spool_dir=tmp_path / "spool", name="span")
    fs.span("ok", T0, T0 + 5)
    with pytest.raises(SchemaError, match=r"spans\.end_ns: ends before it starts"):
        fs.span("bad", T0 + 5, T0 + 4)
    with pytest.raises(SchemaError, match=r"transfers\.end_ns: ends before it starts"):
        fs.emit("transfers", kind="mpi", src_resource_id="a", dst_resource_id="b", start_ns=T0 + 2, end_ns=T0)
    with pytest.raises(SchemaError, match=r"io\.end_ns: ends before it starts"):
        fs.emit("io", source="s", op="read", start_ns=T0 + 2, end_ns=T0)
    with pytest.raises(SchemaError, match=r"spans\.start_ns: is required but was None"):
        fs.span("none", None, T0)
    fs.emit("io", source="s", op="open", start_ns=T0)                # an instantaneous observation: no end
    fs.emit("resources", resource_id="r", kind="host", end_ns=T0)     # only one end of the interval known
    fs.span("zero", T0, T0)
    fs.close()
    run = flowscope.open_run(fs.run_dir)
    assert sorted(run.table("spans")["name"]) == ["ok", "zero"]
    assert run.counts()["io"] == 1 and run.counts()["transfers"] == 0
    # the run the refusals protected is one the anomaly analysis accepts
    res = subprocess.run([sys.executable, "-m", "flowscope", "anomalies", str(fs.run_dir)], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stderr


# ---- item 4: run metadata is checked when a run is opened, and a bad run.json never hides the others -------------------

@pytest.mark.parametrize("meta, words", [
    ({"start_ns": 1e300}, "start_ns"),
    ({"start_ns": 2**63}, "start_ns"),
    ({"start_ns": -1}, "start_ns"),
    ({"start_ns": "yesterday"}, "start_ns"),
    ({"start_ns": True}, "start_ns"),
    ({"start_ns": 1.5e18}, "start_ns"),
    ({"name": 5}, "name"),
    ({"command": ["python", "x.py"]}, "command"),
    ({"provenance": "laptop"}, "provenance"),
    ({"status": "finished"}, "status"),
    ({"format_version": 2}, "format_version"),
    ({"end_ns": T0}, "end_ns"),
])
def test_opening_a_run_with_bad_metadata_is_refused_naming_the_field(collector, meta, words):
    base = collector.address
    res = httpx.post(f"{base}/v1/runs", json={"run_id": "bad-meta", **meta})
    assert res.status_code == 422, res.text
    assert res.json()["error"].startswith(f"run.json {words}:"), res.json()
    assert not (collector.store / "bad-meta").exists()


def test_opening_a_run_with_a_non_finite_number_is_refused(collector):
    res = httpx.post(f"{collector.address}/v1/runs", content=b'{"run_id": "nan-meta", "job": {"load": NaN}}',
                     headers={"Content-Type": "application/json"})
    assert res.status_code == 422 and "job.load" in res.json()["error"], res.text


def test_a_client_with_bad_metadata_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="run.json start_ns"):
        flowscope.Client(store=tmp_path / "store", spool_dir=tmp_path / "spool", meta={"start_ns": 1e300})


def _write_run_json(store, name: str, text: str) -> None:
    d = store / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(text)


def test_one_bad_run_json_does_not_break_listing_the_others(collector):
    base, store = collector.address, collector.store
    good = [_open(base, run_id=f"good-{i}", name=f"good {i}") for i in range(2)]
    httpx.post(f"{base}/v1/runs/good-0/close", json={"status": "finished"}).raise_for_status()
    bad = {
        "huge-start": (json.dumps({"run_id": "huge-start", "start_ns": 1e300, "status": "finished"}), "start_ns"),
        "text-start": (json.dumps({"run_id": "text-start", "start_ns": "yesterday", "end_ns": T0}), "start_ns"),
        "bad-end": (json.dumps({"run_id": "bad-end", "start_ns": T0, "end_ns": [1]}), "end_ns"),
        "nan-name": ('{"run_id": "nan-name", "start_ns": 1, "name": NaN}', "name"),
        "a-list": ("[1, 2]", "not a JSON object"),
        "truncated": ('{"run_id": "trunc', "run.json"),
    }
    for name, (text, _) in bad.items():
        _write_run_json(store, name, text)

    def check(listed: list[dict]) -> None:
        by_id = {m["run_id"]: m for m in listed}
        assert set(by_id) == set(good) | set(bad)
        for rid in good:
            assert "error" not in by_id[rid] and by_id[rid]["name"] == rid.replace("-", " ")
        for rid, (_, words) in bad.items():
            assert words in by_id[rid]["error"], by_id[rid]
            assert by_id[rid]["path"].endswith(rid)

    check(list_runs(store))
    res = httpx.get(f"{base}/v1/runs")
    assert res.status_code == 200, res.text
    check(res.json()["runs"])
    cli = subprocess.run([sys.executable, "-m", "flowscope", "runs", "--json", str(store)], capture_output=True,
                         text=True, check=False)
    assert cli.returncode == 0, cli.stderr
    check(json.loads(cli.stdout))
    table = subprocess.run([sys.executable, "-m", "flowscope", "runs", str(store)], capture_output=True, text=True,
                           env={"COLUMNS": "400", "PATH": "/usr/bin"}, check=False)
    assert table.returncode == 0, table.stderr
    for rid in [*good, *bad]:
        assert rid in table.stdout
    assert "start_ns" in table.stdout                        # the bad run is flagged with what is wrong
    # nothing on disk was changed by listing
    assert (store / "huge-start" / "run.json").read_text() == bad["huge-start"][0]


# ---- item 5: closing a run accepts only end_ns and status ------------------------------------------------------------------

def test_closing_a_run_accepts_only_the_documented_fields(collector):
    base = collector.address
    run_id = _open(base, run_id="close-me", name="close me")
    before = json.loads((collector.store / run_id / "run.json").read_text())
    for body, words in [
        ({"run_id": "other", "format_version": 99}, "format_version, run_id"),
        ({"status": "finished", "note": "hi"}, "note"),
        ({"end_ns": 1.5}, "end_ns"),
        ({"end_ns": True}, "end_ns"),
        ({"end_ns": 1e300}, "end_ns"),
        ({"end_ns": 2**64}, "end_ns"),
        ({"status": 3}, "status"),
        ({"status": ""}, "status"),
    ]:
        res = httpx.post(f"{base}/v1/runs/{run_id}/close", json=body)
        assert res.status_code == 422, (body, res.text)
        assert words in res.json()["error"], (body, res.json())
    assert json.loads((collector.store / run_id / "run.json").read_text()) == before
    res = httpx.post(f"{base}/v1/runs/{run_id}/close", json={"end_ns": before["start_ns"] + 5, "status": "failed"})
    assert res.status_code == 200, res.text
    after = json.loads((collector.store / run_id / "run.json").read_text())
    assert after == {**before, "end_ns": before["start_ns"] + 5, "status": "failed"}


def test_the_embedded_transport_refuses_undocumented_close_fields_too(tmp_path):
    collector = Collector(tmp_path / "store")
    try:
        transport = EmbeddedTransport(collector)
        transport.open_run({"run_id": "emb"})
        with pytest.raises(ValueError, match="run_id"):
            transport.close_run("emb", {"run_id": "x", "status": "finished"})
        assert transport.close_run("emb", {"status": "finished"})["run_id"] == "emb"
    finally:
        collector.shutdown()
