"""`flowscope show` on runs that hold no rows, or only some tables: an empty run, the reduced run that
`flowscope anomalies --reduce` writes, and an import killed before its first file landed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_show_an_import_killed_before_its_first_file_landed(tmp_path):
    store = tmp_path / "store"
    pipe = tmp_path / "never-written.json"
    os.mkfifo(pipe)  # the import stops opening it: a certain point to kill it at
    proc = subprocess.Popen([sys.executable, "-m", "flowscope", "import", str(pipe), "--format", "chrome",
                             "--store", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (store.is_dir() and any((p / "run.json").is_file() for p in store.iterdir())):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    run_dir = next(p for p in store.iterdir() if (p / "run.json").is_file())
    while json.loads((run_dir / "run.json").read_text()).get("importing") is None:  # it says who imports
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    res = subprocess.run([sys.executable, "-m", "flowscope", "show", str(run_dir)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "interrupted" in res.stdout and "0 of 1 files" in res.stdout and "no rows" in res.stdout
    assert Path(run_dir).is_dir()
