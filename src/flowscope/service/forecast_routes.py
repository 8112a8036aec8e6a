"""The collector's forecast endpoint: GET /v1/runs/{run}/forecast?event=idle&fraction=0.25[&window=N].

A thin route over :func:`flowscope.analysis.forecast.predict` on what the run holds so far (a live run's
acknowledged batches, or a finished run): the same JSON as ``flowscope forecast predict RUN --json``. Bad
parameters get 400 ``{"error", "field"}``; an unknown run 404; a run with no executing resource yet 409.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from flowscope.model.provenance import check_run_id
from flowscope.service.collector import Collector
from flowscope.store.layout import RUN_JSON
from flowscope.store.run import Run

PARAMS = ("event", "fraction", "window")


class StoreRuns:
    """The runs of a store folder, as the route looks them up (``flowscope ui`` has no collector)."""

    def __init__(self, store: Path):
        self.store = store

    def run_dir(self, run_id: str) -> Path:
        return self.store / check_run_id(run_id)

    def has_run(self, run_id: str) -> bool:
        try:
            return (self.run_dir(run_id) / RUN_JSON).is_file()
        except ValueError:
            return False


def _refuse(status: int, message: str, field: str | None = None) -> JSONResponse:
    body = {"error": message}
    if field:
        body["field"] = field
    return JSONResponse(body, status_code=status)


def forecast_routes(collector: Collector | StoreRuns) -> list[Route]:
    """The routes to mount on the collector's app (or on the dashboard's, over a store's runs)."""
    from flowscope.analysis.forecast import check_fraction, predict
    from flowscope.analysis.forecast.signal import check_event

    async def forecast(request: Request) -> JSONResponse:
        run_id = request.path_params["run_id"]
        try:
            check_run_id(run_id)
        except ValueError as exc:
            return _refuse(400, str(exc), "run")
        if not collector.has_run(run_id):
            return _refuse(404, f"unknown run {run_id!r}", "run")
        q = request.query_params
        unknown = sorted(set(q) - set(PARAMS))
        if unknown:
            return _refuse(400, f"unknown parameter {unknown[0]!r}; parameters are {', '.join(PARAMS)}", unknown[0])
        try:
            event = check_event(q.get("event", "idle"))
        except ValueError as exc:
            return _refuse(400, str(exc), "event")
        try:
            fraction = check_fraction(q.get("fraction", "0.25"))
        except ValueError as exc:
            return _refuse(400, str(exc), "fraction")
        window = None
        if "window" in q:
            try:
                window = int(q["window"])
            except ValueError:
                return _refuse(400, f"window: expected a whole number of samples, got {q['window']!r}", "window")
            if window < 1:
                return _refuse(400, f"window: must be >= 1 sample, got {window}", "window")
        run = Run(collector.run_dir(run_id))
        try:
            pred = await asyncio.to_thread(predict, run, event, fraction, None, window=window)
        except ValueError as exc:  # nothing to sample yet
            return _refuse(409, str(exc))
        finally:
            run.close()
        return JSONResponse(pred.as_dict())

    return [Route("/v1/runs/{run_id}/forecast", forecast, methods=["GET"])]
