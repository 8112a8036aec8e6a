"""Streaming, distributed detection as in Chimbuko: a detector next to each producer judges calls
against the latest global model plus its own data since the last sync and hands its local statistics
to a parameter server, which merges them and returns the global model."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from flowscope.analysis.anomalies.config import AnomalyConfig
from flowscope.analysis.anomalies.model import FunctionModel, scorer


class ParameterServer:
    """Holds the global model; ``exchange`` merges a detector's local statistics and returns a copy.

    ``model`` and ``updates`` restore a saved state; ``save(model, updates)``, if given, is called with
    each new state before it is adopted (so an exchange whose save raises changes nothing)."""

    def __init__(self, model: FunctionModel | None = None, updates: int = 0,
                 save: Callable[[FunctionModel, int], None] | None = None) -> None:
        self.model = model if model is not None else FunctionModel()
        #: held while the model changes; hold it to read ``model`` and ``updates`` together
        self.lock = threading.RLock()
        self.updates = int(updates)
        self._save = save

    def update(self, local: FunctionModel) -> int:
        """Merge a detector's local statistics into the global model; returns the new version."""
        with self.lock:
            if self._save is None:
                self.model.merge_in(local)
            else:
                merged = self.model.merge(local)
                self._save(merged, self.updates + 1)
                self.model = merged
            self.updates += 1
            return self.updates

    def exchange(self, local: FunctionModel) -> FunctionModel:
        """:meth:`update`, then a copy of the global model."""
        with self.lock:
            self.update(local)
            return self.model.copy()

    def snapshot(self) -> FunctionModel:
        with self.lock:
            return self.model.copy()


class Detector:
    """Judges batches of calls of one producer; ``sync`` trades local statistics for the global model."""

    def __init__(self, config: AnomalyConfig | None = None, global_model: FunctionModel | None = None):
        self.config = config or AnomalyConfig()
        self.global_model = global_model.copy() if global_model is not None else FunctionModel()
        self.local = FunctionModel()       # calls seen since the last sync
        self.view = self.global_model.copy()  # global + local: what calls are judged against

    def process(self, functions: Sequence[str], func: np.ndarray, values: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """Add calls (``func`` codes into ``functions``) to the model, then judge them: (score, flagged)."""
        lcodes = self.local.codes(list(functions))[np.asarray(func, np.int64)]
        vcodes = self.view.codes(list(functions))[np.asarray(func, np.int64)]
        self.local.update(lcodes, values)
        self.view.update(vcodes, values)
        return scorer(self.view, self.config).score(vcodes, values)

    def take_local(self) -> FunctionModel:
        """The statistics gathered since the last call, and start afresh."""
        out, self.local = self.local, FunctionModel()
        return out

    def set_global(self, model: FunctionModel) -> None:
        """Adopt a new global model (which includes every local update already sent)."""
        self.global_model = model
        self.view = model.merge(self.local)

    def sync(self, server: ParameterServer) -> None:
        """Send local statistics to ``server`` and adopt the merged global model it returns."""
        self.set_global(server.exchange(self.take_local()))


#: logs category of a post-pruning verdict: the final model no longer flags an anomaly recorded online
PRUNED = "anomaly-pruned"


def unpruned_anomalies(run) -> "pa.Table":
    """A run's anomalies table without the online anomalies that post-pruning withdrew (their ``logs`` rows
    of category :data:`PRUNED` name the task key and start)."""
    import json

    import pyarrow as pa

    table = run.arrow("anomalies")
    logs = run.sql(f"SELECT task_key, attrs FROM logs WHERE category = '{PRUNED}'")
    pruned = {(k, json.loads(a)["start_ns"]) for k, a in zip(logs["task_key"], logs["attrs"])}
    if not pruned or not table.num_rows:
        return table
    keep = [(k, s) not in pruned for k, s in zip(table["task_key"].to_pylist(), table["start_ns"].to_pylist())]
    return table.filter(pa.array(keep))

