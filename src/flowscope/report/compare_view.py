"""The comparison of runs as one JSON document: what the dashboard's compare page (``/ui/compare``) and the
static page ``flowscope compare --html`` draw, from :mod:`flowscope.analysis.compare` and
:mod:`flowscope.analysis.compare_figures`."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from flowscope.analysis.compare import Comparison
from flowscope.analysis.compare_figures import CriticalPaths
from flowscope.store.run_set import RunSet

#: rows of a per-record table a document carries at most (the longest tasks, the largest transfers and a
#: sample of the rest are kept; the counts say how many there were)
POINT_LIMIT = 20_000


def _rows(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records", double_precision=15)) if len(df) else []


def _capped(df: pd.DataFrame, by: str | None, limit: int = POINT_LIMIT) -> tuple[pd.DataFrame, int]:
    """At most ``limit`` rows of ``df``: the ``limit // 2`` largest of ``by`` (none when None) and an even
    sample of the others, in the original order; and how many rows there were."""
    n = len(df)
    if n <= limit:
        return df, n
    keep = np.zeros(n, dtype=bool)
    if by is not None:
        keep[np.argsort(-df[by].fillna(0).to_numpy(np.float64), kind="stable")[: limit // 2]] = True
    rest = np.flatnonzero(~keep)
    keep[rest[np.linspace(0, len(rest) - 1, limit - int(keep.sum())).astype(np.int64)]] = True
    return df[keep], n


def compare_view(runs: RunSet, before: list[str] | None = None, after: list[str] | None = None, *,
                 comparison: Comparison | None = None, paths: CriticalPaths | None = None, **options: Any) -> dict:
    """Everything the compare page shows of ``runs``: the comparison (phases, group distributions, what changed
    between ``before`` and ``after``, scheduling order, placement; ``options`` as :func:`compare` takes them;
    ``comparison``, ``paths``: a comparison and the critical paths already computed for these runs) and
    the tables of the figures (transfers by locality, I/O per resource, task coordinates, warnings against long
    tasks, the critical paths side by side, tasks moved between workers per pair of workers), per-record tables capped
    at POINT_LIMIT rows each."""
    from flowscope.analysis.compare import compare
    from flowscope.analysis.compare_figures import (
        LONG_FACTOR,
        LONG_MIN_S,
        critical_paths,
        io_timeline,
        reassignments,
        task_coordinates,
        transfer_costs,
        transfer_fit,
        warnings_and_long_tasks,
    )

    doc = (comparison if comparison is not None else compare(runs, before, after, **options)).to_dict()
    costs = transfer_costs(runs)
    tasks = task_coordinates(runs)
    io = io_timeline(runs)
    warns, long_tasks, warn_summary = warnings_and_long_tasks(runs)
    cut_costs, n_costs = _capped(costs.drop(columns=["src_resource_id", "dst_resource_id"]), "nbytes")
    cut_tasks, n_tasks = _capped(tasks, "duration_s")
    cut_io, n_io = _capped(io, "nbytes")
    cut_warns, n_warns = _capped(warns, None)
    cut_long, n_long = _capped(long_tasks, "duration_s")
    moved = reassignments(runs)
    moves = (moved.groupby(["run_id", "from_worker", "to_worker"], dropna=False).size().rename("tasks").reset_index()
             if len(moved) else pd.DataFrame(columns=["run_id", "from_worker", "to_worker", "tasks"]))
    doc.update(
        transfers=_rows(cut_costs), transfer_count=n_costs, transfer_fit=_rows(transfer_fit(costs)),
        tasks=_rows(cut_tasks), task_count=n_tasks,
        io=_rows(cut_io), io_count=n_io,
        warnings=_rows(cut_warns), warning_count=n_warns, long_tasks=_rows(cut_long),
        long_task_count=n_long,
        warning_summary=_rows(warn_summary), long_task_rule={"factor": LONG_FACTOR, "min_s": LONG_MIN_S},
        critical_paths=(paths if paths is not None else critical_paths(runs)).to_dict(), moves=_rows(moves),
        point_limit=POINT_LIMIT)
    return doc
