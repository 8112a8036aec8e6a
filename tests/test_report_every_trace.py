"""Every trace in the shared data folder, imported, reported and opened in headless Chromium.

For each trace flowscope's own format detection finds in the folder (so a trace added there gets these tests),
each report section whose data the run's tables hold is drawn with content -- marks, boxes, bars, table rows
counted in the page, not just a div -- and each section whose data is absent says what would supply it.
``flowscope show RUN --json`` gives the breakdown and the critical path: a path wherever the run has units of work
(tasks, spans on resources that execute, timed I/O operations), messages or data states, else the reason, which the
report's critical-path section says too. WfCommons instances: the structural critical path the report shows is
networkx's longest runtime-weighted path through the instance's DAG. Darshan logs with DXT: the measured path is
the I/O timeline of the rank whose I/O ended last, checked against the log's operations.

Every trace is covered except in the Darshan release logs: 36 near-identical logs of one 4-process mpi-io-test job,
one per Darshan release 3.0.0-3.5.0 on x86_64 and ppc64. Their runs have the same tables with the same kinds of rows,
so the report draws the same sections for each; what differs between them is how the importer reads each version's
format, which tests/test_darshan.py and tests/test_io_summary.py check on all 36. Here the newest log of each release
series (major.minor) per architecture stands for its series (:func:`sample`: 8 logs, chosen by name, so the same
ones each time), which spares about 28 report files of four page loads each.
Of the traces of one folder whose tables have the same shape (which sections have data, what the stream draws),
the report of the first is opened (:func:`report_shape`); every trace is still imported and its `flowscope show
--json` checked. One browser tab serves the module; each trace is imported and its report opened at most once
(module-scoped caches shared by the tests).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_browser, shared_data_dir

import flowscope
from flowscope.importers import TraceError, content_files, expand, import_paths

DATA = shared_data_dir()

#: traces the shared data's README says are broken on purpose: their import must be refused, saying where
INVALID = {"paje/pajeng/native_paje.trace": "pajeng's own test expects pj_dump to fail on it"}

#: files in the folder that are not traces: documentation and licences, the sources and build notes of the
#: StarPU demo, StarPU's own records beside its Paje trace (tasks.rec, data.rec, trace.rec, dag.dot: read with
#: it), a Score-P configuration. An OTF2 archive's member files are found through the importer.
COMPANION = re.compile(r"(^|/)(README[^/]*|LICENSE[^/]*|HOWTO[^/]*|MANIFEST[^/]*)$|\.(md|txt|c|cfg|rec|dot)$")

#: the sections the overview shows (the task stream, the hosts' CPU and memory): with no data it draws none, and
#: does not yet say what would supply it
OVERVIEW = {"task-stream", "hardware"}

#: per section: what a "No data" message must name as the thing that would supply the missing data
SUPPLIED_BY = {
    "breakdown": r"flowscope semantics",
    "task-stream": r"OTF2|Paje|Chrome",
    "task-states": r"Dask.*Parsl",
    "hardware": r"hardware sampler",
    "io": r"Darshan",
    "io-summary": r"Darshan",
    "communication": r"MPI|flows",
    "task-groups": r"OTF2|Paje|Chrome",
    "profile": r"OTF2|Chrome",
    "critical-path": r"dependencies|messages",
    "warnings": r"Client\.log|warning",
}


#: a folder of near-identical logs, one per release, named ``<job>-<architecture>-<version>.darshan``
RELEASE_LOGS = re.compile(r"^darshan/release_logs/.*-(?P<arch>[^-]+)-(?P<series>\d+\.\d+)\.(?P<patch>\d+)(?P<pre>-[^.]+)?"
                          r"\.darshan$")


def sample(traces: list[str]) -> list[str]:
    """``traces`` with the Darshan release logs cut to the newest release of each series per architecture."""
    newest: dict[tuple[str, str], tuple[tuple[int, int], str]] = {}
    out = []
    for t in traces:
        m = RELEASE_LOGS.match(t)
        if m is None:
            out.append(t)
            continue
        rank = (int(m["patch"]), 0 if m["pre"] else 1)  # 3.4.0-pre1 comes before 3.4.0
        key = (m["arch"], m["series"])
        if key not in newest or rank > newest[key][0]:
            newest[key] = (rank, t)
    return sorted(out + [t for _, t in newest.values()])


def _discover() -> list[str]:
    if not DATA.is_dir():
        return []
    todo, _ = expand([DATA])
    return sample(sorted(p.relative_to(DATA).as_posix() for p, _ in todo))


TRACES = _discover()
# without the folder, one placeholder whose test asks for the ``shared_data`` fixture: skipped with the reason
# (failed under CI, FLOWSCOPE_REQUIRE_SHARED_DATA=1)
PARAMS = TRACES or ["(shared data folder absent)"]
VALID = [t for t in PARAMS if t not in INVALID]
WFCOMMONS = [t for t in TRACES if t.startswith("wfinstances/")] or ["(shared data folder absent)"]


# ---- fixtures: one import per trace, one browser --------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(rel)``: the run of the trace ``rel``, imported on first use."""
    store = tmp_path_factory.mktemp("every-trace")
    cache: dict[str, flowscope.Run] = {}

    def get(rel: str) -> flowscope.Run:
        if rel not in cache:
            cache[rel] = flowscope.open_run(import_paths([DATA / rel], store).run_dir)
        return cache[rel]

    return get


