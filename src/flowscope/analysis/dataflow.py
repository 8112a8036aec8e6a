"""The data-state graph of a Dask run, derived from its canonical tables (no instrumentation needed).

* a null state ``start`` at the run's first task start (as every Crux graph begins with one);
* each task's output is a state: size = the result's nbytes, location = ``<worker>:memory``, time = its finish;
* each transfer of a key to a worker is a TRANSFER to a state ``<key>@<worker>``;
* a task with one input is a CONVERT from it (from the copy on its worker when it was fetched), with several a
  MERGE from each; a task without inputs is a CONVERT from ``start``. Mutations carry ``start_ns`` (the task's
  or transfer's start) in attrs, so the critical path separates waiting from work;
* files a task opened for writing / reading (io rows with a task_key, source "audit" or "proc-io") are states
  ``file:<path>@<writer>`` on ``<host>:disk`` with a TRANSFER from the writer, and a TRANSFER to each reader
  (from the latest version written before the read, or from a state ``file:<path>`` for a file that existed).
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import pandas as pd

from flowscope.store.run import Run

__all__ = ["data_states_from_tasks"]

_IO_SOURCES = ("audit", "proc-io")


def _attrs(text) -> dict:
    if not isinstance(text, str):
        return {}
    try:
        v = orjson.loads(text)
    except orjson.JSONDecodeError:  # what orjson refuses and json takes: NaN, integers beyond 64 bits
        try:
            v = json.loads(text)
        except ValueError:
            return {}
    return v if isinstance(v, dict) else {}


def _opens_for_writing(op: str, attrs: dict) -> bool | None:
    """True / False when the row says whether the file was written; None when it cannot tell."""
    if op == "write":
        return True
    if op == "read":
        return False
    mode = attrs.get("mode")
    if isinstance(mode, str) and mode:
        return any(c in mode for c in "wax+")
    flags = attrs.get("flags")
    if isinstance(flags, int):
        return bool(flags & 3)          # O_WRONLY | O_RDWR
    return None


def data_states_from_tasks(run: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(data_states, mutations) of a Dask run, in the canonical columns (see the module docstring)."""
    # in a fixed order, so that tasks ending at the same nanosecond keep theirs from one call to the next
    t = run.sql("""SELECT * EXCLUDE (name), "group" AS name FROM activity WHERE role = 'task' AND task_key IS NOT NULL
                   ORDER BY end_ns, task_key, start_ns, span_id""")
    # a key computed twice (recomputed after a worker left, or run again by a later graph): its dependents
    # read the first result
    t = t.sort_values("end_ns", kind="stable").drop_duplicates("task_key", keep="first")
    if len(t) == 0:
        return _states([]), _mutations([])
    attrs = t["attrs"].map(_attrs) if "attrs" in t.columns else pd.Series([{}] * len(t), index=t.index)
    tasks = pd.DataFrame({"key": t["task_key"].astype(str).to_numpy(), "group": t["name"].astype(str).to_numpy(),
                          "start": t["start_ns"].astype("int64").to_numpy(), "end": t["end_ns"].astype("int64").to_numpy(),
                          "worker": [a.get("worker") for a in attrs], "nbytes": [a.get("nbytes") for a in attrs]})
    by_key = tasks.set_index("key")
    end_of = dict(zip(tasks["key"], tasks["end"].tolist()))
    group_of = dict(zip(tasks["key"], tasks["group"]))
    nbytes_of = dict(zip(tasks["key"], tasks["nbytes"]))
    t0 = int(tasks["start"].min())
    states: list[dict] = [{"state_id": "start", "label": "start", "size_bytes": None, "ts_ns": t0, "origin": None,
                           "location": None, "attrs": None}]
    muts: list[dict] = []
    states += [{"state_id": k, "label": k, "size_bytes": n, "ts_ns": e, "origin": g,
                "location": f"{w}:memory" if w else None, "attrs": None}
               for k, n, e, g, w in zip(tasks["key"], tasks["nbytes"], tasks["end"].tolist(), tasks["group"],
                                        tasks["worker"])]
    # transferred copies: the first arrival of a key on a worker
    copies: dict[tuple[str, str], str] = {}
    transfers = run.table("transfers")
    if len(transfers):
        tr = transfers.explode("keys").dropna(subset=["keys"]).sort_values("end_ns", kind="stable")
        tr = tr.drop_duplicates(["keys", "dst_resource_id"])
        for r in tr.itertuples(index=False):
            key = str(r.keys)
            if key not in end_of:
                continue
            worker = str(r.dst_resource_id).removeprefix("worker:")
            sid = f"{key}@{worker}"
            ts = max(int(r.end_ns), end_of[key])
            copies[(key, worker)] = sid
            states.append({"state_id": sid, "label": key, "size_bytes": nbytes_of[key], "ts_ns": ts,
                           "origin": group_of[key], "location": f"{worker}:memory", "attrs": None})
            muts.append({"src_state_id": key, "dst_state_id": sid, "kind": "TRANSFER",
                         "application": group_of[key],
                         "attrs": json.dumps({"start_ns": max(int(r.start_ns), end_of[key]),
                                              "nbytes": None if pd.isna(r.nbytes) else int(r.nbytes)})})
    deps = run.table("dependencies")[["task_key", "depends_on"]].astype(str).drop_duplicates()
    deps = deps[deps["task_key"].isin(by_key.index) & deps["depends_on"].isin(by_key.index)]
    consumed = _consumptions(tasks, deps, copies, states)
    transferred = len(muts)
    _files(run, tasks, by_key, states, muts)
    return _monotone(_states(states), _mutations(muts[:transferred], consumed, muts[transferred:]))


