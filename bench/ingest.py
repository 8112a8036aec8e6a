"""Ingest throughput, end to end: producer -> client -> collector (``flowscope serve``) -> Parquet on disk.

Measures span records per second from the first emit to the end of ``Client.close()`` (which flushes
and waits for the collector's acknowledgement; the collector acknowledges a batch only once its
segment is on disk), then checks that the store holds exactly the rows that were sent.

Measured, each against the same collector subprocess on 127.0.0.1:

* per-record API  -- ``client.span(name, start_ns, end_ns, kind=..., resource_id=..., task_key=...)``
  from ``--threads`` producer threads. This is the headline ``value``: it is what an instrumented
  program calls.
* batch API       -- ``client.write("spans", table)`` with prebuilt Arrow tables (``params``).

Peers:

* ``json_post_per_record`` (the main peer, ``ratio_vs_peer``) -- the Crux prototype's protocol: one
  HTTP POST per record with a JSON body (its REST API created each data-state vertex with one call;
  Fig. 13 of the Crux paper reports 100 vertices in 1.38 s, about 70 vertices/s). Here each record is
  POSTed as a JSON array of one record to ``/v1/runs/{run_id}/tables/spans`` over one keep-alive
  ``http.client`` connection, to the same collector.
* ``parquet_write_table_in_process`` -- ``pyarrow.parquet.write_table`` of the same records as one
  Arrow table, with the collector's settings (zstd, dictionary encoding): no network, no client.
  Not a competitor; it shows how far we are from what the disk format itself costs.

The measured things and the peers alternate (the order rotates every repetition); the reported
figures are medians. Writes ``bench/results/ingest.json`` (format: DESIGN.md, "Benchmarks") and
prints one summary line last.

    python bench/ingest.py                 # 1,000,000 records, 3 repetitions (about a minute)
    python bench/ingest.py --quick         # smoke run (a few seconds)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from _machine import cpu_model, git_commit, write_result
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

import flowscope
from flowscope.client.client import Client
from flowscope.model.provenance import new_run_id
from flowscope.model.schemas import schema

BENCH = "ingest"
TARGET = 1_000_000
MAIN_PEER = "json_post_per_record"
CEILING_PEER = "parquet_write_table_in_process"
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
BASE_NS = 1_763_700_000_000_000_000  # a fixed epoch time (2025-11-21), so every run sends identical data
FUNCTIONS = ("load", "inc", "double", "add", "sum", "store", "fetch", "reduce")

console = Console(stderr=True)


class BenchError(RuntimeError):
    """The benchmark could not run, or the store does not hold what was sent."""


# ---- the data every measurement sends ------------------------------------------------------
class Workload:
    """N span records split over T producer threads, as Python lists (per-record API) and as
    Arrow tables of ``batch_rows`` rows (batch API, ceiling). Built once, outside every timing."""

    def __init__(self, records: int, threads: int, batch_rows: int):
        self.records = records
        self.threads = threads
        per = [records // threads + (1 if t < records % threads else 0) for t in range(threads)]
        self.resource_ids = [f"thread:bench-host:4242:{1000 + t}" for t in range(threads)]
        self.parts = []  # per thread: (names, starts, ends, keys)
        offset = 0
        for n in per:
            idx = range(offset, offset + n)
            names = [FUNCTIONS[j % len(FUNCTIONS)] for j in idx]
            starts = [BASE_NS + j * 1_000 for j in idx]
            ends = [s + 750 for s in starts]
            keys = [f"{FUNCTIONS[j % len(FUNCTIONS)]}-{j:08x}" for j in idx]
            self.parts.append((names, starts, ends, keys))
            offset += n
        cols = {"resource_id": [], "kind": [], "name": [], "start_ns": [], "end_ns": [], "task_key": []}
        for rid, (names, starts, ends, keys) in zip(self.resource_ids, self.parts):
            cols["resource_id"] += [rid] * len(names)
            cols["kind"] += ["task"] * len(names)
            cols["name"] += names
            cols["start_ns"] += starts
            cols["end_ns"] += ends
            cols["task_key"] += keys
        sch = schema("spans")
        n = records
        arrays = []
        for field in sch:
            if field.name in cols:
                arrays.append(pa.array(cols[field.name], type=field.type))
            else:
                arrays.append(pa.nulls(n, field.type))
        self.table = pa.Table.from_arrays(arrays, schema=sch).combine_chunks()
        self.batches = [self.table.slice(off, batch_rows) for off in range(0, n, batch_rows)]

    def json_records(self, n: int) -> list[dict]:
        """The first ``n`` records as JSON-ready dicts (only the columns that have values)."""
        names, starts, ends, keys = self.parts[0]
        rid = self.resource_ids[0]
        n = min(n, len(names))
        return [{"resource_id": rid, "kind": "task", "name": names[j], "start_ns": starts[j],
                 "end_ns": ends[j], "task_key": keys[j]} for j in range(n)]


# ---- the collector under test --------------------------------------------------------------
class Collector:
    """A ``flowscope serve`` subprocess on 127.0.0.1 with a free port, writing to ``store``."""

    def __init__(self, workdir: Path, serve_command: str | None = None):
        self.store = workdir / "store"
        self.address_file = workdir / "collector.address"
        self.log_path = workdir / "collector.log"
        if serve_command:
            base = shlex.split(serve_command)
        else:
            exe = shutil.which("flowscope")
            base = ([exe] if exe else [sys.executable, "-m", "flowscope"]) + ["serve"]
        self.cmd = base + ["--host", "127.0.0.1", "--port", "0",
                           "--address-file", str(self.address_file), "--store", str(self.store)]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - open while the collector runs; closed in stop()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"`{' '.join(self.cmd)}` exited with status {self.proc.returncode}: "
                                 f"{self.log_path.read_text()[-2000:]}")
            if self.address_file.exists() and self.address_file.read_text().strip():
                break
            if time.monotonic() > deadline:
                raise BenchError(f"collector did not write {self.address_file} within 30 s")
            time.sleep(0.02)
        self.address = self.address_file.read_text().split()[0]
        hostport = self.address.split("://", 1)[1]
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        while True:  # the address is written just before uvicorn starts accepting
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
                conn.request("GET", "/v1/health")
                resp = conn.getresponse()
                resp.read()
                conn.close()
                if resp.status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"collector at {self.address} never became healthy: "
                                 f"{self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        self.rtt_ms = self._health_rtt_ms()

    def _health_rtt_ms(self, n: int = 20) -> float:
        """Median round trip of GET /v1/health on one keep-alive connection (a sanity check of the
        transport: on loopback it is well under a millisecond unless small responses are delayed)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        times = []
        try:
            for _ in range(n):
                t0 = time.perf_counter()
                conn.request("GET", "/v1/health")
                conn.getresponse().read()
                times.append((time.perf_counter() - t0) * 1e3)
        finally:
            conn.close()
        return statistics.median(times)

    def spans_in_store(self, run_id: str) -> int:
        return flowscope.open_run(self.store / run_id).counts()["spans"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _verify(collector: Collector, run_id: str, sent: int, what: str) -> None:
    stored = collector.spans_in_store(run_id)
    if stored != sent:
        raise BenchError(f"{what}: sent {sent:,} span records but run {run_id} in {collector.store} "
                         f"holds {stored:,}")


def _client(collector: Collector, workdir: Path, name: str) -> Client:
    return Client(collector.address, name=name, spool_dir=workdir / "spool")


# ---- the measurements ------------------------------------------------------------------------
def per_record(collector: Collector, work: Workload, workdir: Path, tag: str) -> dict:
    """``client.span`` from ``work.threads`` threads; timed from the first emit to the end of close()."""
    client = _client(collector, workdir, f"bench-ingest-per-record-{tag}")
    for rid in work.resource_ids:  # declare the producers' resources so the rows join; not timed
        client.resource("thread", rid, host="bench-host", pid=4242)
    if not client.flush(30):  # the run is open and the resources delivered before the clock starts
        raise BenchError("client could not open the run within 30 s")
    start = threading.Barrier(work.threads + 1)
    failures: list[BaseException] = []

    def produce(rid: str, names: list, starts: list, ends: list, keys: list) -> None:
        span = client.span
        try:
            start.wait()
            for name, s, e, key in zip(names, starts, ends, keys):
                span(name, s, e, kind="task", resource_id=rid, task_key=key)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=produce, args=(rid, *part), name=f"producer-{i}")
               for i, (rid, part) in enumerate(zip(work.resource_ids, work.parts))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    t_emitted = time.perf_counter()
    client.close()
    t_end = time.perf_counter()
    if failures:
        raise BenchError(f"a producer thread failed: {failures[0]!r}")
    _verify(collector, client.run_id, work.records, "per-record API")
    return {"value": work.records / (t_end - t0), "seconds": t_end - t0,
            "emit_only": work.records / (t_emitted - t0), "batches": client.stats["batches_sent"],
            "busy_retries": client.stats["busy_retries"]}


