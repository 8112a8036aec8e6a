"""StarPU's own records of a run, read beside its Paje trace: ``tasks.rec`` and ``dag.dot``.

``starpu_fxt_tool`` writes, next to ``paje.trace``, ``tasks.rec`` (one GNU recutils record per task: JobId,
codelet Name, WorkerId, StartTime / EndTime / SubmitTime in milliseconds on the trace's clock, DependsOn) and
``dag.dot`` (the task graph, nodes ``task_<JobId>``). The Paje importer calls :func:`records_beside` and
:func:`annotate`: each task is matched to the Paje state that shows it on its worker (same worker, codelet
name, start and end within :data:`TOLERANCE_NS`), that state becomes a ``task`` span with the task's key,
and the DAG's edges become ``dependencies`` between those keys (docs/formats/paje.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from flowscope.importers import TraceError

#: a state and a task are the same execution when both ends agree this closely (tasks.rec prints 1 ns)
TOLERANCE_NS = 1_000
#: ``dependencies.graph_id`` of the edges read from StarPU's DAG
GRAPH_ID = "starpu-dag"
_EDGE = re.compile(r'"([^"]+)"\s*->\s*"([^"]+)"')
_NODE = re.compile(r'^\s*"([^"]+)"\s*\[')


def task_key(job_id: int) -> str:
    """The key of StarPU job ``job_id``: the node name dag.dot gives it."""
    return f"task_{int(job_id)}"


@dataclass
class StarpuRecords:
    """What StarPU wrote about the run: tasks (one row per JobId) and the DAG's edges (task keys)."""

    tasks: pd.DataFrame          # job_id, key, name, worker (nullable int), start_ms, end_ms, submit_ms
    edges: list[tuple[str, str]]  # (depends_on, task_key)
    tasks_path: Path
    dag_path: Path | None
    edges_from: str               # "dag.dot" or "tasks.rec DependsOn"


def read_tasks_rec(path: Path) -> pd.DataFrame:
    """The records of a StarPU ``tasks.rec``: job_id, key, name, worker, start_ms, end_ms, submit_ms and
    depends_on (list of job ids). TraceError naming the line of a record without a JobId or with a
    field that is not a number."""
    rows: list[dict] = []
    cur: dict[str, tuple[str, int]] = {}

    def close(line: int) -> None:
        if not cur:
            return
        first = min(n for _, n in cur.values())
        if "JobId" not in cur:
            raise TraceError(f"{path}:{first}: a task record without JobId")

        def num(field: str, conv: Callable = float):
            if field not in cur:
                return None
            text, n = cur[field]
            try:
                return conv(text)
            except ValueError:
                raise TraceError(f"{path}:{n}: field {field}: {text!r} is not a number") from None

        job = num("JobId", int)
        deps = []
        if "DependsOn" in cur:
            text, n = cur["DependsOn"]
            try:
                deps = [int(x) for x in text.split()]
            except ValueError:
                raise TraceError(f"{path}:{n}: field DependsOn: {text!r} is not a list of job ids") from None
        rows.append({"job_id": job, "key": task_key(job), "name": cur.get("Name", ("", 0))[0],
                     "worker": num("WorkerId", int), "start_ms": num("StartTime"), "end_ms": num("EndTime"),
                     "submit_ms": num("SubmitTime"), "depends_on": deps})
        cur.clear()

    with open(path, encoding="utf-8", errors="replace") as f:
        n = 0
        for n, line in enumerate(f, 1):
            s = line.rstrip("\n")
            if not s.strip():
                close(n)
                continue
            if s.startswith("#"):
                continue
            field, sep, value = s.partition(":")
            if not sep:
                raise TraceError(f"{path}:{n}: not a 'Field: value' line: {s[:80]!r}")
            cur[field.strip()] = (value.strip(), n)
        close(n)
    df = pd.DataFrame(rows, columns=["job_id", "key", "name", "worker", "start_ms", "end_ms", "submit_ms",
                                     "depends_on"])
    df["worker"] = df["worker"].astype("Int64")
    return df


