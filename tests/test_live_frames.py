"""The live channel's binary messages (service/frames.py): columns travel as buffers and come back exactly, one item
or many, and a damaged message is refused with the byte it went wrong at."""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa
import pytest

from flowscope.service.frames import FrameError, encode_item, message, read_message

KEYS = ["('<script>alert(1)</script>', 0)", "", "ключ-λ-🙂", None, "x" * 1000]


def _tasks(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    start = rng.random(n) * 1e4
    return {"start": start, "end": start + rng.random(n), "row": rng.integers(0, 80, n).astype(np.int32),
            "group": rng.integers(0, 20, n).astype(np.int32),
            "key": pa.array([KEYS[i % len(KEYS)] for i in range(n)], pa.string())}


def test_a_snapshots_columns_come_back_exactly_beside_its_other_fields():
    tasks = _tasks(1001, 1)
    snap = {"seq": 7, "name": "run <b>x</b>", "tasks": tasks, "rows": ["a", "b"],
            "transfers": {"start": np.zeros(0), "end": np.zeros(0), "src": np.zeros(0, np.int32),
                          "dst": np.zeros(0, np.int32)}}
    data = message('"type":"snapshot"', [encode_item(snap)], None)
    assert isinstance(data, bytes)
    got = read_message(data)
    assert got["type"] == "snapshot" and got["seq"] == 7 and got["name"] == "run <b>x</b>" and got["rows"] == ["a", "b"]
    for c in ("start", "end", "row", "group"):
        assert np.array_equal(got["tasks"][c], tasks[c]) and got["tasks"][c].dtype.itemsize == tasks[c].dtype.itemsize
    assert got["tasks"]["key"] == [k or "" for k in tasks["key"].to_pylist()]  # a null key is empty
    assert all(len(got["transfers"][c]) == 0 for c in ("start", "end", "src", "dst"))


def test_deltas_encoded_once_each_make_one_message_in_which_every_delta_finds_its_own_columns():
    items, want = [], []
    for seq, n in enumerate([3, 0, 17, 1], start=1):
        d = {"seq": seq, "progress": {"columns": {"done": 1}, "n": {"done": 2}}}  # groups named like the spec
        if n:
            d["tasks"] = _tasks(n, seq)
            # a sliced key column (an offset into its buffers) and chunks, as DuckDB and Arrow hand them over
            d["tasks"]["key"] = pa.chunked_array([pa.array(["pad"] + KEYS * 4, pa.string()).slice(1, n)])
        items.append(encode_item(d))
        want.append(d)
    assert all(len(i.body) % 8 == 0 for i in items)
    got = read_message(message('"type":"deltas","epoch":"e"', items, "deltas"))
    assert got["type"] == "deltas" and got["epoch"] == "e" and [d["seq"] for d in got["deltas"]] == [1, 2, 3, 4]
    for g, w in zip(got["deltas"], want):
        assert g["progress"] == w["progress"]
        if "tasks" not in w:
            assert "tasks" not in g
            continue
        assert np.array_equal(g["tasks"]["start"], w["tasks"]["start"])
        assert np.array_equal(g["tasks"]["row"], w["tasks"]["row"])
        assert g["tasks"]["key"] == [k or "" for k in w["tasks"]["key"].to_pylist()]


def test_a_message_without_columns_stays_text():
    data = message('"type":"deltas","epoch":"e"', [encode_item({"seq": 1, "status": "finished"})], "deltas")
    assert isinstance(data, str) and json.loads(data) == {"type": "deltas", "epoch": "e",
                                                          "deltas": [{"seq": 1, "status": "finished"}]}


def test_columns_that_do_not_fit_the_layout_are_refused_when_encoded():
    with pytest.raises(ValueError, match="'row' holds values beyond int32"):
        encode_item({"tasks": {"start": np.zeros(1), "row": np.array([2 ** 40])}})
    with pytest.raises(ValueError, match="'end' has 2 values, the others 1"):
        encode_item({"tasks": {"start": np.zeros(1), "end": np.zeros(2)}})
    with pytest.raises(TypeError, match="'when' has dtype"):
        encode_item({"tasks": {"when": np.array(["2026-01-01"], "datetime64[ns]")}})


def test_a_damaged_message_is_refused_with_where_it_went_wrong():
    data = message('"type":"snapshot"', [encode_item({"seq": 1, "tasks": _tasks(50, 3)})], None)
    with pytest.raises(FrameError, match="header claims"):
        read_message(data[:10])
    (h,) = struct.unpack_from("<I", data)
    with pytest.raises(FrameError, match=r"segment ends at byte \d+, the message at \d+"):
        read_message(data[:-8])
    head = json.loads(data[4:4 + h])
    head["tasks"]["columns"]["start"][1] = 10 ** 6  # an offset past the end
    text = json.dumps(head).encode()
    bad = struct.pack("<I", len(text)) + text + bytes(-(4 + len(text)) % 8) + data[4 + h + (-(4 + h) % 8):]
    with pytest.raises(FrameError, match="column 'start' \\(f64\\) at byte"):
        read_message(bad)


def test_a_delta_kept_for_late_pages_holds_its_bytes_once_and_still_joins_other_deltas():
    """The collector keeps the last 2,000 deltas for pages that reconnect: each is kept as the message an up-to-date
    page receives and as the item a late page's message is built from; both must share one copy of its columns
    (two would double what a run at 100,000 tasks a second keeps), and the item must still make a right message."""
    import tracemalloc

    from flowscope.service.live_hub import Encoded, deltas_message

    deltas = [{"seq": s, "tasks": _tasks(50_000, s)} for s in (1, 2)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [Encoded("e", d) for d in deltas]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    sizes = sum(len(k.message) for k in kept)
    assert held < 1.2 * sizes, (held, sizes)
    got = read_message(deltas_message("e", kept))  # a late page's message: both deltas in one
    assert [d["seq"] for d in got["deltas"]] == [1, 2]
    for g, w in zip(got["deltas"], deltas):
        assert np.array_equal(g["tasks"]["end"], w["tasks"]["end"])
        assert g["tasks"]["key"] == [k or "" for k in w["tasks"]["key"].to_pylist()]
    assert read_message(kept[1].message)["deltas"][0]["seq"] == 2
