"""The compiled per-task path of the local-scheduler capture (``sources/dask/_local_tasks.c``) against its pure-Python
reference (``compiled=False``, ``FLOWSCOPE_COMPILED=0``): both store the same rows for the same real Dask graphs on
each local scheduler, keys of every form Dask accepts and a task that raises included. Times differ between two
runs of a graph, and on the threads and processes schedulers so does which thread or process ran a task: those are
compared as the checks of the run say they must hold, not for equality."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from dask.callbacks import Callback

import flowscope

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dask_local_keys as keys_graph

SCHEDULERS = ("sync", "threads", "processes")


def _get(scheduler: str):
    if scheduler == "sync":
        from dask.local import get_sync
        return get_sync
    if scheduler == "threads":
        from dask.threaded import get
        return get
    import functools

    from dask.multiprocessing import get
    return functools.partial(get, optimize_graph=False)  # no fusing: the graph's own keys, as on the other two


def _record(tmp_path: Path, monkeypatch, scheduler: str, compiled: bool, level: str) -> dict:
    """Run the keys graph and the failing graph on ``scheduler`` inside observe(); the rows the run stores."""
    monkeypatch.setenv("FLOWSCOPE_COMPILED", "1" if compiled else "0")
    get = _get(scheduler)
    from dask.local import get_sync

    expected = get_sync(*keys_graph.graph())  # unobserved
    store = tmp_path / ("compiled" if compiled else "reference")
    ran: list = []  # the tasks Dask says it ran, from a callback of its own beside flowscope's
    with flowscope.observe(store=store, hardware_period=0, level=level) as obs, \
            Callback(pretask=lambda key, dsk, state: ran.append(key)):
        assert obs.local_compiled is compiled
        dsk, out = keys_graph.graph()
        assert get(dsk, out) == expected
        dsk, out = keys_graph.failing_graph()
        with pytest.raises(KeyError, match="task failed on 2"):
            get(dsk, out)
    assert obs.hook_errors == {"local": 0}, obs.hook_errors
    run = obs.run
    spans = run.sql("""SELECT s.task_key, s.name, s.kind, s.span_id, s.parent_id, s.start_ns, s.end_ns, s.attrs,
                              r.kind AS rkind, r.name AS rname, r.pid, r.tid, r.thread_ident
                       FROM spans s LEFT JOIN resources r USING (resource_id) WHERE s.kind = 'task'""")
    rows = []
    for rec in spans.to_dict("records"):
        attrs = json.loads(rec.pop("attrs"))
        assert rec["start_ns"] <= rec["end_ns"] and rec["rkind"] == "thread"
        assert attrs.pop("thread_ident") == rec["thread_ident"], "the span's thread is its resource's"
        if level == "standard":
            assert attrs.pop("io", None) in ("own", "next", None)  # whether a call took 1 ms or more: the machine's load decides
        for field in ("start_ns", "end_ns", "thread_ident", "tid", "pid"):
            rec.pop(field)
        if scheduler != "sync":  # which pool thread or worker process ran the task
            rec.pop("rname")
        rows.append(json.dumps({**rec, "attrs": attrs}, sort_keys=True, default=str))
    deps = run.sql("SELECT task_key, depends_on FROM dependencies")
    logs = run.sql("""SELECT category, level, message, task_key, attrs FROM logs
                      WHERE category IN ('task-error', 'graph-submitted')""")
    logs["attrs"] = [json.dumps({k: v for k, v in json.loads(a).items() if k != "graph_id"}, sort_keys=True)
                     for a in logs["attrs"]]
    assert Counter(spans["task_key"]) == Counter(k if isinstance(k, str) else str(k) for k in ran), \
        "every task Dask ran, once"
    return {"spans": Counter(rows), "dependencies": Counter(zip(deps["task_key"], deps["depends_on"])),
            "logs": Counter(map(tuple, logs.astype(str).values.tolist())),
            "tasks": len(rows)}


# a worker process of the processes scheduler reads every task at both levels: standard covers it
@pytest.mark.parametrize(("scheduler", "level"), [("sync", "standard"), ("sync", "full"), ("threads", "standard"),
                                                  ("threads", "full"), ("processes", "standard")])
def test_compiled_and_reference_paths_store_the_same_rows(tmp_path, monkeypatch, scheduler, level):
    from flowscope.sources.dask import local

    assert local.COMPILED_AVAILABLE, "the compiled per-task path is built with the package (pip install -e .)"
    ref = _record(tmp_path, monkeypatch, scheduler, False, level)
    comp = _record(tmp_path, monkeypatch, scheduler, True, level)
    # the keys graph's tasks (Dask runs b"bytes-key" as data, not as a task), the failing graph's first task and
    # the task that raised
    dsk, _ = keys_graph.graph()
    assert ref["tasks"] == comp["tasks"] == len(dsk) - 1 + 2
    assert comp["spans"] == ref["spans"]
    assert comp["dependencies"] == ref["dependencies"]
    assert comp["logs"] == ref["logs"]
    names = {json.loads(r)["task_key"]: json.loads(r) for r in ref["spans"]}
    assert names["x-1"]["attrs"]["group"] == "x" and names["('x-1', 0)"]["attrs"]["group"] == "x-1"
    assert names['say "hi"\\-7']["attrs"]["group"] == 'say "hi"\\'
    assert names["('bad', 0)"]["attrs"]["state"] == "erred"


def test_the_compiled_path_follows_flowscope_compiled(monkeypatch):
    from flowscope.sources.dask.local import COMPILED_AVAILABLE, LocalSchedulerCapture

    monkeypatch.setenv("FLOWSCOPE_COMPILED", "0")
    assert LocalSchedulerCapture(None, io=False).compiled is False
    monkeypatch.delenv("FLOWSCOPE_COMPILED")
    assert LocalSchedulerCapture(None, io=False).compiled is COMPILED_AVAILABLE
    assert LocalSchedulerCapture(None, io=False, compiled=False).compiled is False


class _SlowFirstReading:
    """A thread I/O reader that takes a while (and lets other threads run) on each thread's first reading: the
    moment a thread registers itself with a graph, which must not let another thread take its place."""

    def __init__(self, inner):
        self.inner = inner

    def read_raw(self, tid):
        import time

        time.sleep(0.05)
        return self.inner.read_raw(tid)


@pytest.mark.parametrize("compiled", ["1", "0"])
def test_threads_registering_at_once_keep_their_own_tasks(tmp_path, monkeypatch, compiled):
    import threading

    import dask
    from dask import delayed

    from flowscope.sources.dask import local

    monkeypatch.setenv("FLOWSCOPE_COMPILED", compiled)
    monkeypatch.setattr(local, "_READER", _SlowFirstReading(local._READER))

    def where(i):
        return i, threading.get_native_id()

    parts = [delayed(where, pure=True)(i, dask_key_name=f"where-{i}") for i in range(16)]
    with flowscope.observe(store=tmp_path / "store") as obs:
        ran = dict(dask.compute(*parts, scheduler="threads", num_workers=4))
    spans = obs.run.sql("""SELECT s.task_key, r.tid FROM spans s JOIN resources r USING (resource_id)
                           WHERE s.task_key LIKE 'where-%'""")
    got = {int(k.split("-")[1]): int(t) for k, t in zip(spans["task_key"], spans["tid"])}
    assert got == ran


def test_compiled_keys_and_edges_equal_the_reference_on_every_kind_of_node():
    """A graph's keys as text and its (task, dependency) pairs, read in C once per computation, are the reference's
    values in the reference's order: tuple, str, empty and non-ASCII keys, a data node, a legacy task converted by
    Dask, a dependency the graph does not hold (named by str()), a node with no dependencies; errors the same. The
    pairs are positions: a task's in the graph's keys, a dependency outside the graph's after them, its text in the
    list of those."""
    from array import array

    from dask._task_spec import DataNode, List, Task, TaskRef, convert_legacy_graph

    from flowscope.sources.dask import _local_tasks
    from flowscope.sources.dask.local import _CompiledGraph, _GraphBase

    dsk, _ = keys_graph.graph()
    graph = convert_legacy_graph(dict(dsk))
    graph[("outside", 7)] = Task(("outside", 7), max, TaskRef(("not-in-graph", 1)), TaskRef(""))
    graph[""] = DataNode("", 3)
    graph["ünï"] = Task("ünï", sum, List(TaskRef(""), TaskRef(("outside", 7)), TaskRef("ünï-missing")))
    graph.pop(("not-in-graph", 1), None)
    assert any(isinstance(node, DataNode) for node in graph.values())

    texts = _local_tasks.key_texts(graph)
    assert texts == _GraphBase.key_texts(graph) and list(texts) == list(graph)
    assert all(type(v) is str for v in texts.values())
    keys = list(graph)
    pos = dict(zip(keys, range(len(keys))))

    class Ref:  # the reference's edges, with the positions the compiled path gets
        pass
    Ref.pos = pos
    want = _GraphBase.graph_edges(Ref, graph)
    got = _local_tasks.graph_edges(graph, pos, DataNode)
    assert got == want and got[3] >= 1
    src, dst, outside = array("i", got[0]), array("i", got[1]), got[2]
    assert len(src) == len(dst) == sum(len(node.dependencies) for node in graph.values())
    text = [texts[k] for k in keys] + outside
    pairs = {(text[a], text[b]) for a, b in zip(src, dst)}
    assert {("ünï", "ünï-missing"), ("ünï", ""), (str(("outside", 7)), str(("not-in-graph", 1)))} <= pairs
    assert sorted(outside) == sorted([str(("not-in-graph", 1)), "ünï-missing"])
    assert all(0 <= a < len(keys) for a in src) and max(dst) == len(keys) + len(outside) - 1

    # the Python class picks the C functions for a dict and the reference for anything else
    assert _CompiledGraph.key_texts(graph) == texts
    with pytest.raises(KeyError):  # a key pos lacks: the reference's KeyError
        _local_tasks.graph_edges(graph, {}, DataNode)

    class NoDeps:
        pass
    with pytest.raises(AttributeError, match="dependencies"):
        _local_tasks.graph_edges({"x": NoDeps()}, {"x": 0}, DataNode)
    with pytest.raises(TypeError):
        _local_tasks.key_texts([1, 2])


class _Key:
    def __str__(self) -> str:
        return "a key of its own"


#: tuple keys of every shape: what str() makes of them is what the compiled path must give, whichever way it takes
ODD_KEYS = [("a", 0), ("a",), (), ("it's", 1), ('say "hi"', 2), ("back\\slash", 3), ("tab\there", 4), ("ünï", 5),
            ("x", -7), ("x", -(2 ** 63)), ("x", 2 ** 63 - 1), ("x", 2 ** 70), ("x", 1.5), ("x", True), ("x", None),
            ("x", ("nested", 1)), ("x", b"by"), (1, 2), ("\x7f", 1), ("\x1f", 1), ("", 0), ("long" * 200, 1),
            ("x",) + tuple(range(40)), ("a", "b", "c"), (_Key(), 1), ("x", 10 ** 19), ("x", 0)]


@pytest.mark.parametrize("key", ODD_KEYS, ids=range(len(ODD_KEYS)))
def test_compiled_key_texts_are_str_of_every_shape_of_tuple_key(key):
    from flowscope.sources.dask import _local_tasks

    assert _local_tasks.key_texts({key: 1}) == {key: str(key)}


@pytest.mark.parametrize("compiled", [True, False])
def test_dask_hands_a_task_to_its_pool_without_calling_the_capture(compiled):
    """The capture wraps a graph's tasks once, when Dask hands it the graph's state (``start_state``), not one by one
    as the scheduler's loop hands them to the pool (``pretask``): per task, the loop calls it once (``posttask``)."""
    from flowscope.sources.dask.local import LocalSchedulerCapture

    start, start_state, pretask, posttask, finish = LocalSchedulerCapture(None, io=False, compiled=compiled)._callback
    assert pretask is None
    assert None not in (start, start_state, posttask, finish)


