"""Segment encoding: the store's Parquet write of one batch, with dictionary encoding only on the string
columns whose values repeat (``flowscope.model.schemas.dictionary_columns``) against pyarrow's default of a
dictionary on every column (what the collector did before).

The batch is what the scheduler and a worker deliver for the tiny-task graph of bench/overhead.py: 120,000
``transitions`` rows (each task's ~6 transitions; tuple task keys, stimulus ids that are mostly unique) and
20,000 task ``spans``. Both encodings are written to memory with zstd, alternating, ``--repeat`` times
(medians, with min and max); each file is read back and must equal the table written; CPU time per row of writing and of reading the file back, and the file sizes, are reported.

Writes ``bench/results/segment_encoding.json`` (DESIGN.md, "Benchmarks"; ``value`` is the write time per
row of the store's encoding divided by the default's) and prints one summary line last.

    python bench/segment_encoding.py
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _machine import write_result
from flowscope.model.conform import conform
from flowscope.model.schemas import dictionary_columns

RESULTS = Path(__file__).parent / "results" / "segment_encoding.json"
STATES = ["released", "waiting", "ready", "executing", "memory", "released", "forgotten"]


def transitions(tasks: int) -> pa.Table:
    rows = tasks * 6
    i = np.arange(rows)
    task = i // 6
    t0 = 1_795_000_000_000_000_000
    return conform("transitions", pa.table({
        "ts_ns": t0 + i * 120_000,
        "task_key": [f"('add-{k // 100:032x}', {k})" for k in task.tolist()],
        "group": [f"add-{k // 100:032x}" for k in task.tolist()],
        "prefix": ["add"] * rows,
        "from_state": [STATES[j % 6] for j in i.tolist()],
        "to_state": [STATES[j % 6 + 1] for j in i.tolist()],
        "observer": ["worker:tcp://127.0.0.1:40321"] * rows,
        "worker": ["worker:tcp://127.0.0.1:40321"] * rows,
        "stimulus_id": [f"compute-task-{1795000000 + j * 0.00012:.6f}" for j in i.tolist()],
        "attrs": pa.nulls(rows, pa.string()),
    }))


def spans(tasks: int) -> pa.Table:
    k = np.arange(tasks)
    t0 = 1_795_000_000_000_000_000 + k * 700_000
    return conform("spans", pa.table({
        "span_id": pa.nulls(tasks, pa.int64()), "parent_id": pa.nulls(tasks, pa.int64()),
        "resource_id": [f"thread:host:{1000 + j % 2}:{2000 + j % 4}" for j in k.tolist()],
        "kind": ["task"] * tasks, "name": ["add"] * tasks, "start_ns": t0, "end_ns": t0 + 90_000,
        "task_key": [f"('add-{j // 100:032x}', {j})" for j in k.tolist()],
        "attrs": [f'{{"nbytes": 28, "thread_ident": {140000000 + j % 4}, "worker": "tcp://127.0.0.1:40321", '
                  f'"state": "memory"}}' for j in k.tolist()],
    }))


def measure(table: pa.Table, use_dictionary) -> tuple[float, float, int]:
    """(write CPU µs/row, read CPU µs/row, bytes)."""
    buf = io.BytesIO()
    c0 = time.process_time()
    pq.write_table(table, buf, compression="zstd", use_dictionary=use_dictionary, write_statistics=True)
    write = time.process_time() - c0
    data = buf.getvalue()
    c0 = time.process_time()
    back = pq.read_table(io.BytesIO(data))
    read = time.process_time() - c0
    if not back.equals(table):  # checked before any time is kept: both encodings must read back the same table
        raise SystemExit(f"use_dictionary={use_dictionary!r}: the segment read back differs from the table written")
    return write / table.num_rows * 1e6, read / table.num_rows * 1e6, len(data)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args()

    tables = {"transitions": transitions(args.tasks), "spans": spans(args.tasks)}
    out: dict = {}
    for name, table in tables.items():
        ways = {"store": dictionary_columns(table.schema), "all_columns": True}
        got: dict = {w: [] for w in ways}
        for r in range(args.repeat):
            for w in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                got[w].append(measure(table, ways[w]))
        out[name] = {w: {"rows": table.num_rows,
                         "write_us_per_row": round(statistics.median(x[0] for x in v), 4),
                         "write_us_per_row_min_max": [round(min(x[0] for x in v), 4), round(max(x[0] for x in v), 4)],
                         "read_us_per_row": round(statistics.median(x[1] for x in v), 4),
                         "read_us_per_row_min_max": [round(min(x[1] for x in v), 4), round(max(x[1] for x in v), 4)],
                         "bytes": v[0][2]} for w, v in got.items()}
        out[name]["dictionary_columns"] = ways["store"]
        s, a = out[name]["store"], out[name]["all_columns"]
        print(f"{name:12s} store {s['write_us_per_row']:.3f} us/row write "
              f"[{s['write_us_per_row_min_max'][0]:.3f}-{s['write_us_per_row_min_max'][1]:.3f}], "
              f"{s['read_us_per_row']:.3f} read, "
              f"{s['bytes']:,} B | dictionary on every column {a['write_us_per_row']:.3f} write, "
              f"{a['read_us_per_row']:.3f} read, {a['bytes']:,} B")

    rows = sum(t.num_rows for t in tables.values())
    store = sum(out[n]["store"]["write_us_per_row"] * tables[n].num_rows for n in tables) / rows
    peer = sum(out[n]["all_columns"]["write_us_per_row"] * tables[n].num_rows for n in tables) / rows
    ratio = store / peer
    write_result({
        "benchmark": "segment_encoding", "metric": "parquet_write_cpu_ratio", "value": round(ratio, 4), "unit": "x",
        "target": None, "meets_target": None,
        "peers": {"dictionary_on_every_column": {"value": round(peer, 4), "unit": "us/row"}},
        "ratio_vs_peer": round(ratio, 4),
        "params": {"tasks": args.tasks, "repeat": args.repeat, "compression": "zstd", "tables": out,
                   "store_write_us_per_row": round(store, 4)},
    }, args.output)
    print(f"segment_encoding: the store's encoding writes a segment in {ratio:.2f}x the CPU of a dictionary on "
          f"every column ({store:.3f} vs {peer:.3f} us/row, {rows:,} rows)")


if __name__ == "__main__":
    main()
