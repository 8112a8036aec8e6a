"""Import speed: flowscope's Paje importer against pajeng's ``pj_dump`` on the same large Paje trace.

The trace is written by flowscope's own Paje exporter from a large simulated run (many workers and
threads, nested task/call spans, transfers between workers, metrics, logs), whose canonical tables
are generated directly with numpy and written as a run. The generated run and traces are cached in a
temporary folder (``--cache``) so later runs skip generation; the time generation took is printed
and recorded.

Measured, alternating (the order rotates every repetition), medians of ``--repeat``:

* ``flowscope`` (``value``) -- ``flowscope.importers.paje.read`` of the trace into an
  :class:`ImportSink` that writes Parquet segments to a scratch run (what ``flowscope import`` does),
  in a child process, so its peak memory (``ru_maxrss`` of the child) is its own.
* ``pj_dump`` (main peer, ``ratio_vs_peer``) -- ``pj_dump -e 1e15 FILE > /dev/null`` (Debian pajeng):
  parses and simulates the same trace and prints every entity.

Also (``params``): rows/s of the Chrome importer on the same run exported by the Perfetto exporter,
and of the OTF2 importer on an OTF2 archive written with the ``otf2`` package's writer from the same
run's spans (ENTER/LEAVE per span, one location per thread).

Writes ``bench/results/import.json`` (format: DESIGN.md, "Benchmarks") and prints one summary line last.

    python bench/import.py                       # >= 500 MB Paje trace, 3 repetitions
    python bench/import.py --size-mb 40 --repeat 1   # quick run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, git_commit, write_result

BENCH = "import"
TARGET = 2.0  # flowscope's time at most twice pj_dump's
MAIN_PEER = "pj_dump"
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
BASE_NS = 1_763_700_000_000_000_000
FUNCTIONS = ("load", "inc", "double", "add", "sum", "store", "fetch", "reduce")
#: Paje bytes one simulated task (a task span, two call spans, its share of transfers/metrics) takes
BYTES_PER_TASK = 325


class BenchError(RuntimeError):
    """The benchmark could not run."""


# ---- the simulated run ---------------------------------------------------------------------------
def generate_run(store: Path, tasks: int, workers: int, threads: int, seed: int = 1) -> Path:
    """Write a run of ``tasks`` tasks on ``workers`` x ``threads`` threads directly as canonical tables."""
    from flowscope.model.provenance import new_run_id
    from flowscope.model.schemas import schema
    from flowscope.service.collector import Collector
    from flowscope.store.layout import write_segment

    rng = np.random.default_rng(seed)
    col = Collector(store)
    run_id = new_run_id()
    col.open_run({"run_id": run_id, "name": "bench-import-simulated", "start_ns": BASE_NS})
    run_dir = col.run_dir(run_id)

    def put(table: str, cols: dict, part: int) -> None:
        target = schema(table)
        t = pa.table({f.name: (cols[f.name] if f.name in cols else pa.nulls(len(next(iter(cols.values()))),
                                                                              f.type)) for f in target})
        write_segment(run_dir, table, f"sim-{part:05d}", t.cast(target))

    hosts = [f"node-{h}" for h in range((workers + 7) // 8)]
    wk = [f"worker-{w}" for w in range(workers)]
    th = [f"worker-{w}/thread-{k}" for w in range(workers) for k in range(threads)]
    put("resources", {
        "resource_id": hosts + wk + th,
        "kind": ["host"] * len(hosts) + ["worker"] * len(wk) + ["thread"] * len(th),
        "name": hosts + wk + th,
        "parent_id": [None] * len(hosts) + [hosts[w // 8] for w in range(workers)]
        + [wk[i // threads] for i in range(len(th))],
    }, 0)

    n_lanes = len(th)
    per_lane = -(-tasks // n_lanes)
    chunk_lanes = max(1, 200_000 // per_lane)
    span_id = 0
    end_all = BASE_NS
    for part, lo in enumerate(range(0, n_lanes, chunk_lanes)):
        lanes = np.arange(lo, min(n_lanes, lo + chunk_lanes))
        n = len(lanes) * per_lane
        lane = np.repeat(lanes, per_lane)
        dur = rng.integers(200_000, 5_000_000, n)  # 0.2-5 ms tasks
        gap = rng.integers(10_000, 500_000, n)
        step = (dur + gap).reshape(len(lanes), per_lane)
        start = (BASE_NS + np.cumsum(step, axis=1) - step).reshape(-1)
        end = start + dur
        end_all = max(end_all, int(end.max()))
        fn = rng.integers(0, len(FUNCTIONS), n)
        names = np.array(FUNCTIONS, dtype=object)[fn]
        keys = np.char.add(np.char.add(names.astype(str), "-"), np.arange(span_id, span_id + n).astype(str))
        rids = np.array(th, dtype=object)[lane]
        ids = np.arange(span_id, span_id + n) * 3 + 1
        # a task span with two nested call spans (deserialize, then execute)
        d1 = dur // 10
        put("spans", {
            "span_id": np.concatenate([ids, ids + 1, ids + 2]),
            "parent_id": pa.array(np.concatenate([np.zeros(n, np.int64), ids, ids]),
                                  mask=np.concatenate([np.ones(n, bool), np.zeros(2 * n, bool)])),
            "resource_id": np.concatenate([rids, rids, rids]),
            "kind": ["task"] * n + ["call"] * (2 * n),
            "name": np.concatenate([names, np.full(n, "deserialize", object), names]),
            "start_ns": np.concatenate([start, start, start + d1]),
            "end_ns": np.concatenate([end, start + d1, end]),
            "task_key": np.concatenate([keys, keys, keys]).astype(object),
        }, part)
        # one transfer in ten tasks: from another worker's thread to this one, just before the task
        tr = np.flatnonzero(rng.random(n) < 0.1)
        src = (lane[tr] + rng.integers(1, n_lanes, len(tr))) % n_lanes
        put("transfers", {
            "transfer_id": np.arange(span_id, span_id + len(tr)),
            "kind": ["dask-fetch"] * len(tr),
            "src_resource_id": np.array(th, dtype=object)[src],
            "dst_resource_id": rids[tr],
            "nbytes": rng.integers(1_000, 10_000_000, len(tr)),
            "start_ns": start[tr] - 50_000, "end_ns": start[tr] - 1_000,
        }, part)
        # memory of the worker after every fourth task; a log line every 100 tasks
        me = np.flatnonzero(np.arange(n) % 4 == 0)
        put("metrics", {
            "ts_ns": end[me], "resource_id": rids[me], "namespace": ["performance"] * len(me),
            "name": ["memory.rss"] * len(me), "value": rng.random(len(me)) * 1e9,
        }, part)
        lg = np.flatnonzero(np.arange(n) % 100 == 0)
        put("logs", {
            "ts_ns": end[lg], "resource_id": rids[lg], "level": ["info"] * len(lg),
            "category": ["task-finished"] * len(lg), "message": keys[lg].astype(object),
        }, part)
        span_id += n
    col.close_run(run_id, end_ns=end_all, status="finished")
    col.shutdown()
    return run_dir


def write_otf2(run_dir: Path, out: Path, max_spans: int) -> int:
    """Write up to ``max_spans`` of the run's spans as an OTF2 archive (otf2 writer); returns events written."""
    import otf2
    from otf2.enums import Type  # noqa: F401 - ensures the writer's enums load

    from flowscope.store.run import open_run

    run = open_run(run_dir)
    sp = run.sql(f"select resource_id, name, start_ns, end_ns from spans where kind = 'task' "
                 f"order by resource_id, start_ns limit {int(max_spans)}").to_dict("list")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    n = 0
    with otf2.writer.open(str(out), "traces", timer_resolution=1_000_000_000) as trace:
        node = trace.definitions.system_tree_node("node")
        group = trace.definitions.location_group("process", system_tree_parent=node)
        regions: dict[str, object] = {}
        writers: dict[str, object] = {}
        for rid, name, t0, t1 in zip(sp["resource_id"], sp["name"], sp["start_ns"], sp["end_ns"]):
            w = writers.get(rid)
            if w is None:
                w = writers[rid] = trace.event_writer(rid, group=group)
            r = regions.get(name)
            if r is None:
                r = regions[name] = trace.definitions.region(name)
            w.enter(int(t0), r)
            w.leave(int(t1), r)
            n += 2
    return n


