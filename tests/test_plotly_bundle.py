"""The plotly.js flowscope ships: a partial bundle (scripts/plotly-bundle/) holding the trace types its pages draw.

The dashboard serves it, and the report file embeds it, instead of the whole of plotly.js that the plotly package
carries (4.8 MB, about 1.3 s of a page's opening spent evaluating it). So a trace type the pages come to draw must
be in the bundle: each test below fails when the sources name a trace type the bundle does not register.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import shared_browser

from flowscope.report.snapshot import asset_text
from flowscope.ui import static_dir

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "flowscope"
BUNDLE_DIR = ROOT / "scripts" / "plotly-bundle"


def plotly_trace_types() -> set[str]:
    """Every trace type plotly knows (the plotly package's figure validator's)."""
    import plotly.graph_objects as go

    return set(go.Figure()._data_validator.class_strs_map)


def trace_types_in_sources() -> dict[str, set[str]]:
    """The trace types flowscope's sources draw: ``type: "X"`` in its pages' scripts, ``go.X(...)`` and
    ``"type": "X"`` in its Python, each kept where X is a plotly trace type. Source file -> types."""
    known = plotly_trace_types()
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*")):
        if path.suffix not in (".js", ".py") or path.name == "plotly.min.js":
            continue
        text = path.read_text(encoding="utf-8")
        names = set(re.findall(r"""\btype["']?\s*:\s*["'](\w+)["']""", text))
        names |= {n.lower() for n in re.findall(r"\bgo\.([A-Z]\w+)\s*\(", text)}
        names &= known
        if names:
            found[str(path.relative_to(ROOT))] = names
    return found


@pytest.fixture(scope="module")
def registered() -> dict:
    """What the shipped bundle registers, read in Chromium: its version and trace types."""
    page = shared_browser().new_page()
    try:
        page.set_content("<!doctype html><html><body></body></html>")
        page.add_script_tag(content=asset_text("plotly.min.js"))
        return page.evaluate("() => ({version: Plotly.version, traces: Object.keys(Plotly.PlotSchema.get().traces)})")
    finally:
        page.close()


def test_pages_embed_and_serve_the_bundle_flowscope_ships():
    shipped = (static_dir() / "plotly.min.js").read_text(encoding="utf-8")
    assert shipped.startswith("/* plotly.js "), shipped[:80]
    assert asset_text("plotly.min.js") == shipped


def test_the_bundle_registers_every_trace_type_the_pages_draw(registered):
    used = trace_types_in_sources()
    # the sources do name trace types (the scan reads them): at least the stream's, the flame graph's
    assert {"scattergl", "icicle", "bar"} <= set().union(*used.values()), used
    missing = {f: sorted(t - set(registered["traces"])) for f, t in used.items() if t - set(registered["traces"])}
    assert not missing, f"trace types the pages draw that the bundle lacks (add them to traces.json, rebuild): {missing}"


def test_the_bundle_is_what_its_build_declares(registered):
    """traces.json lists exactly what the bundle registers, and the bundle is the plotly.js the build pins."""
    declared = json.loads((BUNDLE_DIR / "traces.json").read_text())
    assert sorted(registered["traces"]) == sorted(declared)
    pinned = json.loads((BUNDLE_DIR / "package.json").read_text())["devDependencies"]["plotly.js"]
    assert registered["version"] == pinned
    assert (static_dir() / "plotly.min.js").read_text(encoding="utf-8").startswith(f"/* plotly.js {pinned} ")


def test_a_figure_of_each_declared_type_draws_in_chromium(registered):
    """Each trace type of the bundle draws a figure with data in a real browser (no error, a plot made)."""
    page = shared_browser().new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.set_content("<!doctype html><html><body><div id='d' style='width:600px;height:400px'></div></body></html>")
        page.add_script_tag(content=asset_text("plotly.min.js"))
        data = {
            "bar": {"x": [1, 2], "y": [3, 4]}, "box": {"y": [1, 2, 3, 9]}, "heatmap": {"z": [[1, 2], [3, 4]]},
            "histogram": {"x": [1, 1, 2, 3]}, "scatter": {"x": [1, 2], "y": [2, 1]},
            "scattergl": {"x": [1, 2], "y": [2, 1], "mode": "markers"},
            "icicle": {"labels": ["a", "b"], "parents": ["", "a"], "values": [2, 1], "branchvalues": "total"},
            "parcoords": {"dimensions": [{"label": "a", "values": [1, 2]}, {"label": "b", "values": [3, 1]}]},
        }
        assert set(data) == set(registered["traces"]), "a declared trace type without a figure here"
        for kind, trace in data.items():
            drawn = page.evaluate("""([kind, trace]) => Plotly.newPlot('d', [Object.assign({type: kind}, trace)])
                .then(gd => gd._fullData.length === 1 && gd._fullData[0].type === kind && gd._fullData[0].visible === true)""",
                                  [kind, trace])
            assert drawn, kind
        assert not errors, errors
    finally:
        page.close()


def test_the_bundle_loads_in_a_pages_head(tmp_path):
    """As plotly.js's own files do: evaluated before the page has a body (a module that measured the body at load
    once broke it there), then drawing a WebGL scatter."""
    page = shared_browser().new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    html = tmp_path / "head.html"
    html.write_text("<!doctype html><html><head><meta charset='utf-8'><script>" + asset_text("plotly.min.js") +
                    "</script></head><body><div id='d' style='width:400px;height:300px'></div></body></html>",
                    encoding="utf-8")
    try:
        page.goto(html.as_uri())
        drawn = page.evaluate("""() => Plotly.newPlot('d', [{type: 'scattergl', x: [1, 2], y: [2, 1]}])
            .then(gd => gd._fullData[0].visible === true)""")
        assert drawn and not errors, errors
    finally:
        page.close()