@pytest.mark.parametrize("compiled", ["1", "0"])
def test_a_task_dask_reruns_locally_after_it_raised_is_one_span(tmp_path, monkeypatch, compiled):
    """With ``rerun_exceptions_locally`` Dask runs a task that raised a second time, in the scheduler's thread: the
    capture records the task once, as the call that failed in the pool."""
    import dask
    from dask import delayed

    monkeypatch.setenv("FLOWSCOPE_COMPILED", compiled)

    def boom(x):
        raise ZeroDivisionError(x)

    with flowscope.observe(store=tmp_path / "store", hardware_period=0) as obs, \
            dask.config.set(rerun_exceptions_locally=True):
        with pytest.raises(ZeroDivisionError):
            delayed(boom)(delayed(abs)(-1, dask_key_name="abs"), dask_key_name="boom").compute(scheduler="threads")
    spans = obs.run.sql("SELECT task_key, attrs FROM spans WHERE kind = 'task' ORDER BY task_key")
    assert list(spans["task_key"]) == ["abs", "boom"]
    assert [json.loads(a)["state"] for a in spans["attrs"]] == ["memory", "erred"]
    assert obs.hook_errors == {"local": 0}


@pytest.mark.parametrize("compiled", ["1", "0"])
def test_a_profiler_beside_flowscope_keeps_tasks_not_the_capture_tables(tmp_path, monkeypatch, compiled):
    """dask.diagnostics.Profiler keeps each task it saw in the graph: flowscope's wrapper, once the graph is
    wrapped. After the computation the wrapper still reads as the task, and its graph lets go of the tables only
    its rows needed (the keys, their positions and texts), which would otherwise live as long as the Profiler."""
    import dask
    from dask import delayed
    from dask.diagnostics import Profiler

    monkeypatch.setenv("FLOWSCOPE_COMPILED", compiled)
    parts = [delayed(abs)(-i, dask_key_name=f"abs-{i}") for i in range(50)]
    with flowscope.observe(store=tmp_path / "store", hardware_period=0), Profiler() as prof:
        assert dask.compute(*parts, scheduler="threads") == tuple(range(50))
    assert len(prof.results) == 50
    for r in prof.results:
        assert repr(r.task) == f"<Task {r.key!r} abs({-int(r.key.split('-')[1])})>"
        assert r.task.key == r.key
        graph = getattr(r.task, "graph", None)
        if graph is not None:  # flowscope's wrapper, not the task: its graph has ended
            assert graph.live in (False, 0)
            assert (len(graph.keys), len(graph.pos), len(graph.names), graph.key_text) == (0, 0, 0, None)
