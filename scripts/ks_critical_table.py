"""Write src/flowscope/analysis/forecast/ks_critical.json: the KS critical values (flowscope.analysis.forecast.windows
.critical_d at 5 %) for every window size up to ``--largest``, as the installed scipy's ks_2samp decides them.

Run it when scipy changes version (tests/test_forecast_bench.py fails then): about 5 minutes for 50,000 sizes.

    python scripts/ks_critical_table.py [--largest 50000]
"""

from __future__ import annotations

import argparse
import sys
import time

from flowscope.analysis.forecast.windows import TABLE_FILE, write_critical_table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--largest", type=int, default=50_000, help="the largest window size (default 50,000)")
    args = ap.parse_args()
    t0 = time.perf_counter()

    def progress(w: int, n: int) -> None:
        print(f"\rwindow sizes {w:,}/{n:,} ({time.perf_counter() - t0:.0f} s)", end="", file=sys.stderr, flush=True)

    path = write_critical_table(args.largest, TABLE_FILE, progress)
    print(f"\nwrote {path} ({path.stat().st_size:,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
