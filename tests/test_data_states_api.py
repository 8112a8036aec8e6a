"""Data states and mutations through a real collector process: REST (validation, filters, nothing partially
written, online critical path), the Python API, and `flowscope step` on real commands writing real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import flowscope
from flowscope import Client
from flowscope.analysis.critical_path import data_state_path
from flowscope.client.data_states import DataStateError, step

REPO = Path(__file__).resolve().parent.parent

# The paper's Fig. 6 shape: A splits into B and E; B -> C -> D; D and E merge into F. D arrives after E,
# so F's gating input is D and the path is A B C D F.
FIG6_STATES = [
    {"state_id": "A", "label": "file.csv", "size_bytes": 100, "ts_ns": 1_000, "origin": "stagein",
     "location": "node1:disk1"},
    {"state_id": "B", "label": "file1.csv", "size_bytes": 50, "ts_ns": 2_000, "origin": "split",
     "location": "node1:disk1"},
    {"state_id": "E", "label": "file2.csv", "size_bytes": 50, "ts_ns": 2_500, "origin": "split",
     "location": "node2:memory"},
    {"state_id": "C", "label": "c", "size_bytes": 50, "ts_ns": 4_000, "origin": "sim", "location": "node1:memory"},
    {"state_id": "D", "label": "d", "size_bytes": 50, "ts_ns": 7_000, "origin": "sim", "location": "node1:memory"},
    {"state_id": "F", "label": "out.csv", "size_bytes": 100, "ts_ns": 9_000, "origin": "merge",
     "location": "node1:disk1"},
]
FIG6_MUTATIONS = [
    {"src_state_id": "A", "dst_state_id": "B", "kind": "SPLIT", "application": "split"},
    {"src_state_id": "A", "dst_state_id": "E", "kind": "SPLIT", "application": "split"},
    {"src_state_id": "B", "dst_state_id": "C", "kind": "TRANSFER", "application": "sim"},
    {"src_state_id": "C", "dst_state_id": "D", "kind": "CONVERT", "application": "sim"},
    {"src_state_id": "D", "dst_state_id": "F", "kind": "MERGE", "application": "merge"},
    {"src_state_id": "E", "dst_state_id": "F", "kind": "MERGE", "application": "merge"},
]


@pytest.fixture
def api(collector):
    http = httpx.Client(base_url=collector.address, timeout=30)
    run_id = http.post("/v1/runs", json={"name": "states"}).json()["run_id"]
    yield http, run_id, collector
    http.close()


def _counts(http, run_id) -> tuple[int, int]:
    s = http.get(f"/v1/runs/{run_id}/states", params={"limit": 100000}).json()["count"]
    m = http.get(f"/v1/runs/{run_id}/mutations", params={"limit": 100000}).json()["count"]
    return s, m


def test_post_get_filters_and_online_critical_path(api):
    http, run, collector = api
    r = http.post(f"/v1/runs/{run}/states", json=FIG6_STATES[0])  # a single object
    assert r.status_code == 201 and r.json()["states"] == 1
    r = http.post(f"/v1/runs/{run}/states", json=FIG6_STATES[1:])
    assert r.status_code == 201 and r.json()["states"] == 5
    r = http.post(f"/v1/runs/{run}/mutations", json=FIG6_MUTATIONS)
    assert r.status_code == 201 and r.json()["mutations"] == 6

    def ids(path, **params):
        r = http.get(f"/v1/runs/{run}/{path}", params=params)
        assert r.status_code == 200, r.text
        key = "states" if path == "states" else "mutations"
        return [row["state_id"] if key == "states" else (row["src_state_id"], row["dst_state_id"])
                for row in r.json()[key]]

    assert ids("states", location="node1:disk1") == ["A", "B", "F"]
    assert ids("states", origin="sim") == ["C", "D"]
    assert ids("states", application="split") == ["B", "E"]
    assert ids("states", label="out.csv") == ["F"]
    assert ids("states", ts_ns__gte=4000) == ["C", "D", "F"]
    assert ids("mutations", kind="MERGE") == [("D", "F"), ("E", "F")]
    assert ids("mutations", application="sim") == [("B", "C"), ("C", "D")]
    assert http.get(f"/v1/runs/{run}/states", params={"colour": "red"}).status_code == 400

    # repeating records unchanged is a no-op (a retried request)
    r = http.post(f"/v1/runs/{run}/states", json=FIG6_STATES)
    assert r.status_code == 201 and r.json() == {"states": 0, "mutations": 0, "repeated": 6}
    assert _counts(http, run) == (6, 6)

    cp = http.get(f"/v1/runs/{run}/critical-path").json()
    assert cp["ids"] == ["A", "B", "C", "D", "F"]
    assert cp["length_ns"] == 8_000
    # online equals offline over what is stored
    stored = flowscope.open_run(collector.store / run)
    assert data_state_path(stored.table("data_states"), stored.table("mutations")).ids == cp["ids"]

    # the path moves as new states arrive: G after F
    http.post(f"/v1/runs/{run}/states", json={"states": [{"state_id": "G", "ts_ns": 12_000, "size_bytes": 1}],
                                              "mutations": [{"src_state_id": "F", "dst_state_id": "G",
                                                             "kind": "TRANSFER"}]})
    assert http.get(f"/v1/runs/{run}/critical-path").json()["ids"] == ["A", "B", "C", "D", "F", "G"]


@pytest.mark.parametrize("body, field, where", [
    ({"states": [{"state_id": "X", "ts_ns": 5}], "mutations": [{"src_state_id": "A", "dst_state_id": "X",
                                                                "kind": "COPY"}]}, "kind", "'COPY'"),
    ({"states": [{"state_id": "X", "ts_ns": 5}], "mutations": [{"src_state_id": "nope", "dst_state_id": "X",
                                                                "kind": "CONVERT"}]}, "src_state_id", "'nope'"),
    ({"states": [{"state_id": "X", "ts_ns": 5}], "mutations": [{"src_state_id": "A", "dst_state_id": "gone",
                                                                "kind": "CONVERT"}]}, "dst_state_id", "'gone'"),
    ({"states": [{"state_id": "X", "ts_ns": 5, "size_bytes": 3}, {"state_id": "Y", "ts_ns": 6, "size_bytes": -1}],
      "mutations": []}, "size_bytes", "negative size -1"),
    ({"states": [{"state_id": "X", "ts_ns": 500}], "mutations": [{"src_state_id": "A", "dst_state_id": "X",
                                                                  "kind": "CONVERT"}]}, "dst_state_id", "older"),
    ({"states": [{"state_id": "X", "ts_ns": "soon"}], "mutations": []}, "ts_ns", "soon"),
    ({"states": [{"state_id": "A", "ts_ns": 1_001, "size_bytes": 100}], "mutations": []}, "state_id", "exists"),
    ({"states": [{"state_id": "X", "ts_ns": 5, "colour": "red"}], "mutations": []}, "colour", "unknown column"),
])
def test_every_refusal_is_422_naming_the_field_and_writes_nothing(api, body, field, where):
    http, run, _ = api
    assert http.post(f"/v1/runs/{run}/states", json=FIG6_STATES[:1]).status_code == 201  # A, ts 1000
    before = _counts(http, run)
    r = http.post(f"/v1/runs/{run}/states", json=body)
    assert r.status_code == 422, r.text
    doc = r.json()
    assert doc["field"] == field
    assert where in doc["error"] and field in doc["error"]
    assert _counts(http, run) == before  # the valid records of the request were not written either


def test_mutation_endpoint_checks_against_states_already_in_the_run(api):
    http, run, _ = api
    http.post(f"/v1/runs/{run}/states", json=FIG6_STATES[:2])
    r = http.post(f"/v1/runs/{run}/mutations", json=[{"src_state_id": "A", "dst_state_id": "B", "kind": "SPLIT"},
                                                       {"src_state_id": "B", "dst_state_id": "A", "kind": "SPLIT"}])
    assert r.status_code == 422
    assert r.json()["record"] == 1 and r.json()["field"] == "dst_state_id"
    assert _counts(http, run) == (2, 0)
    r = http.post(f"/v1/runs/{run}/mutations", json={"src_state_id": "A", "dst_state_id": "B", "kind": "SPLIT"})
    assert r.status_code == 201


def test_malformed_bodies(api):
    http, run, _ = api
    body = json.dumps(FIG6_STATES).encode()
    r = http.post(f"/v1/runs/{run}/states", content=body[: len(body) // 2],
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = http.post(f"/v1/runs/{run}/states", json=[1, 2])
    assert r.status_code == 422
    r = http.post(f"/v1/runs/{run}/states", json={"states": [], "edges": []})
    assert r.status_code == 422 and r.json()["field"] == "edges"
    assert http.post("/v1/runs/no-such-run/states", json=FIG6_STATES).status_code == 404
    assert _counts(http, run) == (0, 0)


def test_python_api_round_trip(collector, tmp_path):
    src = tmp_path / "input.txt"
    src.write_text("x" * 1000)
    with Client(collector.address, name="py-api", spool_dir=tmp_path / "spool") as client:
        ds = client.data_states()
        mem = ds.file_read(src, application="load")
        parts = ds.split(mem, [{"label": "half-0", "size_bytes": 500}, {"label": "half-1", "size_bytes": 500}],
                         application="scatter")
        merged = ds.merge(parts, application="gather", label="whole", size_bytes=1000)
        out = tmp_path / "output.txt"
        out.write_text("y" * 1234)
        written = ds.file_written(out, merged, application="save")
        with pytest.raises(DataStateError, match=r"kind: 'COPY' is not a mutation kind"):
            client.mutation(mem, merged, "COPY")
        with pytest.raises(DataStateError, match="negative size"):
            client.state(size_bytes=-5)
        with pytest.raises(DataStateError, match=r"dst_state_id.*older than its source"):
            client.mutation(written, mem, "CONVERT")
        with pytest.raises(DataStateError, match=r"src_state_id.*unknown state 'elsewhere'"):
            client.mutation("elsewhere", written, "CONVERT")  # checked by the collector, not locally
        # bulk: one all-or-nothing request on leaving the block
        with client.data_states(batch=1000) as bulk:
            prev = written
            for i in range(100):
                prev_new = bulk.state(f"bulk-{i}", size_bytes=i)
                bulk.mutation(prev, prev_new, "APPEND")
                prev = prev_new
        run_id = client.run_id
    run = flowscope.open_run(collector.store / run_id)
    states = run.table("data_states").set_index("state_id")
    assert int(states.loc[written, "size_bytes"]) == 1234
    assert int(states.loc[written, "ts_ns"]) == out.stat().st_mtime_ns
    src_state = [s for s in states.index if s.startswith("file:") and "input.txt" in s][0]
    assert int(states.loc[src_state, "size_bytes"]) == 1000
    kinds = run.table("mutations")["kind"].value_counts().to_dict()
    assert kinds == {"TRANSFER": 2, "SPLIT": 2, "MERGE": 2, "APPEND": 100}
    path = data_state_path(run.table("data_states"), run.table("mutations"))
    assert path.ids[:3] == [src_state, mem, parts[1]] and path.ids[-1] == "bulk-99"


def _step(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowscope.cli.step", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_flowscope_step_records_real_files(collector, tmp_path):
    http = httpx.Client(base_url=collector.address, timeout=30)
    run = http.post("/v1/runs", json={"name": "steps"}).json()["run_id"]
    raw = tmp_path / "raw.txt"
    raw.write_text("hello world\n" * 100)
    upper, a, b = tmp_path / "upper.txt", tmp_path / "a.txt", tmp_path / "b.txt"
    p = _step("prep", "--in", str(raw), "--out", str(upper), "--run", run, "--address", collector.address, "--",
              sys.executable, "-c", f"open({str(upper)!r}, 'w').write(open({str(raw)!r}).read().upper())")
    assert p.returncode == 0, p.stderr
    # joins through the environment, as under `flowscope run`; the exit status is the command's
    p = _step("split", "--in", str(upper), "--out", str(a), str(b), "--", "sh", "-c",
              f"head -c 600 {upper} > {a}; tail -c 600 {upper} > {b}; exit 3",
              env={"FLOWSCOPE_ADDRESS": collector.address, "FLOWSCOPE_RUN": run})
    assert p.returncode == 3, p.stderr
    p = _step("broken", "--in", str(tmp_path / "missing.txt"), "--run", run, "--address", collector.address,
              "--", "true")
    assert p.returncode == 1 and "missing.txt" in p.stderr and "does not exist" in p.stderr

    stored = flowscope.open_run(collector.store / run)
    states = stored.table("data_states")
    by_label = states.set_index("label")
    for f in (raw, upper, a, b):
        st = f.stat()
        assert int(by_label.loc[f.name, "size_bytes"]) == st.st_size
        assert int(by_label.loc[f.name, "ts_ns"]) == st.st_mtime_ns
    assert by_label.loc["upper.txt", "origin"] == "prep"
    muts = stored.table("mutations")
    label = dict(zip(states["state_id"], states["label"]))
    edges = sorted((label[s], label[d], k) for s, d, k in zip(muts["src_state_id"], muts["dst_state_id"], muts["kind"]))
    assert edges == [("raw.txt", "upper.txt", "CONVERT"), ("upper.txt", "a.txt", "SPLIT"),
                     ("upper.txt", "b.txt", "SPLIT")]
    spans = stored.sql("SELECT name, attrs FROM spans WHERE kind = 'step' ORDER BY start_ns")
    assert list(spans["name"]) == ["prep", "split"]
    assert json.loads(spans["attrs"].iloc[1])["exit_code"] == 3
    path = http.get(f"/v1/runs/{run}/critical-path").json()["ids"]
    assert [label[s] for s in path] in (["raw.txt", "upper.txt", "a.txt"], ["raw.txt", "upper.txt", "b.txt"])
    http.close()


def test_step_context_manager(tmp_path):
    src, out = tmp_path / "in.dat", tmp_path / "out.dat"
    src.write_bytes(b"\1" * 2048)
    client = Client("embedded", store=tmp_path / "store", name="cm")
    with step("double", inputs=[src], outputs=[out], client=client) as st:
        out.write_bytes(src.read_bytes() * 2)
    with pytest.raises(ZeroDivisionError):
        with step("fails", inputs=[out], outputs=[tmp_path / "never.dat"], client=client):
            1 / 0
    client.close()
    run = flowscope.open_run(client.run_dir)
    states = run.table("data_states").set_index("state_id")
    assert int(states.loc[st.output_states[0], "size_bytes"]) == 4096
    muts = run.table("mutations")
    assert list(muts["kind"]) == ["CONVERT"]
    spans = run.sql("SELECT name, attrs FROM spans WHERE kind = 'step' ORDER BY start_ns")
    assert list(spans["name"]) == ["double", "fails"]
    assert "ZeroDivisionError" in json.loads(spans["attrs"].iloc[1])["error"]
