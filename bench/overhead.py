"""Overhead of Dask capture at each capture level: wall time and CPU time of Dask workloads with no
instrumentation and inside ``observe(client, level=...)``, observe()'s setup and teardown included.

Two workloads, each run in every mode on a fresh ``LocalCluster(n_workers=2, threads_per_worker=2,
processes=True, dashboard_address=None)`` (whose scheduler lives in this process, with the client;
``observe()``'s collector is a child process of this one, started once before any cluster exists with
``flowscope.dask.start_collector`` and shared by every ``observe()``, as a user's process would; its CPU
is counted too):

* ``demo`` (the headline) -- the project's image-processing workflow
  (``flowscope.workflows.image_pipeline.run_pipeline``, what ``flowscope demo`` runs), 48 images of
  512 x 512 written as .npy files, submitted as three task graphs: generate; read, normalise,
  grayscale, Gaussian filter, segment, write; per-batch means and a summary. ``--demo builtin`` runs
  this script's stand-in ``demo_like_workflow`` instead; ``demo_workflow()`` is the one place that
  chooses.
* ``tiny`` -- a DAG of 20,000 tiny tasks (``inc``, then layers of ``add`` of two neighbours of the
  layer before, then one ``sum``), timed from ``client.get`` to its result.

Modes (in each repetition every workload runs in every mode, in an order that rotates; medians of
``--repeat`` repetitions, 7 by default, with a 95 % bootstrap interval over the repetitions, paired):

* ``none``      -- no plugins beyond Dask's defaults: the workload alone;
* ``standard``  -- the workload inside ``with observe(client, store=..., level="standard"):`` (the
  default level), timed from entering the block to leaving it: setup (``__enter__``) + workload +
  teardown (``__exit__``, which returns once every record is on disk). The three are also reported
  apart. Every run is checked: no hook failed and the run holds exactly one task span per task;
* ``full``      -- the same at ``level="full"`` (every worker transition, each task's own I/O);
* ``taskstream`` (only with ``--modes``) -- ``distributed.diagnostics.task_stream.TaskStreamPlugin`` added
  on the scheduler (what the dashboard's task stream and ``get_task_stream`` use);
* ``recorder`` (only with ``--modes``) -- a minimal plugin pair that appends one tuple per transition
  to a list: the floor for any Python plugin that records every transition;
* ``full-variant`` (only with ``--modes``) -- level full with a part of the capture switched off on the
  plugin instances (``--variant``: X1 per-task I/O, X2 worker transition rows), to price that part;
* ``standard-embedded`` (only with ``--modes``) -- ``observe(..., collector="embedded")``: the collector
  on threads of this process (the scheduler's).

The ratio of a level is median(setup + workload + teardown) / median(workload with no instrumentation);
the CPU ratio is the same for the CPU time of every process (this one, the workers, the collector) over
the same span, which moves less than wall time when other programs take the cores.

With ``--hook-timers`` the hooks time themselves (``perf_counter_ns`` around each call of the plugins'
``transition`` and ``update_graph``, and of the callables the worker plugin hands to the open audit
hook and the per-task I/O reader, wrapped on the plugin instances, in this benchmark only), and the
CPU time of every process is accounted per thread group (psutil), which unlike wall time does not
grow when other programs take the cores. ``--profile DIR`` adds, per workload, one untimed flowscope
run with timers inside the hooks that also take the thread's CPU time, and one under ``py-spy
record`` (this process and the workers), summarised in the results.

Dask's local threaded scheduler (no cluster; ``observe()`` with no client, through Dask's callbacks):

* ``local-tiny`` -- the same tiny-task DAG, run by ``dask.threaded.get``;
* ``local-array`` -- a dask.array workload, ``(x @ x.T).mean().compute(scheduler="threads")`` for a
  random ``--array-size`` square matrix in 250 x 250 chunks;

each in modes ``none``, ``profiler`` (``with dask.diagnostics.Profiler():``, Dask's own local profiler:
the peer) and ``flowscope`` (``with observe(store=TMP):``, the default level ``standard``: every task as a
span, the I/O of tasks of 1 ms or more, shorter tasks' charged to the next measured one on their thread, the
hardware sampled every second; setup and teardown timed apart). Each sample is a fresh process
(bench/_local_sample.py) that imports only what its mode uses and first runs the workload once small in its mode
(imports, the collector's start: not timed), so the uninstrumented side holds nothing of flowscope -- no modules
for the garbage collector to walk, no audit hook, which a process keeps once added. Checked before any time is
printed: every sample's result equals the one computed here, and the Profiler and flowscope each record every task
Dask ran. Then ``--local-micro N`` no-op tasks on the synchronous scheduler
(one thread, so the hooks' cost is not blurred by thread hand-offs), a fresh process per sample too, timed by
the calling thread's CPU clock: the cost of the capture per task at level ``standard``, at level ``full`` (every task's I/O read),
without per-task I/O, and at ``standard`` on the capture's pure-Python per-task path (``flowscope-reference``,
FLOWSCOPE_COMPILED=0), beside the Profiler's.

Writes ``bench/results/overhead.json`` (format: bench/README.md; ``levels.<level>.<workload>`` holds
``ratio`` with ``ratio_ci95``, ``cpu_ratio`` with ``cpu_ratio_ci95``, ``setup_s``, ``teardown_s`` and the
target; ``value`` is ``levels.standard.demo.ratio``, or the local tiny graph's ratio when no cluster
workload runs) and prints one summary line last.

    python bench/overhead.py                  # 20,000 tiny tasks, 48 images, 7 repetitions (~15 minutes)
    python bench/overhead.py --quick          # smoke run: 2,000 tasks, 12 images, 1 repetition (~1 minute)
    python bench/overhead.py --profile DIR    # and profile one flowscope run per workload (py-spy into DIR)
    python bench/overhead.py --workloads tiny --modes none,full,full-variant --variant X1
    python bench/overhead.py --workloads local-tiny,local-array   # the local threaded scheduler only
    python bench/overhead.py --workloads local-tiny --local-decompose   # and observe()'s imports, its hooks alone
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import cloudpickle
import dask
import distributed
import numpy as np
from dask import delayed
from distributed import Client, LocalCluster
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

import flowscope
import _tiny_graph
from _machine import cpu_model, git_commit, write_result
from _tiny_graph import tiny_graph
from flowscope.sources.dask import FlowscopeSchedulerPlugin, FlowscopeWorkerPlugin, observe, start_collector

BENCH = "overhead"
# (level, workload) -> target of (setup + workload + teardown) / workload alone, medians
TARGETS = {("standard", "tiny"): 1.05, ("standard", "demo"): 1.03, ("full", "tiny"): 1.10}
TARGET = TARGETS[("standard", "demo")]
TARGET_TINY = TARGETS[("standard", "tiny")]
TARGET_SETUP_TEARDOWN_S = 0.3  # observe()'s setup + teardown together, median, worst level
TARGET_HOOK_US = 30.0  # scheduler-side hook time per task
MAIN_PEER = "none"
LEVELS = ("standard", "full")
MODES = ("none", "standard", "full")
EXTRA_MODES = ("taskstream", "recorder", "full-variant", "standard-embedded")
# the modes that run the workload inside observe(): mode -> capture level
LEVEL_MODES = {"standard": "standard", "full": "full", "full-variant": "full", "standard-embedded": "standard"}
WORKLOADS = ("demo", "tiny")
LOCAL_WORKLOADS = ("local-tiny", "local-array")  # Dask's threaded scheduler, observed through its callbacks
LOCAL_MODES = ("none", "profiler", "flowscope")
#: with --local-decompose: what observe() imports alone, the capture's per-task hooks alone (batches discarded), its
#: rows written without per-task I/O and the hardware sampler, and the same written only at the graph's end
LOCAL_PARTS = ("imports", "hooks-only", "rows-only", "rows-at-end")
TARGET_LOCAL = 1.05    # flowscope / none, local threaded scheduler
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
CLUSTER = {"n_workers": 2, "threads_per_worker": 2, "processes": True, "dashboard_address": None}

console = Console(stderr=True)


class BenchError(RuntimeError):
    """The benchmark could not run, or a capture is incomplete."""


# ---- workload 1: a DAG of tiny tasks -----------------------------------------------------------
# (in bench/_tiny_graph.py, shared with the local-scheduler samples; its functions travel to the workers by value,
# as they did from this script's __main__)
cloudpickle.register_pickle_by_value(_tiny_graph)


def run_tiny(client, dsk: dict, key: str, expected: int) -> None:
    got = client.get(dsk, key)
    if got != expected:
        raise BenchError(f"tiny graph returned {got}, expected {expected}")


# ---- workload 2: an image-processing pipeline in three graphs -----------------------------------
def generate_image(i: int, size: int) -> np.ndarray:
    """An RGB uint8 image: a dozen bright discs on a noisy background."""
    rng = np.random.default_rng(i)
    img = rng.normal(40.0, 12.0, (size, size, 3)).astype(np.float32)
    yy, xx = np.ogrid[:size, :size]
    for _ in range(12):
        cy, cx = rng.uniform(0, size, 2)
        r = rng.uniform(size / 40, size / 12)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] += rng.uniform(80, 180, 3).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_npy(arr: np.ndarray, path: str) -> str:
    np.save(path, arr)
    return path


def read_npy(path: str) -> np.ndarray:
    return np.load(path)


def normalise(img: np.ndarray) -> np.ndarray:
    x = img.astype(np.float32)
    lo = x.min(axis=(0, 1))
    hi = x.max(axis=(0, 1))
    return (x - lo) / np.maximum(hi - lo, 1e-6)


def grayscale(img: np.ndarray) -> np.ndarray:
    return img @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def gaussian(img: np.ndarray, sigma: float) -> np.ndarray:
    from scipy import ndimage

    return ndimage.gaussian_filter(img, sigma)


def segment(img: np.ndarray) -> np.ndarray:
    from scipy import ndimage

    labels, _ = ndimage.label(img > img.mean() + img.std())
    return labels.astype(np.int32)


def region_stats(labels: np.ndarray) -> dict:
    sizes = np.bincount(labels.ravel())[1:]
    return {"images": 1, "objects": len(sizes), "area": int(sizes.sum()),
            "largest": int(sizes.max()) if len(sizes) else 0}


def merge_stats(a: dict, b: dict) -> dict:
    return {"images": a["images"] + b["images"], "objects": a["objects"] + b["objects"],
            "area": a["area"] + b["area"], "largest": max(a["largest"], b["largest"])}


def _graph_keys(objs) -> set:
    keys: set = set()
    for o in objs:
        keys.update(o.__dask_graph__().keys())
    return keys


def demo_like_workflow(client, workdir: Path, images: int = 48, size: int = 512, sigma: float = 2.0) -> dict:
    """The demo pipeline, submitted as three task graphs (each computed before the next is built):
    1. generate + write ``images`` RGB images of ``size`` x ``size`` as .npy files;
    2. read, normalise, grayscale, Gaussian filter, segment, write the labels as .npy;
    3. read the labels, measure regions per image, merge the statistics pairwise into one summary.
    Returns what it did ({"tasks", "graphs", "images", "objects", ...})."""
    raw_dir, seg_dir = workdir / "raw", workdir / "labels"
    raw_dir.mkdir(parents=True, exist_ok=True)
    seg_dir.mkdir(parents=True, exist_ok=True)
    tasks = 0

    written = [delayed(write_npy, pure=True)(delayed(generate_image, pure=True)(i, size, dask_key_name=f"generate-{i}"),
                                             str(raw_dir / f"img-{i:03d}.npy"), dask_key_name=f"write-raw-{i}")
               for i in range(images)]
    tasks += len(_graph_keys(written))
    raw_paths = client.gather(client.compute(written))

    outs = []
    for i, p in enumerate(raw_paths):
        img = delayed(read_npy, pure=True)(p, dask_key_name=f"read-{i}")
        norm = delayed(normalise, pure=True)(img, dask_key_name=f"normalise-{i}")
        gray = delayed(grayscale, pure=True)(norm, dask_key_name=f"grayscale-{i}")
        smooth = delayed(gaussian, pure=True)(gray, sigma, dask_key_name=f"gaussian-{i}")
        labels = delayed(segment, pure=True)(smooth, dask_key_name=f"segment-{i}")
        outs.append(delayed(write_npy, pure=True)(labels, str(seg_dir / f"labels-{i:03d}.npy"),
                                                  dask_key_name=f"write-labels-{i}"))
    tasks += len(_graph_keys(outs))
    seg_paths = client.gather(client.compute(outs))

    level = [delayed(region_stats, pure=True)(delayed(read_npy, pure=True)(p, dask_key_name=f"read-labels-{i}"),
                                              dask_key_name=f"measure-{i}") for i, p in enumerate(seg_paths)]
    depth = 0
    while len(level) > 1:
        depth += 1
        nxt = [delayed(merge_stats, pure=True)(level[j], level[j + 1], dask_key_name=f"merge-{depth}-{j // 2}")
               for j in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    tasks += len(_graph_keys(level))
    summary = client.compute(level[0]).result()
    if summary["images"] != images or summary["objects"] < images:
        raise BenchError(f"demo workflow summary is wrong: {summary}")
    return {"tasks": tasks, "graphs": 3, **summary}


def project_workflow(client, workdir: Path, images: int, size: int, batch: int = 4) -> dict:
    """The project's own demo workflow (``flowscope demo`` runs it): the same pipeline, with per-batch
    means that pull images from several workers, submitted as three graphs."""
    from flowscope.workflows.image_pipeline import run_pipeline

    res = run_pipeline(client, workdir, images=images, size=size, batch=batch)
    if res.images != images or res.objects < images:
        raise BenchError(f"image pipeline result is wrong: {res}")
    # generate, then read/normalise/grayscale/gaussian/segment/write per image, batch means, one summary
    return {"tasks": 7 * images + -(-images // batch) + 1, "graphs": 3, "images": res.images,
            "objects": res.objects}


def demo_workflow(client, workdir: Path, images: int, size: int, which: str = "project") -> dict:
    """THE one place that chooses the demo workflow. ``project``: ``flowscope.workflows.image_pipeline``
    (what ``flowscope demo`` runs); ``builtin``: ``demo_like_workflow`` above, the stand-in written
    before the project had one. Either must return at least {"tasks": <number of tasks submitted>}
    (checked against the task spans flowscope records)."""
    if which == "project":
        return project_workflow(client, workdir, images, size)
    return demo_like_workflow(client, workdir, images=images, size=size)


def demo_available(which: str) -> str:
    if which == "project":
        try:
            import flowscope.workflows.image_pipeline  # noqa: F401
        except ImportError:
            return "builtin"
    return which


# ---- code run inside the scheduler and the workers -------------------------------------------
def _warm_worker() -> int:
    """Imports the workloads need, so that fresh workers do not pay them inside the timed window."""
    import scipy.ndimage  # noqa: F401

    generate_image(0, 16)
    return os.getpid()


def _add_taskstream(dask_scheduler) -> str:
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    dask_scheduler.add_plugin(TaskStreamPlugin(dask_scheduler))
    return TaskStreamPlugin.name


class RecorderSchedulerPlugin(distributed.SchedulerPlugin):
    """The floor: one tuple per transition appended to a list."""

    name = "bench-recorder"

    def __init__(self):
        self.rows = []

    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs):
        self.rows.append((time.time_ns(), key, start, finish, stimulus_id))


class RecorderWorkerPlugin(distributed.WorkerPlugin):
    name = "bench-recorder"

    def setup(self, worker):
        self.rows = []

    def transition(self, key, start, finish, **kwargs):
        self.rows.append((time.time_ns(), key, start, finish))


def _plugin(server, name):
    plugins = server.plugins
    return plugins.get(name)


def _install_timers(server, name: str, methods: tuple, attrs: tuple = (), cpu: bool = False) -> bool:
    """Wrap ``methods`` (hooks) and ``attrs`` (callables stored on the instance, e.g. row writers) of the
    plugin ``name`` on this server with ``perf_counter_ns`` accumulators, on the instance only. With
    ``cpu``, also the calling thread's CPU time (``thread_time_ns``, ~0.45 us a call: profile runs only),
    which leaves out time spent waiting for the GIL or for a core."""
    plugin = _plugin(server, name)
    if plugin is None:
        return False
    pc, tt = time.perf_counter_ns, time.thread_time_ns
    acc = plugin.__dict__.setdefault("_bench_timers", {})

    def wrap(fn, a):
        def timed(*args, **kwargs):
            t0 = pc()
            try:
                return fn(*args, **kwargs)
            finally:
                a[1] += pc() - t0
                a[0] += 1
        return timed

    def wrap_cpu(fn, a):
        def timed(*args, **kwargs):
            c0 = tt()
            t0 = pc()
            try:
                return fn(*args, **kwargs)
            finally:
                a[1] += pc() - t0
                a[2] += tt() - c0
                a[0] += 1
        return timed

    for m in tuple(methods) + tuple(attrs):
        if m in acc:
            continue
        owner, _, leaf = m.rpartition(".")
        obj = plugin
        for part in owner.split(".") if owner else ():
            obj = getattr(obj, part, None)
        if obj is None or not callable(getattr(obj, leaf, None)):
            if m in methods:
                return False
            continue  # a detail the plugin does not have (any more): not timed
        a = acc[m] = [0, 0, 0]
        setattr(obj, leaf, (wrap_cpu if cpu else wrap)(getattr(obj, leaf), a))
    return True


def _read_timers(server, name: str) -> dict:
    plugin = _plugin(server, name)
    if plugin is None:
        return {}
    return {m: tuple(a) for m, a in plugin.__dict__.get("_bench_timers", {}).items()}


def _sched_install(names_methods, cpu=False, dask_scheduler=None):
    return [_install_timers(dask_scheduler, n, m, a, cpu) for n, m, a in names_methods]


def _sched_read(names, dask_scheduler=None):
    return {n: _read_timers(dask_scheduler, n) for n in names}


def _worker_install(names_methods, cpu=False, dask_worker=None):
    return [_install_timers(dask_worker, n, m, a, cpu) for n, m, a in names_methods]


def _worker_read(names, dask_worker=None):
    return {n: _read_timers(dask_worker, n) for n in names}


def thread_group(name: str) -> str:
    if name == "IO loop":
        return "dask-loop"  # in the bench process: the scheduler and the client share this event loop
    if name == "MainThread":
        return "main"       # in a worker: its event loop; in the bench process: the driver (mostly waiting)
    if "Dask-Default-Threads" in name or name.startswith("ThreadPoolExecutor"):
        return "dask-executor"
    if name.startswith(("flowscope-builder", "flowscope-sender")):
        return "flowscope-client-threads"
    if name.startswith("flowscope-writer") or name == "flowscope-http":
        return "flowscope-collector"
    if name.startswith("AnyIO worker thread"):
        return "flowscope-collector"
    if name == "native":
        return "native"
    return "other"


def _cpu_snapshot() -> dict:
    """CPU seconds of this process and of each live thread (by native id, with its Python name)."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    p = psutil.Process()
    ct = p.cpu_times()
    return {"pid": os.getpid(), "process": ct.user + ct.system,
            "threads": {th.id: (names.get(th.id, "native"), th.user_time + th.system_time) for th in p.threads()}}


