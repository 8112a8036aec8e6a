"""The compare page (/ui/compare) and its static snapshot (`flowscope compare --html`) in Debian's chromium:
over real Dask runs of one workflow (tests/conftest.py repeated_runs: the last one with a planted slowdown and
GC warnings) the page's cells are the figures the analyses compute on the same tables; over imported StarPU and
OTF2 traces (any source) with markup in their names, nothing of the markup runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import PLANTED_GROUP, PLANTED_SLEEP_S
from test_dashboard import IMG, SCRIPT, _no_markup_ran, _page, browser  # noqa: F401  (fixture)

import flowscope
from flowscope.analysis.compare import compare
from flowscope.analysis.compare_figures import critical_paths, task_coordinates, warnings_and_long_tasks
from flowscope.cli.main import main

#: the least shift of a group's median called a change here (as tests/test_compare.py: robust on a busy machine)
MIN_SHIFT_S = PLANTED_SLEEP_S / 4


def _serve(store: Path):
    proc = subprocess.Popen([sys.executable, "-m", "flowscope", "ui", str(store), "--port", "0", "--no-open"],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        found = re.search(r"dashboard \(read-only\) over .*: (http://\S+)/ui/", line)
        if found:
            return proc, found.group(1)
    proc.terminate()
    pytest.fail("flowscope ui printed no URL")


@pytest.fixture(scope="module")
def pipeline_ui(repeated_runs):
    proc, url = _serve(repeated_runs["store"])
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


def _rendered(pg) -> None:
    pg.wait_for_function("() => window.flowscopeCompare && (flowscopeCompare.renders > 0 || flowscopeCompare.errors.length)",
                         timeout=120_000)
    assert pg.evaluate("() => flowscopeCompare.errors") == []


def _cells(pg, rows: str, *cols: str) -> list[list]:
    return pg.evaluate("""([rows, cols]) => Array.from(document.querySelectorAll(rows)).map(tr =>
        cols.map(c => { const td = tr.querySelector(c); return td ? (td.dataset.value !== undefined ?
            Number(td.dataset.value) : td.textContent) : null; }))""", [rows, list(cols)])


def check_pipeline_page(pg, repeated_runs) -> None:
    """The page's figures against the analyses on the same runs."""
    rs = flowscope.open_store(repeated_runs["store"])
    want = compare(rs, min_shift_s=MIN_SHIFT_S)
    # what changed: the planted group, first, and only it
    got = _cells(pg, "#cmp-changes tbody tr", ".group", ".before", ".after")
    assert [g[0] for g in got] == list(want.changes["group"])
    assert got[0][0] == PLANTED_GROUP
    assert [g[1:] for g in got] == [[pytest.approx(r.median_before_s, rel=1e-9), pytest.approx(r.median_after_s, rel=1e-9)]
                                    for r in want.changes.itertuples()]
    assert pg.evaluate("() => Array.from(document.querySelectorAll('#cmp-changes tbody tr')).map(tr => tr.dataset.changed)") \
        == ["1"] + ["0"] * (len(want.changes) - 1)
    # time per phase: mean and spread
    got = _cells(pg, "#cmp-phases tbody tr", ".mean", ".std")
    assert got == [[pytest.approx(r.mean_s, rel=1e-9), pytest.approx(r.std_s, rel=1e-9, abs=1e-12)]
                   for r in want.phase_summary.itertuples()]
    # ... and each run's own value as a point on its phase
    points = pg.evaluate("() => { const t = document.getElementById('phases-chart').data.find(t => t.name === 'one run');"
                         " return [t.x, t.y]; }")
    per_run = [(ph, getattr(r, ph + "_s")) for r in want.phases.itertuples()
               for ph in ("computation", "communication", "io", "total") if getattr(r, ph + "_s") == getattr(r, ph + "_s")]
    assert points == [[p for p, _ in per_run], [pytest.approx(v, rel=1e-9) for _, v in per_run]]
    # the critical paths side by side
    cp = critical_paths(rs)
    got = _cells(pg, "#cmp-paths tbody tr", ".length")
    assert got == [[pytest.approx(x, rel=1e-9)] for x in cp.runs["length_s"]]
    # warnings against long tasks: the planted run's GC warnings, all while its long tasks ran
    _, _, summary = warnings_and_long_tasks(rs)
    got = _cells(pg, "#cmp-warnings tbody tr", ".warnings", ".during", ".long")
    assert got == [[r.warnings, r.during_long_tasks, r.long_tasks] for r in summary.itertuples()]
    # shown first: the run with the most warnings (the planted run's GC pauses; a baseline run may log one too)
    most = summary.loc[summary["warnings"].idxmax()]
    assert pg.evaluate("() => document.getElementById('warn-run').value") == most["run_id"]
    assert int(pg.evaluate("() => document.getElementById('warnings-chart').dataset.warnings")) == \
        int(most["warnings"]) > 0
    # parallel coordinates: five axes, one line per task of every run
    coords = task_coordinates(rs)
    dims = pg.evaluate("() => document.getElementById('coords-chart').data[0].dimensions.map(d => d.label)")
    assert dims == ["elapsed (s)", "group", "thread", "output (MB)", "duration (s)"]
    assert int(pg.evaluate("() => document.getElementById('coords-chart').dataset.lines")) == len(coords)
    for chart in ("phases-chart", "groups-chart", "paths-chart", "transfers-chart", "io-chart", "order-chart",
                  "placement-chart"):
        assert pg.evaluate(f"() => (document.getElementById('{chart}').data || []).length") > 0, chart


