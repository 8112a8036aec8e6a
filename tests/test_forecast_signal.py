"""Event-occurrence signals (analysis/forecast/signal.py): counts equal to the resource-state timeline's at
every sampled instant, on a schedule recorded by hand and on a real StarPU trace; the paper's sampling
rate and its caps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import flowscope
from flowscope.analysis.forecast.signal import EVENTS, event_signal, run_signal, run_tasks
from flowscope.analysis.timeline import resource_states
from flowscope.importers import import_paths
from flowscope.store.run import open_run

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


@pytest.fixture
def known_run(tmp_path):
    """Three single-slot threads and a two-slot node with a known schedule over [0, 20 ms):
    a: task 0-10, transfer 10-14; b: io 2-6, task 6-20; c: task 4-8; node (2 slots): task 0-20 on one slot."""
    with flowscope.Client(store=tmp_path / "store", name="known") as fs:
        for r in ("a", "b", "c"):
            fs.resource("thread", r)
        fs.resource("node", "n", attrs={"cpu_cores": 2})
        for name, kind, rid, s, e in [("t1", "task", "a", 0, 10), ("x", "transfer", "a", 10, 14),
                                      ("r", "io", "b", 2, 6), ("t2", "task", "b", 6, 20),
                                      ("t3", "task", "c", 4, 8), ("t4", "task", "n", 0, 20)]:
            fs.span(name, T0 + s * MS, T0 + e * MS, kind=kind, resource_id=rid)
        run_dir = fs.run_dir
    return open_run(run_dir)


def test_signal_of_a_known_schedule_has_the_known_counts_at_the_papers_rate(known_run):
    idle = run_signal(known_run, "idle")
    # idle changes at 2, 4, 8 and 14 ms: shortest gap 2 ms, so one sample per ms (twice the inverse)
    assert idle.min_gap_ns == 2 * MS and idle.period_ns == 1 * MS and idle.capped_by is None
    assert idle.resources == 5  # three threads, the node's two slots (one never used)
    assert idle.t0_ns == T0 and len(idle.counts) == 20
    assert idle.times_ns.tolist() == [T0 + k * MS for k in range(20)]
    assert idle.counts.tolist() == [c + 1 for c in [2, 2, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]]
    compute = run_signal(known_run, "compute")
    assert compute.counts.tolist() == [c + 1 for c in [1, 1, 1, 1, 2, 2, 3, 3, 2, 2] + [1] * 10]
    comm = run_signal(known_run, "communication")  # changes at 10 and 14: gaps 10, 4, 6 ms -> 2 ms period
    assert comm.period_ns == 2 * MS and comm.counts.tolist() == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    io = run_signal(known_run, "io")
    assert io.period_ns == 1 * MS and io.counts.tolist() == [0, 0, 1, 1, 1, 1] + [0] * 14
    assert run_tasks(known_run) == 4


def test_signal_equals_a_direct_count_of_the_timeline_on_a_real_starpu_trace(tmp_path, shared_data):
    res = import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], tmp_path / "store")
    run = open_run(res.run_dir)
    states = resource_states(run)
    assert len(states) and set(states["state"]) & {"compute", "idle"}
    lanes = states[["resource_id", "slot"]].drop_duplicates().shape[0]
    seen = 0
    for event in EVENTS:
        sig = run_signal(run, event, states=states)
        assert sig.resources >= lanes
        t = sig.times_ns
        assert len(t) == len(sig.counts) and t[0] == states["start_ns"].min() and t[-1] < states["end_ns"].max()
        pick = np.unique(np.linspace(0, len(t) - 1, min(len(t), 3000)).astype(int))
        m = states["state"] == event
        s, e = states.loc[m, "start_ns"].to_numpy(), states.loc[m, "end_ns"].to_numpy()
        direct = np.array([int(((s <= x) & (x < e)).sum()) for x in t[pick]]) + (
            sig.resources - lanes if event == "idle" else 0)
        assert sig.counts[pick].tolist() == direct.tolist(), event
        seen += int(direct.sum() > 0)
    assert seen >= 2  # the trace has idle and compute time at least


def _states(rows):
    return pd.DataFrame(rows, columns=["resource_id", "slot", "start_ns", "end_ns", "state", "group", "role"])


def test_a_one_nanosecond_gap_is_capped_not_sampled_at_a_gigahertz():
    # two resources whose idle states start 1 ns apart over 1 ms: the paper's rule asks for 2e9 samples/s
    st = _states([("a", 0, 0, 500_000, "compute", None, None), ("a", 0, 500_000, 1_000_000, "idle", None, None),
                  ("b", 0, 0, 500_001, "compute", None, None), ("b", 0, 500_001, 1_000_000, "idle", None, None)])
    sig = event_signal(st, "idle")
    assert sig.min_gap_ns == 1 and sig.nyquist_period_ns == 0.5
    assert sig.capped_by == "max_rate_hz" and sig.period_ns == 1000.0 and len(sig.counts) == 1000
    assert sig.counts[:500].sum() == 0 and sig.counts[501:].tolist() == [2] * 499
    # over a long span the number of samples is capped instead
    long = _states([("a", 0, 0, 10**10, "idle", None, None), ("b", 0, 0, 1, "compute", None, None),
                    ("b", 0, 1, 10**10, "idle", None, None)])
    sig = event_signal(long, "idle", max_samples=5000)
    assert sig.capped_by == "max_samples" and len(sig.counts) == 5000 and sig.period_ns == 10**10 / 5000
    assert sig.counts[0] == 1 and set(sig.counts[1:].tolist()) == {2}


def test_unknown_event_and_empty_run_are_refused_with_the_field_named(known_run):
    with pytest.raises(ValueError, match=r"event: unknown event kind 'sleeping'; known: idle, compute"):
        run_signal(known_run, "sleeping")
    with pytest.raises(ValueError, match="no executing resource"):
        event_signal(_states([]), "idle")


def test_a_single_slot_thread_whose_spans_overlap_is_still_one_resource(tmp_path):
    """A thread runs one thing at a time. Two of its task spans that overlap by a few milliseconds (seen on a real
    Dask worker: the end of one task and the start of the next stamped by different clocks) get a second lane in
    the timeline, which keeps their time; the signal still counts the thread once -- busy while either span runs --
    instead of as a second resource idle nearly all along, which would make "at least a quarter idle" certain."""
    with flowscope.Client(store=tmp_path / "store", name="overlap") as fs:
        fs.resource("thread", "a")
        fs.resource("thread", "b")
        for name, rid, s, e in [("t1", "a", 0, 10), ("t2", "a", 8, 16), ("t3", "a", 18, 20), ("t4", "b", 4, 12)]:
            fs.span(name, T0 + s * MS, T0 + e * MS, kind="task", resource_id=rid)
        run_dir = fs.run_dir
    run = open_run(run_dir)
    states = resource_states(run)
    assert states.loc[states["resource_id"] == "a", "slot"].nunique() == 2  # the timeline keeps the overlap
    idle = run_signal(run, "idle", period_ns=MS)
    assert idle.resources == 2
    # a: busy 0-16 and 18-20; b: busy 4-12
    assert idle.counts.tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 1, 1]
    compute = run_signal(run, "compute", period_ns=MS)
    assert compute.counts.tolist() == [2 - c for c in idle.counts.tolist()]
