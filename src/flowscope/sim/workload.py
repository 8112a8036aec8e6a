"""DAG workloads like the corpus of Pallipuram, DiMarco and Taufer (frequency analysis of DAG workflows):
random DAGs with their Table I/II properties, list-scheduled on N resources with task and communication
costs calibrated against a real StarPU trace, as canonical tables (a flowscope run) and Paje traces.

**The DAG** (:func:`random_dag`). T tasks in L levels; every task of level l > 1 has one parent in level
l - 1 (so its level is exactly l and the graph has exactly L levels: its longest path has L tasks), the
other parents in earlier levels; edges go from a level to a later one, the next one with probability 1/2,
the one after with 1/4... (a geometric gap), never twice between the same two tasks. One task has exactly
D children, no task more: the maximum out-degree is D. Level sizes: T / (2 L) each, the other half spread
at random (multinomial). Defaults drawn from the paper's tables: E / T uniform in [1.7, 1.9], D uniform in
7..18, L uniform in 26..132.

**The costs** (:class:`Costs`). Each task's kind is drawn with the shares of the calibration trace's task
kinds, its duration from that kind's log-normal (maximum likelihood: mean and standard deviation of the
log durations). A dependency between tasks on two resources costs a transfer drawn from the log-normal of
the trace's input-fetching times; on one resource it is free. Each resource first initialises (the trace's
worker initialisation, log-normal too). :data:`STARPU_DEMO_COSTS` is :func:`fit_costs` of
``../shared/data/paje/starpu-demo/paje.trace`` (tests check that the constants are that fit).

**The schedule** (:func:`list_schedule`): list scheduling by bottom level (a task's duration plus the longest
chain of mean durations and mean transfers below it), each task placed on the resource where it finishes
first. A task placed on resource r first fetches the outputs of its parents that ran elsewhere (all at once,
as long as the slowest transfer: a ``transfer`` span on r), then executes (a ``task`` span); it starts when r
is free and its parents have ended. Only the free-earliest resource and the parents' resources can give the
earliest finish, so each task looks at (in-degree + 1) resources: O((V + E) log V) with two heaps.

**As a run** (:func:`schedule_tables`, :func:`write_run`): resources ``node000``... (kind ``host``, one slot),
spans (``state`` Initializing, ``transfer`` FetchingInput, ``task`` <kind>), dependencies, transfers (one per
edge between two resources: the parent's key moved, ``attrs.for_task`` the child). ``flowscope simulate dag --paje FILE`` exports the run with flowscope's Paje
exporter (a simulator does not call presenters itself).
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

if TYPE_CHECKING:
    from flowscope.store.run import Run

#: the paper's 16 size groups (Table I): 1,000 to 4,000 tasks by 200
SIZE_GROUPS = tuple(range(1000, 4001, 200))
#: the paper's six cluster sizes
CLUSTER_SIZES = (8, 16, 32, 64, 128, 256)
#: defaults drawn per DAG (the ranges of the paper's Tables I and II)
EDGE_RATIO = (1.7, 1.9)
MAX_OUT_DEGREE = (7, 18)
LEVELS = (26, 132)
#: a group's DAGs have between group and group + GROUP_SPREAD tasks (Table I: 1000-1006, ..., 3400-3425)
GROUP_SPREAD = 25
#: the simulated clock starts here (ns since the epoch): the output does not depend on when it is made
EPOCH_NS = 1_700_000_000_000_000_000


@dataclass(frozen=True)
class LogNormal:
    """A log-normal distribution of durations: ln(duration in ns) ~ Normal(``mu``, ``sigma``)."""

    mu: float
    sigma: float
    n: int = 0  # observations it was fitted on

    @classmethod
    def fit(cls, durations_ns: np.ndarray) -> LogNormal:
        """Maximum-likelihood fit to positive durations (ns)."""
        d = np.asarray(durations_ns, dtype=np.float64)
        d = d[d > 0]
        if not len(d):
            raise ValueError("no positive duration to fit")
        logs = np.log(d)
        return cls(float(logs.mean()), float(logs.std()), len(d))

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` durations (int64 ns, at least 1)."""
        return np.maximum(1, np.rint(rng.lognormal(self.mu, self.sigma, size))).astype(np.int64)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma ** 2 / 2)

    @property
    def median(self) -> float:
        return math.exp(self.mu)


