"""Capture levels on Dask's local schedulers (docs/dask.md, "Capture levels"): at ``standard`` (the default) a
task's I/O counters are read only when its call took 1 ms or more, and the I/O of shorter calls is charged to the
next measured call on that thread, marked as the distributed capture marks it (the span's ``io``: ``own`` or
``next``; the io rows' ``tasks``: how many calls they carry); at ``full`` every task has its own reading. The
level is chosen the same way as for a cluster: ``observe(level=...)``, ``flowscope run --level``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flowscope

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dask_local_chain as chain  # the script the runs execute, importable for observe()


def _records(run) -> tuple[dict, list, object]:
    """(task key -> span attrs, the task spans' thread resources, the proc-io write rows with their attrs)."""
    spans = run.sql("SELECT task_key, resource_id, attrs FROM spans WHERE kind = 'task'")
    attrs = {k: json.loads(a) for k, a in zip(spans["task_key"], spans["attrs"])}
    writes = run.sql("""SELECT task_key, resource_id, nbytes, attrs FROM io
                        WHERE source = 'proc-io' AND op = 'write'""")
    writes["attrs"] = [json.loads(a) for a in writes["attrs"]]
    return attrs, sorted(set(spans["resource_id"])), writes


def check_standard(run, seen: dict) -> None:
    """Each task's I/O is in exactly one reading of its thread: its own call's, when the call was measured
    (``io = own``), else that of the next measured call, or the rows with no task written when the graph ended."""
    order, sizes = seen["order"], seen["sizes"]
    attrs, threads, writes = _records(run)
    assert set(attrs) == set(order)
    assert len(threads) == 1, "the chain ran on one thread"
    assert {a["io"] for a in attrs.values()} <= {"own", "next"}
    assert attrs["long"]["io"] == "own", "a call of 20 ms is measured"
    assert any(attrs[k]["io"] == "next" for k in order), f"{len(order) - 1} one-write tasks: some took under 1 ms"
    assert set(writes["resource_id"]) == set(threads)
    by_task = {k: (a["tasks"], int(n)) for k, a, n in zip(writes["task_key"], writes["attrs"], writes["nbytes"])
               if isinstance(k, str)}
    deferred, since = 0, 0
    for key in order:
        since += sizes[key]
        if attrs[key]["io"] == "next":
            assert key not in by_task, f"{key} was not measured, yet has rows of its own"
            deferred += 1
            continue
        assert key in by_task, f"{key} was measured and wrote: its rows"
        tasks, nbytes = by_task.pop(key)
        assert tasks == deferred + 1, (key, tasks, deferred)
        # its own bytes and those of the calls charged to it, not the next task's
        assert since <= nbytes < since + chain.SHORT, (key, nbytes, since)
        deferred, since = 0, 0
    assert not by_task, f"rows of tasks that are not in the chain: {by_task}"
    end = writes[writes["task_key"].isna()]
    if deferred:  # calls after the last measured one: recorded when the graph ended, with no task
        assert len(end) == 1 and end["attrs"].iloc[0]["tasks"] == deferred
        assert since <= int(end["nbytes"].iloc[0]) < since + chain.SHORT
    else:
        assert end.empty
    assert int(writes["nbytes"].sum()) >= sum(sizes.values()), "no byte is lost"


def check_full(run, seen: dict) -> None:
    """Every task has its own reading: one write row of its own bytes, no ``io`` or ``tasks`` marks."""
    order, sizes = seen["order"], seen["sizes"]
    attrs, _threads, writes = _records(run)
    assert set(attrs) == set(order)
    assert not any("io" in a for a in attrs.values())
    assert sorted(writes["task_key"]) == sorted(order), "one write row per task, none without a task"
    for key, a, nbytes in zip(writes["task_key"], writes["attrs"], writes["nbytes"]):
        assert "tasks" not in a
        assert sizes[key] <= int(nbytes) < sizes[key] + chain.SHORT, (key, nbytes)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_at_standard_a_short_calls_io_is_charged_to_the_next_measured_call_on_its_thread(tmp_path, scheduler):
    with flowscope.observe(store=tmp_path / "store", hardware_period=0) as obs:  # the default level: standard
        seen = chain.run(scheduler, str(tmp_path))
    assert obs.hook_errors == {"local": 0}
    assert obs.run.meta["capture_level"] == "standard"
    check_standard(obs.run, seen)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_at_full_every_local_task_has_its_own_io_rows(tmp_path, scheduler):
    with flowscope.observe(store=tmp_path / "store", hardware_period=0, level="full") as obs:
        seen = chain.run(scheduler, str(tmp_path))
    assert obs.hook_errors == {"local": 0}
    check_full(obs.run, seen)


def test_at_standard_the_processes_scheduler_still_reads_each_task(tmp_path):
    """A worker process has no moment at which a graph's pending calls could be read, so each task is read
    there at both levels; at standard its rows say so (``io = own``, ``tasks = 1``)."""
    with flowscope.observe(store=tmp_path / "store", hardware_period=0) as obs:
        seen = chain.run("processes", str(tmp_path))
    assert obs.hook_errors == {"local": 0}
    attrs, _threads, writes = _records(obs.run)
    assert set(attrs) == set(seen["order"])
    assert {a["io"] for a in attrs.values()} == {"own"}
    assert sorted(writes["task_key"]) == sorted(seen["order"])
    for key, a, nbytes in zip(writes["task_key"], writes["attrs"], writes["nbytes"]):
        assert a["tasks"] == 1 and seen["sizes"][key] <= int(nbytes) < seen["sizes"][key] + chain.SHORT


def test_at_standard_task_io_false_leaves_io_out_and_marks_nothing(tmp_path):
    with flowscope.observe(store=tmp_path / "store", hardware_period=0, task_io=False) as obs:
        seen = chain.run("sync", str(tmp_path))
    attrs, _threads, writes = _records(obs.run)
    assert set(attrs) == set(seen["order"]) and writes.empty
    assert not any("io" in a for a in attrs.values())


@pytest.mark.parametrize("level", ["standard", "full"])
def test_flowscope_run_level_selects_the_local_capture_level(tmp_path, level):
    out = tmp_path / "seen.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSCOPE_", "DASK_"))}
    store = tmp_path / "store"
    given = [] if level == "standard" else ["--level", level]  # standard: the default
    res = subprocess.run([sys.executable, "-m", "flowscope", "run", "--store", str(store), "--no-report", "--quiet",
                          "--sample-period", "0", *given, "--", sys.executable, str(HERE / "dask_local_chain.py"),
                          "threads", str(tmp_path), str(out)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    [run_dir] = [p for p in store.iterdir() if p.is_dir()]
    run = flowscope.open_run(run_dir)
    assert run.meta["capture_level"] == level
    (check_standard if level == "standard" else check_full)(run, json.loads(out.read_text()))


def _write_then_fail(path: str, n: int, *_deps) -> int:
    chain.write_bytes(path, n)
    raise ValueError("after writing")


@pytest.mark.parametrize("level", ["standard", "full"])
def test_the_io_of_a_task_that_raised_is_kept(tmp_path, level):
    from dask.local import get_sync

    path = str(tmp_path / "out.bin")
    dsk = {"ok": (chain.write_bytes, path, chain.SHORT), "boom": (_write_then_fail, path, chain.LONG, "ok")}
    with flowscope.observe(store=tmp_path / "store", hardware_period=0, level=level) as obs, \
            pytest.raises(ValueError, match="after writing"):
        get_sync(dsk, "boom")
    attrs, _threads, writes = _records(obs.run)
    assert attrs["boom"]["state"] == "erred"
    assert int(writes["nbytes"].sum()) >= chain.SHORT + chain.LONG, "no byte is lost"
    if level == "full":  # its own reading, as for a task that returned
        own = writes[writes["task_key"] == "boom"]
        assert len(own) == 1 and chain.LONG <= int(own["nbytes"].iloc[0]) < chain.LONG + chain.SHORT
