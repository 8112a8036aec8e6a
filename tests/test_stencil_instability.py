"""The stencil mini-app (flowscope.workflows.stencil) publishing its science per step into a namespace, and the
instability detector (flowscope.analysis.instability) that must fire before a run made unstable on purpose crashes:
online, fed step by step, and offline on what the run stored, at the same step."""

from __future__ import annotations

import math

import numpy as np
import pytest

import flowscope
from flowscope.analysis.instability import InstabilityDetector, find_instability
from flowscope.store.run import open_run
from flowscope.workflows.stencil import SolverCrashed, run_stencil


def _energy_series(run_dir) -> tuple[list[int], list[float]]:
    run = open_run(run_dir)
    rows = run.sql("""SELECT s.value AS step, e.value AS energy FROM metrics e JOIN metrics s
                      ON s.ts_ns = e.ts_ns AND s.namespace = e.namespace AND s.name = 'step'
                      WHERE e.namespace = 'application' AND e.name = 'diagnostics/energy' ORDER BY s.value""")
    return [int(s) for s in rows["step"]], [float(v) for v in rows["energy"]]


def test_a_stable_run_publishes_every_step_conserves_mass_and_the_detector_stays_quiet(tmp_path):
    detector = InstabilityDetector()
    seen = []
    with flowscope.Client(store=tmp_path / "store", name="stencil-stable") as fs:
        ns = fs.namespace("application", publish_every=1, blocking=True)
        out = run_stencil(n=96, steps=300, threads=2, namespace=ns,
                          on_step=lambda step, d: seen.append((step, d, detector.update(step, d["energy"]))))
        ns.close()
        run_dir = fs.run_dir
    assert out["steps"] == 300 and out["verdict"] is None and all(v is None for _, _, v in seen)
    masses = [d["mass"] for _, d, _ in seen]
    assert max(abs(m - masses[0]) for m in masses) <= 1e-9 * abs(masses[0])  # periodic diffusion keeps the mass
    energy = [d["energy"] for _, d, _ in seen]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(energy, energy[1:]))  # ... and dissipates the energy
    steps, stored = _energy_series(run_dir)
    assert steps == list(range(1, 301)) and stored == pytest.approx(energy, rel=1e-15)
    assert find_instability(steps, stored) is None


def test_an_unstable_run_is_flagged_before_it_crashes_online_and_offline_alike(tmp_path):
    detector = InstabilityDetector()
    verdicts = []

    def watch(step, d):
        v = detector.update(step, d["energy"])
        if v is not None:
            verdicts.append(v)

    with flowscope.Client(store=tmp_path / "store", name="stencil-unstable") as fs:
        ns = fs.namespace("application", publish_every=1, blocking=True)
        with pytest.raises(SolverCrashed) as crash:
            run_stencil(n=96, steps=5000, threads=2, unstable=True, namespace=ns, on_step=watch)
        ns.close()
        run_dir = fs.run_dir
    crashed_at = crash.value.step
    assert crash.value.nan_count > 0 and 50 < crashed_at < 5000
    [v] = verdicts  # fires once
    assert v["step"] < crashed_at and v["reason"] == "geometric growth" and math.isfinite(v["value"])
    assert v["growth"] >= detector.growth and v["rate"] > 1.0
    steps, stored = _energy_series(run_dir)
    assert steps[-1] == crashed_at  # the crash step's diagnostics were published too
    offline = find_instability(steps, stored)
    assert offline == v


def test_the_detector_ignores_a_lone_spike_and_refuses_bad_parameters():
    d = InstabilityDetector(window=4, growth=10.0)
    series = [1.0] * 20 + [50.0] + [1.0] * 20  # a spike is not a geometric growth
    assert all(d.update(i, x) is None for i, x in enumerate(series))
    nan = InstabilityDetector()
    assert nan.update(0, 1.0) is None and nan.update(1, float("nan"))["reason"] == "non-finite value"
    for kw, msg in [({"window": 1}, "window: "), ({"growth": 1.0}, "growth: "), ({"min_ratio": 0.5}, "min_ratio: ")]:
        with pytest.raises(ValueError, match=msg):
            InstabilityDetector(**kw)
    with pytest.raises(ValueError, match="steps and values"):
        find_instability([1, 2], [1.0])
    assert np.isfinite(InstabilityDetector().growth)
