"""The dashboard's routes: its pages and assets (``/ui/...``), the runs list and a run's live view as JSON
(``/v1/ui/...``), and a WebSocket per run that sends the view and then every change as the collector writes it.

Protocol of ``/v1/ui/runs/{run_id}/live?epoch=E&since=N``: the server sends ``{"type": "snapshot", ...}`` (the
whole view, with its ``seq`` and ``epoch``) unless the page says it has applied ``N`` of epoch ``E`` and the
deltas after ``N`` are still kept, in which case it sends ``{"type": "deltas", "deltas": [...]}``; then one
``deltas`` message per change (or a new snapshot when the page fell too far behind). Each delta has
``seq``; a page applies them in order and reconnects with the last ``seq`` it applied. A message that carries the
task stream's columns is a binary frame (``service/frames.py``), any other is JSON text.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from flowscope.model.provenance import check_run_id
from flowscope.report.pages import PAGES  # the views themselves (pandas, the analyses) on first use
from flowscope.service.auth import cross_site
from flowscope.model.semantics import phase_sql
from flowscope.service.json_text import PageJSON, encode
from flowscope.service.live_hub import LiveHub, snapshot_message
from flowscope.store.catalog import list_runs, run_state
from flowscope.store.layout import RUN_JSON, read_json, segment_files
from flowscope.store.run import Run
from flowscope.ui import static_dir

log = logging.getLogger("flowscope.dashboard")

#: without a collector, how often a connected page's run is checked for new segments on disk, seconds
DISK_POLL_S = 1.0
#: an analysis page's view is recomputed at most this often while its run changes (changes meanwhile fold into
#: one recomputation), seconds
VIEW_DEBOUNCE_S = 1.0
#: ... and a view that takes long to compute waits longer: at least its last computation's cost (``cost_s``: the
#: collector's CPU time over it, or its wall time when smaller) divided by this
#: share, so that following a large run keeps each view's recomputation under this share of one core, for every
#: page that follows it together (a page may ask for less with ``?share=``)
VIEW_CPU_SHARE = 0.2
#: the next computation's time is predicted as the last one's times the run's growth since (segments of the tables
#: the view reads), at most this factor: a prediction without a bound would hold the view back for ever while a
#: run grows faster than its analysis can follow, and long after it finished; at ten, a cheap view of a young run
#: (the overview's memory panel) waited minutes on a busy machine
VIEW_GROWTH_CAP = 3.0
#: the share the overview's panels (advisor, memory) ask for with ``?share=panel``: they are open whenever a run's
#: overview is, and with the forecast panel (service/forecast_routes.py, CPU_SHARE) and the live view keep the
#: dashboard's cost to the collector under a tenth of a core (bench/dashboard.py)
PANEL_CPU_SHARE = 0.02
#: the run's analysis pages (``/ui/runs/RUN_ID/PAGE``), each served by ``view.html`` with the view of that name
VIEW_PAGES = PAGES
#: a running run's findings in the runs list are recomputed at most every this many seconds...
RUNNING_FINDINGS_S = 2.0
#: ... and at most this share of the time (their last computation's time / share)
RUNNING_FINDINGS_SHARE = 0.05
#: views drawn as panels of the run overview (cheap: one query each), computed on a thread of their own so that
#: a long analysis of a page does not hold them back, nor they it
PANEL_VIEWS = ("memory",)
#: the views a run's pages read
VIEW_NAMES = (*VIEW_PAGES, *PANEL_VIEWS)
#: the data-state graphs kept laid out (the runs whose groups were expanded last)
GRAPHS_KEPT = 4


@lru_cache(maxsize=1)
def _plotly_js() -> tuple[bytes, bytes, str]:
    """flowscope's plotly.js (the trace types its pages draw, scripts/plotly-bundle/): its bytes, gzipped once (1.8 MB
    -> about 0.5 MB), its ETag."""
    raw = (static_dir() / "plotly.min.js").read_bytes()
    return raw, gzip.compress(raw, 6, mtime=0), '"' + hashlib.sha256(raw).hexdigest()[:32] + '"'


def _cold_counts(run_dir: Path, cache: dict) -> dict:
    """Tasks, done and warnings of a run nobody watches, read from its tables (cached until a segment is added)."""
    sig = tuple(len(segment_files(run_dir, t)) for t in ("spans", "transitions", "logs"))
    hit = cache.get(run_dir)
    if hit and hit[0] == sig:
        return hit[1]
    run = Run(run_dir)
    try:
        phase = phase_sql(run.mappings(), "t")
        sched = run.sql(f"""SELECT count(DISTINCT task_key) AS n,
                                   count(DISTINCT CASE WHEN {phase} IN ('done', 'erred') THEN task_key END) AS done
                            FROM transitions t WHERE observer = 'scheduler'""").iloc[0]
        if int(sched["n"]):
            tasks, done = int(sched["n"]), int(sched["done"])
        else:
            tasks = done = int(run.sql("SELECT count(*) AS n FROM activity WHERE role = 'task'")["n"].iloc[0])
        warnings = int(run.sql("SELECT count(*) AS n FROM logs WHERE level IN ('warning', 'error')")["n"].iloc[0])
    finally:
        run.close()
    out = {"tasks": tasks, "done": done, "warnings": warnings}
    cache[run_dir] = (sig, out)
    return out


def _growth(segments_now: int, segments_then: int) -> float:
    """How many times a run grew since an analysis of it (its segments of the tables the analysis reads), between
    1 and VIEW_GROWTH_CAP: what that analysis's next computation is predicted to cost, relative to its last."""
    return min(VIEW_GROWTH_CAP, max(1.0, segments_now / max(1, segments_then)))


