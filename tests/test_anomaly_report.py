"""The report's anomaly section: present for a run with an anomalies table, absent otherwise, and drawn by
Plotly in headless Chromium without console errors; its menus switch what is shown."""

from __future__ import annotations

import numpy as np
import pandas as pd

import flowscope
from flowscope.analysis.anomalies import AnomalyConfig, detect
from flowscope.analysis.anomalies.reduce import write_reduced
from flowscope.report import write_single_page
from flowscope.report.anomalies import anomaly_section, resource_ranking
from test_anomalies import synthetic
from test_report import _errors, open_page, render


def _runs(tmp_path):
    spans, planted = synthetic(n=20_000, threads=6, planted=25, seed=5)
    fs = flowscope.Client("embedded", store=tmp_path / "store", name="synthetic")
    fs.write("spans", spans)
    fs.close()
    full = flowscope.open_run(fs.run_dir)
    # steps counted from the first call (the synthetic calls predate the run's wall-clock start)
    det = detect(full.arrow("spans"), AnomalyConfig(algo="sstd"), meta={**full.meta, "start_ns": None})
    write_reduced(det, tmp_path / "reduced", full_spans=full.arrow("spans"), meta=full.meta)
    return full, flowscope.open_run(tmp_path / "reduced"), det


def test_resource_ranking_statistics_per_step():
    a = pd.DataFrame({"resource_id": ["r1", "r1", "r1", "r2"], "step": [0, 0, 2, 1]})
    rank = resource_ranking(a, nsteps=4)
    assert rank.loc["r1"].tolist() == [0.75, np.std([2, 0, 1, 0]), 2, 0, 3]
    assert rank.loc["r2", "total"] == 1 and rank.loc["r2", "max"] == 1


def test_anomaly_section_renders_without_console_errors(tmp_path):
    full, reduced, det = _runs(tmp_path)
    assert anomaly_section(full) is None  # a run without an anomalies table gets no section
    out = write_single_page(reduced, tmp_path / "report.html")
    text = out.read_text()
    assert '<section id="anomalies">' in text and 'href="#anomalies"' in text
    r = render(out)
    assert not _errors(r), _errors(r)
    assert not r["external"]
    assert "anomalies" in r["sections"]
    ours = {k: v for k, v in r["plots"].items() if k.startswith("fig-anom-")}
    assert set(ours) == {"fig-anom-ranking", "fig-anom-steps", "fig-anom-functions", "fig-anom-window"}
    assert all(r["drawn"][k] > 0 for k in ours), r["drawn"]
    assert ours["fig-anom-ranking"] == 10  # 5 statistics x top / bottom
    assert f"{det.anomalies.num_rows} anomalies" in r["text"]["anomalies"]
    assert ours["fig-anom-steps"] == 6 and int(det.anomalies["step"].to_numpy().max()) >= 2

    # the function view's x menu switches the axis to functions; the window menu to another anomaly
    with open_page(out) as (page, _console, errors):
        page.wait_for_function("() => document.getElementById('fig-anom-functions') && "
                               "document.getElementById('fig-anom-functions').data")
        got = page.evaluate("""() => {
            const d = document.getElementById('fig-anom-functions');
            const menu = d.layout.updatemenus[0].buttons.find(b => b.label === 'x: function');
            return Plotly.update(d, menu.args[0], menu.args[1]).then(
                () => [d.layout.xaxis.type, d.layout.xaxis.title.text, d.data[0].x.slice(0, 3)]);
        }""")
        assert got[0] == "category" and got[1] == "function"
        assert set(got[2]) <= set(det.anomalies["function"].to_pylist())
        vis = page.evaluate("""() => {
            const d = document.getElementById('fig-anom-window');
            const b = d.layout.updatemenus[0].buttons[1];
            return Plotly.update(d, b.args[0], b.args[1]).then(
                () => [d.data.map(t => t.visible), d.layout.title.text]);
        }""")
        assert vis[0] == [False] * 3 + [True] * 3 + [False] * (len(vis[0]) - 6)
        assert vis[1].startswith("#1 ")
        assert not errors, errors


def test_the_section_leaves_out_anomalies_post_pruning_withdrew(tmp_path):
    """Online anomalies the final model no longer flags are withdrawn by a logs row (category PRUNED naming the
    task and its start); the report counts and draws only the ones that stand."""
    import json

    from flowscope.analysis.anomalies.stream import PRUNED

    _, _, det = _runs(tmp_path)
    rows = det.anomalies.slice(0, 5)
    fs = flowscope.Client("embedded", store=tmp_path / "online", name="online")
    fs.write("anomalies", rows)
    gone = rows.slice(0, 2)
    for key, start in zip(gone["task_key"].to_pylist(), gone["start_ns"].to_pylist()):
        fs.log("anomaly pruned", category=PRUNED, task_key=key, attrs={"start_ns": start})
    fs.close()
    section = anomaly_section(flowscope.open_run(fs.run_dir))
    assert "3 anomalies (" in section and "5 anomalies (" not in section
