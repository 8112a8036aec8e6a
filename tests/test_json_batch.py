"""The collector's windowed JSON batch decoder reads what json.loads + records_to_table read, and says the same
about what they refuse, with windows small enough that every batch spans many of them."""

from __future__ import annotations

import json

import pytest

from flowscope.model.conform import SchemaError, records_to_table
from flowscope.service import json_batch
from flowscope.service.json_batch import MalformedBatch, json_batch_table


@pytest.fixture(autouse=True)
def small_windows(monkeypatch):
    monkeypatch.setattr(json_batch, "WINDOW_CHARS", 300)


def _record(i: int) -> dict:
    rec = {"resource_id": f"r{i % 3}", "kind": "task", "name": "a},{b" if i % 7 == 0 else "n",
           "start_ns": i, "end_ns": i + 1, "span_id": i}
    if i % 5 == 0:  # a nested document in a string, with the window's cut marker inside it
        rec["attrs"] = json.dumps({"x": {"y": [1, {"z": "},"}]}})
    return rec


RECORDS = [_record(i) for i in range(200)]
DUMPS = {
    "default": json.dumps,
    "indented": lambda o: json.dumps(o, indent=2),
    "compact": lambda o: json.dumps(o, separators=(",", ":")),
    "unicode": lambda o: json.dumps(o, ensure_ascii=False),
    "spaced": lambda o: json.dumps(o).replace("}, {", "} ,\n {"),  # no "}," anywhere: one record at a time
}


@pytest.mark.parametrize("style", DUMPS)
@pytest.mark.parametrize("shape", ["array", "object", "object with other keys", "empty"])
def test_batches_read_as_json_loads_reads_them(style, shape):
    dumps = DUMPS[style]
    recs = RECORDS if shape != "empty" else []
    doc = {"array": recs, "object": {"records": recs}, "empty": recs,
           "object with other keys": {"meta": {"a": [1, {"b": "},"}]}, "records": recs, "z": 1}}[shape]
    body = bytearray(dumps(doc).encode())
    expected = records_to_table("spans", recs)
    got = json_batch_table("spans", body)
    assert got.equals(expected)
    assert len(body) == 0  # the body's memory was given back once it was text


@pytest.mark.parametrize("change, message", [
    (lambda r: r[150].update(start_ns="soon"), "spans.start_ns: record 150: expected an integer (int64), got str 'soon'"),
    (lambda r: r[123].update(duration=1), "spans.duration: record 123 has unknown column 'duration'"),
    (lambda r: r.__setitem__(177, [1]), "spans: record 177 is a list, expected an object"),
    (lambda r: r[140].pop("kind"), "spans.kind: is required but row 140 is null"),
    (lambda r: r[160].update(end_ns=None), "spans.end_ns: is required but row 160 is null"),
])
def test_a_record_that_does_not_fit_is_named_by_its_index_in_the_whole_batch(change, message):
    recs = [dict(r) for r in RECORDS]
    change(recs)
    with pytest.raises(SchemaError) as old:
        records_to_table("spans", recs)
    with pytest.raises(SchemaError) as new:
        json_batch_table("spans", json.dumps(recs).encode())
    assert str(new.value) == str(old.value)
    assert str(new.value).startswith(message)


GOOD = json.dumps(RECORDS)


def _loads_error(body: str) -> str:
    """Where json.loads says the body goes wrong."""
    try:
        json.loads(body)
    except json.JSONDecodeError as exc:
        return f"line {exc.lineno} column {exc.colno} (char {exc.pos})"
    raise AssertionError("json.loads read it")


@pytest.mark.parametrize("body, where", [
    ('[{"a":', "Expecting value: line 1 column 7 (char 6)"),
    (GOOD[:1000], _loads_error(GOOD[:1000])),
    (GOOD[:-1], _loads_error(GOOD[:-1])),
    (GOOD + "x", f"extra data after the batch: line 1 column {len(GOOD) + 1}"),
    ("", "expecting '[' or '{'"),
    ("nul", "expecting '[' or '{'"),
    ('{"records": 5}', "expecting the records array: line 1 column 13 (char 12)"),
    ('{"records": [], "records": []}', "a second 'records' key"),
    ('{"x": 1}', "the object has no 'records' key"),
    (json.dumps(RECORDS[:2], indent=1).replace("},", "}"), "expecting ',' or ']' after a record: line 11 column 2"),
])
def test_malformed_batches_are_refused_saying_where(body, where):
    with pytest.raises(MalformedBatch, match="malformed JSON batch|no 'records' key") as refused:
        json_batch_table("spans", body.encode())
    assert where in str(refused.value)


def test_a_body_that_is_not_utf8_is_refused_at_its_byte_offset():
    with pytest.raises(MalformedBatch, match="not UTF-8 at byte offset 3"):
        json_batch_table("spans", b'[{"\xff": 1}]')
