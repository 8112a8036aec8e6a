"""The collector as the anomaly detectors' parameter server: producers post their local per-function
statistics, which are merged exactly into the run's global model, and get the global model back.

    POST /v1/runs/{run_id}/anomaly-model   body {"model": FunctionModel.to_dict()} -> {"version", "model"}
    GET  /v1/runs/{run_id}/anomaly-model   -> {"version", "model"} (the empty model before any post)
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from flowscope.analysis.anomalies import FunctionModel, ParameterServer

MAX_BODY = 64 * 2**20


class AnomalyModels:
    """One parameter server per run."""

    def __init__(self) -> None:
        self.servers: dict[str, ParameterServer] = {}

    def server(self, run_id: str) -> ParameterServer:
        return self.servers.setdefault(run_id, ParameterServer())


def _reply(server: ParameterServer, model: FunctionModel) -> JSONResponse:
    return JSONResponse({"version": server.updates, "model": model.to_dict()})


def anomaly_routes(models: AnomalyModels | None = None) -> list[Route]:
    """The Starlette routes of the anomaly parameter server (state in ``models``, a new one if None)."""
    models = models or AnomalyModels()

    async def exchange(request: Request) -> JSONResponse:
        run_id = request.path_params["run_id"]
        body = await request.body()
        if len(body) > MAX_BODY:
            return JSONResponse({"error": f"body of {len(body)} bytes is over the limit of {MAX_BODY}"}, 413)
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return JSONResponse({"error": f"anomaly-model body is not JSON: {exc}"}, 400)
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            return JSONResponse({"error": "anomaly-model body must be an object with a 'model' object"}, 400)
        try:
            local = FunctionModel.from_dict(doc["model"])
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": f"anomaly-model body: {exc!r}" if not isinstance(exc, ValueError)
                                 else str(exc)}, 400)
        server = models.server(run_id)
        try:
            merged = server.exchange(local)
        except ValueError as exc:  # histograms on one side only: nothing merged
            return JSONResponse({"error": f"anomaly-model body: {exc}"}, 400)
        return _reply(server, merged)

    async def current(request: Request) -> JSONResponse:
        server = models.server(request.path_params["run_id"])
        return _reply(server, server.snapshot())

    return [Route("/v1/runs/{run_id}/anomaly-model", exchange, methods=["POST"]),
            Route("/v1/runs/{run_id}/anomaly-model", current, methods=["GET"])]