def _monotone(states: pd.DataFrame, muts: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Move a state that appears older than one of its sources to that source's time (flagged
    ``{"ts_adjusted_from": ns}`` in its attrs). Task times come from each worker's clock corrected by
    Dask's estimate of its offset to the scheduler's, so on different hosts a very short task can seem to
    finish before an input it read; the graph's rule (a destination is not older than its source) must hold."""
    if muts.empty:
        return states, muts
    pos = pd.Series(np.arange(len(states)), index=states["state_id"].astype(str))
    src = pos.reindex(muts["src_state_id"].astype(str)).to_numpy()
    dst = pos.reindex(muts["dst_state_id"].astype(str)).to_numpy()
    ok = ~(np.isnan(src) | np.isnan(dst))
    src, dst = src[ok].astype(np.int64), dst[ok].astype(np.int64)
    ts = states["ts_ns"].to_numpy(dtype=np.int64).copy()
    original = ts.copy()
    for _ in range(len(states)):  # each round fixes one more level of a chain of inversions
        need = ts[src] > ts[dst]
        if not need.any():
            break
        np.maximum.at(ts, dst[need], ts[src[need]])
    moved = np.flatnonzero(ts != original)
    if len(moved):
        states = states.copy()
        states["ts_ns"] = ts
        attrs = states["attrs"].to_numpy(dtype=object, copy=True)
        for i in moved:
            attrs[i] = json.dumps({"ts_adjusted_from": int(original[i])})
        states["attrs"] = attrs
    return states, muts


def _files(run: Run, tasks: pd.DataFrame, by_key: pd.DataFrame, states: list[dict], muts: list[dict]) -> None:
    io = run.table("io")
    if len(io) == 0:
        return
    io = io[io["task_key"].notna() & io["source"].isin(_IO_SOURCES)]
    io = io[io["task_key"].astype(str).isin(by_key.index)]
    if len(io) == 0:
        return
    wrote_bytes = io[(io["op"] == "write") & io["nbytes"].notna()].groupby("task_key")["nbytes"].sum().to_dict()
    rows = io[io["path"].notna()]
    writes: dict[str, list[tuple[int, str]]] = {}     # path -> [(ts, state id)]
    reads: list[tuple[str, str, int]] = []              # (path, reader key, ts of the open)
    for r in rows.itertuples(index=False):
        key = str(r.task_key)
        w = _opens_for_writing(str(r.op), _attrs(r.attrs))
        if w is None:
            w = wrote_bytes.get(key, 0) > 0
        if w:
            sid = f"file:{r.path}@{key}"
            if any(s == sid for _, s in writes.get(r.path, [])):
                continue
            end = int(by_key.at[key, "end"])
            ts = max(end, int(r.end_ns) if pd.notna(r.end_ns) else end)
            writes.setdefault(r.path, []).append((ts, sid))
            states.append({"state_id": sid, "label": r.path, "size_bytes": wrote_bytes.get(key),
                           "ts_ns": ts, "origin": by_key.at[key, "group"],
                           "location": f"{r.host}:disk" if pd.notna(r.host) else "disk", "attrs": None})
            muts.append({"src_state_id": key, "dst_state_id": sid, "kind": "TRANSFER",
                         "application": by_key.at[key, "group"], "attrs": json.dumps({"component": "io"})})
        else:
            reads.append((r.path, key, int(r.start_ns)))
    existing: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    for path, key, ts in reads:
        if (path, key) in seen:
            continue
        seen.add((path, key))
        start = int(by_key.at[key, "start"])
        versions = [(vts, sid) for vts, sid in writes.get(path, []) if vts <= start and not sid.endswith(f"@{key}")]
        if any(sid.endswith(f"@{key}") for _, sid in writes.get(path, [])) and not versions:
            continue        # a task reading back what it wrote itself
        if versions:
            src = max(versions)[1]
        else:
            src = existing.get(path)
            if src is None:
                src = existing[path] = f"file:{path}"
                host = rows.loc[rows["path"] == path, "host"].dropna()
                states.append({"state_id": src, "label": path, "size_bytes": None, "ts_ns": min(ts, start),
                               "origin": None, "location": f"{host.iloc[0]}:disk" if len(host) else "disk",
                               "attrs": None})
        muts.append({"src_state_id": src, "dst_state_id": key, "kind": "TRANSFER",
                     "application": by_key.at[key, "group"], "attrs": json.dumps({"component": "io"})})


