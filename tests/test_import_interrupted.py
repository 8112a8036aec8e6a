"""An import killed with SIGKILL part way: `flowscope runs` and `show` say it was interrupted, and one command
resumes it (`flowscope import --resume RUN`) or removes it (`flowscope rm RUN`).

Real `flowscope import` processes. The kill comes at a point that is certain: the second file to import is a
named pipe nobody writes, so once run.json lists the first file as imported the process is stopped opening
the second one, and stays there until it is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flowscope


def _flowscope(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowscope", *args], capture_output=True, text=True,
                          timeout=timeout)


def _run_json(store: Path) -> dict | None:
    runs = [p for p in store.iterdir() if (p / "run.json").is_file()] if store.is_dir() else []
    if not runs:
        return None
    try:
        return json.loads((runs[0] / "run.json").read_text())
    except ValueError:  # caught between write and rename: impossible (atomic), but be plain about it
        return None


class StuckImport:
    """`flowscope import FILES... PIPE`, stopped opening PIPE once the files before it are imported."""

    def __init__(self, store: Path, files: list[Path], pipe: Path):
        os.mkfifo(pipe)
        self.proc = subprocess.Popen([sys.executable, "-m", "flowscope", "import", *map(str, files), str(pipe),
                                      "--format", "chrome", "--store", str(store)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while True:
            meta = _run_json(store)
            if meta is not None and len(meta.get("imports") or []) == len(files):
                break
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the import did not reach its second file"
            time.sleep(0.02)
        self.run_dir = Path(store) / meta["run_id"]
        self.run_id = meta["run_id"]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=30)


@pytest.fixture
def stuck_imports():
    started: list[StuckImport] = []

    def start(*args) -> StuckImport:
        started.append(StuckImport(*args))
        return started[-1]

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.kill()


def test_a_killed_import_is_reported_interrupted_and_resumes_to_the_same_rows(shared_data, tmp_path, stuck_imports):
    store = tmp_path / "store"
    first = shared_data / "chrome" / "viztracer" / "multithread.json"
    second = shared_data / "chrome" / "catapult" / "big_trace.json"
    pipe = tmp_path / "second.json"
    stuck = stuck_imports(store, [first], pipe)
    stuck.kill()  # kill -9 while it waits for the second file

    res = _flowscope("runs", "--store", str(store))
    assert res.returncode == 0, res.stderr
    assert "interrupted" in res.stdout and "running" not in res.stdout
    assert f"flowscope import --resume {stuck.run_id}" in res.stdout and f"flowscope rm {stuck.run_id}" in res.stdout
    listed = json.loads(_flowscope("runs", "--store", str(store), "--json").stdout)
    assert [m["status"] for m in listed] == ["interrupted"]
    res = _flowscope("show", stuck.run_id, "--store", str(store))
    assert res.returncode == 0, res.stderr
    assert "interrupted" in res.stdout and f"pid {stuck.proc.pid}" in res.stdout
    assert "1 of 2 files" in res.stdout and "--resume" in res.stdout

    # the second file becomes readable; resuming reads only what is missing
    pipe.unlink()
    pipe.symlink_to(second)
    res = _flowscope("import", "--resume", stuck.run_id, "--store", str(store), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [f["path"] for f in out["files"]] == [str(pipe)]
    assert [d["path"] for d in out["duplicates"]] == [str(first)]
    run = flowscope.open_run(stuck.run_dir)
    assert run.meta["status"] == "imported" and run.meta.get("importing") is None
    assert [Path(i["path"]).name for i in run.meta["imports"]] == [first.name, second.name]
    assert not [p for p in run.path.iterdir() if p.name.startswith(".import-")]
    # the same rows as an import that was never interrupted
    res = _flowscope("import", str(first), str(second), "--store", str(tmp_path / "clean"), "--json")
    assert res.returncode == 0, res.stderr
    assert run.counts() == flowscope.open_run(json.loads(res.stdout)["run_dir"]).counts()
    assert "interrupted" not in _flowscope("runs", "--store", str(store)).stdout


def test_rm_removes_an_interrupted_import_and_refuses_a_live_one(shared_data, tmp_path, stuck_imports):
    store = tmp_path / "store"
    first = shared_data / "chrome" / "viztracer" / "multithread.json"
    killed = stuck_imports(store, [first], tmp_path / "a.json")
    killed.kill()
    live = stuck_imports(tmp_path / "store2", [first], tmp_path / "b.json")  # still importing

    res = _flowscope("rm", str(live.run_dir))
    assert res.returncode == 1 and f"being imported by pid {live.proc.pid}" in res.stderr, res.stderr
    assert live.run_dir.is_dir()
    res = _flowscope("import", "--resume", str(live.run_dir))
    assert res.returncode == 1 and f"pid {live.proc.pid}" in res.stderr, res.stderr

    res = _flowscope("rm", killed.run_id, "--store", str(store))
    assert res.returncode == 0, res.stderr
    assert f"removed run {killed.run_id}" in res.stdout and not killed.run_dir.exists()
    assert "no runs" in _flowscope("runs", "--store", str(store)).stdout


def test_rm_refuses_a_run_a_collector_may_still_be_writing_unless_forced(tmp_path):
    with flowscope.Client(name="live", store=tmp_path / "store") as fs:
        fs.span("work", 1, 2)
        run_dir = fs.run_dir
        res = _flowscope("rm", str(run_dir))
        assert res.returncode == 1 and "running" in res.stderr and "--force" in res.stderr, res.stderr
        assert run_dir.is_dir()
    finished = _flowscope("rm", str(run_dir))
    assert finished.returncode == 0, finished.stderr
    assert not run_dir.exists()


def test_resume_refuses_a_run_that_has_no_interrupted_import(shared_data, tmp_path):
    store = tmp_path / "store"
    res = _flowscope("import", str(shared_data / "chrome" / "viztracer" / "multithread.json"), "--store", str(store),
                     "--json")
    run_id = json.loads(res.stdout)["run_id"]
    res = _flowscope("import", "--resume", run_id, "--store", str(store))
    assert res.returncode == 1 and f"run {run_id} has no interrupted import" in res.stderr, res.stderr
    res = _flowscope("import", "--resume", run_id, "x.json", "--store", str(store))
    assert res.returncode == 1 and "--resume" in res.stderr
