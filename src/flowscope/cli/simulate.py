"""``flowscope simulate PATTERN``: run one of the Crux paper's five workflow patterns as real processes and
check the collector's online critical path against the one the pattern has by construction."""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from pathlib import Path

from flowscope.cli.output import STORE_HELP


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="run a Crux workflow pattern and check its critical path",
                       description="Run one of the five workflow patterns of the Crux paper (section 5) as "
                                   "processes that read and write real files and report their data states and "
                                   "mutations to a collector over its REST API. One MPI rank per parallel phase "
                                   "is made the slowest, so the Workflow Critical Path is known in advance; the "
                                   "command prints it next to the one the collector computed online and exits 0 "
                                   "when they are the same, 2 when not.")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from flowscope.sim.patterns import PATTERNS

    p.add_argument("pattern", choices=PATTERNS, metavar="PATTERN", help=" | ".join(PATTERNS))
    p.add_argument("--ranks", type=int, default=4, help="MPI ranks per parallel phase (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the durations (default 0)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every duration by this (default 1)")
    p.add_argument("--size", type=int, default=65_536, metavar="BYTES", help="bytes per file (default 65536)")
    p.add_argument("--store", default=None, help=STORE_HELP)
    p.add_argument("--workdir", default=None, help="where the jobs' files go (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def simulate(pattern: str, *, ranks: int = 4, seed: int = 0, scale: float = 1.0, size: int = 65_536,
             store: str | Path | None = None, workdir: str | Path | None = None) -> dict:
    """Run ``pattern`` into a new run; returns run_id, run_dir, expected and observed (online) paths."""
    from flowscope import Client
    from flowscope.sim.patterns import build, execute

    plan = build(pattern, ranks=ranks, seed=seed, scale=scale)
    client = Client("embedded", store=store, serve=True, name=pattern, command=f"flowscope simulate {pattern}",
                    meta={"simulation": {"pattern": pattern, "ranks": ranks, "seed": seed, "scale": scale}})
    status = "failed"
    try:
        with tempfile.TemporaryDirectory(prefix="flowscope-sim-") as tmp:
            execute(plan, client, workdir or tmp, size=size)
        with urllib.request.urlopen(f"{client.address}/v1/runs/{client.run_id}/critical-path", timeout=60) as r:
            online = json.loads(r.read())
        status = "finished"
    finally:
        client.close(status=status)
    return {"pattern": pattern, "run_id": client.run_id, "run_dir": str(client.run_dir), "ranks": ranks,
            "seed": seed, "scale": scale, "slowest_rank": plan.slowest, "expected": plan.expected,
            "observed": online["ids"], "length_ns": online["length_ns"], "match": online["ids"] == plan.expected}


def run(args: argparse.Namespace) -> int:
    res = simulate(args.pattern, ranks=args.ranks, seed=args.seed, scale=args.scale, size=args.size,
                   store=args.store, workdir=args.workdir)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{res['pattern']}: run {res['run_id']} ({res['run_dir']})")
        print(f"  slowest ranks: {res['slowest_rank']}")
        print(f"  expected path: {' -> '.join(res['expected'])}")
        print(f"  online path:   {' -> '.join(res['observed'])}  ({res['length_ns'] / 1e9:.3f} s)")
        print("  match" if res["match"] else "  MISMATCH")
    return 0 if res["match"] else 2
