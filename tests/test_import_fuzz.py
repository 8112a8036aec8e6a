"""Fuzzing the Paje, Chrome and WfCommons importers with mutated copies of the real samples.

Each mutated input (cut at a random offset, bytes flipped, lines duplicated, deleted or swapped,
seeded) must either import or raise one :class:`TraceError` naming the file and where in it -- never
another exception -- and a failed import must leave no run behind (checked through
``import_paths`` for every :data:`STORE_EVERY`-th input). ``FLOWSCOPE_FUZZ_EXAMPLES`` sets the total
number of inputs (default 10,000, split over the importers); ``FLOWSCOPE_FUZZ_SEED`` the seed.
OTF2 and Darshan are fuzzed in tests/test_hpc_corrupt.py.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from flowscope.importers import TraceError, format_module, import_paths
from flowscope.importers.sink import ImportSink

TOTAL = int(os.environ.get("FLOWSCOPE_FUZZ_EXAMPLES", "10000"))
SEED = int(os.environ.get("FLOWSCOPE_FUZZ_SEED", "20251121"))
STORE_EVERY = 40
#: share of the inputs per importer, and the real samples it mutates (small ones, so 10,000 fit a minute)
SAMPLES = {
    "paje": (0.4, ["paje/pajeng/states.trace", "paje/pajeng/links.trace", "paje/pajeng/events.trace",
                   "paje/pajeng/variables.trace", "paje/pajeng/containers.trace", "paje/pajeng/gattaca.trace",
                   "paje/pajeng/simgrid-fg126.trace", "paje/pajeng/replay_output_shurakai_extract.trace",
                   "paje/pajeng/categories.trace"]),
    "chrome": (0.4, ["chrome/catapult/async_begin_end.json", "chrome/catapult/flow_simple.json",
                     "chrome/catapult/instance_counters.json", "chrome/catapult/instant_events.json",
                     "chrome/catapult/nanoseconds.json", "chrome/catapult/nestable_async.json",
                     "chrome/catapult/simple_trace.json", "chrome/catapult/tall_trace.json",
                     "chrome/catapult/trivial_trace.json", "chrome/catapult/gpu_state_trace.json",
                     "chrome/viztracer/tests_fib.json", "chrome/viztracer/tests_old.json",
                     "chrome/viztracer/function_args_return.json", "chrome/catapult/simple_trace_gz.gz"]),
    "wfcommons": (0.2, ["wfinstances/helloworld-chain-5-chameleon.json"]),
}
#: where in the input an error message may point, by format (see :func:`unclear`)
LINE = re.compile(r"\bline (\d+)")
BYTE = re.compile(r"\b(?:at )?byte(?: offset)? (\d+)( of the decompressed content)?")
#: a field: a quoted name ('ts', 'stackFrames'), a JSON path (workflow.specification.tasks[3].id) or a missing
#: member named (no traceEvents array)
FIELD = re.compile(r"'[A-Za-z_]\w*'|\b[A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)+|\bno [A-Za-z_]\w* (?:array|field)\b")
#: the records at fault named by their ids: a dependency cycle through WfCommons tasks
CYCLE = re.compile(r"has a cycle: \S+( -> \S+)+$")


def unclear(fmt: str, path: Path, msg: str, data: bytes) -> str | None:
    """Why a TraceError message fails to say which file and where in it, or None when it does.

    Paje is read line by line: the message starts ``<file>:<line>:`` with a line of the input. Chrome
    JSON: a byte offset of the input (or of its decompressed content), or a field it names, or that the file
    is empty. WfCommons: a line of the input, a byte offset in it, or a field (a JSON path), or the tasks of a
    dependency cycle."""
    if str(path) not in msg:
        return "the file is not named"
    lines = data.count(b"\n") + 1
    if fmt == "paje":
        m = re.match(re.escape(str(path)) + r":(\d+): \S", msg)
        if not m:
            return "no '<file>:<line>: ' prefix"
        return None if 1 <= int(m.group(1)) <= lines else f"line {m.group(1)} is not in the input ({lines} lines)"
    rest = msg.replace(str(path), "")
    for m in BYTE.finditer(rest):
        if m.group(2) or int(m.group(1)) <= len(data):  # the decompressed content's size is not known here
            return None
        return f"byte offset {m.group(1)} is past the input's {len(data)} bytes"
    if fmt == "wfcommons":
        m = LINE.search(rest)
        if m:
            return None if 1 <= int(m.group(1)) <= lines else f"line {m.group(1)} is not in the input"
        if CYCLE.search(rest):
            return None
    if FIELD.search(rest) or (fmt == "chrome" and rest.startswith(": empty file")):
        return None
    return "no line, byte offset or field"


class _MemorySink(ImportSink):
    """An ImportSink that keeps its rows in memory (the fuzz loop needs thousands per minute)."""

    def __init__(self, path: Path, fmt: str):
        self.rows: dict[str, list] = {}
        super().__init__("fuzz", path, fmt, lambda _r, t, _s, d: self.rows.setdefault(t, []).extend(
            json.dumps(r, sort_keys=True) for r in d.to_pylist()))


def _paje_both_ways(path: Path) -> tuple[dict, dict]:
    """The rows of a Paje import through the vectorised path (when it takes the file) and the line simulator."""
    from flowscope.importers import paje

    out = []
    for fast in (True, False):
        saved, paje.FAST = paje.FAST, fast
        try:
            sink = _MemorySink(path, "paje")
            paje.read(path, sink)
            sink.flush()
        finally:
            paje.FAST = saved
        out.append(({t: sorted(v) for t, v in sink.rows.items()}, sink.meta.get("read_path")))
    return out[0], out[1]


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One random corruption of ``data`` and its name."""
    op = rng.choice(["cut", "flip", "flip", "dup", "delete", "swap", "cut+flip", "insert"])
    if not data:
        return op, data
    if op == "cut":
        return op, data[: rng.randrange(len(data))]
    if op in ("flip", "cut+flip"):
        b = bytearray(data if op == "flip" else data[: rng.randrange(1, len(data) + 1)])
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] = rng.choice([rng.randrange(256), ord('"'), ord(" "), ord("\n"), ord("{"), ord("9"), ord("-")])
        return op, bytes(b)
    if op == "insert":
        i = rng.randrange(len(data))
        junk = rng.choice([b"\x00", b"\xff\xfe", b'"', b"-1e400", b"nan", b"}", b"]", b",", b"%", b"# x\n"])
        return op, data[:i] + junk + data[i:]
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    if op == "dup":
        lines.insert(i, lines[i])
    elif op == "delete":
        del lines[i]
    else:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    return op, b"\n".join(lines)