@pytest.fixture(scope="module")
def browser():
    """The module's Chromium (tests/conftest.py): each report opens in a page of its own, closed after it."""
    return shared_browser()


@pytest.fixture(scope="module")
def pages(runs, browser, tmp_path_factory):
    """``pages(rel)``: what the report (the pages file) of the trace ``rel`` draws (:func:`page_sections`), opened
    on first use."""
    from flowscope.report import write_report

    out = tmp_path_factory.mktemp("reports")
    cache: dict[str, dict] = {}
    tab = _ReportPage(browser)  # one tab for every report: a new one started a renderer process per trace

    def get(rel: str) -> dict[str, dict]:
        if rel not in cache:
            cache[rel] = page_sections(tab, write_report(runs(rel), out / f"{len(cache)}.html"), runs(rel))
        return cache[rel]

    yield get
    tab.page.close()


#: what each section of an analysis page holds: its figures with the marks drawn in each, the rows of its tables,
#: its "No data" messages, its text. Marks: scatter markers, line segments, bars of non-zero size, flame-graph boxes,
#: heat-map images, points of WebGL traces (drawn on a canvas).
SECTIONS_JS = """() => {
  const marks = (gd) => {
    let n = 0;
    gd.querySelectorAll('.scatterlayer .trace').forEach(t => {
      n += t.querySelectorAll('path.point').length;
      t.querySelectorAll('path.js-line').forEach(p => { n += ((p.getAttribute('d') || '').match(/M/g) || []).length; });
    });
    gd.querySelectorAll('.barlayer .point path').forEach(p => {
      const d = p.getAttribute('d') || ''; if (d && d !== 'M0,0Z') n += 1; });
    n += gd.querySelectorAll('g.slice').length;
    n += gd.querySelectorAll('.hm image').length;
    (gd._fullData || []).forEach(t => {
      if (/gl$/.test(t.type) && t.visible === true)
        n += Array.from(t.x || []).filter(v => v !== null && v === v).length; });
    return n;
  };
  return Array.from(document.querySelectorAll('#view > section')).map(s => ({
    id: s.id,
    figures: Array.from(s.querySelectorAll('.js-plotly-plot')).map(d => ({id: d.id, marks: marks(d)})),
    undrawn: Array.from(s.querySelectorAll('div.plot:not(.js-plotly-plot)')).map(d => d.id),
    rows: Array.from(s.querySelectorAll('table')).filter(t => t.tBodies.length).map(t => t.tBodies[0].rows.length),
    nodata: Array.from(s.querySelectorAll('p.nodata')).map(p => p.innerText),
    text: s.innerText,
  }));
}"""

ALL_DRAWN_JS = """() => window.flowscopeView && flowscopeView.renders > 0 && (window.Plotly === undefined || (
  document.querySelectorAll('.plot').length === document.querySelectorAll('.js-plotly-plot').length &&
  Array.from(document.querySelectorAll('.js-plotly-plot')).every(d => d.calcdata)))"""

#: the report's sections (as the one page had them) -> the sections of the pages file's analysis pages that show
#: them (the task stream and the hosts' CPU and memory are the overview's)
SECTIONS = {
    "breakdown": ("profile", ("pf-breakdown", "pf-utilisation")),
    "task-stream": ("", ()),
    "task-states": ("charts", ("ch-task-states",)),
    "hardware": ("", ()),
    "io": ("charts", ("ch-io",)),
    "io-summary": ("charts", ("ch-io-summary",)),
    "communication": ("charts", ("ch-communication",)),
    "task-groups": ("profile", ("pf-groups",)),
    "profile": ("profile", ("pf-hot", "pf-flame")),
    "critical-path": ("critical-path", ("cp-none", "cp-task", "cp-messages", "cp-data")),
    "warnings": ("charts", ("ch-warnings",)),
}


#: what the overview's stream draws: the run's tasks and calls; with neither, its states; with none of those, its
#: other spans (the roles of the model's vocabulary, docs/data-model.md)
STREAM_CLASSES = {"tasks": ("task", "call"), "states": ("state",), "spans": ("other",)}


