"""A run's dashboard pages as one self-contained HTML file: the overview and every analysis page, drawn offline by
the dashboard's own scripts from what the server would send them now (the live view's snapshot, each analysis
view, the forecast of each state), embedded in the file. The file opens without a server; ``#PAGE`` picks the
page. What it shows is the dashboard's, not a second implementation of it. The print layout (``layout="all"``) is
the same file showing every page one after another in one scrolling document.

    from flowscope.report.run_pages import write_run_pages
    write_run_pages(run, "run.html")
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flowscope.report import Progress
from flowscope.report.snapshot import DOC_ID, asset_text, embed_json, inline_script
from flowscope.report.views import PAGES, VIEWS, data_state_graph, graph_layout_doc, view_document, view_signature
from flowscope.store.run import DamagedSegment, Run
from flowscope.ui import static_dir

#: the forecast panel's default share of the resources; the file holds each state's forecast at it
FORECAST_FRACTION = 0.25
#: the file's layouts: one page at a time (``FILE#PAGE``), or every page one after another (the print layout)
LAYOUTS = ("pages", "all")
#: a data-state graph drawn collapsed by group has each group's states in the file up to this many states (about
#: 20 bytes a state and 8 a mutation once deflated; a larger graph's groups expand under flowscope ui)
OFFLINE_GRAPH_STATES = 500_000
#: the page files whose bodies the file carries: overview, analysis page
_PAGE_FILES = {"overview": "run.html", "view": "view.html"}
_SCRIPT = re.compile(r'<script src="/ui/static/([\w.-]+)"></script>')
_BODY = re.compile(r"<body>(.*)</body>", re.DOTALL)


def live_snapshot(run: Run) -> dict:
    """The overview's live view of ``run`` as its socket's first message: the view built from the run's segments,
    with the run's status and end."""
    from flowscope.analysis.live import LiveRun, read_pending

    live = LiveRun(run.meta, run.mappings())
    try:
        for table, sid, path, data in read_pending(run.path, live):
            if isinstance(data, Exception):
                raise DamagedSegment(path, str(data))
            live.apply(table, sid, data)
        snap = live.snapshot()
    finally:
        live.close()
    end = run.meta.get("end_ns")
    return {"type": "snapshot", **snap, "epoch": "offline", "status": run.meta.get("status"),
            "end_s": (end - live.t0_ns) / 1e9 if end else None}


def forecasts(run: Run, fraction: float = FORECAST_FRACTION) -> dict:
    """The forecast panel's answers for each state at ``fraction``, as the forecast route gives them (status, body)."""
    from flowscope.analysis.forecast import predict
    from flowscope.analysis.forecast.signal import EVENTS
    by_event = {}
    for event in EVENTS:  # (each state's signal is drawn from one timeline of the run: Run.memo)
        try:
            by_event[event] = {"status": 200, "body": predict(run, event, fraction, None).as_dict()}
        except ValueError as exc:  # nothing to sample: what the route answers
            by_event[event] = {"status": 409, "body": {"error": str(exc)}}
    return {"fraction": fraction, "by_event": by_event}


def graph_groups(run: Run, view: dict) -> dict | None:
    """What the critical-path page expands a collapsed data-state graph's groups from: the whole laid-out graph
    (:func:`flowscope.report.views.graph_layout_doc`) as deflated JSON in base64 (``data``), or why the file holds it
    not (``omitted``); None when the page draws every state already."""
    graph = ((view.get("data_states") or {}).get("graph") or {})
    if graph.get("mode") != "groups":
        return None
    states = view["data_states"]["states"]
    if states > OFFLINE_GRAPH_STATES:
        return {"omitted": f"the graph's {states:,} states are more than a file holds "
                           f"({OFFLINE_GRAPH_STATES:,}); open the run with flowscope ui to expand its groups"}
    dsg = data_state_graph(run)  # computed once for the view already (Run.memo)
    text = json.dumps(graph_layout_doc(dsg["layout"]), separators=(",", ":")).encode()
    return {"encoding": "deflate+base64", "data": base64.b64encode(zlib.compress(text, 6)).decode("ascii")}


def run_pages_doc(run: Run, progress: Progress | None = None) -> dict:
    """Everything the file's pages draw: the live view, every analysis and panel view, the forecasts."""
    steps = ["live view", *VIEWS, "forecast"]

    def step(i: int) -> None:
        if progress is not None:
            progress(steps[i], i, len(steps))

    step(0)
    doc = {"run_id": run.run_id, "written_ns": time.time_ns(), "pages": ["", *PAGES], "views": {}, "scripts": {}}
    # the overview's live view shares nothing with the analyses: built beside them, on its own Run (its segment
    # reads and DuckDB's queries let the analyses run meanwhile: 0.5-0.8 s of a 100,000-task run's 9 s)
    own = Run(run.path, run.semantics or None)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="flowscope-live-view") as pool:
            live = pool.submit(live_snapshot, own)
            for i, view in enumerate(VIEWS, 1):
                step(i)
                doc["views"][view] = view_document(run.path, view, view_signature(run.path, view), run)
            doc["graph_groups"] = graph_groups(run, doc["views"]["critical-path"])
            step(len(steps) - 1)
            doc["forecast"] = forecasts(run)
            doc["live"] = live.result()
    finally:
        own.close()
    return doc


def run_pages_html(doc: dict, layout: str = "pages") -> str:
    """The file: the pages' bodies as templates, their scripts (each once) as inert blocks, ``doc`` embedded, and
    ui/static/offline.js, which shows the page the address names (``layout="pages"``), or every page one after
    another (``layout="all"``, the print layout)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    bodies, assets = [], []
    doc = dict(doc, scripts={}, layout=layout)
    for name, file in _PAGE_FILES.items():
        html = (static_dir() / file).read_text(encoding="utf-8")
        body = _BODY.search(html).group(1)
        doc["scripts"][name] = scripts = _SCRIPT.findall(body)
        if name == "overview" and "plotly.min.js" not in scripts:  # the served page loads it once painted
            scripts.insert(1, "plotly.min.js")
        for s in scripts:
            if s not in assets:
                assets.append(s)
        bodies.append(f'<template id="page-{name}">{_SCRIPT.sub("", body)}</template>')
    blocks = [inline_script(asset_text(a)).replace("<script>", f'<script type="text/x-flowscope-asset" '
                                                               f'data-asset="{a}">', 1) for a in assets]
    title = "flowscope run (snapshot)"
    return "\n".join([
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">', f"<title>{title}</title>",
        "<style>" + asset_text("dashboard.css") + "</style>", "</head>\n<body>",
        f'<script type="application/json" id="{DOC_ID}">{embed_json(doc)}</script>',
        *bodies, *blocks, inline_script(asset_text("offline.js")), "</body>\n</html>\n"])


def write_run_pages(run: Run, out: str | Path, progress: Progress | None = None, layout: str = "pages") -> Path:
    """Write the offline file of ``run``'s pages to ``out`` (replaced atomically), in ``layout`` (one of
    :data:`LAYOUTS`); returns its path."""
    out = Path(out)
    text = run_pages_html(run_pages_doc(run, progress), layout)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out
