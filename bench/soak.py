"""Soak: many producer processes into one collector for a long time, with the collector killed (SIGKILL)
and restarted in the middle.

``--producers`` processes (default 32) each run a ``flowscope.Client`` joined to one run and record
``--rate`` spans a second (default 2,000) for ``--duration`` seconds (default 600) into one
``flowscope serve --queue-mb Q`` subprocess on 127.0.0.1. Halfway through, the collector gets SIGKILL,
stays down ``--down`` seconds (the clients spool to local disk meanwhile) and is restarted on the same
port and store (the clients replay their spools). Checked, each against a bound stated before the run:

* records sent = records stored: every span id once, none missing, none twice (DuckDB over the store);
* the collector's resident memory (psutil, every 0.2 s, both incarnations) stays under
  ``RSS at start + --queue-mb + --rss-allowance-mb`` (the write budget plus a fixed allowance for the
  writer threads, the connections' buffers and the allocator);
* no producer blocks: the longest single ``client.span()`` call in any producer stays under
  ``--block-limit`` seconds (a producer waits only when its client's buffer is full).

The headline ``value`` is that longest call. There is no peer (a soak run checks bounds; nothing
else a user would pick is run beside it), so ``peers`` is empty and ``ratio_vs_peer`` null. Writes
``bench/results/soak.json`` (format: DESIGN.md, "Benchmarks") and prints one summary line last; exits
1 if a check fails.

    python bench/soak.py                    # 32 producers, 10 minutes, kill -9 at 5 minutes
    python bench/soak.py --duration 60      # a one-minute check that it works
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from _machine import cpu_model, git_commit, write_result

import flowscope

BENCH = "soak"
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
MiB = 2**20
ID_STRIDE = 10**12  # span ids of producer k are k * ID_STRIDE + 0, 1, 2, ...
FUNCTIONS = ("load", "inc", "double", "add", "sum", "store", "fetch", "reduce")


# ---- one producer process -----------------------------------------------------------------------
def produce(address: str, run_id: str, index: int, rate: float, start_at: float, duration: float,
            spool: Path) -> dict:
    """Record ``rate`` spans a second from ``start_at`` (wall clock) for ``duration`` s, then close.
    Returns what was sent and how long the longest ``span()`` call took."""
    from flowscope import Client, FlowscopeError

    client = Client(address, run_id=run_id, spool_dir=spool)
    span = client.span
    tick = 0.01
    per_tick = rate * tick
    sent, owed, longest = 0, 0.0, 0.0
    base = index * ID_STRIDE
    time.sleep(max(0.0, start_at - time.time()))
    t0 = time.perf_counter()
    end = t0 + duration
    next_tick = t0
    clock = time.perf_counter
    while True:
        now = clock()
        if now >= end:
            break
        owed += per_tick
        while owed >= 1:
            i = base + sent
            c0 = clock()
            span(FUNCTIONS[sent % 8], i, i + 500, span_id=i)
            took = clock() - c0
            longest = max(longest, took)
            sent += 1
            owed -= 1
        next_tick += tick
        pause = next_tick - clock()
        if pause > 0:
            time.sleep(pause)
    emitted_s = clock() - t0
    c0 = clock()
    error = None
    try:
        client.close()
    except FlowscopeError as exc:
        error = str(exc)
    return {"index": index, "sent": sent, "emit_seconds": emitted_s, "longest_call_s": longest,
            "close_seconds": clock() - c0, "stats": dict(client.stats), "error": error}


# ---- the collector ------------------------------------------------------------------------------
class Collector:
    """``flowscope serve`` on 127.0.0.1; restartable on the same port and store."""

    def __init__(self, workdir: Path, queue_mb: float):
        self.workdir = workdir
        self.store = workdir / "store"
        self.log_path = workdir / "collector.log"
        self.queue_mb = queue_mb
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self) -> None:
        addr = self.workdir / f"address-{time.monotonic_ns()}"
        exe = shutil.which("flowscope")
        cmd = ([exe] if exe else [sys.executable, "-m", "flowscope"]) + [
            "serve", "--host", "127.0.0.1", "--port", str(self.port), "--store", str(self.store),
            "--address-file", str(addr), "--queue-mb", str(self.queue_mb)]
        self.cmd = cmd
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (addr.exists() and addr.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"collector did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        self.address = addr.read_text().split()[0]
        self.port = int(self.address.rsplit(":", 1)[1])
        while True:
            try:
                httpx.get(f"{self.address}/v1/health", timeout=2).raise_for_status()
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("collector never answered /v1/health") from None
                time.sleep(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None


class RssWatch:
    """Peak resident memory of whichever collector process is current, sampled every 0.2 s."""

    def __init__(self, collector: Collector):
        self.collector = collector
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                rss = psutil.Process(self.collector.proc.pid).memory_info().rss
            except (psutil.NoSuchProcess, psutil.ZombieProcess, AttributeError):
                continue
            self.peak = max(self.peak, rss)
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ---- driver -------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600, help="seconds the producers record (default 600)")
    p.add_argument("--producers", type=int, default=32, help="producer processes (default 32)")
    p.add_argument("--rate", type=float, default=2_000, help="spans a second per producer (default 2,000)")
    p.add_argument("--kill-at", type=float, default=0.5,
                   help="when the collector is killed, as a fraction of --duration (default 0.5)")
    p.add_argument("--down", type=float, default=5.0, help="seconds the killed collector stays down (default 5)")
    p.add_argument("--queue-mb", type=float, default=64, help="the collector's --queue-mb (default 64)")
    p.add_argument("--rss-allowance-mb", type=float, default=64,
                   help="stated RSS bound: RSS at start + --queue-mb + this (default 64)")
    p.add_argument("--block-limit", type=float, default=1.0,
                   help="stated limit, seconds, for the longest single span() call of any producer (default 1)")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    p.add_argument("--keep", action="store_true",
                   help="keep the working directory (store, collector and producer logs); kept anyway on failure")
    p.add_argument("--producer", nargs=6, metavar=("ADDRESS", "RUN", "INDEX", "START_AT", "DURATION", "SPOOL"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.duration <= 0 or args.producers < 1 or args.rate <= 0 or not 0 < args.kill_at < 1:
        p.error("--duration, --producers and --rate must be positive and --kill-at within (0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.producer:
        address, run_id, index, start_at, duration, spool = args.producer
        print(json.dumps(produce(address, run_id, int(index), args.rate, float(start_at), float(duration),
                                 Path(spool))), flush=True)
        return 0

    wall0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="flowscope-bench-soak-"))
    collector = Collector(workdir, args.queue_mb)
    procs: list[subprocess.Popen] = []
    try:
        collector.start()
        time.sleep(1.0)
        rss_start = psutil.Process(collector.proc.pid).memory_info().rss
        rss_bound = rss_start + (args.queue_mb + args.rss_allowance_mb) * MiB
        run_id = f"soak-{time.strftime('%Y%m%dT%H%M%S')}"
        httpx.post(f"{collector.address}/v1/runs", json={"run_id": run_id, "name": "soak"}).raise_for_status()
        start_at = time.time() + 20 + 0.5 * args.producers  # every producer has imported flowscope by then
        for k in range(args.producers):
            cmd = [sys.executable, __file__, "--rate", str(args.rate), "--producer", collector.address, run_id,
                   str(k), repr(start_at), repr(args.duration), str(workdir / f"spool-{k}")]
            with open(workdir / f"producer-{k}.log", "w") as log:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log))
        print(f"soak: {args.producers} producers x {args.rate:,.0f} spans/s for {args.duration:.0f} s into "
              f"{collector.address}; kill -9 at {args.kill_at * args.duration:.0f} s", file=sys.stderr)
        watch = RssWatch(collector)
        time.sleep(max(0.0, start_at - time.time() + args.kill_at * args.duration))
        killed_rss = psutil.Process(collector.proc.pid).memory_info().rss
        collector.kill()
        killed_at = time.time() - start_at
        time.sleep(args.down)
        collector.start()
        restarted_at = time.time() - start_at
        print(f"soak: collector killed at {killed_at:.0f} s, back at {restarted_at:.0f} s", file=sys.stderr)
        reports = []
        for k, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=args.duration + 900)
            if proc.returncode != 0:
                raise RuntimeError(f"producer {k} exited with {proc.returncode}: "
                                   f"{(workdir / f'producer-{k}.log').read_text()[-2000:]}")
            reports.append(json.loads(out.decode().strip().splitlines()[-1]))
        watch.stop()
        httpx.post(f"{collector.address}/v1/runs/{run_id}/close", json={"status": "finished"}).raise_for_status()
        health = httpx.get(f"{collector.address}/v1/health").json()
        run = flowscope.open_run(collector.store / run_id)
        got = run.sql(f"""SELECT span_id // {ID_STRIDE} AS producer, count(*) AS n, count(DISTINCT span_id) AS ids,
                                 min(span_id % {ID_STRIDE}) AS lo, max(span_id % {ID_STRIDE}) AS hi
                          FROM spans WHERE span_id IS NOT NULL GROUP BY 1 ORDER BY 1""")
        run.close()
        exit_code = collector.stop()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        collector.stop()

    stored = {int(r.producer): (int(r.n), int(r.ids), int(r.lo), int(r.hi)) for r in got.itertuples()}
    mismatched = [rep["index"] for rep in reports
                  if stored.get(rep["index"], (0, 0, 0, -1)) != (rep["sent"], rep["sent"], 0, rep["sent"] - 1)]
    sent = sum(rep["sent"] for rep in reports)
    stored_rows = sum(v[0] for v in stored.values())
    longest = max(rep["longest_call_s"] for rep in reports)
    checks = {
        "sent_equals_stored": not mismatched and sent == stored_rows,
        "rss_under_bound": watch.peak < rss_bound,
        "no_producer_blocked": longest < args.block_limit,
        "no_producer_error": not any(rep["error"] for rep in reports),
        "collector_exit_0": exit_code == 0,
    }
    ok = all(checks.values())
    result = {
        "benchmark": BENCH,
        "metric": "longest_producer_call_s",
        "value": round(longest, 4),
        "unit": "s",
        "target": args.block_limit,
        "meets_target": ok,
        "peers": {},
        "ratio_vs_peer": None,
        "params": {
            "value_is": "the longest single client.span() call in any producer process over the whole run; "
                        "meets_target requires every check in `checks`",
            "checks": checks,
            "producers": args.producers,
            "rate_per_producer": args.rate,
            "duration_s": args.duration,
            "records_sent": sent,
            "records_stored": stored_rows,
            "producers_mismatched": mismatched,
            "killed_at_s": round(killed_at, 1),
            "restarted_at_s": round(restarted_at, 1),
            "collector_rss_start_mib": round(rss_start / MiB, 1),
            "collector_rss_at_kill_mib": round(killed_rss / MiB, 1),
            "collector_rss_peak_mib": round(watch.peak / MiB, 1),
            "collector_rss_bound_mib": round(rss_bound / MiB, 1),
            "rss_bound_is": f"RSS at start + --queue-mb {args.queue_mb:g} + --rss-allowance-mb "
                            f"{args.rss_allowance_mb:g}",
            "rss_samples": watch.samples,
            "block_limit_s": args.block_limit,
            "longest_close_s": round(max(rep["close_seconds"] for rep in reports), 2),
            "batches_spooled": sum(rep["stats"]["batches_spooled"] for rep in reports),
            "batches_replayed": sum(rep["stats"]["batches_replayed"] for rep in reports),
            "busy_retries": sum(rep["stats"]["busy_retries"] for rep in reports),
            "collector_after_restart": {k: health[k] for k in ("batches", "rows", "duplicates", "busy_refusals",
                                                               "peak_reserved_bytes", "errors")},
            "collector": " ".join(collector.cmd[:collector.cmd.index("--port")]) + f" --queue-mb {args.queue_mb:g}",
            "no_peer": "a soak run checks bounds over time; nothing a user would pick instead is run beside it",
            "flowscope_commit": git_commit(),
            "load_avg_1m_before": round(load_before, 2),
            "cpu_model": cpu_model(),
            "platform": platform.platform(),
            "flowscope": flowscope.__version__,
            "wall_s": round(time.perf_counter() - wall0, 1),
        },
    }
    write_result(result, args.output)
    if ok and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"soak: kept {workdir} (store, collector and producer logs)", file=sys.stderr)
    if ok and args.keep:
        print(f"soak: kept {workdir}", file=sys.stderr)
    print(f"wrote {args.output}", file=sys.stderr)
    failed = ", ".join(k for k, v in checks.items() if not v)
    print(f"soak: {'ok' if ok else 'FAILED (' + failed + ')'}: {args.producers} producers x {args.duration:.0f} s, "
          f"{sent:,} spans sent, {stored_rows:,} stored; collector RSS peak {watch.peak / MiB:.0f} MiB "
          f"(bound {rss_bound / MiB:.0f}); longest span() call {longest * 1e3:.0f} ms (limit "
          f"{args.block_limit * 1e3:.0f}); kill -9 at {killed_at:.0f} s, back at {restarted_at:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
