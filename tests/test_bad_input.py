"""Bad requests to the collector get a 4xx that names the problem, and the collector keeps what it had."""

from __future__ import annotations

import pyarrow as pa
import pytest
import httpx

import flowscope
from flowscope.client.transport import ipc_bytes

ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}


@pytest.fixture
def small_collector(collector_factory):
    return collector_factory("--max-request-mb", "1")


def _good_spans(n: int, first: int = 0) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"span_id": ids, "resource_id": ["thread:h:1:1"] * n, "kind": ["call"] * n,
                     "name": ["f"] * n, "start_ns": ids, "end_ns": [i + 10 for i in ids]})


def test_each_bad_request_gets_a_clear_4xx_and_nothing_is_lost(small_collector):
    base = small_collector.address
    run_id = httpx.post(f"{base}/v1/runs", json={"name": "bad-input"}).json()["run_id"]
    url = f"{base}/v1/runs/{run_id}/tables"
    ok = httpx.post(f"{url}/spans", content=ipc_bytes(_good_spans(100)), headers={**ARROW, "X-Flowscope-Segment": "s1"})
    assert ok.status_code == 200 and ok.json()["rows"] == 100

    cases = []
    # a malformed batch: not an Arrow stream at all, and a truncated one
    cases.append((httpx.post(f"{url}/spans", content=b"\x00garbage" * 10, headers=ARROW), 400, "malformed Arrow IPC"))
    cases.append((httpx.post(f"{url}/spans", content=ipc_bytes(_good_spans(50))[:-120], headers=ARROW), 400,
                  "malformed Arrow IPC"))
    # an unknown table
    cases.append((httpx.post(f"{url}/nosuch", content=ipc_bytes(_good_spans(1)), headers=ARROW), 404,
                  "unknown table 'nosuch'"))
    # a wrong column type: start_ns as text
    bad_type = _good_spans(3).set_column(4, "start_ns", pa.array(["1", "2", "x"]))
    cases.append((httpx.post(f"{url}/spans", content=ipc_bytes(bad_type), headers=ARROW), 422,
                  "spans.start_ns: has type string, expected int64"))
    # an unknown column, a missing required column, a null in a required column
    cases.append((httpx.post(f"{url}/spans", content=ipc_bytes(_good_spans(2).append_column("color", pa.array(["r", "g"]))),
                             headers=ARROW), 422, "unknown column(s) 'color'"))
    cases.append((httpx.post(f"{url}/spans", content=ipc_bytes(_good_spans(2).drop_columns(["name"])), headers=ARROW),
                  422, "spans.name: is required but missing"))
    cases.append((httpx.post(f"{url}/spans", content=ipc_bytes(_good_spans(2).set_column(3, "name", pa.array(["a", None]))),
                             headers=ARROW), 422, "spans.name: is required but row 1 is null"))
    # JSON records with a wrong type
    cases.append((httpx.post(f"{url}/metrics", json=[{"ts_ns": 1, "resource_id": "r", "namespace": "n", "name": "x",
                                                      "value": "high"}]), 422, "metrics.value"))
    cases.append((httpx.post(f"{url}/logs", content=b"[{", headers={"Content-Type": "application/json"}), 400,
                  "malformed JSON batch"))
    # an oversized request (limit is 1 MiB here)
    cases.append((httpx.post(f"{url}/spans", content=b"\x00" * (2 * 2**20), headers=ARROW), 413,
                  "exceeds the limit of 1048576 bytes"))
    # a huge value: an end time beyond int64
    cases.append((httpx.post(f"{url}/spans", json=[{"resource_id": "r", "kind": "call", "name": "f", "start_ns": 0,
                                                    "end_ns": 2**70}]), 422, "spans.end_ns"))
    # a content type we do not read, an unknown run, a bad run id, a bad segment id
    cases.append((httpx.post(f"{url}/spans", content=b"a,b", headers={"Content-Type": "text/csv"}), 415,
                  "unsupported Content-Type"))
    cases.append((httpx.post(f"{base}/v1/runs/nope/tables/spans", content=ipc_bytes(_good_spans(1)), headers=ARROW),
                  404, "unknown run 'nope'"))
    cases.append((httpx.post(f"{base}/v1/runs", json={"run_id": "../etc"}), 422, "invalid run id"))
    cases.append((httpx.post(f"{base}/v1/runs/bad$id/tables/spans", content=ipc_bytes(_good_spans(1)), headers=ARROW),
                  400, "invalid run id 'bad$id'"))
    cases.append((httpx.post(f"{url}/spans", content=ipc_bytes(_good_spans(1)),
                             headers={**ARROW, "X-Flowscope-Segment": "../../x"}), 400, "invalid segment id"))
    # bad queries
    cases.append((httpx.get(f"{url}/spans", params={"colour": "red"}), 400, "unknown filter column 'colour'"))
    cases.append((httpx.get(f"{url}/spans", params={"limit": "many"}), 400, "limit and offset must be integers"))

    for res, status, words in cases:
        assert res.status_code == status, (words, res.status_code, res.text)
        assert words in res.json()["error"], (words, res.json())

    # still serving, still holding exactly what it acknowledged
    assert httpx.get(f"{base}/v1/health").json()["status"] == "ok"
    again = httpx.post(f"{url}/spans", content=ipc_bytes(_good_spans(100, 100)), headers={**ARROW, "X-Flowscope-Segment": "s2"})
    assert again.status_code == 200
    dup = httpx.post(f"{url}/spans", content=ipc_bytes(_good_spans(100, 100)), headers={**ARROW, "X-Flowscope-Segment": "s2"})
    assert dup.json()["duplicate"] is True
    run = flowscope.open_run(small_collector.store / run_id)
    assert run.counts()["spans"] == 200
    assert sorted(run.table("spans")["span_id"]) == list(range(200))
    assert run.counts()["metrics"] == 0 and run.counts()["logs"] == 0