def read_dag_dot(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """The nodes and edges (``"a"->"b"``: b depends on a) of the DOT file StarPU writes."""
    nodes: list[str] = []
    edges: list[tuple[str, str]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _EDGE.search(line)
            if m:
                edges.append((m.group(1), m.group(2)))
                continue
            m = _NODE.match(line)
            if m:
                nodes.append(m.group(1))
    return nodes, edges


def records_beside(trace: Path) -> StarpuRecords | None:
    """StarPU's tasks.rec (and dag.dot, when there) in the folder of ``trace``; None without tasks.rec."""
    folder = Path(trace).parent
    tasks_path = folder / "tasks.rec"
    if not tasks_path.is_file():
        return None
    tasks = read_tasks_rec(tasks_path)
    dag_path = folder / "dag.dot"
    if dag_path.is_file():
        _, edges = read_dag_dot(dag_path)
        edges_from = "dag.dot"
        edges = [(a, b) for a, b in edges]
    else:
        dag_path = None
        edges = [(task_key(d), k) for k, deps in zip(tasks["key"], tasks["depends_on"]) for d in deps]
        edges_from = "tasks.rec DependsOn"
    return StarpuRecords(tasks, edges, tasks_path, dag_path, edges_from)


def _nearest(tasks: pd.DataFrame, states: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per task, the state of the same ``by`` values starting nearest its start (within the tolerance)."""
    t = tasks.sort_values("start_ns", kind="stable")
    s = states.sort_values("start_ns", kind="stable")
    m = pd.merge_asof(t, s, on="start_ns", by=by, direction="nearest", tolerance=TOLERANCE_NS,
                      suffixes=("", "_state"))
    return m[m["row"].notna() & ((m["end_ns"] - m["end_ns_state"]).abs() <= TOLERANCE_NS)]


def match(spans: pa.Table, tasks: pd.DataFrame, to_ns: Callable[[float], int]) -> tuple[pd.DataFrame, dict]:
    """Which state span shows each task: (matches with columns row (the span's row in ``spans``), key,
    job_id, resource_id; the worker -> resource mapping). A worker's resource is the one whose states
    agree with most of its tasks (codelet name, start and end); then each task is matched only among its
    worker's states."""
    timed = tasks[tasks["worker"].notna() & tasks["start_ms"].notna() & tasks["end_ms"].notna()].copy()
    empty = pd.DataFrame({"row": [], "key": [], "job_id": [], "resource_id": []})
    if not len(timed) or spans.num_rows == 0:
        return empty, {}
    timed["start_ns"] = [to_ns(x) for x in timed["start_ms"]]
    timed["end_ns"] = [to_ns(x) for x in timed["end_ms"]]
    timed["worker"] = timed["worker"].astype("int64")
    kind = spans.column("kind").to_numpy(zero_copy_only=False)
    states = pd.DataFrame({"row": np.arange(spans.num_rows), "name": spans.column("name").to_pandas(),
                           "resource_id": spans.column("resource_id").to_pandas(),
                           "start_ns": spans.column("start_ns").to_numpy(),
                           "end_ns": spans.column("end_ns").to_numpy()})
    states = states[(kind == "state") & (states["end_ns"] > states["start_ns"])]
    cand = _nearest(timed[["job_id", "name", "worker", "start_ns", "end_ns"]], states, ["name"])
    if not len(cand):
        return empty, {}
    votes = cand.groupby(["worker", "resource_id"]).size().rename("n").reset_index()
    votes = votes.sort_values(["worker", "n"], ascending=[True, False], kind="stable")
    worker_rid = dict(votes.drop_duplicates("worker")[["worker", "resource_id"]].itertuples(index=False))
    timed["resource_id"] = timed["worker"].map(worker_rid)
    timed = timed[timed["resource_id"].notna()]
    m = _nearest(timed[["job_id", "key", "name", "resource_id", "start_ns", "end_ns"]], states,
                 ["name", "resource_id"])
    m = m.drop_duplicates("row")
    return m[["row", "key", "job_id", "resource_id"]].astype({"row": "int64"}), worker_rid


def annotate(spans: pa.Table, rec: StarpuRecords, to_ns: Callable[[float], int],
             warn: Callable[[str], None]) -> tuple[pa.Table, pd.DataFrame]:
    """``spans`` with each matched state turned into the task it shows (kind ``task``, ``task_key``, attrs
    ``starpu_job``, ``submit_ns``), and the dependencies to add (the DAG's edges)."""
    m, _ = match(spans, rec.tasks, to_ns)
    timed = rec.tasks[rec.tasks["worker"].notna()]
    if len(m) < len(timed):
        missing = sorted(set(timed["job_id"]) - set(m["job_id"]))
        warn(f"{rec.tasks_path}: {len(missing)} of {len(timed)} tasks that ran on a worker have no Paje state of "
             f"their codelet on that worker at their start and end (first JobIds: {missing[:5]}); they stay "
             f"states")
    if len(m):
        kind = spans.column("kind").to_pylist()
        key = spans.column("task_key").to_pylist()
        attrs = spans.column("attrs").to_pylist()
        submit = dict(zip(rec.tasks["job_id"], rec.tasks["submit_ms"]))
        for row, k, job in zip(m["row"], m["key"], m["job_id"]):
            kind[row] = "task"
            key[row] = k
            a = json.loads(attrs[row]) if attrs[row] else {}
            a["starpu_job"] = int(job)
            if submit.get(job) is not None and submit[job] == submit[job]:
                a["submit_ns"] = to_ns(submit[job])
            attrs[row] = json.dumps(a)
        spans = spans.set_column(spans.schema.get_field_index("kind"), spans.schema.field("kind"),
                                 pa.array(kind, pa.string()))
        spans = spans.set_column(spans.schema.get_field_index("task_key"), spans.schema.field("task_key"),
                                 pa.array(key, pa.string()))
        spans = spans.set_column(spans.schema.get_field_index("attrs"), spans.schema.field("attrs"),
                                 pa.array(attrs, pa.string()))
    known = set(rec.tasks["key"])
    edges = [(a, b) for a, b in rec.edges]
    unknown = [e for e in edges if e[0] not in known or e[1] not in known]
    if unknown:
        warn(f"{rec.dag_path or rec.tasks_path}: {len(unknown)} edges name a task tasks.rec does not have "
             f"(first: {unknown[0][0]} -> {unknown[0][1]}); kept")
    deps = pd.DataFrame({"graph_id": GRAPH_ID, "task_key": [b for _, b in edges],
                         "depends_on": [a for a, _ in edges]}).drop_duplicates()
    return spans, deps
