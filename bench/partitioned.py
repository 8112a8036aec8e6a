"""bench/partitioned.py: the breakdown, task groups and anomalies of a run too large for one process, on Dask.

    python bench/partitioned.py                    # a run of 10,000,000 tasks, 5 interleaved repetitions
    python bench/partitioned.py --large-gib 25     # and a run of 25 GiB, larger than this machine's memory, once

The input (bench/_big_run.py) is a Dask-shaped run as the capture stores it: task spans without span ids on 512
worker threads, each task's transitions, dependencies and I/O row, in time-ordered segments that each hold rows of
every thread (the worst case for regrouping by resource).

Sides, each a fresh process timed whole (start-up, imports, the cluster's start included), with the summed resident
memory of the process and its children sampled every 0.2 s:

- ``flowscope analyse RUN --json``: the run on a LocalCluster of this machine's cores (analysis/partitioned.py);
- the same analyses in one process, the way flowscope computes them for one run (``breakdown``, ``task_groups``,
  ``detect_run``): what a user has without the partitioned path;
- DuckDB, the per-group statistics only (count, total, mean, sample std, max of the task durations per group) as
  one SQL query over the run's span segments: what a user would write instead for that part, and the engine that
  scales on one machine. It computes neither the timeline nor the anomalies.

Outputs are compared before any time is printed: the breakdown (every figure, relative 1e-9), the groups (DuckDB's
too) and the anomalies (count, and call id, function and severity of each) must agree.

With ``--large-gib``, the run is written until its segments reach that size; the partitioned side runs once, the
one-process side runs with a watchdog that stops it when its memory passes ``--memory-cap-gib`` (default 20 of
this machine's 23 GiB), and DuckDB's groups are the reference the partitioned groups are checked against.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _big_run import make_run  # noqa: E402
from _machine import git_commit, write_result  # noqa: E402

ONE_PROCESS = r"""
import json, sys
import flowscope
from flowscope.analysis.anomalies.detect import detect_run
from flowscope.analysis.breakdown import breakdown, task_groups
run = flowscope.open_run(sys.argv[1])
a = detect_run(run).anomalies
print(json.dumps({"breakdown": breakdown(run).to_dict(), "task_groups": task_groups(run).to_dict("records"),
                  "anomalies": a.num_rows,
                  "top_anomalies": a.select(["call_id", "function", "severity_ns"]).to_pylist()}, default=str))
"""

DUCKDB = r"""
import json, sys
import duckdb
duckdb.execute("SET enable_progress_bar = false")  # it draws on stdout
glob = sys.argv[1] + "/spans/*.parquet"
rows = duckdb.sql(f'''
    SELECT name AS "group", count(*) AS count, sum(end_ns - start_ns) / 1e9 AS total_s,
           avg(end_ns - start_ns) / 1e9 AS mean_s, coalesce(stddev_samp(end_ns - start_ns), 0) / 1e9 AS std_s,
           max(end_ns - start_ns) / 1e9 AS max_s
    FROM read_parquet('{glob}') WHERE kind = 'task' GROUP BY name ORDER BY total_s DESC, "group"''').fetchall()
cols = ["group", "count", "total_s", "mean_s", "std_s", "max_s"]
print(json.dumps({"task_groups": [dict(zip(cols, r)) for r in rows]}))
"""


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def timed(cmd: list[str], cap_bytes: int | None = None) -> dict:
    """Run ``cmd``; its wall time, peak summed RSS of its process tree, output, and whether the cap stopped it."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    capped = [False]
    done = threading.Event()

    def sample() -> None:
        import psutil

        while not done.wait(0.2):
            rss = _tree_rss(proc.pid)
            peak[0] = max(peak[0], rss)
            if cap_bytes and rss > cap_bytes:
                capped[0] = True
                for q in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                    try:
                        q.kill()
                    except psutil.NoSuchProcess:
                        pass
                return

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t
    done.set()
    th.join()
    return {"wall_s": wall, "peak_rss_bytes": peak[0], "returncode": proc.returncode, "stdout": out,
            "stderr": err[-3000:], "capped": capped[0]}


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12) + 1e-9