@dataclass(frozen=True)
class Costs:
    """Task and communication costs: per task kind its share and duration distribution, the transfer time
    of one dependency between two resources, a resource's initialisation, and the bytes a transfer moves."""

    kinds: dict[str, tuple[float, LogNormal]]  # kind -> (share of the tasks, duration)
    transfer: LogNormal
    init: LogNormal
    nbytes: int
    source: str

    def as_dict(self) -> dict:
        def ln(x: LogNormal) -> dict:
            return {"mu": x.mu, "sigma": x.sigma, "n": x.n, "median_ns": x.median, "mean_ns": x.mean}

        return {"source": self.source, "nbytes": self.nbytes, "transfer": ln(self.transfer), "init": ln(self.init),
                "kinds": {k: {"share": s, **ln(d)} for k, (s, d) in self.kinds.items()}}


#: task names, input-fetch and initialisation states of a StarPU worker, as flowscope imports its Paje trace
FETCH_STATE = "FetchingInput"
INIT_STATE = "Initializing"


def fit_costs(run: Run, *, nbytes: int | None = None) -> Costs:
    """:class:`Costs` fitted to a real run: the shares and log-normal durations of its task kinds (task spans
    by name), the log-normal of its input-fetching times (spans named ``FetchingInput``: StarPU's worker state
    while it brings a task's data) and of its resources' initialisation (``Initializing``). ``nbytes``:
    bytes per transfer (default: the run's median transfer size, else 0)."""
    tasks = run.sql("SELECT name, end_ns - start_ns AS d FROM activity WHERE role = 'task' AND end_ns > start_ns")
    if not len(tasks):
        raise ValueError(f"run {run.run_id}: no task span with a duration to fit costs on")
    states = run.sql("SELECT name, end_ns - start_ns AS d FROM spans WHERE name IN (?, ?) AND end_ns > start_ns",
                     [FETCH_STATE, INIT_STATE])
    fetch = states.loc[states["name"] == FETCH_STATE, "d"].to_numpy()
    init = states.loc[states["name"] == INIT_STATE, "d"].to_numpy()
    if not len(fetch) or not len(init):
        raise ValueError(f"run {run.run_id}: needs spans named {FETCH_STATE!r} and {INIT_STATE!r} (a StarPU trace's "
                         f"worker states) to fit transfer and initialisation times")
    if nbytes is None:
        sizes = run.sql("SELECT median(nbytes) AS b FROM transfers WHERE nbytes IS NOT NULL")["b"]
        nbytes = int(sizes.iloc[0]) if len(sizes) and pd.notna(sizes.iloc[0]) else 0
    kinds = {str(name): (len(g) / len(tasks), LogNormal.fit(g["d"].to_numpy()))
             for name, g in sorted(tasks.groupby("name"), key=lambda kv: str(kv[0]))}
    return Costs(kinds=kinds, transfer=LogNormal.fit(fetch), init=LogNormal.fit(init), nbytes=int(nbytes),
                 source=str(run.path))


#: :func:`fit_costs` of ../shared/data/paje/starpu-demo/paje.trace (StarPU 1.3.10, 36 scal/axpy tasks on 2 CPU
#: workers); nbytes is the size of its data handles (data.rec: 800,000 bytes), the trace having no transfer.
STARPU_DEMO_COSTS = Costs(
    kinds={"axpy": (12 / 36, LogNormal(16.05302623603443, 1.2236066759207365, 12)),
           "scal": (24 / 36, LogNormal(15.522035423648354, 0.7441488481293156, 24))},
    transfer=LogNormal(6.6416310416748106, 0.5790704433919354, 36),
    init=LogNormal(11.038933501105717, 0.4600045951285745, 2), nbytes=800_000,
    source="../shared/data/paje/starpu-demo/paje.trace")


# ---- the DAG -------------------------------------------------------------------------------------------------

