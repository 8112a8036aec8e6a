"""Back-filling idle workers from the forecast (issue 16): what ``flowscope.forecast.when`` gains on a Dask
workflow that leaves workers idle, beside what a Dask user does without it.

The workflow: ``--waves`` waves on a LocalCluster of 2 single-threaded worker processes (2 slots, one per core);
each wave is one long task (``--long`` s of CPU) and one short task (``--short`` s) side by side, and the next wave
starts when both are done, so one slot idles for long - short seconds per wave (the shape of a pipeline whose
steps have a straggler). Beside it, a back-fill pool of ``--backfill`` independent tasks of ``--piece`` s each (a
parameter sweep nobody waits for). Every task burns CPU on its worker's thread (``time.thread_time``), so the
tasks' lengths do not depend on the machine's load. Modes, each inside ``flowscope.observe(client)``:

* ``alone`` -- the workflow by itself: its makespan and slot utilisation are the reference;
* ``sequential`` -- the workflow, then the pool (no tool: the pool waits for the workflow to end);
* ``priority`` -- the pool submitted at once with Dask's ``priority=-10`` beside the workflow: Dask's own way to
  fill idle slots with low-priority work (https://distributed.dask.org/en/stable/priority.html), the strongest
  peer, and what a Dask user would pick when the pool can be queued in the same scheduler;
* ``forecast`` -- ``flowscope.forecast.when(obs.client, event="idle", fraction=0.5, likelihood=--likelihood,
  do=...)`` reads the live run's forecast (``/v1/runs/{run}/forecast``) every ``--interval`` s and, for each frame
  predicted to have at least one of the two slots idle, submits as many pieces of the pool as fill the idle
  slot-time predicted for it (likelihood x idle slots x the frame's length; at least one; also at priority -10):
  back-fill that is released only when idleness is predicted, as the paper proposes for a shared cluster whose
  batch scheduler cannot hold a queue of low-priority work.

Measured per run, from the run's own spans: the workflow's makespan (its first task's start to its last task's
end), the slot utilisation over that window (busy slot-seconds, back-fill included, / 2 slots x window), the pool's
pieces finished inside it, and the wall time until the workflow and the whole pool are done. Checked before any
figure is printed: the workflow's result and every piece's result are right, and each run's spans hold every task.
``--repeat`` (5) repetitions, modes rotated in each; medians and min-max. Writes bench/results/backfill.json
(bench/README.md's format): ``value`` = the forecast mode's utilisation gain over ``alone`` (percentage points),
``peers.priority`` Dask's priority mode's.

    python bench/backfill.py
    python bench/backfill.py --quick      # 4 waves, 1 repetition
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, git_commit, write_result  # noqa: E402

import flowscope  # noqa: E402

MODES = ("alone", "sequential", "priority", "forecast")
RESULTS = Path(__file__).resolve().parent / "results" / "backfill.json"
console = Console(stderr=True)


class BenchError(RuntimeError):
    """A run computed a wrong result or its record is incomplete."""


def burn(seconds: float, value, after=None):
    """Hold this thread's CPU for ``seconds`` (thread CPU time), then return ``value`` (``after``: a task it waits
    for, unused)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return value


def join(a: int, b: int, acc: int | None) -> int:
    return a + b + (acc or 0)


def chained_workflow(waves: int, long_s: float, short_s: float):
    """The waves as one Dask graph: each wave's two tasks start after the previous wave's join; the result is
    3 x waves."""
    from dask import delayed

    acc = None
    for w in range(waves):
        a = delayed(burn, pure=False)(long_s, 1, acc, dask_key_name=f"wave-long-{w}")
        b = delayed(burn, pure=False)(short_s, 2, acc, dask_key_name=f"wave-short-{w}")
        acc = delayed(join, pure=False)(a, b, acc, dask_key_name=f"wave-join-{w}")
    return acc


def measure(mode: str, client, args: argparse.Namespace, store: Path) -> dict:
    pieces = args.backfill
    done: list = []
    t0 = time.perf_counter()
    with flowscope.observe(client, store=store, name=f"backfill-{mode}") as obs:
        graph = chained_workflow(args.waves, args.long, args.short)
        if mode == "priority":
            done += [client.submit(burn, args.piece, i, key=f"backfill-{i}", priority=-10, pure=False)
                     for i in range(pieces)]
        rule = None
        if mode == "forecast":
            lock = threading.Lock()

            def submit(frame: dict) -> None:
                # as much work as the idle slot-time predicted for the frame: likelihood x slots x its length
                want = frame["likelihood"] * frame["threshold"] * (frame["end_ns"] - frame["start_ns"]) / 1e9
                with lock:
                    for _ in range(max(1, round(want / args.piece))):
                        i = len(done)
                        if i >= pieces:
                            break
                        done.append(client.submit(burn, args.piece, i, key=f"backfill-{i}", priority=-10,
                                                  pure=False))

            rule = flowscope.forecast.when(obs.client, event="idle", fraction=0.5, likelihood=args.likelihood,
                                           do=submit, interval=args.interval)
        fut = client.compute(graph)
        result = fut.result()
        if rule is not None:
            rule.stop()
            if rule.error is not None:
                raise BenchError(f"the forecast rule failed: {rule.error!r}")
        if mode in ("sequential", "forecast"):  # the rest of the pool once the workflow is over
            done += [client.submit(burn, args.piece, i, key=f"backfill-{i}", priority=-10, pure=False)
                     for i in range(len(done), pieces)]
        got = client.gather(done) if mode != "alone" else []
        wall = time.perf_counter() - t0
    if result != 3 * args.waves:
        raise BenchError(f"{mode}: the workflow returned {result}, expected {3 * args.waves}")
    if mode != "alone" and sorted(got) != list(range(pieces)):
        raise BenchError(f"{mode}: the pool returned {len(got)} results, expected 0..{pieces - 1}")
    run = obs.run
    spans = run.sql("SELECT task_key, start_ns, end_ns FROM spans WHERE kind = 'task'")
    run.close()
    expect = _task_count(args) + (0 if mode == "alone" else pieces)
    if len(spans) != expect:
        raise BenchError(f"{mode}: the run holds {len(spans)} task spans, expected {expect}")
    main = spans[spans["task_key"].str.startswith("wave-")]
    w0, w1 = int(main["start_ns"].min()), int(main["end_ns"].max())
    s = spans["start_ns"].clip(lower=w0, upper=w1)
    e = spans["end_ns"].clip(lower=w0, upper=w1)
    busy = float((e - s).sum())
    fill = spans[spans["task_key"].str.startswith("backfill-")]
    return {"makespan_s": (w1 - w0) / 1e9, "utilisation": busy / (2 * (w1 - w0)),
            "pieces_inside": int((fill["end_ns"] <= w1).sum()), "wall_s": wall,
            "fired": len(rule.fired) if rule is not None else None}