def check_same(ours: dict, one: dict | None, duck: dict | None) -> None:
    """Fail, printing no time, unless the sides agree."""
    if one is not None:
        for k, v in one["breakdown"].items():
            w = ours["breakdown"][k]
            if isinstance(v, float) and not _close(v, w):
                raise SystemExit(f"breakdown {k}: partitioned {w} != one process {v}")
            if isinstance(v, dict) and (v.keys() != w.keys() or not all(_close(v[c], w[c]) for c in v)):
                raise SystemExit(f"breakdown {k}: partitioned {w} != one process {v}")
            if not isinstance(v, (float, dict)) and v != w:
                raise SystemExit(f"breakdown {k}: partitioned {w} != one process {v}")
        _same_groups(ours["task_groups"], one["task_groups"], "one process")
        if ours["anomalies"] != one["anomalies"]:
            raise SystemExit(f"anomalies: partitioned {ours['anomalies']} != one process {one['anomalies']}")
        got = [(a["call_id"], a["function"], a["severity_ns"]) for a in ours["top_anomalies"]]
        want = [(a["call_id"], a["function"], a["severity_ns"]) for a in one["top_anomalies"]]
        if len(got) != len(want) or any(g[:2] != w[:2] or abs(g[2] - w[2]) > 1 for g, w in zip(got, want)):
            raise SystemExit(f"anomalies differ: {got[:3]} vs {want[:3]}")
    if duck is not None:
        _same_groups(ours["task_groups"], duck["task_groups"], "DuckDB")


def _same_groups(ours: list[dict], theirs: list[dict], who: str) -> None:
    if [g["group"] for g in ours] != [g["group"] for g in theirs]:
        raise SystemExit(f"groups differ from {who}: {[g['group'] for g in ours][:5]} vs "
                         f"{[g['group'] for g in theirs][:5]}")
    for g, t in zip(ours, theirs):
        for c in ("count", "total_s", "mean_s", "std_s", "max_s"):
            if not _close(float(g[c]), float(t[c])):
                raise SystemExit(f"group {g['group']} {c}: partitioned {g[c]} != {who} {t[c]}")


def _sizes(run_dir: Path) -> dict[str, int]:
    return {d.name: sum(f.stat().st_size for f in d.glob("*.parquet")) for d in run_dir.iterdir() if d.is_dir()}


