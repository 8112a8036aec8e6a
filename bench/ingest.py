"""Ingest throughput: span records from a Python program's threads to storage, against what a user would pick instead.

Every measurement is its own Python process, started fresh for each repetition, so imports and start-up
count. Each process builds its input lists first (the same for every contender, timed separately), then
records every span from ``--threads`` producer threads, and ends once everything is stored (flowscope:
acknowledged by the collector, which acknowledges a batch only once its Parquet segment is on disk) or
exported (OpenTelemetry: ``force_flush`` returned). Contenders, in rotating order within each repetition:

* ``per_record_api`` (the headline ``value``) -- ``flowscope.Client(address).span(name, start_ns, end_ns,
  kind=..., resource_id=..., task_key=...)`` into a real ``flowscope serve`` on 127.0.0.1, then ``close()``.
* ``otel_sdk`` (the main peer, ``ratio_vs_peer``) -- the OpenTelemetry Python SDK as its documentation
  sets it up: ``TracerProvider`` + ``BatchSpanProcessor``, each span recorded with
  ``tracer.start_span(name, start_time=..., attributes={...})`` and ``span.end(end_time=...)``, then
  ``provider.force_flush()``. The exporter is the cheapest possible: it keeps each exported span's name
  and drops the span (no serialisation, nothing retained); the SDK's own in-memory exporter keeps every
  span (about 3 GB per million) and its console exporter formats JSON, so both are slower. The queue is
  sized to hold every span (``max_queue_size``), so none is dropped.
* ``json_batched`` -- what a user without our client would write: each span a dict, POSTed as a JSON
  array of ``--json-batch`` records (``json.dumps`` + ``http.client``, one keep-alive connection per
  thread) to the same collector.
* ``batch_api`` -- ``client.write("spans", table)`` of Arrow tables built from the same lists (context).
* ``parquet_ceiling`` -- no client, no network: ``pyarrow`` builds the same table from the lists and
  ``pyarrow.parquet.write_table`` writes it with the collector's settings (zstd, dictionary for the
  repetitive string columns). Not a competitor: what the storage format itself costs.

Shapes (``--shapes``): ``dask`` -- spans as Dask's worker plugin records them: 8 function names, one resource
per thread, a unique task key per span. ``worst`` -- the worst case for flowscope's per-record path: every
span has a unique name (every string-dictionary lookup misses) and an ``attrs`` dict turned into JSON in the
call (OpenTelemetry gets the same value as one more attribute).

Before any time is kept, the stored rows are checked against what was sent: the row count, the count per
span name, and for flowscope's store and the Parquet file also the sum of durations and the number of
distinct task keys. The figures are medians over ``--repeat`` repetitions, with min and max. Per
contender: ``records_per_s`` over the in-process clock (first span to everything stored), the process's
wall time (from spawn to exit) with and without building its input, its CPU time (user + system, from
``wait4``) and its CPU time over the clocked part alone, the collector's CPU time for the contenders that use it,
and the process's peak RSS (VmHWM).

Writes ``bench/results/ingest.json`` (DESIGN.md, "Benchmarks") and prints one summary line last.

    python bench/ingest.py                  # 1,000,000 spans per contender and shape, 5 repetitions
    python bench/ingest.py --quick          # smoke run: 20,000 spans, 1 repetition
    python bench/ingest.py --shapes dask --contenders per_record_api,otel_sdk --repeat 7
"""

from __future__ import annotations

# Only the standard library at module level: a contender's process imports what that contender needs
# (OpenTelemetry's process must not pay for importing pyarrow, and flowscope's not for OpenTelemetry).
import argparse
import hashlib
import http.client
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

BENCH = "ingest"
TARGET = 1_500_000          # records/s of the per-record API, dask shape
TARGET_RATIO = 10           # x OpenTelemetry
MAIN = "per_record_api"
MAIN_PEER = "otel_sdk"
CONTENDERS = ("per_record_api", "otel_sdk", "json_batched", "batch_api", "parquet_ceiling")
USES_COLLECTOR = ("per_record_api", "json_batched", "batch_api")
SHAPES = ("dask", "worst")
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
BASE_NS = 1_763_700_000_000_000_000  # a fixed epoch time (2025-11-21), so every run sends identical data
FUNCTIONS = ("load", "inc", "double", "add", "sum", "store", "fetch", "reduce")
SPAN_COLUMNS = ("span_id", "parent_id", "resource_id", "kind", "name", "start_ns", "end_ns", "task_key", "attrs")


