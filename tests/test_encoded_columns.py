"""Columns a producer hands over encoded, decoded where the run is stored: a JSON-text column (``attrs``) given as an
Arrow struct becomes the text ``json.dumps`` writes for the same values, and a string column may stay
dictionary-encoded on the producer's side (``conform(..., decode=False)``) until the collector stores it plain.
The local-scheduler capture sends its task rows this way, so a user's process never builds their text."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

import flowscope
from flowscope import Client
from flowscope.model.conform import SchemaError, conform
from flowscope.client.transport import ipc_bytes
from flowscope.model.json_columns import text_bytes

WEIRD = ['say "hi"', "back\\slash", "new\nline", "ctl\x01\x1f", "é", "snow ☃", "clef 𝄞", "", "\t", "/"]


def _attrs_struct() -> tuple[pa.StructArray, list]:
    """A struct column of every kind of field the encoding takes, and the Python dicts its rows stand for."""
    n = len(WEIRD)
    ints = [0, -1, 2**63 - 1, -(2**63), None, 42, 7, 8, 9, 10]
    flags = [True, False, None, True, False, True, False, True, False, True]
    floats = [0.1, 1e-05, 1e20, -0.0, None, 3.0, 2.5e-300, 123456789.125, float("nan"), float("inf")]
    groups = pa.DictionaryArray.from_arrays(pa.array([i % 3 for i in range(n)], pa.int32()),
                                            pa.array(["inc", 'q"uote', "ü"]))
    idents = pa.DictionaryArray.from_arrays(pa.array([1, 0, 1, 0, 1, 0, 1, 0, None, 1], pa.int8()),
                                            pa.array([140000000000001, 5], pa.int64()))
    s = pa.StructArray.from_arrays(
        [pa.array(ints, pa.int64()), pa.array(flags), pa.array(floats), pa.array(WEIRD), groups, idents,
         pa.array([1] * n, pa.uint32())],
        names=["nbytes", "flag", "x", "text", "group", 'we"ird', "u"])
    rows = [json.dumps(r) for r in s.to_pylist()]
    return s, rows


def _spans(attrs: pa.Array) -> pa.Table:
    n = len(attrs)
    return pa.table({"resource_id": pa.DictionaryArray.from_arrays(pa.array([i % 2 for i in range(n)], pa.int32()),
                                                                   ["thread:a", "thread:b"]),
                     "kind": ["task"] * n, "name": ["f"] * n,
                     "start_ns": pa.array(range(n), pa.int64()), "end_ns": pa.array(range(1, n + 1), pa.int64()),
                     "attrs": attrs})


def test_a_struct_attrs_column_is_stored_as_the_text_json_dumps_writes():
    attrs, expected = _attrs_struct()
    out = conform("spans", _spans(attrs))
    assert out.schema == flowscope.model.schemas.schema("spans")
    assert out["attrs"].to_pylist() == expected
    assert out["resource_id"].to_pylist() == ["thread:a", "thread:b"] * 5
    first = json.loads(expected[0])
    assert first["text"] == 'say "hi"' and first["we\"ird"] == 5 and math.isclose(first["x"], 0.1)
    # what the collector's memory budget counts before making the text is its exact size
    assert text_bytes(attrs) == sum(len(t) for t in expected) + 4 * (len(expected) + 1)
    # a null row of the struct is a null attrs; a struct with no rows, no text
    with_null = pa.StructArray.from_arrays([pa.array([1, 2])], names=["a"], mask=pa.array([False, True]))
    assert conform("spans", _spans(with_null))["attrs"].to_pylist() == ['{"a": 1}', None]
    assert conform("spans", _spans(attrs.slice(0, 0)))["attrs"].to_pylist() == []
    # a slice keeps its own rows
    assert conform("spans", _spans(attrs.slice(3, 4)))["attrs"].to_pylist() == expected[3:7]


def test_the_producers_conform_keeps_encoded_columns_and_still_refuses_what_does_not_fit():
    attrs, expected = _attrs_struct()
    table = _spans(attrs)
    kept = conform("spans", table, decode=False)
    assert pa.types.is_struct(kept.schema.field("attrs").type)
    assert pa.types.is_dictionary(kept.schema.field("resource_id").type)
    assert kept.schema.names == flowscope.model.schemas.schema("spans").names  # canonical order, missing filled
    assert conform("spans", kept).equals(conform("spans", table))
    # what it still refuses, naming the column (and the struct's field)
    with pytest.raises(SchemaError, match=r"spans\.attrs: field 'l' has type list<item: int64>"):
        conform("spans", _spans(pa.StructArray.from_arrays([pa.array([[1]] * 2)], names=["l"])), decode=False)
    with pytest.raises(SchemaError, match=r"spans\.resource_id: has type dictionary<values=int64"):
        conform("spans", _spans(attrs).set_column(0, "resource_id", pa.array([1] * 10).dictionary_encode()),
                decode=False)
    nulls = pa.DictionaryArray.from_arrays(pa.array([0, None] * 5, pa.int32()), ["task"])
    with pytest.raises(SchemaError, match=r"spans\.kind: is required but row 1 is null"):
        conform("spans", table.set_column(1, "kind", nulls), decode=False)
    reversed_ = table.set_column(4, "end_ns", pa.array([0] * 10, pa.int64()))
    with pytest.raises(SchemaError, match=r"row 1 ends before it starts"):
        conform("spans", reversed_, decode=False)
    with pytest.raises(SchemaError, match=r"spans\.name: has type struct"):
        conform("spans", table.set_column(2, "name", attrs), decode=False)


def test_encoded_batches_travel_to_a_real_collector_and_are_stored_plain(collector_factory, tmp_path):
    c = collector_factory()
    attrs, expected = _attrs_struct()
    with Client(c.address, name="encoded", spool_dir=tmp_path / "spool") as client:
        client.write("spans", _spans(attrs))
        client.write("spans", _spans(attrs.slice(5, 5)))
        run_id = client.run_id
    stored = flowscope.open_run(c.store / run_id).sql("SELECT attrs, resource_id FROM spans ORDER BY start_ns, attrs")
    assert sorted(stored["attrs"]) == sorted(expected + expected[5:])
    assert set(stored["resource_id"]) == {"thread:a", "thread:b"}


def test_a_struct_field_that_would_expand_beyond_the_limits_is_refused(collector_factory):
    """A dictionary field inside the struct expands like a dictionary column: 2,000 rows pointing at one 64 KiB
    value are refused before they are expanded."""
    from test_collector_memory import open_run, post

    c = collector_factory("--max-request-mb", "1")
    path = open_run(c.address, "struct")
    n = 2_000
    big = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int8()), ["x" * 65536])
    struct = pa.StructArray.from_arrays([big], names=["big"])
    body = ipc_bytes(_spans(struct))
    assert len(body) < 200_000
    status, answer = post(c.address, path, body, "application/vnd.apache.arrow.stream", "expands", chunked=False)
    assert status == 413, answer
    decoded = n * len('{"big": "' + "x" * 65536 + '"}') + 4 * (n + 1)
    assert text_bytes(struct) == decoded
    assert json.loads(answer)["error"].startswith(f"spans.attrs: an encoded column that decodes to {decoded} bytes")
    assert flowscope.open_run(c.store / "struct").counts()["spans"] == 0


def test_the_local_capture_hands_its_task_rows_over_encoded(tmp_path):
    """The user's process builds no text for the task rows: the spans and dependencies it hands to the client keep
    their keys, threads and groups dictionary-encoded and their attrs as a struct; what is stored is the text
    json.dumps writes."""
    from dask.threaded import get

    handed: list[tuple[str, pa.Schema]] = []
    dsk = {("a", i): (lambda x: x + 1, i) for i in range(50)}
    dsk["total"] = (sum, [("a", i) for i in range(50)])
    with flowscope.observe(store=tmp_path, hardware_period=0) as obs:
        client = obs.client
        enqueue = client._enqueue  # what the client queues for its senders, once checked
        client._enqueue = lambda table, data: (handed.append((table, data.schema)), enqueue(table, data))[1]
        assert get(dsk, "total") == sum(range(1, 51))
    assert obs.hook_errors == {"local": 0}
    spans = [s for t, s in handed if t == "spans" and "task_key" in s.names]
    deps = [s for t, s in handed if t == "dependencies"]
    assert spans and deps
    for s in spans:
        assert pa.types.is_struct(s.field("attrs").type), s
        for name in ("task_key", "resource_id", "name"):
            assert pa.types.is_dictionary(s.field(name).type), (name, s)
    for s in deps:
        assert pa.types.is_dictionary(s.field("task_key").type) and pa.types.is_dictionary(s.field("depends_on").type)
    rows = obs.run.sql("SELECT task_key, attrs FROM spans WHERE kind = 'task'")
    assert len(rows) == 51
    for text in rows["attrs"]:
        assert text == json.dumps(json.loads(text))
        assert list(json.loads(text))[:5] == ["nbytes", "group", "scheduler", "state", "thread_ident"]
    assert len(obs.run.sql("SELECT * FROM dependencies")) == 50
