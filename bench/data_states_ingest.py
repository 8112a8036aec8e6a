"""Data-state graph ingest, end to end: Python client -> ``flowscope serve`` over loopback -> checked -> stored.

A random layered data-state DAG (``flowscope.sim.dag.layered_dag``: ``--states`` states, ``--mutations``
mutations, every mutation from an older to a younger state) is delivered to a collector subprocess on
127.0.0.1, and the records per second (states + mutations) are measured from the first call to the last
acknowledgement. Every request is checked whole by the collector (kinds, both ends known, sizes, time order,
ids naming one thing; model/data_states.py StateIndex) and the run's critical path is updated incrementally
before the request is acknowledged; afterwards the store must hold exactly what was sent.

Measured, each in a new run of the same collector:

* table API (the headline ``value``) -- ``ds = client.data_states(batch=B)``, ``ds.add(states, mutations)``
  with Arrow tables of ``--batch`` states and the mutations ending in them, ``ds.flush()`` per batch
  (one all-or-nothing Arrow request each);
* per-record API (``params``) -- ``ds.state(...)`` / ``ds.mutation(...)`` per record, ``batch=B``.

Peers:

* ``json_batched`` (the main peer, ``ratio_vs_peer``) -- what a user of the same REST API without flowscope's
  Python client would do: one ``POST /v1/runs/{run}/states`` per batch with a JSON body
  ``{"states": [...], "mutations": [...]}`` (the same batches as the table API), over one keep-alive connection,
  each acknowledged. The JSON bodies are serialised before the clock starts (which favours the peer); the
  collector parses, checks and writes them exactly as it does Arrow requests. Full size, same clock.
* ``crux_post_per_record`` -- the Crux prototype's protocol: one HTTP POST with a JSON body per vertex or edge
  (``/v1/runs/{run}/states``, then ``/mutations``), each acknowledged, over one keep-alive connection. It is
  measured on a subsample (the first ``--peer-records`` records, time-limited by ``--peer-seconds``) and its rate
  extrapolated to the full size (``params.crux_extrapolated_s``); the Crux paper itself reports about 14 ms per
  vertex (other hardware). A protocol comparison, not a competitor.

Measurements alternate for ``--repeat`` repetitions; figures are medians. Writes
``bench/results/data_states_ingest.json`` (DESIGN.md, "Benchmarks") and prints one summary line last.

    python bench/data_states_ingest.py             # 500,000 states + 500,000 mutations, 5 repetitions
    python bench/data_states_ingest.py --quick     # smoke run
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from _machine import cpu_model, git_commit, write_result
from ingest import BenchError, Collector, post_one_by_one

from flowscope.model.provenance import new_run_id

import flowscope
from flowscope.client.client import Client
from flowscope.sim.dag import layered_dag

BENCH = "data_states_ingest"
TARGET = 200_000
MAIN_PEER = "json_batched"
CRUX_PEER = "crux_post_per_record"
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"


def _no_nulls(record: dict) -> dict:
    return {c: v for c, v in record.items() if v is not None}


class Workload:
    """The graph, cut into batches whose mutations end in the batch's states (a mutation's source is an older
    row, so it is in this batch or an earlier one)."""

    def __init__(self, n_states: int, n_mutations: int, batch: int, seed: int):
        states, muts = layered_dag(n_states, n_mutations, seed=seed)
        order = np.argsort(states.column("ts_ns").to_numpy(), kind="stable")  # rows by time
        self.states = states.take(pa.array(order))
        rank = np.empty(n_states, dtype=np.int64)
        rank[order] = np.arange(n_states)
        dst_row = rank[np.char.lstrip(muts.column("dst_state_id").to_numpy(zero_copy_only=False).astype(str),
                                      "s").astype(np.int64)]
        morder = np.argsort(dst_row, kind="stable")
        self.mutations = muts.take(pa.array(morder))
        dst_sorted = dst_row[morder]
        self.batches = []
        for a in range(0, n_states, batch):
            lo, hi = np.searchsorted(dst_sorted, [a, a + batch])
            self.batches.append((self.states.slice(a, batch), self.mutations.slice(lo, hi - lo)))
        self.records = n_states + self.mutations.num_rows

    def records_for_peer(self, n: int) -> list[tuple[str, dict]]:
        """The first states (by time) and the mutations among them, as (path, JSON record), about ``n`` in all."""
        k = max(2, n // 2)
        st = self.states.slice(0, k).to_pylist()
        ids = {r["state_id"] for r in st}
        mu = [m for m in self.mutations.slice(0, min(self.mutations.num_rows, 4 * n)).to_pylist()
              if m["src_state_id"] in ids and m["dst_state_id"] in ids][: n - k]
        return [("states", _no_nulls(r)) for r in st] + [("mutations", _no_nulls(r)) for r in mu]


def _client(collector: Collector, workdir: Path, name: str) -> Client:
    client = Client(collector.address, name=name, spool_dir=workdir / "spool")
    if not client.flush(30):
        raise BenchError("client could not open the run within 30 s")
    return client


def _verify(collector: Collector, run_id: str, states: int, mutations: int, what: str) -> None:
    counts = flowscope.open_run(collector.store / run_id).counts()
    got = (counts["data_states"], counts["mutations"])
    if got != (states, mutations):
        raise BenchError(f"{what}: sent {states:,} states and {mutations:,} mutations but run {run_id} holds "
                         f"{got[0]:,} and {got[1]:,}")


def table_api(collector: Collector, work: Workload, workdir: Path, batch: int, tag: str) -> dict:
    client = _client(collector, workdir, f"bench-ds-table-{tag}")
    ds = client.data_states(batch=2 * batch + 1)
    t0 = time.perf_counter()
    for st, mu in work.batches:
        ds.add(st, mu)
        ds.flush()
    t1 = time.perf_counter()
    conn = http.client.HTTPConnection(collector.host, collector.port, timeout=300)
    conn.request("GET", f"/v1/runs/{client.run_id}/critical-path")
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    t2 = time.perf_counter()
    conn.close()
    if resp.status != 200 or doc.get("n_states") != work.states.num_rows:
        raise BenchError(f"GET critical-path -> HTTP {resp.status}: {str(doc)[:300]}")
    client.close()
    _verify(collector, client.run_id, work.states.num_rows, work.mutations.num_rows, "table API")
    return {"value": work.records / (t1 - t0), "seconds": t1 - t0, "requests": len(work.batches),
            "critical_path_s": t2 - t1, "path_states": len(doc["ids"])}


def per_record_api(collector: Collector, work: Workload, workdir: Path, batch: int, tag: str) -> dict:
    cols = {c: work.states.column(c).to_pylist() for c in ("state_id", "size_bytes", "ts_ns", "origin",
                                                           "location")}
    mcols = {c: work.mutations.column(c).to_pylist() for c in ("mutation_id", "src_state_id", "dst_state_id",
                                                               "kind")}
    client = _client(collector, workdir, f"bench-ds-record-{tag}")
    ds = client.data_states(batch=2 * batch)
    state, mutation = ds.state, ds.mutation
    t0 = time.perf_counter()
    m = 0
    n_m = len(mcols["dst_state_id"])
    dst, src, kind, mid = mcols["dst_state_id"], mcols["src_state_id"], mcols["kind"], mcols["mutation_id"]
    pos = {}
    for i, (sid, size, ts, origin, loc) in enumerate(zip(*cols.values())):
        state(sid, size_bytes=size, ts_ns=ts, origin=origin, location=loc)
        pos[sid] = i
        while m < n_m and dst[m] == sid:  # the mutations ending here (sorted by destination)
            mutation(src[m], dst[m], kind[m], mutation_id=mid[m])
            m += 1
    ds.flush()
    t1 = time.perf_counter()
    client.close()
    _verify(collector, client.run_id, work.states.num_rows, m, "per-record API")
    return {"value": (work.states.num_rows + m) / (t1 - t0), "seconds": t1 - t0}


def json_bodies(work: Workload) -> list[bytes]:
    """One JSON body per batch of the table API: {"states": [...], "mutations": [...]}, nulls left out."""
    return [json.dumps({"states": [_no_nulls(r) for r in st.to_pylist()],
                        "mutations": [_no_nulls(r) for r in mu.to_pylist()]}).encode() for st, mu in work.batches]


def json_batched(collector: Collector, work: Workload, bodies: list[bytes], tag: str) -> dict:
    """One POST of a JSON body per batch to the REST API, keep-alive, each acknowledged."""
    run_id = new_run_id()
    conn = http.client.HTTPConnection(collector.host, collector.port, timeout=600)
    headers = {"Content-Type": "application/json"}

    def post(path: str, body: bytes) -> None:
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        text = resp.read()
        if resp.status not in (200, 201):
            raise BenchError(f"POST {path} -> HTTP {resp.status}: {text[:300]!r}")

    try:
        post("/v1/runs", json.dumps({"run_id": run_id, "name": f"bench-ds-json-{tag}"}).encode())
        t0 = time.perf_counter()
        for body in bodies:
            post(f"/v1/runs/{run_id}/states", body)
        seconds = time.perf_counter() - t0
        post(f"/v1/runs/{run_id}/close", b'{"status": "finished"}')
    finally:
        conn.close()
    _verify(collector, run_id, work.states.num_rows, work.mutations.num_rows, "JSON batched")
    return {"value": work.records / seconds, "seconds": seconds, "requests": len(bodies)}


def crux_post_per_record(collector: Collector, records: list[tuple[str, dict]], tag: str,
                         max_seconds: float) -> dict:
    run_id, sent, seconds = post_one_by_one(collector, f"bench-ds-crux-{tag}", records, max_seconds)
    n_states = sent.count("states")
    _verify(collector, run_id, n_states, len(sent) - n_states, "POST per record")
    return {"value": len(sent) / seconds, "seconds": seconds, "records": len(sent)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--states", type=int, default=None, help="states (default 500,000)")
    p.add_argument("--mutations", type=int, default=None, help="mutations (default as many as states)")
    p.add_argument("--batch", type=int, default=100_000, help="states per request of the table API")
    p.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    p.add_argument("--peer-records", type=int, default=None, help="records POSTed one by one (default 2,000)")
    p.add_argument("--peer-seconds", type=float, default=None, help="time limit per peer measurement (default 20)")
    p.add_argument("--skip-per-record", action="store_true", help="leave out the per-record API")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="smoke run: 20,000 states, 1 repetition")
    p.add_argument("--output", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    a.states = a.states or (20_000 if a.quick else 500_000)
    a.mutations = a.mutations if a.mutations is not None else a.states
    a.repeat = a.repeat or (1 if a.quick else 5)
    a.peer_records = a.peer_records or (200 if a.quick else 2_000)
    a.peer_seconds = a.peer_seconds or (3.0 if a.quick else 20.0)
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall0 = time.perf_counter()
    work = Workload(args.states, args.mutations, args.batch, args.seed)
    peer_records = work.records_for_peer(args.peer_records)
    print(f"graph: {work.states.num_rows:,} states, {work.mutations.num_rows:,} mutations, "
          f"{len(work.batches)} batches", file=sys.stderr, flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="flowscope-bench-ds-"))
    samples: dict[str, list[dict]] = {"table_api": [], "per_record_api": [], MAIN_PEER: [], CRUX_PEER: []}
    bodies = json_bodies(work)
    collector = None
    try:
        collector = Collector(workdir)
        warm = Workload(5_000, 5_000, 2_000, args.seed + 1)
        table_api(collector, warm, workdir, 2_000, "warmup")
        crux_post_per_record(collector, warm.records_for_peer(20), "warmup", 2.0)
        json_batched(collector, warm, json_bodies(warm), "warmup")
        measures = [("table_api", lambda tag: table_api(collector, work, workdir, args.batch, tag)),
                    (MAIN_PEER, lambda tag: json_batched(collector, work, bodies, tag)),
                    (CRUX_PEER, lambda tag: crux_post_per_record(collector, peer_records, tag, args.peer_seconds))]
        if not args.skip_per_record:
            measures.append(("per_record_api",
                             lambda tag: per_record_api(collector, work, workdir, args.batch, tag)))
        for rep in range(args.repeat):
            for key, fn in measures[rep % len(measures):] + measures[:rep % len(measures)]:
                res = fn(f"r{rep}")
                samples[key].append(res)
                print(f"rep {rep + 1} {key:<22} {res['value']:>12,.0f} records/s ({res['seconds']:.2f} s)",
                      file=sys.stderr, flush=True)
        rtt = collector.rtt_ms
    finally:
        if collector is not None:
            collector.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    med = {k: statistics.median(s["value"] for s in v) for k, v in samples.items() if v}
    value, peer, crux = med["table_api"], med[MAIN_PEER], med[CRUX_PEER]
    result = write_result({
        "benchmark": BENCH, "metric": "records_per_s", "value": round(value, 1), "unit": "records/s",
        "target": TARGET, "meets_target": value >= TARGET,
        "peers": {MAIN_PEER: {"value": round(peer, 1), "unit": "records/s"},
                  CRUX_PEER: {"value": round(crux, 1), "unit": "records/s", "note": "subsample, extrapolated"}},
        "ratio_vs_peer": round(value / peer, 1),
        "params": {
            "states": work.states.num_rows, "mutations": work.mutations.num_rows, "records": work.records,
            "batch_states": args.batch, "requests": len(work.batches), "repeat": args.repeat, "seed": args.seed,
            "value_is": "table API: DataStates.add(states, mutations) + flush() per batch (one Arrow request "
                        "each), from the first call to the last acknowledgement; the collector checks every "
                        "request whole, updates the online critical path and writes Parquet before it answers",
            "main_peer": MAIN_PEER,
            "peer_is": "one POST per batch of the REST API with a JSON body {states, mutations} (bodies "
                       "serialised before the clock), keep-alive, each acknowledged; full size",
            "crux_peer_is": "one JSON POST per state / mutation (the Crux prototype's style), keep-alive, each "
                            "acknowledged; measured on a subsample and extrapolated",
            "crux_records_sent": [s["records"] for s in samples[CRUX_PEER]],
            "crux_extrapolated_s": round(work.records / crux, 1),
            "json_batched_seconds": [round(s["seconds"], 3) for s in samples[MAIN_PEER]],
            "table_api_spread": {"min": min(x["value"] for x in samples["table_api"]),
                                 "max": max(x["value"] for x in samples["table_api"])},
            "table_api_seconds": [round(s["seconds"], 3) for s in samples["table_api"]],
            "critical_path_get_s": [round(s["critical_path_s"], 3) for s in samples["table_api"]],
            "critical_path_get_is": "GET /v1/runs/{run}/critical-path right after the ingest: the online path "
                                    "takes in every batch acknowledged since it was last asked for",
            "records_per_s_including_path": round(statistics.median(
                work.records / (s["seconds"] + s["critical_path_s"]) for s in samples["table_api"]), 1),
            "per_record_api_records_per_s": round(med["per_record_api"], 1) if "per_record_api" in med else None,
            "samples_records_per_s": {k: [round(s["value"], 1) for s in v] for k, v in samples.items()},
            "verified": "open_run(run).counts() equals what was sent, for every measurement",
            "collector_health_rtt_ms": round(rtt, 3), "flowscope_commit": git_commit(), "cpu_model": cpu_model(),
            "pyarrow": pa.__version__, "wall_s": round(time.perf_counter() - wall0, 1),
        },
    }, args.output)
    rec = f", per-record API {med['per_record_api']:,.0f}" if "per_record_api" in med else ""
    print(f"data_states_ingest: {work.records:,} records ({work.states.num_rows:,} states + "
          f"{work.mutations.num_rows:,} mutations) at {value:,.0f} records/s "
          f"({'meets' if result['meets_target'] else 'below'} target {TARGET:,}){rec}; batched JSON to the same "
          f"REST API {peer:,.0f}/s (x{result['ratio_vs_peer']:,.1f}); Crux-style POST per record {crux:,.0f}/s "
          f"({result['params']['crux_extrapolated_s']:,.0f} s extrapolated) [median of {args.repeat}]", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BenchError, flowscope.FlowscopeError) as exc:
        print(f"data_states_ingest: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