def batch_api(collector: Collector, work: Workload, workdir: Path, tag: str) -> dict:
    """``client.write("spans", table)`` with prebuilt Arrow tables, one producer thread."""
    client = _client(collector, workdir, f"bench-ingest-batch-{tag}")
    if not client.flush(30):
        raise BenchError("client could not open the run within 30 s")
    t0 = time.perf_counter()
    for batch in work.batches:
        client.write("spans", batch)
    client.close()
    t_end = time.perf_counter()
    _verify(collector, client.run_id, work.records, "batch API")
    return {"value": work.records / (t_end - t0), "seconds": t_end - t0,
            "batches": client.stats["batches_sent"], "busy_retries": client.stats["busy_retries"]}


def post_one_by_one(collector: Collector, name: str, posts: Iterable[tuple[str, Any]],
                    max_seconds: float) -> tuple[str, list[str], float]:
    """The Crux prototype's protocol: open a run called ``name``, POST each ``(path under the run, JSON doc)``
    on one keep-alive connection, each acknowledged, until all are sent or ``max_seconds`` have passed, and
    close the run. Returns the run id, the paths posted (one per record sent) and the seconds the posts took."""
    run_id = new_run_id()
    conn = http.client.HTTPConnection(collector.host, collector.port, timeout=60)
    headers = {"Content-Type": "application/json"}

    def post(path: str, doc) -> None:
        conn.request("POST", path, json.dumps(doc).encode(), headers)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status not in (200, 201):
            raise BenchError(f"POST {path} -> HTTP {resp.status}: {body[:300]!r}")

    sent: list[str] = []
    try:
        post("/v1/runs", {"run_id": run_id, "name": name})
        t0 = time.perf_counter()
        deadline = t0 + max_seconds
        for path, doc in posts:
            post(f"/v1/runs/{run_id}/{path}", doc)
            sent.append(path)
            if time.perf_counter() > deadline:
                break
        seconds = time.perf_counter() - t0
        post(f"/v1/runs/{run_id}/close", {"status": "finished"})
    finally:
        conn.close()
    return run_id, sent, seconds