def test_the_compare_page_shows_what_the_analyses_compute(repeated_runs, pipeline_ui, browser):  # noqa: F811
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _page(context)
    pg.goto(f"{pipeline_ui}/ui/compare?name=pipeline&min_shift={MIN_SHIFT_S}")
    _rendered(pg)
    check_pipeline_page(pg, repeated_runs)
    # a selection lives in the URL: the link reopens the page as it was
    first = repeated_runs["run_ids"][0]
    pg.select_option("#io-run", first)
    q = parse_qs(urlsplit(pg.url).query)
    assert q["io"] == [first] and q["name"] == ["pipeline"]
    pg2 = _page(context)
    pg2.goto(pg.url)
    _rendered(pg2)
    assert pg2.evaluate("() => document.getElementById('io-run').value") == first
    io_first = flowscope.open_store(repeated_runs["store"]).sql(f"SELECT count(*) AS n FROM io WHERE run_id = '{first}'")
    assert int(pg2.evaluate("() => document.getElementById('io-chart').dataset.records")) == int(io_first["n"].iloc[0])
    for p in (pg, pg2):
        assert p.errors == [] and p.outside == []
    context.close()


def test_runs_ticked_in_the_list_open_their_comparison(repeated_runs, pipeline_ui, browser):  # noqa: F811
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _page(context)
    pg.goto(f"{pipeline_ui}/ui/")
    pg.wait_for_function("() => window.flowscopeRuns && flowscopeRuns.refreshes > 0")
    assert pg.is_hidden("#compare-selected")
    a, b = repeated_runs["run_ids"][1], repeated_runs["planted"]
    pg.check(f"tr[data-run='{b}'] .pick-run")
    assert pg.is_hidden("#compare-selected")  # one run is not a comparison
    pg.check(f"tr[data-run='{a}'] .pick-run")
    pg.click("#compare-selected")
    _rendered(pg)
    assert parse_qs(urlsplit(pg.url).query)["run"] == [a, b]
    rows = pg.evaluate("() => Array.from(document.querySelectorAll('#cmp-runs tbody tr')).map(tr => "
                       "[tr.dataset.run, tr.querySelector('.set').textContent])")
    assert rows == [[a, "baseline"], [b, "tested"]]
    assert pg.errors == [] and pg.outside == []
    context.close()


