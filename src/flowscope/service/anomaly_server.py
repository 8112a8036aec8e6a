"""The collector as the anomaly detectors' parameter server: producers post their local per-function
statistics, which are merged exactly into the run's global model, and get the global model back.

    POST /v1/runs/{run_id}/anomaly-model   body {"model": FunctionModel.to_dict()} -> {"run_id", "version", "model"}
    GET  /v1/runs/{run_id}/anomaly-model   -> {"run_id", "version", "model"} (the empty model before any post)

The run must exist (404; 400 for a string that is not a run id). The global model lives with the run:
each update is written to ``<run>/online_anomaly_model.json`` before it is answered, so a collector that
restarts, even after a kill, serves the model its producers built and post-pruning never judges against a
partial one. A body over the collector's request limit is refused (413) as soon as the limit is passed,
without reading the rest.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from flowscope.model.provenance import check_run_id
from flowscope.store.layout import read_json, write_bytes_atomic

if TYPE_CHECKING:
    from flowscope.analysis.anomalies import FunctionModel, ParameterServer
    from flowscope.service.collector import Collector

#: the file of a run directory holding the online detectors' global model
MODEL_FILE = "online_anomaly_model.json"
#: parameter servers kept in memory; others are read back from their run directory when used again
CACHED_RUNS = 64


class Refused(Exception):
    """A request answered with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class _Entry:
    server: ParameterServer
    users: int = 0


class AnomalyModels:
    """The parameter server of each run of ``collector``: read from the run directory on first use, written
    there on every update. At most :data:`CACHED_RUNS` idle ones stay in memory."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._saved = threading.local()  # the reply an exchange on this thread saved

    def path(self, run_id: str) -> Path:
        return self.collector.run_dir(run_id) / MODEL_FILE

    def _load(self, run_id: str) -> ParameterServer:
        from flowscope.analysis.anomalies import FunctionModel, ParameterServer  # on a run's first exchange, not at start

        path = self.path(run_id)

        def save(model: FunctionModel, version: int) -> None:
            self._saved.reply = _reply(run_id, version, model)  # the file is the answer: serialised once
            write_bytes_atomic(path, self._saved.reply)

        try:
            doc = read_json(path)
        except FileNotFoundError:
            return ParameterServer(save=save)
        except (OSError, ValueError) as exc:
            raise Refused(500, f"{path}: unreadable anomaly model ({exc}); move it away to start afresh") from None
        try:
            return ParameterServer(FunctionModel.from_dict(doc["model"]), int(doc["version"]), save=save)
        except (KeyError, TypeError, ValueError) as exc:
            raise Refused(500, f"{path}: not an anomaly model ({exc!r}); move it away to start afresh") from None

    @contextmanager
    def server(self, run_id: str) -> Iterator[ParameterServer]:
        """The parameter server of ``run_id`` (an existing run), held in memory while in use."""
        with self._lock:
            entry = self._entries.get(run_id)
            if entry is None:
                entry = self._entries[run_id] = _Entry(self._load(run_id))
            self._entries.move_to_end(run_id)
            entry.users += 1
        try:
            yield entry.server
        finally:
            with self._lock:
                entry.users -= 1
                idle = [k for k, e in self._entries.items() if not e.users]
                for k in idle[:max(0, len(self._entries) - CACHED_RUNS)]:  # least recently used first
                    del self._entries[k]

    def exchange(self, run_id: str, body: bytes) -> bytes:
        """Merge the local model in ``body`` into the run's global model, save it, and return the reply."""
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise Refused(400, f"anomaly-model body is not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            raise Refused(400, "anomaly-model body must be an object with a 'model' object")
        from flowscope.analysis.anomalies import FunctionModel

        try:
            local = FunctionModel.from_dict(doc["model"])
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        except (KeyError, TypeError) as exc:
            raise Refused(400, f"anomaly-model body: {exc!r}") from None
        with self.server(run_id) as server:
            try:
                server.update(local)
            except ValueError as exc:  # histograms on one side only: nothing merged
                raise Refused(400, f"anomaly-model body: {exc}") from None
            return self._saved.reply

    def current(self, run_id: str) -> bytes:
        with self.server(run_id) as server:
            with server.lock:
                return _reply(run_id, server.updates, server.model)


def _reply(run_id: str, version: int, model: FunctionModel) -> bytes:
    """``{"run_id", "version", "model"}``: both the answer and the file kept in the run directory."""
    return json.dumps({"run_id": run_id, "version": version, "model": model.to_dict()}, allow_nan=False,
                      separators=(",", ":")).encode()


def _run_id(request: Request, collector: Collector) -> str:
    run_id = request.path_params["run_id"]
    try:
        check_run_id(run_id)
    except ValueError as exc:
        raise Refused(400, str(exc)) from None
    if not collector.has_run(run_id):
        raise Refused(404, f"unknown run {run_id!r}: open it first with POST /v1/runs")
    return run_id


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes ``limit`` bytes, declared or streamed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise Refused(413, f"anomaly-model body of {int(declared)} bytes is over the limit of {limit} bytes")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise Refused(413, f"anomaly-model body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def anomaly_routes(collector: Collector, models: AnomalyModels | None = None) -> list[Route]:
    """The Starlette routes of the anomaly parameter server for the runs of ``collector``."""
    models = models or AnomalyModels(collector)

    async def exchange(request: Request) -> Response:
        try:
            run_id = _run_id(request, collector)
            body = await _bounded_body(request, collector.max_request_bytes)
            return Response(await asyncio.to_thread(models.exchange, run_id, body), media_type="application/json")
        except Refused as exc:
            return JSONResponse({"error": str(exc)}, exc.status)

    async def current(request: Request) -> Response:
        try:
            reply = await asyncio.to_thread(models.current, _run_id(request, collector))
            return Response(reply, media_type="application/json")
        except Refused as exc:
            return JSONResponse({"error": str(exc)}, exc.status)

    return [Route("/v1/runs/{run_id}/anomaly-model", exchange, methods=["POST"]),
            Route("/v1/runs/{run_id}/anomaly-model", current, methods=["GET"])]
