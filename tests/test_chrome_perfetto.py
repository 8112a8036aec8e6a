"""Chrome / Perfetto trace-event JSON: the importer against a plain json.load of every real sample, bad input,
and the Perfetto exporter round-tripping a real Dask run and an imported trace."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import dask
from dask import delayed
from distributed import Client, LocalCluster

import flowscope
from flowscope.exporters import export_run
from flowscope.importers import TraceError, detect_format, import_paths


def _samples(shared: Path) -> list[Path]:
    files = sorted(p for p in (shared / "chrome").rglob("*") if p.is_file() and not p.name.startswith("LICENSE"))
    assert len(files) >= 20
    return files


def _load(path: Path):
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def _import(path: Path, store: Path):
    res = import_paths([path], store)
    return flowscope.open_run(res.run_dir), res.files[0]


def _ns(us) -> int:
    return round(us * 1000)


@pytest.fixture(scope="module")
def imported(shared_data, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    return {p: _import(p, store) for p in _samples(shared_data)}


def test_every_sample_is_detected_and_counts_by_phase_equal_json_load(shared_data, imported):
    for path, (run, fi) in imported.items():
        assert detect_format(path) == "chrome", path
        events = _load(path)
        phases = Counter(e.get("ph") for e in events)
        assert fi.meta["events_by_phase"] == {str(k): v for k, v in phases.items()}, path
        counts = run.counts()
        # every slice begin becomes one span (closed or not); instants become logs; each numeric counter series
        # value one metric row
        assert counts["spans"] == sum(phases[p] for p in ("X", "B", "b", "S")), path
        assert counts["logs"] == sum(phases[p] for p in ("i", "I", "R", "n")), path
        series = sum(1 for e in events if e.get("ph") == "C" for v in (e.get("args") or {}).values()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
        assert counts["metrics"] == series, path
        # each pid is a process resource; each (pid, tid) with a thread-scoped event or a thread_name a thread
        # (counters, process- and global-scoped instants and process metadata belong to the process)
        pids = {e["pid"] for e in events if "pid" in e}
        threads = {(e["pid"], e["tid"]) for e in events if "pid" in e and "tid" in e and
                   (e.get("ph") not in ("M", "C", "n", "i", "I", "R") or e.get("name") == "thread_name"
                    or (e.get("ph") in ("i", "I", "R") and e.get("s", "t") == "t"))}
        res = run.table("resources")
        assert set(res.loc[res.kind == "process", "pid"].dropna().astype(int)) == \
            {p for p in pids if isinstance(p, int)}, path
        assert len(res[res.kind == "thread"]) == len(threads), path
        # X slices keep their times exactly (microseconds -> ns), whatever displayTimeUnit says
        xs = Counter((e.get("name") or "", _ns(e["ts"]), _ns(e["ts"]) + _ns(e.get("dur", 0)))
                     for e in events if e.get("ph") == "X")
        got = Counter(zip(*(run.sql("SELECT name, start_ns, end_ns FROM spans WHERE kind = 'call'")[c]
                            for c in ("name", "start_ns", "end_ns"))))
        assert not xs - got, path


def test_process_and_thread_names_come_from_metadata(imported, shared_data):
    run, _ = imported[shared_data / "chrome" / "viztracer" / "multithread.json"]
    events = _load(shared_data / "chrome" / "viztracer" / "multithread.json")
    want = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    res = run.table("resources")
    threads = res[res.kind == "thread"]
    assert {(int(r.pid), int(r.tid)): r["name"] for _, r in threads.iterrows()} == want
    assert set(res.loc[res.kind == "process", "name"]) == {"MainProcess"}


def test_nanoseconds_display_unit_does_not_scale_ts(imported, shared_data):
    path = shared_data / "chrome" / "catapult" / "nanoseconds.json"
    run, fi = imported[path]
    assert fi.meta["display_time_unit"] == "ns"
    events = _load(path)
    begins = {e["name"]: e["ts"] for e in events if e["ph"] == "B"}
    ends = {e["name"]: e["ts"] for e in events if e["ph"] == "E"}
    spans = run.table("spans").set_index("name")
    for name in begins:  # ts is microseconds: "us1" lasts 1.1 us = 1100 ns, "ns2" 2 ns
        assert spans.loc[name, "start_ns"] == _ns(begins[name])
        assert spans.loc[name, "end_ns"] - spans.loc[name, "start_ns"] == _ns(ends[name]) - _ns(begins[name])


def test_unclosed_slices_are_reported_and_end_at_the_trace_end(imported, shared_data):
    path = shared_data / "chrome" / "catapult" / "main_thread_has_unclosed_slices.json"
    run, fi = imported[path]
    events = _load(path)
    # reference: a plain per-thread stack over the time-sorted B/E events
    open_: dict = defaultdict(list)
    for e in sorted((e for e in events if e["ph"] in "BE"), key=lambda e: e["ts"]):
        st = open_[(e["pid"], e["tid"])]
        if e["ph"] == "B":
            st.append(e["name"])
        elif st:
            st.pop()
    unclosed = sorted(n for st in open_.values() for n in st)
    assert unclosed
    warning = [w for w in fi.warnings if "no matching E" in w]
    assert len(warning) == 1 and warning[0].startswith(f"{len(unclosed)} B events")
    spans = run.sql("SELECT name, end_ns FROM spans WHERE json_extract(attrs, '$.unclosed')::BOOLEAN")
    assert sorted(spans["name"]) == unclosed
    assert set(spans["end_ns"]) == {_ns(max(e["ts"] for e in events if "ts" in e and e["ph"] != "M"))}


def test_nesting_gives_parents_depth_and_exclusive_time(imported, shared_data):
    run, _ = imported[shared_data / "chrome" / "viztracer" / "multithread.json"]
    pairs = run.sql("""SELECT c.resource_id = p.resource_id AS same, c.start_ns >= p.start_ns AND c.end_ns <= p.end_ns
                              AS inside, json_extract(c.attrs, '$.depth')::INT = json_extract(p.attrs, '$.depth')::INT + 1
                              AS deeper
                       FROM spans c JOIN spans p ON c.parent_id = p.span_id""")
    assert len(pairs) > 100 and pairs.all().all()
    roots = run.sql("SELECT count(*) AS n FROM spans WHERE parent_id IS NULL")["n"][0]
    assert roots == run.sql("SELECT count(*) AS n FROM spans WHERE json_extract(attrs, '$.depth')::INT = 0")["n"][0]
    excl = run.sql("""SELECT p.end_ns - p.start_ns - coalesce(sum(c.end_ns - c.start_ns), 0) AS exclusive
                      FROM spans p LEFT JOIN spans c ON c.parent_id = p.span_id GROUP BY p.span_id, p.start_ns, p.end_ns""")
    assert (excl["exclusive"] >= 0).all()


def test_async_flows_and_counters(imported, shared_data):
    run, _ = imported[shared_data / "chrome" / "catapult" / "nestable_async.json"]
    spans = run.sql("SELECT name, start_ns, end_ns, resource_id FROM spans WHERE kind = 'async' ORDER BY start_ns")
    events = _load(shared_data / "chrome" / "catapult" / "nestable_async.json")
    assert spans["name"].iloc[0] == "REQUEST_BAR" and spans["start_ns"].iloc[0] == 10_000
    assert spans["resource_id"].str.startswith("process:").all()

    run, fi = imported[shared_data / "chrome" / "catapult" / "flow.json"]
    events = _load(shared_data / "chrome" / "catapult" / "flow.json")
    # reference: ids are reused, so a flow is an s followed in time by an f of the same (cat, id); an f in the
    # microsecond of an s of its id finishes the flow begun before when there is one, else that s's flow
    by_key = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e["ph"] in "sf":
            by_key[(e.get("cat"), e["id"])][e["ts"]].append(e["ph"])
    pairs = 0
    for by_ts in by_key.values():
        is_open = False
        for ts in sorted(by_ts):
            f, s = by_ts[ts].count("f"), by_ts[ts].count("s")
            if f and is_open:
                pairs, f, is_open = pairs + 1, f - 1, False
            if s:
                is_open = True
            if f and is_open:
                pairs, is_open = pairs + 1, False
    transfers = run.table("transfers")
    assert len(transfers) == pairs > 0
    assert (transfers["end_ns"] >= transfers["start_ns"]).all()
    assert any("flow events have no matching" in w for w in fi.warnings)

    run, _ = imported[shared_data / "chrome" / "catapult" / "instance_counters.json"]
    events = _load(shared_data / "chrome" / "catapult" / "instance_counters.json")
    want = Counter(f"{e['name']}[{e['id']}]" for e in events if e["ph"] == "C")
    assert Counter(run.table("metrics")["name"]) == want


# ---- bad input ---------------------------------------------------------------------------------------------

def test_truncated_file_gives_byte_offset(shared_data, tmp_path):
    src = (shared_data / "chrome" / "viztracer" / "multithread.json").read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(src[: len(src) // 2])
    with pytest.raises(TraceError) as exc:
        import_paths([cut], tmp_path / "store")
    msg = str(exc.value)
    assert str(cut) in msg and "truncated" in msg and "byte offset" in msg
    # the offset named is where the input ends
    assert f"input ends at byte offset {len(src) // 2}" in msg

    gz = tmp_path / "cut.json.gz"
    gz.write_bytes(gzip.compress(src)[:2000])
    with pytest.raises(TraceError, match="cut.json.gz"):
        import_paths([gz], tmp_path / "store")


def test_bare_array_without_closing_bracket_is_accepted(shared_data, tmp_path):
    src = (shared_data / "chrome" / "catapult" / "big_trace.json").read_text()
    events = json.loads(src)
    body = src.rstrip().removesuffix("]")
    for tail in ("", ",", ",\n"):
        f = tmp_path / f"open{len(tail)}.json"
        f.write_text(body + tail)
        run, fi = _import(f, tmp_path / "store")
        assert fi.meta["unterminated_array"] is True
        assert fi.meta["events"] == len(events)
        assert run.counts()["spans"] == sum(e["ph"] == "B" for e in events)


def test_corrupted_event_gives_offset_and_event(shared_data, tmp_path):
    src = (shared_data / "chrome" / "catapult" / "x_event_trace.json").read_text()
    at = src.index('"ts":', len(src) // 2)
    bad = tmp_path / "badjson.json"
    bad.write_text(src[:at] + '"ts":}' + src[at + 5:])
    with pytest.raises(TraceError, match=r"invalid JSON in event #\d+ at byte offset \d+"):
        import_paths([bad], tmp_path / "store")


def test_wrong_typed_ts_names_field_and_event(shared_data, tmp_path):
    d = json.loads((shared_data / "chrome" / "viztracer" / "multithread.json").read_text())
    idx = next(i for i, e in enumerate(d["traceEvents"]) if e["ph"] == "X" and i > 10)
    d["traceEvents"][idx]["ts"] = "soon"
    f = tmp_path / "wrongts.json"
    f.write_text(json.dumps(d))
    with pytest.raises(TraceError) as exc:
        import_paths([f], tmp_path / "store")
    msg = str(exc.value)
    assert f"event #{idx}" in msg and "'ts'" in msg and "str" in msg and "byte offset" in msg
    # and no run with half the rows was left behind as a finished import
    assert not any((tmp_path / "store").glob("*/spans/*.parquet"))


def test_unknown_phase_is_a_warning(shared_data, tmp_path):
    d = json.loads((shared_data / "chrome" / "catapult" / "trivial_trace.json").read_text())
    d.insert(1, {"name": "odd", "ph": "Q", "pid": 52, "tid": 53, "ts": 9530})
    f = tmp_path / "unknown.json"
    f.write_text(json.dumps(d))
    run, fi = _import(f, tmp_path / "store")
    assert any("unknown phase ph='Q'" in w and "event #1" in w for w in fi.warnings)
    assert run.counts()["spans"] == 2


# ---- export and round trip ---------------------------------------------------------------------------------

def _inc(x):
    time.sleep(0.01)
    return x + 1


def _add(a, b):
    time.sleep(0.01)
    return a + b


@pytest.fixture(scope="module")
def dask_run(tmp_path_factory):
    store = tmp_path_factory.mktemp("dask")
    with dask.config.set({"distributed.scheduler.work-stealing": False}):
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                          worker_dashboard_address=None) as cl, Client(cl) as client:
            xs = [delayed(_inc, pure=True)(i, dask_key_name=f"inc-{i}") for i in range(8)]
            ys = [delayed(_add, pure=True)(xs[i], xs[(i + 3) % 8], dask_key_name=f"add-{i}") for i in range(8)]
            with flowscope.observe(client, store=store, name="perfetto-rt") as obs:
                assert client.compute(delayed(sum)(ys)).result() == 72
    return obs.run.path


SPAN_Q = "SELECT resource_id, kind, name, start_ns, end_ns, task_key FROM spans ORDER BY ALL"


def _round_trip(run_dir: Path, tmp_path: Path, name: str):
    out, counts = export_run(run_dir, "perfetto", tmp_path / f"{name}.perfetto.json")
    doc = json.loads(out.read_text())  # valid JSON in the object form viewers read
    events = doc["traceEvents"]
    back, fi = _import(out, tmp_path / "back")
    return doc, events, counts, back, fi


def test_dask_run_exports_to_perfetto_and_reads_back_to_the_same_spans(dask_run, tmp_path):
    original = flowscope.open_run(dask_run)
    doc, events, counts, back, fi = _round_trip(dask_run, tmp_path, "dask")
    assert counts["spans"] == original.counts()["spans"] > 0
    # every slice is on a named thread of a named process
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    xs = [e for e in events if e["ph"] == "X"]
    assert all((e["pid"], e["tid"]) in named and e["pid"] in procs for e in xs)
    # spans on one track nest (viewers need it), flows pair up, counters and instants are there
    by_track = defaultdict(list)
    for e in xs:
        by_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for ivs in by_track.values():
        ivs.sort(key=lambda t: (t[0], -t[1]))
        stack = []
        for s, e in ivs:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1] + 1e-3
            stack.append(e)
    assert Counter(e["ph"] for e in events if e["ph"] in "sf") == \
        {"s": original.counts()["transfers"], "f": original.counts()["transfers"]}
    assert sum(e["ph"] == "C" for e in events) == original.counts()["metrics"]
    assert sum(e["ph"] == "i" for e in events) == original.counts()["logs"]
    assert not fi.warnings
    # the same spans: resource, kind, name, task and times (exact to the nanosecond, within 1 us required)
    a, b = original.sql(SPAN_Q), back.sql(SPAN_Q)
    assert len(a) == len(b) > 0
    for col in ("resource_id", "kind", "name", "task_key"):
        assert list(a[col]) == list(b[col])
    assert ((a["start_ns"] - b["start_ns"]).abs() <= 1000).all() and ((a["end_ns"] - b["end_ns"]).abs() <= 1000).all()
    attrs = original.sql("SELECT attrs FROM spans ORDER BY resource_id, kind, name, start_ns, end_ns, task_key")
    attrs_b = back.sql("SELECT attrs FROM spans ORDER BY resource_id, kind, name, start_ns, end_ns, task_key")
    assert [json.loads(x) if x else None for x in attrs["attrs"]] == \
        [json.loads(x) if x else None for x in attrs_b["attrs"]]
    # transfers come back between the same resources at the same times
    tq = "SELECT kind, src_resource_id, dst_resource_id, nbytes, start_ns, end_ns FROM transfers ORDER BY ALL"
    assert original.sql(tq).equals(back.sql(tq))
    lq = "SELECT ts_ns, resource_id, level, category, message FROM logs ORDER BY ALL"
    assert original.sql(lq).equals(back.sql(lq))


def test_imported_trace_round_trips_through_perfetto(imported, shared_data, tmp_path):
    for name in ("viztracer/multithread.json", "catapult/x_event_trace.json"):
        run, _ = imported[shared_data / "chrome" / name]
        doc, events, counts, back, fi = _round_trip(run.path, tmp_path, Path(name).stem)
        assert counts["spans"] == run.counts()["spans"]
        a, b = run.sql(SPAN_Q), back.sql(SPAN_Q)
        assert len(a) == len(b) > 0
        assert list(a["resource_id"]) == list(b["resource_id"]) and list(a["name"]) == list(b["name"])
        assert ((a["start_ns"] - b["start_ns"]).abs() <= 1000).all()
        assert ((a["end_ns"] - b["end_ns"]).abs() <= 1000).all()


def test_export_gzip_and_cli(dask_run, tmp_path):
    from flowscope.cli.main import main as cli_main

    out = tmp_path / "run.json.gz"
    assert cli_main(["export", str(dask_run), "--format", "perfetto", "-o", str(out)]) == 0
    with gzip.open(out, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == flowscope.open_run(dask_run).counts()["spans"]
    assert detect_format(out) == "chrome"


# ---- flows whose ends share a timestamp ----------------------------------------------------------------------

FLOW_Q = "SELECT src_resource_id, dst_resource_id, start_ns, end_ns, attrs FROM transfers ORDER BY ALL"


def _flows_by_slice(run, query: str):
    """``query``'s transfers with the slices a flow binds (src_call / dst_call, named by span ids, which follow
    the file's order) given as name@start instead, so that two imports of the same events compare equal."""
    t = run.sql(query)
    slice_of = {k: f"{n}@{s}" for k, n, s in run.sql(
        "SELECT task_key, name, start_ns FROM spans WHERE task_key IS NOT NULL").itertuples(index=False)}
    t["attrs"] = [json.dumps({k: slice_of.get(v, v) if k in ("src_call", "dst_call") else v
                              for k, v in json.loads(a).items()}) for a in t["attrs"]]
    return t