class BenchError(RuntimeError):
    """The benchmark could not run, or the store does not hold what was sent."""


# ---- the input: identical for every contender --------------------------------------------------
class Part:
    """One producer thread's spans, as the lists a program would hold."""

    def __init__(self, shape: str, thread: int, first: int, n: int):
        self.rid = f"thread:bench-host:4242:{1000 + thread}"
        idx = range(first, first + n)
        if shape == "dask":
            self.names = [FUNCTIONS[j % len(FUNCTIONS)] for j in idx]
            self.attrs = None
        elif shape == "worst":
            self.names = [f"fn-{j:08x}" for j in idx]
            self.attrs = [{"nbytes": j} for j in idx]
        else:
            raise BenchError(f"unknown shape {shape!r}")
        self.starts = [BASE_NS + j * 1_000 for j in idx]
        self.ends = [s + 750 for s in self.starts]
        self.keys = [f"{FUNCTIONS[j % len(FUNCTIONS)]}-{j:08x}" for j in idx]


def build_input(shape: str, records: int, threads: int) -> list[Part]:
    per = [records // threads + (1 if t < records % threads else 0) for t in range(threads)]
    parts, first = [], 0
    for t, n in enumerate(per):
        parts.append(Part(shape, t, first, n))
        first += n
    return parts


def names_digest(counts: dict[str, int]) -> str:
    """A digest of the span count per name (equal digests: equal counts for every name)."""
    h = hashlib.sha256()
    for name in sorted(counts):
        h.update(f"{name}\t{counts[name]}\n".encode())
    return h.hexdigest()


def expected_summary(shape: str, records: int, threads: int) -> dict:
    parts = build_input(shape, records, threads)
    names: Counter = Counter()
    for p in parts:
        names.update(p.names)
    return {"rows": records, "names_digest": names_digest(names), "names": len(names),
            "duration_ns_sum": sum(e - s for p in parts for s, e in zip(p.starts, p.ends)),
            "distinct_task_keys": len({k for p in parts for k in p.keys}),
            "nbytes_sum": sum(a["nbytes"] for p in parts for a in p.attrs) if shape == "worst" else None}


def summary_of_table(table) -> dict:
    """The same summary from an Arrow table of spans (what flowscope stored, or the Parquet file)."""
    import json as _json

    import pyarrow.compute as pc

    counts = {d["values"]: d["counts"] for d in pc.value_counts(table.column("name")).to_pylist()}
    attrs = table.column("attrs")
    nbytes = None
    if attrs.null_count < len(attrs):
        nbytes = sum(_json.loads(a)["nbytes"] for a in attrs.to_pylist() if a is not None)
    return {"rows": table.num_rows, "names_digest": names_digest(counts), "names": len(counts),
            "duration_ns_sum": pc.sum(pc.subtract(table.column("end_ns"), table.column("start_ns"))).as_py() or 0,
            "distinct_task_keys": pc.count_distinct(table.column("task_key")).as_py(), "nbytes_sum": nbytes}


def check_summary(got: dict, want: dict, what: str) -> None:
    """Raise BenchError unless every field ``got`` reports equals ``want``'s."""
    for key, value in got.items():
        if key in want and value != want[key]:
            raise BenchError(f"{what}: {key} is {value!r} but {want[key]!r} were sent")


# ---- the collector (also used by bench/data_states_ingest.py) ----------------------------------------
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
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"`{' '.join(self.cmd)}` exited with status {self.proc.returncode}: "
                                 f"{self.log_path.read_text()[-2000:]}")
            if self.address_file.exists() and self.address_file.read_text().strip():
                break
            if time.monotonic() > deadline:
                raise BenchError(f"collector did not write {self.address_file} within 60 s")
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

    def cpu_seconds(self) -> float:
        """CPU time (user + system, all threads) the collector process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def spans_in_store(self, run_id: str) -> int:
        import flowscope

        return flowscope.open_run(self.store / run_id).counts()["spans"]

    def stored_spans(self, run_id: str):
        """The run's spans as one Arrow table, read from its segment files."""
        import pyarrow.dataset as ds

        return ds.dataset(self.store / run_id / "spans", format="parquet").to_table(
            columns=["name", "start_ns", "end_ns", "task_key", "attrs"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def post_one_by_one(collector: Collector, name: str, posts: Iterable[tuple[str, Any]],
                    max_seconds: float) -> tuple[str, list[str], float]:
    """The Crux prototype's protocol (bench/data_states_ingest.py's peer): open a run called ``name``, POST each
    ``(path under the run, JSON doc)`` on one keep-alive connection, each acknowledged, until all are sent or
    ``max_seconds`` have passed, and close the run. Returns the run id, the paths posted (one per record sent)
    and the seconds the posts took."""
    from flowscope.model.provenance import new_run_id

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


# ---- the contenders: each runs in its own process (``--contender NAME``) ------------------------------
_CPU: dict[str, float] = {}  # process CPU time (all threads) where a contender's clock starts and stops


def _run_threads(parts: list[Part], produce) -> tuple[float, float]:
    """Start one thread per part running ``produce(part)``, release them together; returns (t0, t_joined)."""
    start = threading.Barrier(len(parts) + 1)
    failures: list[BaseException] = []

    def run(part: Part) -> None:
        try:
            start.wait()
            produce(part)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(p,), name=f"producer-{i}") for i, p in enumerate(parts)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    _CPU["start"] = time.process_time()
    for t in threads:
        t.join()
    t1 = time.perf_counter()
    if failures:
        raise BenchError(f"a producer thread failed: {failures[0]!r}")
    return t0, t1


def contender_per_record_api(args, parts: list[Part]) -> dict:
    import flowscope

    client = flowscope.Client(args.address, name=f"bench-ingest-per-record-{args.tag}", spool_dir=args.workdir / "spool")
    for p in parts:  # the producers' resources, declared as a program declares them
        client.resource("thread", p.rid, host="bench-host", pid=4242)

    def produce(p: Part) -> None:
        span, rid = client.span, p.rid
        if p.attrs is None:
            for name, s, e, key in zip(p.names, p.starts, p.ends, p.keys):
                span(name, s, e, kind="task", resource_id=rid, task_key=key)
        else:
            for name, s, e, key, attrs in zip(p.names, p.starts, p.ends, p.keys, p.attrs):
                span(name, s, e, kind="task", resource_id=rid, task_key=key, attrs=attrs)

    t0, t_emitted = _run_threads(parts, produce)
    client.close()
    t_end = time.perf_counter()
    _CPU["end"] = time.process_time()
    return {"seconds": t_end - t0, "emit_seconds": t_emitted - t0, "run_id": client.run_id,
            "batches": client.stats["batches_sent"], "busy_retries": client.stats["busy_retries"]}


SPAN_SCHEMA_DICTIONARY = ["resource_id", "kind", "name"]  # the collector's dictionary columns for spans


def _arrow_table(parts: list[Part]):
    """The spans as one Arrow table in flowscope's span schema, built from the lists."""
    import pyarrow as pa

    n = sum(len(p.names) for p in parts)
    rids, names, starts, ends, keys, attrs = [], [], [], [], [], []
    for p in parts:
        rids += [p.rid] * len(p.names)
        names += p.names
        starts += p.starts
        ends += p.ends
        keys += p.keys
        attrs += [json.dumps(a) for a in p.attrs] if p.attrs is not None else [None] * len(p.names)
    return pa.table({"span_id": pa.nulls(n, pa.int64()), "parent_id": pa.nulls(n, pa.int64()),
                     "resource_id": pa.array(rids, pa.string()), "kind": pa.array(["task"] * n, pa.string()),
                     "name": pa.array(names, pa.string()), "start_ns": pa.array(starts, pa.int64()),
                     "end_ns": pa.array(ends, pa.int64()), "task_key": pa.array(keys, pa.string()),
                     "attrs": pa.array(attrs, pa.string())})


def contender_batch_api(args, parts: list[Part]) -> dict:
    import flowscope

    client = flowscope.Client(args.address, name=f"bench-ingest-batch-{args.tag}", spool_dir=args.workdir / "spool")
    t0 = time.perf_counter()
    _CPU["start"] = time.process_time()
    table = _arrow_table(parts)
    for off in range(0, table.num_rows, 65_536):
        client.write("spans", table.slice(off, 65_536))
    client.close()
    t_end = time.perf_counter()
    _CPU["end"] = time.process_time()
    return {"seconds": t_end - t0, "run_id": client.run_id, "batches": client.stats["batches_sent"],
            "busy_retries": client.stats["busy_retries"]}


def contender_json_batched(args, parts: list[Part]) -> dict:
    host, port = args.address.split("://", 1)[1].rsplit(":", 1)
    headers = {"Content-Type": "application/json"}

    def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> None:
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        answer = resp.read()
        if resp.status not in (200, 201):
            raise BenchError(f"POST {path} -> HTTP {resp.status}: {answer[:300]!r}")

    control = http.client.HTTPConnection(host, int(port), timeout=120)
    run_id = f"bench-json-{args.tag}-{os.getpid()}"
    post(control, "/v1/runs", json.dumps({"run_id": run_id, "name": f"bench-ingest-json-{args.tag}"}).encode())
    path = f"/v1/runs/{run_id}/tables/spans"
    batch_size = args.json_batch

    def produce(p: Part) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        rid, batch = p.rid, []
        attrs = p.attrs if p.attrs is not None else [None] * len(p.names)
        for name, s, e, key, a in zip(p.names, p.starts, p.ends, p.keys, attrs):
            rec = {"resource_id": rid, "kind": "task", "name": name, "start_ns": s, "end_ns": e, "task_key": key}
            if a is not None:
                rec["attrs"] = json.dumps(a)
            batch.append(rec)
            if len(batch) == batch_size:
                post(conn, path, json.dumps(batch).encode())
                batch = []
        if batch:
            post(conn, path, json.dumps(batch).encode())
        conn.close()

    control.close()  # idle while the producers run: the collector would close it (keep-alive timeout)
    t0, t_emitted = _run_threads(parts, produce)
    control = http.client.HTTPConnection(host, int(port), timeout=120)
    post(control, f"/v1/runs/{run_id}/close", json.dumps({"status": "finished"}).encode())
    t_end = time.perf_counter()
    _CPU["end"] = time.process_time()
    control.close()
    return {"seconds": t_end - t0, "emit_seconds": t_emitted - t0, "run_id": run_id}


def contender_otel_sdk(args, parts: list[Part]) -> dict:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class NamesOnly(SpanExporter):
        """The cheapest exporter: keeps each span's name (for the check), drops the span."""

        def __init__(self) -> None:
            self.names: list[str] = []

        def export(self, spans) -> SpanExportResult:
            self.names.extend([s.name for s in spans])
            return SpanExportResult.SUCCESS

    exporter = NamesOnly()
    provider = TracerProvider()
    n = sum(len(p.names) for p in parts)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=max(n, 2048)))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("bench-ingest")

    def produce(p: Part) -> None:
        start_span, rid = tracer.start_span, p.rid
        if p.attrs is None:
            for name, s, e, key in zip(p.names, p.starts, p.ends, p.keys):
                start_span(name, start_time=s, attributes={"kind": "task", "resource_id": rid,
                                                           "task_key": key}).end(end_time=e)
        else:
            for name, s, e, key, a in zip(p.names, p.starts, p.ends, p.keys, p.attrs):
                start_span(name, start_time=s, attributes={"kind": "task", "resource_id": rid, "task_key": key,
                                                           "nbytes": a["nbytes"]}).end(end_time=e)

    t0, t_emitted = _run_threads(parts, produce)
    if not provider.force_flush(timeout_millis=600_000):
        raise BenchError("OpenTelemetry's force_flush timed out")
    t_end = time.perf_counter()
    _CPU["end"] = time.process_time()
    provider.shutdown()
    counts = Counter(exporter.names)
    return {"seconds": t_end - t0, "emit_seconds": t_emitted - t0,
            "summary": {"rows": len(exporter.names), "names_digest": names_digest(counts), "names": len(counts)}}


