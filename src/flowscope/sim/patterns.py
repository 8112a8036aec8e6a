"""The Crux paper's five workflow patterns (section 5) as plans of jobs, each with its critical path known by
construction, and the runner that executes a plan as real processes reporting to a collector.

In every pattern one MPI rank per parallel phase is made the slowest: it runs longest, and it writes its output
only once the other ranks of its phase have finished, so which input gates each MERGE, and therefore the whole
Workflow Critical Path, follows from the plan alone, however late a busy machine starts or runs any process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PATTERNS = ("crux-generic", "crux-data-splits", "crux-checkpoint", "crux-multiple-sources", "crux-create-delete")
WORKER = Path(__file__).with_name("worker.py")


@dataclass
class Job:
    """One simulated job: a process that reads ``inputs`` and writes ``outputs`` (state ids)."""

    name: str
    app: str
    kind: str
    sleep: float
    inputs: list[str]
    outputs: list[str]
    after: list[str] = field(default_factory=list)  # jobs that must finish first besides the inputs' producers
    delete: bool = False
    then: list[Job] = field(default_factory=list)  # run next by the same process (no process-start delay)
    finish_after: list[str] = field(default_factory=list)  # jobs that must be done before this one writes

    def all_outputs(self) -> list[str]:
        return self.outputs + [s for j in self.then for s in j.all_outputs()]


@dataclass
class Plan:
    """A pattern instance: its source states, its jobs, and the critical path it must produce."""

    pattern: str
    ranks: int
    sources: list[str]
    locations: dict[str, str]
    jobs: list[Job]
    expected: list[str]
    slowest: dict[str, int]  # per parallel phase, the rank made slowest

    def job_deps(self) -> dict[str, list[str]]:
        producer = {s: j.name for j in self.jobs for s in j.all_outputs()}
        return {j.name: sorted({producer[s] for s in j.inputs if s in producer} | set(j.after)) for j in self.jobs}


class _Builder:
    def __init__(self, pattern: str, ranks: int, seed: int, scale: float):
        if ranks < 1:
            raise ValueError(f"--ranks must be at least 1, got {ranks}")
        if scale <= 0:
            raise ValueError(f"--scale must be positive, got {scale}")
        self.rng = np.random.default_rng(seed)
        self.pattern, self.ranks, self.scale = pattern, ranks, scale
        self.jobs: list[Job] = []
        self.locations: dict[str, str] = {}
        self.slowest: dict[str, int] = {}

    def t(self, lo: float, hi: float) -> float:
        return float(self.rng.uniform(lo, hi)) * self.scale

    def phase(self, name: str) -> tuple[list[float], int]:
        """Durations of one parallel phase, one rank slower than all others by a margin; and that rank."""
        d = [self.t(0.1, 0.4) for _ in range(self.ranks)]
        k = int(self.rng.integers(self.ranks))
        d[k] = max(d) + 0.3 * self.scale + 0.25
        self.slowest[name] = k
        return d, k

    def hold_slowest(self, phase: str) -> None:
        """The slowest rank of ``phase`` writes its output only after its siblings are done: it arrives last by
        construction, not by a margin that a busy machine's process-start delays can exceed."""
        k = self.slowest[phase]
        job = next(j for j in self.jobs if j.name == f"{phase}-{k}")
        job.finish_after = [f"{phase}-{i}" for i in range(self.ranks) if i != k]

    def job(self, name: str, app: str, kind: str, inputs: list[str], outputs: list[str], sleep: float,
            location: str, after: list[str] | None = None, delete: bool = False) -> None:
        for s in outputs:
            self.locations[s] = location
        self.jobs.append(Job(name, app, kind, sleep, inputs, outputs, after or [], delete))

    def front(self, source: str = "source") -> None:
        """Stagein then Preprocess splitting the data into one part per rank."""
        self.locations[source] = "storage:disk"
        self.job("stagein", "Stagein", "TRANSFER", [source], ["staged"], self.t(0.05, 0.15), "node0:disk")
        self.job("preprocess", "Preprocess", "SPLIT", ["staged"], [f"part-{i}" for i in range(self.ranks)],
                 self.t(0.05, 0.15), "node0:disk")

    def mpi(self, phase: str, app: str, inputs: list[list[str]], kind: str = "CONVERT") -> int:
        d, k = self.phase(phase)
        for i in range(self.ranks):
            self.job(f"{phase}-{i}", app, kind, inputs[i], [f"{phase}-out-{i}"], d[i], f"node{i}:memory")
        self.hold_slowest(phase)
        return k

    def plan(self, sources: list[str], expected: list[str]) -> Plan:
        return Plan(self.pattern, self.ranks, sources, self.locations, self.jobs, expected, self.slowest)


