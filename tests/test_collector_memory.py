"""The collector's memory budget against raw HTTP senders: chunked bodies, JSON bodies, many at once.

Every test runs a real `flowscope serve` process and measures its resident memory (psutil) while real
senders (threads of this process, each with its own socket) push bodies at it.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import psutil
import pyarrow as pa
import pytest

import flowscope
from flowscope.model.conform import conform

MiB = 2**20
BASE_NS = 1_763_700_000_000_000_000
FUNCTIONS = ("load", "inc", "double", "add", "sum", "store", "fetch", "reduce")


class PeakRss:
    """The peak resident memory of a process, sampled every few milliseconds from a thread."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)
        self.baseline = self.proc.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            time.sleep(0.005)

    def stop(self) -> float:
        """Stop sampling; the growth over the baseline, in MiB."""
        self._stop.set()
        self._thread.join()
        return (self.peak - self.baseline) / MiB


def span_records(first: int, n: int) -> list[dict]:
    return [{"span_id": i, "resource_id": f"thread:node-3:4242:{4243 + i % 8}", "kind": "task",
             "name": FUNCTIONS[i % 8], "start_ns": BASE_NS + i * 1000, "end_ns": BASE_NS + i * 1000 + 750,
             "task_key": f"{FUNCTIONS[i % 8]}-{i:08x}"} for i in range(first, first + n)]


def arrow_body(first: int, n: int) -> bytes:
    """An Arrow IPC stream of ``n`` spans with ids first..first+n-1, in the canonical schema."""
    recs = span_records(first, n)
    table = conform("spans", pa.table({k: [r[k] for r in recs] for k in recs[0]}))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def json_body(first: int, n: int) -> bytes:
    return json.dumps(span_records(first, n)).encode()


def post(address: str, path: str, body: bytes, content_type: str, segment: str, *, chunked: bool,
         piece: int = 256 * 1024, timeout: float = 300) -> tuple[int, bytes]:
    """POST ``body`` over a new connection, chunked or with a Content-Length, a piece at a time. Stops
    sending as soon as the collector answers early (a refusal before the body is read). Returns the
    status and body of the answer, or (0, b"") if the connection was dropped without one."""
    u = urlsplit(address)
    sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
    try:
        head = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: {content_type}\r\n"
                f"X-Flowscope-Segment: {segment}\r\nConnection: close\r\n"
                + ("Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {len(body)}\r\n") + "\r\n")
        try:
            sock.sendall(head.encode())
            view = memoryview(body)
            for off in range(0, len(body), piece):
                if select.select([sock], [], [], 0)[0]:
                    break  # answered before the whole body was sent
                part = view[off:off + piece]
                sock.sendall(b"%x\r\n" % len(part) + part + b"\r\n" if chunked else part)
            else:
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused early and closed; the answer may still be readable
        resp = http.client.HTTPResponse(sock)
        try:
            resp.begin()
            return resp.status, resp.read()
        except (http.client.HTTPException, ConnectionResetError):
            return 0, b""
    finally:
        sock.close()


def post_until_accepted(address: str, path: str, body: bytes, content_type: str, segment: str, *,
                        chunked: bool, deadline: float) -> dict:
    """Send until the collector accepts (200), backing off while it says it is busy (503)."""
    refusals = 0
    while True:
        status, answer = post(address, path, body, content_type, segment, chunked=chunked)
        if status == 200:
            return {**json.loads(answer), "refusals": refusals}
        assert status in (0, 503), f"HTTP {status}: {answer[:300]!r}"
        refusals += 1
        assert time.monotonic() < deadline, f"{segment} still refused after {refusals} attempts"
        time.sleep(0.05)


def open_run(address: str, run_id: str) -> str:
    res = httpx.post(f"{address}/v1/runs", json={"run_id": run_id, "name": run_id})
    assert res.status_code == 201, res.text
    return f"/v1/runs/{run_id}/tables/spans"


def warm_up(address: str, path: str) -> None:
    """One small batch of each kind, so that the baseline includes what the first batch initialises."""
    for k, (body, ctype) in enumerate([(arrow_body(10**9, 1000), "application/vnd.apache.arrow.stream"),
                                       (json_body(10**9 + 1000, 1000), "application/json")]):
        status, answer = post(address, path, body, ctype, f"warm-{k}", chunked=False)
        assert status == 200, answer


def stored_spans(store, run_id: str) -> tuple[int, int]:
    """Rows and distinct span ids in the run, warm-up rows left out."""
    got = flowscope.open_run(store / run_id).sql(
        "SELECT count(*) AS n, count(DISTINCT span_id) AS ids FROM spans WHERE span_id < 1000000000").iloc[0]
    return int(got["n"]), int(got["ids"])


