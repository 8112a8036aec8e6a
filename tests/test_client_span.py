"""Client.span, the per-record hot path, records exactly what the generic path (Client.emit) records and
refuses exactly what it refuses; a row writer records into the buffer of the thread that calls it."""

from __future__ import annotations

import threading

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import flowscope
from flowscope.model.conform import SchemaError

T0 = 1_700_000_000_000_000_000
INT64 = st.integers(-(2**63), 2**63 - 1)


class StrSub(str):
    """A str subclass: stored as a plain str."""


def _value(kind: str):
    """Values of every type a caller might pass where ``kind`` is expected, good and bad."""
    bad = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.just([1]), st.just({"a": 1}),
                    st.just(b"x"), st.integers(2**63, 2**70), st.integers(-(2**70), -(2**63) - 1),
                    st.builds(np.int64, INT64), st.builds(np.float64, st.floats(-1e3, 1e3)), st.just(np.bool_(True)))
    good = {"int": st.one_of(INT64, st.integers(T0, T0 + 10**6)),
            "str": st.one_of(st.sampled_from(["f", "g", "task", "r"]), st.text(max_size=5),
                             st.builds(StrSub, st.sampled_from(["f", "r"]))),
            "attrs": st.one_of(st.none(), st.just('{"a": 1}'), st.just({"n": 1}), st.just({"p": [1, "x"]}))}[kind]
    return st.one_of(good, good, bad)


SPAN_ARGS = st.fixed_dictionaries({
    "name": _value("str"), "start_ns": _value("int"), "end_ns": _value("int"), "kind": _value("str"),
    "resource_id": st.one_of(st.none(), _value("str")), "task_key": st.one_of(st.none(), _value("str")),
    "attrs": _value("attrs"), "span_id": st.one_of(st.none(), _value("int")),
    "parent_id": st.one_of(st.none(), _value("int"))})


def _outcome(call) -> tuple[str, object]:
    try:
        call()
    except SchemaError as exc:
        return "refused", str(exc)
    return "recorded", None


def test_span_records_and_refuses_exactly_what_emit_does(tmp_path):
    fs = flowscope.Client(store=tmp_path / "store", spool_dir=tmp_path / "spool", name="fast-slow")
    fs.span("warm", T0, T0)  # the thread's buffers and resource exist before the comparison
    rid = fs.thread_resource()
    outcomes: list[tuple[str, object]] = []

    @hypothesis.settings(max_examples=600, deadline=None, derandomize=True, database=None)
    @hypothesis.given(SPAN_ARGS)
    def check(kw):
        fast = _outcome(lambda: fs.span(kw["name"], kw["start_ns"], kw["end_ns"], kind=kw["kind"],
                                        resource_id=kw["resource_id"], task_key=kw["task_key"], attrs=kw["attrs"],
                                        span_id=kw["span_id"], parent_id=kw["parent_id"]))
        slow = _outcome(lambda: fs.emit("spans", **{**kw, "resource_id": kw["resource_id"] or rid}))
        assert fast == slow, kw
        outcomes.append(fast)

    check()
    assert {o for o, _ in outcomes} == {"recorded", "refused"}  # both paths were exercised
    fs.close()
    spans = flowscope.open_run(fs.run_dir).table("spans")
    recorded = sum(o == "recorded" for o, _ in outcomes)
    assert len(spans) == 1 + 2 * recorded
    rows = spans[spans["name"] != "warm"].sort_values(["start_ns", "end_ns", "name"], kind="stable")
    # each accepted call was stored twice, once per path, with the same values
    pairs = rows.astype(str).value_counts()
    assert (pairs % 2 == 0).all()


def test_span_from_many_threads_with_unique_names_loses_nothing(tmp_path):
    """Small batches and a string dictionary that fills up and is reset while the builder takes batches."""
    fs = flowscope.Client(store=tmp_path / "store", spool_dir=tmp_path / "spool", name="unique", flush_records=64,
                          flush_interval=0.01)
    n, threads = 20_000, 4

    def produce(t: int) -> None:
        for i in range(t * n, (t + 1) * n):
            fs.span(f"fn-{i}", T0 + i, T0 + i + 1, kind=f"k{i % 3}", task_key=f"key-{i}",
                    attrs={"i": i} if i % 7 == 0 else None)

    ts = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    fs.close()
    spans = flowscope.open_run(fs.run_dir).table("spans")
    assert len(spans) == n * threads
    i = spans["start_ns"].astype("int64") - T0
    assert (spans["name"] == "fn-" + i.astype(str)).all()
    assert (spans["task_key"] == "key-" + i.astype(str)).all()
    assert (spans["kind"] == "k" + (i % 3).astype(str)).all()
    assert (spans["attrs"].notna() == (i % 7 == 0)).all()
    assert sorted(i) == list(range(n * threads))


def test_a_row_writer_called_from_another_thread_writes_to_that_threads_buffer(tmp_path):
    fs = flowscope.Client(store=tmp_path / "store", spool_dir=tmp_path / "spool", name="writer")
    got = []
    t = threading.Thread(target=lambda: got.append(fs.row_writer("spans")))
    t.start()
    t.join()
    assert fs.flush(30)  # the builder has seen the thread end and let go of its empty buffers
    write = got[0]
    write(None, None, "r", "call", "after-its-thread-ended", T0, T0 + 1, None, None)
    with pytest.raises(SchemaError, match=r"spans\.end_ns: ends before it starts"):
        write(None, None, "r", "call", "reversed", T0 + 1, T0, None, None)
    fs.close()
    assert list(flowscope.open_run(fs.run_dir).table("spans")["name"]) == ["after-its-thread-ended"]


def test_closing_a_client_frees_its_per_thread_state_without_the_garbage_collector(tmp_path):
    """CPython 3.11 deadlocks when a threading.local is freed by a garbage collection that starts inside
    sys._current_frames() (cpython#106883: both hold the interpreter's thread list lock), and Dask's worker
    profiler calls sys._current_frames() every 10 ms: a Dask worker plugin's closed client once hung a worker
    that way. A client's per-thread state goes when it closes, by reference counting, never by the collector."""
    import gc
    import weakref

    gc.disable()
    try:
        fs = flowscope.Client(store=tmp_path / "store", name="closing")
        t = threading.Thread(target=lambda: fs.span("f", T0, T0 + 1))
        t.start()
        t.join()
        fs.span("g", T0, T0 + 2)
        local = weakref.ref(fs._local)
        fs.close()
        assert local() is None, "the closed client's threading.local is left for the garbage collector"
    finally:
        gc.enable()