def _task_count(args) -> int:
    return args.waves * 3  # long, short, join


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waves", type=int, default=16)
    ap.add_argument("--long", type=float, default=1.0, help="seconds of CPU of each wave's long task (default 1)")
    ap.add_argument("--short", type=float, default=0.25, help="seconds of CPU of each wave's short task (0.25)")
    ap.add_argument("--backfill", type=int, default=48, help="pieces in the back-fill pool (default 48)")
    ap.add_argument("--piece", type=float, default=0.25, help="seconds of CPU of each piece (default 0.25)")
    ap.add_argument("--likelihood", type=float, default=0.5, help="the rule's likelihood threshold (default 0.5)")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between the rule's checks (default 0.25)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.waves, args.backfill, args.repeat = 4, 8, 1
    from distributed import Client, LocalCluster

    store = Path(tempfile.mkdtemp(prefix="flowscope-bench-backfill-")) / "store"
    samples: dict = {m: [] for m in MODES}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cl, Client(cl) as client, Progress(console=console) as bar:
        client.gather(client.map(burn, [0.01, 0.01], [0, 1], pure=False))  # workers warm
        task = bar.add_task("back-fill", total=args.repeat * len(MODES))
        for rep in range(args.repeat):
            order = MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]
            for mode in order:
                bar.update(task, description=f"repetition {rep + 1}/{args.repeat}: {mode}")
                samples[mode].append(measure(mode, client, args, store))
                bar.advance(task)
    summary = {m: {k: spread([r[k] for r in rs]) for k in ("makespan_s", "utilisation", "pieces_inside", "wall_s")}
               for m, rs in samples.items()}
    summary["forecast"]["fired"] = spread([r["fired"] for r in samples["forecast"]])
    base = summary["alone"]["utilisation"]["median"]
    gain = {m: 100 * (summary[m]["utilisation"]["median"] - base) for m in MODES}
    slow = {m: summary[m]["makespan_s"]["median"] / summary["alone"]["makespan_s"]["median"] for m in MODES}
    for m in MODES:
        s = summary[m]
        console.print(f"{m:<10} utilisation {100 * s['utilisation']['median']:5.1f} % "
                      f"[{100 * s['utilisation']['min']:.1f}-{100 * s['utilisation']['max']:.1f}] ({gain[m]:+.1f} "
                      f"points), workflow makespan {s['makespan_s']['median']:.2f} s ({slow[m]:.3f}x alone), pieces "
                      f"done inside it {s['pieces_inside']['median']:.0f}/{args.backfill}, everything done after "
                      f"{s['wall_s']['median']:.2f} s")
    write_result({
        "benchmark": "backfill", "metric": "utilisation_gain_points", "value": round(gain["forecast"], 2),
        "unit": "percentage points of slot utilisation over the workflow alone", "target": None,
        "meets_target": None,
        "peers": {"priority": {"value": round(gain["priority"], 2), "unit": "points"},
                  "sequential": {"value": round(gain["sequential"], 2), "unit": "points"}},
        "ratio_vs_peer": round(gain["forecast"] / gain["priority"], 4) if gain["priority"] else None,
        "params": {"waves": args.waves, "long_s": args.long, "short_s": args.short, "pieces": args.backfill,
                   "piece_s": args.piece, "likelihood": args.likelihood, "interval_s": args.interval,
                   "repeat": args.repeat, "modes": summary, "makespan_vs_alone": slow,
                   "cluster": "LocalCluster, 2 worker processes x 1 thread", "cpu_model": cpu_model(),
                   "commit": git_commit()}}, RESULTS)
    print(f"backfill: utilisation {100 * base:.1f} % alone; forecast back-fill {gain['forecast']:+.1f} points "
          f"(workflow {slow['forecast']:.3f}x), Dask priorities {gain['priority']:+.1f} points "
          f"({slow['priority']:.3f}x) [median of {args.repeat}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