def _store_runs(store: Path) -> list[Path]:
    return sorted(p for p in store.iterdir() if p.is_dir()) if store.exists() else []


@pytest.mark.parametrize("fmt", list(SAMPLES))
def test_mutated_samples_import_or_fail_clearly(shared_data, tmp_path, fmt):
    share, rels = SAMPLES[fmt]
    n = max(1, round(TOTAL * share))
    rng = random.Random(f"{SEED}-{fmt}")
    mod = format_module(fmt)
    originals = [(rel, (shared_data / rel).read_bytes()) for rel in rels]
    ok = failed = differential = 0
    unexpected: list[str] = []
    store = tmp_path / "store"
    for k in range(n):
        rel, data = originals[k % len(originals)]
        op, bad = mutate(data, rng)
        suffix = "".join(Path(rel).suffixes) or ".trace"
        path = tmp_path / f"in{k % 7}-{Path(rel).stem.split('.')[0]}{suffix}"
        if path.suffix == ".gz" and op != "cut" and rng.random() < 0.5:
            import gzip
            bad = gzip.compress(mutate(gzip.decompress(data), rng)[1])  # corrupt the content, not the gzip
        path.write_bytes(bad)
        via_store = k % STORE_EVERY == 0
        before = _store_runs(store)
        try:
            if via_store:
                import_paths([path], store, fmt=fmt)
            else:
                sink = _MemorySink(path, fmt)
                mod.read(path, sink)
                sink.flush()
                if fmt == "paje" and sink.meta.get("read_path") == "vectorised":
                    # differential: the vectorised path must give the line simulator's rows exactly
                    (fast, _), (slow, _) = _paje_both_ways(path)
                    differential += 1
                    if fast != slow:
                        unexpected.append(f"{rel} {op} #{k}: the vectorised Paje path differs from the line "
                                          f"simulator: {[t for t in fast if fast[t] != slow.get(t)]}")
            ok += 1
        except TraceError as exc:
            failed += 1
            msg = str(exc)
            why = unclear(fmt, path, msg, bad)
            if why:
                unexpected.append(f"{rel} {op} #{k}: unclear error ({why}): {msg[:300]}")
            if via_store and _store_runs(store) != before:
                unexpected.append(f"{rel} {op} #{k}: a failed import left a run: "
                                  f"{set(_store_runs(store)) - set(before)}")
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            unexpected.append(f"{rel} {op} #{k}: {type(exc).__name__}: {str(exc)[:300]}")
        if len(unexpected) >= 20:
            break
    print(f"{fmt}: {ok + failed} mutated inputs, {ok} imported, {failed} refused with a TraceError"
          + (f"; {differential} imported through the vectorised path compared with the line simulator"
             if fmt == "paje" else ""))
    assert not unexpected, "\n".join(unexpected)
    assert ok + failed == n and failed > 0
    if fmt == "paje":
        assert differential > 0


