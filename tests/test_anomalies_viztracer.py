"""`flowscope anomalies` on a real viztracer trace imported through the Chrome importer: functions are the
traced Python functions and the detector scores their exclusive time, checked against a plain json.load."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import numpy as np

import flowscope
from flowscope.importers import import_paths


def _exclusive_by_json_load(path) -> dict[tuple[str, int], int]:
    """(name, start_ns) -> exclusive ns of every X event, nesting worked out per (pid, tid) with a stack."""
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    by_thread = defaultdict(list)
    for e in events:
        s = round(e["ts"] * 1000)
        by_thread[(e["pid"], e["tid"])].append((s, s + round(e.get("dur", 0) * 1000), e["name"]))
    out = {}
    for calls in by_thread.values():
        calls.sort(key=lambda c: (c[0], -c[1], c[2]))
        stack: list[list] = []
        for s, t, name in calls:
            while stack and not (stack[-1][0] <= s and t <= stack[-1][1]):
                stack.pop()
            rec = [s, t, name, t - s]
            if stack:
                stack[-1][3] -= t - s
            stack.append(rec)
            out[(name, s)] = rec  # a list: children found later still subtract from it
    return {k: v[3] for k, v in out.items()}


def test_anomalies_on_imported_viztracer_trace_use_exclusive_time(shared_data, tmp_path):
    path = shared_data / "chrome" / "viztracer" / "multithread.json"
    res = import_paths([path], tmp_path / "store")
    run = flowscope.open_run(res.run_dir)
    want = _exclusive_by_json_load(path)
    out = subprocess.run([sys.executable, "-m", "flowscope", "anomalies", str(res.run_dir), "--json", "--top",
                          "100000"], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["config"]["metric"] == "exclusive" and doc["calls"] == len(want)
    assert doc["anomalies"] > 0 and len(doc["top"]) == doc["anomalies"]
    nested = 0
    for row in doc["top"]:
        assert row["metric"] == "exclusive"
        assert row["exclusive_ns"] == want[(row["function"], row["start_ns"])]
        nested += row["exclusive_ns"] < row["inclusive_ns"]
        # the model the call was judged against is that of the function's exclusive times (json.load's)
        xs = np.array([v for (n, _), v in want.items() if n == row["function"]], float)
        assert row["model"]["count"] == len(xs)
        assert abs(row["model"]["mean"] - xs.mean()) <= 1e-9 * max(xs.mean(), 1.0)
    assert nested > 0, "some anomalous call has children, so exclusive and inclusive time differ"
    assert run.sql("SELECT count(*) AS n FROM spans WHERE parent_id IS NOT NULL")["n"][0] > 0
