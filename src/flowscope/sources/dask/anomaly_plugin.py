"""Distributed anomaly detection on Dask workers, as in Chimbuko: a detector next to each producer.

``AnomalyWorkerPlugin`` runs on every worker. Each task that finishes there (``executing`` or
``long-running`` to ``memory`` or ``error``) is queued with its compute duration -- the same
nanoseconds the capture plugin writes as the task's span, so online and offline judge the same
values -- and its function (the task prefix). Every ``period`` seconds (default 1) a thread of the
plugin judges the queued calls in one vectorised batch against the latest global model plus the
worker's own data since the last sync (``analysis.anomalies.Detector``), records the flagged ones in
the run's ``anomalies`` table through a flowscope Client, posts its local statistics to the
collector's ``/v1/runs/{run}/anomaly-model`` (the parameter server, which merges them exactly) and
adopts the global model it returns.

Calls are judged again later, at each sync (a worker with nothing new to send but calls kept asks for the
global model each period, and adopts it when other workers changed it) and at the end against the final model,
while the model they were judged against held fewer than ``mature`` calls of their function (default 1,000), and
when they were
near misses (HBOS: a bin at most 8x as full as a flagged one; SSTD: beyond 2/3 of sigma); those then
flagged are recorded with ``"late": true``. Chimbuko re-checks only what it flagged, so a call the early
model let pass is lost; these few kept calls (at most ``max_pending``, default 100,000) are what makes the
online verdicts agree with the offline pass as the run goes. At the end, every call the worker let pass
(the last ``max_pending`` of them) is judged once more against the final model, so after that pass the
anomalies a worker recorded are those the final model flags: what the offline pass finds, whatever the
model looked like when a call was first judged.

Post-pruning: at the end (``finish_anomalies`` from ``observe``, after every worker has sent its last
statistics; else on teardown, against the global model of that moment) each worker re-judges the
anomalies it stored against the final global model and records a ``logs`` row of category
``anomaly-pruned`` for each one the final model no longer flags. ``distributed_anomalies(run)``
reads the anomalies table without the pruned ones.

Online rows differ from the offline pass's (``flowscope anomalies``) in what a worker cannot know
when it judges: ``call_id`` is -1 (Dask task spans have no span id; match on ``task_key``), the
call windows and ``exemplar_call_id`` are null (the exemplar's time is kept), ``messages`` is 0, and
``model`` carries ``"online": true``, the model version and the worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import pyarrow as pa
from distributed.diagnostics.plugin import WorkerPlugin

from flowscope.analysis.anomalies import AnomalyConfig, Detector, FunctionModel, scorer
from flowscope.model import identifiers as ids
from flowscope.model.schemas import ANOMALIES

log = logging.getLogger("flowscope.dask.anomalies")

NAME = "flowscope-anomalies"
from flowscope.analysis.anomalies.stream import PRUNED, unpruned_anomalies  # noqa: E402
_DONE_FROM = frozenset(("executing", "long-running"))
_DONE_TO = frozenset(("memory", "error"))


def _anomaly_id(key: str, start_ns: int) -> int:
    """A run-wide id for an online anomaly that needs no coordination between workers."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{start_ns}".encode(), digest_size=8).digest(), "little") >> 1


