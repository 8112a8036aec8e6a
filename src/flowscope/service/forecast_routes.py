"""The collector's forecast endpoint: GET /v1/runs/{run}/forecast?event=idle&fraction=0.25[&window=N].

Without ``window`` the frame size comes from the window-size model of the event asked, when the server was given one
($FLOWSCOPE_FORECAST_MODEL, ``--forecast-model``), else from the documented default.

A thin route over :func:`flowscope.analysis.forecast.predict` on what the run holds so far (a live run's
acknowledged batches, or a finished run): the same JSON as ``flowscope forecast predict RUN --json``. Bad
parameters get 400 ``{"error", "field"}``; an unknown run 404; a run with no executing resource yet 409.

A prediction reads the whole run, so its cost grows with the run. Answers are kept per (run, query): while the
tables the prediction reads (spans, resources, io, run.json) are unchanged the kept answer is the exact one and is
served again. ``max_age=S`` accepts an answer computed up to S seconds ago on older data; ``max_age=auto`` (what
the dashboard's panel asks) lets the route choose, so that recomputing one query takes at most ``CPU_SHARE`` of a
core: an answer that took c seconds is served for up to max(``MIN_AGE_S``, c / ``CPU_SHARE``) seconds. Such an
answer carries the standard ``Age`` header (whole seconds since it was computed). Without ``max_age``, every
answer is computed on what the run holds now.

Whoever reads a run's forecast follows it live, as a page does: for ``FOLLOW_S`` seconds after a request the
collector's acknowledgements of that run's batches say ``"watched": true``, and producers send more often.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from flowscope.model.provenance import check_run_id
from flowscope.service.collector import Collector
from flowscope.store.layout import RUN_JSON
from flowscope.store.run import Run

PARAMS = ("event", "fraction", "window", "max_age")
#: ``max_age=auto``: the share of one core recomputing one (run, query) may take, and the shortest age then served
CPU_SHARE = 0.02
MIN_AGE_S = 1.0
#: how many (run, query) answers are kept, the least recently asked dropped first
KEPT_MAX = 256
#: what a prediction reads: a new segment in one of these folders (or run.json rewritten) changes the answer
READS = ("spans", "resources", "io", RUN_JSON)
#: a run whose forecast was read in the last FOLLOW_S seconds is followed live (a rule's or a panel's reader): the
#: collector's acknowledgements say "watched", and producers send their batches more often
FOLLOW_S = 5.0


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


def _version(run_dir: Path) -> tuple:
    """When what a prediction reads last changed (modification times of its tables' folders and run.json)."""
    out = []
    for name in READS:
        try:
            out.append(os.stat(run_dir / name).st_mtime_ns)
        except OSError:
            out.append(None)
    return tuple(out)


class _Kept:
    """The last answer to one (run, query): the document, the data it was computed on, when, and its cost."""

    __slots__ = ("doc", "version", "at", "cost", "lock")

    def __init__(self) -> None:
        self.doc: dict | None = None
        self.version: tuple | None = None
        self.at = 0.0
        self.cost = 0.0
        self.lock = asyncio.Lock()


def forecast_routes(collector: Collector | StoreRuns, models: dict | None = None) -> list[Route]:
    """The routes to mount on the collector's app (or on the dashboard's, over a store's runs). ``models``: the
    window-size model of each event (:func:`flowscope.analysis.forecast.model.load_models`), by default those
    $FLOWSCOPE_FORECAST_MODEL names (ValueError naming a file that is not one); a query that gives no window takes
    its frame size from the model of its event, else the default (the answer's ``window_source`` and ``note`` say
    which)."""
    from flowscope.analysis.forecast import check_fraction, predict
    from flowscope.analysis.forecast.model import models_from_env
    from flowscope.analysis.forecast.signal import check_event

    models = models_from_env() if models is None else models

    kept: OrderedDict[tuple, _Kept] = OrderedDict()
    read_at: dict[str, float] = {}  # run -> when its forecast was last read (monotonic)

    def following(run_id: str) -> bool:
        t = read_at.get(run_id)
        return t is not None and time.monotonic() - t < FOLLOW_S

    if hasattr(collector, "add_watch_probe"):  # a collector (not `flowscope ui` over a store): producers hear it
        collector.add_watch_probe(following)

    async def forecast(request: Request) -> JSONResponse:
        run_id = request.path_params["run_id"]
        try:
            check_run_id(run_id)
        except ValueError as exc:
            return _refuse(400, str(exc), "run")
        if not collector.has_run(run_id):
            return _refuse(404, f"unknown run {run_id!r}", "run")
        read_at[run_id] = time.monotonic()
        if len(read_at) > KEPT_MAX:  # forget the runs read longest ago
            for old in sorted(read_at, key=read_at.get)[:len(read_at) - KEPT_MAX]:
                del read_at[old]
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
        max_age = None
        if "max_age" in q:
            if q["max_age"] == "auto":
                max_age = "auto"
            else:
                try:
                    max_age = float(q["max_age"])
                except ValueError:
                    max_age = -1.0
                if not max_age >= 0:
                    return _refuse(400, f"max_age: expected 'auto' or seconds >= 0, got {q['max_age']!r}", "max_age")
        run_dir = collector.run_dir(run_id)
        key = (run_id, event, fraction, window)
        k = kept.get(key)
        if k is None:
            k = kept[key] = _Kept()
            if len(kept) > KEPT_MAX:
                kept.popitem(last=False)
        kept.move_to_end(key)
        async with k.lock:  # one computation per query at a time; the requests waiting for it get its answer
            version = await asyncio.to_thread(_version, run_dir)
            age = time.monotonic() - k.at
            allowed = 0.0 if max_age is None else max(MIN_AGE_S, k.cost / CPU_SHARE) if max_age == "auto" \
                else max_age
            if k.doc is not None and (k.version == version or age <= allowed):
                headers = {} if k.version == version else {"Age": str(int(age))}
                return JSONResponse(k.doc, headers=headers)
            run = Run(run_dir)
            t0 = time.monotonic()
            try:
                pred = await asyncio.to_thread(predict, run, event, fraction, models.get(event), window=window)
            except ValueError as exc:  # nothing to sample yet
                return _refuse(409, str(exc))
            finally:
                run.close()
            k.doc, k.version, k.at, k.cost = pred.as_dict(), version, time.monotonic(), time.monotonic() - t0
            return JSONResponse(k.doc)

    return [Route("/v1/runs/{run_id}/forecast", forecast, methods=["GET"])]
