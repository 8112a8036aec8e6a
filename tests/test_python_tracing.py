"""Selective Python function tracing: nested call spans, exclusive time, threads, only what is named."""

from __future__ import annotations

import importlib
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import flowscope
from flowscope import Client, open_run
from flowscope.analysis.anomalies import AnomalyConfig, calls_from_spans, detect
from flowscope.sources import python_tracing

MODULE = '''
import time
from pathlib import Path

def outer(n, slow=0.0):
    time.sleep(0.004)
    for i in range(n):
        inner(slow if i == 0 else 0.0)
    helper()
    return n

def inner(extra=0.0):
    time.sleep(0.002 + extra)

def helper():
    time.sleep(0.001)

class Solver:
    def step(self):
        inner()

    @staticmethod
    def check():
        return 1
'''


@pytest.fixture
def tracing(tmp_path):
    """A module of the user's written to disk, an embedded client receiving the spans, and cleanup."""
    name = f"user_mod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / f"{name}.py").write_text(textwrap.dedent(MODULE))
    sys.path.insert(0, str(tmp_path / "src"))
    client = python_tracing.start(Client("embedded", store=tmp_path / "store", name="trace-test"))
    finders = []

    def run():
        python_tracing.stop()
        client.close()
        return open_run(client.run_dir)

    yield name, finders, run
    for f in finders:
        f.remove()
    sys.path.remove(str(tmp_path / "src"))
    sys.modules.pop(name, None)
    python_tracing.stop()


def test_patterns_trace_only_the_named_functions_as_nested_spans(tracing):
    name, finders, finish = tracing
    finders.append(flowscope.trace_modules([f"{name}:outer", f"{name}:inn*", f"{name}:Solver.st*"]))
    mod = importlib.import_module(name)  # instrumented at import time
    assert sorted(finders[0].traced[name]) == ["Solver.step", "inner", "outer"]
    mod.outer(3)
    mod.Solver().step()
    assert mod.Solver.check() == 1
    spans = finish().table("spans").sort_values("start_ns")
    assert list(spans["name"]) == [f"{name}.outer", *[f"{name}.inner"] * 3, f"{name}.Solver.step", f"{name}.inner"]
    assert (spans["kind"] == "call").all()
    outer = spans.iloc[0]
    assert pd_null(outer["parent_id"])
    inner = spans[spans["name"] == f"{name}.inner"]
    assert list(inner["parent_id"][:3]) == [outer["span_id"]] * 3  # nested under the call that made them
    assert inner.iloc[3]["parent_id"] == spans.iloc[4]["span_id"]  # Solver.step -> inner
    assert spans["span_id"].is_unique
    # helper (not named) and Solver.check (not matched) were not traced
    assert not spans["name"].str.endswith(("helper", "check")).any()

    # exclusive time = inclusive minus the direct children's inclusive time
    calls = calls_from_spans(open_run_spans(spans))
    i = calls.functions.index(f"{name}.outer")
    row = int(np.flatnonzero(calls.func == i)[0])
    kids = inner["end_ns"][:3] - inner["start_ns"][:3]
    assert calls.exclusive[row] == (outer["end_ns"] - outer["start_ns"]) - int(kids.sum())
    assert calls.children[row] == 3 and calls.depth[row] == 0
    assert calls.exclusive[row] >= 5_000_000  # its own 4 ms sleep and the untraced helper's 1 ms


def pd_null(v) -> bool:
    import pandas as pd

    return v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v))


def open_run_spans(df):
    import pyarrow as pa

    from flowscope.model.schemas import SPANS

    return pa.Table.from_pandas(df.reset_index(drop=True), schema=SPANS, preserve_index=False)


def test_each_thread_has_its_own_stack(tracing):
    name, finders, finish = tracing
    mod = importlib.import_module(name)  # imported before: instrumented when trace_modules is called
    finders.append(flowscope.trace_modules(f"{name}:*"))
    barrier = threading.Barrier(3)

    def work():
        barrier.wait()
        mod.outer(4)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = finish().table("spans")
    outers = spans[spans["name"] == f"{name}.outer"]
    assert len(outers) == 3 and outers["resource_id"].nunique() == 3  # one thread resource each
    by_id = spans.set_index("span_id")
    inner = spans[spans["name"] == f"{name}.inner"]
    assert len(inner) == 12
    for _, r in inner.iterrows():  # the parent is the outer call of the same thread, which encloses it
        p = by_id.loc[r["parent_id"]]
        assert p["name"] == f"{name}.outer" and p["resource_id"] == r["resource_id"]
        assert p["start_ns"] <= r["start_ns"] and r["end_ns"] <= p["end_ns"]
    assert (spans["name"] == f"{name}.helper").sum() == 3  # '*' names helper too


