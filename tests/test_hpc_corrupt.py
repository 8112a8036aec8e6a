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
from conftest import require_module

#: seeded flips per Darshan log (48 logs) and per OTF2 archive; each format's fuzz stays well under 40 s
DARSHAN_FLIPS = 16
OTF2_FLIPS = 150


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
    """A copy of the archive with bytes flipped in its global definitions, a location's local definitions
    or event file. (Not the anchor file: a lost string terminator there keeps the OTF2 library busy for
    about 15 s before it reports the error, which would dominate this test; docs/formats/otf2.md.)"""
    rng = random.Random(f"otf2:{seed}")
    dst = out_dir / f"otf2-{seed}"
    shutil.copytree(archive, dst)
    for p in dst.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    targets = sorted([dst / "traces.def", *(dst / "traces").glob("*.evt"), *(dst / "traces").glob("*.def")])
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
        t = time.perf_counter()
        try:
            import_paths([path], work / "store")
            res = {"i": i, "result": "ok"}
        except TraceError as exc:
            res = {"i": i, "result": "trace_error", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - reported: anything but TraceError fails the test
            res = {"i": i, "result": "other", "message": f"{type(exc).__name__}: {exc}"}
        res["seconds"] = round(time.perf_counter() - t, 3)
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
                              text=True, errors="replace", env=env, timeout=600)
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
    require_module("darshan", "PyDarshan reads Darshan logs: pip install -e '.[test]'")
    logs = darshan_logs(shared_data)
    assert len(logs) >= 40
    jobs = [("darshan", str(log), seed) for log in logs for seed in range(DARSHAN_FLIPS)]
    t = time.monotonic()
    counts = check(run_jobs(jobs, tmp_path), len(jobs))
    print(f"darshan: {len(jobs)} corrupted logs in {time.monotonic() - t:.1f} s: {counts}")
    # most flips land in compressed data, which the checksums reject
    assert counts["trace_error"] > len(jobs) // 2


def test_otf2_seeded_byte_flips_never_crash(shared_data, tmp_path):
    require_module("otf2", "the otf2 Python bindings read OTF2 archives: pip install -e '.[test]'")
    archive = shared_data / "otf2" / "ping-pong-otf2"
    jobs = [("otf2", str(archive), seed) for seed in range(OTF2_FLIPS)]
    t = time.monotonic()
    counts = check(run_jobs(jobs, tmp_path), len(jobs))
    print(f"otf2: {len(jobs)} corrupted archives in {time.monotonic() - t:.1f} s: {counts}")
    assert counts["trace_error"] > 0


# ---- Darshan: specific damage, specific messages -------------------------------------------------------
def _import_cli(path: Path, tmp: Path) -> subprocess.CompletedProcess:
    """``flowscope import`` in a child process: a crash shows as a negative return code, not a dead pytest."""
    return subprocess.run([sys.executable, "-m", "flowscope", "import", str(path), "--store", str(tmp / "store")],
                          capture_output=True, text=True, errors="replace", timeout=120)


def test_every_real_log_validates_with_the_regions_pydarshan_reports(shared_data):
    from darshan.backend import cffi_backend as be

    from flowscope.importers.darshan import validate

    for log in darshan_logs(shared_data):
        info = validate(log)
        handle = be.log_open(str(log))
        try:
            modules = be.log_get_modules(handle)
            version = be.log_get_job(handle)["log_ver"]
        finally:
            be.log_close(handle)
        ours = {k: length for k, (_, length) in info["regions"].items() if k not in ("job", "name records")}
        assert ours == {m: int(i["len"]) for m, i in modules.items()}, log
        assert info["version"] == version, log