#: every valid Paje trace of the shared folder (native_paje.trace is invalid on purpose)
PAJE_REAL = ["paje/pajeng/categories.trace", "paje/pajeng/containers.trace", "paje/pajeng/events.trace",
             "paje/pajeng/gattaca.trace", "paje/pajeng/gattaca2.trace", "paje/pajeng/gattaca3.trace",
             "paje/pajeng/links.trace", "paje/pajeng/ms.trace", "paje/pajeng/native_sample.trace",
             "paje/pajeng/replay_output_shurakai_extract.trace", "paje/pajeng/simgrid-fg126.trace",
             "paje/pajeng/states.trace", "paje/pajeng/variables.trace", "paje/pajeng/multiple_files/root.trace",
             "paje/starpu-demo/paje.trace", "paje/starvz_lu_old_data_header_only_paje.trace"]


@pytest.mark.parametrize("rel", PAJE_REAL)
def test_paje_vectorised_path_equals_line_simulator_on_real_traces(shared_data, rel):
    """Same rows, ids, parents and attributes, to the byte, from both paths; and every real trace takes
    the vectorised one."""
    (fast, how_fast), (slow, how_slow) = _paje_both_ways(shared_data / rel)
    assert how_fast == "vectorised" and how_slow == "line simulator"
    assert fast == slow
    if "header_only" not in rel:
        assert sum(map(len, fast.values())) > 0


@pytest.mark.parametrize("rel", [r for r in PAJE_REAL if "header_only" not in r])
def test_paje_vectorised_path_in_small_pieces_equals_line_simulator(shared_data, monkeypatch, rel):
    """Chunks of a few lines, sorted runs of a few rows, merged three at a time in rounds: what carries over
    from one piece to the next (open states, variable values, link halves) and the external sort of a
    trace that is not time-ordered give the line simulator's rows, as on a trace of gigabytes."""
    from flowscope.importers import paje_fast

    monkeypatch.setattr(paje_fast, "CHUNK_BYTES", 700)
    monkeypatch.setattr(paje_fast, "RUN_BATCH", 7)
    monkeypatch.setattr(paje_fast, "FAN_IN", 3)
    monkeypatch.setattr(paje_fast, "MERGE_ROWS", 50)
    (fast, how_fast), (slow, how_slow) = _paje_both_ways(shared_data / rel)
    assert how_fast == "vectorised" and how_slow == "line simulator"
    assert fast == slow and sum(map(len, fast.values())) > 0