@dataclass
class Dag:
    """A DAG of ``tasks`` tasks 0 .. tasks - 1: ``level`` (1-based) per task, edges ``src`` -> ``dst`` (int64,
    sorted by (src, dst)), ``kind`` per task (a code into ``kinds``)."""

    level: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray
    kinds: tuple[str, ...]
    seed: int
    params: dict = field(default_factory=dict)

    @property
    def tasks(self) -> int:
        return len(self.level)

    @property
    def edges(self) -> int:
        return len(self.src)

    @property
    def levels(self) -> int:
        return int(self.level.max())

    @property
    def out_degree(self) -> np.ndarray:
        return np.bincount(self.src, minlength=self.tasks)

    @property
    def in_degree(self) -> np.ndarray:
        return np.bincount(self.dst, minlength=self.tasks)

    @property
    def max_out_degree(self) -> int:
        return int(self.out_degree.max())

    def properties(self) -> dict:
        """The paper's characterisation: tasks, edges, maximum out-degree, graph level."""
        return {"tasks": self.tasks, "edges": self.edges, "max_out_degree": self.max_out_degree,
                "levels": self.levels}


def _check(name: str, value: Any, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {what}, got {value!r}")


def random_dag(tasks: int, *, seed: int = 0, edge_ratio: float | None = None, max_out_degree: int | None = None,
               levels: int | None = None, costs: Costs | None = None) -> Dag:
    """A random DAG with exactly ``tasks`` tasks, ``round(edge_ratio * tasks)`` edges, maximum out-degree
    ``max_out_degree`` and ``levels`` levels (defaults drawn from the paper's ranges, :data:`EDGE_RATIO`,
    :data:`MAX_OUT_DEGREE`, :data:`LEVELS`); task kinds drawn with ``costs``' shares (default
    :data:`STARPU_DEMO_COSTS`). Seeded: the same arguments give the same DAG."""
    _check("tasks", tasks, isinstance(tasks, (int, np.integer)) and tasks >= 2, "must be an integer >= 2")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(tasks)]))
    ratio = float(rng.uniform(*EDGE_RATIO)) if edge_ratio is None else float(edge_ratio)
    d_max = int(rng.integers(MAX_OUT_DEGREE[0], MAX_OUT_DEGREE[1] + 1)) if max_out_degree is None \
        else int(max_out_degree)
    n_lev = int(rng.integers(LEVELS[0], LEVELS[1] + 1)) if levels is None else int(levels)
    n_lev = min(n_lev, tasks) if levels is None else n_lev
    _check("levels", n_lev, 2 <= n_lev <= tasks, f"must lie in 2..tasks ({tasks})")
    _check("max_out_degree", d_max, d_max >= 1, "must be >= 1")
    n_edges = int(round(ratio * tasks))

    # level sizes: half spread evenly (so that no level is much larger than the one before), half at random
    base = max(1, tasks // (2 * n_lev))
    for _ in range(100):  # a level more than d_max times larger than the one before cannot be fed: draw again
        sizes = base + rng.multinomial(tasks - base * n_lev, np.full(n_lev, 1.0 / n_lev))
        if np.ceil(sizes[1:] / sizes[:-1]).max() <= d_max:
            break
    first = np.concatenate([[0], np.cumsum(sizes)])
    level = np.repeat(np.arange(n_lev, dtype=np.int64), sizes)  # 0-based here
    mandatory = tasks - sizes[0]
    _check("edges", n_edges, mandatory <= n_edges, f"edge_ratio * tasks must be at least {mandatory} (one parent "
                                                   f"per task below the first level)")
    need = int(np.ceil(sizes[1:] / sizes[:-1]).max())
    _check("max_out_degree", d_max, need <= d_max, f"must be at least {need} for these level sizes")
    later = tasks - first[1:-1]  # tasks after each level but the last
    _check("edges", n_edges, mandatory + d_max <= n_edges, f"edge_ratio * tasks must be at least "
                                                           f"{mandatory + d_max} (with the hub's {d_max} children)")
    _check("edges", n_edges, n_edges <= d_max * (tasks - sizes[-1]),
           f"at most {d_max * (tasks - sizes[-1])} with max_out_degree {d_max}")

    # one parent in the previous level per task (children of a level dealt to its parents in turn)
    child = np.arange(sizes[0], tasks, dtype=np.int64)
    lc = level[child]
    pos = child - first[lc]
    offset = rng.integers(0, 1 << 30, n_lev)
    parent = first[lc - 1] + (pos + offset[lc]) % sizes[lc - 1]
    src, dst = [parent], [child]
    deg = np.bincount(parent, minlength=tasks)

    # the hub: one task (not in the last level) gets exactly d_max children
    candidates = np.flatnonzero((level < n_lev - 1) & (later[np.minimum(level, n_lev - 2)] >= d_max))
    _check("max_out_degree", d_max, len(candidates) > 0, "leaves no task with that many later tasks")
    hub = int(rng.choice(candidates))
    have = set(child[parent == hub].tolist())
    lo = first[level[hub] + 1]
    hi = min(tasks, lo + max(4 * d_max, 64))
    pool = np.setdiff1d(np.arange(lo, hi), np.fromiter(have, np.int64, len(have)))
    extra = rng.choice(pool, size=d_max - len(have), replace=False) if d_max > len(have) else np.zeros(0, np.int64)
    src.append(np.full(len(extra), hub, np.int64))
    dst.append(np.asarray(extra, np.int64))
    deg[hub] += len(extra)
    s_all, d_all = np.concatenate(src), np.concatenate(dst)
    keys = np.unique(s_all * tasks + d_all)

    # the other edges: a source below the cap (not the hub), a destination a geometric number of levels later
    missing = n_edges - len(keys)
    sources_ok = level < n_lev - 1
    for _ in range(200):
        if missing <= 0:
            break
        k = 2 * missing + 64
        s = rng.integers(0, tasks, k)
        s = s[sources_ok[s] & (deg[s] < d_max) & (s != hub)]
        gap = rng.geometric(0.5, len(s))
        dl = np.minimum(level[s] + gap, n_lev - 1)
        d = first[dl] + (rng.random(len(s)) * sizes[dl]).astype(np.int64)
        key = s * tasks + d
        key, idx = np.unique(key, return_index=True)
        order = np.argsort(idx, kind="stable")  # back to draw order: first drawn, first kept
        key = key[order]
        key = key[~np.isin(key, keys, assume_unique=True)]
        s = key // tasks
        # at most d_max - deg[s] new children per source, in draw order
        srt = np.argsort(s, kind="stable")
        ss = s[srt]
        start = np.flatnonzero(np.concatenate([[True], ss[1:] != ss[:-1]]))
        rank = np.arange(len(ss)) - np.repeat(start, np.diff(np.concatenate([start, [len(ss)]])))
        keep = np.zeros(len(s), bool)
        keep[srt] = deg[ss] + rank < d_max
        key = key[keep][:missing]
        np.add.at(deg, key // tasks, 1)
        keys = np.union1d(keys, key)
        missing = n_edges - len(keys)
    if missing > 0:
        raise ValueError(f"edges: could not place {n_edges} edges under max_out_degree {d_max}")
    s_all, d_all = keys // tasks, keys % tasks  # sorted by (src, dst)

    costs = costs or STARPU_DEMO_COSTS
    kinds = tuple(costs.kinds)
    shares = np.array([costs.kinds[k][0] for k in kinds], dtype=np.float64)
    kind = rng.choice(len(kinds), size=tasks, p=shares / shares.sum()).astype(np.int64)
    return Dag(level=level + 1, src=s_all.astype(np.int64), dst=d_all.astype(np.int64), kind=kind, kinds=kinds,
               seed=int(seed), params={"tasks": int(tasks), "edge_ratio": ratio, "max_out_degree": d_max,
                                       "levels": n_lev, "seed": int(seed)})


# ---- the schedule --------------------------------------------------------------------------------------------

@dataclass
class Schedule:
    """Where and when each task ran: ``resource``, ``fetch_ns`` (start of its input fetch), ``start_ns``
    (start of its execution), ``end_ns`` per task (ns from the schedule's origin), ``duration`` and
    ``comm`` (per edge transfer time, paid when the edge's tasks are on two resources); ``init_ns`` per
    resource (its initialisation, from 0)."""

    dag: Dag
    resources: int
    resource: np.ndarray
    fetch_ns: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    duration: np.ndarray
    comm: np.ndarray
    init_ns: np.ndarray
    costs: Costs

    @property
    def makespan_ns(self) -> int:
        return int(self.end_ns.max())

    @property
    def remote(self) -> np.ndarray:
        """Per edge: whether its two tasks ran on two resources."""
        return self.resource[self.dag.src] != self.resource[self.dag.dst]


def _bottom_levels(dag: Dag, duration: np.ndarray, mean_comm: float) -> np.ndarray:
    """Per task: its duration plus the longest chain (mean transfer + bottom level) through its children."""
    bl = duration.astype(np.float64).copy()
    lev_src = dag.level[dag.src]
    order = np.argsort(-lev_src, kind="stable")
    s, d, ls = dag.src[order], dag.dst[order], lev_src[order]
    bounds = np.flatnonzero(np.concatenate([[True], ls[1:] != ls[:-1], [True]]))
    for a, b in zip(bounds[:-1], bounds[1:]):  # deepest levels first: children are final before parents
        best = np.zeros(dag.tasks)
        np.maximum.at(best, s[a:b], bl[d[a:b]] + mean_comm)
        idx = np.unique(s[a:b])
        bl[idx] = duration[idx] + best[idx]
    return bl


def list_schedule(dag: Dag, resources: int, *, seed: int = 0, costs: Costs | None = None,
                  comm_scale: float = 1.0) -> Schedule:
    """List-schedule ``dag`` on ``resources`` resources (see the module docstring), durations and transfer
    times drawn from ``costs`` (default :data:`STARPU_DEMO_COSTS`), transfers multiplied by ``comm_scale``."""
    _check("resources", resources, isinstance(resources, (int, np.integer)) and resources >= 1,
           "must be an integer >= 1")
    _check("comm_scale", comm_scale, comm_scale >= 0, "must be >= 0")
    costs = costs or STARPU_DEMO_COSTS
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), dag.tasks, int(resources), 1]))
    n = dag.tasks
    duration = np.empty(n, np.int64)
    for code, name in enumerate(dag.kinds):
        m = dag.kind == code
        duration[m] = costs.kinds[name][1].draw(rng, int(m.sum()))
    comm = np.rint(costs.transfer.draw(rng, dag.edges) * comm_scale).astype(np.int64)
    init = costs.init.draw(rng, int(resources))
    bl = _bottom_levels(dag, duration, costs.transfer.mean * comm_scale)

    # parents of each task, as CSR over the edges sorted by destination
    by_dst = np.argsort(dag.dst, kind="stable")
    in_ptr = np.concatenate([[0], np.cumsum(np.bincount(dag.dst, minlength=n))]).tolist()
    in_src = dag.src[by_dst].tolist()
    in_comm = comm[by_dst].tolist()
    out_ptr = np.concatenate([[0], np.cumsum(np.bincount(dag.src, minlength=n))]).tolist()
    out_dst = dag.dst.tolist()  # already sorted by source
    waiting = np.bincount(dag.dst, minlength=n).tolist()
    dur = duration.tolist()
    prio = (-bl).tolist()

    res = [-1] * n
    fetch = [0] * n
    start = [0] * n
    end = [0] * n
    avail = init.tolist()
    free = [(a, r) for r, a in enumerate(avail)]
    heapq.heapify(free)
    ready = [(prio[u], u) for u in range(n) if waiting[u] == 0]
    heapq.heapify(ready)
    while ready:
        _, u = heapq.heappop(ready)
        while free[0][0] != avail[free[0][1]]:  # entries left behind when a resource got busier
            heapq.heappop(free)
        parents = range(in_ptr[u], in_ptr[u + 1])
        data = max((end[in_src[i]] for i in parents), default=0)
        best = None
        for r in {free[0][1], *(res[in_src[i]] for i in parents)}:
            s = max(avail[r], data)
            c = max((in_comm[i] for i in parents if res[in_src[i]] != r), default=0)
            key = (s + c + dur[u], r)
            if best is None or key < best[0]:
                best = (key, s, c)
        (f, r), s, c = best
        res[u], fetch[u], start[u], end[u] = r, s, s + c, f
        avail[r] = f
        heapq.heappush(free, (f, r))
        for i in range(out_ptr[u], out_ptr[u + 1]):
            v = out_dst[i]
            waiting[v] -= 1
            if waiting[v] == 0:
                heapq.heappush(ready, (prio[v], v))
    return Schedule(dag=dag, resources=int(resources), resource=np.array(res, np.int64),
                    fetch_ns=np.array(fetch, np.int64), start_ns=np.array(start, np.int64),
                    end_ns=np.array(end, np.int64), duration=duration, comm=comm, init_ns=init, costs=costs)