def test_chunked_uploads_wait_for_the_memory_budget(collector_factory):
    """Five concurrent 44 MiB uploads without a Content-Length against an 8 MiB budget: each is admitted
    as if it were as large as the largest request allowed (48 MiB), so they go through one at a time."""
    c = collector_factory("--queue-mb", "8", "--max-request-mb", "48", "--writer-delay", "0.2")
    path = open_run(c.address, "chunked")
    warm_up(c.address, path)
    rows = 480_000
    bodies = [arrow_body(k * rows, rows) for k in range(5)]
    assert all(44 * MiB <= len(b) <= 48 * MiB for b in bodies)
    rss = PeakRss(c.pid)
    deadline = time.monotonic() + 300
    results: list[dict] = []

    def send(k: int) -> None:
        results.append(post_until_accepted(c.address, path, bodies[k], "application/vnd.apache.arrow.stream",
                                           f"chunked-{k}", chunked=True, deadline=deadline))

    threads = [threading.Thread(target=send, args=(k,)) for k in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    growth = rss.stop()
    health = httpx.get(f"{c.address}/v1/health").json()
    print(f"collector RSS growth {growth:.0f} MiB, refusals {[r['refusals'] for r in results]}, "
          f"peak reserved {health['peak_reserved_bytes'] / MiB:.0f} MiB")
    assert sorted(r["rows"] for r in results) == [rows] * 5
    assert stored_spans(c.store, "chunked") == (5 * rows, 5 * rows)
    assert health["busy_refusals"] > 0 and sum(r["refusals"] for r in results) > 0
    # one upload in memory at a time: its body and a decoded copy of it at most (2 x 48 MiB), plus a
    # fixed allowance for the Parquet writers and the allocator
    assert growth < 2 * 48 + 48, f"collector RSS grew by {growth:.0f} MiB"


@pytest.mark.parametrize("shape", ["spans", "resources"])
def test_a_json_batch_reserves_what_decoding_it_costs(collector_factory, shape):
    """One large JSON batch on an idle collector: the collector's resident memory grows by no more than
    the bytes it reserved for the batch (plus a fixed allowance), whatever the records look like."""
    c = collector_factory("--max-request-mb", "64")
    path = open_run(c.address, "json-cost")
    warm_up(c.address, path)
    if shape == "spans":  # realistic records
        n = 120_000
        body, path_ = json_body(0, n), path
    else:  # the smallest valid records of a wide table (their Arrow form is larger than their JSON)
        n = 700_000
        body = json.dumps([{"resource_id": f"r{i}", "kind": "k"} for i in range(n)]).encode()
        path_ = path.replace("/spans", "/resources")
    assert len(body) >= 20 * MiB
    rss = PeakRss(c.pid)
    status, answer = post(c.address, path_, body, "application/json", "big", chunked=False)
    growth = rss.stop()
    assert status == 200, answer
    assert json.loads(answer)["rows"] == n
    reserved = httpx.get(f"{c.address}/v1/health").json()["peak_reserved_bytes"] / MiB
    print(f"{shape}: body {len(body) / MiB:.1f} MiB, RSS growth {growth:.0f} MiB, reserved {reserved:.0f} MiB")
    assert growth < reserved + 16, f"RSS grew by {growth:.0f} MiB for a batch that reserved {reserved:.0f} MiB"


def test_a_json_batch_is_decoded_off_the_event_loop(collector_factory):
    """While a large JSON batch is being decoded, the collector still answers other requests: some
    answer to /v1/health reports the decoding in progress (it could not if decoding held the loop)."""
    c = collector_factory("--max-request-mb", "64")
    path = open_run(c.address, "stall")
    n = 250_000
    body = json_body(0, n)
    answer: list = []
    sender = threading.Thread(target=lambda: answer.append(
        post(c.address, path, body, "application/json", "big", chunked=False)))
    seen = []
    with httpx.Client(timeout=120) as http:
        sender.start()
        while sender.is_alive():
            seen.append(http.get(f"{c.address}/v1/health").json()["decoding_batches"])
            time.sleep(0.01)
    sender.join()
    status, text = answer[0]
    assert status == 200, text
    assert json.loads(text)["rows"] == n
    assert max(seen) == 1, f"no health answer while the batch was decoded ({len(seen)} answers)"


@pytest.mark.parametrize("budget", ["off", "on"])
def test_the_budget_holds_many_raw_concurrent_senders(collector_factory, budget):
    """24 raw senders at once, half with chunked Arrow bodies, half with JSON bodies with a Content-Length,
    retrying while refused. With the budget switched off (a 100 GB write queue) the collector's resident
    memory goes beyond the bound this test asserts; with an 8 MiB budget it stays under it, and every
    record is stored exactly once either way."""
    bound_mib = 64
    queue_mb = "100000" if budget == "off" else "8"
    c = collector_factory("--queue-mb", queue_mb, "--max-request-mb", "4", "--writer-delay", "0.3")
    path = open_run(c.address, "raw")
    warm_up(c.address, path)
    senders, rounds = 24, 2
    arrow_rows, json_rows = 40_000, 18_000
    work = []
    first = 0
    for k in range(senders):
        for r in range(rounds):
            if k % 2:
                work.append((k, arrow_body(first, arrow_rows), "application/vnd.apache.arrow.stream", True))
                first += arrow_rows
            else:
                work.append((k, json_body(first, json_rows), "application/json", False))
                first += json_rows
    assert all(3 * MiB < len(body) <= 4 * MiB for _, body, _, _ in work)
    rss = PeakRss(c.pid)
    deadline = time.monotonic() + 600
    start = threading.Barrier(senders)
    failures: list[BaseException] = []

    def send(k: int) -> None:
        try:
            start.wait()
            for seg, (owner, body, ctype, chunked) in enumerate(work):
                if owner == k:
                    post_until_accepted(c.address, path, body, ctype, f"raw-{seg}", chunked=chunked, deadline=deadline)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    growth = rss.stop()
    assert not failures, failures[0]
    health = httpx.get(f"{c.address}/v1/health").json()
    print(f"budget {budget}: collector RSS growth {growth:.0f} MiB, busy refusals {health['busy_refusals']}, "
          f"peak reserved {health['peak_reserved_bytes'] / MiB:.1f} MiB")
    assert stored_spans(c.store, "raw") == (first, first)
    if budget == "off":  # the control: this load does exceed the bound when nothing holds it back
        assert growth > bound_mib, f"without a budget the collector grew by only {growth:.0f} MiB"
    else:
        assert health["busy_refusals"] > 0
        assert growth < bound_mib, f"collector RSS grew by {growth:.0f} MiB"


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_arrow_body_is_refused_before_it_is_decompressed(collector, codec):
    """A compressed Arrow IPC body decodes to an amount of memory its length does not bound (zeros
    compress a thousandfold), so the budget cannot hold it: it is refused, and nothing is stored."""
    path = open_run(collector.address, "compressed")
    table = pa.ipc.open_stream(arrow_body(0, 1000)).read_all()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=codec)) as writer:
        writer.write_table(table)
    status, answer = post(collector.address, path, sink.getvalue().to_pybytes(),
                          "application/vnd.apache.arrow.stream", "packed", chunked=False)
    assert status == 415, answer
    assert json.loads(answer)["error"].startswith("compressed Arrow IPC stream (message 1, a record batch, has "
                                                  "compressed buffers)")
    assert flowscope.open_run(collector.store / "compressed").counts()["spans"] == 0


