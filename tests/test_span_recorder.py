"""The compiled span recorder (client/span_recorder.py) stores, value for value, what the pure-Python packer
stores, refuses what it refuses with the same message, and the client falls back to the pure-Python path when
the extension is not built."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import weakref

import hypothesis
import numpy as np
import pytest
from test_client_span import SPAN_ARGS

import flowscope
from flowscope.client import span_recorder
from flowscope.model.conform import SchemaError

T0 = 1_700_000_000_000_000_000
LO, HI = -(2**63), 2**63 - 1

pytestmark = pytest.mark.skipif(not span_recorder.AVAILABLE, reason="the compiled span recorder is not built")


class StrSub(str):
    """A str subclass: stored as a plain str."""


def _client(tmp_path, label: str, compiled: bool, **kw) -> flowscope.Client:
    fs = flowscope.Client(store=tmp_path / label / "store", spool_dir=tmp_path / label / "spool", name=label,
                          compiled=compiled, **kw)
    assert fs.compiled is compiled
    return fs


def _stored(fs: flowscope.Client, default_rids: dict[str, str] | None = None) -> list[tuple]:
    """The client's stored spans as sorted tuples, each thread's default resource id replaced by a label."""
    spans = flowscope.open_run(fs.run_dir).table("spans")
    rows = []
    for rec in spans.to_dict("records"):
        rec = {k: (None if v is None or (isinstance(v, float) and np.isnan(v)) else v) for k, v in rec.items()}
        rec["resource_id"] = (default_rids or {}).get(rec["resource_id"], rec["resource_id"])
        rows.append(tuple(rec[c] if not isinstance(rec[c], (np.integer,)) else int(rec[c])
                          for c in flowscope.TABLES["spans"].names))
    return sorted(rows, key=repr)


def _produce(fs: flowscope.Client, t: int, n: int) -> str:
    """Records of every kind the per-record API takes, through Client.span, Client.timed, the row writer and
    Client.emit; returns the thread's own resource id (the default)."""
    span, row, rid = fs.span, fs.row_writer("spans"), fs.thread_resource()
    for i in range(t * n, (t + 1) * n):
        s = T0 + 1_000 * i
        kind = ("task", "call", StrSub("io"), "tâche")[i % 4]
        name = f"fn-{i % 13}" if i % 5 else f"unique-{i}-名前"
        key = None if i % 3 == 0 else f"key-{i}-é" if i % 7 == 0 else f"key-{i}"
        attrs = (None, '{"raw": 1}', {"i": i, "nested": [1, "x"]}, {"f": 0.5}, "")[i % 5]
        which = i % 6
        if which == 0:
            span(name, s, s + i % 1000, kind=kind, task_key=key, attrs=attrs)
        elif which == 1:
            span(name, np.int64(s), s + 7, kind=kind, resource_id=f"r{t}", span_id=i, parent_id=None if i % 2 else i - 1,
                 task_key=key)
        elif which == 2:
            span(name=name, start_ns=s, end_ns=s, resource_id="", attrs=attrs)  # "" is the default resource too
        elif which == 3:
            row(i, -i, StrSub(f"r{t}"), kind, name, s, s + 1, key, attrs)
        elif which == 4:
            fs.emit("spans", span_id=None, parent_id=HI, resource_id=f"r{t}", kind=kind, name=name, start_ns=s,
                    end_ns=s + 2, task_key=StrSub("sub") if key else None, attrs=attrs)
        else:
            span(name, LO + i, HI - i, kind=kind, task_key="", span_id=LO if i % 2 else HI)
    return rid