def test_a_comparison_naming_nothing_or_a_wrong_field_is_refused_naming_it(pipeline_ui):
    import httpx

    r = httpx.get(f"{pipeline_ui}/v1/ui/compare", timeout=60)
    assert r.status_code == 400 and "name the runs" in r.json()["error"]
    r = httpx.get(f"{pipeline_ui}/v1/ui/compare?name=pipeline&alpha=often", timeout=60)
    assert r.status_code == 400 and r.json()["error"].startswith("alpha:")
    r = httpx.get(f"{pipeline_ui}/v1/ui/compare?run=no-such-run", timeout=60)
    assert r.status_code == 400 and "no-such-run" in r.json()["error"]


def test_the_static_page_of_flowscope_compare_draws_the_same_offline(repeated_runs, browser, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "compare.html"
    assert main(["compare", "--name", "pipeline", "--store", str(repeated_runs["store"]), "--min-shift",
                 str(MIN_SHIFT_S), "--html", str(out), "--json"]) == 0
    import json

    json.loads(capsys.readouterr().out)  # --json still prints only JSON
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = context.new_page()
    errors, outside = [], []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("request", lambda r: None if r.url.startswith(("file://", "data:", "blob:")) else outside.append(r.url))
    pg.goto(out.as_uri())
    _rendered(pg)
    check_pipeline_page(pg, repeated_runs)
    assert errors == [] and outside == []  # no server, no network: everything is in the file
    context.close()


@pytest.fixture(scope="module")
def imported_store(tmp_path_factory, shared_data) -> tuple[Path, list[str]]:
    from flowscope.importers import import_paths

    store = tmp_path_factory.mktemp("compare-imported")
    ids = []
    for name, path, fmt in (("starpu " + IMG, shared_data / "paje" / "starpu-demo" / "paje.trace", "paje"),
                            ("starpu again " + SCRIPT, shared_data / "paje" / "starpu-demo" / "paje.trace", "paje"),
                            ("otf2 " + IMG, shared_data / "otf2" / "ping-pong-otf2" / "traces.otf2", None)):
        ids.append(import_paths([path], store, fmt=fmt, name=name).run_id)
    return store, ids


def test_imported_traces_of_any_source_compare_with_their_markup_shown_as_text(imported_store, browser, tmp_path):  # noqa: F811
    store, ids = imported_store
    proc, url = _serve(store)
    try:
        context = browser.new_context(viewport={"width": 1300, "height": 1000})
        pg = _page(context)
        pg.goto(f"{url}/ui/compare?" + "&".join(f"run={i}" for i in ids))
        _rendered(pg)
        rs = flowscope.open_store(store)
        names = pg.evaluate("() => Array.from(document.querySelectorAll('#cmp-runs tbody .name')).map(td => td.textContent)")
        assert names == list(rs.runs["name"]) and any("<script>" in n for n in names)
        want = compare(rs)
        got = _cells(pg, "#cmp-groups tbody tr", ".tasks")
        assert got == [[r.tasks] for r in want.groups.itertuples()] and len(got) > 0
        # the StarPU trace's critical path comes from its task graph, the MPI trace's has no task graph: it says why
        cp = critical_paths(rs)
        assert cp.runs["length_s"].notna().sum() >= 2
        _no_markup_ran(pg)
        assert pg.errors == [] and pg.outside == []
        # and offline: the names are in the file's embedded JSON, and still only text
        out = tmp_path / "imported.html"
        assert main(["compare", *ids, "--store", str(store), "--html", str(out)]) == 0
        assert "<script>window.pwned" not in out.read_text()
        st = context.new_page()
        st.dialogs = []
        st.on("dialog", lambda d: (st.dialogs.append(d.message), d.dismiss()))
        st.goto(out.as_uri())
        _rendered(st)
        assert st.evaluate("() => window.pwned") is None and st.dialogs == []
        assert st.evaluate("() => document.querySelectorAll('img').length") == 0
        assert st.evaluate("() => Array.from(document.querySelectorAll('#cmp-runs tbody .name')).map(td => td.textContent)") == names
        context.close()
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()