def stream_drawn(run) -> tuple[int, str]:
    """How many spans the overview's stream draws and what it calls them (tasks, states or spans), from the run's
    ``activity`` view."""
    by_role = dict(run.sql("SELECT role, count(*) FROM activity GROUP BY role").values.tolist())
    for unit, roles in STREAM_CLASSES.items():
        n = sum(int(by_role.get(r, 0)) for r in roles)
        if n:
            return n, unit
    return 0, "tasks"


class _ReportPage:
    """One Chromium page for the reports, offline: a request leaving the file is refused and noted in
    ``external``; the page's errors and console errors are noted in ``errors`` (both emptied by :meth:`clear`).
    Each view is opened by a whole load of the file (as following a link to ``#PAGE`` reloads it), one page after
    another in the same tab."""

    def __init__(self, browser):
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors: list[str] = []
        self.external: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

        def block(route):
            self.external.append(route.request.url)
            route.abort()

        self.page.route(re.compile(r"^(?!file:|data:|blob:|about:).*"), block)

    def clear(self) -> None:
        """Forget the errors and requests noted so far (another report is opened next)."""
        self.page.goto("about:blank")  # the last report's page unloaded first: what it still does is its own
        self.errors.clear()
        self.external.clear()

    def open(self, url: str, wait: str):
        """The file loaded afresh at ``url``, once ``wait`` holds in it."""
        # through about:blank, so that a URL differing from the last only in its hash is a whole load too
        self.page.goto("about:blank")
        # a 2 MB page on a machine shared with other work can take long to load: wait for it, not for a time
        self.page.goto(url, wait_until="load", timeout=600_000)
        self.page.wait_for_function(wait, timeout=600_000)
        return self.page


def page_sections(tab: _ReportPage, report: Path, run) -> dict[str, dict]:
    """The report of ``run``, its pages opened in ``tab`` (offline: a request leaving the file fails the test):
    per section of :data:`SECTIONS`, what :data:`SECTIONS_JS` finds on the analysis pages that show it, merged; the
    overview's stream (its marks, and the spans it holds once the file's one snapshot is applied) and host
    charts."""
    uri = report.resolve().as_uri()
    found: dict[str, dict] = {}
    tab.clear()
    for view in ("profile", "charts", "critical-path"):
        page = tab.open(f"{uri}#{view}", ALL_DRAWN_JS)
        assert page.evaluate("() => location.hash") == f"#{view}"
        found.update({s["id"]: s for s in page.evaluate(SECTIONS_JS)})
        own = page.evaluate("() => flowscopeView.errors")
        assert not tab.errors and not own, (view, tab.errors, own)
        assert not tab.external, tab.external
    # the file's one snapshot is applied whole when the status is: what the stream holds then is all it holds;
    # and the counters above the stream are written by the page's next drawing (up to 250 ms later), the one
    # whose status badge shows that status
    page = tab.open(uri, "() => { const s = window.flowscopeLive && flowscopeLive.summary(); "
                         "const st = flowscopeOffline.doc.live.status; "
                         "return s && s.status === st && document.querySelector('#run-status').textContent === st; }")
    held = page.evaluate("() => flowscopeLive.summary().stream")
    # the stream's marks: its tasks and calls, and its transfers (red, on the workers' own rows)
    stream = page.evaluate("() => { const t = flowscopeLive.timeline; return t ? t.count + (t.xfer ? t.xfer.n : 0) : 0; }")
    hosts = page.evaluate("() => { const d = document.getElementById('hosts'); return d && d.data ? "
                          "d.data.reduce((n, t) => n + (t.y ? t.y.length : 0), 0) : 0; }")
    counted = page.locator("#stream-count").inner_text()
    assert not tab.errors, tab.errors
    assert not tab.external, tab.external
    out: dict[str, dict] = {}
    for sid, (_view, parts) in SECTIONS.items():
        got = [found[p] for p in parts if p in found]
        out[sid] = {"figures": [f for g in got for f in g["figures"]], "undrawn": [u for g in got for u in g["undrawn"]],
                    "rows": [r for g in got for r in g["rows"]], "nodata": [n for g in got for n in g["nodata"]],
                    "text": "\n".join(g["text"] for g in got)}
    out["task-stream"]["figures"] = [{"id": "stream", "marks": stream, "spans": held}] if stream else []
    out["task-stream"]["text"] = counted
    out["hardware"]["figures"] = [{"id": "hosts", "marks": hosts}] if hosts else []
    # the critical-path page: a path, or the reason there is none (its subsections' own "none yet" are not that)
    cp = out["critical-path"]
    cp["nodata"] = [n for n in cp["nodata"] if n.startswith("No critical path")]
    return out


# ---- what the run's tables hold, read from the tables (not from the report) -----------------------------------