def simulate_dag(tasks: int, resources: int, *, seed: int = 0, costs: Costs | None = None, **dag_args: Any
                 ) -> Schedule:
    """:func:`random_dag` then :func:`list_schedule`, both from ``seed``."""
    return list_schedule(random_dag(tasks, seed=seed, costs=costs, **dag_args), resources, seed=seed, costs=costs)


# ---- as canonical tables and a run -------------------------------------------------------------

def resource_ids(n: int) -> np.ndarray:
    width = max(3, len(str(n - 1)))
    return np.array([f"node{r:0{width}d}" for r in range(n)], dtype=object)


def task_keys(n: int) -> np.ndarray:
    return np.char.add("task-", np.arange(n).astype(str)).astype(object)


def schedule_tables(sch: Schedule, *, origin_ns: int = EPOCH_NS, graph_id: str = "dag") -> dict[str, pa.Table]:
    """The schedule as canonical tables: ``resources``, ``spans``, ``dependencies``, ``transfers``."""
    dag, n, p = sch.dag, sch.dag.tasks, sch.resources
    rids = resource_ids(p)
    keys = task_keys(n)
    t0 = np.int64(origin_ns)
    resources = pa.table({
        "resource_id": rids, "kind": ["host"] * p, "name": rids, "start_ns": np.full(p, t0),
        "end_ns": np.full(p, t0 + sch.makespan_ns), "attrs": [json.dumps({"cpu_cores": 1, "simulated": True})] * p})
    fetching = sch.start_ns > sch.fetch_ns
    nf = int(fetching.sum())
    kind_names = np.array(dag.kinds, dtype=object)
    spans = pd.DataFrame({
        "resource_id": np.concatenate([rids, rids[sch.resource[fetching]], rids[sch.resource]]),
        "kind": np.concatenate([np.full(p, "state", object), np.full(nf, "transfer", object),
                                np.full(n, "task", object)]),
        "name": np.concatenate([np.full(p, INIT_STATE, object), np.full(nf, FETCH_STATE, object),
                                kind_names[dag.kind]]),
        "start_ns": t0 + np.concatenate([np.zeros(p, np.int64), sch.fetch_ns[fetching], sch.start_ns]),
        "end_ns": t0 + np.concatenate([sch.init_ns, sch.start_ns[fetching], sch.end_ns]),
        "task_key": np.concatenate([np.full(p, None, object), keys[fetching], keys]),
    })
    spans.insert(0, "span_id", np.arange(len(spans), dtype=np.int64))
    deps = pa.table({"graph_id": [graph_id] * dag.edges, "task_key": keys[dag.dst], "depends_on": keys[dag.src],
                     "ts_ns": np.full(dag.edges, t0)})
    remote = sch.remote
    e_src, e_dst = dag.src[remote], dag.dst[remote]
    t_start = sch.fetch_ns[e_dst]
    transfers = pa.table({
        "transfer_id": np.arange(int(remote.sum()), dtype=np.int64), "kind": ["sim-fetch"] * int(remote.sum()),
        "src_resource_id": rids[sch.resource[e_src]], "dst_resource_id": rids[sch.resource[e_dst]],
        "nbytes": np.full(int(remote.sum()), sch.costs.nbytes, np.int64),
        "start_ns": t0 + t_start, "end_ns": t0 + t_start + sch.comm[remote],
        "keys": pa.array([[k] for k in keys[e_src]], pa.list_(pa.string())),
        "attrs": [json.dumps({"for_task": k}) for k in keys[e_dst]]})
    return {"resources": resources, "spans": pa.Table.from_pandas(spans, preserve_index=False),
            "dependencies": deps, "transfers": transfers}


