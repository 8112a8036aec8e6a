"""The HTML report at scale: time to build and size of the report (the run's dashboard pages as one offline file)
of a real 100,000-task Dask run, beside Dask's own ``distributed.performance_report`` of the same computation.

One real run: a DAG of tiny tasks (``load`` leaves, one ``inc`` each, then a binary tree of ``add`` down
to one key; about ``--tasks`` tasks in all) on ``LocalCluster(n_workers=2, threads_per_worker=2)``, recorded
with ``flowscope.sources.dask.observe`` and flowscope's hardware sampler (1 s), while two
``performance_report`` blocks surround the same computation:

* ``dask_performance_report`` (the main peer, ``ratio_vs_peer``) -- ``performance_report(filename=...)``
  as users call it (default ``mode``: the page loads BokehJS from a CDN, so it does not open offline);
* ``dask_performance_report_inline`` -- ``performance_report(filename=..., mode="inline")``: BokehJS
  embedded, self-contained like flowscope's report.

Measured (the run itself happens once; the cluster stays up after it):

* flowscope -- ``flowscope.report.write_report(open_run(run_dir), path)``: the run read from its Parquet
  files through DuckDB, the live view's snapshot, every analysis page's view (the advisor, the critical path,
  the profile, the charts, the anomalies, the logs) and the forecasts computed, the file written. A fresh ``Run`` every time. This is
  the in-process figure (``value``), what ``flowscope run`` / ``observe`` do at the end of a run, and the one
  timed the same way as the peer (both inside a running Python process).
* ``flowscope report RUN -o OUT`` -- the same, as a user runs it afterwards: a new Python process, start-up
  and imports included (``params.flowscope_cli_seconds``).
* each peer -- its ``__exit__``, which is where performance_report does all its work (the scheduler
  builds the Bokeh document from its in-memory task stream, profiles and bandwidth records, and the
  file is written). The first ``__exit__`` closes the real block around the computation; the repetitions
  call ``__exit__`` again on the same object, which rebuilds the report for the same window from the
  scheduler's state (the cluster is idle by then).

Checked before any time is printed: the graph's result, one task span per task in the run, and that every report
built covers the run's tasks (flowscope's breakdown, in the file's embedded document, and performance_report's
summary both give the number of tasks; each must equal the graph's). flowscope and the peers alternate (the order rotates every repetition); the
figures are medians. Sizes
are the files' sizes on disk. With ``--render`` (default when Chromium and Playwright are there) the
time headless Chromium takes to open flowscope's report and draw its overview with every task in the stream, and to
open its critical-path page, is measured too, beside the time it takes to open the inline performance_report and
have Bokeh build its views (each a new page, ``--repeat`` rounds, interleaved).
Writes ``bench/results/report.json`` (format: DESIGN.md, "Benchmarks") and prints one summary line last.

    python bench/report.py                   # 100,000 tasks, 5 repetitions (a few minutes)
    python bench/report.py --quick           # smoke run: 5,000 tasks, 1 repetition
"""

from __future__ import annotations

import argparse
import os
import platform
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

import flowscope
from _machine import cpu_model, git_commit, write_result
from flowscope.report import write_report
from flowscope.store.run import open_run

BENCH = "report"
TARGET_S = 10.0
TARGET_BYTES = 20 * 2**20
MAIN_PEER = "dask_performance_report"
INLINE_PEER = "dask_performance_report_inline"
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
CHROMIUM = os.environ.get("FLOWSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]

console = Console(stderr=True)


class BenchError(RuntimeError):
    """The benchmark could not run, or the run does not hold what was computed."""


# ---- the workload -------------------------------------------------------------------------------------------

def load(i):
    return i


def inc(x):
    return x + 1


def add(a, b):
    return a + b


def graph(tasks: int) -> tuple[dict, str, int]:
    """A raw Dask graph of about ``tasks`` tiny tasks: L loads, L incs, a binary tree of L - 1 adds.
    Returns (graph, root key, number of tasks)."""
    leaves = max(2, (tasks + 1) // 3)
    dsk: dict = {}
    for i in range(leaves):
        dsk[f"load-{i}"] = (load, i)
        dsk[f"inc-{i}"] = (inc, f"load-{i}")
    level = [f"inc-{i}" for i in range(leaves)]
    depth = 0
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level) - 1, 2):
            key = f"add-{depth}-{j // 2}"
            dsk[key] = (add, level[j], level[j + 1])
            nxt.append(key)
        if len(level) % 2:
            nxt.append(level[-1])
        level, depth = nxt, depth + 1
    return dsk, level[0], len(dsk)


