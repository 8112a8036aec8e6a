"""`flowscope show` on runs that hold no rows, or only some tables: an empty run and the reduced run that
`flowscope anomalies --reduce` writes."""

from __future__ import annotations

import json

import flowscope
from flowscope.cli.main import main as cli_main


def test_show_an_empty_run(tmp_path, capsys):
    with flowscope.Client(name="nothing-recorded", store=tmp_path / "store") as fs:
        run_dir = fs.run_dir
    assert cli_main(["show", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "nothing-recorded" in out and "finished" in out and "no rows" in out
    assert cli_main(["show", str(run_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["top_spans"] == [] and sum(doc["rows"].values()) == 0 and doc["start_ns"] is not None


def test_show_a_reduced_run(shared_data, tmp_path, capsys):
    store = tmp_path / "store"
    trace = shared_data / "chrome" / "viztracer" / "multithread.json"
    assert cli_main(["import", str(trace), "--store", str(store), "--json"]) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    reduced = tmp_path / "reduced"
    assert cli_main(["anomalies", run_dir, "--reduce", str(reduced), "--json"]) == 0
    anomalies = json.loads(capsys.readouterr().out)["anomalies"]
    assert anomalies > 0
    assert cli_main(["show", str(reduced)]) == 0
    out = capsys.readouterr().out
    assert "anomalies" in out and str(anomalies) in out
