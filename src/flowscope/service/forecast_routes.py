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
core: an answer that cost c seconds (the process's CPU time while it was computed, or the wall time when smaller) is
served for up to max(``MIN_AGE_S``, c / ``CPU_SHARE``) seconds. Such an
answer carries the standard ``Age`` header (whole seconds since it was computed). Without ``max_age``, every
answer is computed on what the run holds now.

Whoever reads a run's forecast follows it live, as a page does: for ``FOLLOW_S`` seconds after a request the
collector's acknowledgements of that run's batches say ``"watched": true``, and producers send more often.

The dashboard's panel does not ask again and again: it opens ``/v1/runs/{run}/forecast/live?event&fraction[&window]``
(a WebSocket), which sends the answer, then sends it again each time it changed: when the run moved on (the
dashboard's hub says so; over a store without a collector, its files are looked at every ``LIVE_POLL_S``), computed
as ``max_age=auto`` allows. Every page on the same query shares one computation. While such a socket is open the
run counts as followed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from flowscope.model.provenance import check_run_id
from flowscope.service.auth import cross_site
from flowscope.service.collector import Collector
from flowscope.service.json_text import encode
from flowscope.store.layout import RUN_JSON
from flowscope.store.run import Run

PARAMS = ("event", "fraction", "window", "max_age")
#: the live route's parameters (its answers keep to the CPU share ``max_age=auto`` gives)
LIVE_PARAMS = ("event", "fraction", "window")
#: the live route without a hub (no collector: ``flowscope ui``) looks at the run's files this often (seconds); and
#: after a change it waits this long, so that the batches of one moment fold into one answer
LIVE_POLL_S = 1.0
LIVE_DEBOUNCE_S = 0.25
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
#: the window models' files (flowscope.analysis.forecast.model.MODELS_ENV, named here so that starting a collector
#: does not import the forecast)
MODELS_ENV = "FLOWSCOPE_FORECAST_MODEL"


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


class _Refused(ValueError):
    """A forecast query refused: its HTTP status, message and the field at fault."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field

    def body(self) -> dict:
        return {"error": str(self), **({"field": self.field} if self.field else {})}


def forecast_routes(collector: Collector | StoreRuns, models: dict | None = None, hub=None) -> list[BaseRoute]:
    """The routes to mount on the collector's app (or on the dashboard's, over a store's runs). ``models``: the
    window-size model of each event (:func:`flowscope.analysis.forecast.model.load_models`), by default those
    $FLOWSCOPE_FORECAST_MODEL names (ValueError naming a file that is not one); a query that gives no window takes
    its frame size from the model of its event, else the default (the answer's ``window_source`` and ``note`` say
    which). ``hub``: the dashboard's :class:`~flowscope.service.live_hub.LiveHub`, which says when a run changed
    (the live route; without one it looks at the run's files every ``LIVE_POLL_S``)."""
    loaded: dict = {}

    def forecasting() -> dict:
        """The forecast's functions and window models, imported by the first query rather than when the collector
        starts (pandas and the window model's modules: most runs never show a forecast)."""
        if not loaded:
            from flowscope.analysis.forecast import check_fraction, predict
            from flowscope.analysis.forecast.model import models_from_env
            from flowscope.analysis.forecast.signal import check_event

            loaded.update(check_event=check_event, check_fraction=check_fraction, predict=predict,
                          models=models_from_env() if models is None else models)
        return loaded

    if models is None and os.environ.get(MODELS_ENV):
        forecasting()  # models the environment names are checked as the collector starts (ValueError naming a file)

    kept: OrderedDict[tuple, _Kept] = OrderedDict()
    read_at: dict[str, float] = {}  # run -> when its forecast was last read (monotonic)
    live_readers: dict[str, int] = {}  # run -> pages following its forecast over the live route now

    def following(run_id: str) -> bool:
        if live_readers.get(run_id):
            return True
        t = read_at.get(run_id)
        return t is not None and time.monotonic() - t < FOLLOW_S

    if hasattr(collector, "add_watch_probe"):  # a collector (not `flowscope ui` over a store): producers hear it
        collector.add_watch_probe(following)

    def check_run(run_id: str) -> None:
        try:
            check_run_id(run_id)
        except ValueError as exc:
            raise _Refused(400, str(exc), "run") from None
        if not collector.has_run(run_id):
            raise _Refused(404, f"unknown run {run_id!r}", "run")
        read_at[run_id] = time.monotonic()
        if len(read_at) > KEPT_MAX:  # forget the runs read longest ago
            for old in sorted(read_at, key=read_at.get)[:len(read_at) - KEPT_MAX]:
                del read_at[old]

    def parse(q, allowed: tuple[str, ...] = PARAMS) -> tuple[str, float, int | None, float | str | None]:
        """(event, fraction, window, max_age) of a query, or _Refused naming the field at fault."""
        unknown = sorted(set(q) - set(allowed))
        if unknown:
            raise _Refused(400, f"unknown parameter {unknown[0]!r}; parameters are {', '.join(allowed)}", unknown[0])
        try:
            event = forecasting()["check_event"](q.get("event", "idle"))
        except ValueError as exc:
            raise _Refused(400, str(exc), "event") from None
        try:
            fraction = forecasting()["check_fraction"](q.get("fraction", "0.25"))
        except ValueError as exc:
            raise _Refused(400, str(exc), "fraction") from None
        window = None
        if "window" in q:
            try:
                window = int(q["window"])
            except ValueError:
                raise _Refused(400, f"window: expected a whole number of samples, got {q['window']!r}",
                               "window") from None
            if window < 1:
                raise _Refused(400, f"window: must be >= 1 sample, got {window}", "window")
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
                    raise _Refused(400, f"max_age: expected 'auto' or seconds >= 0, got {q['max_age']!r}", "max_age")
        return event, fraction, window, max_age

    async def answer(run_id: str, event: str, fraction: float, window: int | None,
                     max_age: float | str | None) -> tuple[int, dict, float | None, float | None]:
        """(status, body, age of a kept answer served older than the run or None, seconds until a fresher one may
        be computed or None) of one query: 200 and the prediction, or 409 while the run has nothing to sample."""
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
                if k.version == version:
                    return 200, k.doc, None, None
                return 200, k.doc, age, allowed - age
            run = Run(run_dir)
            t0, cpu0 = time.monotonic(), time.process_time()
            try:
                fc = forecasting()
                pred = await asyncio.to_thread(fc["predict"], run, event, fraction, fc["models"].get(event),
                                               window=window)
            except ValueError as exc:  # nothing to sample yet
                return 409, {"error": str(exc)}, None, None
            finally:
                run.close()
            # its cost to this process: the CPU time, or the wall time when smaller (other threads busy meanwhile);
            # on a machine whose cores other programs take, the wall time of a cheap prediction grows, its CPU does not
            k.doc, k.version, k.at = pred.as_dict(), version, time.monotonic()
            k.cost = min(k.at - t0, time.process_time() - cpu0)
            return 200, k.doc, None, None

    async def forecast(request: Request) -> JSONResponse:
        run_id = request.path_params["run_id"]
        try:
            check_run(run_id)
            event, fraction, window, max_age = parse(request.query_params)
        except _Refused as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        status, body, age, _ = await answer(run_id, event, fraction, window, max_age)
        return JSONResponse(body, status_code=status, headers={"Age": str(int(age))} if age is not None else None)

    async def forecast_live(ws: WebSocket) -> None:
        """The forecast of one query, then again each time its answer changed (the run moved on, and a fresher
        prediction was allowed by the route's CPU share): ``{"type": "forecast", "status": 200, "doc"}`` or
        ``{"type": "forecast", "status": 409, "error"}`` (nothing to sample yet). A refused query gets
        ``{"type": "refused", "status", "error", "field"}`` and the socket is closed."""
        if cross_site(ws.headers):
            await ws.close(code=1008)
            return
        await ws.accept()
        run_id = ws.path_params["run_id"]
        try:
            check_run(run_id)
            event, fraction, window, _ = parse(ws.query_params, LIVE_PARAMS)
        except _Refused as exc:
            await ws.send_text(encode({"type": "refused", "status": exc.status, **exc.body()}))
            await ws.close(code=1000)
            return
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        watched = None
        if hub is not None:
            try:
                watched = await asyncio.to_thread(hub.watch, run_id)
                watched.waiters.add((loop, wake))
            except (ValueError, FileNotFoundError):
                watched = None
        # woken when the run changes only where a collector tells the hub; else its files are looked at
        woken = watched is not None and getattr(hub, "collector", None) is not None
        live_readers[run_id] = live_readers.get(run_id, 0) + 1
        gone = asyncio.ensure_future(ws.receive())
        sent = None
        try:
            while True:
                wake.clear()
                status, body, _, fresher_in = await answer(run_id, event, fraction, window, "auto")
                message = encode({"type": "forecast", "status": status,
                                  **({"doc": body} if status == 200 else body)})
                if message != sent:
                    await ws.send_text(message)
                    sent = message
                # until the run changes (or, with no hub, until its files may have), or a fresher answer is due
                waits = {gone, asyncio.ensure_future(wake.wait())}
                timeout = fresher_in if fresher_in is not None else (None if woken else LIVE_POLL_S)
                done, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for f in pending - {gone}:
                    f.cancel()
                if gone in done:
                    return
                await asyncio.sleep(LIVE_DEBOUNCE_S)  # the batches of the next moment fold into one answer
        except (WebSocketDisconnect, OSError):
            return
        finally:
            live_readers[run_id] -= 1
            if not live_readers[run_id]:
                del live_readers[run_id]
            if watched is not None:
                watched.waiters.discard((loop, wake))
            gone.cancel()

    return [Route("/v1/runs/{run_id}/forecast", forecast, methods=["GET"]),
            WebSocketRoute("/v1/runs/{run_id}/forecast/live", forecast_live)]