def expected_result(leaves: int) -> int:
    return sum(range(1, leaves + 1))


# ---- measurements -------------------------------------------------------------------------------------------

def build_flowscope(run_dir: Path, out: Path) -> dict:
    t0 = time.perf_counter()
    path = write_report(open_run(run_dir), out)
    took = time.perf_counter() - t0
    return {"seconds": took, "bytes": path.stat().st_size, "path": path}


def build_flowscope_cli(run_dir: Path, out: Path) -> dict:
    """``flowscope report RUN -o OUT`` in a new process: whole-process wall time."""
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flowscope", "report", str(run_dir), "-o", str(out)],
                          capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise BenchError(f"flowscope report exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return {"seconds": took, "bytes": out.stat().st_size, "path": out}


def exit_peer(report, filename: Path) -> dict:
    report.filename = str(filename)
    t0 = time.perf_counter()
    report.__exit__(None, None, None)
    took = time.perf_counter() - t0
    return {"seconds": took, "bytes": filename.stat().st_size, "path": filename}


# what each report says it covers: the compute row of flowscope's breakdown (the profile page's view, in the file's
# embedded document), the summary of Dask's performance_report ("number of tasks: 1018")
_DOC = re.compile(r'<script type="application/json" id="flowscope-doc">(.*?)</script>', re.DOTALL)
_DASK_TASKS = re.compile(r"number of tasks: (\d+)")


def tasks_shown(path: Path, kind: str) -> int:
    """The number of tasks the report at ``path`` (``kind``: flowscope or dask) says it covers."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if kind == "dask":
        m = _DASK_TASKS.search(text)
        if m is None:
            raise BenchError(f"{path}: no task count found in the dask report")
        return int(m.group(1))
    m = _DOC.search(text)
    if m is None:
        raise BenchError(f"{path}: no embedded document in flowscope's report")
    rows = json.loads(m.group(1))["views"]["profile"].get("breakdown") or []
    counts = [r["count"] for r in rows if r["category"] == "compute" and r["count"] is not None]
    if not counts:
        raise BenchError(f"{path}: no compute row in flowscope's breakdown")
    return int(counts[0])


#: when a page is drawn: flowscope's overview with every task in its stream, its critical-path page rendered once;
#: the peer's file (Bokeh) with its document's views built
READY = {
    "overview": "n => window.flowscopeLive && flowscopeLive.summary().stream >= n",
    "critical-path": "() => window.flowscopeView && flowscopeView.renders > 0",
    "peer": "() => window.Bokeh && Bokeh.documents && Bokeh.documents.length > 0 && Bokeh.index && "
            "Object.keys(Bokeh.index).length > 0",
}


def render_seconds(flowscope_file: Path, peer_file: Path, tasks: int, repeat: int) -> dict | None:
    """Headless Chromium, offline, a new page each time: from navigation to flowscope's report drawn (its overview
    with every task in the stream; its critical-path page) and to the peer's self-contained file (Dask's
    performance_report, mode="inline") drawn by Bokeh; ``repeat`` rounds, the three interleaved (the order rotates).
    Medians and spreads, in seconds; None without a browser."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path(CHROMIUM).exists():
        return None
    opens = [("overview", flowscope_file.resolve().as_uri(), READY["overview"], tasks),
             ("critical-path", flowscope_file.resolve().as_uri() + "#critical-path", READY["critical-path"], None),
             ("peer", peer_file.resolve().as_uri(), READY["peer"], None)]
    took: dict[str, list[float]] = {name: [] for name, *_ in opens}
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for rep in range(repeat):
                for name, url, ready, arg in opens[rep % 3:] + opens[:rep % 3]:
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    try:
                        page.on("pageerror", lambda e: errors.append(str(e)))
                        page.route("http*://**", lambda route: route.abort())
                        t0 = time.perf_counter()
                        page.goto(url, wait_until="load", timeout=180_000)
                        page.wait_for_function(ready, arg=arg, timeout=180_000)
                        took[name].append(time.perf_counter() - t0)
                    finally:
                        page.close()
        finally:
            browser.close()
    if errors:
        raise BenchError(f"errors while the reports were drawn: {errors[:3]}")

    def summary(xs: list[float]) -> dict:
        return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
                "samples": [round(x, 3) for x in xs]}

    return {"seconds": summary(took["overview"])["median"], "overview": summary(took["overview"]),
            "critical_path_page": summary(took["critical-path"]), "peer_inline": summary(took["peer"]),
            "is": "navigation to drawn, a new page each time: flowscope's overview with every task in its stream, "
                  "its critical-path page rendered, the inline performance_report with Bokeh's views built"}


