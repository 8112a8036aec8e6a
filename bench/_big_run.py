"""A Dask-shaped run of any size, written straight to Parquet segments the way the collector writes them.

Shape, taken from a real `flowscope demo` run (dask-distributed capture): task spans on worker threads, no span ids
(the capture writes none), the span's name the task prefix, the key ``('prefix-<token>', i)``, attrs as the capture
writes them (nbytes, thread_ident, worker, state, clock_offset_ns, attempt_id, io: about 160 bytes of JSON), the
resources host > worker (nthreads) > thread, and the run.json semantics the Dask source declares. Each thread runs
its tasks one after another with small gaps; durations are log-normal per task group (20 groups, a few ms to a few
hundred ms), and one task in 100,000 is slowed 20-50 times (anomalies to find).

Beside each task span, the rows the capture writes for the same task, in the proportions of that run: five
scheduler transitions (released > waiting > processing > memory > released > forgotten, with stimulus ids), two
dependencies on earlier tasks of the same thread, and one per-task I/O counter row (``proc-io``, bytes without
time). The analyses read the spans and the I/O rows; the transitions and dependencies make the store what it is.

The segments are in time order and each holds rows of every thread, as a collector receiving batches from every
worker at once writes them: the worst case for regrouping by resource, which then moves every row.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GROUPS = ["read-parquet", "getitem", "astype", "add", "mul", "sum-chunk", "sum-partial", "mean-chunk",
          "rechunk-split", "rechunk-merge", "transpose", "matmul", "filter", "assign", "groupby-chunk",
          "groupby-agg", "shuffle-split", "shuffle-merge", "to-parquet", "finalize"]
EPOCH_NS = 1_796_000_000_000_000_000


def _resources(hosts: int, workers: int, threads: int, t0: int) -> tuple[pa.Table, list[str], list[int], list[str]]:
    rows, thread_ids, idents, addrs = [], [], [], []
    for h in range(hosts):
        host = f"host:node{h:03d}"
        rows.append({"resource_id": host, "kind": "host", "name": f"node{h:03d}", "parent_id": None,
                     "host": f"node{h:03d}"})
        for w in range(workers):
            addr = f"tcp://10.0.{h}.{w + 10}:{40000 + w}"
            worker = f"worker:{addr}"
            rows.append({"resource_id": worker, "kind": "worker", "name": f"{h * workers + w}", "parent_id": host,
                         "host": f"node{h:03d}", "address": addr,
                         "attrs": json.dumps({"nthreads": threads, "memory_limit": 16 << 30})})
            for t in range(threads):
                rid = f"thread:node{h:03d}:{5000 + w}:{6000 + w * threads + t}"
                rows.append({"resource_id": rid, "kind": "thread", "parent_id": worker, "host": f"node{h:03d}",
                             "name": f"{h * workers + w}-Dask-Default-Threads-{5000 + w}-{t}",
                             "pid": 5000 + w, "tid": 6000 + w * threads + t})
                thread_ids.append(rid)
                idents.append(140_000_000_000_000 + (h * workers + w) * 1_000_000 + t * 4096)
                addrs.append(addr)
    from flowscope.model.schemas import schema

    target = schema("resources")
    cols = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in target}
    cols["start_ns"] = pa.array([t0] * len(rows), pa.int64())
    return pa.table(cols, schema=target), thread_ids, idents, addrs


def make_run(store: Path, *, rows: int | None = None, gib: float | None = None, hosts: int = 16, workers: int = 4,
             threads: int = 8, rows_per_segment: int = 200_000, seed: int = 0, progress: bool = True,
             full_capture: bool = True) -> Path:
    """Write the run into ``store`` until it holds ``rows`` spans, or ``gib`` GiB of segments; its directory. With
    ``full_capture``, each task's transitions, dependencies and I/O row too."""
    from flowscope.embedded import Client
    from flowscope.sources.dask.plugins import SEMANTICS

    rng = np.random.default_rng(seed)
    fs = Client(store=store, name="big dask-shaped run", command="bench/_big_run.py",
                meta={"start_ns": EPOCH_NS, "semantics": [SEMANTICS]})
    res, thread_ids, idents, addrs = _resources(hosts, workers, threads, EPOCH_NS)
    fs.write("resources", res)
    run_dir = Path(fs.run_dir)
    fs.close(status="finished", end_ns=EPOCH_NS)
    nthreads = len(thread_ids)
    g = len(GROUPS)
    mu = np.log(rng.uniform(3e6, 3e8, g))        # median duration per group, ns
    sigma = rng.uniform(0.2, 0.6, g)
    weights = rng.dirichlet(np.ones(g) * 2)
    tokens = [f"{rng.integers(0, 2**63):016x}{rng.integers(0, 2**63):016x}" for _ in range(g)]
    prefix = pa.array([f"('{name}-{tok}', " for name, tok in zip(GROUPS, tokens)])
    names = pa.array(GROUPS)
    rid = pa.array(thread_ids)
    ident_text = pa.array([str(i) for i in idents])
    addr_arr = pa.array(addrs)
    clock = np.full(nthreads, EPOCH_NS, np.int64) + rng.integers(0, 10**7, nthreads)
    counter = np.zeros(g, np.int64)
    out = run_dir / "spans"
    out.mkdir(exist_ok=True)
    written = nbytes = seg = 0
    limit_bytes = int(gib * (1 << 30)) if gib else None
    started = time.monotonic()
    while (rows is None or written < rows) and (limit_bytes is None or nbytes < limit_bytes):
        n = rows_per_segment if rows is None else min(rows_per_segment, rows - written)
        per = -(-n // nthreads)
        thread = np.tile(np.arange(nthreads), per)[:n]
        grp = rng.choice(g, size=n, p=weights)
        dur = np.exp(rng.normal(mu[grp], sigma[grp])).astype(np.int64) + 1000
        slow = rng.random(n) < 1e-5
        dur[slow] *= rng.integers(20, 50, int(slow.sum()))
        gap = rng.integers(20_000, 400_000, n)
        # each thread's tasks one after another: per thread, the running sum of (gap + duration) from its clock
        step = (gap + dur).reshape(per, nthreads) if n == per * nthreads else None
        if step is not None:
            ends = clock + np.cumsum(step, axis=0)
            start = (ends - dur.reshape(per, nthreads)).ravel()
            clock = ends[-1]
        else:
            start = np.empty(n, np.int64)
            for i in range(n):
                t = thread[i]
                clock[t] += gap[i]
                start[i] = clock[t]
                clock[t] += dur[i]
        index = np.empty(n, np.int64)
        for k in np.unique(grp):  # the key's index within its group
            m = grp == k
            index[m] = counter[k] + np.arange(int(m.sum()))
            counter[k] += int(m.sum())
        idx = pa.array(grp)
        key = pc.binary_join_element_wise(prefix.take(idx), pc.cast(pa.array(index), pa.string()), ")", "")
        th = pa.array(thread)
        attrs = pc.binary_join_element_wise(
            '{"nbytes": ', pc.cast(pa.array(rng.integers(64, 1 << 26, n)), pa.string()),
            ', "thread_ident": ', ident_text.take(th), ', "worker": "', addr_arr.take(th),
            '", "state": "memory", "clock_offset_ns": 0, "attempt_id": ', pc.cast(pa.array(index % 97), pa.string()),
            ', "io": "own"}', "")
        table = pa.table({"span_id": pa.nulls(n, pa.int64()), "parent_id": pa.nulls(n, pa.int64()),
                          "resource_id": rid.take(th), "kind": pa.array(["task"] * n),
                          "name": names.take(idx), "start_ns": start, "end_ns": start + dur, "task_key": key,
                          "attrs": attrs})
        path = out / f"bench-{seg:07d}.parquet"
        pq.write_table(table, path)
        nbytes += os.path.getsize(path)
        if full_capture:
            nbytes += _write_beside(run_dir, seg, table, th, grp, prefix.take(idx), addr_arr, idents, names, rng)
        written += n
        seg += 1
        if progress and seg % 50 == 0:
            rate = written / max(time.monotonic() - started, 1e-9)
            print(f"  {written:,} tasks, {nbytes / (1 << 30):.2f} GiB, {rate:,.0f} tasks/s", flush=True)
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["end_ns"] = int(clock.max())
    meta_path.write_text(json.dumps(meta))
    return run_dir


_STATES = [("released", "waiting"), ("waiting", "processing"), ("processing", "memory"), ("memory", "released"),
           ("released", "forgotten")]


def _write_beside(run_dir: Path, seg: int, spans: pa.Table, th: pa.Array, grp: np.ndarray, key_prefix: pa.Array,
                  addr_arr: pa.Array, idents: list[int], names: pa.Array, rng: np.random.Generator) -> int:
    """The transitions, dependencies and I/O row of each task of ``spans``; the bytes written."""
    from flowscope.model.schemas import schema

    n = spans.num_rows
    key, start, end = spans["task_key"], spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
    worker = pc.binary_join_element_wise("worker:", addr_arr.take(th), "")
    group = names.take(pa.array(grp))
    stim = pc.binary_join_element_wise("update-graph-", pc.cast(pa.array(start // 1_000_000_000 * 1000 + seg % 1000),
                                                                pa.string()), "")
    ts = [start - 2_000_000, start - 1_000_000, end + 50_000, end + 5_000_000, end + 5_100_000]
    tr = pa.concat_tables([pa.table({
        "ts_ns": t, "task_key": key, "group": group, "prefix": group, "from_state": pa.array([a] * n),
        "to_state": pa.array([b] * n), "observer": pa.array(["scheduler"] * n),
        "worker": worker if b in ("processing", "memory") else pa.nulls(n, pa.string()),
        "stimulus_id": stim, "attrs": pa.nulls(n, pa.string())}, schema=schema("transitions"))
        for t, (a, b) in zip(ts, _STATES)])
    # two tasks of the same group (any index so far)
    earlier = [pc.cast(pa.array(rng.integers(0, max(seg, 1) * 1000 + n, n)), pa.string()) for _ in range(2)]
    dep = pa.concat_tables([pa.table({
        "graph_id": pa.array([f"update-graph-{seg // 100}"] * n), "task_key": key,
        "depends_on": pc.binary_join_element_wise(key_prefix, e, ")", ""),
        "ts_ns": start - 3_000_000}, schema=schema("dependencies")) for e in earlier])
    written = rng.integers(0, 1 << 24, n)
    io = pa.table({
        "resource_id": spans["resource_id"], "host": pc.utf8_slice_codeunits(spans["resource_id"], 7, 14),
        "pid": pa.nulls(n, pa.int64()), "tid": pa.nulls(n, pa.int64()),
        "thread_ident": pa.array(np.asarray(idents, np.int64)[th.to_numpy()]), "rank": pa.nulls(n, pa.int64()),
        "source": pa.array(["proc-io"] * n), "op": pa.array(["write"] * n), "path": pa.nulls(n, pa.string()),
        "offset": pa.nulls(n, pa.int64()), "nbytes": written, "start_ns": start, "end_ns": end, "task_key": key,
        "attrs": pc.binary_join_element_wise('{"syscw": 2, "write_bytes": ', pc.cast(pa.array(written + 4096),
                                             pa.string()), ', "cancelled_write_bytes": 0, "interface": "syscalls", '
                                             '"aggregate": true, "ops": 2, "tasks": 1}', "")}, schema=schema("io"))
    total = 0
    for table, data in (("transitions", tr), ("dependencies", dep), ("io", io)):
        d = run_dir / table
        d.mkdir(exist_ok=True)
        path = d / f"bench-{seg:07d}.parquet"
        pq.write_table(data, path)
        total += os.path.getsize(path)
    return total
