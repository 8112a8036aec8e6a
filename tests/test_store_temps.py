"""Temp files of writers sharing one store: a collector never deletes the temp file of a writer that is still
writing (a second collector on the same store, a spool replay, an import); it deletes those of writers that
are dead, when it starts. Real writer processes: each stops between writing its temp file and renaming it,
so the moment the other writer acts is certain."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

import flowscope

#: a real writer: the store's own write_segment, holding its temp file until the test says go
_WRITER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import pyarrow as pa
    from flowscope.store import layout

    run_dir, segment, announce, release = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    real_replace = os.replace

    def held_replace(src, dst):
        if str(src).endswith(".tmp") and str(dst).endswith(".parquet"):
            announce.write_text(str(src))
            while not release.exists():
                time.sleep(0.01)
        return real_replace(src, dst)

    os.replace = held_replace
    spans = pa.table({"resource_id": ["held-writer"], "kind": ["call"], "name": ["held"],
                      "start_ns": pa.array([1], pa.int64()), "end_ns": pa.array([2], pa.int64())})
    from flowscope.model.conform import conform
    assert layout.write_segment(run_dir, "spans", segment, conform("spans", spans))
    print("renamed")
""")


@pytest.fixture
def held_writers():
    """Starts HeldWriter processes; kills those still running when the test ends."""
    started: list[HeldWriter] = []

    def start(run_dir: Path, segment: str, workdir: Path) -> HeldWriter:
        started.append(HeldWriter(run_dir, segment, workdir))
        return started[-1]

    yield start
    for w in started:
        if w.proc.poll() is None:
            w.kill()


class HeldWriter:
    """A process writing one segment of ``run_dir``, stopped after its temp file is written."""

    def __init__(self, run_dir: Path, segment: str, workdir: Path):
        self.announce = workdir / f"{segment}.announce"
        self.release = workdir / f"{segment}.release"
        self.proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(run_dir), segment, str(self.announce),
                                      str(self.release)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not (self.announce.exists() and self.announce.read_text()):
            assert self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.01)
        self.temp = Path(self.announce.read_text())
        assert self.temp.is_file()

    def finish(self) -> tuple[int, str]:
        self.release.write_text("go")
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out + err

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def _swept(address: str) -> int:
    """How many dead writers' files the collector at ``address`` removed when it started (waits for it)."""
    with httpx.Client(base_url=address, timeout=30) as http:
        while (n := http.get("/v1/health").json()["dead_temps_removed"]) is None:
            time.sleep(0.02)
    return n


def _open_and_write(address: str, run_id: str, rows: int) -> None:
    with httpx.Client(base_url=address, timeout=30) as http:
        http.post("/v1/runs", json={"run_id": run_id, "name": "shared"}).raise_for_status()
        records = [{"resource_id": "collector-client", "kind": "call", "name": "second", "start_ns": i,
                    "end_ns": i + 1} for i in range(rows)]
        r = http.post(f"/v1/runs/{run_id}/tables/spans", json=records)
        assert r.status_code == 200, r.text


def test_a_second_collector_opening_a_run_leaves_a_live_writers_temp_file_alone(collector_factory, held_writers,
                                                                                 tmp_path):
    store = tmp_path / "store"
    first = collector_factory(store=store)
    run_id = "20260101-000000-shared"
    _open_and_write(first.address, run_id, 3)
    run_dir = store / run_id
    held = held_writers(run_dir, "held-by-a-live-writer", tmp_path)  # writer 1: mid-write
    second = collector_factory(store=store)  # writer 2 starts on the same store ...
    assert _swept(second.address) == 0
    _open_and_write(second.address, run_id, 5)  # ... and opens the same run
    _open_and_write(first.address, run_id, 7)
    assert held.temp.is_file(), "the live writer's temp file was deleted"
    code, output = held.finish()
    assert code == 0 and "renamed" in output, output
    run = flowscope.open_run(run_dir)
    assert run.counts()["spans"] == 3 + 5 + 7 + 1
    assert sorted(run.table("spans")["name"].unique()) == ["held", "second"]
    assert not list(run_dir.glob("*/.*.tmp"))


def test_a_collector_deletes_dead_writers_temp_files_when_it_starts_and_only_theirs(collector_factory, held_writers,
                                                                                    tmp_path):
    from flowscope.store.layout import temp_path
    from flowscope.store.writers import WriterId

    store = tmp_path / "store"
    first = collector_factory(store=store)
    run_id = "20260101-000000-sweep"
    _open_and_write(first.address, run_id, 2)
    run_dir = store / run_id
    dead = held_writers(run_dir, "held-by-a-dead-writer", tmp_path)
    dead.kill()  # SIGKILL between its temp write and its rename
    live = held_writers(run_dir, "held-by-a-live-writer", tmp_path)
    # a writer on another host of a shared file system: its liveness cannot be known here
    elsewhere = WriterId(host="another-node", pid=dead.proc.pid, started_ms=1)
    remote = temp_path(run_dir / "spans" / "remote.parquet", elsewhere)
    remote.write_bytes(b"being written on another-node")

    _open_and_write(first.address, run_id, 3)  # opening a run deletes nothing
    assert dead.temp.is_file() and live.temp.is_file() and remote.is_file()

    restarted = collector_factory(store=store)  # a collector starting: the dead writer's temp file goes
    assert _swept(restarted.address) == 1
    assert not dead.temp.exists()
    assert live.temp.is_file() and remote.is_file()
    code, output = live.finish()
    assert code == 0 and "renamed" in output, output
    assert flowscope.open_run(run_dir).counts()["spans"] == 2 + 3 + 1


def test_a_writers_identity_tells_a_dead_process_from_a_live_one(tmp_path):
    from flowscope.store.writers import WriterId

    me = WriterId.current()
    assert me.alive() is True
    assert WriterId.from_token(me.token) == WriterId(me.host_tag, me.pid, me.started_ms)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    import psutil

    started = round(psutil.Process(child.pid).create_time() * 1000)
    assert WriterId(me.host, child.pid, started).alive() is True
    assert WriterId(me.host, child.pid, started - 60_000).alive() is False  # the pid, reused by another process
    child.kill()
    child.wait()
    assert WriterId(me.host, child.pid, started).alive() is False
    assert WriterId("another-node", child.pid, started).alive() is None  # cannot be known from here