def contender_parquet_ceiling(args, parts: list[Part]) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pa.table({"x": [1]})  # pyarrow imports pandas on first use (about 0.5 s): a one-time cost, not the format's
    path = args.workdir / f"ceiling-{args.tag}-{os.getpid()}.parquet"
    t0 = time.perf_counter()
    _CPU["start"] = time.process_time()
    table = _arrow_table(parts)
    t_built = time.perf_counter()
    pq.write_table(table, path, compression="zstd", use_dictionary=SPAN_SCHEMA_DICTIONARY, write_statistics=True)
    t_end = time.perf_counter()
    _CPU["end"] = time.process_time()
    summary = summary_of_table(pq.read_table(path))
    path.unlink()
    return {"seconds": t_end - t0, "build_seconds": t_built - t0, "summary": summary}


def run_contender(args) -> None:
    """The child process: build the input, run one contender, write its result as JSON."""
    t = time.perf_counter()
    parts = build_input(args.shape, args.records, args.threads)
    input_seconds = time.perf_counter() - t
    res = globals()[f"contender_{args.contender}"](args, parts)
    res["input_seconds"] = input_seconds
    res["clocked_cpu_seconds"] = _CPU["end"] - _CPU["start"]
    # the peak RSS of this process image: VmHWM starts afresh at exec, unlike ru_maxrss, which a child
    # inherits from the process that forked it (the driver)
    status = Path("/proc/self/status").read_text()
    res["peak_rss_mb"] = int(status.split("VmHWM:", 1)[1].split()[0]) / 1024
    Path(args.result).write_text(json.dumps(res))