def _collector_pids() -> list[int]:
    """Collector processes observe() started for this process (``python -m flowscope serve``)."""
    import psutil

    pids = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = child.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "flowscope" in cmd and "serve" in cmd:
            pids.append(child.pid)
    return pids


def _collector_cpu(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            ct = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += ct.user + ct.system
    return total


def _all_cpu(client, collectors: list[int]) -> float:
    """CPU seconds so far of this process, the workers and the collector process, together."""
    return _sum_cpu({"bench": _cpu_snapshot(), "workers": client.run(_cpu_snapshot),
                     "collector": _collector_cpu(collectors)})


def _sum_cpu(snap: dict) -> float:
    return snap["bench"]["process"] + sum(w["process"] for w in snap["workers"].values()) + snap["collector"]


def _cpu_delta(before: dict, after: dict) -> dict:
    groups: dict[str, float] = defaultdict(float)
    for tid, (name, t1) in after["threads"].items():
        t0 = before["threads"].get(tid, (name, 0.0))[1]
        groups[thread_group(name)] += max(0.0, t1 - t0)
    return {"process": after["process"] - before["process"], "groups": dict(groups)}


def _merge_cpu(parts: list[dict]) -> dict:
    out = {"process": sum(p["process"] for p in parts), "groups": defaultdict(float)}
    for p in parts:
        for g, v in p["groups"].items():
            out["groups"][g] += v
    out["groups"] = dict(out["groups"])
    return out


# ---- variants: a part of the capture left out, to measure what it costs (mode flowscope-variant) --
# The first round of changes measured here by monkeypatching the plugin instances (pyarrow's pandas
# import paid at setup, the counters' own read not charged to each task, worker hooks that skip tasks
# with nothing new, attrs formatted directly, cached worker ids) is in plugins.py since 088f2a9; see
# docs/performance.md. What is left are switches that remove a part, to price it:
#   X1  no per-task I/O: the worker's executor is unwrapped (no /proc read, no window per task);
#   X2  no worker-side transition rows (the scheduler's are kept; spans, transfers, I/O unchanged).
VARIANTS = ("X1", "X2")


def _variant_worker(want: tuple, dask_worker=None) -> list[str]:
    applied = []
    plugin = dask_worker.plugins.get(FlowscopeWorkerPlugin.name)
    if plugin is None:
        return applied
    executor = getattr(plugin, "_executor", None)
    if "X1" in want and executor is not None and dask_worker.executors.get("default") is executor:
        dask_worker.executors["default"] = executor.inner  # teardown checks identity before restoring
        applied.append("X1")
    if "X2" in want and hasattr(plugin, "_append") and plugin.level == "full":
        plugin._append = lambda row: None
        applied.append("X2")
    return applied


def apply_variant(client, want: tuple) -> list[str]:
    """Applies the switches in ``want`` on every worker (timed as part of setup); returns those applied
    on all of them."""
    per_worker = list(client.run(_variant_worker, tuple(want)).values())
    return sorted(set(per_worker[0]).intersection(*per_worker[1:])) if per_worker else []


# ---- one measurement -----------------------------------------------------------------------------
class Workload:
    def __init__(self, kind: str, args: argparse.Namespace):
        self.kind = kind
        self.args = args
        if kind == "tiny":
            self.dsk, self.key, self.tasks, self.expected = tiny_graph(args.tasks)

    def run(self, client, workdir: Path) -> int:
        """Runs the workload; returns the number of tasks it submitted."""
        if self.kind == "tiny":
            run_tiny(client, dict(self.dsk), self.key, self.expected)
            return self.tasks
        return demo_workflow(client, workdir, self.args.images, self.args.size, self.args.demo)["tasks"]


def _timed_hooks(mode: str, detail: bool) -> tuple[list, list]:
    """(scheduler [(plugin name, hooks, instance attrs)], worker [...]) to time in ``mode``."""
    if mode in LEVEL_MODES:
        sched = [(FlowscopeSchedulerPlugin.name, ("transition", "update_graph"),
                  ("_append",) if detail else ())]
        if LEVEL_MODES[mode] == "full":
            work = [(FlowscopeWorkerPlugin.name, ("transition",),
                     ("_audit.emit", "_io_reader.read") + (("_append", "_record_startstops",
                                                            "_drain_transfers", "_emit_span", "_thread_resource",
                                                            "_record_task_io") if detail else ()))]
        else:  # no transition hook: what the handle_stimulus wrapper calls per execution and per fetch
            work = [(FlowscopeWorkerPlugin.name, ("_executed", "_drain_transfers"),
                     ("_audit.emit", "_io_reader.read") + (("_emit_span", "_thread_resource", "_record_task_io")
                                                           if detail else ()))]
        return sched, work
    if mode == "taskstream":
        return [("task-stream", ("transition",), ())], []
    if mode == "recorder":
        return [(RecorderSchedulerPlugin.name, ("transition",), ())], [(RecorderWorkerPlugin.name, ("transition",), ())]
    return [], []


def _sched_tasks_left(dask_scheduler=None) -> int:
    return len(dask_scheduler.tasks)


def _worker_tasks_left(dask_worker=None) -> int:
    return len(dask_worker.state.tasks)


def _wait_forgotten(client, timeout: float = 15.0) -> None:
    """Waits (untimed) until the scheduler and the workers have forgotten every task."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not client.run_on_scheduler(_sched_tasks_left) and not any(client.run(_worker_tasks_left).values()):
            return
        time.sleep(0.05)


def _sum_worker_timers(per_worker: dict) -> dict:
    total: dict = {}
    for timers in per_worker.values():
        for plugin, ms in timers.items():
            for m, vals in ms.items():
                c = total.setdefault(plugin, {}).setdefault(m, [0] * len(vals))
                for i, v in enumerate(vals):
                    c[i] += v
    return {p: {m: tuple(v) for m, v in ms.items()} for p, ms in total.items()}


def measure(workload: Workload, mode: str, args: argparse.Namespace, base: Path, tag: str, *,
            detail: bool = False, spy_dir: Path | None = None) -> dict:
    """One fresh cluster, one run of ``workload`` in ``mode``. For the modes inside ``observe()``, the setup
    (``__enter__``), the workload and the teardown (``__exit__``) are timed one after the other, and the CPU of
    every process is taken over the three. ``detail``: timers inside the hooks too, with thread CPU time (a
    profile run); ``spy_dir``: py-spy on the scheduler's and workers' processes."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=base))
    res: dict = {"mode": mode, "workload": workload.kind, "load_avg_1m": round(os.getloadavg()[0], 2),
                 "setup_s": 0.0, "teardown_s": 0.0}
    timers = detail or args.hook_timers
    gc.collect()
    with LocalCluster(**CLUSTER) as cluster, Client(cluster) as client:
        worker_pids = client.run(_warm_worker)
        sched_hooks, worker_hooks = _timed_hooks(mode, detail) if timers else ([], [])
        cm = obs = None
        if mode == "taskstream":
            client.run_on_scheduler(_add_taskstream)
        elif mode == "recorder":
            client.register_plugin(RecorderSchedulerPlugin())
            client.register_plugin(RecorderWorkerPlugin())
        collectors = _collector_pids()
        spies = _start_py_spy(spy_dir, tag, worker_pids, collectors) if spy_dir else []
        try:
            cpu0 = {"bench": _cpu_snapshot(), "workers": client.run(_cpu_snapshot),
                    "collector": _collector_cpu(collectors)}
            if mode in LEVEL_MODES:
                extra = {"collector": "embedded"} if mode == "standard-embedded" else {}
                t0 = time.perf_counter()
                cm = observe(client, store=args.store, name=f"bench-overhead-{tag}", level=LEVEL_MODES[mode],
                             **extra)
                obs = cm.__enter__()
                if mode == "full-variant":
                    res["variant_applied"] = apply_variant(client, args.variant)
                res["setup_s"] = time.perf_counter() - t0
            try:
                if sched_hooks and not all(client.run_on_scheduler(_sched_install, sched_hooks, detail)):
                    raise BenchError(f"{mode}: a scheduler plugin to time is missing: {sched_hooks}")
                if worker_hooks and not all(all(v) for v in client.run(_worker_install, worker_hooks, detail).values()):
                    raise BenchError(f"{mode}: a worker plugin to time is missing: {worker_hooks}")
                cpu_a = _all_cpu(client, collectors)  # untimed: between the setup and the workload (every mode)
                t0 = time.perf_counter()
                tasks = workload.run(client, workdir)
                res["wall_s"] = time.perf_counter() - t0
                cpu_b = _all_cpu(client, collectors)
                if timers:
                    _wait_forgotten(client)  # the release transitions of the last results, so hook counts are whole
                    if sched_hooks:
                        res["sched_timers"] = client.run_on_scheduler(_sched_read, [n for n, _, _ in sched_hooks])
                    if worker_hooks:
                        res["worker_timers"] = _sum_worker_timers(client.run(_worker_read,
                                                                             [n for n, _, _ in worker_hooks]))
            except BaseException:
                if cm is not None:
                    cm.__exit__(*sys.exc_info())
                raise
            if cm is not None:
                t0 = time.perf_counter()
                cm.__exit__(None, None, None)
                res["teardown_s"] = time.perf_counter() - t0
            cpu1 = {"bench": _cpu_snapshot(), "workers": client.run(_cpu_snapshot),
                    "collector": _collector_cpu(collectors)}
        finally:
            if spies:
                res["py_spy"] = _stop_py_spy(spies)
        res["tasks"] = tasks
        res["total_s"] = res["setup_s"] + res["wall_s"] + res["teardown_s"]
        cpu_0, cpu_1 = _sum_cpu(cpu0), _sum_cpu(cpu1)
        res["setup_cpu_s"], res["teardown_cpu_s"] = cpu_a - cpu_0, cpu_1 - cpu_b
        res["cpu_s"] = {"bench": _cpu_delta(cpu0["bench"], cpu1["bench"]),
                        "workers": _merge_cpu([_cpu_delta(cpu0["workers"][w], cpu1["workers"][w])
                                               for w in cpu1["workers"]]),
                        "collector": {"process": cpu1["collector"] - cpu0["collector"], "groups": {}}}
        if cm is not None:
            res["hook_errors"] = obs.hook_errors
            if any(obs.hook_errors.values()):
                raise BenchError(f"flowscope hooks failed: {obs.hook_errors}")
            res["collector_pid"] = obs.collector_pid
            counts = obs.run.counts()
            spans = int(obs.run.sql("SELECT count(*) AS n FROM spans WHERE kind = 'task'")["n"][0])
            res["records"] = {"task_spans": spans, **{k: counts[k] for k in ("transitions", "spans", "dependencies", "io")
                                                     if k in counts}}
            if spans != res["tasks"]:
                raise BenchError(f"{workload.kind}: {res['tasks']} tasks ran but the run holds {spans} task spans")
            shutil.rmtree(obs.run_dir, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return res


# ---- py-spy (profile runs only) -------------------------------------------------------------------
def _start_py_spy(profile_dir: Path, tag: str, worker_pids: dict, collector_pids: list) -> list:
    exe = shutil.which("py-spy")
    if exe is None:
        raise BenchError("--profile needs py-spy (pip install py-spy)")
    profile_dir.mkdir(parents=True, exist_ok=True)
    spies = []
    targets = ([("bench", os.getpid())] + [(f"worker-{i}", pid) for i, pid in enumerate(sorted(worker_pids.values()))]
               + [(f"collector-{i}", pid) for i, pid in enumerate(collector_pids)])
    for role, pid in targets:
        out = profile_dir / f"{tag}-{role}.txt"
        cmd = [exe, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--threads", "--nonblocking",
               "--output", str(out)]
        with open(profile_dir / f"{tag}-{role}.log", "w") as log:
            spies.append((role, pid, out, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
    time.sleep(1.0)  # let py-spy attach before the clock starts
    return spies


def _stop_py_spy(spies: list) -> dict:
    files = {}
    for role, pid, out, proc in spies:
        proc.send_signal(signal.SIGINT)
    for role, pid, out, proc in spies:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        files[role] = {"pid": pid, "file": str(out)}
    return files


def summarise_profile(path: Path) -> dict:
    """Samples of one ``py-spy record --format raw --threads`` file: by thread group, how many of each
    group's samples are inside flowscope code, and flowscope's costliest entry points and leaves."""
    groups: Counter = Counter()
    fs_by_group: Counter = Counter()
    fs_entry: Counter = Counter()   # first flowscope frame of the stack: what the caller spent in flowscope
    fs_leaf: Counter = Counter()    # innermost frame of the stacks that went through flowscope
    fs_own: Counter = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        frames = stack.split(";")
        head = frames[0]
        if head.startswith("thread ("):  # "thread (<native id>): <thread name>"
            name = head.partition("): ")[2] or "?"
            frames = frames[1:]
        else:
            name = "?"
        g = thread_group(name)
        groups[g] += n
        total += n
        fs = [f for f in frames if _is_flowscope(f)]
        if fs:
            fs_by_group[g] += n
            fs_entry[f"{g}: {_short(fs[0])}"] += n
            fs_leaf[f"{g}: {_short(frames[-1])}"] += n
            # below the last flowscope frame only library code flowscope called (json, pyarrow, the
            # os) -- or, where flowscope wraps Dask (the measuring executor), Dask's own work
            below = frames[frames.index(fs[-1]) + 1:]
            if not any(_is_dask(f) for f in below):
                fs_own[g] += n
    return {"samples": total, "by_group": dict(groups.most_common()),
            "in_flowscope_by_group": dict(fs_by_group),
            "in_flowscope_excluding_wrapped_dask_by_group": dict(fs_own),
            "flowscope_entry_points": dict(fs_entry.most_common(12)),
            "leaves_under_flowscope": dict(fs_leaf.most_common(15))}


def _is_flowscope(frame: str) -> bool:
    """A frame of flowscope's own code (the bundled workflows are the workload, not flowscope)."""
    return ("(flowscope/" in frame or "/flowscope/" in frame) and "flowscope/workflows/" not in frame


def _is_dask(frame: str) -> bool:
    """Frames that are not flowscope's work when they sit below a flowscope frame: Dask code a flowscope
    wrapper calls, and threads waiting (py-spy's idle detection misses some waits on this VM)."""
    return any(m in frame for m in ("(distributed/", "/distributed/", "(dask/", "/site-packages/dask/", "(tornado/",
                                    "(concurrent/", "(threading.py", "(queue.py", "(asyncio/", "(selectors.py"))


def _short(frame: str) -> str:
    """'transition (/x/src/flowscope/sources/dask/plugins.py:181)' -> 'transition (dask/plugins.py:181)'."""
    func, _, loc = frame.partition(" (")
    loc = loc.rstrip(")")
    parts = loc.split("/")
    return f"{func} ({'/'.join(parts[-2:])})" if loc else func


# ---- Dask's local threaded scheduler ---------------------------------------------------------------
MICRO_MODES = ("none", "profiler", "flowscope", "flowscope-full", "flowscope-no-task-io", "flowscope-reference")
LOCAL_SAMPLE = Path(__file__).resolve().parent / "_local_sample.py"


def local_expected(kind: str, args: argparse.Namespace):
    """What the local workload ``kind`` returns, computed here on the synchronous scheduler."""
    if kind == "local-tiny":
        return tiny_graph(args.tasks)[3]
    import dask.array as da

    n = args.array_size
    x = da.random.RandomState(42).random_sample((n, n), chunks=(250, 250))
    return float((x @ x.T).mean().compute(scheduler="sync"))


def local_sample(kind: str, mode: str, args: argparse.Namespace, store: Path, tag: str, expected=None) -> dict:
    """One sample of ``kind`` in ``mode`` in a fresh process (bench/_local_sample.py: an uninstrumented process
    imports nothing of flowscope and has no audit hook), its result checked against ``expected``."""
    cmd = [sys.executable, str(LOCAL_SAMPLE), kind, mode, "--tasks", str(args.local_micro if kind == "micro" else
                                                                          args.tasks),
           "--array-size", str(args.array_size), "--store", str(store), "--tag", tag]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise BenchError(f"{kind} / {mode} sample failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if expected is not None:
        got = res["value"]
        if (got != expected if isinstance(expected, int) else abs(got - expected) > 1e-9 * abs(expected)):
            raise BenchError(f"{kind} / {mode} returned {got}, expected {expected}")
    return res


def local_micro(samples: dict, n: int) -> dict:
    """Per-task cost of each local instrumentation on ``n`` no-op tasks on the synchronous scheduler (thread CPU
    of the calling thread, a fresh process per sample): median µs per task per mode, and the difference to none."""
    med = {m: _med(s["wall_s"] for s in v) / n * 1e6 for m, v in samples.items()}
    return {"tasks": n, "repeat": len(samples["none"]),
            "clock": "thread_time of the calling thread (synchronous scheduler), a fresh process per sample",
            "us_per_task": {m: _r(v, 2) for m, v in med.items()},
            "added_us_per_task": {m: _r(v - med["none"], 2) for m, v in med.items() if m != "none"}}


def local_summary(samples: dict) -> dict:
    """Medians per local workload and mode."""
    out = {}
    for w, by_mode in samples.items():
        med = {m: _med(s["wall_s"] for s in v) for m, v in by_mode.items()}
        cpu = {m: _med(s["cpu_s"]["bench"] + s["cpu_s"]["collector"] for s in v) for m, v in by_mode.items()}
        fs = by_mode["flowscope"]
        tasks = fs[0]["tasks"]
        out[w] = {
            "tasks": tasks,
            "wall_s": {m: _r(v) for m, v in med.items()},
            "samples_wall_s": {m: [_r(s["wall_s"]) for s in v] for m, v in by_mode.items()},
            "ratio_vs_none": {m: _r(med[m] / med["none"]) for m in med if m != "none"},
            "ratio_flowscope_vs_profiler": _r(med["flowscope"] / med["profiler"]),
            "median_paired_ratio_flowscope": _r(_med(f["wall_s"] / n["wall_s"] for f, n in zip(fs, by_mode["none"]))),
            "us_per_task": {m: _r(v / tasks * 1e6, 2) for m, v in med.items()},
            # the garbage collector's share: its time during the run, the run without it, what it had to walk
            "gc_s": {m: _r(_med(s["gc_s"] for s in v)) for m, v in by_mode.items()},
            "wall_minus_gc_s": {m: _r(_med(s["wall_s"] - s["gc_s"] for s in v)) for m, v in by_mode.items()},
            "gc_objects": {m: int(_med(s["gc_objects"] for s in v)) for m, v in by_mode.items()},
            "cpu_us_per_task": {m: _r(v / tasks * 1e6, 2) for m, v in cpu.items()},
            "flowscope_setup_s": _r(_med(s["setup_s"] for s in fs)),
            "flowscope_teardown_s": _r(_med(s["teardown_s"] for s in fs)),
            "records": fs[0].get("records"),
            "load_avg_1m": {m: [s["load_avg_1m"] for s in v] for m, v in by_mode.items()},
        }
    return out


# ---- driver ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=None, help="tasks in the tiny-task graph (default 20,000)")
    p.add_argument("--images", type=int, default=None, help="images in the demo workflow (default 48)")
    p.add_argument("--size", type=int, default=512, help="image side in pixels (default 512)")
    p.add_argument("--demo", choices=("project", "builtin"), default="project",
                   help="demo workflow: the project's (flowscope.workflows.image_pipeline, default) or this "
                        "script's stand-in (demo_like_workflow)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions; figures are medians (default 7)")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma-separated modes (default {','.join(MODES)}; also: {','.join(EXTRA_MODES)})")
    p.add_argument("--workloads", default=",".join(WORKLOADS + LOCAL_WORKLOADS),
                   help=f"comma-separated (default {','.join(WORKLOADS + LOCAL_WORKLOADS)})")
    p.add_argument("--array-size", type=int, default=None,
                   help="side of the local-array workload's matrix (default 3,000: 2,642 tasks, about 1.7 s a "
                        "run; at 2,000 a run took 0.5 s and its samples spread wider than the ratios; --quick 1,000)")
    p.add_argument("--local-decompose", action="store_true",
                   help="also time, on the local workloads, what observe() imports alone (mode imports) and the "
                        "capture's per-task hooks alone with every batch discarded (mode hooks-only)")
    p.add_argument("--local-micro", type=int, default=None, metavar="N",
                   help="no-op tasks in the per-task cost micro-benchmark of the local capture (default 100,000; "
                        "--quick 20,000; 0 skips it)")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR",
                   help="after the timed runs, one untimed flowscope run per workload under py-spy, with finer "
                        "timers inside the hooks; raw profiles go to DIR, a summary into the results")
    p.add_argument("--hook-timers", action="store_true",
                   help="time the plugins' hooks in every run (perf_counter_ns wrappers on the plugin instances, about "
                        "0.3 us a call, inside the timed runs); off by default, so that the timed runs are unmodified")
    p.add_argument("--variant", default="X1",
                   help="what mode full-variant leaves out: X1 = per-task I/O, X2 = worker transition rows "
                        "(comma-separated; default X1)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2,000 tasks, 12 images, 1 repetition (unless given explicitly)")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    args = p.parse_args(argv)
    args.tasks = args.tasks if args.tasks is not None else (2_000 if args.quick else 20_000)
    args.images = args.images if args.images is not None else (12 if args.quick else 48)
    args.repeat = args.repeat if args.repeat is not None else (1 if args.quick else 7)
    args.array_size = args.array_size if args.array_size is not None else (1_000 if args.quick else 3_000)
    args.local_micro = args.local_micro if args.local_micro is not None else (20_000 if args.quick else 100_000)
    args.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    args.workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    args.demo = demo_available(args.demo)
    args.variant = tuple(t.strip() for t in args.variant.split(",") if t.strip())
    if set(args.variant) - set(VARIANTS):
        p.error(f"--variant takes {', '.join(VARIANTS)}")
    for name in ("tasks", "images", "size", "repeat"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.tasks < 4:
        p.error("--tasks must be at least 4")
    bad = set(args.modes) - set(MODES + EXTRA_MODES)
    if bad or MAIN_PEER not in args.modes or not set(LEVELS) & set(args.modes) or len(set(args.modes)) != len(args.modes):
        p.error(f"--modes must include none and a level ({', '.join(LEVELS)}), from {MODES + EXTRA_MODES}")
    if set(args.workloads) - set(WORKLOADS + LOCAL_WORKLOADS) or not args.workloads:
        p.error(f"--workloads must be from {WORKLOADS + LOCAL_WORKLOADS}")
    if args.array_size < 250:
        p.error("--array-size must be at least 250 (one chunk)")
    return args


def _timer_overhead_ns() -> float:
    """What the perf_counter_ns wrapper adds to one call (it is inside the measured hook times)."""
    class P:
        def hook(self, key, start, finish, **kw):
            return None
    plain, timed = P(), P()
    timed.__dict__["name"] = "x"
    server = type("S", (), {"plugins": {"x": timed}})()
    _install_timers(server, "x", ("hook",))
    n = 200_000
    best = []
    for obj in (plain, timed):
        f = obj.hook
        t0 = time.perf_counter_ns()
        for _ in range(n):
            f("k", "a", "b", stimulus_id="s")
        best.append((time.perf_counter_ns() - t0) / n)
    return max(0.0, best[1] - best[0])



def _med(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _r(x, nd=4):
    return None if x is None else round(x, nd)


# callables the plugins hand to others that run them as hooks (the open audit hook runs the worker
# plugin's ``_record_open`` on the task's own thread): counted in the hooks' total like the hooks
HOOK_EXTRAS = frozenset({"_audit.emit"})


def hook_costs(samples: list[dict]) -> dict:
    """Per-transition and per-task hook times (µs), medians over the measurements."""
    out: dict = {}
    for side in ("sched_timers", "worker_timers"):
        per: dict = defaultdict(lambda: defaultdict(list))
        for s in samples:
            for plugin, ms in s.get(side, {}).items():
                tot_ns = tot_cpu = 0
                for m, (calls, ns, cpu_ns) in ms.items():
                    if cpu_ns:
                        per[plugin][f"{m}_cpu_us_per_call"].append(cpu_ns / 1e3 / calls if calls else 0.0)
                        per[plugin][f"{m}_cpu_us_per_task"].append(cpu_ns / 1e3 / s["tasks"])
                    if m.startswith("_") and m not in HOOK_EXTRAS:
                        per[plugin][f"{m}_us_per_call"].append(ns / 1e3 / calls if calls else 0.0)
                        per[plugin][f"{m}_us_per_task"].append(ns / 1e3 / s["tasks"])
                        continue
                    tot_ns += ns
                    tot_cpu += cpu_ns
                    per[plugin][f"{m}_calls"].append(calls)
                    per[plugin][f"{m}_us_per_call"].append(ns / 1e3 / calls if calls else 0.0)
                    per[plugin][f"{m}_calls_per_task"].append(calls / s["tasks"])
                per[plugin]["hooks_us_per_task"].append(tot_ns / 1e3 / s["tasks"])
                if tot_cpu:
                    per[plugin]["hooks_cpu_us_per_task"].append(tot_cpu / 1e3 / s["tasks"])
        key = "scheduler" if side == "sched_timers" else "workers"
        for plugin, vals in per.items():
            out.setdefault(key, {})[plugin] = {k: _r(_med(v), 3) for k, v in vals.items()}
            if len(samples) > 1 and "hooks_us_per_task" in vals:  # the least disturbed measurement
                out[key][plugin]["hooks_us_per_task_min"] = _r(min(vals["hooks_us_per_task"]), 3)
    return out


def cpu_costs(samples: list[dict]) -> dict:
    """CPU µs per task by process role and thread group (medians)."""
    out: dict = {}
    for role in ("bench", "workers", "collector"):
        proc = [s["cpu_s"][role]["process"] * 1e6 / s["tasks"] for s in samples]
        groups: dict = defaultdict(list)
        for s in samples:
            for g, v in s["cpu_s"][role]["groups"].items():
                groups[g].append(v * 1e6 / s["tasks"])
        out[role] = {"process_us_per_task": _r(_med(proc), 1),
                     "thread_groups_us_per_task": {g: _r(_med(v), 1) for g, v in sorted(groups.items())}}
    return out


def _local_parts(local: dict, local_ratio: dict) -> list[str]:
    parts = []
    for w, v in local_ratio.items():
        lw = local[w]
        parts.append(f"{w} ({lw['tasks']:,} tasks, threads) {v:.3f}x wall "
                     f"({'meets' if v <= TARGET_LOCAL else 'misses'} {TARGET_LOCAL}), Profiler "
                     f"{lw['ratio_vs_none']['profiler']:.3f}x, garbage collector {lw['gc_s']['none']:.3f} -> "
                     f"{lw['gc_s']['flowscope']:.3f} s, the rest {lw['wall_minus_gc_s']['none']:.3f} -> "
                     f"{lw['wall_minus_gc_s']['flowscope']:.3f} s")
        if "hooks-only" in lw["ratio_vs_none"]:
            r = lw["ratio_vs_none"]
            parts.append(f"{w} taken apart: observe()'s imports alone {r['imports']:.3f}x, its per-task hooks alone "
                         f"{r['hooks-only']:.3f}x, its rows (no per-task I/O, no sampler) {r['rows-only']:.3f}x, "
                         f"the same written at the graph's end {r['rows-at-end']:.3f}x")
    if "micro" in local:
        added = local["micro"]["added_us_per_task"]
        parts.append(f"local capture +{added['flowscope']:.1f} us/task at standard (+{added['flowscope-full']:.1f} at "
                     f"full, +{added['flowscope-no-task-io']:.1f} without per-task I/O; Profiler +{added['profiler']:.1f})")
    return parts


def _local_only_result(args, local: dict, local_ratio: dict, wall0: float, load_before: float) -> int:
    """Result and summary line of a run of the local workloads only."""
    head = "local-tiny" if "local-tiny" in local_ratio else next(iter(local_ratio))
    value = local_ratio[head]
    result = {
        "benchmark": BENCH, "metric": "wall_time_ratio", "value": value, "unit": "x", "target": TARGET_LOCAL,
        "meets_target": value <= TARGET_LOCAL,
        "peers": {m: {"value": local[head]["wall_s"][m], "unit": "s"} for m in LOCAL_MODES if m != "flowscope"},
        "ratio_vs_peer": value,
        "params": {
            "value_is": f"median wall time of {head} on Dask's threaded scheduler inside `with observe(store=TMP)` "
                        "divided by the median with no instrumentation",
            "main_peer": MAIN_PEER, "tasks": args.tasks, "array_size": args.array_size, "repeat": args.repeat,
            "quick": args.quick, "local": local,
            "targets": {f"{w.replace('-', '_')}_ratio": {"target": TARGET_LOCAL, "value": v, "meets": v <= TARGET_LOCAL}
                        for w, v in local_ratio.items()},
            "flowscope_commit": git_commit(), "load_avg_1m_before": round(load_before, 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2), "cpu_model": cpu_model(),
            "platform": platform.platform(), "dask": dask.__version__, "flowscope": flowscope.__version__,
            "wall_s": round(time.perf_counter() - wall0, 1),
        },
    }
    write_result(result, args.output)
    console.print(f"wrote {args.output}")
    loads = [x for w in local_ratio for v in local[w]["load_avg_1m"].values() for x in v]
    print(f"overhead: {'; '.join(_local_parts(local, local_ratio))} [median of {args.repeat}, "
          f"load avg {min(loads):.1f}-{max(loads):.1f}]", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    base = Path(tempfile.mkdtemp(prefix="flowscope-bench-overhead-"))
    # one store and one collector process for every observe() of this process, started before any cluster exists
    args.store = base / "store"
    t0 = time.perf_counter()
    start_collector(args.store)
    collector_start_s = time.perf_counter() - t0
    cluster_w = tuple(w for w in args.workloads if w in WORKLOADS)
    local_w = tuple(w for w in args.workloads if w in LOCAL_WORKLOADS)
    samples: dict = {w: {m: [] for m in args.modes} for w in cluster_w}
    local_modes = LOCAL_MODES + (LOCAL_PARTS if args.local_decompose else ())
    local_samples: dict = {w: {m: [] for m in local_modes} for w in local_w}
    micro = None
    orders = []
    profiles: dict = {}
    columns = [SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn()]
    n_steps = (1 + args.repeat * len(cluster_w) * len(args.modes) + (2 * len(cluster_w) if args.profile else 0)
               + args.repeat * len(local_w) * len(local_modes) + (1 if local_w and args.local_micro else 0))
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            steps = progress.add_task("warming up", total=n_steps)
            work = {w: Workload(w, args) for w in cluster_w}
            warm_args = argparse.Namespace(**{**vars(args), "tasks": min(args.tasks, 1_000), "images": 4})
            for w in cluster_w:  # imports, first cluster start, collector start: not timed
                for level in LEVELS:
                    if level in args.modes:
                        measure(Workload(w, warm_args), level, warm_args, base, f"warmup-{w}-{level}")
            progress.advance(steps)
            for rep in range(args.repeat):
                order = list(args.modes[rep % len(args.modes):] + args.modes[:rep % len(args.modes)])
                orders.append(order)
                for w in cluster_w:
                    for mode in order:
                        progress.update(steps, description=f"rep {rep + 1}/{args.repeat}: {w} / {mode}")
                        res = measure(work[w], mode, args, base, f"r{rep}-{w}-{mode}")
                        samples[w][mode].append(res)
                        extra = ""
                        if mode in LEVEL_MODES:
                            extra = f" + setup {res['setup_s']:.2f} s + teardown {res['teardown_s']:.2f} s"
                        cpu = sum(res["cpu_s"][r]["process"] for r in ("bench", "workers", "collector"))
                        progress.console.print(f"rep {rep + 1} {w:<5} {mode:<15} {res['wall_s']:7.3f} s "
                                               f"{res['wall_s'] / res['tasks'] * 1e3:7.3f} ms/task{extra} = "
                                               f"{res['total_s']:.3f} s, CPU {cpu:.2f} s, "
                                               f"load {res['load_avg_1m']:.1f}", soft_wrap=True)
                        progress.advance(steps)
            if args.profile:
                for w in cluster_w:
                    progress.update(steps, description=f"profiling {w} / flowscope: timers inside the hooks")
                    res = measure(work[w], "full", args, base, f"detail-{w}", detail=True)
                    profiles[w] = {"detail_run": {"wall_s": _r(res["wall_s"]), "tasks": res["tasks"],
                                                  "hooks": hook_costs([res]), "cpu": cpu_costs([res])}}
                    progress.advance(steps)
                    progress.update(steps, description=f"profiling {w} / flowscope under py-spy")
                    res = measure(work[w], "standard", args, base, f"py-spy-{w}", spy_dir=args.profile)
                    spy = {"wall_s": _r(res["wall_s"]), "files": str(args.profile)}
                    for role, info in res.get("py_spy", {}).items():
                        spy[role] = summarise_profile(Path(info["file"]))
                    profiles[w]["py_spy_run"] = spy
                    progress.advance(steps)
            if local_w:  # Dask's local schedulers: each sample a fresh process of its own (bench/_local_sample.py)
                local_store = base / "local-store"
                expected = {w: local_expected(w, args) for w in local_w}
                for rep in range(args.repeat):
                    order = list(local_modes[rep % len(local_modes):] + local_modes[:rep % len(local_modes)])
                    for w in local_w:
                        for mode in order:
                            progress.update(steps, description=f"rep {rep + 1}/{args.repeat}: {w} / {mode}")
                            res = local_sample(w, mode, args, local_store, f"r{rep}-{w}-{mode}", expected[w])
                            local_samples[w][mode].append(res)
                            extra = (f" + setup {res['setup_s']:.2f} s + teardown {res['teardown_s']:.2f} s"
                                     if mode == "flowscope" else "")
                            progress.console.print(f"rep {rep + 1} {w:<11} {mode:<10} {res['wall_s']:7.3f} s{extra}",
                                                   soft_wrap=True)
                            progress.advance(steps)
                if args.local_micro:
                    micro_samples: dict = {m: [] for m in MICRO_MODES}
                    for rep in range(max(3, args.repeat)):
                        order = list(MICRO_MODES[rep % len(MICRO_MODES):] + MICRO_MODES[:rep % len(MICRO_MODES)])
                        for mode in order:
                            progress.update(steps, description=f"local micro-benchmark: {args.local_micro:,} no-op "
                                                               f"tasks, rep {rep + 1} / {mode}")
                            micro_samples[mode].append(local_sample("micro", mode, args, local_store,
                                                                    f"micro-r{rep}-{mode}", args.local_micro))
                    micro = local_micro(micro_samples, args.local_micro)
                    progress.console.print(f"local per-task cost (µs, thread CPU): {micro['us_per_task']}")
                    progress.advance(steps)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    workloads: dict = {}
    for w in cluster_w:
        none = samples[w]["none"]
        none_med = _med(s["wall_s"] for s in none)
        tasks = none[0]["tasks"]
        # CPU of every process involved (this one: scheduler and client; the workers; observe()'s collector
        # process), over setup + workload + teardown: unlike wall time it does not grow when other programs take
        # the cores
        cpu = {m: [sum(s["cpu_s"][r]["process"] for r in ("bench", "workers", "collector")) for s in samples[w][m]]
               for m in args.modes}
        info = {
            "tasks": tasks,
            "wall_s": {m: _r(_med(s["wall_s"] for s in samples[w][m])) for m in args.modes},
            "total_s": {m: _r(_med(s["total_s"] for s in samples[w][m])) for m in args.modes},
            "samples_total_s": {m: [_r(s["total_s"]) for s in samples[w][m]] for m in args.modes},
            "ratio_vs_none": {}, "ratio_ci95": {}, "cpu_ratio_vs_none": {}, "cpu_ratio_ci95": {},
            "ratio_workload_only": {},
            "cpu_us_per_task_all_processes": {m: _r(_med(v) * 1e6 / tasks, 1) for m, v in cpu.items()},
            "ms_per_task_none": _r(none_med / tasks * 1e3),
            "records": {m: samples[w][m][0].get("records") for m in args.modes if m in LEVEL_MODES},
            "hooks": {m: hook_costs(samples[w][m]) for m in args.modes if m != "none"} if args.hook_timers else None,
            "cpu": {m: cpu_costs(samples[w][m]) for m in args.modes},
            "load_avg_1m": {m: [s["load_avg_1m"] for s in samples[w][m]] for m in args.modes},
        }
        for m in args.modes:
            if m == "none":
                continue
            totals = [s["total_s"] for s in samples[w][m]]
            ratio, lo, hi = ratio_with_interval(totals, [s["wall_s"] for s in none])
            info["ratio_vs_none"][m], info["ratio_ci95"][m] = ratio, [lo, hi]
            cratio, clo, chi = ratio_with_interval(cpu[m], cpu["none"])
            info["cpu_ratio_vs_none"][m], info["cpu_ratio_ci95"][m] = cratio, [clo, chi]
            info["ratio_workload_only"][m] = _r(_med(s["wall_s"] for s in samples[w][m]) / none_med)
            if m in LEVEL_MODES:
                info.setdefault("setup_s", {})[m] = _r(_med(s["setup_s"] for s in samples[w][m]))
                info.setdefault("teardown_s", {})[m] = _r(_med(s["teardown_s"] for s in samples[w][m]))
                info.setdefault("setup_teardown_s", {})[m] = _r(_med(s["setup_s"] + s["teardown_s"]
                                                                     for s in samples[w][m]))
                info.setdefault("setup_cpu_s", {})[m] = _r(_med(s["setup_cpu_s"] for s in samples[w][m]))
                info.setdefault("teardown_cpu_s", {})[m] = _r(_med(s["teardown_cpu_s"] for s in samples[w][m]))
        if "full-variant" in args.modes:
            info["variant_applied"] = samples[w]["full-variant"][0].get("variant_applied")
        workloads[w] = info

    local = local_summary(local_samples) if local_w else {}
    if micro is not None:
        local["micro"] = micro
    local_ratio = {w: local[w]["ratio_vs_none"]["flowscope"] for w in local_w}
    if not cluster_w:  # --workloads local-*: the local tiny graph (or the array workload) is the headline
        return _local_only_result(args, local, local_ratio, wall0, load_before)

    levels: dict = {}
    for level in LEVELS:
        if level not in args.modes:
            continue
        for w, info in workloads.items():
            levels.setdefault(level, {})[w] = {
                "ratio": info["ratio_vs_none"][level], "ratio_ci95": info["ratio_ci95"][level],
                "cpu_ratio": info["cpu_ratio_vs_none"][level], "cpu_ratio_ci95": info["cpu_ratio_ci95"][level],
                "ratio_workload_only": info["ratio_workload_only"][level],
                "setup_s": info["setup_s"][level], "teardown_s": info["teardown_s"][level],
                "setup_teardown_s": info["setup_teardown_s"][level],
                "setup_cpu_s": info["setup_cpu_s"][level], "teardown_cpu_s": info["teardown_cpu_s"][level],
                "target": TARGETS.get((level, w)),
                "meets_target": (info["ratio_vs_none"][level] <= TARGETS[(level, w)]) if (level, w) in TARGETS else None,
            }
    head_level = "standard" if "standard" in levels else next(iter(levels))
    demo_w = "demo" if "demo" in workloads else cluster_w[0]
    value = levels[head_level][demo_w]["ratio"]
    main_target = TARGETS.get((head_level, demo_w), TARGET)
    setup_teardown = max(v["setup_teardown_s"] for lv in levels.values() for v in lv.values())
    targets = {f"{level}_{w}_ratio": {"target": t, "value": levels[level][w]["ratio"],
                                      "meets": levels[level][w]["ratio"] <= t}
               for (level, w), t in TARGETS.items() if level in levels and w in levels[level]}
    targets["setup_teardown_s"] = {"target": TARGET_SETUP_TEARDOWN_S, "value": setup_teardown,
                                   "meets": setup_teardown <= TARGET_SETUP_TEARDOWN_S,
                                   "note": "median of each level and workload, the worst of them"}
    targets.update({f"{w.replace('-', '_')}_ratio": {"target": TARGET_LOCAL, "value": v, "meets": v <= TARGET_LOCAL}
                    for w, v in local_ratio.items()})
    hook_sched = hook_worker = None
    if args.hook_timers:
        hook_sched = {m: {w: workloads[w]["hooks"][m].get("scheduler", {}).get(FlowscopeSchedulerPlugin.name, {})
                          .get("hooks_us_per_task") for w in workloads} for m in args.modes if m in LEVEL_MODES}
        hook_worker = {m: {w: workloads[w]["hooks"][m].get("workers", {}).get(FlowscopeWorkerPlugin.name, {})
                           .get("hooks_us_per_task") for w in workloads} for m in args.modes if m in LEVEL_MODES}
    peers = {m: {"value": workloads[demo_w]["total_s"][m], "unit": "s"} for m in args.modes if m != head_level}
    result = {
        "benchmark": BENCH,
        "metric": "wall_time_ratio",
        "value": value,
        "unit": "x",
        "target": main_target,
        "meets_target": value <= main_target,
        "peers": peers,
        "ratio_vs_peer": value,
        "levels": levels,
        "params": {
            "value_is": f"median wall time of the {demo_w} workload at capture level {head_level}, observe()'s setup "
                        "and teardown included (`with observe(client, store=..., level=...)` entered before and "
                        "left after the workload), divided by the median wall time of the workload with no "
                        "instrumentation; fresh LocalCluster each; the interval is a 95 % bootstrap interval over "
                        "the repetitions (paired)",
            "main_peer": MAIN_PEER,
            "tasks": args.tasks, "images": args.images, "size": args.size, "repeat": args.repeat,
            "quick": args.quick, "modes": list(args.modes), "orders": orders,
            "variant_requested": list(args.variant) if "full-variant" in args.modes else None,
            "cluster": "LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None); "
                       "the scheduler runs in the bench process, with the client; observe()'s collector is a child "
                       "process of the bench process (CPU role 'collector'), started once before any cluster and "
                       "shared by every observe()",
            "collector_start_s": _r(collector_start_s),
            "demo_workflow": ("flowscope.workflows.image_pipeline.run_pipeline(client, workdir, images, size, "
                              "batch=4)" if args.demo == "project" else "bench/overhead.py demo_like_workflow()"),
            "targets": targets,
            "local": local or None,
            "scheduler_hook_us_per_task": hook_sched,
            "worker_hook_us_per_task": hook_worker,
            "workloads": workloads,
            "timer_overhead_ns_per_call": _r(_timer_overhead_ns(), 1),
            "profile": profiles or None,
            "flowscope_commit": git_commit(),
            "load_avg_1m_before": round(load_before, 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
            "cpu_model": cpu_model(),
            "platform": platform.platform(),
            "dask": dask.__version__, "distributed": distributed.__version__,
            "flowscope": flowscope.__version__,
            "wall_s": round(time.perf_counter() - wall0, 1),
        },
    }
    write_result(result, args.output)
    console.print(f"wrote {args.output}")

    def verdict(ok: bool | None) -> str:
        return "" if ok is None else " meets" if ok else " MISSES"

    parts = []
    for level, by_w in levels.items():
        for w, v in by_w.items():
            t = f" (target {v['target']}:{verdict(v['meets_target'])})" if v["target"] else ""
            parts.append(f"{level} {w} ({workloads[w]['tasks']:,} tasks) {v['ratio']:.3f}x wall "
                         f"[95% {v['ratio_ci95'][0]:.3f}-{v['ratio_ci95'][1]:.3f}]{t}, {v['cpu_ratio']:.3f}x CPU, "
                         f"setup+teardown {v['setup_teardown_s']:.2f} s")
    if "taskstream" in args.modes:
        parts += [f"taskstream {w} {workloads[w]['ratio_vs_none']['taskstream']:.3f}x" for w in workloads]
    parts.append(f"setup+teardown worst {setup_teardown:.2f} s (target {TARGET_SETUP_TEARDOWN_S}:"
                 f"{verdict(setup_teardown <= TARGET_SETUP_TEARDOWN_S)})")
    parts += _local_parts(local, local_ratio)
    loads = [x for w in [*workloads.values(), *(local[w] for w in local_w)] for v in w["load_avg_1m"].values()
             for x in v]
    print(f"overhead: {'; '.join(parts)} [median of {args.repeat}, setup and teardown included, fresh cluster each, "
          f"load avg {min(loads):.1f}-{max(loads):.1f}]", flush=True)
    return 0


def ratio_with_interval(xs: list[float], base: list[float], n: int = 10_000, seed: int = 0) -> tuple:
    """median(xs) / median(base) and its 95 % bootstrap interval, resampling the repetitions in pairs (xs[i] and
    base[i] were measured in the same repetition)."""
    x, b = np.asarray(xs, dtype=float), np.asarray(base, dtype=float)
    ratio = float(np.median(x) / np.median(b))
    k = min(len(x), len(b))
    if k < 2:
        return _r(ratio), _r(ratio), _r(ratio)
    idx = np.random.default_rng(seed).integers(0, k, size=(n, k))
    boot = np.median(x[:k][idx], axis=1) / np.median(b[:k][idx], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return _r(ratio), _r(float(lo)), _r(float(hi))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BenchError, flowscope.FlowscopeError) as exc:
        print(f"{BENCH}: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