def build(pattern: str, ranks: int = 4, seed: int = 0, scale: float = 1.0) -> Plan:
    """The plan of ``pattern`` (one of PATTERNS) with ``ranks`` MPI ranks; durations seeded and scaled."""
    b = _Builder(pattern, ranks, seed, scale)
    r = range(ranks)
    if pattern == "crux-generic":
        b.front()
        k = b.mpi("mpi", "MPI", [[f"part-{i}"] for i in r])
        b.job("postprocess", "Postprocess", "MERGE", [f"mpi-out-{i}" for i in r], ["post"], b.t(0.05, 0.1),
              "node0:disk")
        b.job("viz", "Viz", "CONVERT", ["post"], ["viz"], b.t(0.05, 0.1), "node0:disk")
        return b.plan(["source"], ["source", "staged", f"part-{k}", f"mpi-out-{k}", "post", "viz"])
    if pattern == "crux-data-splits":
        b.front()
        move = [b.t(0.05, 0.3) for _ in r]  # moving each part to its node
        for i in r:
            b.job(f"scatter-{i}", "Preprocess", "TRANSFER", [f"part-{i}"], [f"node-{i}"], move[i], f"node{i}:disk")
        d, k = b.phase("mpi")
        slack = max(move[i] + d[i] for i in r if i != k) if ranks > 1 else 0.0
        d[k] = max(d[k], slack - move[k] + 0.3 * b.scale + 0.25)  # the slowest rank is slowest end to end
        for i in r:
            b.job(f"mpi-{i}", "MPI", "CONVERT", [f"node-{i}"], [f"mpi-out-{i}"], d[i], f"node{i}:memory")
        b.hold_slowest("mpi")
        b.job("postprocess", "Postprocess", "MERGE", [f"mpi-out-{i}" for i in r], ["post"], b.t(0.05, 0.1),
              "node0:disk")
        b.job("viz", "Viz", "CONVERT", ["post"], ["viz"], b.t(0.05, 0.1), "node0:disk")
        return b.plan(["source"], ["source", "staged", f"part-{k}", f"node-{k}", f"mpi-out-{k}", "post", "viz"])
    if pattern == "crux-checkpoint":
        b.front()
        a = b.mpi("mpi", "MPI", [[f"part-{i}"] for i in r])
        b.job("checkpointout", "Checkpointout", "MERGE", [f"mpi-out-{i}" for i in r], ["checkpoint"],
              b.t(0.1, 0.2), "storage:disk")
        b.job("checkpointin", "Checkpointin", "SPLIT", ["checkpoint"], [f"restart-{i}" for i in r],
              b.t(0.1, 0.2), "node0:memory")
        c = b.mpi("mpi2", "MPI2", [[f"restart-{i}"] for i in r])
        b.job("postprocess2", "Postprocess2", "MERGE", [f"mpi2-out-{i}" for i in r], ["post2"], b.t(0.05, 0.1),
              "node0:disk")
        b.job("viz", "Viz", "CONVERT", ["post2"], ["viz"], b.t(0.05, 0.1), "node0:disk")
        return b.plan(["source"], ["source", "staged", f"part-{a}", f"mpi-out-{a}", "checkpoint", f"restart-{c}",
                                   f"mpi2-out-{c}", "post2", "viz"])
    if pattern == "crux-multiple-sources":
        b.front()
        b.locations["source2"] = "storage2:disk"
        b.mpi("mpi", "MPI", [[f"part-{i}"] for i in r])
        b.job("postprocess", "Postprocess", "MERGE", [f"mpi-out-{i}" for i in r], ["post"], b.t(0.05, 0.1),
              "node0:disk")
        # the second source is loaded between jobs, so it arrives last at MPI2's MERGE
        b.job("load", "Load", "TRANSFER", ["source2"], ["loaded"], b.t(0.2, 0.4), "node0:disk", after=["postprocess"])
        c = b.mpi("mpi2", "MPI2", [["post", "loaded"] for _ in r], kind="MERGE")
        b.job("postprocess2", "Postprocess", "MERGE", [f"mpi2-out-{i}" for i in r], ["post2"], b.t(0.05, 0.1),
              "node0:disk")
        b.job("viz", "Viz", "CONVERT", ["post2"], ["viz"], b.t(0.05, 0.1), "node0:disk")
        return b.plan(["source", "source2"], ["source2", "loaded", f"mpi2-out-{c}", "post2", "viz"])
    if pattern == "crux-create-delete":
        b.front()
        a = b.mpi("mpi", "MPI", [[f"part-{i}"] for i in r])
        for i in r:  # each rank writes its temporary file right after its step (the slowest rank's comes last, as
            # that rank's step finishes after the other ranks' processes, temporary files included)
            b.jobs[-ranks + i].then.append(Job(f"filecreate-{i}", "Filecreate", "CONVERT", 0.02, [f"mpi-out-{i}"],
                                               [f"tmp-{i}"]))
            b.locations[f"tmp-{i}"] = f"node{i}:disk"
        b.job("postprocess", "Postprocess", "MERGE", [f"tmp-{i}" for i in r], ["post"], b.t(0.05, 0.1), "node0:disk")
        b.job("delete", "Filecreate", "DELETE", [f"tmp-{i}" for i in r], [], 0.02, "node0:disk",
              after=["postprocess"], delete=True)
        c = b.mpi("mpi2", "MPI2", [["post"] for _ in r])
        for i in r:
            b.jobs[-ranks + i].after.append("delete")  # the next simulation runs once the files are gone
        b.job("postprocess2", "Postprocess", "MERGE", [f"mpi2-out-{i}" for i in r], ["post2"], b.t(0.05, 0.1),
              "node0:disk")
        b.job("viz", "Viz", "CONVERT", ["post2"], ["viz"], b.t(0.05, 0.1), "node0:disk")
        return b.plan(["source"], ["source", "staged", f"part-{a}", f"mpi-out-{a}", f"tmp-{a}", "post",
                                   f"mpi2-out-{c}", "post2", "viz"])
    raise ValueError(f"unknown pattern {pattern!r}; patterns are {', '.join(PATTERNS)}")


