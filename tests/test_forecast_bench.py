"""The benchmarking phase (analysis/forecast/windows.py, model.py, bench.py, `flowscope forecast bench`):
KS decisions equal to scipy's ks_2samp on every window pair, hit-rate curves, the polynomial surface and
its 95 % cut, the window-size model's JSON round trip."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp

from flowscope.analysis.forecast.bench import bench_run
from flowscope.analysis.forecast.model import CorpusEntry, WindowModel, build_model, fit_surface, load_model
from flowscope.analysis.forecast.predict import choose_window
from flowscope.analysis.forecast.signal import run_signal
from flowscope.analysis.forecast.windows import candidate_windows, critical_d, hit_rates, ks_hits, value_codes
from flowscope.importers import import_paths
from flowscope.store.run import open_run


def _scipy_pairs(counts: np.ndarray, w: int) -> tuple[list[bool], list[float]]:
    m = len(counts) // w
    hits, stats = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(1, m):
            r = ks_2samp(counts[(i - 1) * w: i * w], counts[i * w: (i + 1) * w])
            hits.append(bool(r.pvalue >= 0.05))
            stats.append(float(r.statistic))
    return hits, stats


@pytest.mark.parametrize("values", [2, 3, 9, 60])  # few distinct values: ties everywhere
def test_vectorised_ks_decision_equals_scipy_on_every_window_pair(values):
    rng = np.random.default_rng(values)
    # a signal whose level drifts, so that some pairs differ and some do not
    n = 2400
    level = np.repeat(rng.integers(0, values, n // 120 + 1), 120)[:n]
    counts = np.clip(level + rng.integers(-1, 2, n), 0, values)
    decided = misses = 0
    for w in [1, 2, 3, 4, 5, 7, 10, 16, 33, 50, 101, 300, 799]:
        hits, stat = ks_hits(counts, w)
        want_hits, want_stat = _scipy_pairs(counts, w)
        assert hits.tolist() == want_hits, w
        np.testing.assert_allclose(stat, want_stat, rtol=0, atol=1e-12)
        decided += len(want_hits)
        misses += want_hits.count(False)
    assert decided > 5000 and 0 < misses < decided  # both decisions were checked


def test_vectorised_ks_equals_scipy_beyond_its_exact_range():
    # scipy switches from the exact distribution to the asymptotic one above 10,000 samples per side
    rng = np.random.default_rng(7)
    counts = np.concatenate([rng.integers(0, 4, 24_000), rng.integers(0, 5, 12_000)])
    hits, stat = ks_hits(counts, 12_000)
    want_hits, want_stat = _scipy_pairs(counts, 12_000)
    assert hits.tolist() == want_hits and want_hits.count(False) >= 1
    np.testing.assert_allclose(stat, want_stat, atol=1e-12)


@pytest.mark.parametrize("make", [
    lambda rng: rng.integers(0, 200, 50_000),                       # a core count: small non-negative ints
    lambda rng: rng.integers(-5, 6, 1_000),                         # negative values
    lambda rng: rng.integers(0, 2**62, 3_000),                      # a range far wider than the sample count
    lambda rng: np.array([7, 7, 7]),                                # one value
    lambda rng: np.array([], np.int64),                             # no sample
    lambda rng: rng.integers(0, 9, (40, 25)),                       # not flat
    lambda rng: rng.integers(0, 3, 500).astype(np.uint8),           # another integer type
    lambda rng: rng.random(800).round(1),                           # not integers
    lambda rng: np.array([2**63 - 1, -2**63, 0, 5], np.int64),      # the int64 extremes
    lambda rng: np.array([127, -128, 0, 127], np.int8),             # a difference wider than the type
    lambda rng: np.array([2**64 - 1, 2**64 - 3, 2**64 - 1], np.uint64),  # beyond int64, close together
])
def test_value_codes_are_the_ranks_of_the_values_among_the_distinct_ones(make):
    counts = make(np.random.default_rng(11))
    codes, n_values = value_codes(counts)
    values, inverse = np.unique(counts, return_inverse=True)
    assert n_values == len(values) and codes.dtype == np.int64
    assert codes.tolist() == inverse.ravel().tolist()


def test_critical_d_is_the_first_rejected_statistic():
    for w in (1, 2, 5, 40, 1000):
        d = critical_d(w)
        a = np.zeros(w)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if d <= w:
                assert ks_2samp(a, np.r_[np.zeros(w - d), np.ones(d)]).pvalue < 0.05
            if d >= 1:
                assert ks_2samp(a, np.r_[np.zeros(w - d + 1), np.ones(d - 1)]).pvalue >= 0.05
    with pytest.raises(ValueError, match="window size must be >= 1"):
        critical_d(0)


def test_critical_d_takes_a_few_scipy_calls_and_the_bisections_answer(monkeypatch):
    """Bracketed from the asymptotic critical value: the same d as a bisection over 0..w (written out here),
    in at most 5 scipy calls per window size where the bisection took about log2(w)."""
    from flowscope.analysis.forecast import windows

    def bisection(w):
        lo, hi = 0, w + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if windows._pvalue(mid, w) < 0.05 else (mid, hi)
        return hi

    calls = []
    real = windows._pvalue
    monkeypatch.setattr(windows, "_pvalue", lambda d, w: calls.append((d, w)) or real(d, w))
    sizes = [*range(1, 80), 97, 250, 1000, 4096, 9999, 10_000, 10_001, 12_000, 50_000, 60_000]
    for w in sizes:
        calls.clear()
        d = windows.scipy_critical_d(w)
        n = len(calls)
        assert d == bisection(w), w
        assert n <= 5, (w, n, calls)


def test_the_shipped_critical_values_are_scipys_decision():
    """critical_d reads the table shipped with flowscope (ks_critical.json) up to its largest window: every
    entry checked here is what scipy's ks_2samp decides, with the scipy installed."""
    from flowscope.analysis.forecast import windows

    table = windows.critical_table()
    assert table is not None, ("the shipped table was computed with another scipy than the installed one: "
                               "python scripts/ks_critical_table.py writes it again")
    top = len(table) - 1
    assert top >= 50_000  # the corpus's largest window (bench/forecast_corpus.py --max-window)
    rng = np.random.default_rng(16)
    sizes = sorted({*range(1, 301), *range(9_990, 10_011), top,
                    *(int(x) for x in rng.integers(301, top, 150))})
    for w in sizes:
        assert int(table[w]) == windows.scipy_critical_d(w), w
        assert critical_d(w) == int(table[w])
    assert critical_d(top + 1) == windows.scipy_critical_d(top + 1)  # beyond the table: scipy, as before
    assert critical_d(40, alpha=0.01) == windows.scipy_critical_d(40, alpha=0.01)  # another level: scipy