def test_a_dictionary_column_that_would_expand_beyond_the_limits_is_refused(collector_factory):
    """A dictionary-encoded string column is stored plain: 2,000 rows pointing at one 64 KiB value
    are a 124 KiB body that decodes to 125 MiB. It is refused (413) before it is expanded."""
    c = collector_factory("--max-request-mb", "1")
    path = open_run(c.address, "dictionary")
    n = 2_000
    table = pa.table({"resource_id": pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int8()), ["x" * 65536]),
                      "kind": ["task"] * n, "name": ["f"] * n, "start_ns": pa.array(range(n), pa.int64()),
                      "end_ns": pa.array(range(1, n + 1), pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue().to_pybytes()
    assert len(body) < 200_000
    rss = PeakRss(c.pid)
    status, answer = post(c.address, path, body, "application/vnd.apache.arrow.stream", "expands", chunked=False)
    growth = rss.stop()
    assert status == 413, answer
    assert json.loads(answer)["error"].startswith("spans.resource_id: a dictionary-encoded column that decodes "
                                                  f"to {n * 65536 + 4 * (n + 1)} bytes")
    assert growth < 32
    assert flowscope.open_run(c.store / "dictionary").counts()["spans"] == 0
    # within the limits, a dictionary-encoded column is taken and stored plain
    small = table.slice(0, 10).set_column(0, "resource_id", pa.DictionaryArray.from_arrays(
        pa.array([0, 1] * 5, pa.int8()), ["thread:a", "thread:b"]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, small.schema) as writer:
        writer.write_table(small)
    status, answer = post(c.address, path, sink.getvalue().to_pybytes(), "application/vnd.apache.arrow.stream",
                          "fits", chunked=False)
    assert status == 200, answer
    stored = flowscope.open_run(c.store / "dictionary").table("spans")
    assert stored["resource_id"].tolist() == ["thread:a", "thread:b"] * 5
