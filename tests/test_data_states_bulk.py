"""The bulk data-state path: DataStates.add with whole tables, delivered as one Arrow request (states and
mutations streams back to back) to a real collector process; all-or-nothing on refusal."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import flowscope
from flowscope import Client
from flowscope.analysis.critical_path import data_state_path
from flowscope.client.data_states import DataStateError


def _chain(n: int, prefix: str, t0: int = 1_000) -> tuple[pa.Table, pa.Table]:
    """n states in a chain (each CONVERTed from the one before), plus a MERGE of the two last into one."""
    ids = [f"{prefix}{i}" for i in range(n)]
    states = pa.table({"state_id": ids, "label": ids, "size_bytes": pa.array(np.arange(n) * 10, pa.int64()),
                       "ts_ns": pa.array(t0 + np.arange(n) * 1_000, pa.int64()),
                       "origin": ["gen"] * n, "location": ["node1:memory"] * n})
    mutations = pa.table({"src_state_id": ids[:-1], "dst_state_id": ids[1:], "kind": ["CONVERT"] * (n - 1),
                          "application": ["step"] * (n - 1)})
    return states, mutations


def test_bulk_tables_land_whole_and_feed_the_online_path(collector, tmp_path):
    n = 5_000
    states, mutations = _chain(n, "s")
    with Client(collector.address, name="bulk", spool_dir=tmp_path / "spool") as client:
        with client.data_states(batch=100_000) as ds:
            ds.add(states, mutations)
        run_id = client.run_id
    run = flowscope.open_run(collector.store / run_id)
    got_s, got_m = run.table("data_states"), run.table("mutations")
    assert len(got_s) == n and len(got_m) == n - 1
    assert sorted(got_s["state_id"]) == sorted(states.column("state_id").to_pylist())
    assert got_s.set_index("state_id").loc["s17", "size_bytes"] == 170
    path = data_state_path(got_s, got_m)
    assert path.ids == [f"s{i}" for i in range(n)]
    import httpx
    online = httpx.get(f"{collector.address}/v1/runs/{run_id}/critical-path", timeout=60).json()
    assert online["ids"] == path.ids and online["length_ns"] == path.length_ns


@pytest.mark.parametrize("break_it, field", [
    (lambda s, m: (s, m.set_column(2, "kind", pa.array(["CONVERT"] * (m.num_rows - 1) + ["COPY"]))), "kind"),
    (lambda s, m: (s.set_column(2, "size_bytes", pa.array([-1] + [1] * (s.num_rows - 1), pa.int64())), m),
     "size_bytes"),
    (lambda s, m: (s.set_column(3, "ts_ns", pa.array(list(range(s.num_rows, 0, -1)), pa.int64())), m),
     "dst_state_id"),
])
def test_a_refused_bulk_batch_writes_nothing(collector, tmp_path, break_it, field):
    states, mutations = break_it(*_chain(300, "r"))
    with Client(collector.address, name="bulk-bad", spool_dir=tmp_path / "spool") as client:
        ds = client.data_states(batch=100_000)
        with pytest.raises(DataStateError, match=field):
            ds.add(states, mutations)
            ds.flush()
        run_id = client.run_id
    run = flowscope.open_run(collector.store / run_id)
    assert run.counts()["data_states"] == 0 and run.counts()["mutations"] == 0


def test_bulk_mutations_may_reference_states_already_in_the_run(collector, tmp_path):
    first, _ = _chain(10, "a")
    with Client(collector.address, name="bulk-2", spool_dir=tmp_path / "spool") as client:
        with client.data_states(batch=100_000) as ds:
            ds.add(first, None)
        later = pa.table({"state_id": ["b0"], "label": ["b0"], "size_bytes": pa.array([1], pa.int64()),
                          "ts_ns": pa.array([100_000], pa.int64()), "origin": ["x"], "location": ["node2:disk"]})
        link = pa.table({"src_state_id": ["a9"], "dst_state_id": ["b0"], "kind": ["TRANSFER"],
                         "application": ["copy"]})
        with client.data_states(batch=100_000) as ds:
            ds.add(later, link)
        with pytest.raises(DataStateError, match="src_state_id"):
            with client.data_states(batch=100_000) as ds:
                ds.add(None, pa.table({"src_state_id": ["nowhere"], "dst_state_id": ["b0"], "kind": ["TRANSFER"],
                                       "application": ["copy"]}))
        run_id = client.run_id
    run = flowscope.open_run(collector.store / run_id)
    assert run.counts()["data_states"] == 11 and run.counts()["mutations"] == 1