def execute(plan: Plan, client, workdir: str | Path, size: int = 65_536) -> dict[str, tuple[int, int]]:
    """Run ``plan``'s jobs as worker processes (each as soon as what it needs is done) that write real files in
    ``workdir`` and report through ``client``'s collector address; record each job as a span. Returns each
    job's (start_ns, end_ns). Raises RuntimeError naming the job if one fails."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = {s: str(workdir / f"{s}.dat") for s in plan.locations}
    ds = client.data_states()
    for s in plan.sources:
        Path(path[s]).write_bytes(b"\0" * size)
        ds.state(s, label=f"{s}.dat", size_bytes=size, origin="source", location=plan.locations[s],
                 attrs={"path": path[s]})
    deps = plan.job_deps()
    done = {j.name: threading.Event() for j in plan.jobs}
    times: dict[str, tuple[int, int]] = {}
    errors: list[str] = []

    def spec_of(job: Job) -> dict:
        return {"app": job.app, "kind": job.kind, "sleep": job.sleep, "delete": job.delete,
                "inputs": [{"id": s, "path": path[s], "location": plan.locations[s]} for s in job.inputs],
                "outputs": [{"id": s, "path": path[s], "size": size, "location": plan.locations[s]}
                            for s in job.outputs],
                "then": [spec_of(j) for j in job.then], "hold": bool(job.finish_after)}

    def run(job: Job) -> None:
        try:
            for d in deps[job.name]:
                done[d].wait()
            if errors:
                return
            spec = {"address": client.address, "run": client.run_id, **spec_of(job)}
            t0 = time.time_ns()
            proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for d in job.finish_after:  # the job writes its outputs when told to go (a line on its stdin)
                done[d].wait()
            _, stderr = proc.communicate("go\n" if job.finish_after else None)
            t1 = time.time_ns()
            times[job.name] = (t0, t1)
            client.span(job.name, t0, t1, kind="step", attrs={"app": job.app, "exit_code": proc.returncode})
            if proc.returncode:
                errors.append(f"job {job.name} exited with {proc.returncode}: {stderr.strip()[-500:]}")
        finally:
            done[job.name].set()

    threads = [threading.Thread(target=run, args=(j,), name=f"sim-{j.name}") for j in plan.jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return times