def _n(run, sql: str) -> int:
    return int(run.sql(sql).iloc[0, 0])


#: the run's I/O operations with a start and an end on resources that execute work (not the aggregate rows that
#: total many operations over a window, docs/data-model.md), every layer (an MPI-IO write and its POSIX writes)
TIMED_OPS_SQL = """SELECT i.resource_id, i.start_ns, i.end_ns FROM io i LEFT JOIN executors e
                   ON e.resource_id = i.resource_id
                   WHERE i.resource_id IS NOT NULL AND coalesce(e.executes, TRUE) AND i.end_ns > i.start_ns
                     AND coalesce(json_extract_string(i.attrs, '$.aggregate'), 'false') <> 'true'"""


def holds(run) -> dict[str, int]:
    """Counts of what each report section draws from, from the run's tables and the model's views."""
    counts = run.counts()
    return {
        "spans": counts.get("spans", 0),
        "transfers": counts.get("transfers", 0),
        # busy time of the resources that execute work, in the vocabulary's categories
        "busy": _n(run, """SELECT count(*) FROM activity a LEFT JOIN executors e ON e.resource_id = a.resource_id
                           WHERE coalesce(e.executes, TRUE) AND a.category <> 'idle' AND a.end_ns > a.start_ns"""),
        "executing": _n(run, """SELECT count(DISTINCT a.resource_id) FROM activity a LEFT JOIN executors e
                                ON e.resource_id = a.resource_id WHERE coalesce(e.executes, TRUE)"""),
        "io": counts.get("io", 0),
        "io_marks": _n(run, "SELECT count(*) FROM io WHERE op IN ('read', 'write', 'open')") if counts.get("io") else 0,
        # I/O operations with a start and an end (not totals) on resources that execute work: a Darshan log's DXT
        "timed_io": _n(run, f"SELECT count(*) FROM ({TIMED_OPS_SQL})") if counts.get("io") else 0,
        "sized_transfers": _n(run, "SELECT count(*) FROM transfers WHERE nbytes > 0 AND end_ns > start_ns")
        if counts.get("transfers") else 0,
        "messages": _n(run, """SELECT count(*) FROM transfers WHERE attrs LIKE '%"dst_call"%'""")
        if counts.get("transfers") else 0,
        "dependencies": counts.get("dependencies", 0),
        "transitions": counts.get("transitions", 0),
        "hardware": _n(run, """SELECT count(*) FROM metrics WHERE (namespace = 'hardware' AND name IN
                               ('cpu.percent', 'memory.used_bytes', 'process.cpu.percent', 'process.memory.rss_bytes'))""")
        if counts.get("metrics") else 0,
        "warnings": _n(run, "SELECT count(*) FROM logs WHERE level IN ('warning', 'error')") if counts.get("logs") else 0,
        "data_states": counts.get("data_states", 0) if counts.get("mutations") else 0,
    }


def expected_sections(h: dict[str, int]) -> dict[str, bool]:
    """Per section: whether the run holds its data."""
    return {
        "breakdown": bool(h["busy"] or h["transfers"] or h["io"]),
        "task-stream": bool(h["spans"] or h["transfers"]),
        "task-states": bool(h["transitions"]),
        "hardware": bool(h["hardware"]),
        "io": bool(h["io"]),
        "io-summary": bool(h["io"]),
        "communication": bool(h["transfers"]),
        "task-groups": bool(h["spans"]),
        "profile": bool(h["spans"]),
        "critical-path": bool(h["busy"] or h["timed_io"] or h["messages"] or h["data_states"]),
        "warnings": bool(h["warnings"]),
    }


#: run directory -> the text ``flowscope show RUN --json`` printed: the command runs once per trace, and each test
#: that reads it parses its own copy
_SHOWN: dict[Path, str] = {}


def show_json(run) -> dict:
    """``flowscope show RUN --json``, in this process (the command's own code, its own printing)."""
    from flowscope.cli.main import main

    if run.path not in _SHOWN:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["show", str(run.path), "--json"]) == 0
        _SHOWN[run.path] = out.getvalue()
    return json.loads(_SHOWN[run.path])


# ---- tests -------------------------------------------------------------------------------------------------------

def test_the_folder_holds_only_traces_and_their_companions(shared_data):
    """Every file of the shared folder is either a trace flowscope detects (and so gets the tests below), a
    member of a detected OTF2 archive, or a companion file named in :data:`COMPANION`: a trace in a format
    flowscope does not detect cannot slip through untested."""
    todo, skipped = expand([shared_data])
    assert todo, "no trace found"
    members = {m.resolve() for p, fmt in todo for m in content_files(p, fmt)}
    untested = [s for s in skipped if Path(s).resolve() not in members
                and not COMPANION.search(Path(s).relative_to(shared_data).as_posix())]
    assert not untested, f"files no importer claims and no rule explains: {untested}"
    assert set(INVALID) <= set(TRACES), "a file named broken on purpose is no longer there"


