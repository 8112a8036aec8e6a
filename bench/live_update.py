"""What watching a run costs the collector per record, in process: the live view's update of one batch
(``LiveRun.apply``) and the encoding of its delta for the pages connected, measured as the process's CPU time
(DuckDB works in threads of its own).

The batches are those of ``bench/dashboard.py``'s ingest part (task spans as flowscope's Dask worker plugin sends
them: 20 workers x 4 threads, 20 task groups in phases, one unique key per span). Measured side by side, alternating,
``--repeat`` times (medians):

- ``now``: this checkout: ``LiveRun.apply`` then ``live_hub.Encoded`` (the delta encoded once; every page is sent
  the same message);
- ``before``: the live view of commit ``--baseline`` (per-record Python update, read with ``git show``), its delta
  encoded once per page as Starlette's ``send_json`` did.

Both views are fed the same batches and must end with equal snapshots. Not counted: the WebSocket send itself (per
page in both), the HTTP decode and the segment write. CPU time, not wall time: on a shared machine the figure still
holds roughly, but say it was shared.

    python bench/live_update.py                 # 100,000 records, 0 / 1 / 5 pages, 5 repetitions
    python bench/live_update.py --records 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import write_result
from dashboard import _semantics, ingest_batches


def _baseline(commit: str):
    """analysis/live.py as it was at ``commit``, imported as a module of its own."""
    src = subprocess.run(["git", "show", f"{commit}:src/flowscope/analysis/live.py"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent).stdout
    path = Path(tempfile.mkdtemp()) / "live_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("live_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _send_json_text(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def measure(make_view, batches, pages: int, once: bool, epoch: str) -> tuple[float, dict]:
    """CPU seconds of this process to apply every batch and encode its delta for ``pages`` pages; the final snapshot."""
    from flowscope.service.live_hub import Encoded

    view = make_view()
    cpu = 0.0
    for i, (_, table) in enumerate(batches):
        c0 = time.process_time()
        delta = view.apply("spans", f"b{i}", table)
        if delta is not None and pages:
            if once:
                Encoded(epoch, delta)
            else:
                for _ in range(pages):
                    _send_json_text({"type": "deltas", "epoch": epoch, "deltas": [delta]})
        cpu += time.process_time() - c0
    return cpu, view.snapshot()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000, help="records fed per measurement (default 100,000)")
    ap.add_argument("--rate", type=int, default=100_000, help="records/s the batches are shaped for (default 100,000)")
    ap.add_argument("--pages", default="0,1,5", help="pages connected (default 0,1,5)")
    ap.add_argument("--repeat", type=int, default=5, help="interleaved repetitions (default 5)")
    ap.add_argument("--baseline", default="6c3eacc", help="commit whose per-record live view is the 'before' peer")
    ap.add_argument("--shared", action="store_true", help="record that the machine was shared (busy) during the run")
    ap.add_argument("--output", default="live_update", help="result name (bench/results/NAME.json)")
    args = ap.parse_args(argv)

    from flowscope.analysis.live import LiveRun

    before = _baseline(args.baseline)
    workers = 20
    batches = ingest_batches(args.rate, args.records / args.rate, workers, t0_ns=10**18)
    n = sum(t.num_rows for _, t in batches)
    meta = {"run_id": "bench", "start_ns": 10**18}
    kinds = {"now": (lambda: LiveRun(meta, _semantics()), True),
             "before": (lambda: before.LiveRun(meta, _semantics()), False)}
    pages = [int(p) for p in args.pages.split(",")]
    us: dict[str, list[float]] = {}
    for rep in range(args.repeat):
        for p in pages:
            snaps = {}
            for kind in (("now", "before") if rep % 2 == 0 else ("before", "now")):
                make, once = kinds[kind]
                cpu, snaps[kind] = measure(make, batches, p, once, "e" * 32)
                us.setdefault(f"{kind}/{p}", []).append(cpu / n * 1e6)
            if snaps["now"] != snaps["before"]:
                raise SystemExit("the two live views disagree: the measurement is void")
    med = {k: statistics.median(v) for k, v in us.items()}
    top = max(pages)
    result = {"benchmark": args.output, "metric": "watch_cpu_us_per_record", "value": round(med[f"now/{top}"], 3),
              "unit": "us/record", "target": None, "meets_target": None,
              "peers": {f"before ({args.baseline})": {"value": round(med[f"before/{top}"], 3), "unit": "us/record"}},
              "ratio_vs_peer": round(med[f"now/{top}"] / med[f"before/{top}"], 3),
              "params": {"records": n, "batches": len(batches), "rate": args.rate, "pages": pages,
                         "repeat": args.repeat, "shared_machine": args.shared},
              "per_config_us_per_record": {k: {"median": round(m, 3), "min": round(min(us[k]), 3),
                                               "max": round(max(us[k]), 3)} for k, m in med.items()}}
    write_result(result, Path(__file__).resolve().parent / "results" / f"{args.output}.json")
    for p in pages:
        print(f"{p} page(s): now {med[f'now/{p}']:.2f} us/record, before {med[f'before/{p}']:.2f} us/record")
    print(f"live_update: {med[f'now/{top}']:.2f} us/record with {top} pages (before: {med[f'before/{top}']:.2f}); "
          f"{n} records in {len(batches)} batches{' (machine shared)' if args.shared else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
