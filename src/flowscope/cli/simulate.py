"""``flowscope simulate PATTERN``: run one of the Crux paper's five workflow patterns as real processes and
check the collector's online critical path against the one the pattern has by construction;
``flowscope simulate dag``: a random DAG workload list-scheduled on N resources (sim/workload.py), written
as a run and optionally as a Paje trace."""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from pathlib import Path

from flowscope.cli.output import STORE_HELP


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="run a Crux workflow pattern, or simulate a DAG workload on N resources",
                       description="PATTERN: run one of the five workflow patterns of the Crux paper (section 5) "
                                   "as processes that read and write real files and report their data states and "
                                   "mutations to a collector over its REST API. One MPI rank per parallel phase "
                                   "is made the slowest, so the Workflow Critical Path is known in advance; the "
                                   "command prints it next to the one the collector computed online and exits 0 "
                                   "when they are the same, 2 when not. "
                                   "dag: a random DAG with the properties of Pallipuram et al.'s corpus, "
                                   "list-scheduled on --resources resources with costs calibrated on a real "
                                   "StarPU trace, written as a run (and with --paje as a Paje trace); seeded "
                                   "(docs/forecast.md).")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from flowscope.sim.patterns import PATTERNS

    p.add_argument("pattern", choices=(*PATTERNS, "dag"), metavar="PATTERN", help=" | ".join((*PATTERNS, "dag")))
    p.add_argument("--ranks", type=int, default=4, help="MPI ranks per parallel phase (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the durations (default 0)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every duration by this (default 1)")
    p.add_argument("--size", type=int, default=65_536, metavar="BYTES", help="bytes per file (default 65536)")
    p.add_argument("--store", default=None, help=STORE_HELP)
    p.add_argument("--workdir", default=None, help="where the jobs' files go (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    d = p.add_argument_group("dag", "options of `flowscope simulate dag` (default: drawn from the paper's ranges)")
    d.add_argument("--tasks", type=int, default=2000, help="tasks in the DAG (default 2000)")
    d.add_argument("--resources", type=int, default=64, help="resources it is scheduled on (default 64)")
    d.add_argument("--edge-ratio", type=float, default=None, help="edges per task (default: drawn in 1.7-1.9)")
    d.add_argument("--max-out-degree", type=int, default=None, help="maximum out-degree (default: drawn in 7-18)")
    d.add_argument("--levels", type=int, default=None, help="graph levels (default: drawn in 26-132)")
    d.add_argument("--comm-scale", type=float, default=1.0, help="multiply every transfer time by this (default 1)")
    d.add_argument("--paje", default=None, metavar="FILE", help="also write the run as a Paje trace to FILE")


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


def simulate_dag(tasks: int = 2000, resources: int = 64, *, seed: int = 0, store: str | Path | None = None,
                 paje: str | Path | None = None, comm_scale: float = 1.0, **dag_args) -> dict:
    """Simulate a DAG workload into a new run (and a Paje trace when ``paje`` is given); returns its summary."""
    from flowscope.exporters import export_run
    from flowscope.sim.workload import list_schedule, random_dag, write_run

    dag = random_dag(tasks, seed=seed, **dag_args)
    sch = list_schedule(dag, resources, seed=seed, comm_scale=comm_scale)
    run_dir = write_run(sch, store)
    busy = int((sch.end_ns - sch.fetch_ns).sum())
    res = {"run_id": run_dir.name, "run_dir": str(run_dir), "seed": seed, "resources": resources,
           **dag.properties(), "makespan_s": sch.makespan_ns / 1e9,
           "utilisation": busy / (sch.makespan_ns * resources), "transfers": int(sch.remote.sum()),
           "resources_used": int(len(set(sch.resource.tolist())))}
    if paje is not None:
        path, counts = export_run(run_dir, "paje", paje)
        res["paje"] = str(path)
        res["paje_records"] = counts
    return res


def run(args: argparse.Namespace) -> int:
    if args.pattern == "dag":
        dag_args = {k: getattr(args, k) for k in ("edge_ratio", "max_out_degree", "levels")
                    if getattr(args, k) is not None}
        res = simulate_dag(args.tasks, args.resources, seed=args.seed, store=args.store, paje=args.paje,
                           comm_scale=args.comm_scale, **dag_args)
        if args.json:
            print(json.dumps(res, indent=2))
        else:
            print(f"dag: run {res['run_id']} ({res['run_dir']})")
            print(f"  {res['tasks']} tasks, {res['edges']} edges, max out-degree {res['max_out_degree']}, "
                  f"{res['levels']} levels")
            print(f"  on {res['resources']} resources ({res['resources_used']} ran a task): makespan "
                  f"{res['makespan_s']:.3f} s, utilisation {100 * res['utilisation']:.1f} %, "
                  f"{res['transfers']} transfers")
            if "paje" in res:
                print(f"  Paje trace: {res['paje']}")
        return 0
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