@pytest.mark.parametrize("rel", [t for t in PARAMS if t in INVALID] or ["(shared data folder absent)"])
def test_a_trace_broken_on_purpose_is_refused_saying_where(shared_data, tmp_path, rel):
    with pytest.raises(TraceError) as err:
        import_paths([shared_data / rel], tmp_path / "store")
    assert Path(rel).name in str(err.value), str(err.value)
    assert re.search(rf"{re.escape(Path(rel).name)}:\d+|line \d+|byte \d+|offset \d+", str(err.value)), str(err.value)


def report_problems(run, got: dict[str, dict]) -> list[str]:
    """What is wrong with what the report of ``run`` draws (``got``, :func:`page_sections`): a section with data
    drawn empty, one without data that does not say what would supply it, counts that are not the run's."""
    from flowscope.analysis.breakdown import breakdown, task_groups

    h = holds(run)
    want = expected_sections(h)
    if list(SECTIONS) != list(got):
        return [f"sections {list(got)}, not {list(SECTIONS)}"]
    stream, unit = stream_drawn(run)  # what the overview's stream draws: tasks and calls, else states, else others
    problems: list[str] = []  # every problem of this trace's report, not only the first

    def check(ok, sid: str, what: str) -> None:
        if not ok:
            problems.append(f"{sid}: {what}")

    for sid, has in want.items():
        s = got[sid]
        if not has and sid in OVERVIEW:  # the overview draws no stream / host chart (and says nothing of why)
            check(not s["figures"], sid, f"holds no data but draws {s['figures']}")
            continue
        if not has:
            check(s["nodata"], sid, f"holds no data but draws {s['figures']} {s['rows']}")
            if sid == "critical-path":  # the reason `flowscope show --json` gives, word for word
                reason = show_json(run)["critical_path"]["reason"].removeprefix("No critical path: ")
                check(s["nodata"] and reason in s["nodata"][0], sid, f"says {s['nodata'][:1]}, not {reason!r}")
            check(s["nodata"] and re.search(SUPPLIED_BY[sid], s["nodata"][0]), sid,
                  f"does not say what would supply its data: {s['nodata'][:1]}")
            continue
        check(not s["nodata"], sid, f"says {s['nodata']} though the run holds {({k: v for k, v in h.items() if v})}")
        check(not s["undrawn"], sid, f"figures Plotly did not draw: {s['undrawn']}")
        check(all(f["marks"] for f in s["figures"]), sid, f"a figure without a mark: {s['figures']}")
        check(s["figures"] or any(s["rows"]), sid, "neither a figure nor a table row")
        if sid != "critical-path":  # (its attribution tables list only the parts with time)
            check(all(s["rows"]), sid, f"a table without rows: {s['rows']}")

    # what each section must show when its data is there, counted
    b, cp = got["breakdown"], got["critical-path"]
    times = breakdown(run)
    if any((times.compute_s, times.communication_s, times.io_s, times.wait_s, times.runtime_s, times.other_s)):
        check(b["figures"], "breakdown", "time in some category, no breakdown chart")
    if h["busy"]:
        check("Utilisation per executing resource" in b["text"] and b["rows"]
              and b["rows"][-1] == min(50, h["executing"]), "breakdown",
              f"utilisation rows {b['rows']}, not one per executing resource ({h['executing']})")
    if stream:
        check(got["task-stream"]["figures"] and got["task-stream"]["figures"][0]["marks"], "task-stream", "no bars")
        check(got["task-stream"]["figures"] and got["task-stream"]["figures"][0]["spans"] == stream, "task-stream",
              f"holds {got['task-stream']['figures'][:1]}, not the run's {stream} {unit}")
        check(got["task-stream"]["text"] == f"({stream:,} {unit})", "task-stream",
              f"counted as {got['task-stream']['text']!r}, not {stream:,} {unit}")
    elif h["transfers"]:  # transfers alone: the stream draws them between the rows of their ends
        drawn = got["task-stream"]["figures"][0]["marks"] if got["task-stream"]["figures"] else 0
        check(drawn == h["transfers"] and got["task-stream"]["text"] == f"({h['transfers']:,} transfers)",
              "task-stream", f"{drawn} transfers drawn, counted as {got['task-stream']['text']!r}, of {h['transfers']}")
    if h["io_marks"]:
        check(got["io"]["figures"], "io", "no marks per thread")
    if h["io"]:
        s = got["io-summary"]
        check(s["figures"] and s["rows"] and s["rows"][0] > 0, "io-summary", "no chart or no row per interface")
    if h["sized_transfers"]:
        check(got["communication"]["figures"], "communication", "transfers with a size and a duration, no chart")
    if h["transfers"]:
        check(got["communication"]["rows"] and got["communication"]["rows"][0] > 0, "communication",
              "no table of the transfers")
    if h["spans"]:
        groups = task_groups(run)
        check(got["task-groups"]["rows"] == [len(groups)], "task-groups",
              f"rows {got['task-groups']['rows']} for {len(groups)} groups")
        check(got["profile"]["figures"] and got["profile"]["rows"] and got["profile"]["rows"][-1] > 0, "profile",
              "no flame graph or no hottest paths")
    if want["critical-path"]:
        check(any(f["id"] in ("cp-task-chart", "cp-messages-chart", "cp-data-chart") and f["marks"]
                  for f in cp["figures"]) and any(cp["rows"]), "critical-path",
              "no attribution chart or no steps of a path")
    if h["timed_io"] and not h["busy"]:
        check("Measured critical path" in cp["text"] and re.search(r"\bio\b", cp["text"]), "critical-path",
              "timed I/O operations, no measured path through I/O")
        # what the path is, as `flowscope show` says it: the I/O timeline of the rank whose I/O ended last
        shown = show_json(run)["critical_path"]
        said = (f"through {shown['measured_tasks']:,} I/O operations: the I/O timeline of "
                f"{shown['measured_end_location']}, the resource whose I/O ended last")
        check(said in cp["text"], "critical-path", f"does not say {said!r}")
    if want["critical-path"] and not h["timed_io"] and show_json(run)["critical_path"].get("units") == "tasks":
        check(re.search(r"through [\d,]+ tasks", cp["text"]), "critical-path", "a path through tasks, not said so")
    if h["messages"]:
        check("Critical path through messages" in cp["text"]
              and any(f["id"] == "cp-messages-chart" and f["marks"] for f in cp["figures"]),
              "critical-path", "no path through the messages drawn")
    return problems