def _states(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["state_id", "label", "size_bytes", "ts_ns", "origin", "location", "attrs"])
    df["size_bytes"] = pd.array([None if v is None or (isinstance(v, float) and np.isnan(v)) else int(v)
                                 for v in df["size_bytes"]], dtype="Int64")
    df["ts_ns"] = df["ts_ns"].astype("int64")
    return df


_MUTATION_COLUMNS = ["src_state_id", "dst_state_id", "kind", "application", "attrs"]


def _consumptions(tasks: pd.DataFrame, deps: pd.DataFrame, copies: dict[tuple[str, str], str],
                  states: list[dict]) -> pd.DataFrame:
    """The mutations that make each task's output, in the tasks' order: a CONVERT from ``start`` for a task
    without inputs; else one per input (a MERGE when there are several), from the copy of the input on the
    task's worker when it had arrived by the task's end, from the input itself otherwise."""
    pos = pd.Series(np.arange(len(tasks)), index=tasks["key"].to_numpy())
    d = deps.reset_index(drop=True)
    at = pos.reindex(d["task_key"].to_numpy()).to_numpy(np.int64)
    worker = tasks["worker"].to_numpy(object)[at]
    ends = tasks["end"].to_numpy(np.int64)[at]
    copy_ts = {s["state_id"]: s["ts_ns"] for s in states}
    src = d["depends_on"].to_numpy(object).copy()
    for i, (u, w) in enumerate(zip(src, worker)):
        if w:
            sid = copies.get((u, w))
            if sid is not None and copy_ts[sid] <= ends[i]:
                src[i] = sid
    n_inputs = np.bincount(at, minlength=len(tasks))
    alone = np.flatnonzero(n_inputs == 0)
    # the tasks' order, each task's inputs in the table's order
    task_at = np.concatenate([at, alone])
    order = np.lexsort((np.arange(len(task_at)), task_at))
    task_at = task_at[order]
    src = np.concatenate([src, np.full(len(alone), "start", dtype=object)])[order]
    kind = np.where(n_inputs[task_at] > 1, "MERGE", "CONVERT").astype(object)
    starts = tasks["start"].to_numpy(np.int64)[task_at]
    return pd.DataFrame({"src_state_id": src, "dst_state_id": tasks["key"].to_numpy(object)[task_at],
                         "kind": kind, "application": tasks["group"].to_numpy(object)[task_at],
                         # json.dumps({"start_ns": ...})'s text, without its per-row cost
                         "attrs": np.array([f'{{"start_ns": {v}}}' for v in starts.tolist()], dtype=object)},
                        columns=_MUTATION_COLUMNS)


def _mutations(*parts: list[dict] | pd.DataFrame) -> pd.DataFrame:
    frames = [p if isinstance(p, pd.DataFrame) else pd.DataFrame(p, columns=_MUTATION_COLUMNS) for p in parts]
    frames = [f for f in frames if len(f)] or frames[:1]
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].reset_index(drop=True)
    df.insert(0, "mutation_id", [f"m{i}" for i in range(len(df))])
    return df
