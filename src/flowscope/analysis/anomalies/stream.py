"""Streaming, distributed detection as in Chimbuko: a detector next to each producer judges calls
against the latest global model plus its own data since the last sync and hands its local statistics
to a parameter server, which merges them and returns the global model."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from flowscope.analysis.anomalies.config import AnomalyConfig
from flowscope.analysis.anomalies.model import FINE_BINS, FunctionModel, batch_moments, fine_bin, scorer


class ParameterServer:
    """Holds the global model; ``exchange`` merges a detector's local statistics and returns a copy,
    ``exchange_since`` returns only the functions that changed since the detector's last exchange."""

    def __init__(self) -> None:
        self.model = FunctionModel()
        self._lock = threading.Lock()
        self.updates = 0
        self._changed = np.zeros(0, np.int64)  # per function: the update that last changed it

    def _merge(self, local: FunctionModel) -> None:
        self.model.merge_in(local)
        self.updates += 1
        if len(self._changed) < len(self.model):
            grown = np.zeros(max(len(self.model), 2 * len(self._changed)), np.int64)
            grown[:len(self._changed)] = self._changed
            self._changed = grown
        if len(local):
            self._changed[self.model.codes(local.names)] = self.updates

    def exchange(self, local: FunctionModel) -> FunctionModel:
        with self._lock:
            self._merge(local)
            return self.model.copy()

    def exchange_since(self, local: FunctionModel, since: int) -> tuple[int, FunctionModel]:
        """Merge ``local``; return the new version and the global statistics of every function changed after
        version ``since`` (by any detector, this one included)."""
        with self._lock:
            self._merge(local)
            return self.updates, self.model.subset(np.flatnonzero(self._changed[:len(self.model)] > since))

    def snapshot(self) -> FunctionModel:
        with self._lock:
            return self.model.copy()


class Detector:
    """Judges batches of calls of one producer; ``sync`` trades local statistics for the global model.

    SSTD detectors keep moments only (no histograms). With ``keep=True`` a detector also keeps the calls a
    grown model could still flag -- those flagged, near misses (HBOS: a bin score within 3 bits of the
    threshold; SSTD: beyond ``near`` x sigma, half by default, as a few early anomalies can inflate a young
    model's std) and calls judged while their function had fewer than
    ``mature`` calls -- and ``final(model)`` judges them against the final model: with a stationary workload
    that is exactly the set one pass over the whole run flags, without keeping the other calls.
    """

    def __init__(self, config: AnomalyConfig | None = None, global_model: FunctionModel | None = None, *,
                 keep: bool = False, mature: int = 1000, near: float = 0.5):
        self.config = config or AnomalyConfig()
        self._hist = self.config.algo == "hbos"
        self.view = global_model.copy() if global_model is not None else FunctionModel(self._hist)  # global + local
        self._local = self._aligned(FunctionModel(self._hist))
        self.synced_version = 0                # the parameter server's version this view includes
        self.keep = keep
        self.mature = int(mature)
        self.near = float(near)
        self.seen = 0                          # calls processed so far (the default ids of kept calls)
        self._kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (ids, view codes, values)

    # the local statistics are kept with the view's function numbering, so that one batch's moments update both
    def _aligned(self, model: FunctionModel) -> FunctionModel:
        self.view.codes(model.names)
        out = FunctionModel(model.histograms)
        out.codes(self.view.names)
        out.merge_in(model)
        return out

    @property
    def local(self) -> FunctionModel:
        """Statistics of the calls seen since the last sync."""
        return self._local

    @local.setter
    def local(self, model: FunctionModel) -> None:
        self._local = self._aligned(model)

    def _map(self, functions: Sequence[str], func: np.ndarray) -> np.ndarray:
        """View codes of the calls ``func`` (codes into ``functions``), looking up only the names used."""
        if not len(func):
            return np.zeros(0, np.int64)
        used = np.flatnonzero(np.bincount(func, minlength=len(functions)))
        out = np.empty(len(functions), np.int64)
        out[used] = self.view.codes([functions[i] for i in used.tolist()])
        if len(self._local) < len(self.view):
            self._local.codes(self.view.names[len(self._local):])
        return out[func]

    def process(self, functions: Sequence[str], func: np.ndarray, values: np.ndarray,
                ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Add calls (``func`` codes into ``functions``) to the model, then judge them: (score, flagged).
        ``ids`` name the calls for ``final`` (default: their running number in this detector)."""
        func = np.asarray(func, np.int64)
        values = np.asarray(values, np.float64)
        if not len(func):
            return np.zeros(0), np.zeros(0, bool)
        vcodes = self._map(functions, func)
        b = batch_moments(vcodes, values, len(self.view))
        self.view._merge_rows(*b)
        self._local._merge_rows(*b)
        if self._hist:
            keys = vcodes * FINE_BINS + fine_bin(values)
            np.add.at(self.view._hist.reshape(-1), keys, 1)
            np.add.at(self._local._hist.reshape(-1), keys, 1)
        sc = scorer(self.view, self.config, b[0])  # for the functions of this batch only
        score, flagged = sc.score(vcodes, values)
        if self.keep:
            # judged again at the end: flagged, near misses, and calls of functions the model knows little of
            if self.config.algo == "hbos":
                cut = sc.threshold - 3.0
            else:
                cut = sc.threshold * self.near
            cut = np.where(self.view.count[b[0]] < self.mature, -np.inf, np.where(sc.judged, cut, np.inf))
            sel = np.flatnonzero(flagged | (score >= cut[sc.pos[vcodes]]))
            ids = np.arange(self.seen, self.seen + len(func)) if ids is None else np.asarray(ids, np.int64)
            self._kept.append((ids[sel], vcodes[sel], values[sel]))
        self.seen += len(func)
        return score, flagged

    def final(self, model: FunctionModel | None = None) -> np.ndarray:
        """The ids of the kept calls that ``model`` (default: this detector's view) flags (needs ``keep``)."""
        if not self.keep:
            raise ValueError("Detector(keep=False) keeps no calls to judge again")
        model = self.view if model is None else model
        if not self._kept:
            return np.zeros(0, np.int64)
        ids, codes, values = (np.concatenate(x) for x in zip(*self._kept))
        self._kept = [(ids, codes, values)]
        mapped = model.codes(self.view.names)[codes] if model is not self.view else codes
        return ids[scorer(model, self.config).score(mapped, values)[1]]

    @property
    def kept(self) -> int:
        """Calls kept to be judged again."""
        return sum(len(k[0]) for k in self._kept)

    def take_local(self) -> FunctionModel:
        """The statistics gathered since the last call, and start afresh."""
        loc = self._local
        rows = np.flatnonzero(loc.count)
        out = loc.subset(rows)
        loc.count[rows], loc.mean[rows], loc.m2[rows] = 0, 0.0, 0.0
        loc.min[rows], loc.max[rows] = np.inf, -np.inf
        if loc.histograms:
            loc.hist[rows] = 0
        return out

    def set_global(self, model: FunctionModel) -> None:
        """Adopt a new global model (which includes every local update already sent)."""
        self.view = model.merge(self._local)
        self._local = self._aligned(self._local)

    def sync(self, server: ParameterServer) -> None:
        """Send local statistics to ``server`` and take back the global statistics of the functions that
        changed since this detector's last sync (its view is then the global model)."""
        self.synced_version, changed = server.exchange_since(self.take_local(), self.synced_version)
        self.view.assign(changed)
        if len(self._local) < len(self.view):
            self._local.codes(self.view.names[len(self._local):])


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