class AnomalyWorkerPlugin(WorkerPlugin):
    """Judges the tasks finishing on a worker against the run's global model (see the module doc)."""

    name = NAME

    def __init__(self, address: str, run_id: str, config: AnomalyConfig | None = None, period: float = 1.0,
                 mature: int = 1000, max_pending: int = 100_000):
        if not period > 0:
            raise ValueError(f"period must be > 0 seconds, not {period!r}")
        if mature < 0:
            raise ValueError(f"mature must be >= 0 calls, not {mature!r}")
        self.mature = int(mature)
        self.max_pending = int(max_pending)
        self.address = address
        self.run_id = run_id
        self.config = config or AnomalyConfig()
        self.period = float(period)
        self.errors = 0
        self.fs = None
        self._capture = None  # the worker's capture plugin of this run, which tells each task span it records

    # ---- lifecycle ------------------------------------------------------------------------------
    def setup(self, worker) -> None:
        from flowscope.client.client import Client
        from flowscope.client.transport import HttpTransport

        self.worker = worker
        self.fs = Client(self.address, run_id=self.run_id, flush_interval=self.period)
        self._http = HttpTransport(self.address, timeout=30.0)
        self._path = f"/v1/runs/{self.run_id}/anomaly-model"
        self.detector = Detector(self.config)
        self.version = 0
        self.stats = {"calls": 0, "batches": 0, "syncs": 0, "flagged": 0, "late": 0, "pruned": 0, "pending_dropped": 0, "pending_max": 0, "thread_cpu_ns": 0, "judge_ns": 0,
                      "sync_ns": 0}
        self._queue: deque = deque()
        self._threads: dict[int | None, str] = {}
        self._exemplar: dict[str, tuple[int, int]] = {}   # function -> (step, value) of a normal call
        self._stored: list[tuple[str, float, str, int]] = []  # flagged: function, value, task key, start
        self._pending: list[tuple] = []  # unflagged calls judged against a thin model: judged again later
        self._passed: deque = deque(maxlen=self.max_pending)  # every unflagged call: judged once more at the end
        self._finished = False
        self._worker_addr = worker.address
        try:
            self._run_start = int(self._http._check(*self._http._request("GET", f"/v1/runs/{self.run_id}"))
                                  ["start_ns"])
        except Exception:
            self._run_start = None  # steps then count from the worker's first call
        from flowscope.sources.dask.plugins import FlowscopeWorkerPlugin

        # judge the spans the capture records, on its clock (Dask's own times are the scheduler's, which the capture
        # may take back to the worker's: docs/dask.md); without it, Dask's times from the transition hook
        cap = worker.plugins.get(FlowscopeWorkerPlugin.name)
        if getattr(cap, "run_id", None) == self.run_id and hasattr(cap, "span_listeners"):
            self._capture = cap
            cap.span_listeners.append(self._on_span)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one batch or sync at a time (the loop, finish and prune)
        self._thread = threading.Thread(target=self._loop, name="flowscope-anomalies", daemon=True)
        self._thread.start()

    def teardown(self, worker) -> None:
        if self.fs is None:
            return
        if self._capture is not None and self._on_span in self._capture.span_listeners:
            self._capture.span_listeners.remove(self._on_span)
        try:
            if not self._finished:
                self.finish()
                self.prune()
        except Exception:
            self._failed()
        fs, self.fs = self.fs, None
        try:
            fs.close(timeout=30)
        except Exception:
            log.exception("flowscope anomaly plugin: closing its client failed")
        self._http.close()

    def _failed(self) -> None:
        self.errors += 1
        if self.errors <= 3:
            log.exception("flowscope anomaly plugin failed")

    # ---- the hook: queue, nothing else ----------------------------------------------------------
    def _on_span(self, prefix: str, key: str, start_ns: int, end_ns: int, ident: int | None) -> None:
        """A task span as the worker's capture plugin recorded it: judged as recorded (the same clock)."""
        self._queue.append((prefix, key, start_ns, end_ns, ident))

    def transition(self, key, start, finish, **kwargs) -> None:
        if self._capture is not None:  # the capture plugin tells each span (_on_span)
            return
        if finish not in _DONE_TO or start not in _DONE_FROM:
            return
        try:
            ts = self.worker.state.tasks.get(key)
            if ts is None:
                return
            for ss in reversed(ts.startstops):
                if ss.get("action") == "compute":
                    self._queue.append((ts.prefix, key if key.__class__ is str else str(key),
                                        int(ss["start"] * 1e9), int(ss["stop"] * 1e9),
                                        self.worker.state.threads.get(key)))
                    return
        except Exception:
            self._failed()

    # ---- the detector's thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                with self._lock:
                    self._judge()
                    self._sync()
            except Exception:
                self._failed()
            self.stats["thread_cpu_ns"] = time.thread_time_ns()  # this thread's CPU time so far

    def _thread_resource(self, ident: int | None) -> str:
        rid = self._threads.get(ident)
        if rid is None:
            native = next((t.native_id for t in threading.enumerate() if t.ident == ident), None)
            rid = self._threads[ident] = ids.thread_id(native if native is not None else ident)
        return rid

    def _judge(self) -> None:
        """Judge the queued calls as one batch and record the flagged ones."""
        n = len(self._queue)
        if not n:
            return
        t0 = time.perf_counter_ns()
        batch = [self._queue.popleft() for _ in range(n)]
        prefixes, keys, starts, ends, idents = zip(*batch)
        functions, codes = np.unique(np.asarray(prefixes, dtype=object).astype(str), return_inverse=True)
        functions = functions.tolist()
        start = np.fromiter(starts, np.int64, n)
        end = np.fromiter(ends, np.int64, n)
        values = (end - start).astype(np.float64)
        det = self.detector  # Detector.process, keeping the scorer for the near-miss test below
        vcodes = det.view.codes(functions)[codes]
        det.local.update(det.local.codes(functions)[codes], values)
        det.view.update(vcodes, values)
        sc = scorer(det.view, self.config)
        score, flagged = sc.score(vcodes, values)
        if self._run_start is None:
            self._run_start = int(start.min())
        step = np.maximum(start - self._run_start, 0) // self.config.step_ns
        normal = np.flatnonzero(~flagged)
        for i in normal[np.unique(codes[normal], return_index=True)[1]]:  # one normal call per function
            self._exemplar[functions[codes[i]]] = (int(step[i]), int(values[i]))
        self.stats["calls"] += n
        self.stats["batches"] += 1
        names = np.asarray(functions, dtype=object)[codes]
        rows = np.flatnonzero(flagged)
        if len(rows):
            self._record(rows, names, keys, start, end, values, score, idents, det.view, sc, late=False)
        for i in np.flatnonzero(~flagged):
            self._passed.append((names[i], keys[i], int(start[i]), int(end[i]), idents[i]))
        # judged again later: calls judged against a thin model of their function, and near misses
        again = np.flatnonzero(~flagged & ((det.view.count[vcodes] < self.mature) | self._near(sc, vcodes, score)))
        for i in again:
            self._pending.append((names[i], keys[i], int(start[i]), int(end[i]), idents[i]))
        self.stats["pending_max"] = max(self.stats["pending_max"], len(self._pending))
        if len(self._pending) > self.max_pending:
            self.stats["pending_dropped"] += len(self._pending) - self.max_pending
            del self._pending[:len(self._pending) - self.max_pending]
        self.stats["judge_ns"] += time.perf_counter_ns() - t0

    def _near(self, sc, codes: np.ndarray, score: np.ndarray) -> np.ndarray:
        """Calls a model that has grown a little could flag: hbos, a bin up to 8x as full as a flagged one
        (score within 3 bits of the threshold); sstd, beyond two thirds of sigma."""
        cut = sc.threshold[codes] - 3.0 if self.config.algo == "hbos" else sc.threshold[codes] * (2 / 3)
        return sc.judged[codes] & (score >= cut)

    def _rejudge(self, model: FunctionModel, final: bool) -> None:
        """Judge the pending calls again against ``model``; keep those whose function is still thin."""
        if not self._pending:
            return
        names, keys, starts, ends, idents = zip(*self._pending)
        start, end = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        values = (end - start).astype(np.float64)
        codes = model.codes(list(names))
        sc = scorer(model, self.config)
        score, flagged = sc.score(codes, values)
        rows = np.flatnonzero(flagged)
        if len(rows):
            self._record(rows, np.asarray(names, dtype=object), keys, start, end, values, score, idents,
                         model, sc, late=True)
        keep = [] if final else np.flatnonzero(~flagged & ((model.count[codes] < self.mature) |
                                                           self._near(sc, codes, score)))
        self._pending = [self._pending[i] for i in keep]

    def _record(self, rows, names, keys, start, end, values, score, idents, model: FunctionModel, sc,
                *, late: bool) -> None:
        """Write the anomalies table rows of the flagged ``rows``, judged by ``sc`` (the scorer of ``model``)."""
        k = len(rows)
        fn = [str(names[r]) for r in rows]
        vcodes = model.codes(fn)
        step = np.maximum(start[rows] - self._run_start, 0) // self.config.step_ns
        ex = [self._exemplar.get(f) for f in fn]
        models = []
        for r, vc in zip(rows, vcodes):
            m = sc.explain(int(vc), float(values[r]))
            m.update(online=True, late=late, model_version=self.version, worker=self._worker_addr)
            models.append(json.dumps(m))
        cols = {
            "anomaly_id": [_anomaly_id(keys[r], int(start[r])) for r in rows],
            "call_id": np.full(k, -1, np.int64),
            "resource_id": [self._thread_resource(idents[r]) for r in rows],
            "function": fn,
            "kind": ["task"] * k,
            "task_key": [keys[r] for r in rows],
            "start_ns": start[rows],
            "end_ns": end[rows],
            "inclusive_ns": (end - start)[rows],
            "exclusive_ns": (end - start)[rows],  # Dask task spans do not nest
            "metric": [self.config.metric] * k,
            "algo": [self.config.algo] * k,
            "score": score[rows],
            "threshold": sc.threshold[vcodes],
            "severity_ns": (values[rows] - model.mean[vcodes]).round().astype(np.int64),
            "step": step,
            "depth": np.zeros(k, np.int64),
            "call_stack": [[f] for f in fn],
            "children": np.zeros(k, np.int64),
            "messages": np.zeros(k, np.int64),
            "exemplar_ns": pa.array([e[1] if e else None for e in ex], pa.int64()),
            "model": models,
            "run_id": [self.run_id] * k,
        }
        self.fs.write("anomalies", pa.table({c: cols[c] for c in ANOMALIES.names if c in cols}))
        self._stored.extend((fn[j], float(values[r]), keys[r], int(start[r])) for j, r in enumerate(rows))
        self.stats["late" if late else "flagged"] += k

    def _sync(self) -> None:
        """Send the local statistics to the parameter server and adopt the global model it returns."""
        local = self.detector.take_local()
        if not len(local) and self.version:
            if self._pending:  # nothing new here, but calls wait for a fuller model: the others' calls may make it
                self._adopt_newer()
            return
        t0 = time.perf_counter_ns()
        body = json.dumps({"model": local.to_dict()}).encode()
        try:
            doc = self._http._check(*self._http._request("POST", self._path, body,
                                                         {"Content-Type": "application/json"}))
        except Exception:
            self.detector.local = local.merge(self.detector.local)  # not merged: send it next time
            raise
        self._adopt(doc, t0)

    def _adopt_newer(self) -> None:
        """Adopt the global model if other workers changed it since this one's, and judge the kept calls again
        against it (a read: nothing of this worker's to merge)."""
        t0 = time.perf_counter_ns()
        doc = self._http._check(*self._http._request("GET", self._path))
        if int(doc["version"]) > self.version:
            self._adopt(doc, t0)

    def _adopt(self, doc: dict, t0: int) -> None:
        """Take the parameter server's answer ``doc`` as the global model and judge the kept calls again; one sync
        more, begun at ``t0``."""
        self.detector.set_global(FunctionModel.from_dict(doc["model"]))
        self.version = int(doc["version"])
        self._rejudge(self.detector.view, final=False)
        self.stats["syncs"] += 1
        self.stats["sync_ns"] += time.perf_counter_ns() - t0

    # ---- the end ---------------------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        """Stop the periodic thread, judge what is queued and send the last local statistics."""
        self._stop.set()
        self._thread.join(timeout=60)
        with self._lock:
            self._judge()
            self._sync()
        self._finished = True
        return dict(self.stats, errors=self.errors)

    def prune(self, final: FunctionModel | None = None) -> dict[str, Any]:
        """Re-judge the stored anomalies against ``final`` (default: the parameter server's model now) and
        record a logs row (category ``anomaly-pruned``) for each one it no longer flags."""
        if final is None:
            doc = self._http._check(*self._http._request("GET", self._path))
            final = FunctionModel.from_dict(doc["model"])
            self.version = int(doc["version"])
        # the final pass: every call let pass so far (not only the thin and near ones), minus those flagged late
        flagged = {(key, start) for _, _, key, start in self._stored}
        self._pending = [c for c in self._passed if (c[1], c[2]) not in flagged]
        self._rejudge(final, final=True)
        if self._stored:
            names, values, keys, starts = zip(*self._stored)
            sc = scorer(final, self.config)
            s, keep = sc.score(final.codes(list(names)), np.asarray(values, np.float64))
            rid = ids.worker_id(self._worker_addr)
            for i in np.flatnonzero(~keep):
                self.fs.log(f"anomaly of {names[i]} pruned by the final model", category=PRUNED,
                            resource_id=rid, task_key=keys[i],
                            attrs={"start_ns": starts[i], "score": float(s[i]), "model_version": self.version})
            self.stats["pruned"] = int(np.count_nonzero(~keep))
        self.fs.flush(30)
        return dict(self.stats, errors=self.errors)


def _finish(dask_worker) -> dict | None:
    plugin = dask_worker.plugins.get(NAME)
    return plugin.finish() if plugin is not None and plugin.fs is not None else None


def _prune(dask_worker) -> dict | None:
    plugin = dask_worker.plugins.get(NAME)
    return plugin.prune() if plugin is not None and plugin.fs is not None else None


def register_anomalies(dask_client, address: str, run_id: str, config: AnomalyConfig | None = None,
                       period: float = 1.0, mature: int = 1000) -> None:
    """Install the anomaly detector on every worker of ``dask_client``'s cluster (and workers joining later)."""
    dask_client.register_plugin(AnomalyWorkerPlugin(address, run_id, config, period, mature), name=NAME)


def finish_anomalies(dask_client) -> dict[str, dict]:
    """End distributed detection: every worker sends its last statistics, then every worker post-prunes
    against the final global model; the plugin is removed. Returns each worker's counters."""
    dask_client.run(_finish)
    stats = dask_client.run(_prune)
    dask_client.unregister_worker_plugin(NAME)
    return stats


def distributed_anomalies(run) -> pa.Table:
    """The anomalies the workers flagged online and the final model still flags (a run on disk)."""
    return unpruned_anomalies(run)