def family(rel: str) -> str:
    """The folder a trace came from, its tool and suite: ``chrome/catapult``, ``paje/pajeng``, ``wfinstances``..."""
    parts = rel.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def report_shape(run) -> tuple:
    """What the report's drawing of ``run`` depends on: which sections have data (the kinds of rows its tables
    hold), what the overview's stream draws, and whether the utilisation table is cut at 50 rows."""
    h = holds(run)
    return tuple(sorted(k for k, v in h.items() if v)), stream_drawn(run)[1], h["executing"] > 50


FAMILIES = sorted({family(t) for t in VALID}) if TRACES else ["(shared data folder absent)"]


@pytest.mark.parametrize("fam", FAMILIES)
def test_the_report_draws_each_section_the_trace_has_data_for(shared_data, runs, pages, fam):
    """The report of each trace of the folder ``fam`` whose tables have a shape no earlier trace of the folder had
    (:func:`report_shape`), opened in Chromium, checked by :func:`report_problems`. Traces of one folder with one
    shape are read by the same importer code and drawn by the same report code, differing in their numbers; a page
    load of a 2 MB report costs about a second under the suite's load, and the 20 Catapult traces have 4 shapes,
    the 14 of pajeng 3 (the folder's other checks, `flowscope show --json` above all, still run on every trace)."""
    problems: list[str] = []
    shapes: dict[tuple, str] = {}
    for rel in [t for t in VALID if family(t) == fam]:
        run = runs(rel)
        shape = report_shape(run)
        if shape in shapes:
            continue
        shapes[shape] = rel
        problems += [f"{rel}: {p}" for p in report_problems(run, pages(rel))]
    assert shapes, f"no trace in {fam}"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("rel", VALID)