def _time_scrambled(path: Path, out: Path, seed: int) -> Path:
    """``path`` with its timed lines in a random order that keeps the file order of lines of equal time (so a
    stable sort by time gives the original order back), definitions first: heavily not time-ordered."""
    lines = path.read_text().splitlines()
    time_pos: dict[str, int] = {}
    cur, fields = None, []
    head, untimed, timed = [], [], []
    for line in lines:
        s = line.strip()
        if not s or s[0] in "%#":
            head.append(line)
            parts = s[1:].split()
            if s.startswith("%") and parts and parts[0] == "EventDef":
                cur, fields = parts[2], []
            elif s.startswith("%") and parts and parts[0] == "EndEventDef" and "Time" in fields:
                time_pos[cur] = fields.index("Time") + 1
            elif s.startswith("%") and parts:
                fields.append(parts[0])
            continue
        toks = re.findall(r'"[^"]*"|\S+', s)
        (timed if toks[0] in time_pos else untimed).append((float(toks[time_pos[toks[0]]]) if toks[0] in time_pos
                                                           else 0.0, line))
    rng = random.Random(seed)
    keys = [rng.random() for _ in timed]
    by_time: dict[float, list[int]] = {}
    for i, (t, _) in enumerate(timed):
        by_time.setdefault(t, []).append(i)
    for idx in by_time.values():  # within one time, the keys in file order
        for i, k in zip(idx, sorted(keys[i] for i in idx)):
            keys[i] = k
    order = sorted(range(len(timed)), key=keys.__getitem__)
    out.write_text("\n".join(head + [x for _, x in untimed] + [timed[i][1] for i in order]) + "\n")
    return out


def _sorted_mode_rows(path: Path, fast: bool) -> dict:
    """Rows of ``path`` read in sorted mode from the start (the mode a trace that is not time-ordered ends in)."""
    import tempfile

    from flowscope.importers import paje, paje_fast

    sink = _MemorySink(path, "paje")
    with tempfile.TemporaryDirectory() as tmp:
        spool = paje._Spool(tmp)
        reader = paje._Reader(path, sink, spool, sorted_mode=True)
        if fast:
            paje_fast.read_fast(reader)
            reader.sink = sink
        else:
            reader.run()
        spool.replay(sink)
        spool.close()
    sink.flush()
    return {t: sorted(v) for t, v in sink.rows.items()}


@pytest.mark.parametrize("rel", ["paje/pajeng/ms.trace", "paje/pajeng/native_sample.trace",
                                 "paje/pajeng/categories.trace", "paje/pajeng/links.trace",
                                 "paje/starpu-demo/paje.trace"])
def test_paje_sorted_mode_in_small_pieces_equals_line_simulator(shared_data, tmp_path, monkeypatch, rel):
    """A real trace with its events scrambled in time, read in sorted mode in pieces of a few lines: the
    vectorised path's external sort and merge give the line simulator's rows, which are those of the
    trace as it was."""
    from flowscope.importers import paje_fast

    path = _time_scrambled(shared_data / rel, tmp_path / "scrambled.trace", seed=7)
    monkeypatch.setattr(paje_fast, "CHUNK_BYTES", 900)
    monkeypatch.setattr(paje_fast, "RUN_BATCH", 5)
    monkeypatch.setattr(paje_fast, "FAN_IN", 4)
    monkeypatch.setattr(paje_fast, "MERGE_ROWS", 40)
    fast = _sorted_mode_rows(path, fast=True)
    assert fast == _sorted_mode_rows(path, fast=False) and sum(map(len, fast.values())) > 0
    # the trace alone, as the scrambled copy is: without the StarPU tasks.rec / dag.dot that sit beside the demo
    alone = tmp_path / "original.trace"
    shutil.copyfile(shared_data / rel, alone)
    (_, _), (original, _) = _paje_both_ways(alone)
    assert fast == original