# ---- measured things ----------------------------------------------------------------------------
CHILD = r"""
import json, sys, time
from pathlib import Path
from flowscope.importers import format_module
from flowscope.importers.sink import ImportSink
from flowscope.store.layout import write_segment
fmt, path, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
sink = ImportSink("bench", path, fmt, lambda _r, t, seg, d: write_segment(out, t, seg, d), None, out)
t0 = time.perf_counter()
format_module(fmt).read(path, sink)
sink.flush()
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "rows": sum(sink.counts.values()), "counts": sink.counts,
                  "warnings": sink.warnings[:5],
                  "maxrss_mb": int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024}))
"""


def run_flowscope(fmt: str, path: Path, scratch: Path) -> dict:
    """Import ``path`` in a child process; its seconds (read + flush), rows, and peak RSS."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, fmt, str(path), str(scratch)], capture_output=True,
                       text=True, check=False, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise BenchError(f"flowscope import of {path} failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["wall_seconds"] = wall
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def run_pj_dump(path: Path) -> dict:
    """``pj_dump -e 1e15 path > /dev/null``: wall seconds and peak RSS (its VmHWM, polled every 20 ms; the
    rusage of a child would also count the pre-exec copy of this process)."""
    exe = shutil.which("pj_dump")
    if exe is None:
        raise BenchError("pj_dump not found (apt-get install pajeng)")
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen([exe, "-e", "1e15", str(path)], stdout=null, stderr=subprocess.PIPE)
        hwm = 0
        while True:
            pid, status, _ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            try:
                with open(f"/proc/{proc.pid}/status") as st:
                    hwm = max(hwm, next(int(x.split()[1]) for x in st if x.startswith("VmHWM")))
            except (OSError, StopIteration):
                pass
            time.sleep(0.02)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise BenchError(f"pj_dump refused {path} (exit {proc.returncode}): {err[-2000:]}")
    return {"seconds": wall, "maxrss_mb": hwm / 1024}


def count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += chunk.count(b"\n")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=int, default=520, help="Paje trace size to generate, MB (default 520)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions; figures are medians (default 3)")
    p.add_argument("--workers", type=int, default=64, help="simulated workers (default 64)")
    p.add_argument("--threads", type=int, default=4, help="threads per worker (default 4)")
    p.add_argument("--otf2-spans", type=int, default=300_000, help="task spans written to the OTF2 archive")
    p.add_argument("--no-chrome", action="store_true", help="skip the Chrome importer measurement")
    p.add_argument("--no-otf2", action="store_true", help="skip the OTF2 importer measurement")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "flowscope-bench-import",
                   help="where the generated run and traces are kept between runs")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    return p.parse_args(argv)


def prepare(args: argparse.Namespace) -> dict:
    """The generated run and its Paje / Chrome / OTF2 exports, from the cache when there."""
    from flowscope.exporters import export_run  # noqa: F401 - registry import check
    from flowscope.exporters import paje as paje_exp
    from flowscope.exporters import perfetto as perfetto_exp
    from flowscope.store.run import open_run

    tasks = max(1000, args.size_mb * 1_000_000 // BYTES_PER_TASK)
    key = f"t{tasks}-w{args.workers}-k{args.threads}"
    cache = args.cache / key
    done = cache / "done.json"
    if done.is_file():
        info = json.loads(done.read_text())
        print(f"using cached traces in {cache} (generated in {info['generate_seconds']:.0f} s)", file=sys.stderr)
    else:
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        info = {}
        t0 = time.perf_counter()
        run_dir = generate_run(cache / "store", tasks, args.workers, args.threads)
        info["simulate_seconds"] = time.perf_counter() - t0
        run = open_run(run_dir)
        print(f"simulated run: {run.counts()} in {info['simulate_seconds']:.1f} s", file=sys.stderr)
        t1 = time.perf_counter()
        info["paje_counts"] = paje_exp.write(run, cache / "trace.paje")
        info["paje_export_seconds"] = time.perf_counter() - t1
        print(f"Paje export: {info['paje_counts']} in {info['paje_export_seconds']:.1f} s", file=sys.stderr)
        t1 = time.perf_counter()
        perfetto_exp.write(run, cache / "trace.perfetto.json")
        info["perfetto_export_seconds"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        info["otf2_events"] = write_otf2(run_dir, cache / "otf2", args.otf2_spans)
        info["otf2_write_seconds"] = time.perf_counter() - t1
        info["generate_seconds"] = time.perf_counter() - t0
        info["run_counts"] = run.counts()
        done.write_text(json.dumps(info, indent=2))
        print(f"generated in {info['generate_seconds']:.0f} s: {cache}", file=sys.stderr)
    info["dir"] = str(cache)
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = prepare(args)
    cache = Path(info["dir"])
    paje = cache / "trace.paje"
    size = paje.stat().st_size
    lines = count_lines(paje)
    scratch = Path(tempfile.mkdtemp(prefix="flowscope-bench-import-"))
    fs: list[dict] = []
    pj: list[dict] = []
    try:
        for rep in range(args.repeat):
            order = ("flowscope", "pj_dump") if rep % 2 == 0 else ("pj_dump", "flowscope")
            for which in order:
                if which == "flowscope":
                    r = run_flowscope("paje", paje, scratch / "paje")
                    fs.append(r)
                else:
                    r = run_pj_dump(paje)
                    pj.append(r)
                print(f"rep {rep + 1}/{args.repeat} {which}: {r['seconds']:.2f} s, peak {r['maxrss_mb']:.0f} MB",
                      file=sys.stderr)
        extra: dict[str, dict] = {}
        if not args.no_chrome:
            cpath = cache / "trace.perfetto.json"
            runs = [run_flowscope("chrome", cpath, scratch / "chrome") for _ in range(args.repeat)]
            sec = statistics.median(r["seconds"] for r in runs)
            extra["chrome"] = {"file_mb": round(cpath.stat().st_size / 1e6, 1), "rows": runs[0]["rows"],
                               "seconds": round(sec, 3), "rows_per_s": round(runs[0]["rows"] / sec),
                               "peak_rss_mb": round(max(r["maxrss_mb"] for r in runs))}
            print(f"chrome: {extra['chrome']}", file=sys.stderr)
        if not args.no_otf2:
            opath = cache / "otf2" / "traces.otf2"
            runs = [run_flowscope("otf2", opath, scratch / "otf2") for _ in range(args.repeat)]
            sec = statistics.median(r["seconds"] for r in runs)
            extra["otf2"] = {"events": info["otf2_events"], "rows": runs[0]["rows"], "seconds": round(sec, 3),
                             "rows_per_s": round(runs[0]["rows"] / sec),
                             "events_per_s": round(info["otf2_events"] / sec),
                             "peak_rss_mb": round(max(r["maxrss_mb"] for r in runs))}
            print(f"otf2: {extra['otf2']}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    value = statistics.median(r["seconds"] for r in fs)
    peer = statistics.median(r["seconds"] for r in pj)
    ratio = value / peer
    result = {
        "benchmark": BENCH, "metric": "paje_import_seconds", "value": round(value, 3), "unit": "s",
        "target": f"<= {TARGET} x pj_dump", "meets_target": ratio <= TARGET,
        "peers": {MAIN_PEER: {"value": round(peer, 3), "unit": "s",
                              "peak_rss_mb": round(max(r["maxrss_mb"] for r in pj))}},
        "ratio_vs_peer": round(ratio, 3),
        "params": {
            "paje_file_mb": round(size / 1e6, 1), "paje_lines": lines, "repeat": args.repeat,
            "flowscope_seconds_all": [round(r["seconds"], 3) for r in fs],
            "pj_dump_seconds_all": [round(r["seconds"], 3) for r in pj],
            "flowscope_peak_rss_mb": round(max(r["maxrss_mb"] for r in fs)),
            "flowscope_rows": fs[0]["rows"], "flowscope_counts": fs[0]["counts"],
            "flowscope_lines_per_s": round(lines / value),
            "generated": {k: v for k, v in info.items() if k != "dir"},
            "workers": args.workers, "threads": args.threads,
            "importers": extra, "commit": git_commit(), "cpu": cpu_model(),
        },
    }
    write_result(result, args.output)
    print(f"import: flowscope {value:.2f} s vs pj_dump {peer:.2f} s on a {size / 1e6:.0f} MB Paje trace "
          f"(ratio {ratio:.2f}, target <= {TARGET}); peak RSS flowscope "
          f"{result['params']['flowscope_peak_rss_mb']} MB, pj_dump {result['peers'][MAIN_PEER]['peak_rss_mb']} MB; "
          + "; ".join(f"{k} {v['rows_per_s']:,} rows/s" for k, v in extra.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
