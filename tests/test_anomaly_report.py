"""The report's anomalies page (Chimbuko's views on the pages file's anomalies page): a run with an anomalies table
shows that table's anomalies, drawn in headless Chromium without console errors; its controls switch what is
shown."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import flowscope
from flowscope.analysis.anomalies import AnomalyConfig, detect
from flowscope.analysis.anomalies.reduce import write_reduced
from flowscope.report import write_report
from flowscope.report.anomalies import resource_ranking
from flowscope.report.views import anomalies_view
from test_anomalies import synthetic
from test_report import open_view


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


def test_the_anomalies_page_of_the_report_renders_without_console_errors(tmp_path):
    full, reduced, det = _runs(tmp_path)
    # a run without an anomalies table gets the detector's anomalies over its calls, not a table it lacks
    assert anomalies_view(full)["source"] == "detected"
    out = write_report(reduced, tmp_path / "report.html")
    blocked: list = []
    with open_view(out, "anomalies", blocked) as (page, console, errors):
        doc = page.evaluate("() => flowscopeView.doc")
        assert doc["source"] == "recorded" and doc["anomalies"] == det.anomalies.num_rows
        assert f"{det.anomalies.num_rows:,} anomalies" in page.locator("#an-facts").inner_text()
        # each resource's statistics of its anomalies per step, as resource_ranking gives them
        a = det.anomalies.to_pandas()
        rank = resource_ranking(a, doc["steps"])
        shown = page.evaluate("() => Array.from(document.querySelectorAll('table.ranking tbody tr')).map(tr => "
                              "[tr.dataset.resource].concat(['mean', 'std', 'max', 'min', 'total'].map(c => "
                              "Number(tr.querySelector('td.' + c).dataset.value))))")
        assert len(shown) == min(10, len(rank)) and int(det.anomalies["step"].to_numpy().max()) >= 2
        for row in shown:
            assert row[1:] == pytest.approx([float(rank.loc[row[0], k]) for k in ("mean", "std", "max", "min",
                                                                                    "total")]), row
        drawn = "id => { const d = document.getElementById(id); return d && d.calcdata && d.data.length ? d.querySelectorAll('.trace, canvas').length : 0; }"
        for chart in ("an-ranking-chart", "an-steps-chart", "an-functions-chart"):
            page.wait_for_function(drawn, arg=chart)
        # the steps of the top resource: the anomalies per step as the table counts them
        top = page.locator("table.ranking tbody tr").first
        rid = top.get_attribute("data-resource")
        top.click()
        page.wait_for_function("r => document.querySelector('#an-step-links b') && "
                               "document.querySelector('#an-step-links b').textContent === r", arg=rid)
        per = a[a["resource_id"] == rid].groupby("step").size()
        links = page.evaluate("() => Array.from(document.querySelectorAll('#an-step-links a')).map(a => "
                              "[Number(a.dataset.step), Number(a.dataset.count)])")
        assert links == [[int(k), int(n)] for k, n in per.items()]
        # the function view's x menu switches the axis to functions
        page.select_option("#an-x", "function")
        page.wait_for_function("() => { const d = document.getElementById('an-functions-chart'); "
                               "return d && d.layout.xaxis.type === 'category'; }")
        got = page.evaluate("() => { const d = document.getElementById('an-functions-chart'); "
                            "return [d.layout.xaxis.title.text, d.data.find(t => t.name === 'anomaly').x.slice(0, 3)]; }")
        assert got[0].startswith("function") and got[1]
        assert set(got[1]) <= set(det.anomalies["function"].to_pylist())
        # a step, then an anomaly in it: its call with the calls around it drawn; another anomaly, its own
        page.locator("#an-step-links a").first.click()
        page.wait_for_function("() => document.querySelectorAll('table.step-anomalies tbody tr').length > 0")
        calls = page.evaluate("() => Array.from(document.querySelectorAll('table.step-anomalies tbody tr')).map(tr => "
                              "tr.dataset.call)")
        for call in calls[:2]:
            page.locator(f'table.step-anomalies tbody tr[data-call="{call}"]').click()
            page.wait_for_function("c => { const f = document.getElementById('an-call-facts'); return f && "
                                   "f.dataset.call === c; }", arg=call)
            page.wait_for_function(drawn, arg="an-window-chart")
            window = page.evaluate("() => document.getElementById('an-window-chart').data[0].marker.color")
            assert window.count("#d62728") == 1  # the anomaly among the calls around it
        assert page.evaluate("() => flowscopeView.errors") == []
        assert not [m for m in console if m[0] == "error"] and not errors and not blocked


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
    shown = anomalies_view(flowscope.open_run(fs.run_dir))  # what the report's anomalies page shows
    assert shown["source"] == "recorded" and shown["anomalies"] == 3
    assert sum(r["total"] for r in shown["ranking"]) == 3 and len(shown["list"]) == 3