def schedule_states(sch: Schedule, *, origin_ns: int = EPOCH_NS) -> pd.DataFrame:
    """The resource-state timeline of the run :func:`write_run` writes (the rows
    :func:`flowscope.analysis.timeline.resource_states` gives for it: resource_id, slot, start_ns, end_ns,
    state, group, role), computed from the schedule without a store: each resource's spans in time order
    (they never overlap) and ``idle`` in the gaps, over the run's span."""
    sp = schedule_tables(sch, origin_ns=origin_ns)["spans"].to_pandas()
    kind = sp["kind"].to_numpy(object)
    state = np.select([kind == "task", kind == "transfer"], ["compute", "communication"], "other").astype(object)
    role = np.select([kind == "task", kind == "state"], ["task", "state"], "other").astype(object)
    rid = sp["resource_id"].to_numpy(object)
    s, e = sp["start_ns"].to_numpy(np.int64), sp["end_ns"].to_numpy(np.int64)
    t0, t1 = int(s.min()), int(e.max())
    order = np.lexsort((s, rid))
    rid, s, e, state, role = rid[order], s[order], e[order], state[order], role[order]
    new = np.concatenate([[True], rid[1:] != rid[:-1]])
    last = np.concatenate([new[1:], [True]])
    prev_end = np.where(new, t0, np.concatenate([[t0], e[:-1]]))
    gap = s > prev_end  # idle before each span
    tail = last & (e < t1)  # idle after a resource's last span
    cols = {
        "resource_id": np.concatenate([rid, rid[gap], rid[tail]]),
        "slot": np.zeros(len(s) + int(gap.sum()) + int(tail.sum()), np.int64),
        "start_ns": np.concatenate([s, prev_end[gap], e[tail]]),
        "end_ns": np.concatenate([e, s[gap], np.full(int(tail.sum()), t1, np.int64)]),
        "state": np.concatenate([state, np.full(int(gap.sum() + tail.sum()), "idle", object)]),
        "role": np.concatenate([role, np.full(int(gap.sum() + tail.sum()), None, object)]),
    }
    out = pd.DataFrame(cols)
    out.insert(5, "group", None)
    return out.sort_values(["resource_id", "start_ns"], kind="stable", ignore_index=True)