def _stats(xs: list[float]) -> dict:
    return {"median": float(np.median(xs)), "min": float(min(xs)), "max": float(max(xs)), "samples": xs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10_000_000, help="tasks of the run of the repeated part")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--large-gib", type=float, default=None, help="also a run of this many GiB, once")
    ap.add_argument("--memory-cap-gib", type=float, default=20.0)
    ap.add_argument("--store", type=Path, default=None, help="keep the generated runs here (default: a temp dir)")
    ap.add_argument("--analyse-option", action="append", default=[],
                    help="an option for `flowscope analyse` on the large run (repeat it), e.g. --memory-limit=3GiB")
    ap.add_argument("--large-run", type=Path, default=None,
                    help="the large run written before (with --store): measure it again instead of writing one")
    args = ap.parse_args()
    store = args.store or Path(tempfile.mkdtemp(prefix="flowscope-bench-partitioned-"))
    flowscope_cmd = [sys.executable, "-m", "flowscope"]
    result: dict = {"benchmark": "partitioned", "params": {"commit": git_commit(), "tasks": args.tasks,
                                                           "repeat": args.repeat}}
    try:
        if args.repeat:
            print(f"writing a run of {args.tasks:,} tasks ...", flush=True)
        run_dir = make_run(store / "repeated", rows=args.tasks if args.repeat else 1000, progress=False)
        sides = {
            "partitioned": [*flowscope_cmd, "analyse", str(run_dir), "--json", "--top", str(10**9)],
            "one process": [sys.executable, "-c", ONE_PROCESS, str(run_dir)],
            "duckdb groups": [sys.executable, "-c", DUCKDB, str(run_dir)],
        }
        names = list(sides)
        samples: dict[str, list[dict]] = {n: [] for n in names}
        for rep in range(args.repeat):
            for n in names[rep % 3:] + names[:rep % 3]:  # rotated order
                r = timed(sides[n])
                if r["returncode"] != 0:
                    raise SystemExit(f"{n} failed: {r['stderr']}")
                samples[n].append(r)
                print(f"  rep {rep + 1} {n}: {r['wall_s']:.1f} s, peak {r['peak_rss_bytes'] / 2**30:.2f} GiB",
                      flush=True)
        ours = one = float("nan")
        for i in range(args.repeat):
            check_same(json.loads(samples["partitioned"][i]["stdout"]), json.loads(samples["one process"][i]["stdout"]),
                       json.loads(samples["duckdb groups"][i]["stdout"]))
        result["repeated"] = {} if not args.repeat else {
            n: {"wall_s": _stats([r["wall_s"] for r in samples[n]]),
                "peak_rss_gib": _stats([r["peak_rss_bytes"] / 2**30 for r in samples[n]])} for n in names}
        result["repeated"]["run"] = {"tasks": args.tasks, "bytes_by_table": _sizes(run_dir)}
        if args.repeat:
            ours = result["repeated"]["partitioned"]["wall_s"]["median"]
            one = result["repeated"]["one process"]["wall_s"]["median"]
        for n in names if args.repeat else []:
            w, m = result["repeated"][n]["wall_s"], result["repeated"][n]["peak_rss_gib"]
            print(f"{n:14s} wall {w['median']:.1f} s [{w['min']:.1f}-{w['max']:.1f}], peak memory "
                  f"{m['median']:.2f} GiB [{m['min']:.2f}-{m['max']:.2f}]")
        shutil.rmtree(run_dir)

        large = None
        if args.large_gib or args.large_run:
            if args.large_run:
                big = args.large_run
            else:
                print(f"writing a run of {args.large_gib} GiB ...", flush=True)
                big = make_run(store / "large", gib=args.large_gib)
            sizes = _sizes(big)
            spans = sum(__import__("pyarrow.parquet", fromlist=["x"]).ParquetFile(f).metadata.num_rows
                        for f in (big / "spans").glob("*.parquet"))
            print(f"  {sum(sizes.values()) / 2**30:.2f} GiB, {spans:,} spans", flush=True)
            ours_big = timed([*flowscope_cmd, "analyse", str(big), "--json", "--top", str(10**9), *args.analyse_option])
            if ours_big["returncode"] != 0:
                raise SystemExit(f"partitioned failed on the large run: {ours_big['stderr']}")
            print(f"  partitioned: {ours_big['wall_s']:.0f} s, peak {ours_big['peak_rss_bytes'] / 2**30:.2f} GiB, "
                  f"stages {json.loads(ours_big['stdout'])['timings_s']}", flush=True)
            duck_big = timed([sys.executable, "-c", DUCKDB, str(big)])
            print(f"  DuckDB groups: {duck_big['wall_s']:.0f} s, peak {duck_big['peak_rss_bytes'] / 2**30:.2f} GiB",
                  flush=True)
            check_same(json.loads(ours_big["stdout"]), None, json.loads(duck_big["stdout"]))
            one_big = timed([sys.executable, "-c", ONE_PROCESS, str(big)], cap_bytes=int(args.memory_cap_gib * 2**30))
            large = {"bytes_by_table": sizes, "gib": sum(sizes.values()) / 2**30, "spans": spans,
                     "partitioned": {"wall_s": ours_big["wall_s"], "peak_rss_gib": ours_big["peak_rss_bytes"] / 2**30,
                                     "timings_s": json.loads(ours_big["stdout"])["timings_s"]},
                     "duckdb groups": {"wall_s": duck_big["wall_s"], "peak_rss_gib": duck_big["peak_rss_bytes"] / 2**30},
                     "one process": {"wall_s": one_big["wall_s"], "peak_rss_gib": one_big["peak_rss_bytes"] / 2**30,
                                     "stopped_at_cap": one_big["capped"], "returncode": one_big["returncode"]}}
            result["large"] = large
            print(f"large run {large['gib']:.1f} GiB ({spans:,} spans): partitioned {ours_big['wall_s']:.0f} s, peak "
                  f"{large['partitioned']['peak_rss_gib']:.2f} GiB; DuckDB groups {duck_big['wall_s']:.0f} s, peak "
                  f"{large['duckdb groups']['peak_rss_gib']:.2f} GiB; one process "
                  + (f"stopped at the {args.memory_cap_gib:g} GiB cap after {one_big['wall_s']:.0f} s"
                     if one_big["capped"] else f"{one_big['wall_s']:.0f} s, rc {one_big['returncode']}"))
            if not args.large_run:
                shutil.rmtree(big)
    finally:
        if args.store is None:
            shutil.rmtree(store, ignore_errors=True)
    duck = result["repeated"]["duckdb groups"]["wall_s"]["median"] if args.repeat else float("nan")
    result.update({
        "metric": "wall_s", "value": ours, "unit": "s", "target": None, "meets_target": None,
        "peers": {"one process": {"value": one, "unit": "s"}, "duckdb groups": {"value": duck, "unit": "s"}},
        "ratio_vs_peer": ours / one if args.repeat else None})
    result["params"]["what"] = ("median whole-process wall time of `flowscope analyse` (LocalCluster, all cores) on "
                                "the repeated run; peers: the same analyses in one process, DuckDB's per-group SQL")
    write_result(result, Path(__file__).resolve().parent / "results" / "partitioned.json")
    tail = (f"; large {large['gib']:.1f} GiB run in {large['partitioned']['wall_s']:.0f} s at "
            f"{large['partitioned']['peak_rss_gib']:.1f} GiB peak" if large else "")
    head = (f"{ours:.1f} s vs one process {one:.1f} s ({ours / one:.2f}x) on {args.tasks:,} tasks" if args.repeat
            else "no repeated run")
    print(f"partitioned: {head}{tail}")


if __name__ == "__main__":
    main()