# ---- driver -------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=None, help="tasks in the run (default 100,000)")
    p.add_argument("--repeat", type=int, default=None, help="report builds of each kind; medians (default 5)")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster workers (default 2)")
    p.add_argument("--threads", type=int, default=2, help="threads per worker (default 2)")
    p.add_argument("--render", choices=("auto", "yes", "no"), default="auto",
                   help="time headless Chromium opening flowscope's report and the inline peer's (default: when "
                        "available)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="keep the run and the report files in DIR (default: a temporary directory, removed)")
    p.add_argument("--quick", action="store_true", help="smoke run: 5,000 tasks, 1 repetition")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    args = p.parse_args(argv)
    args.tasks = args.tasks if args.tasks is not None else (5_000 if args.quick else 100_000)
    args.repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    for name in ("tasks", "repeat", "workers", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args




def _hardware_sampler(fs):
    try:
        from flowscope.sources.hardware import HardwareSampler
    except ImportError:
        return None
    return HardwareSampler(fs, period=1.0).start()


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def record_run(args, workdir: Path, progress, step) -> dict:
    """The run, once: observe() and both performance_reports around one computation. Returns what the
    repetitions need (the cluster stays up: the peers rebuild from the scheduler's state)."""
    import dask
    from distributed import Client, LocalCluster, performance_report

    from flowscope.sources.dask import observe

    dsk, root, n_tasks = graph(args.tasks)
    leaves = (len(dsk) + 1) // 3
    progress.update(step, description=f"starting LocalCluster ({args.workers}x{args.threads})")
    # the scheduler's task stream (what performance_report draws) keeps every task of the run
    cfg = {"distributed.scheduler.dashboard.tasks.task-stream-length": max(100_000, 2 * n_tasks)}
    stack = dask.config.set(cfg)
    stack.__enter__()
    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=args.threads, processes=True,
                           dashboard_address=":0", worker_dashboard_address=None)
    client = Client(cluster)
    state = {"cluster": cluster, "client": client, "config": stack, "tasks": n_tasks}
    try:
        client.run(lambda: None)  # workers up
        progress.update(step, description=f"running {n_tasks:,} tasks (observed, inside performance_report)")
        t_run = time.perf_counter()
        with observe(client, store=workdir / "store", name="bench-report",
                     command=f"bench/report.py --tasks {args.tasks}") as obs:
            sampler = _hardware_sampler(obs.client)
            peer = performance_report(filename=str(workdir / "peer-first.html"))
            inline = performance_report(filename=str(workdir / "peer-inline-first.html"), mode="inline")
            peer.__enter__()
            inline.__enter__()
            t_compute = time.perf_counter()
            result = client.get(dsk, root)
            compute_s = time.perf_counter() - t_compute
            first_inline = exit_peer(inline, workdir / "peer-inline-first.html")
            first_peer = exit_peer(peer, workdir / "peer-first.html")
            if sampler is not None:
                sampler.stop(timeout=10)
        run_s = time.perf_counter() - t_run
        if result != expected_result(leaves):
            raise BenchError(f"the graph computed {result}, expected {expected_result(leaves)}")
        run = open_run(obs.run_dir)
        spans = int(run.sql("SELECT count(*) AS n FROM spans WHERE kind = 'task'")["n"].iloc[0])
        if spans != n_tasks:
            raise BenchError(f"the run holds {spans} task spans for {n_tasks} tasks (hook errors: {obs.hook_errors})")
        for first in (first_peer, first_inline):
            shown = tasks_shown(first.pop("path"), "dask")
            if shown != n_tasks:
                raise BenchError(f"performance_report covers {shown:,} tasks, the run ran {n_tasks:,}")
        state.update(run_dir=obs.run_dir, peer=peer, inline=inline, compute_s=compute_s, run_s=run_s,
                     first_peer=first_peer, first_inline=first_inline, counts=run.counts(),
                     hook_errors=obs.hook_errors)
        return state
    except BaseException:
        close_cluster(state)
        raise


def close_cluster(state: dict) -> None:
    for name in ("client", "cluster"):
        try:
            state[name].close()
        except Exception:  # noqa: BLE001 - best effort at the end
            pass
    state["config"].__exit__(None, None, None)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="flowscope-bench-report-"))
    workdir.mkdir(parents=True, exist_ok=True)
    samples: dict[str, list[dict]] = {"flowscope": [], "flowscope_cli": [], MAIN_PEER: [], INLINE_PEER: []}
    columns = [SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn()]
    state = None
    render = None
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            step = progress.add_task("preparing", total=2 + 4 * args.repeat)
            state = record_run(args, workdir, progress, step)
            progress.console.print(f"run: {state['tasks']:,} tasks computed in {state['compute_s']:.1f} s "
                                   f"({state['run_s']:.1f} s with observe() set-up and flush); "
                                   f"first performance_report exits: {state['first_peer']['seconds']:.2f} s, "
                                   f"inline {state['first_inline']['seconds']:.2f} s")
            progress.advance(step)
            measures = [
                ("flowscope", "flowscope write_report",
                 lambda tag: build_flowscope(state["run_dir"], workdir / f"flowscope-{tag}.html")),
                ("flowscope_cli", "flowscope report (process)",
                 lambda tag: build_flowscope_cli(state["run_dir"], workdir / f"flowscope-cli-{tag}.html")),
                (MAIN_PEER, "performance_report",
                 lambda tag: exit_peer(state["peer"], workdir / f"peer-{tag}.html")),
                (INLINE_PEER, "performance_report inline",
                 lambda tag: exit_peer(state["inline"], workdir / f"peer-inline-{tag}.html")),
            ]
            for rep in range(args.repeat):
                order = measures[rep % len(measures):] + measures[:rep % len(measures)]
                for key, label, fn in order:
                    progress.update(step, description=f"rep {rep + 1}/{args.repeat}: {label}")
                    res = fn(f"r{rep}")
                    shown = tasks_shown(res.pop("path"), "flowscope" if key.startswith("flowscope") else "dask")
                    if shown != state["tasks"]:  # both sides cover the same computation, before any time is shown
                        raise BenchError(f"{label}: the report covers {shown:,} tasks, the run ran {state['tasks']:,}")
                    samples[key].append(res)
                    progress.console.print(f"rep {rep + 1} {label:<26} {res['seconds']:7.2f} s  {_mib(res['bytes'])}")
                    progress.advance(step)
            if args.render != "no":
                progress.update(step, description="headless Chromium: drawing flowscope's report")
                render = render_seconds(workdir / "flowscope-r0.html", workdir / "peer-inline-r0.html",
                                        state["tasks"], args.repeat)
                if render is None and args.render == "yes":
                    raise BenchError(f"--render yes: Playwright or {CHROMIUM} is missing")
                if render is not None:
                    progress.console.print(
                        f"Chromium opened flowscope's overview in {render['overview']['median']:.2f} s, its critical-path "
                        f"page in {render['critical_path_page']['median']:.2f} s, the inline performance_report in "
                        f"{render['peer_inline']['median']:.2f} s (medians of {args.repeat})")
            progress.advance(step)
    finally:
        if state is not None:
            close_cluster(state)
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)

    def med(key: str, field: str) -> float:
        return statistics.median(s[field] for s in samples[key])

    value = med("flowscope", "seconds")
    size = med("flowscope", "bytes")
    peer = med(MAIN_PEER, "seconds")
    result = {
        "benchmark": BENCH,
        "metric": "build_seconds",
        "value": round(value, 3),
        "unit": "s",
        "target": TARGET_S,
        "meets_target": value <= TARGET_S,
        "peers": {
            MAIN_PEER: {"value": round(peer, 3), "unit": "s"},
            INLINE_PEER: {"value": round(med(INLINE_PEER, "seconds"), 3), "unit": "s"},
        },
        "ratio_vs_peer": round(value / peer, 3),
        "params": {
            "tasks": state["tasks"],
            "workers": args.workers,
            "threads_per_worker": args.threads,
            "repeat": args.repeat,
            "quick": args.quick,
            "main_peer": MAIN_PEER,
            "value_is": "median seconds of flowscope.report.write_report(open_run(run_dir), path) on the finished "
                        "run (read Parquet through DuckDB, build every chart, write the file)",
            "peer_is": "median seconds of performance_report.__exit__ (the scheduler builds the Bokeh document, "
                       "the file is written); the first exit closes the block around the computation, the others "
                       "rebuild it for the same window",
            "report_bytes": int(size),
            "report_size_target_bytes": TARGET_BYTES,
            "meets_size_target": size <= TARGET_BYTES,
            "peer_report_bytes": int(med(MAIN_PEER, "bytes")),
            "peer_inline_report_bytes": int(med(INLINE_PEER, "bytes")),
            "peer_report_opens_offline": False,
            "flowscope_cli_seconds": round(med("flowscope_cli", "seconds"), 3),
            "flowscope_cli_is": "flowscope report RUN -o OUT in a new process (start-up and imports included)",
            "samples_seconds": {k: [round(s["seconds"], 3) for s in v] for k, v in samples.items()},
            "samples_bytes": {k: [s["bytes"] for s in v] for k, v in samples.items()},
            "first_peer_exit_seconds": {MAIN_PEER: round(state["first_peer"]["seconds"], 3),
                                        INLINE_PEER: round(state["first_inline"]["seconds"], 3)},
            "chromium_render": render,
            "run_compute_seconds": round(state["compute_s"], 2),
            "run_seconds_with_observe": round(state["run_s"], 2),
            "run_rows": {k: v for k, v in state["counts"].items() if v},
            "hook_errors": state["hook_errors"],
            "flowscope_commit": git_commit(),
            "load_avg_1m_before": round(load_before, 2),
            "cpu_model": cpu_model(),
            "platform": platform.platform(),
            "flowscope": flowscope.__version__,
            "plotly": _version("plotly"),
            "dask": _version("dask"),
            "distributed": _version("distributed"),
            "bokeh": _version("bokeh"),
            "wall_s": round(time.perf_counter() - wall0, 1),
        },
    }
    write_result(result, args.output)
    console.print(f"wrote {args.output}")
    verdict = "meets" if result["meets_target"] and result["params"]["meets_size_target"] else "misses"
    print(f"report: {state['tasks']:,} tasks: flowscope {value:.2f} s in process "
          f"({med('flowscope_cli', 'seconds'):.2f} s as `flowscope report`), {_mib(size)} ({verdict} targets "
          f"{TARGET_S:.0f} s / {_mib(TARGET_BYTES)}); performance_report {peer:.2f} s, "
          f"{_mib(result['params']['peer_report_bytes'])} (CDN), inline {med(INLINE_PEER, 'seconds'):.2f} s, "
          f"{_mib(result['params']['peer_inline_report_bytes'])} (x{result['ratio_vs_peer']:.2f} time) "
          f"[median of {args.repeat}]", flush=True)
    return 0


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"report: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