def json_post_per_record(collector: Collector, records: list[dict], tag: str, max_seconds: float) -> dict:
    """Crux-style: one POST with a JSON body per record, keep-alive connection, each acknowledged.
    Stops after ``max_seconds`` if the records are not all sent by then (the rate is what was sent)."""
    run_id, sent, seconds = post_one_by_one(collector, f"bench-ingest-json-post-{tag}",
                                            (("tables/spans", [rec]) for rec in records), max_seconds)
    _verify(collector, run_id, len(sent), "JSON POST per record")
    return {"value": len(sent) / seconds, "seconds": seconds, "records": len(sent)}


def parquet_ceiling(work: Workload, workdir: Path, tag: str) -> dict:
    """pyarrow.parquet.write_table of all records as one table, as the collector writes segments."""
    path = workdir / f"ceiling-{tag}.parquet"
    t0 = time.perf_counter()
    pq.write_table(work.table, path, compression="zstd", use_dictionary=True, write_statistics=True)
    t_end = time.perf_counter()
    rows = pq.ParquetFile(path).metadata.num_rows
    path.unlink()
    if rows != work.records:
        raise BenchError(f"parquet ceiling wrote {rows} rows, expected {work.records}")
    return {"value": work.records / (t_end - t0), "seconds": t_end - t0}