class _Findings:
    """The summary's findings (``analysis.summary.findings``) of each run, computed in one background thread (a list
    of runs never waits for them) and kept until a segment is added. A running run's, which change with every
    batch, are kept at least RUNNING_FINDINGS_S, or their cost scaled by the run's growth since (at most
    VIEW_GROWTH_CAP-fold) over RUNNING_FINDINGS_SHARE, and shown meanwhile: the list follows the run without its
    thread computing all the time, nor a young run's cheap computation letting a costly one follow at once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._done: dict[Path, tuple] = {}  # run dir -> (signature, messages, when computed, seconds it took)
        self._queued: set[Path] = set()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._clock = clock

    def get(self, run_dir: Path, running: bool = False) -> list[str] | None:
        """The findings' messages (a running run's: maybe a few seconds old), or None while the first are computed."""
        sig = tuple(len(segment_files(run_dir, t)) for t in ("spans", "transitions", "transfers", "dependencies"))
        with self._lock:
            hit = self._done.get(run_dir)
            if hit and hit[0] == sig:
                return hit[1]
            if hit and running:  # their cost scaled by the run's growth since, as the views' (_Views.get)
                grown = _growth(sum(sig), sum(hit[0]))
                fresh_for = max(RUNNING_FINDINGS_S, hit[3] * grown / RUNNING_FINDINGS_SHARE)
                if self._clock() - hit[2] < fresh_for:
                    return hit[1]
            if run_dir not in self._queued:
                self._queued.add(run_dir)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="flowscope-findings")
                self._pool.submit(self._compute, run_dir, sig)
        return hit[1] if hit and running else None

    def _compute(self, run_dir: Path, sig: tuple) -> None:
        from flowscope.analysis.summary import summarize

        t0 = self._clock()
        try:
            run = Run(run_dir)
            try:
                out = [f["message"] for f in summarize(run).findings]
            finally:
                run.close()
        except Exception as exc:  # noqa: BLE001  (a run the analyses cannot read says why, in its row)
            out = [f"no findings: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]
        now = self._clock()
        with self._lock:
            self._done[run_dir] = (sig, out, now, now - t0)
            self._queued.discard(run_dir)


class _Views:
    """The analysis views (``report.views.VIEWS``) of watched runs, each computed by one background thread (the
    analyses never run on the event loop nor side by side with each other; the overview's panel views on a thread
    of their own) and kept until the segments of the
    tables it reads, or the run's status, change; pages of the same run and view share one computation."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._done: dict[tuple, tuple] = {}  # (run_dir, view) -> (signature, doc, computed at)
        self._graphs: dict[Path, tuple] = {}  # run_dir -> (signature, its data-state graph laid out)
        self._locks: dict[tuple, asyncio.Lock] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="flowscope-views")
        self._panel_pool = ThreadPoolExecutor(1, thread_name_prefix="flowscope-panel-views")

    @staticmethod
    def signature(run_dir: Path, view: str) -> tuple:
        """What the view depends on: the run's status, then the number of segments of each table it reads."""
        from flowscope.report.views import view_signature

        return view_signature(run_dir, view)

    def _compute(self, run_dir: Path, view: str, sig: tuple) -> dict:
        from flowscope.report.views import data_state_graph, view_document

        if view != "critical-path":
            return view_document(run_dir, view, sig)
        run = Run(run_dir)
        try:
            doc = view_document(run_dir, view, sig, run)
            graph = (doc.get("data_states") or {}).get("graph") or {}
            if graph.get("mode") == "groups":  # its groups are expanded from the graph this computation laid out
                self._keep_graph(run_dir, sig, data_state_graph(run))
            return doc
        finally:
            run.close()

    def _keep_graph(self, run_dir: Path, sig: tuple, graph: dict | None) -> None:
        self._graphs.pop(run_dir, None)
        self._graphs[run_dir] = (sig, graph)
        while len(self._graphs) > GRAPHS_KEPT:
            self._graphs.pop(next(iter(self._graphs)))

    async def get(self, run_dir: Path, view: str, share: float | None = None) -> tuple[dict, float | None]:
        """The view of the run, and None when it is as the tables are now; or, with ``share``, the view kept
        from a recent computation and in how many seconds a fresher one may be computed: a view followed live
        is recomputed at most once per max(VIEW_DEBOUNCE_S, its predicted cost / ``share``), however many pages
        follow it. The prediction is the last computation's cost (``cost_s``, what it cost this process in CPU:
        a busy machine stretches the wall time of a cheap view, not its cost) scaled by how much the run grew since (the
        segments of the tables the view reads), at most VIEW_GROWTH_CAP-fold: an analysis takes about as long as
        its tables are large, and a young run's cheap first computation must not let a costly one follow at once."""
        key = (run_dir, view)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            sig = await asyncio.to_thread(self.signature, run_dir, view)
            hit = self._done.get(key)
            if share is not None and hit is not None and hit[0] != sig:
                grown = _growth(sum(sig[1:]), sum(hit[0][1:]))
                wait = hit[2] + max(VIEW_DEBOUNCE_S, hit[1]["cost_s"] * grown / share) - self._clock()
                if wait > 0:
                    return hit[1], wait
            if hit is None or hit[0] != sig:
                loop = asyncio.get_running_loop()
                pool = self._panel_pool if view in PANEL_VIEWS else self._pool
                doc = await loop.run_in_executor(pool, self._compute, run_dir, view, sig)
                hit = self._done[key] = (sig, doc, self._clock())
            return hit[1], None

    def _graph(self, run_dir: Path, sig: tuple) -> dict | None:
        """The run's data-state graph as the critical-path view drew it at ``sig`` (kept for the last few runs: the
        view's own computation keeps it, so expanding a group computes nothing the view did not)."""
        from flowscope.report.views import data_state_graph

        hit = self._graphs.get(run_dir)
        if hit is None or hit[0] != sig:
            run = Run(run_dir)
            try:
                hit = (sig, data_state_graph(run))
            finally:
                run.close()
            self._keep_graph(run_dir, sig, hit[1])
        return hit[1]

    async def graph_group(self, run_dir: Path, group: str) -> dict:
        """One group of the run's data-state graph in full (:func:`flowscope.report.views.graph_group_doc`), computed
        on the analyses' thread. KeyError: the run has no data-state graph, or no such group in it."""
        from flowscope.report.views import graph_group_doc

        async with self._locks.setdefault((run_dir, "graph"), asyncio.Lock()):
            sig = await asyncio.to_thread(self.signature, run_dir, "critical-path")
            graph = await asyncio.get_running_loop().run_in_executor(self._pool, self._graph, run_dir, sig)
        if graph is None:
            raise KeyError("the run has no data-state graph (yet)")
        try:
            return graph_group_doc(graph["layout"], group)
        except KeyError:
            raise KeyError(f"no group {group!r} in the data-state graph; its groups: "
                           f"{', '.join(graph['layout'].groups)}") from None


