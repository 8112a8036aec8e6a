"""Memory over time per executing process: the per-process memory samples of the ``metrics`` table
(``process.memory.rss_bytes``, whichever source and namespace wrote them) of the processes that run the
workflow's work.

A process "runs work" when it executes and ran tasks or calls (the ``executors`` and ``activity`` views: an MPI
rank) or when such a resource sits under it in the resource tree (a Dask worker whose threads ran tasks).
A process that only schedules or submits (a Dask scheduler, a client) is left out.

    df = process_memory(run)      # resource_id, label, ts_ns, bytes; one row per sample
    df = process_memory_parts(run)  # the same, with the runtime's managed and spilled bytes of each sample
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from flowscope.model.semantics import PROCESS_MEMORY, PROCESS_MEMORY_MANAGED, PROCESS_MEMORY_SPILLED

if TYPE_CHECKING:
    from flowscope.store.run import Run

COLUMNS = ["resource_id", "label", "ts_ns", "bytes"]


def _label(kind, name, address, rid: str) -> str:
    """A short name for a process: its kind and name (or address), as the report names a resource."""
    text = (lambda v: v if isinstance(v, str) and v else None)
    name, address = text(name), text(address)
    address = address.split("://", 1)[-1] if address else None
    who = name if name and "://" not in name else (address or name or rid)
    return f"{kind} {who}" if text(kind) else who


def working_processes(resources: pd.DataFrame, active: set[str]) -> set[str]:
    """The resources (of an ``executors`` frame: resource_id, parent_id, executes) that ran work (are in
    ``active`` and execute) or have such a resource below them. Every declared thread executes by the generic
    rules (a client's main thread too), so having run work is what tells a worker from a client."""
    if resources.empty:
        return set()
    parent = dict(zip(resources["resource_id"], resources["parent_id"]))
    out: set[str] = set()
    ran = resources["executes"].fillna(False).astype(bool) & resources["resource_id"].isin(active)
    for rid in resources.loc[ran, "resource_id"]:
        seen = set()
        while isinstance(rid, str) and rid not in seen:  # the tree, guarded against a cycle in bad input
            seen.add(rid)
            out.add(rid)
            rid = parent.get(rid)
    return out


def process_memory(run: Run, metric: str = PROCESS_MEMORY) -> pd.DataFrame:
    """One row per sample of ``metric`` on a process that runs work (see the module's docstring), ordered by
    resource and time: resource_id, label, ts_ns, bytes."""
    samples = run.sql("SELECT resource_id, ts_ns, value AS bytes FROM metrics WHERE name = ? AND isfinite(value) "
                      "ORDER BY resource_id, ts_ns", [metric])
    if samples.empty:
        return pd.DataFrame(columns=COLUMNS)
    res = run.sql("SELECT resource_id, parent_id, kind, name, address, executes FROM executors")
    active = set(run.sql("SELECT DISTINCT resource_id FROM activity WHERE role IN ('task', 'call')")["resource_id"])
    keep = working_processes(res, active)
    samples = samples[samples["resource_id"].isin(keep)].reset_index(drop=True)
    first = res.drop_duplicates("resource_id", keep="last").set_index("resource_id")
    labels = {rid: _label(*first.loc[rid, ["kind", "name", "address"]], rid) for rid in samples["resource_id"].unique()}
    samples.insert(1, "label", samples["resource_id"].map(labels))
    return samples[COLUMNS]


#: the parts of a process's memory a runtime may sample with its resident size: column -> metric
MEMORY_PARTS = {"managed": PROCESS_MEMORY_MANAGED, "spilled": PROCESS_MEMORY_SPILLED}


def process_memory_parts(run: Run) -> pd.DataFrame:
    """:func:`process_memory` with, per sample, the bytes of the runtime's data the process held in memory
    (``managed``) and had spilled to disk (``spilled``), sampled at the same moment on the same resource (Dask's
    workers record them); NaN where the source sampled no such part."""
    df = process_memory(run)
    if df.empty:
        return df.assign(**{c: pd.Series(dtype="float64") for c in MEMORY_PARTS})
    names = ", ".join(f"'{m}'" for m in MEMORY_PARTS.values())
    parts = run.sql(f"SELECT resource_id, ts_ns, name, value FROM metrics WHERE name IN ({names}) AND isfinite(value)")
    for col, metric in MEMORY_PARTS.items():
        part = parts[parts["name"] == metric].drop_duplicates(["resource_id", "ts_ns"], keep="last")
        df = df.merge(part[["resource_id", "ts_ns", "value"]].rename(columns={"value": col}),
                      on=["resource_id", "ts_ns"], how="left")
        df[col] = df[col].astype("float64")
    return df