def test_decorator_and_detection_on_exclusive_time(tracing, monkeypatch):
    name, finders, finish = tracing
    # the calls' durations are set, not slept: sleep jitter on a busy machine (tens of ms) would decide which
    # calls are unusual. The tracer reads this clock; each call's body advances it.
    now = [time.time_ns()]
    monkeypatch.setattr(python_tracing, "clock", lambda: now[0])

    def work(ns: int) -> None:
        now[0] += ns

    @flowscope.trace
    def step(i):
        work(1_000_000 + 20_000 * (i % 7))
        load(i, 60_000_000 if i == 25 else 0)  # one slowed child: its parent's exclusive time stays normal

    @flowscope.trace(name="load")
    def load(i, extra):
        work(2_000_000 + 30_000 * (i % 5) + extra)

    for i in range(60):
        step(i)
    run = finish()
    spans = run.arrow("spans")
    assert spans.num_rows == 120
    det = detect(spans, AnomalyConfig(algo="sstd"))
    flagged = det.anomalies.to_pylist()
    slow = [r for r in flagged if r["function"] == "load"]
    assert len(slow) == 1 and slow[0]["exclusive_ns"] >= 60_000_000 and slow[0]["depth"] == 1
    assert slow[0]["call_stack"][-1] == "load" and slow[0]["call_stack"][0].endswith("step")
    parent = slow[0]["parent_call_id"]
    # judged on exclusive time, the step that called the slowed load is normal, and so is every other call;
    # on inclusive time it is an anomaly too
    assert [r["call_id"] for r in flagged] == [slow[0]["call_id"]]
    incl = detect(spans, AnomalyConfig(algo="sstd", metric="inclusive")).anomalies
    assert set(incl["call_id"].to_pylist()) == {parent, slow[0]["call_id"]}


def test_bad_patterns_are_refused():
    with pytest.raises(ValueError, match="module glob"):
        flowscope.trace_modules(":f")
    with pytest.raises(ValueError, match="non-empty"):
        flowscope.trace_modules(["pkg", ""])


def test_overhead_per_call(tracing):
    """Printed, not asserted: the machine is shared."""
    name, finders, finish = tracing

    def plain(x):
        return x

    traced = flowscope.trace(plain)
    n = 50_000
    traced(0)
    best = {}
    for label, f in (("plain", plain), ("traced", traced)) * 3:
        t0 = time.perf_counter_ns()
        for i in range(n):
            f(i)
        best[label] = min(best.get(label, 1e18), (time.perf_counter_ns() - t0) / n)
    run = finish()
    assert run.counts()["spans"] == 3 * n + 1
    print(f"traced call: {best['traced']:.0f} ns, plain call {best['plain']:.0f} ns, "
          f"overhead {best['traced'] - best['plain']:.0f} ns per call")


def test_flowscope_run_trace_pattern(tmp_path):
    """`flowscope run --trace` traces the named functions in the command's Python process, nothing else."""
    import os
    import subprocess

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "cli_mod.py").write_text(textwrap.dedent(MODULE))
    script = tmp_path / "app" / "main.py"
    script.write_text("import cli_mod\ncli_mod.outer(2)\n")
    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(flowscope.__file__).parents[1])])}
    out = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(store), "--no-report", "--quiet",
                          "--sample-period", "0", "--trace", "cli_mod:outer", "--trace", "cli_mod:inner", "--",
                          sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (run_dir,) = [p for p in store.iterdir() if (p / "run.json").exists()]
    spans = open_run(run_dir).table("spans")
    calls = spans[spans["kind"] == "call"].sort_values("start_ns")
    assert list(calls["name"]) == ["cli_mod.outer", "cli_mod.inner", "cli_mod.inner"]
    assert (calls["parent_id"].iloc[1:] == calls["span_id"].iloc[0]).all()

    bad = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(store), "--trace", ":x", "--",
                          sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "module glob" in bad.stderr