def dashboard_routes(hub: LiveHub) -> list:
    """The dashboard's routes over ``hub``'s store."""
    cold: dict = {}
    findings = _Findings()
    views = _Views()
    pages = static_dir()

    async def index(request) -> Response:
        return RedirectResponse("/ui/", status_code=307)

    async def runs_page(request) -> Response:
        return FileResponse(pages / "runs.html", headers={"cache-control": "no-store"})

    async def run_page(request) -> Response:
        try:
            check_run_id(request.path_params["run_id"])
        except ValueError as exc:
            return PageJSON({"error": str(exc)}, status_code=400)
        return FileResponse(pages / "run.html", headers={"cache-control": "no-store"})

    async def offline_file(request) -> Response:
        """The run's pages as one offline file (``flowscope report``), to save."""
        from flowscope.report.run_pages import run_pages_doc, run_pages_html

        try:
            run_id = check_run_id(request.path_params["run_id"])
        except ValueError as exc:
            return PageJSON({"error": str(exc)}, status_code=400)
        run_dir = hub.store / run_id
        if not (run_dir / RUN_JSON).is_file():
            return PageJSON({"error": f"run: unknown run {run_id!r}"}, status_code=404)

        def build() -> str:
            run = Run(run_dir)
            try:
                return run_pages_html(run_pages_doc(run))
            finally:
                run.close()

        text = await asyncio.to_thread(build)
        return Response(text, media_type="text/html; charset=utf-8",
                        headers={"content-disposition": f'attachment; filename="flowscope-{run_id}.html"',
                                 "cache-control": "no-store"})

    async def view_page(request) -> Response:
        try:
            check_run_id(request.path_params["run_id"])
        except ValueError as exc:
            return PageJSON({"error": str(exc)}, status_code=400)
        if request.path_params["page"] not in VIEW_PAGES:
            return PageJSON({"error": f"page: no page {request.path_params['page']!r}; the pages of a run: "
                                      f"{', '.join(VIEW_PAGES)}"}, status_code=404)
        return FileResponse(pages / "view.html", headers={"cache-control": "no-store"})

    def _view_target(params) -> tuple[str, str]:
        """(run id, view) of a view's route; ValueError naming the field that is wrong."""
        run_id = check_run_id(params["run_id"])
        if params["view"] not in VIEW_NAMES:
            raise ValueError(f"view: no view {params['view']!r}; the views: {', '.join(VIEW_NAMES)}")
        return run_id, params["view"]

    async def view_json(request) -> PageJSON:
        try:
            run_id, view = _view_target(request.path_params)
            w = await asyncio.to_thread(hub.watch, run_id)
        except ValueError as exc:
            return PageJSON({"error": str(exc)}, status_code=400)
        except FileNotFoundError as exc:
            return PageJSON({"error": str(exc)}, status_code=404)
        return PageJSON((await views.get(w.run_dir, view))[0])

    async def graph_group_json(request) -> PageJSON:
        """One group of the run's data-state graph in full: ``?group=NAME``."""
        try:
            run_id = check_run_id(request.path_params["run_id"])
            group = request.query_params.get("group")
            if group is None:
                raise ValueError("group: missing; give ?group=NAME, a group of the critical-path page's graph")
            w = await asyncio.to_thread(hub.watch, run_id)
        except ValueError as exc:
            return PageJSON({"error": str(exc)}, status_code=400)
        except FileNotFoundError as exc:
            return PageJSON({"error": str(exc)}, status_code=404)
        try:
            return PageJSON(await views.graph_group(w.run_dir, group))
        except KeyError as exc:
            return PageJSON({"error": f"group: {exc.args[0]}"}, status_code=404)
        except ValueError as exc:  # the graph's critical path could not be computed (the page says so too)
            return PageJSON({"error": f"the data-state graph: {exc}"}, status_code=422)

    async def changed(wake: asyncio.Event, gone: asyncio.Future) -> bool:
        """Wait until the run changed (``wake``; without a collector, at most DISK_POLL_S) or the page left
        (``gone``); False when it left."""
        waiting = asyncio.ensure_future(wake.wait())
        done, _ = await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED,
                                     timeout=DISK_POLL_S if hub.collector is None else None)
        if not waiting.done():
            waiting.cancel()
        return gone not in done

    async def view_live(ws: WebSocket) -> None:
        """The view, then the view again each time the run changed (at most once per VIEW_DEBOUNCE_S, and for
        a view that is long to compute at most once per its cost / share, for every page together)."""
        if cross_site(ws.headers):
            await ws.close(code=1008)
            return
        try:
            run_id, view = _view_target(ws.path_params)
            asked = ws.query_params.get("share")
            share = PANEL_CPU_SHARE if asked == "panel" else \
                min(VIEW_CPU_SHARE, max(0.01, float(asked or VIEW_CPU_SHARE)))
            w = await asyncio.to_thread(hub.watch, run_id)
        except (ValueError, FileNotFoundError):
            await ws.close(code=1008)
            return
        await ws.accept()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        w.waiters.add((loop, wake))
        gone = asyncio.ensure_future(ws.receive())
        try:
            doc, later = await views.get(w.run_dir, view, share)
            await ws.send_text(encode({"type": "view", "doc": doc}))
            sent = doc["segments"], doc["status"]
            while True:
                if later is None and not await changed(wake, gone):  # up to date: wait for the run to change
                    return
                # the changes of the next VIEW_DEBOUNCE_S (or until a fresher view may be computed) fold into
                # one recomputation
                done, _ = await asyncio.wait({gone}, timeout=VIEW_DEBOUNCE_S if later is None else later)
                if gone in done:
                    return
                wake.clear()
                doc, later = await views.get(w.run_dir, view, share)
                if (doc["segments"], doc["status"]) != sent:
                    await ws.send_text(encode({"type": "view", "doc": doc}))
                    sent = doc["segments"], doc["status"]
        except (WebSocketDisconnect, OSError):
            return
        finally:
            w.waiters.discard((loop, wake))
            gone.cancel()

    async def compare_page(request) -> Response:
        return FileResponse(pages / "compare.html", headers={"cache-control": "no-store"})

    def compare_doc(query) -> dict:
        """The compare page's document for the runs the query names (``run``, ``name``, ``against``,
        ``against_name``, repeatable; ``alpha``, ``min_change``, ``min_shift``); ValueError naming a wrong field."""
        from flowscope.analysis.compare import choose
        from flowscope.report.compare_view import compare_view
        from flowscope.report.views import json_safe
        from flowscope.store.run_set import open_store

        ids, against = query.getlist("run"), query.getlist("against")
        for field, values in (("run", ids), ("against", against)):
            for v in values:
                try:
                    check_run_id(v)
                except ValueError as exc:
                    raise ValueError(f"{field}: {exc}") from None
        options = {}
        for field, key in (("alpha", "alpha"), ("min_change", "min_change"), ("min_shift", "min_shift_s")):
            if query.get(field) not in (None, ""):
                try:
                    options[key] = float(query[field])
                except ValueError:
                    raise ValueError(f"{field}: not a number: {query[field]!r}") from None
        chosen, baseline = choose(open_store(hub.store), ids, query.getlist("name"), against,
                                  query.getlist("against_name"))
        doc = compare_view(chosen, before=baseline or None, **options)
        doc["store"] = str(hub.store)
        return json_safe(doc)

    async def compare_json(request) -> PageJSON:
        try:
            return PageJSON(await asyncio.to_thread(compare_doc, request.query_params))
        except ValueError as exc:
            return PageJSON({"error": str(exc)}, status_code=400)

    async def plotly_js(request) -> Response:
        raw, packed, etag = await asyncio.to_thread(_plotly_js)  # the first call reads and compresses it
        headers = {"cache-control": "max-age=3600", "etag": etag, "vary": "accept-encoding"}
        if etag in (t.strip() for t in request.headers.get("if-none-match", "").split(",")):
            return Response(status_code=304, headers=headers)
        if "gzip" in request.headers.get("accept-encoding", ""):
            return Response(packed, media_type="text/javascript", headers={**headers, "content-encoding": "gzip"})
        return Response(raw, media_type="text/javascript", headers=headers)

    def runs_doc() -> dict:
        out = []
        now = time.time_ns()
        for m in list_runs(hub.store):
            row = {"run_id": m.get("run_id"), "name": m.get("name"), "error": m.get("error"),
                   "status": run_state(m) if "error" not in m else "unreadable", "start_ns": m.get("start_ns"),
                   "end_ns": m.get("end_ns"), "command": m.get("command")}
            start, end = m.get("start_ns"), m.get("end_ns")
            w = hub.watched(row["run_id"]) if row["run_id"] else None
            if w is not None:
                row.update(w.live.counts())
            elif "error" not in m:
                try:
                    row.update(_cold_counts(Path(m["path"]), cold))
                except Exception as exc:  # noqa: BLE001  (a damaged run, whatever the error, must not hide the others)
                    row["error"] = str(exc).splitlines()[0]
            row["duration_s"] = ((end if end else now) - start) / 1e9 if start else None
            if "error" not in m and row["status"] != "importing":
                row["findings"] = findings.get(Path(m["path"]), running=row["status"] == "running")
            out.append(row)
        out.reverse()  # newest first
        return {"store": str(hub.store), "runs": out}

    async def runs_json(request) -> PageJSON:
        return PageJSON(await asyncio.to_thread(runs_doc))

    async def snapshot_json(request) -> PageJSON:
        try:
            w = await asyncio.to_thread(hub.watch, check_run_id(request.path_params["run_id"]))
        except ValueError as exc:
            return PageJSON({"error": str(exc)}, status_code=400)
        except FileNotFoundError as exc:
            return PageJSON({"error": str(exc)}, status_code=404)
        _, snap = await asyncio.to_thread(w.since, None, None)
        return PageJSON(snap)

    async def live(ws: WebSocket) -> None:
        if cross_site(ws.headers):
            await ws.close(code=1008)
            return
        try:
            run_id = check_run_id(ws.path_params["run_id"])
            since = ws.query_params.get("since")
            since = int(since) if since not in (None, "") else None
        except ValueError:
            await ws.close(code=1008)
            return
        try:
            w = await asyncio.to_thread(hub.watch, run_id)
        except FileNotFoundError:
            await ws.close(code=1008)
            return
        await ws.accept()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        w.waiters.add((loop, wake))
        gone = asyncio.ensure_future(ws.receive())  # a closed page ends the wait at once
        try:
            epoch = ws.query_params.get("epoch")
            kind, body = await asyncio.to_thread(w.since, epoch, since, True)
            while True:
                if kind == "snapshot":
                    message = await asyncio.to_thread(snapshot_message, body)
                    epoch, since = body["epoch"], body["seq"]
                elif body is not None:
                    message, since = body  # encoded once for every page (live_hub.Encoded)
                else:
                    message = None
                if isinstance(message, bytes):  # with the stream's columns (service/frames.py)
                    await ws.send_bytes(message)
                elif message is not None:
                    await ws.send_text(message)
                if not await changed(wake, gone):
                    return
                wake.clear()
                if hub.collector is None:
                    await asyncio.to_thread(w.catch_up, True)
                kind, body = w.since(epoch, since, True)
        except (WebSocketDisconnect, OSError):  # the page went away while a message was being sent
            return
        finally:
            w.waiters.discard((loop, wake))
            gone.cancel()

    return [
        Route("/", index, methods=["GET"]),
        Route("/ui", index, methods=["GET"]),
        Route("/ui/", runs_page, methods=["GET"]),
        Route("/ui/compare", compare_page, methods=["GET"]),
        Route("/v1/ui/compare", compare_json, methods=["GET"]),
        Route("/ui/runs/{run_id}", run_page, methods=["GET"]),
        Route("/ui/runs/{run_id}/offline", offline_file, methods=["GET"]),
        Route("/ui/runs/{run_id}/{page}", view_page, methods=["GET"]),
        Route("/ui/static/plotly.min.js", plotly_js, methods=["GET"]),
        Mount("/ui/static", app=StaticFiles(directory=pages), name="ui-static"),
        Route("/v1/ui/runs", runs_json, methods=["GET"]),
        Route("/v1/ui/runs/{run_id}/snapshot", snapshot_json, methods=["GET"]),
        WebSocketRoute("/v1/ui/runs/{run_id}/live", live),
        Route("/v1/ui/runs/{run_id}/views/critical-path/group", graph_group_json, methods=["GET"]),
        Route("/v1/ui/runs/{run_id}/views/{view}", view_json, methods=["GET"]),
        WebSocketRoute("/v1/ui/runs/{run_id}/views/{view}/live", view_live),
    ]


def dashboard_app(store: str | Path):
    """The dashboard alone over ``store``, read-only (``flowscope ui``): no ingest, nothing written; with the
    forecast route its overview's forecast panel reads."""
    from starlette.applications import Starlette

    from flowscope.service.forecast_routes import StoreRuns, forecast_routes

    hub = LiveHub(Path(store))
    return Starlette(routes=[*dashboard_routes(hub), *forecast_routes(StoreRuns(Path(store)), hub=hub)])