def test_show_json_gives_the_breakdown_and_the_critical_path(shared_data, runs, rel):
    run = runs(rel)
    h = holds(run)
    doc = show_json(run)
    assert "breakdown" in doc and "critical_path" in doc
    b, cp = doc["breakdown"], doc["critical_path"]
    assert isinstance(cp, dict), cp  # a path, or the reason there is none: never a bare null
    if h["busy"]:
        assert b["categories"] and sum(b["categories"].values()) > 0 and b["makespan_s"] > 0, b
    if h["busy"] or h["timed_io"]:
        assert not cp.get("error") and (cp.get("measured_ns") or cp.get("structural_ns")), cp
    elif not (h["messages"] or h["data_states"]):
        # no units of work, no messages, no data states: the reason, naming what the run holds instead
        assert set(cp) == {"path", "reason"} and cp["path"] is None, cp
        reason = cp["reason"]
        assert reason.startswith("No critical path: ") and re.search(r"dependencies|messages", reason), reason
        if h["spans"]:
            assert f"its {h['spans']:,} spans" in reason, reason
        if h["io"]:
            assert f"its {h['io']:,} I/O records are totals" in reason and "DXT_ENABLE_IO_TRACE=1" in reason, reason
        if h["transfers"]:
            assert f"its {h['transfers']:,} transfers" in reason, reason
        if not (h["spans"] or h["io"] or h["transfers"]):
            assert "it holds no timed work" in reason, reason
    if h["io"]:
        assert b["io_read_bytes"] + b["io_write_bytes"] > 0 or b["io_s"], b
    if h["messages"]:
        assert cp["messages"]["length_ns"] > 0 and cp["messages"]["messages"] > 0, cp
    if h["dependencies"] and h["busy"] and cp["units"] == "tasks":
        # a task graph's structural path follows its dependencies: each step is an edge of the run's graph (the
        # dependencies of a call trace -- OTF2 messages, Chrome flows -- link inner calls, not its units of work:
        # the path through messages above covers them)
        ids = cp["structural_ids"]
        edges = set(zip(run.table("dependencies")["depends_on"], run.table("dependencies")["task_key"]))
        assert len(ids) > 1 and all((a, b_) in edges for a, b_ in itertools.pairwise(ids)), ids
    if not (h["spans"] or h["io"] or h["transfers"] or h["data_states"]):
        assert doc["nothing_observed"], "a run that holds no work says why"


@pytest.mark.parametrize("rel", WFCOMMONS)
def test_wfcommons_structural_path_is_networkxs_longest_path(shared_data, runs, pages, rel):
    """The report's and show's structural critical path equal networkx's dag_longest_path_length over the
    instance's runtimes, read from the instance with json.load."""
    from test_wfcommons import _nx_longest, reference

    from flowscope.report.views import STEP_LIMIT, critical_path_view

    longest = _nx_longest(reference(shared_data / rel))
    run = runs(rel)
    cp = show_json(run)["critical_path"]
    assert cp["structural_ns"] / 1e9 == pytest.approx(longest, rel=1e-9, abs=1e-6)
    shown = critical_path_view(run)["task_path"]  # what the critical-path page draws
    assert shown["kind"] == "structural" and shown["length_s"] == pytest.approx(longest, rel=1e-9, abs=1e-6)
    got = pages(rel)["critical-path"]
    assert f"Structural critical path (task times derived) " in got["text"]
    assert f"through {len(cp['structural_ids']):,} tasks" in got["text"]
    assert got["rows"][-1] == min(STEP_LIMIT, len(cp["structural_ids"])), "one row per task of the path"


DARSHAN = [t for t in VALID if t.startswith("darshan/")] or ["(shared data folder absent)"]


def _union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """The length of the union of the intervals [start, end)."""
    order = np.argsort(start, kind="stable")
    total, cur_s, cur_e = 0, None, None
    for s, e in zip(start[order].tolist(), end[order].tolist()):
        if cur_e is None or s > cur_e:
            total += (cur_e - cur_s) if cur_e is not None else 0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0)


def _latest_end_starting_by(start: np.ndarray, end: np.ndarray, x: np.ndarray, side: str) -> np.ndarray:
    """Per point of ``x``: the largest end among the intervals [start, end] starting at or before it (``side``
    "right") or before it ("left"), int64's least where none does (a DXT log's operations number 10^5)."""
    order = np.argsort(start, kind="stable")
    ends = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(end[order].astype(np.int64))])
    return ends[np.searchsorted(start[order], x, side=side)]