def test_truncated_log_names_the_region_cut_off(shared_data, tmp_path):
    from flowscope.importers import TraceError
    from flowscope.importers.darshan import validate

    log = shared_data / "darshan" / "partial_data_dxt" / "partial_data_dxt.darshan"
    regions = validate(log)["regions"]
    data = log.read_bytes()
    for name, (off, length) in regions.items():
        cut = tmp_path / f"cut-{name.replace('/', '_')}.darshan"
        cut.write_bytes(data[:off + length // 2])  # half of this region is gone
        with pytest.raises(TraceError) as err:
            validate(cut)
        msg = str(err.value)
        assert str(cut) in msg and "at byte" in msg, msg
        # the region cut in half, or (for the job region, whose end is the name region's start) the next one
        assert f"(region {name})" in msg or "(region name records)" in msg, msg
    # the whole import, which used to abort in darshan_log_close, fails cleanly in a child process
    cut = tmp_path / "cut-import.darshan"
    off, length = regions["DXT_MPIIO"]
    cut.write_bytes(data[:off + 100])
    proc = _import_cli(cut, tmp_path)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert f"{cut}: region map says bytes {off}..{off + length}, outside the file's data" in proc.stderr
    assert "(region DXT_MPIIO)" in proc.stderr
    # cut inside the header
    cut.write_bytes(data[:200])
    with pytest.raises(TraceError, match=r"fewer than the 360-byte header of format 3\.21 at byte 200"):
        validate(cut)


def test_wrong_header_fields_are_named(shared_data, tmp_path):
    import struct

    from flowscope.importers import TraceError
    from flowscope.importers.darshan import validate

    log = shared_data / "darshan" / "release_logs" / "mpi-io-test-x86_64-3.5.0.darshan"
    data = log.read_bytes()
    regions = validate(log)["regions"]

    def broken(name: str, at: int, new: bytes) -> Path:
        out = tmp_path / f"{name}.darshan"
        out.write_bytes(data[:at] + new + data[at + len(new):])
        return out

    cases = [
        (broken("version", 0, b"9.99"), r"log format version '9\.99' is not one PyDarshan reads .* at byte 0 \(region header\)"),
        (broken("magic", 8, struct.pack("<q", 12345)), r"magic number is not Darshan's 6567223 at byte 8"),
        (broken("compression", 16, b"\x07"), r"compression type 7 is not zlib .* at byte 16 \(region header\)"),
    ]
    # the POSIX map entry (module id 1 in format 3.41: bytes 48+16) claims a length past the end of the file
    off, _ = regions["POSIX"]
    cases.append((broken("posix-length", 48 + 16, struct.pack("<QQ", off, len(data))),
                  r"region map says bytes .* outside the file's data .* at byte 64 \(region POSIX\)"))
    # MPI-IO's map entry moved onto POSIX's data
    cases.append((broken("overlap", 48 + 32, struct.pack("<QQ", off + 1, regions["MPI-IO"][1])),
                  r"overlapping region POSIX .* at byte 80 \(region MPI-IO\)"))
    for path, pattern in cases:
        with pytest.raises(TraceError, match=pattern) as err:
            validate(path)
        assert str(err.value).startswith(f"{path}: "), err.value


def test_flipped_compressed_byte_is_located_in_its_region(shared_data, tmp_path):
    from flowscope.importers import TraceError
    from flowscope.importers.darshan import validate

    log = shared_data / "darshan" / "nonmpi_dxt_anonymized" / "nonmpi_dxt_anonymized.darshan"
    data = log.read_bytes()
    for name, (off, length) in validate(log)["regions"].items():
        at = off + length // 3
        bad = tmp_path / f"flip-{name.replace('/', '_')}.darshan"
        bad.write_bytes(data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1:])
        with pytest.raises(TraceError) as err:
            validate(bad)
        msg = str(err.value)
        assert msg.startswith(f"{bad}: ") and msg.endswith(f"(region {name})"), msg
        where = int(msg.rsplit(" at byte ", 1)[1].split()[0])
        # zlib notices the damage at or after the flipped byte and at the latest at the end of the region
        assert at <= where <= off + length, (name, at, where, off + length)


# ---- OTF2: a definition value OTF2 does not define ------------------------------------------------------
def test_otf2_undefined_enum_value_in_definitions_is_a_trace_error(shared_data, tmp_path):
    require_module("otf2", "the otf2 Python bindings read OTF2 archives: pip install -e '.[test]'")
    src = shared_data / "otf2" / "ping-pong-otf2"
    dst = tmp_path / "archive"
    shutil.copytree(src, dst)
    defs = dst / "traces.def"
    defs.chmod(0o644)
    data = bytearray(defs.read_bytes())
    # byte 5905 of this archive's traces.def holds a region's role (a one-byte enum); 255 is no RegionRole
    data[5905] = 255
    defs.write_bytes(bytes(data))
    proc = _import_cli(dst / "traces.otf2", tmp_path)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert f"{dst / 'traces.otf2'}: global definitions traces.def: region " in proc.stderr
    assert "has RegionRole 255, which OTF2 does not define" in proc.stderr


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