def test_the_hit_rate_curve_within_the_table_does_not_import_scipy():
    code = """
import sys
import numpy as np
from flowscope.analysis.forecast.windows import hit_rates
counts = np.random.default_rng(3).integers(0, 5, 30_000)
r = hit_rates(counts, [10, 37, 500, 7000])
print(sorted(m for m in sys.modules if m.split(".")[0] == "scipy")[:3], list(r["hits"]))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded, hits = p.stdout.strip().split(" ", 1)[0], p.stdout.strip().split(" ", 1)[1]
    assert loaded == "[]", p.stdout
    counts = np.random.default_rng(3).integers(0, 5, 30_000)
    assert json.loads(hits) == [int(h) for h in hit_rates(counts, [10, 37, 500, 7000])["hits"]]


@pytest.fixture(scope="module")
def starpu_run(tmp_path_factory, shared_data):
    res = import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], tmp_path_factory.mktemp("s") / "store")
    return open_run(res.run_dir)


def test_hit_rate_curve_of_a_real_trace_equals_a_per_pair_scipy_loop(starpu_run):
    sig = run_signal(starpu_run, "idle")
    windows = candidate_windows(len(sig.counts), count=12, smallest=len(sig.counts) // 1500)  # <= 1,500 pairs each
    assert len(windows) >= 5 and len(sig.counts) > 100_000
    calls = []
    curve = hit_rates(sig.counts, windows, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (len(windows), len(windows))
    for w, pairs, hits, rate in curve.itertuples(index=False):
        want, _ = _scipy_pairs(sig.counts, w)
        assert pairs == len(want) and hits == sum(want)
        assert rate == pytest.approx(sum(want) / len(want))
    entry = bench_run(starpu_run, "idle", windows)
    assert entry.resources == sig.resources and entry.tasks > 0 and entry.samples == len(sig.counts)
    pd.testing.assert_frame_equal(entry.curve, curve)


def _corpus_from(fn, resources=(8, 64)) -> list[CorpusEntry]:
    out = []
    for n in resources:
        for tasks in (1000, 1600, 2200, 2800, 3400, 4000):
            ws = np.array([10, 20, 40, 80, 160, 320, 640, 1280])
            rate = fn(np.log2(ws), tasks, n)
            out.append(CorpusEntry(source=f"sim-{n}-{tasks}", run_id=f"r{n}-{tasks}", resources=n, tasks=tasks,
                                   samples=100_000, period_ns=1e3, capped_by=None,
                                   curve=pd.DataFrame({"window": ws, "pairs": 50, "hits": 0, "hit_rate": rate})))
    return out


def test_surface_fit_recovers_a_fourth_order_polynomial_and_the_cut_follows_it():
    # hit rate falls with log2(window), faster for larger DAGs: an exact polynomial of degree <= 4
    def fn(lw, tasks, n):
        return 1.0 - 0.002 * (lw - 3.3) ** 2 * (1 + tasks / 2000) * (n / 8) ** 0.5

    model = build_model(_corpus_from(fn), "idle")
    for n in (8, 64):
        s = model.surfaces[n]
        assert s.rank == 15 and s.points == 48
        for tasks in (1000, 2500, 4000):
            for w in (12, 100, 1000):
                assert s(w, tasks) == pytest.approx(fn(np.log2(w), tasks, n), abs=1e-9)
            w = s.cut(tasks)
            # the largest size still at >= 95 %: fn(w) >= 0.95 and the next larger sizes fall below
            assert fn(np.log2(w), tasks, n) >= 0.95 - 1e-9
            if w < 1280:
                assert fn(np.log2(w * 1.05), tasks, n) < 0.95
    cuts = model.cuts()
    assert cuts[cuts["resources"] == 8]["window"].is_monotonic_decreasing  # bigger DAG, shorter window here
    assert (cuts[cuts["resources"] == 64]["window"].to_numpy() < cuts[cuts["resources"] == 8]["window"].to_numpy()).all()


def test_window_model_round_trips_through_json_and_says_when_it_does_not_fit(tmp_path):
    model = build_model(_corpus_from(lambda lw, t, n: 1.0 - 0.01 * lw * (t / 4000) * (n / 8) ** 0.25), "idle")
    path = model.save(tmp_path / "model.json")
    back = load_model(path)
    assert back.as_dict() == model.as_dict()
    assert json.loads(path.read_text())["corpus"][0]["source"] == "sim-8-1000"  # the corpus it came from
    for n, t in [(8, 1000), (8, 4000), (64, 2000)]:
        assert back.window_for(n, t) == model.window_for(n, t) and model.window_for(n, t)[0] is not None
    w, why = back.window_for(16, 2000)
    assert w is None and why == "the model has no surface for 16 resources (it has: 8, 64)"
    w, why = back.window_for(8, 9000)
    assert w is None and "outside the model's range for 8 resources (1000-4000 tasks" in why
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match=r"bad\.json: not a flowscope window-size model"):
        load_model(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text('{"format": ')
    with pytest.raises(ValueError, match=r"broken\.json: not JSON \(line 1"):
        load_model(tmp_path / "broken.json")


def test_a_surface_below_the_cut_everywhere_gives_its_best_window_not_the_default():
    # the model covers the run (its cluster size, its task range) but no window reaches 95 %: the surface still
    # ranks the windows, so the model's best one is used rather than the default, which ignores the model
    rates = {10: 0.62, 100: 0.71, 1000: 0.40}  # peaks inside the range, not at either end
    s = fit_surface(pd.DataFrame({"window": list(rates) * 2, "tasks": [100] * 3 + [200] * 3,
                                  "hit_rate": list(rates.values()) * 2}), 4)
    assert s.cut(150) is None
    best = s.best(150)
    grid = np.unique(np.round(2.0 ** np.linspace(np.log2(10), np.log2(1000), 400)).astype(np.int64))
    fitted = s(grid, np.full(len(grid), 150.0))
    assert best == int(grid[np.argmax(fitted)]) and 10 < best < 1000
    m = WindowModel(event="idle", surfaces={4: s})
    w, why = m.window_for(4, 150)
    assert w == best
    assert "stays below 95% hit rate" in why and f"its best window, {best} samples" in why
    assert f"{float(s(best, 150)):.0%}" in why  # the fitted hit rate the window was chosen for
    assert choose_window(m, 4, 150, 100_000) == (best, "model", why)
    # a run the model does not cover still gets the documented default
    assert choose_window(m, 8, 150, 100_000)[1] == "default"
    # a surface that dips below the cut at the smallest size only (a polynomial's wiggle) has no cut either, but
    # reaches it further on: the reason must not say it stays below
    rates = {10: 0.90, 100: 1.0, 1000: 0.50}
    s = fit_surface(pd.DataFrame({"window": list(rates) * 2, "tasks": [100] * 3 + [200] * 3,
                                  "hit_rate": list(rates.values()) * 2}), 4)
    assert s.cut(150) is None and float(s(s.best(150), 150)) >= 0.95
    w, why = WindowModel(event="idle", surfaces={4: s}).window_for(4, 150)
    assert w == s.best(150) and "stays below" not in why
    assert "is below 95% hit rate at its smallest window size, so it has no cut" in why
    assert f"fitted hit rate {min(1.0, float(s(w, 150))):.0%})" in why


def test_cli_bench_writes_the_model_from_trace_files_and_runs(tmp_path, shared_data, starpu_run):
    trace = shared_data / "paje" / "starpu-demo" / "paje.trace"
    out = tmp_path / "model.json"
    p = subprocess.run([sys.executable, "-m", "flowscope", "forecast", "bench", str(trace), str(starpu_run.path),
                        "--event", "idle", "--windows", "8", "-o", str(out), "--store", str(tmp_path / "none")],
                       check=False, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    model = load_model(out)
    assert model.event == "idle" and [e.source for e in model.corpus] == [str(trace), str(starpu_run.path)]
    assert model.corpus[0].curve.equals(model.corpus[1].curve)  # the same trace, imported or given as a run
    assert list(model.surfaces) == [model.corpus[0].resources]
    assert str(out) in p.stdout and not (tmp_path / "none").exists()  # traces imported into a temporary store
    bad = subprocess.run([sys.executable, "-m", "flowscope", "forecast", "bench", str(trace), "--event", "sleep",
                          "-o", str(out)], check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert "event: unknown event kind 'sleep'" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "flowscope", "forecast", "bench", str(tmp_path / "nope.trace"),
                              "-o", str(out)], check=False, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "nope.trace" in missing.stderr and missing.stderr.count("\n") == 1