# ---- driver -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=None,
                   help="span records per measurement of the client APIs and the ceiling (default 1,000,000)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions; figures are medians (default 3)")
    p.add_argument("--threads", type=int, default=4, help="producer threads for the per-record API (default 4)")
    p.add_argument("--peer-records", type=int, default=None,
                   help="records POSTed one by one in the JSON peer (default 2,000)")
    p.add_argument("--peer-seconds", type=float, default=None,
                   help="time limit per JSON peer measurement; its rate is taken over what was sent (default 8)")
    p.add_argument("--batch-rows", type=int, default=65_536,
                   help="rows per prebuilt Arrow table for the batch API (default 65,536, the client's flush size)")
    p.add_argument("--serve-command", default=None, metavar="CMD",
                   help="command that starts the collector, before its options (default: `flowscope serve`); "
                        "for measuring a modified collector")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 50,000 records, 1 repetition, 200 JSON POSTs (unless given explicitly)")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    args = p.parse_args(argv)
    small = args.quick
    args.records = args.records if args.records is not None else (50_000 if small else 1_000_000)
    args.repeat = args.repeat if args.repeat is not None else (1 if small else 3)
    args.peer_records = args.peer_records if args.peer_records is not None else (200 if small else 2_000)
    args.peer_seconds = args.peer_seconds if args.peer_seconds is not None else (2.0 if small else 8.0)
    for name in ("records", "repeat", "threads", "peer_records", "batch_rows", "peer_seconds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args




def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    samples: dict[str, list[dict]] = {"per_record_api": [], "batch_api": [], MAIN_PEER: [], CEILING_PEER: []}
    workdir = Path(tempfile.mkdtemp(prefix="flowscope-bench-ingest-"))
    collector = None
    columns = [SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn()]
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            steps = progress.add_task("preparing records", total=2 + 4 * args.repeat)
            work = Workload(args.records, args.threads, args.batch_rows)
            json_records = work.json_records(args.peer_records)
            if len(json_records) < args.peer_records:  # fewer records than peer posts: repeat them
                json_records = (json_records * (args.peer_records // len(json_records) + 1))[:args.peer_records]
            progress.advance(steps)
            progress.update(steps, description="starting `flowscope serve` and warming up")
            collector = Collector(workdir, args.serve_command)
            if collector.rtt_ms > 10:
                progress.console.print(
                    f"[yellow]warning:[/] GET /v1/health takes {collector.rtt_ms:.0f} ms on loopback: responses are "
                    "being delayed (Nagle's algorithm against delayed ACKs: the collector's accepted sockets "
                    "lack TCP_NODELAY?); every acknowledgement pays it")
            warm = Workload(min(20_000, args.records), args.threads, args.batch_rows)
            per_record(collector, warm, workdir, "warmup")
            batch_api(collector, warm, workdir, "warmup")
            json_post_per_record(collector, warm.json_records(20), "warmup", 2.0)
            progress.advance(steps)

            measures = [
                ("per_record_api", "per-record API", lambda tag: per_record(collector, work, workdir, tag)),
                (MAIN_PEER, "JSON POST per record",
                 lambda tag: json_post_per_record(collector, json_records, tag, args.peer_seconds)),
                ("batch_api", "batch API", lambda tag: batch_api(collector, work, workdir, tag)),
                (CEILING_PEER, "parquet write_table", lambda tag: parquet_ceiling(work, workdir, tag)),
            ]
            for rep in range(args.repeat):
                order = measures[rep % len(measures):] + measures[:rep % len(measures)]
                for key, label, fn in order:
                    progress.update(steps, description=f"rep {rep + 1}/{args.repeat}: {label}")
                    res = fn(f"r{rep}")
                    samples[key].append(res)
                    progress.console.print(f"rep {rep + 1} {label:<22} {_fmt(res['value']):>12} records/s "
                                         f"({res['seconds']:.2f} s)")
                    progress.advance(steps)
    finally:
        if collector is not None:
            collector.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    med = {k: statistics.median(s["value"] for s in v) for k, v in samples.items()}
    value = med["per_record_api"]
    peer = med[MAIN_PEER]
    result = {
        "benchmark": BENCH,
        "metric": "records_per_s",
        "value": round(value, 1),
        "unit": "records/s",
        "target": TARGET,
        "meets_target": value >= TARGET,
        "peers": {
            MAIN_PEER: {"value": round(peer, 1), "unit": "records/s"},
            CEILING_PEER: {"value": round(med[CEILING_PEER], 1), "unit": "records/s"},
        },
        "ratio_vs_peer": round(value / peer, 2),
        "params": {
            "records": args.records,
            "repeat": args.repeat,
            "threads": args.threads,
            "peer_records": args.peer_records,
            "peer_seconds": args.peer_seconds,
            "peer_records_sent": [s["records"] for s in samples[MAIN_PEER]],
            "batch_rows": args.batch_rows,
            "quick": args.quick,
            "main_peer": MAIN_PEER,
            "value_is": "per-record API: client.span(...) from `threads` producer threads, first emit to end "
                        "of client.close() (flushed and acknowledged after the segments are on disk)",
            "batch_api_records_per_s": round(med["batch_api"], 1),
            "per_record_api_emit_only_records_per_s": round(
                statistics.median(s["emit_only"] for s in samples["per_record_api"]), 1),
            "samples_records_per_s": {k: [round(s["value"], 1) for s in v] for k, v in samples.items()},
            "batches_per_run": {k: samples[k][0]["batches"] for k in ("per_record_api", "batch_api")},
            "busy_retries": sum(s["busy_retries"] for k in ("per_record_api", "batch_api") for s in samples[k]),
            "collector": " ".join(collector.cmd[:collector.cmd.index("--host")] if collector else []) +
                         " --host 127.0.0.1 --port 0 (defaults otherwise: 2 writers, zstd, no fsync)",
            "client": "flowscope.Client(address) defaults: flush_records 65,536, flush_interval 1 s",
            "ceiling": "pyarrow.parquet.write_table(one table of `records` rows, zstd, dictionary)",
            "verified": "open_run(run_dir).counts()['spans'] == records sent, for every measurement",
            "collector_health_rtt_ms": round(collector.rtt_ms, 3),
            "flowscope_commit": git_commit(),
            "load_avg_1m_before": round(load_before, 2),
            "cpu_model": cpu_model(),
            "platform": platform.platform(),
            "pyarrow": pa.__version__,
            "flowscope": flowscope.__version__,
            "wall_s": round(time.perf_counter() - wall0, 1),
        },
    }
    write_result(result, args.output)
    console.print(f"wrote {args.output}")
    verdict = "meets" if result["meets_target"] else "below"
    print(f"ingest: per-record API {_fmt(value)} records/s ({verdict} target {_fmt(TARGET)}), "
          f"batch API {_fmt(med['batch_api'])}, JSON POST per record {_fmt(peer)} "
          f"(x{result['ratio_vs_peer']:,.0f}), parquet write_table ceiling {_fmt(med[CEILING_PEER])} "
          f"[{args.threads} threads, {args.records:,} records, median of {args.repeat}]", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BenchError, flowscope.FlowscopeError) as exc:
        print(f"ingest: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
