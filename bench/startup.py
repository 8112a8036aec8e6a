"""How long flowscope's processes take to start: a collector (`flowscope serve`, which every ``observe()`` and
``flowscope run`` starts) until its address is written and it accepts batches, and a command (``flowscope
--version``, which builds every command's parser as any command does) until it exits.

A diagnostic, like bench/observe_setup.py: no peer, since no other tool starts our collector; it compares this tree
with another (``--other SRC``, a checkout's ``src`` folder, run with ``PYTHONPATH=SRC``, its compiled modules built
or copied in). Each sample is a fresh process, whole-process wall time from ``Popen`` to the address file (the
collector) or to the exit (the command), and the process's CPU time (user + system) at that moment; the trees
alternate in each repetition. A collector is checked to answer ``GET /v1/health`` before its sample counts.

    python bench/startup.py                              # this tree alone, 9 repetitions
    python bench/startup.py --other /tmp/before/src      # this tree against another

Writes ``bench/results/startup.json`` (bench/README.md's format) and prints one summary line last.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from _machine import cpu_model, git_commit, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "startup.json"
THIS = str(Path(__file__).resolve().parents[1] / "src")


def collector_sample(src: str) -> tuple[float, float, float]:
    """(wall s until the address file is written, CPU s of the process then, RSS MiB) of one `flowscope serve`."""
    tmp = tempfile.mkdtemp(prefix="flowscope-bench-startup-")
    addr = Path(tmp) / "address"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flowscope", "serve", "--port", "0", "--store", f"{tmp}/store",
                             "--address-file", str(addr)], env={**os.environ, "PYTHONPATH": src},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not (addr.exists() and addr.stat().st_size):
            if proc.poll() is not None:
                raise RuntimeError(f"flowscope serve ({src}) exited: {proc.stderr.read().decode()[-500:]}")
            if time.perf_counter() - t0 > 60:
                raise RuntimeError(f"flowscope serve ({src}) wrote no address in 60 s")
            time.sleep(0.002)
        wall = time.perf_counter() - t0
        p = psutil.Process(proc.pid)
        t = p.cpu_times()
        rss = p.memory_info().rss / 2**20
        address = addr.read_text().split()[0]
        with urllib.request.urlopen(f"{address}/v1/health", timeout=30) as r:  # it serves, not just listens
            if r.status != 200:
                raise RuntimeError(f"{address}/v1/health answered {r.status}")
        return wall, t.user + t.system, rss
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def command_sample(src: str) -> tuple[float, float]:
    """(wall s, CPU s) of one `flowscope --version`, from the child's resource usage."""
    before = os.times()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "flowscope", "--version"], env={**os.environ, "PYTHONPATH": src},
                         capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = os.times()
    if out.returncode != 0 or not out.stdout.startswith("flowscope "):
        raise RuntimeError(f"flowscope --version ({src}): {out.returncode} {out.stderr[-500:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def _stats(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=9, help="repetitions (default 9)")
    p.add_argument("--other", default=None, help="another tree's src folder to compare with (PYTHONPATH=OTHER)")
    args = p.parse_args(argv)
    trees = {"this": THIS, **({"other": args.other} if args.other else {})}
    samples: dict[str, dict[str, list]] = {t: {"collector": [], "command": []} for t in trees}
    for rep in range(args.repeat):
        order = list(trees) if rep % 2 == 0 else list(reversed(trees))
        for name in order:
            samples[name]["collector"].append(collector_sample(trees[name]))
            samples[name]["command"].append(command_sample(trees[name]))
        print(f"rep {rep + 1}/{args.repeat}: " + ", ".join(
            f"{n} collector {samples[n]['collector'][-1][0]:.3f} s, command {samples[n]['command'][-1][0]:.3f} s"
            for n in order), flush=True)
    summary = {name: {"collector_ready_wall_s": _stats([s[0] for s in v["collector"]]),
                      "collector_ready_cpu_s": _stats([s[1] for s in v["collector"]]),
                      "collector_rss_mib": _stats([s[2] for s in v["collector"]]),
                      "command_wall_s": _stats([s[0] for s in v["command"]]),
                      "command_cpu_s": _stats([s[1] for s in v["command"]])}
               for name, v in samples.items()}
    value = summary["this"]["collector_ready_wall_s"]["median"]
    other = summary.get("other")
    write_result({"benchmark": "startup", "metric": "collector_ready_wall_s", "value": value, "unit": "s",
                  "target": None, "meets_target": None,
                  "peers": {"other tree": {"value": other["collector_ready_wall_s"]["median"], "unit": "s"}}
                  if other else {},
                  "ratio_vs_peer": round(value / other["collector_ready_wall_s"]["median"], 3) if other else None,
                  "params": {"value_is": "median wall time from starting `flowscope serve` to its address file "
                                         "(this tree); the peer is the same for --other",
                             "repeat": args.repeat, "trees": trees, "summary": summary,
                             "load_avg_1m": round(psutil.getloadavg()[0], 2), "cpu_model": cpu_model(),
                             "commit": git_commit()}}, RESULTS)
    line = "; ".join(f"{n}: collector ready {s['collector_ready_wall_s']['median']:.3f} s wall "
                     f"({s['collector_ready_cpu_s']['median']:.2f} s CPU, {s['collector_rss_mib']['median']:.0f} MiB), "
                     f"`flowscope --version` {s['command_wall_s']['median']:.3f} s" for n, s in summary.items())
    print(f"startup: {line} [median of {args.repeat}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
