"""Corrupted Darshan logs and OTF2 archives: every seeded byte flip gives a successful import or a TraceError
naming the file, never a crash of the process. Each import runs in a child process (this file run as a
script), so a crash fails the test instead of killing pytest; a child that dies is restarted after the
flip that killed it, so every flip is tried and every crash counted."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

#: seeded flips per Darshan log (48 logs) and per OTF2 archive; each format's fuzz stays well under 40 s
DARSHAN_FLIPS = 12
OTF2_FLIPS = 120


# ---- corruption (shared by the test and the child) ----------------------------------------------------
def flip_bytes(data: bytearray, rng: random.Random) -> list[int]:
    """XOR 1 to 4 bytes at random offsets with a random non-zero mask; the offsets changed."""
    where = sorted(rng.sample(range(len(data)), min(len(data), rng.randint(1, 4))))
    for i in where:
        data[i] ^= rng.randint(1, 255)
    return where


def corrupt_darshan(log: Path, seed: int, out_dir: Path) -> tuple[Path, str]:
    rng = random.Random(f"{log.name}:{seed}")
    data = bytearray(log.read_bytes())
    where = flip_bytes(data, rng)
    out = out_dir / f"{seed}-{log.name}"
    out.write_bytes(bytes(data))
    return out, f"{log.name} bytes {where}"


def corrupt_otf2(archive: Path, seed: int, out_dir: Path) -> tuple[Path, str]:
    """A copy of the archive with bytes flipped in its global definitions or one location's event file."""
    rng = random.Random(f"otf2:{seed}")
    dst = out_dir / f"otf2-{seed}"
    shutil.copytree(archive, dst)
    for p in dst.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    targets = sorted([dst / "traces.def", *(dst / "traces").glob("*.evt")])
    target = rng.choice(targets)
    data = bytearray(target.read_bytes())
    where = flip_bytes(data, rng)
    target.write_bytes(bytes(data))
    return dst / "traces.otf2", f"{target.relative_to(dst)} bytes {where}"


# ---- the child: imports one job after another, one JSON line each -------------------------------------
def _child(jobs_file: str, first: int) -> None:
    from flowscope.importers import TraceError, import_paths

    jobs = json.loads(Path(jobs_file).read_text())
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    for i in range(first, len(jobs)):
        kind, src, seed = jobs[i]
        corrupt = corrupt_darshan if kind == "darshan" else corrupt_otf2
        path, what = corrupt(Path(src), seed, work)
        print(json.dumps({"i": i, "start": what, "file": str(path)}), flush=True)
        try:
            import_paths([path], work / "store")
            res = {"i": i, "result": "ok"}
        except TraceError as exc:
            res = {"i": i, "result": "trace_error", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - reported: anything but TraceError fails the test
            res = {"i": i, "result": "other", "message": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(res), flush=True)
    shutil.rmtree(work, ignore_errors=True)


def run_jobs(jobs: list[tuple[str, str, int]], tmp: Path, env: dict | None = None) -> list[dict]:
    """Every job's outcome; a child killed by a signal (or exiting without an answer) counts as a crash of the
    job it had started, and a new child goes on with the next job."""
    jobs_file = tmp / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    results: dict[int, dict] = {}
    first = 0
    while first < len(jobs):
        proc = subprocess.run([sys.executable, __file__, str(jobs_file), str(first)], capture_output=True,
                              text=True, env=env, timeout=600)
        started: dict | None = None
        for line in proc.stdout.splitlines():
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if "start" in rec:
                started = rec
            else:
                results[rec["i"]] = {**started, **rec}
                started = None
        if started is None and proc.returncode == 0:
            break
        if started is None:
            raise AssertionError(f"fuzz child failed before a job: rc={proc.returncode}\n{proc.stderr[-3000:]}")
        sig = -proc.returncode if proc.returncode < 0 else None
        results[started["i"]] = {**started, "result": "crash", "returncode": proc.returncode,
                                 "signal": signal.Signals(sig).name if sig else None,
                                 "stderr": proc.stderr[-500:]}
        first = started["i"] + 1
    return [results[i] for i in sorted(results)]


def check(results: list[dict], n_jobs: int) -> dict[str, int]:
    assert len(results) == n_jobs
    bad = [r for r in results if r["result"] in ("crash", "other")]
    assert not bad, f"{len(bad)} of {n_jobs} corrupted inputs crashed or raised a non-TraceError:\n" + \
        "\n".join(json.dumps(r) for r in bad[:10])
    for r in results:
        if r["result"] == "trace_error":
            assert r["file"] in r["message"], r
    return {k: sum(r["result"] == k for r in results) for k in ("ok", "trace_error")}


# ---- Darshan -----------------------------------------------------------------------------------------
def darshan_logs(shared: Path) -> list[Path]:
    return sorted(p for p in (shared / "darshan").rglob("*.darshan") if p.stat().st_size)


def test_darshan_seeded_byte_flips_never_crash(shared_data, tmp_path):
    pytest.importorskip("darshan", reason="PyDarshan (pip install darshan) reads Darshan logs")
    logs = darshan_logs(shared_data)
    assert len(logs) >= 40
    jobs = [("darshan", str(log), seed) for log in logs for seed in range(DARSHAN_FLIPS)]
    t = time.monotonic()
    counts = check(run_jobs(jobs, tmp_path), len(jobs))
    print(f"darshan: {len(jobs)} corrupted logs in {time.monotonic() - t:.1f} s: {counts}")
    # most flips land in compressed data, which the checksums reject
    assert counts["trace_error"] > len(jobs) // 2


def test_otf2_seeded_byte_flips_never_crash(shared_data, tmp_path):
    pytest.importorskip("otf2", reason="the otf2 Python bindings read OTF2 archives")
    archive = shared_data / "otf2" / "ping-pong-otf2"
    jobs = [("otf2", str(archive), seed) for seed in range(OTF2_FLIPS)]
    t = time.monotonic()
    counts = check(run_jobs(jobs, tmp_path), len(jobs))
    print(f"otf2: {len(jobs)} corrupted archives in {time.monotonic() - t:.1f} s: {counts}")
    assert counts["trace_error"] > 0


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