# ---- the driver ---------------------------------------------------------------------------------------------
def run_process(args, contender: str, shape: str, tag: str, collector: Collector | None, workdir: Path) -> dict:
    """Run one contender in a fresh process; return its result with the process's wall and CPU time."""
    result = workdir / f"result-{tag}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--contender", contender, "--shape", shape,
           "--records", str(args.records), "--threads", str(args.threads), "--json-batch", str(args.json_batch),
           "--workdir", str(workdir), "--tag", tag, "--result", str(result)]
    if collector is not None:
        cmd += ["--address", collector.address]
    cpu0 = collector.cpu_seconds() if collector is not None else 0.0
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    stderr_text: list[str] = []
    reader = threading.Thread(target=lambda: stderr_text.append(proc.stderr.read()), daemon=True)
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise BenchError(f"{contender} ({shape}) exited with status {proc.returncode}: {''.join(stderr_text)[-3000:]}")
    res = json.loads(result.read_text())
    result.unlink()
    res["collector_cpu_seconds"] = (collector.cpu_seconds() - cpu0) if contender in USES_COLLECTOR else None
    res.update(process_wall_seconds=wall, process_cpu_seconds=usage.ru_utime + usage.ru_stime)
    return res


def verify(res: dict, contender: str, shape: str, collector: Collector | None, want: dict) -> None:
    what = f"{contender} ({shape})"
    if "run_id" in res:
        got = summary_of_table(collector.stored_spans(res["run_id"]))
    else:
        got = res["summary"]
    check_summary(got, want, what)
    if got.get("rows") != want["rows"]:
        raise BenchError(f"{what}: no row count to check")


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def aggregate(samples: list[dict], records: int) -> dict:
    rate = [records / s["seconds"] for s in samples]
    out = {"records_per_s": spread(rate), "seconds": spread([s["seconds"] for s in samples]),
           "process_wall_s": spread([s["process_wall_seconds"] for s in samples]),
           "process_wall_minus_input_s": spread([s["process_wall_seconds"] - s["input_seconds"] for s in samples]),
           "input_s": spread([s["input_seconds"] for s in samples]),
           "process_cpu_s": spread([s["process_cpu_seconds"] for s in samples]),
           "clocked_cpu_s": spread([s["clocked_cpu_seconds"] for s in samples]),
           "peak_rss_mb": spread([s["peak_rss_mb"] for s in samples])}
    if samples[0].get("collector_cpu_seconds") is not None:
        out["collector_cpu_s"] = spread([s["collector_cpu_seconds"] for s in samples])
    if "emit_seconds" in samples[0]:
        out["emit_records_per_s"] = spread([records / s["emit_seconds"] for s in samples])
    out["samples_records_per_s"] = [round(r, 1) for r in rate]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=None, help="spans per contender and shape (default 1,000,000)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions; figures are medians (default 5)")
    p.add_argument("--threads", type=int, default=4, help="producer threads (default 4)")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated, of {', '.join(CONTENDERS)}")
    p.add_argument("--json-batch", type=int, default=10_000, help="records per JSON POST (default 10,000)")
    p.add_argument("--serve-command", default=None, metavar="CMD",
                   help="command that starts the collector, before its options (default: `flowscope serve`)")
    p.add_argument("--quick", action="store_true", help="smoke run: 20,000 spans, 1 repetition (unless given)")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    # a contender's own process (started by the driver)
    p.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--shape", choices=SHAPES, help=argparse.SUPPRESS)
    p.add_argument("--address", help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--tag", default="x", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.records = args.records if args.records is not None else (20_000 if args.quick else 1_000_000)
    args.repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    for name in ("records", "repeat", "threads", "json_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.contenders = [c for c in args.contenders.split(",") if c]
    for s in args.shapes:
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; shapes are {', '.join(SHAPES)}")
    for c in args.contenders:
        if c not in CONTENDERS:
            p.error(f"unknown contender {c!r}; contenders are {', '.join(CONTENDERS)}")
    return args


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.contender:
        run_contender(args)
        return 0
    import platform

    from _machine import cpu_model, git_commit, write_result
    from rich.console import Console

    import flowscope

    console = Console(stderr=True)
    wall0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="flowscope-bench-ingest-"))
    collector = None
    samples: dict[str, dict[str, list[dict]]] = {s: {c: [] for c in args.contenders} for s in args.shapes}
    try:
        wants = {s: expected_summary(s, args.records, args.threads) for s in args.shapes}
        if any(c in USES_COLLECTOR for c in args.contenders):
            collector = Collector(workdir, args.serve_command)
            if collector.rtt_ms > 10:
                console.print(f"[yellow]warning:[/] GET /v1/health takes {collector.rtt_ms:.0f} ms on loopback: "
                              "responses are delayed; every acknowledgement pays it")
        warm = argparse.Namespace(**{**vars(args), "records": min(args.records, 2_000)})
        for c in args.contenders:  # untimed: compiles the .pyc files, warms the page cache and the collector
            run_process(warm, c, args.shapes[0], f"warm-{c}", collector, workdir)
        for rep in range(args.repeat):
            for shape in args.shapes:
                k = rep % len(args.contenders)
                for c in args.contenders[k:] + args.contenders[:k]:
                    res = run_process(args, c, shape, f"r{rep}-{shape}-{c}", collector, workdir)
                    verify(res, c, shape, collector, wants[shape])
                    samples[shape][c].append(res)
                    extra = f", collector CPU {res['collector_cpu_seconds']:.2f} s" \
                        if res.get("collector_cpu_seconds") is not None else ""
                    console.print(f"rep {rep + 1} {shape:<5} {c:<16} {_fmt(args.records / res['seconds']):>11} "
                                  f"records/s ({res['seconds']:.2f} s; process {res['process_wall_seconds']:.2f} s "
                                  f"wall, {res['process_cpu_seconds']:.2f} s CPU{extra})")
    finally:
        if collector is not None:
            collector.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    shapes_out = {}
    for shape in args.shapes:
        agg = {c: aggregate(samples[shape][c], args.records) for c in args.contenders}
        out: dict[str, Any] = {"contenders": agg}
        if MAIN in agg and MAIN_PEER in agg:
            mine, peer = agg[MAIN], agg[MAIN_PEER]
            out["ratio_vs_peer"] = round(mine["records_per_s"]["median"] / peer["records_per_s"]["median"], 2)
            out["ratio_vs_peer_process_wall"] = round(
                peer["process_wall_s"]["median"] / mine["process_wall_s"]["median"], 2)
            mine_cpu = mine["process_cpu_s"]["median"] + mine.get("collector_cpu_s", {}).get("median", 0.0)
            out["ratio_vs_peer_cpu"] = round(peer["process_cpu_s"]["median"] / mine_cpu, 2)
            mine_clocked = mine["clocked_cpu_s"]["median"] + mine.get("collector_cpu_s", {}).get("median", 0.0)
            out["ratio_vs_peer_clocked_cpu"] = round(peer["clocked_cpu_s"]["median"] / mine_clocked, 2)
        shapes_out[shape] = out
    head = shapes_out.get("dask", shapes_out[args.shapes[0]])["contenders"]
    value = head[MAIN]["records_per_s"]["median"] if MAIN in head else None
    peer_value = head[MAIN_PEER]["records_per_s"]["median"] if MAIN_PEER in head else None
    ratio = round(value / peer_value, 2) if value and peer_value else None
    result = {
        "benchmark": BENCH,
        "metric": "records_per_s",
        "value": round(value, 1) if value else None,
        "unit": "records/s",
        "target": TARGET,
        "meets_target": bool(value and value >= TARGET and ratio and ratio >= TARGET_RATIO),
        "peers": {c: {"value": round(head[c]["records_per_s"]["median"], 1), "unit": "records/s"}
                  for c in head if c != MAIN},
        "ratio_vs_peer": ratio,
        "shapes": shapes_out,
        "params": {
            "records": args.records, "repeat": args.repeat, "threads": args.threads, "shapes": args.shapes,
            "contenders": args.contenders, "json_batch": args.json_batch, "quick": args.quick,
            "main_peer": MAIN_PEER, "target_ratio_vs_peer": TARGET_RATIO,
            "value_is": "per-record API, dask shape: records / seconds from the first client.span() to "
                        "client.close() returning (every batch acknowledged after its segment is on disk); "
                        "median over repetitions, each in a fresh process",
            "ratios": "ratio_vs_peer: records/s over each side's in-process clock; ratio_vs_peer_process_wall: "
                      "the peer's process wall time / ours; ratio_vs_peer_cpu: the peer's process CPU / ours "
                      "including the collector's CPU; ratio_vs_peer_clocked_cpu: the same over the clocked part only "
                      "(the process's CPU, all threads, from the first record to the clock's end; no imports, no "
                      "input building), steadier than wall time on a shared machine",
            "otel": "opentelemetry-sdk TracerProvider + BatchSpanProcessor(max_queue_size=records) with an "
                    "exporter that keeps names and drops spans; start_span(start_time, attributes) + "
                    "end(end_time); force_flush() ends the clock",
            "collector": (" ".join(collector.cmd[:collector.cmd.index("--host")]) +
                          " --host 127.0.0.1 --port 0 (defaults otherwise)") if collector else None,
            "verified": "rows, rows per span name (digest), and for stored tables the sum of durations, distinct "
                        "task keys and attrs; checked for every measurement before its time is kept",
            "collector_health_rtt_ms": round(collector.rtt_ms, 3) if collector else None,
            "flowscope_commit": git_commit(),
            "load_avg_1m_before": round(load_before, 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
            "cpu_model": cpu_model(),
            "platform": platform.platform(),
            "flowscope": flowscope.__version__,
            "versions": _versions(),
            "wall_s": round(time.perf_counter() - wall0, 1),
        },
    }
    write_result(result, args.output)
    console.print(f"wrote {args.output}")
    line = [f"ingest: per-record API {_fmt(value)} records/s" if value else "ingest:"]
    if ratio:
        line.append(f"= x{ratio:,.1f} OpenTelemetry SDK ({_fmt(peer_value)})")
    for c in ("json_batched", "batch_api", "parquet_ceiling"):
        if c in head:
            line.append(f"{c} {_fmt(head[c]['records_per_s']['median'])}")
    line.append(f"[{'meets' if result['meets_target'] else 'below'} target {_fmt(TARGET)} and x{TARGET_RATIO}; "
                f"{args.threads} threads, {args.records:,} spans, median of {args.repeat}]")
    print(" ".join(line), flush=True)
    return 0


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("pyarrow", "opentelemetry-sdk", "opentelemetry-api"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    out["python"] = sys.version.split()[0]
    return out


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"ingest: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