def _within_some(start: np.ndarray, end: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per interval [a, b]: whether some interval [start, end] holds it whole (start <= a and end >= b)."""
    return _latest_end_starting_by(start, end, a, "right") >= b


def _overlaps_some(start: np.ndarray, end: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per interval [a, b]: whether some interval overlaps it (start < b and end > a)."""
    return _latest_end_starting_by(start, end, b, "left") > a


@pytest.mark.parametrize("rel", DARSHAN)
def test_a_darshan_log_gets_the_io_timeline_of_its_last_rank_or_says_dxt_is_missing(shared_data, runs, rel):
    """A log with DXT: the measured critical path is the I/O timeline of the rank whose I/O ended last, from the
    run's first traced operation: its length is that rank's last end minus the first start, its steps are that
    rank's operations (each within one of its traced operations) and the gaps between them (idle: none of its
    operations runs there), contiguous and in time order, and the I/O on the path is exactly the time that rank
    spent in traced I/O. A log with counters only: the reason, naming DXT."""
    from flowscope.analysis.critical_path import task_graph_paths, work_units

    run = runs(rel)
    h = holds(run)
    cp = show_json(run)["critical_path"]
    if not h["timed_io"]:
        assert cp["path"] is None, cp
        assert ("DXT_ENABLE_IO_TRACE=1" if h["io"] else "it holds no timed work") in cp["reason"], cp
        return
    ops = run.sql(TIMED_OPS_SQL)
    t0, t1 = int(ops["start_ns"].min()), int(ops["end_ns"].max())
    rank = cp["measured_end_location"]
    mine = ops[ops["resource_id"] == rank]
    s_ops, e_ops = mine["start_ns"].to_numpy(np.int64), mine["end_ns"].to_numpy(np.int64)
    assert cp["units"] == "I/O operations" and len(mine) and int(e_ops.max()) == t1, (cp, t1)
    assert cp["measured_ns"] == t1 - t0, (cp, t0, t1)
    comp = cp["measured_components"]
    assert set(comp) <= {"io", "idle"} and sum(comp.values()) == t1 - t0 and comp["io"] > 0, comp
    # the same path, step by step, as the analysis gives it
    steps = task_graph_paths(work_units(run), run.table("dependencies"), run.table("transfers")).measured.steps
    s, e = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    assert s[0] == t0 and e[-1] == t1 and (e >= s).all() and (s[1:] == e[:-1]).all()
    assert set(steps["location"]) == {rank}, set(steps["location"])
    assert set(steps["component"]) <= {"io", "idle"}
    is_io = (steps["component"] == "io").to_numpy()
    outside = np.flatnonzero(is_io & ~_within_some(s_ops, e_ops, s, e))
    assert not len(outside), f"I/O steps in no operation of {rank}: {list(zip(s[outside], e[outside]))[:3]}"
    busy = np.flatnonzero(~is_io & _overlaps_some(s_ops, e_ops, s, e))
    assert not len(busy), f"idle steps overlapping an operation of {rank}: {list(zip(s[busy], e[busy]))[:3]}"
    io_ns = int(steps.loc[steps["component"] == "io", "duration_ns"].sum())
    assert io_ns == comp["io"] == _union_ns(s_ops, e_ops), (io_ns, comp)


@pytest.mark.parametrize("rel", DARSHAN)
def test_a_darshan_log_with_dxt_gets_its_ranks_timeline_makespan_and_utilisation(shared_data, runs, pages, rel):
    """A log with DXT: its traced operations are the ranks' timed work, as for the critical path. The breakdown's
    makespan (`flowscope show --json`) is the span from the first traced operation to the last; each rank's busy
    time in the resource-state timeline is the union of its operations (an MPI-IO write and the POSIX writes within
    it counted once), all of it I/O, and the breakdown's idle time is the rest of the ranks' capacity; utilisation is busy time over one slot per rank times the makespan; the report's
    breakdown draws its chart and one utilisation row per rank. A log without DXT has no timed work: no makespan,
    no utilisation rows."""
    from flowscope.analysis.timeline import resource_states, utilisation_by_resource

    run = runs(rel)
    doc = show_json(run)
    b, util = doc["breakdown"], utilisation_by_resource(run)
    section = pages(rel)["breakdown"]
    ops = run.sql(TIMED_OPS_SQL)
    if not len(ops):
        assert b["makespan_s"] == 0 and util.empty and doc["utilisation"] is None, (b, util)
        assert "Utilisation per executing resource" not in section["text"]
        return
    t0, t1 = int(ops["start_ns"].min()), int(ops["end_ns"].max())
    assert b["makespan_s"] == (t1 - t0) / 1e9 and b["executors"] == ops["resource_id"].nunique(), b
    by = {r: g for r, g in ops.groupby("resource_id")}
    assert sorted(util["resource_id"]) == sorted(by), util
    unions = 0
    for r in util.itertuples():
        g = by[r.resource_id]
        union = _union_ns(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
        assert r.busy_ns == r.io_ns == union > 0 and r.window_ns == t1 - t0, (r, union)
        assert r.slots == 1 and r.utilisation == union / (t1 - t0), r
        unions += union
    # idle is the rest of the ranks' capacity
    assert b["compute_s"] == 0 and b["idle_s"] == pytest.approx(len(by) * (t1 - t0) / 1e9 - unions / 1e9, rel=1e-9), b
    states = resource_states(run)
    assert set(states["state"]) <= {"io", "idle"} and (states["start_ns"].min(), states["end_ns"].max()) == (t0, t1)
    u = doc["utilisation"]
    assert u["busy_ns"] == int(util["busy_ns"].sum()) and u["slots"] == len(by) and u["makespan_ns"] == t1 - t0, u
    assert u["value"] == pytest.approx(u["busy_ns"] / (len(by) * (t1 - t0)), rel=1e-12), u
    assert any(f["id"] == "pf-chart" and f["marks"] for f in section["figures"]), section["figures"]
    assert "Utilisation per executing resource" in section["text"] and section["rows"][-1] == min(50, len(by)), section