def _run(fs: flowscope.Client, threads: int, n: int) -> dict[str, str]:
    rids: dict[str, str] = {}

    def go(t: int) -> None:
        rids[_produce(fs, t, n)] = f"thread-{t}"

    ts = [threading.Thread(target=go, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    fs.close()
    assert len(rids) == threads
    return rids


def test_compiled_and_pure_python_paths_store_the_same_rows_from_several_threads(tmp_path):
    """Small batches (so batches fill, are taken by the filling thread and by the builder, and the string
    dictionaries restart many times), 4 threads, every kind of value; the two stores hold the same rows."""
    n, threads = 3_000, 4
    stored = {}
    for compiled in (True, False):
        fs = _client(tmp_path, f"compiled-{compiled}", compiled, flush_records=97, flush_interval=0.005)
        stored[compiled] = _stored(fs, _run(fs, threads, n))
        assert fs.stats["batches_sent"] > threads * n // 150  # batches of at most 97 records, or the builder's
    assert len(stored[True]) == threads * n
    assert stored[True] == stored[False]
    by_key = {r[5]: r for r in stored[True]}  # start_ns is unique but in the LO..HI rows
    first = by_key[T0 + 2_000 * 1]  # i = 2: name= / start_ns= / end_ns= keywords, resource "" -> the default
    assert first[2] == "thread-0" and first[4] == "fn-2" and first[3] == "call"
    assert json.loads(by_key[T0 + 1_000 * 2][8]) == {"i": 2, "nested": [1, "x"]}


def test_a_bad_record_is_refused_with_the_pure_python_message_and_the_records_around_it_are_kept(tmp_path):
    bad = [
        lambda fs: fs.span("f", T0 + 10, T0 + 9),                                  # ends before it starts
        lambda fs: fs.span("f", float(T0), T0 + 1),                                # a float, even integral
        lambda fs: fs.span("f", T0, T0 + 1, span_id=True),
        lambda fs: fs.span("f", T0, 2**63),
        lambda fs: fs.span(["f"], T0, T0 + 1),
        lambda fs: fs.span("f", T0, T0 + 1, kind=None),
        lambda fs: fs.span("f", T0, T0 + 1, task_key=3),
        lambda fs: fs.row_writer("spans")(None, None, None, "call", "f", T0, T0 + 1, None, None),
        lambda fs: fs.row_writer("spans")(None, None, "r", "call", "f", T0 + 1, T0, None, None),
        lambda fs: fs.emit("spans", resource_id="r", kind="call", name="f", start_ns=T0, end_ns=np.float64(T0)),
    ]
    messages = {}
    for compiled in (True, False):
        fs = _client(tmp_path, f"compiled-{compiled}", compiled)
        fs.span("before", T0, T0 + 1)
        got = []
        for call in bad:
            with pytest.raises(SchemaError) as err:
                call(fs)
            got.append(str(err.value))
        fs.span("after", T0 + 2, T0 + 3)
        fs.close()
        assert sorted(flowscope.open_run(fs.run_dir).table("spans")["name"]) == ["after", "before"]
        messages[compiled] = got
    assert messages[True] == messages[False]
    assert messages[True][0] == f"spans.end_ns: ends before it starts (start_ns {T0 + 10}, end_ns {T0 + 9})"
    assert messages[True][1].startswith("spans.start_ns: expected an int64 (ns), got float")


def test_a_value_that_is_not_unicode_text_is_refused_naming_its_column(tmp_path):
    fs = _client(tmp_path, "surrogate", True)
    with pytest.raises(SchemaError, match=r"spans\.task_key: is not valid Unicode text"):
        fs.span("f", T0, T0 + 1, task_key="a\ud800b")
    fs.span("ok", T0, T0 + 1)
    fs.close()
    assert list(flowscope.open_run(fs.run_dir).table("spans")["name"]) == ["ok"]


def test_the_recorder_takes_the_arguments_the_pure_python_method_takes(tmp_path):
    fs = _client(tmp_path, "args", True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        fs.span("f", T0, T0, colour="red")
    with pytest.raises(TypeError, match="multiple values for argument 'name'"):
        fs.span("f", T0, T0, name="g")
    with pytest.raises(TypeError, match="missing required argument 'end_ns'"):
        fs.span("f", T0)
    with pytest.raises(TypeError, match="positional arguments"):
        fs.span("f", T0, T0, "task")
    args, kwargs = ("f", T0, T0 + 5), {"kind": "task", "span_id": 1}
    fs.span(*args, **kwargs)  # through tp_call, not vectorcall
    with fs.timed("block", kind="step"):
        pass
    fs.close()
    spans = flowscope.open_run(fs.run_dir).table("spans").sort_values("name")
    assert list(spans["name"]) == ["block", "f"] and list(spans["kind"]) == ["step", "task"]


def test_each_new_thread_records_on_its_own_resource_even_when_its_thread_ident_is_reused(tmp_path):
    """Thread idents are reused once a thread ends: the recorder finds a thread's buffer through the thread's own
    state, so a new thread never writes to an ended thread's buffer or resource."""
    fs = _client(tmp_path, "reuse", True)
    seen = []

    def one(i: int) -> None:
        fs.span(f"t{i}", T0 + i, T0 + i)
        seen.append((threading.get_ident(), fs.thread_resource()))

    for i in range(20):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        t.join()
    fs.close()
    run = flowscope.open_run(fs.run_dir)
    spans = run.table("spans").sort_values("start_ns")
    assert list(spans["resource_id"]) == [rid for _, rid in seen]
    assert len(set(spans["resource_id"])) == 20
    assert set(spans["resource_id"]) <= set(run.table("resources")["resource_id"])


def test_a_closed_client_is_freed(tmp_path):
    """The recorder and the per-thread buffers refer back to the client; the cycle is collectable, and the weak
    references the threads keep do not hold the client."""
    fs = _client(tmp_path, "freed", True)
    fs.span("f", T0, T0 + 1)
    t = threading.Thread(target=fs.span, args=("g", T0, T0 + 1))
    t.start()
    t.join()
    buffer = weakref.ref(fs._local.packers["spans"])
    fs.close()
    gone = weakref.ref(fs)
    del fs
    gc.collect()
    assert gone() is None and buffer() is None


def test_the_buffers_go_to_arrow_without_a_copy():
    """take() hands out the C buffers' memory: the Arrow arrays read it where the recorder wrote it."""
    b = span_recorder.SpanBuffer(flush_rows=10**6, rid="r")
    for i in range(1000):
        b.add(i, None, "r", "call", f"f{i % 3}", T0 + i, T0 + i + 1, f"k{i}", None)
    raw = b._take()
    assert len(b) == 0 and b._take() is None
    starts = raw[13]
    table = span_recorder._to_arrow(raw)
    view = memoryview(starts)
    assert table.column("start_ns").chunk(0).buffers()[1].address == np.frombuffer(view, np.uint8).ctypes.data
    assert table.column("start_ns").to_pylist() == [T0 + i for i in range(1000)]
    assert table.column("name").to_pylist() == [f"f{i % 3}" for i in range(1000)]
    assert table.column("parent_id").null_count == 1000 and table.column("attrs").null_count == 1000


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A compiled and a pure-Python client, both recording on this thread's resource, never flushing by themselves."""
    base = tmp_path_factory.mktemp("pair")
    clients = []
    for compiled in (True, False):
        fs = _client(base, f"compiled-{compiled}", compiled, flush_records=10**6, flush_interval=3600)
        fs.span("warm", T0, T0)
        fs._local.packers["spans"].take()
        clients.append(fs)
    yield clients
    for fs in clients:
        fs.close()


@hypothesis.settings(max_examples=400, deadline=None, derandomize=True, database=None)
@hypothesis.given(kw=SPAN_ARGS)
def test_compiled_span_records_and_refuses_exactly_what_the_pure_python_span_does(kw, pair):
    """Each call's outcome (recorded, or the refusal's message) and the row stored are the same on both paths."""
    clients = pair
    outcomes = []
    for fs in clients:
        try:
            fs.span(kw["name"], kw["start_ns"], kw["end_ns"], kind=kw["kind"], resource_id=kw["resource_id"],
                    task_key=kw["task_key"], attrs=kw["attrs"], span_id=kw["span_id"], parent_id=kw["parent_id"])
            outcomes.append(("recorded", None))
        except SchemaError as exc:
            outcomes.append(("refused", str(exc)))
    assert outcomes[0] == outcomes[1], kw
    if outcomes[0][0] == "recorded":
        got = [fs._local.packers["spans"].take() for fs in clients]
        assert got[0].equals(got[1]), kw


FALLBACK = '''
import sys
sys.modules["flowscope.client._span_recorder"] = None  # as if the extension had not been built
import flowscope
from flowscope.client import span_recorder
assert not span_recorder.AVAILABLE
fs = flowscope.Client(sys.argv[1], name="fallback")
assert not fs.compiled and "span" not in vars(fs)
fs.span("f", 1, 2, kind="task", task_key="k", attrs={"a": 1})
fs.row_writer("spans")(None, None, "r", "call", "g", 3, 4, None, None)
try:
    fs.span("bad", 2, 1)
except ValueError as exc:  # SchemaError
    print("refused:", exc)
try:
    flowscope.Client(sys.argv[1], name="must-be-compiled", compiled=True)
except ImportError as exc:
    print("no extension:", type(exc).__name__)
fs.close()
print("pandas" in sys.modules)
'''

COMPILED = '''
import sys
import flowscope
fs = flowscope.Client(sys.argv[1], name="compiled")
assert fs.compiled and type(fs.span).__name__ == "Recorder"
for i in range(1000):
    fs.span("f", i, i + 1, kind="task", task_key=f"k{i}", attrs={"i": i} if i % 2 else None)
with fs.timed("block"):
    pass
fs.row_writer("spans")(None, None, "r", "call", "g", 3, 4, None, None)
fs.emit("spans", resource_id="r", kind="call", name="h", start_ns=5, end_ns=6)
fs.close()
print("pandas" in sys.modules)
'''


def _runs(collector, tmp_path):
    return [flowscope.open_run(p) for p in sorted((tmp_path / "store").iterdir()) if (p / "run.json").exists()]


def test_without_the_extension_the_client_records_in_pure_python(collector, tmp_path):
    out = subprocess.run([sys.executable, "-c", FALLBACK, collector.address], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "refused: spans.end_ns: ends before it starts (start_ns 2, end_ns 1)"
    assert lines[1:] == ["no extension: ImportError", "False"]
    (run,) = [r for r in _runs(collector, tmp_path) if r.counts().get("spans")]
    spans = run.table("spans").sort_values("name")
    assert list(spans["name"]) == ["f", "g"] and spans["attrs"].iloc[0] == '{"a": 1}'


def test_a_process_recording_through_the_compiled_path_does_not_import_pandas(collector, tmp_path):
    out = subprocess.run([sys.executable, "-c", COMPILED, collector.address], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
    (run,) = _runs(collector, tmp_path)
    assert run.counts()["spans"] == 1003
