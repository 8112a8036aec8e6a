"""What the anomalies page (Chimbuko's views, :func:`flowscope.report.views.anomalies_view`) reads: the run's
anomalies as the report shows them (post-pruning's withdrawals left out), the calls around them, and resources
ranked by anomaly statistics per step."""

from __future__ import annotations

import numpy as np
import pandas as pd


def resource_ranking(anomalies: pd.DataFrame, nsteps: int) -> pd.DataFrame:
    """Per resource: mean, std, max, min and total of its anomalies per step over the run's ``nsteps``
    steps (steps without anomalies count as 0)."""
    per = anomalies.groupby(["resource_id", "step"]).size().unstack(fill_value=0)
    per = per.reindex(columns=range(max(nsteps, 1)), fill_value=0)
    return pd.DataFrame({"mean": per.mean(axis=1), "std": per.std(axis=1, ddof=0), "max": per.max(axis=1),
                         "min": per.min(axis=1), "total": per.sum(axis=1)}).rename_axis("resource_id")


def _kept_calls(run, anomalies: pd.DataFrame) -> pd.DataFrame:
    """The calls around the anomalies with entry, exit, times, depth, children, function, resource, call id and
    position on the resource: the reduced run's kept calls, else every call of the run."""
    from flowscope.analysis.anomalies.reduce import CALLS_FILE, window_calls

    if (run.path / CALLS_FILE).exists():
        return window_calls(run.path).to_pandas()
    from flowscope.analysis.anomalies import calls_from_spans

    c = calls_from_spans(run.sql_arrow("SELECT * FROM activity"))
    pos = np.arange(len(c)) - c.resource_start()
    return pd.DataFrame({"resource_id": np.asarray(c.resources, object)[c.resource], "pos": pos,
                         "call_id": c.call_id, "function": np.asarray(c.functions, object)[c.func],
                         "depth": c.depth, "children": c.children, "start_ns": c.start, "end_ns": c.end,
                         "inclusive_ns": c.inclusive, "exclusive_ns": c.exclusive})


def _read_anomalies(run) -> pd.DataFrame:
    from flowscope.analysis.anomalies.reduce import CALLS_FILE, MODEL_FILE, reduced_anomalies

    if (run.path / CALLS_FILE).exists() and (run.path / MODEL_FILE).exists():
        return reduced_anomalies(run.path).to_pandas()
    from flowscope.analysis.anomalies.stream import unpruned_anomalies

    # online anomalies that post-pruning withdrew are not shown
    return unpruned_anomalies(run).to_pandas().sort_values("anomaly_id")