def test_flows_match_whatever_the_file_order_of_equal_timestamps(shared_data, tmp_path):
    """The format does not order events: the same flows come out of catapult's flow.json with its events reversed,
    which puts each f that shares its timestamp with an s of the same id before that s in the file."""
    src = shared_data / "chrome" / "catapult" / "flow.json"
    doc = json.loads(src.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    ends = defaultdict(lambda: defaultdict(set))
    for e in events:
        if e["ph"] in "sf":
            ends[(e.get("cat"), e["id"])][e["ts"]].add(e["ph"])
    shared_ts = sorted(ts for by_ts in ends.values() for ts, phs in by_ts.items() if phs == {"s", "f"})
    assert len(shared_ts) >= 3  # the real trace has flows that start in the microsecond another one finishes
    reversed_file = tmp_path / "flow-reversed.json"
    reversed_file.write_text(json.dumps(events[::-1]))
    tables = []
    for f, store in ((src, "a"), (reversed_file, "b")):
        run, _ = _import(f, tmp_path / store)
        t = _flows_by_slice(run, FLOW_Q)
        for col in ("src_resource_id", "dst_resource_id"):
            t[col] = t[col].str.replace(f.name, "flow.json", regex=False)
        tables.append(t.sort_values(list(t.columns)).reset_index(drop=True))
        # each f that shares its microsecond with an s of its id finishes a flow: none is dropped
        assert {_ns(ts) for ts in shared_ts} <= set(t["end_ns"])
    a, b = tables
    assert len(b) == len(a) > 0
    assert a.equals(b)


# ---- a real PyTorch profiler trace (torch, CPU build, is in the test extra) ----------------------------------

PROFILE_SCRIPT = """
import sys, time
import torch
from torch.profiler import ProfilerActivity, profile

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
before = time.time_ns()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
after = time.time_ns()
prof.export_chrome_trace(sys.argv[1])
print(before, after)
"""


@pytest.fixture(scope="module")
def pytorch_trace(tmp_path_factory):
    """A trace written by torch.profiler's export_chrome_trace, and the wall-clock window (ns) around the run."""
    import subprocess
    import sys

    d = tmp_path_factory.mktemp("torch")
    (d / "run_profiler.py").write_text(PROFILE_SCRIPT)  # not profile.py: that would hide the stdlib module
    out = subprocess.run([sys.executable, str(d / "run_profiler.py"), str(d / "pytorch.json")], check=False,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, ("torch.profiler failed (torch is in the test extra: pip install -e '.[test]')\n"
                                 + out.stderr[-2000:])
    before, after = map(int, out.stdout.split()[-2:])
    return d / "pytorch.json", before, after


def test_pytorch_profiler_trace_starts_at_its_wall_clock_time(pytorch_trace, tmp_path):
    path, before, after = pytorch_trace
    doc = json.loads(path.read_text())
    assert isinstance(doc["baseTimeNanoseconds"], int)  # what Kineto writes: ts are µs after this base
    run, fi = _import(path, tmp_path / "store")
    # the profiled steps ran between the two wall-clock readings the script took around the profiler
    steps = run.sql("SELECT min(start_ns) AS s, max(end_ns) AS e FROM spans WHERE name LIKE 'ProfilerStep%' "
                    "OR name LIKE 'aten::%'")
    assert before <= int(steps["s"][0]) <= int(steps["e"][0]) <= after
    assert before - 10**9 <= run.meta["start_ns"] <= run.meta["end_ns"] <= after + 10**9
    first_x = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    assert int(run.sql("SELECT min(start_ns) AS s FROM spans")["s"][0]) == \
        doc["baseTimeNanoseconds"] + _ns(first_x)
    assert fi.meta["time_origin"] == {"key": "baseTimeNanoseconds", "ns": doc["baseTimeNanoseconds"]}
    # JSON keys have no order: the same trace saved with traceEvents before the base gives the same times
    moved = tmp_path / "events-first.json"
    moved.write_text(json.dumps({"traceEvents": doc["traceEvents"],
                                 **{k: v for k, v in doc.items() if k != "traceEvents"}}))
    back, fi_back = _import(moved, tmp_path / "store2")
    q = "SELECT name, start_ns, end_ns FROM spans ORDER BY ALL"
    assert run.sql(q).equals(back.sql(q))
    assert back.meta["start_ns"] == run.meta["start_ns"] and not fi_back.warnings


def test_pytorch_profiler_flows_all_pair_up_in_any_file_order(pytorch_trace, tmp_path):
    path, _, _ = pytorch_trace
    doc = json.loads(path.read_text())
    starts = [e for e in doc["traceEvents"] if e.get("ph") == "s"]
    assert len(starts) > 0 and len(starts) == sum(e.get("ph") == "f" for e in doc["traceEvents"])
    run, fi = _import(path, tmp_path / "a")
    t = run.table("transfers")
    assert len(t) == len(starts)  # forward op -> its backward op (cat fwdbwd): every flow kept
    assert not any("flow events" in w for w in fi.warnings)
    assert (t["end_ns"] >= t["start_ns"]).all()
    shuffled = dict(doc, traceEvents=doc["traceEvents"][::-1])
    (tmp_path / "reversed.json").write_text(json.dumps(shuffled))
    back, _ = _import(tmp_path / "reversed.json", tmp_path / "b")
    q = "SELECT start_ns, end_ns, attrs FROM transfers"
    a, b = _flows_by_slice(run, q), _flows_by_slice(back, q)
    a, b = (x.sort_values(list(x.columns)).reset_index(drop=True) for x in (a, b))
    assert a.equals(b)
    # each flow links its forward op to the backward op it feeds: a dependency between those two slices
    deps = run.sql("""SELECT a.name AS fwd, b.name AS bwd FROM dependencies d
                      JOIN spans a ON a.task_key = d.depends_on JOIN spans b ON b.task_key = d.task_key""")
    assert len(deps) == len(starts)
    assert all("Backward" in b or "backward" in b for b in deps["bwd"]), deps.head()


# ---- flows as dependencies between the slices they bind ----------------------------------------------------

def test_flows_bind_their_slices_and_become_dependencies(imported, shared_data):
    """A flow start binds to the slice enclosing it on its thread, a flow end to the next slice that begins on
    its thread (trace-event format; catapult's flow_simple.json: SenderA -> SomeSlice, SenderB -> Blergh). The
    end's slice depends on the start's (``dependencies``), and the transfer names both (src_call / dst_call)."""
    run, _ = imported[shared_data / "chrome" / "catapult" / "flow_simple.json"]
    deps = run.sql("""SELECT a.name AS src, b.name AS dst FROM dependencies d
                      JOIN spans a ON a.task_key = d.depends_on JOIN spans b ON b.task_key = d.task_key""")
    assert sorted(zip(deps["src"], deps["dst"])) == [("SenderA", "SomeSlice"), ("SenderB", "Blergh")]
    tr = run.sql("""SELECT a.name AS src, b.name AS dst FROM transfers t
                    JOIN spans a ON a.task_key = json_extract_string(t.attrs, '$.src_call')
                    JOIN spans b ON b.task_key = json_extract_string(t.attrs, '$.dst_call')""")
    assert sorted(zip(tr["src"], tr["dst"])) == sorted(zip(deps["src"], deps["dst"]))


def test_every_flow_of_a_real_trace_binds_by_the_format_rules(imported, shared_data):
    """catapult's flow.json (593 flows, ids reused): for every transfer, its src_call slice is the innermost
    slice on the start's thread enclosing the start, and its dst_call slice the first slice on the end's thread
    beginning at or after the end; every dependency is one of them."""
    run, _ = imported[shared_data / "chrome" / "catapult" / "flow.json"]
    spans = run.sql("SELECT * FROM spans WHERE kind = 'call'")
    tr = run.table("transfers")
    by_key = spans.dropna(subset=["task_key"]).set_index("task_key")
    linked = 0
    for t in tr.itertuples():
        a = json.loads(t.attrs)
        on_src = spans[(spans["resource_id"] == t.src_resource_id) & (spans["start_ns"] <= t.start_ns)
                       & (spans["end_ns"] >= t.start_ns)]
        want_src = on_src.sort_values(["start_ns", "end_ns"], ascending=[True, False]).iloc[-1] if len(on_src) else None
        if want_src is None:
            assert "src_call" not in a
        else:
            assert by_key.loc[a["src_call"], "span_id"] == want_src["span_id"]
        after = spans[(spans["resource_id"] == t.dst_resource_id) & (spans["start_ns"] >= t.end_ns)]
        want_dst = after.sort_values(["start_ns", "end_ns"], ascending=[True, False]).iloc[0] if len(after) else None
        if want_dst is None:
            assert "dst_call" not in a
        else:
            assert by_key.loc[a["dst_call"], "span_id"] == want_dst["span_id"]
        linked += "src_call" in a and "dst_call" in a and a["src_call"] != a["dst_call"]
    deps = run.table("dependencies")
    assert len(deps) == linked > 0 and (deps["graph_id"] == "flows").all()
