"""Read Parsl's monitoring database (``monitoring.db``, SQLite, written when a Parsl ``Config`` has a
``MonitoringHub``) into the canonical tables.

One workflow run of the database becomes the run (the latest, when it holds several: Parsl appends every run
of a directory to one file; the others are named in a warning). What each of Parsl's tables gives:

* ``try`` and ``status``: each try of a task is a ``task`` span, named by the app's function, ``task_key``
  ``<function>-<task id>``, from its ``running`` status to its ``running_ended`` (when the worker ran the
  function; without them, the try's ``task_try_time_running`` to ``task_try_time_returned``), on the worker
  process that ran it (``process:<host>:<pid>``, one task at a time, from the ``resource`` table of Parsl's
  resource monitor), or on its worker pool when the monitor did not see it; attrs: ``try``, ``executor``,
  ``block_id``, ``hostname``, ``state`` (``exec_done``, ``failed``, ...), ``launched_ns`` (when it was handed to the
  executor) and the worker process's ``pid`` where Parsl's resource monitor saw it. Every status row is a
  ``transitions`` row (``from_state`` the task's previous status,
  ``observer`` ``scheduler``: the DataFlowKernel), and :data:`SEMANTICS` gives each state its phase (``exec_done``
  done, ``failed`` erred, ``launched`` queued, ...);
* ``task``: ``task_depends`` gives the ``dependencies``; a task whose last status is ``failed`` or
  ``dep_fail`` gets an error ``logs`` row;
* ``node`` and ``block``: resources. Each (executor, block, host) is a worker pool, kind ``worker``,
  ``worker:parsl/<executor>/<block>/<host>``, that runs ``nthreads`` = the node's ``worker_count`` tasks at
  once, nested in ``host:<hostname>`` (``cpu_cores`` in attrs, from the node's ``cpu_count``); its worker
  processes nest in it. A run whose tries are all placed on processes counts its capacity from them (the pools
  ran nothing themselves); a run with tries on both counts both, an overestimate of the capacity;
* ``resource`` (Parsl's resource monitor, psutil around each try): each sample becomes ``hardware`` metrics of
  the worker process, ``process.memory.rss_bytes`` and ``process.cpu.seconds`` (user + system, cumulative);
* ``task.task_time_invoked``: the first is a ``graph-submitted`` log (the work reached the DataFlowKernel);
* ``workflow``: the run's name, start and end.

Parsl writes its times as naive local date-times (``2026-11-29 14:15:55.158732``); they are read as UTC, so the
run's absolute times are off by the recording host's UTC offset, its durations and order are not.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flowscope.importers.sink import ImportSink
from flowscope.model.identifiers import host_id, process_id
from flowscope.model.semantics import PROCESS_MEMORY

NAME = "parsl"

#: what Parsl's rows mean (model/semantics.py): each task try a unit of work grouped by its app, run on a worker
#: pool that runs ``nthreads`` at once; hosts hold the pools and do not run tasks themselves
SEMANTICS = {
    "source": "parsl",
    "spans": [{"when": {"kind": "task"}, "category": "compute", "role": "task", "group": "name"}],
    "resources": [{"when": {"kind": "process"}, "executes": True, "slots": 1},
                  {"when": {"kind": "worker"}, "executes": True, "slots": "attrs.nthreads"},
                  {"when": {"kind": "host"}, "executes": False}],
    # Parsl's task states (parsl.dataflow.states.States)
    "transitions": [{"when": {"to_state": ["exec_done", "memo_done"]}, "phase": "done"},
                    {"when": {"to_state": ["failed", "dep_fail"]}, "phase": "erred"},
                    {"when": {"to_state": ["running", "running_ended"]}, "phase": "running"},
                    {"when": {"to_state": "launched"}, "phase": "queued"},
                    {"when": {"to_state": ["pending", "unsched", "joining", "fail_retryable"]}, "phase": "waiting"}],
}
#: the tables and columns this importer reads (Parsl's monitoring schema since 2020)
_NEEDED = {"workflow": ("run_id", "workflow_name", "time_began", "time_completed", "host", "user", "rundir"),
           "task": ("task_id", "run_id", "task_depends", "task_func_name", "task_time_invoked", "task_time_returned"),
           "try": ("try_id", "task_id", "run_id", "block_id", "hostname", "task_executor", "task_try_time_launched",
                   "task_try_time_running", "task_try_time_returned"),
           "status": ("task_id", "task_status_name", "timestamp", "run_id", "try_id")}
_FAILED = ("failed", "dep_fail")
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _error(path: Path, msg: str) -> Exception:
    from flowscope.importers import TraceError  # the package imports this module lazily

    return TraceError(f"{path}: {msg}")


def sniff(path: Path, head: bytes) -> bool:
    """Whether ``head`` is a SQLite database whose schema (kept on its first pages) has Parsl's monitoring
    tables."""
    return head.startswith(_SQLITE_MAGIC) and b"task_func_name" in head and b"task_try_time_running" in head


def _ns(values: pd.Series) -> pd.Series:
    """Parsl's naive date-times (text) as ns since the UTC epoch (nullable Int64: null where missing or
    unreadable)."""
    t = pd.to_datetime(pd.Series(values).reset_index(drop=True), errors="coerce", format="ISO8601")
    out = pd.Series(t.dt.tz_localize(UTC).array.asi8, dtype="Int64")
    return out.mask(t.isna())


def _query(con: sqlite3.Connection, path: Path, table: str, where: str = "", args: tuple = ()) -> pd.DataFrame:
    cols = _NEEDED.get(table)
    sql = f'SELECT {", ".join(cols) if cols else "*"} FROM "{table}" {where}'
    try:
        return pd.read_sql_query(sql, con, params=args)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
        raise _error(path, f"table {table!r}: {exc}") from None


def _check_schema(con: sqlite3.Connection, path: Path) -> set[str]:
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise _error(path, f"not a readable SQLite database ({exc})") from None
    for table, cols in _NEEDED.items():
        if table not in tables:
            raise _error(path, f"no {table!r} table: not a Parsl monitoring database")
        have = {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}
        missing = [c for c in cols if c not in have]
        if missing:
            raise _error(path, f"table {table!r} lacks column(s) {', '.join(missing)}")
    return tables


def _dumps(d: dict) -> str:
    return json.dumps({k: v for k, v in d.items() if v is not None}, separators=(",", ":"))


def _pool_id(executor: Any, block: Any, host: Any) -> str:
    return f"worker:parsl/{executor or 'executor'}/{'' if block is None else block}/{host or 'unknown-host'}"


def read(path: Path, sink: ImportSink) -> None:
    """Read the latest workflow run of Parsl's monitoring database ``path`` into ``sink``."""
    size = path.stat().st_size
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as exc:
        raise _error(path, f"cannot open as SQLite ({exc})") from None
    try:
        tables = _check_schema(con, path)
        runs = _query(con, path, "workflow").sort_values("time_began", kind="stable")
        if not len(runs):
            raise _error(path, "no workflow run in it (its 'workflow' table is empty)")
        wf = runs.iloc[-1]
        run_id = str(wf["run_id"])
        if len(runs) > 1:
            sink.warn(f"{len(runs)} workflow runs; imported the latest, {run_id} ({wf['workflow_name']}); "
                      f"the others: {', '.join(map(str, runs['run_id'].iloc[:-1]))}")
        where, args = "WHERE run_id = ?", (run_id,)
        tasks = _query(con, path, "task", where, args)
        tries = _query(con, path, "try", where, args)
        status = _query(con, path, "status", where, args)
        nodes = (pd.read_sql_query("SELECT hostname, block_id, cpu_count, worker_count, total_memory, timestamp "
                                   "FROM node WHERE run_id = ?", con, params=args)
                 if "node" in tables else pd.DataFrame(columns=["hostname", "block_id", "cpu_count", "worker_count"]))
        blocks = (pd.read_sql_query("SELECT executor_label, block_id, job_id, status, timestamp FROM block "
                                    "WHERE run_id = ?", con, params=args) if "block" in tables else pd.DataFrame())
        samples = (pd.read_sql_query("SELECT task_id, try_id, timestamp, psutil_process_pid AS pid, "
                                     "psutil_process_memory_resident AS rss, "
                                     "psutil_process_time_user + psutil_process_time_system AS cpu_s "
                                     "FROM resource WHERE run_id = ?", con, params=args)
                   if "resource" in tables else pd.DataFrame(columns=["task_id", "try_id", "timestamp", "pid"]))
        pids = samples.groupby(["task_id", "try_id"], as_index=False)["pid"].min()
    except sqlite3.DatabaseError as exc:
        raise _error(path, f"not a readable SQLite database ({exc})") from None
    finally:
        con.close()
    sink.advance(size // 2)

    name_of = dict(zip(tasks["task_id"], tasks["task_func_name"].fillna("app")))
    key_of = {tid: f"{name}-{tid}" for tid, name in name_of.items()}
    status = status.assign(ts=_ns(status["timestamp"]).to_numpy())
    unread = status["ts"].isna()
    if unread.any():
        first = status[unread].iloc[0]
        sink.warn(f"table 'status': {int(unread.sum())} row(s) with no readable timestamp left out (the first: "
                  f"task {first['task_id']}, state {first['task_status_name']!r}, timestamp {first['timestamp']!r})")
    status = status[~unread]
    status = status.sort_values(["task_id", "ts"], kind="stable")
    unknown = sorted(set(status["task_id"]) - set(key_of))
    if unknown:
        raise _error(path, f"table 'status': task id(s) {unknown[:5]} are not in the 'task' table of run {run_id}")

    # -- resources: hosts, and the worker pools of (executor, block, host)
    workers = nodes.dropna(subset=["worker_count"]).groupby(["block_id", "hostname"])["worker_count"].max()
    cores = nodes.dropna(subset=["cpu_count"]).groupby("hostname")["cpu_count"].max()
    job_of = ({(str(r.executor_label), str(r.block_id)): r.job_id for r in blocks.itertuples()}
              if len(blocks) else {})
    tries = tries.assign(pool=[_pool_id(e, b, h) for e, b, h in
                               zip(tries["task_executor"], tries["block_id"], tries["hostname"])])
    hosts = sorted({h for h in tries["hostname"].dropna()} | set(cores.index))
    resources = [{"resource_id": host_id(h), "kind": "host", "name": h, "host": h,
                  "attrs": _dumps({"cpu_cores": int(cores[h]) if h in cores.index else None})} for h in hosts]
    for (ex, block, host), _ in tries.groupby(["task_executor", "block_id", "hostname"], dropna=False):
        n = workers.get((block, host)) if block is not None and host is not None else None
        resources.append({"resource_id": _pool_id(ex, block, host), "kind": "worker",
                          "name": f"{ex} block {block} on {host}", "host": host,
                          "parent_id": host_id(host) if isinstance(host, str) else None,
                          "attrs": _dumps({"nthreads": None if n is None or pd.isna(n) else int(n),
                                           "executor": ex, "block_id": block,
                                           "job_id": job_of.get((str(ex), str(block)))})})
    # a try whose worker process Parsl's resource monitor saw runs on that process (one task at a time), else on
    # its pool
    pid_of = {(r.task_id, r.try_id): int(r.pid) for r in pids.itertuples() if not pd.isna(r.pid)} if len(pids) else {}
    where_ran = []
    seen: set[str] = set()
    for tid, tr, pool, host in zip(tries["task_id"], tries["try_id"], tries["pool"], tries["hostname"]):
        pid = pid_of.get((tid, tr))
        if pid is None or not isinstance(host, str):
            where_ran.append(pool)
            continue
        rid = process_id(pid, host)
        where_ran.append(rid)
        if rid not in seen:
            seen.add(rid)
            resources.append({"resource_id": rid, "kind": "process", "name": f"{host}:{pid}", "parent_id": pool,
                              "host": host, "pid": pid, "attrs": _dumps({"role": "parsl-worker"})})
    tries = tries.assign(ran_on=where_ran)
    sink.add("resources", resources)

    # -- spans: each try, from "running" to "running_ended" (else the try's own times)
    def first(state: str) -> pd.Series:
        s = status[status["task_status_name"] == state]
        return s.groupby(["task_id", "try_id"])["ts"].min()

    running, ended = first("running"), first("running_ended")
    last_state = status.groupby(["task_id", "try_id"])["task_status_name"].last()
    idx = pd.MultiIndex.from_arrays([tries["task_id"], tries["try_id"]])
    start = running.reindex(idx).reset_index(drop=True).fillna(_ns(tries["task_try_time_running"]))
    end = ended.reindex(idx).reset_index(drop=True).fillna(_ns(tries["task_try_time_returned"]))
    launched = _ns(tries["task_try_time_launched"])
    ok = (start.notna() & end.notna()).to_numpy()
    if (~ok).any():
        sink.warn(f"{int((~ok).sum())} task tr(ies) never ran (no running time): no span for them")
    t = tries[ok]
    states = last_state.reindex(idx[ok]).to_numpy()
    attrs = [_dumps({"try": int(tr), "executor": ex, "block_id": b, "hostname": h, "state": st,
                     "launched_ns": None if pd.isna(la) else int(la),
                     "pid": pid_of.get((tid, tr))})
             for tid, tr, ex, b, h, st, la in zip(t["task_id"], t["try_id"], t["task_executor"], t["block_id"],
                                                  t["hostname"], states, launched[ok])]
    s0, s1 = start[ok].to_numpy(np.int64), end[ok].to_numpy(np.int64)
    sink.add("spans", {"resource_id": list(t["ran_on"]), "kind": ["task"] * len(t),
                       "name": [name_of.get(x, "app") for x in t["task_id"]], "start_ns": s0,
                       "end_ns": np.maximum(s0, s1), "task_key": [key_of.get(x, str(x)) for x in t["task_id"]],
                       "attrs": attrs})

    # -- metrics: the resource monitor's samples of each worker process (memory as every source writes it)
    host_of = dict(zip(zip(tries["task_id"], tries["try_id"]), tries["hostname"]))
    smp = samples.dropna(subset=["pid"])
    smp = smp.assign(ts=_ns(smp["timestamp"]).to_numpy(),
                     host=[host_of.get((a, b)) for a, b in zip(smp["task_id"], smp["try_id"])])
    smp = smp[smp["ts"].notna() & smp["host"].notna()]
    if len(smp):
        rid = [process_id(int(p), h) for p, h in zip(smp["pid"], smp["host"])]
        for name, col in ((PROCESS_MEMORY, "rss"), ("process.cpu.seconds", "cpu_s")):
            ok = smp[col].notna().to_numpy()
            sink.add("metrics", {"ts_ns": smp["ts"].to_numpy(np.int64)[ok], "resource_id": np.asarray(rid)[ok],
                                 "namespace": ["hardware"] * int(ok.sum()), "name": [name] * int(ok.sum()),
                                 "value": smp[col].to_numpy(np.float64)[ok]})

    # -- transitions: every status row, from the task's previous status
    prev = status.groupby("task_id")["task_status_name"].shift(1)
    pool_of = dict(zip(zip(tries["task_id"], tries["try_id"]), tries["ran_on"]))
    names = [name_of[x] for x in status["task_id"]]
    sink.add("transitions", {"ts_ns": status["ts"].to_numpy(np.int64),
                             "task_key": [key_of[x] for x in status["task_id"]],
                             "group": names, "prefix": names,
                             "from_state": prev.where(prev.notna(), None), "to_state": status["task_status_name"],
                             "observer": ["scheduler"] * len(status),  # Parsl's DataFlowKernel
                             "worker": [pool_of.get((a, b)) for a, b in zip(status["task_id"], status["try_id"])],
                             "attrs": [_dumps({"try": None if pd.isna(x) else int(x)}) for x in status["try_id"]]})

    # -- dependencies
    edges = []
    for tid, deps in zip(tasks["task_id"], tasks["task_depends"]):
        for d in str(deps or "").split(","):
            d = d.strip()
            if not d:
                continue
            if not d.isdigit() or int(d) not in key_of:
                sink.warn(f"task {tid}: dependency {d!r} is not a task of run {run_id}; edge dropped")
                continue
            edges.append((key_of[tid], key_of[int(d)]))
    sink.add("dependencies", {"graph_id": [f"parsl-{run_id}"] * len(edges), "task_key": [c for c, _ in edges],
                              "depends_on": [p for _, p in edges]})

    # -- submission: Parsl submits tasks one by one as the program calls its apps; the first is when the work
    # reached the DataFlowKernel (the advisor's lead-in is the client's until then, the scheduler's after)
    invoked = _ns(tasks["task_time_invoked"])
    if invoked.notna().any():
        sink.add("logs", {"ts_ns": [int(invoked.min())], "level": ["info"], "category": ["graph-submitted"],
                          "message": [f"first of {len(tasks)} Parsl tasks submitted to the DataFlowKernel"],
                          "attrs": [_dumps({"graph_id": f"parsl-{run_id}", "tasks": len(tasks),
                                            "scheduler": "parsl"})]})

    # -- failures
    final = status.groupby("task_id").last()
    bad = final[final["task_status_name"].isin(_FAILED)]
    if len(bad):
        sink.add("logs", {"ts_ns": bad["ts"].to_numpy(np.int64), "level": ["error"] * len(bad),
                          "category": ["task-error"] * len(bad),
                          "message": [f"Parsl task {key_of[x]} ended {st}" for x, st in
                                      zip(bad.index, bad["task_status_name"])],
                          "task_key": [key_of[x] for x in bad.index],
                          "resource_id": [pool_of.get((x, tr)) for x, tr in zip(bad.index, bad["try_id"])]})

    t0, t1 = _ns(pd.Series([wf["time_began"], wf["time_completed"]]))
    sink.set_meta(workflow_run_id=run_id, workflow_name=wf["workflow_name"], host=wf["host"], user=wf["user"],
                  rundir=wf["rundir"], tasks=len(tasks), tries=len(tries), edges=len(edges), failed=len(bad),
                  times="naive local date-times read as UTC")
    fields = {"name": wf["workflow_name"]}
    if not pd.isna(t0):
        fields["start_ns"] = int(t0)
    if not pd.isna(t1):
        fields["end_ns"] = int(t1)
    sink.set_run_fields(**fields)
    sink.advance(size)
