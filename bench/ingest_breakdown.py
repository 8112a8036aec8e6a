"""Where a record's CPU time goes on flowscope's per-record path: a profile, not a race (bench/ingest.py is the race).

One thread, CPU time (``time.process_time``, steadier than wall time on a shared machine), the dask shape of
bench/ingest.py (8 function names, one resource, a unique task key per span, no attrs). ``Client.span`` is the
compiled recorder when it is built (client/span_recorder.py, the default) and the pure-Python generated method
otherwise (``Client(compiled=False)``); both are measured. Per record:

* ``loop_and_call`` -- the producer's loop calling an empty Python function with Client.span's signature and the
  same keyword arguments: what any Python API costs before it does anything.
* ``span`` -- the compiled ``Client.span``, buffers never flushed (so no batch conversion in the figure).
* ``python_span`` -- the pure-Python ``Client.span``, the same way.
* ``python_span_without_<part>`` -- the pure-Python method's generated code with one part cut out (its value
  checks, its string-dictionary lookup, or six of its seven column appends); the difference to ``python_span`` is
  that part's cost.
* ``take`` / ``python_take`` -- turning a thread's buffered batch (65,536 records) into an Arrow table
  (``SpanBuffer.take`` over the C buffers, ``Packer.take`` over the Python lists).
* ``ipc`` -- serialising that table as the Arrow IPC stream the client POSTs.

``value`` is span + take + ipc on the compiled path (the pure-Python path's when the extension is not built).

Each variant runs ``--repeat`` times interleaved; the minimum per variant is reported (the least disturbed run).
Writes ``bench/results/ingest_breakdown.json`` and prints a table.

    python bench/ingest_breakdown.py             # 500,000 spans per variant, 5 repetitions (about a minute)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

from _machine import cpu_model, git_commit, write_result

import flowscope
from flowscope.client import packer as packer_module
from flowscope.client import span_recorder
from flowscope.client.packer import Packer
from flowscope.client.transport import ipc_bytes

RESULTS = Path(__file__).resolve().parent / "results" / "ingest_breakdown.json"
FUNCTIONS = ("load", "inc", "double", "add", "sum", "store", "fetch", "reduce")
BASE_NS = 1_763_700_000_000_000_000


def _variants() -> dict[str, object]:
    """The pure-Python Client.span as generated, and with one part of its body cut out."""
    source = flowscope.Client.span.__source__
    lines = source.split("\n")
    lookup = ("    try:\n        k = get((resource_id, kind, name))\n    except TypeError:\n        k = None\n"
              "    if k is None:\n        k = code((resource_id, kind, name))\n")
    if lookup not in source:
        raise SystemExit("Client.span's generated code changed: update bench/ingest_breakdown.py")
    checks = [ln for ln in lines if ln.startswith("    if ") and "len(rows)" not in ln and "k is None" not in ln]
    texts = {
        "python_span": source,
        "python_span_without_checks": "\n".join(ln for ln in lines if ln not in checks),
        "python_span_without_dictionary": source.replace(lookup, "    k = 0\n"),
        "python_span_without_6_appends": "\n".join(ln for ln in lines if not (ln.startswith("    append_") and
                                                                               not ln.startswith("    append_0("))),
    }
    out = {}
    for name, text in texts.items():
        ns = packer_module._namespace()
        exec(text, ns)  # noqa: S102 - Client.span's own generated source, with lines removed
        out[name] = ns["method"]

    def empty(self, name, start_ns, end_ns, *, kind="call", resource_id=None, task_key=None, attrs=None,
              span_id=None, parent_id=None):
        return None

    out["loop_and_call"] = empty
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    n = args.records
    names = [FUNCTIONS[j % 8] for j in range(n)]
    starts = [BASE_NS + j * 1_000 for j in range(n)]
    ends = [s + 750 for s in starts]
    keys = [f"{FUNCTIONS[j % 8]}-{j:08x}" for j in range(n)]
    rid = "thread:bench-host:4242:1000"
    tmp = Path(tempfile.mkdtemp(prefix="flowscope-breakdown-"))
    clients = {compiled: flowscope.Client(store=tmp / f"store-{compiled}", spool_dir=tmp / "spool", name="breakdown",
                                          flush_records=10**9, flush_interval=10**6, compiled=compiled)
               for compiled in ([True, False] if span_recorder.AVAILABLE else [False])}
    python = clients[False]
    variants = {label: types.MethodType(f, python) for label, f in _variants().items()}  # bound, as client.span is
    if True in clients:
        variants["span"] = clients[True].span
    for c in clients.values():
        c.span("warm", BASE_NS, BASE_NS)
    samples: dict[str, list[float]] = {k: [] for k in [*variants, "python_take", "take", "ipc"]}
    clock = time.process_time
    for rep in range(args.repeat):
        order = list(variants)
        order = order[rep % len(order):] + order[:rep % len(order)]
        for label in order:
            f = variants[label]
            t = clock()
            for name, s, e, key in zip(names, starts, ends, keys):
                f(name, s, e, kind="task", resource_id=rid, task_key=key)
            samples[label].append((clock() - t) / n * 1e9)
            for c in clients.values():  # what the variant buffered: dropped, not converted
                buffered = c._local.packers["spans"]
                if isinstance(buffered, Packer):
                    for lst in buffered._all:
                        lst.clear()
                else:
                    buffered._take()
        batches = {"python_take": Packer("spans")}
        if span_recorder.AVAILABLE:
            batches["take"] = span_recorder.SpanBuffer(flush_rows=10**9, rid=rid)
        for label in sorted(batches, key=lambda k: (k != order[0], k)):  # alternate which goes first
            p = batches[label]
            for name, s, e, key in zip(names[:65_536], starts, ends, keys):
                p.add(None, None, rid, "task", name, s, e, key, None)
            t = clock()
            table = p.take()
            t1 = clock()
            samples[label].append((t1 - t) / table.num_rows * 1e9)
        t2 = clock()
        ipc_bytes(table)
        samples["ipc"].append((clock() - t2) / table.num_rows * 1e9)
    for c in clients.values():
        c.close()
    samples = {k: v for k, v in samples.items() if v}
    best = {k: round(min(v), 1) for k, v in samples.items()}
    python_parts = {"call_and_loop": best["loop_and_call"],
                    "checks": round(best["python_span"] - best["python_span_without_checks"], 1),
                    "dictionary_lookup": round(best["python_span"] - best["python_span_without_dictionary"], 1),
                    "six_appends": round(best["python_span"] - best["python_span_without_6_appends"], 1)}
    python_parts["rest_of_span"] = round(best["python_span"] - best["loop_and_call"] - python_parts["checks"]
                                         - python_parts["dictionary_lookup"] - python_parts["six_appends"], 1)
    python_parts["take_to_arrow"] = best["python_take"]
    python_parts["ipc_serialise"] = best["ipc"]
    python_total = best["python_span"] + best["python_take"] + best["ipc"]
    if "span" in best:
        parts = {"span": best["span"], "take_to_arrow": best["take"], "ipc_serialise": best["ipc"]}
        total = best["span"] + best["take"] + best["ipc"]
    else:
        parts, total = python_parts, python_total
    result = {
        "benchmark": "ingest_breakdown", "metric": "cpu_ns_per_record", "value": round(total, 1), "unit": "ns",
        "target": None, "meets_target": None, "peers": {}, "ratio_vs_peer": None,
        "compiled": "span" in best, "parts_ns": parts, "python_parts_ns": python_parts,
        "python_value": round(python_total, 1), "variants_ns": best,
        "samples_ns": {k: [round(x, 1) for x in v] for k, v in samples.items()},
        "median_ns": {k: round(statistics.median(v), 1) for k, v in samples.items()},
        "min_max_ns": {k: [round(min(v), 1), round(max(v), 1)] for k, v in samples.items()},
        "params": {"records": n, "repeat": args.repeat, "threads": 1, "clock": "process CPU time, minimum of the "
                   "repetitions", "value_is": "span + take + ipc per record, one thread, no collector, on the "
                   "compiled path when built (python_value: the pure-Python path)",
                   "flowscope_commit": git_commit(), "cpu_model": cpu_model()},
    }
    write_result(result, args.output)
    print("pure-Python path:")
    for k, v in python_parts.items():
        print(f"  {k:<20} {v:>7.1f} ns/record")
    if "span" in best:
        print("compiled path:")
        for k, v in parts.items():
            print(f"  {k:<20} {v:>7.1f} ns/record")
        print(f"  (the loop and a call of an empty Python function with span's arguments: {best['loop_and_call']} ns)")
    med = {k: statistics.median(samples[k]) for k in (("span", "take") if "span" in best else ("python_span", "python_take"))}
    print(f"  (medians of the {args.repeat} repetitions: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items())
          + f", ipc {statistics.median(samples['ipc']):.1f} ns/record)")
    print(f"ingest_breakdown: {total:,.0f} ns of CPU per record on the per-record path "
          f"({'compiled' if 'span' in best else 'pure Python'}; pure Python {python_total:,.0f}); wrote {args.output}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