def write_run(sch: Schedule, store: str | Path | None = None, *, name: str | None = None,
              origin_ns: int = EPOCH_NS) -> Path:
    """Write the schedule as a finished flowscope run in ``store``; returns its directory."""
    from flowscope.embedded import Client

    dag = sch.dag
    name = name or f"dag-{dag.tasks}t-{sch.resources}r-s{dag.seed}"
    meta = {"simulation": {"generator": "dag", **dag.params, "resources": sch.resources, **dag.properties(),
                           "makespan_ns": sch.makespan_ns, "costs": sch.costs.as_dict()}}
    fs = Client(store=store, name=name, command=f"flowscope simulate dag --tasks {dag.params['tasks']} "
                f"--resources {sch.resources} --seed {dag.seed}", meta={"start_ns": int(origin_ns), **meta})
    status = "failed"
    try:
        for table, data in schedule_tables(sch, origin_ns=origin_ns, graph_id=name).items():
            fs.write(table, data)
        run_dir = fs.run_dir
        status = "finished"
    finally:
        fs.close(status=status, end_ns=int(origin_ns) + sch.makespan_ns)
    return Path(run_dir)


# ---- the paper's corpus --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CorpusDag:
    """One DAG of the corpus: its size group, its index in the group, its subset, its task count and seed."""

    group: int
    index: int
    subset: int
    tasks: int
    seed: int


def corpus(bench_subsets: int = 8, predict_subsets: int = 3, *, seed: int = 0,
           groups: Sequence[int] = SIZE_GROUPS, per_group: int = 100) -> list[CorpusDag]:
    """The paper's subsets: ``per_group`` DAGs per size group, of which each subset takes one at random per
    group, without sharing any (subsets 0 .. bench_subsets - 1 for benchmarking, the next ``predict_subsets``
    for prediction). A DAG's tasks lie in [group, group + GROUP_SPREAD]."""
    total = bench_subsets + predict_subsets
    _check("subsets", total, 1 <= total <= per_group, f"must lie in 1..{per_group} in all")
    out = []
    for g in groups:
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(g), 7]))
        picked = rng.choice(per_group, size=total, replace=False)
        for subset, i in enumerate(picked.tolist()):
            r = np.random.default_rng(np.random.SeedSequence([int(seed), int(g), int(i)]))
            tasks = int(g + r.integers(0, GROUP_SPREAD + 1))
            out.append(CorpusDag(group=int(g), index=int(i), subset=subset, tasks=tasks,
                                 seed=int(seed) * 1_000_003 + int(g) * 1000 + int(i)))
    return out
