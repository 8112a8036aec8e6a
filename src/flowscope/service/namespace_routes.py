"""The collector's namespace endpoint: POST /v1/runs/{run}/namespaces/{namespace}/analyze (SOMA's analyze).

The body is JSON, ``{"sql": "SELECT ... FROM namespace ..."}`` or ``{"reduce": "max", "name": "rank/*/mass",
"by": "resource_id"}`` (flowscope.analysis.namespaces.check_request); the answer ``{"namespace", "columns", "rows",
"truncated"}`` over what the run holds now. A bad request gets 422 ``{"error", "field", "message"}`` naming the
field (``namespace``, ``sql``, ``reduce``, ...); a body that is not JSON 400; an unknown run 404.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from flowscope.model.namespaces import NamespaceError
from flowscope.model.provenance import check_run_id
from flowscope.service.collector import Collector, UnknownRun
from flowscope.store.run import Run

BODY_LIMIT = 2**20


def analyze(collector: Collector, run_id: str, namespace: str, request: Any) -> dict:
    """Run ``request`` over ``namespace``'s rows in ``run_id`` (the endpoint, called; the embedded client's path).
    NamespaceError names a bad field; UnknownRun an unknown run."""
    from flowscope.analysis.namespaces import analyze as run_analysis

    if not collector.has_run(run_id):
        raise UnknownRun(f"unknown run {run_id!r}")
    run = Run(collector.run_dir(run_id))
    try:
        return run_analysis(run, namespace, request)
    finally:
        run.close()


def _refuse(status: int, field: str, message: str) -> JSONResponse:
    return JSONResponse({"error": f"{field}: {message}", "field": field, "message": message}, status_code=status)


def namespace_routes(collector: Collector) -> list[Route]:
    """The routes to mount on the collector's app."""

    async def analyze_endpoint(request: Request) -> JSONResponse:
        run_id = request.path_params["run_id"]
        try:
            check_run_id(run_id)
        except ValueError as exc:
            return _refuse(400, "run", str(exc))
        if not collector.has_run(run_id):
            return _refuse(404, "run", f"unknown run {run_id!r}: open it first with POST /v1/runs")
        body = await request.body()
        if len(body) > BODY_LIMIT:
            return _refuse(413, "body", f"{len(body)} bytes; at most {BODY_LIMIT}")
        try:
            doc = json.loads(body) if body else {}
        except ValueError as exc:
            return _refuse(400, "body", f"not valid JSON: {exc}")
        try:
            result = await asyncio.to_thread(analyze, collector, run_id, request.path_params["namespace"], doc)
        except NamespaceError as exc:
            return _refuse(422, exc.field, str(exc).removeprefix(f"{exc.field}: "))
        return JSONResponse(result)

    return [Route("/v1/runs/{run_id}/namespaces/{namespace}/analyze", analyze_endpoint, methods=["POST"])]
