"""The compiled detector step gives what the numpy formulation gives: the same flags, kept calls and models (bit
for bit), and the same scores (SSTD bit for bit; HBOS to the last bits of log2, which the C library and numpy may
round differently), step after step, with syncs through a parameter server, on random and adversarial inputs (one
function, many functions seen a few times, zero variance, equal values, huge and zero values, steps of one call)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from flowscope.analysis.anomalies import AnomalyConfig, Detector, FunctionModel, ParameterServer

_STATS = ("_count", "_mean", "_m2", "_min", "_max")


def _skewed(n: int, nfunc: int, seed: int):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, nfunc + 1) ** 1.1
    codes = rng.choice(nfunc, n, p=p / p.sum())
    mu = rng.uniform(np.log(1e3), np.log(1e8), nfunc)
    v = np.exp(rng.normal(mu[codes], rng.uniform(0.01, 0.4, nfunc)[codes]))
    hit = rng.choice(n, max(n // 500, 1), replace=False)
    v[hit] *= rng.uniform(5, 80, len(hit))
    return [f"fn_{i}" for i in range(nfunc)], codes.astype(np.int64), np.round(v)


def _adversarial(nfunc: int = 9_000):
    """(name, names, codes, values, step) cases that stress the corners of the update and the verdict."""
    rng = np.random.default_rng(7)
    n = 6_000
    yield "one function", ["f"], np.zeros(n, np.int64), np.round(rng.lognormal(10, 0.3, n)), 500
    codes = np.arange(int(nfunc * 2.2), dtype=np.int64) % nfunc  # many functions, each seen two or three times
    yield "many functions", [f"g{i}" for i in range(nfunc)], codes, np.round(rng.lognormal(8, 1, len(codes))), 700
    yield "zero variance", ["a", "b"], np.tile([0, 1], n // 2).astype(np.int64), np.full(n, 1234.0), 333
    v = np.full(n, 5e6)
    v[::997] = 5e9  # equal values with rare huge outliers: the std of a young model is 0, then jumps
    yield "equal then outliers", ["a", "b", "c"], (np.arange(n) % 3).astype(np.int64), v, 250
    v = rng.choice([0.0, 1.0, 1e15, 3.0], n, p=[0.3, 0.3, 0.001, 0.399])
    yield "zeros and huge values", ["a", "b"], rng.integers(0, 2, n).astype(np.int64), v, 400
    yield "steps of one call", ["a", "b", "c"], rng.integers(0, 3, 300).astype(np.int64), \
        np.round(rng.lognormal(5, 0.5, 300)), 1


def _assert_same_model(a, b):
    assert a.names == b.names
    for attr in _STATS:
        np.testing.assert_array_equal(getattr(a, attr)[:len(a)], getattr(b, attr)[:len(b)], err_msg=attr)
    assert a.histograms == b.histograms
    np.testing.assert_array_equal(a.hist, b.hist)


def _run_both(names, codes, values, step, config, producers=3, keep=True, mature=1000):
    """Feed the same steps to compiled and numpy detectors synced through their own servers; every step's
    (score, flagged) and, at the end, the views, local models, kept calls and final verdicts must be equal."""
    sides = {}
    for compiled in (True, False):
        server = ParameterServer()
        dets = [Detector(config, keep=keep, mature=mature, compiled=compiled) for _ in range(producers)]
        steps = []
        for k, lo in enumerate(range(0, len(codes), step)):
            part = np.arange(lo, min(lo + step, len(codes)))
            det = dets[k % producers]
            steps.append(det.process(names, codes[part], values[part], ids=part))
            if k % producers == producers - 1:
                for d in dets:
                    d.sync(server)
        sides[compiled] = (dets, steps, server)
    (cd, cs, cserver), (nd, ns, nserver) = sides[True], sides[False]
    for k, ((s1, f1), (s2, f2)) in enumerate(zip(cs, ns)):
        if config.algo == "sstd":
            np.testing.assert_array_equal(s1, s2, err_msg=f"step {k} scores")
        else:
            np.testing.assert_allclose(s1, s2, rtol=1e-13, err_msg=f"step {k} scores")
        np.testing.assert_array_equal(f1, f2, err_msg=f"step {k} flags")
    for a, b in zip(cd, nd):
        _assert_same_model(a.view, b.view)
        _assert_same_model(a.local, b.local)
        assert a.kept == b.kept
    _assert_same_model(cserver.snapshot(), nserver.snapshot())
    if keep:
        final = nserver.snapshot()
        np.testing.assert_array_equal(np.sort(np.concatenate([d.final(final) for d in cd])),
                                      np.sort(np.concatenate([d.final(final) for d in nd])))
    return cs


@pytest.mark.parametrize("sigma,min_count", [(6.0, 2), (3.0, 50)])
def test_compiled_sstd_step_equals_numpy_on_skewed_calls(sigma, min_count):
    names, codes, values = _skewed(60_000, 400, seed=11)
    steps = _run_both(names, codes, values, 2_500, AnomalyConfig(algo="sstd", sigma=sigma, min_count=min_count))
    assert sum(int(f.sum()) for _, f in steps) > 0  # the comparison covered flagged calls


@pytest.mark.parametrize("case", list(_adversarial()), ids=lambda c: c[0])
def test_compiled_sstd_step_equals_numpy_on_adversarial_inputs(case):
    _, names, codes, values, step = case
    _run_both(names, codes, values, step, AnomalyConfig(algo="sstd"), mature=50)


@pytest.mark.parametrize("threshold,max_bins,min_count", [(0.99, 200, 2), (0.9, 20, 30)])
def test_compiled_hbos_step_equals_numpy_on_skewed_calls(threshold, max_bins, min_count):
    names, codes, values = _skewed(40_000, 120, seed=13)
    config = AnomalyConfig(algo="hbos", threshold=threshold, max_bins=max_bins, min_count=min_count)
    steps = _run_both(names, codes, values, 2_000, config, mature=300)
    assert sum(int(f.sum()) for _, f in steps) > 0


@pytest.mark.parametrize("case", list(_adversarial(nfunc=150)), ids=lambda c: c[0])
def test_compiled_hbos_step_equals_numpy_on_adversarial_inputs(case):
    _, names, codes, values, step = case
    _run_both(names, codes, values, step, AnomalyConfig(algo="hbos"), mature=50)


@pytest.mark.parametrize("algo", ["sstd", "hbos"])
def test_compiled_step_without_keep_and_with_a_growing_name_list(algo):
    names, codes, values = _skewed(20_000, 300, seed=2)
    grown: list[str] = []
    out = {}
    for compiled in (True, False):
        det = Detector(AnomalyConfig(algo=algo), compiled=compiled)
        grown.clear()
        res = []
        for lo in range(0, len(codes), 1_000):  # the same list object, appended to as new functions appear
            part = slice(lo, lo + 1_000)
            top = int(codes[part].max()) + 1
            grown.extend(names[len(grown):top])
            res.append(det.process(grown, codes[part], values[part]))
        out[compiled] = (det, res)
    for (s1, f1), (s2, f2) in zip(out[True][1], out[False][1]):
        np.testing.assert_allclose(s1, s2, rtol=0 if algo == "sstd" else 1e-13)
        np.testing.assert_array_equal(f1, f2)
    _assert_same_model(out[True][0].view, out[False][0].view)
    _assert_same_model(out[True][0].take_local(), out[False][0].take_local())


@pytest.mark.parametrize("algo", ["sstd", "hbos"])
def test_compiled_sync_merges_in_place_what_exchange_rows_merges(algo, monkeypatch):
    """Compiled detectors sync through ParameterServer.exchange_moments (the moments merged in C, no per-function
    arrays; functions new to the server or to the detector named first), falling back to exchange_rows where it
    does not apply (HBOS's first exchange, which takes whole histogram rows); views (names included), servers,
    flags and final verdicts stay those of the numpy detectors, which always take exchange_rows."""
    calls = {"moments": 0, "moments_refused": 0, "rows": 0}
    moments, rows = ParameterServer.exchange_moments, ParameterServer.exchange_rows

    def counted_moments(self, *a, **k):
        out = moments(self, *a, **k)
        calls["moments" if out is not None else "moments_refused"] += 1
        return out

    def counted_rows(self, *a, **k):
        calls["rows"] += 1
        return rows(self, *a, **k)

    monkeypatch.setattr(ParameterServer, "exchange_moments", counted_moments)
    monkeypatch.setattr(ParameterServer, "exchange_rows", counted_rows)
    names, codes, values = _skewed(30_000, 300, seed=5)
    steps = _run_both(names, codes, values, 500, AnomalyConfig(algo=algo), producers=3, mature=200)
    assert sum(int(f.sum()) for _, f in steps) > 0
    syncs = len(steps)  # the numpy side syncs as often, through exchange_rows only
    assert calls["moments"] > syncs // 2             # most compiled syncs took the in-place path
    assert calls["moments"] + calls["rows"] == 2 * syncs   # each sync once, by one path or the other
    # and a refusal (names to exchange first) or a fallback (HBOS's first exchange) was exercised
    assert calls["moments_refused"] + calls["rows"] - syncs > 0


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("algo", ["sstd", "hbos"])
def test_process_steps_equals_one_process_call_per_step(algo, compiled):
    """Detector.process_steps (several steps in one call, as a producer handing over a few steps at a time
    would) gives every step the scores and flags, and leaves the views, local models, kept calls, server and
    final verdicts, that one ``process`` call per step gives, bit for bit; two producers sync after each
    hand-over. Steps of irregular sizes, empty ones included."""
    names, codes, values = _skewed(36_000, 250, seed=17)
    rng = np.random.default_rng(3)
    bounds = np.unique(np.concatenate([[0], rng.integers(0, len(codes), 240), [len(codes)]]))
    bounds = np.sort(np.concatenate([bounds, bounds[5::9]]))   # repeated bounds: empty steps
    steps = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    config = AnomalyConfig(algo=algo)
    sides = {}
    for batched in (False, True):
        server = ParameterServer()
        dets = [Detector(config, keep=True, mature=300, compiled=compiled) for _ in range(2)]
        out = []
        for r, g in enumerate(range(0, len(steps), 7)):   # hand-overs of 7 steps, producers in turn
            det, group = dets[r % 2], steps[g:g + 7]
            lo, hi = group[0][0], group[-1][1]
            if batched:
                local = np.array([a for a, _ in group] + [hi]) - lo
                s, f = det.process_steps(names, codes[lo:hi], values[lo:hi], local, ids=np.arange(lo, hi))
                out += [(s[a - lo:b - lo], f[a - lo:b - lo]) for a, b in group]
            else:
                out += [det.process(names, codes[a:b], values[a:b], ids=np.arange(a, b)) for a, b in group]
            det.sync(server)
        sides[batched] = (dets, out, server)
    (d1, o1, s1), (d2, o2, s2) = sides[False], sides[True]
    assert len(o1) == len(o2) == len(steps)
    for k, ((a, fa), (b, fb)) in enumerate(zip(o1, o2)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {k} scores")
        np.testing.assert_array_equal(fa, fb, err_msg=f"step {k} flags")
    assert sum(int(f.sum()) for _, f in o1) > 0
    for a, b in zip(d1, d2):
        _assert_same_model(a.view, b.view)
        _assert_same_model(a.local, b.local)
        assert a.kept == b.kept and a.seen == b.seen
    _assert_same_model(s1.snapshot(), s2.snapshot())
    final = s1.snapshot()
    np.testing.assert_array_equal(np.sort(np.concatenate([d.final(final) for d in d1])),
                                  np.sort(np.concatenate([d.final(final) for d in d2])))


def test_process_steps_refuses_bounds_that_do_not_cover_the_calls():
    det = Detector(AnomalyConfig(algo="sstd"))
    for bad in ([1, 3], [0, 2], [0, 2, 1, 3], [0, 4]):
        with pytest.raises(ValueError, match="bounds must run from 0 to the 3 calls"):
            det.process_steps(["f"], [0, 0, 0], [1.0, 2.0, 3.0], bad)
    assert det.seen == 0 and len(det.view) == 0


def test_a_lagging_detector_sees_every_change_after_the_servers_change_log_is_trimmed():
    """A compiled sync reads the functions changed since the detector's last one from the server's change log, not
    from a pass over every function; the log is trimmed (a function's older entries dropped) so it stays bounded
    while a detector lags, and a detector that joins late still gets every function. The lagging detector's view, the others' and the
    server stay those of numpy detectors (which take exchange_rows)."""
    names, codes, values = _skewed(80_000, 60, seed=23)
    config = AnomalyConfig(algo="sstd")
    sides = {}
    for compiled in (True, False):
        server = ParameterServer()
        server._log_slack = 256  # trimmed every few dozen syncs here
        dets = [Detector(config, keep=True, mature=100, compiled=compiled) for _ in range(4)]
        views = []
        late = Detector(config, compiled=compiled)
        lengths = []
        for k, lo in enumerate(range(0, len(codes), 100)):   # 800 steps; detector 3 syncs every 40th of its steps
            p = k % 4
            part = np.arange(lo, min(lo + 100, len(codes)))
            dets[p].process(names, codes[part], values[part], ids=part)
            if p < 3 or (k // 4) % 40 == 39:
                dets[p].sync(server)
                if p == 3:
                    views.append(dets[3].view.copy())
            if compiled:  # bounded while detector 3 lags
                lengths.append(int(server._clog[2][0]))
                assert lengths[-1] <= 4 * len(server.model) + server._log_slack + 3 * len(names)
        assert not compiled or any(b < a for a, b in itertools.pairwise(lengths))  # it was trimmed
        late.process(names, codes[:50], values[:50])  # joins after the log was trimmed
        late.sync(server)
        views.append(late.view.copy())
        sides[compiled] = (dets, views, server)
    (cd, cv, cs), (nd, nv, ns) = sides[True], sides[False]
    assert len(cv) == len(nv) == 6
    for a, b in zip(cv, nv):
        _assert_same_model(a, b)
    for a, b in zip(cd, nd):
        _assert_same_model(a.view, b.view)
    _assert_same_model(cs.snapshot(), ns.snapshot())


@pytest.mark.parametrize("algo", ["sstd", "hbos"])
def test_final_against_a_model_that_numbers_functions_differently_maps_them_by_name(algo):
    """``final(model)`` maps the kept calls through the server's numbering when ``model`` numbers functions as the
    server does (a snapshot), and by name otherwise: a model with the functions in another order gives the same
    verdict."""
    names, codes, values = _skewed(30_000, 80, seed=29)
    server = ParameterServer()
    dets = [Detector(AnomalyConfig(algo=algo), keep=True, mature=200) for _ in range(2)]
    for k, lo in enumerate(range(0, len(codes), 1_000)):
        part = np.arange(lo, lo + 1_000)
        dets[k % 2].process(names, codes[part], values[part], ids=part)
        dets[k % 2].sync(server)
    snap = server.snapshot()
    other = FunctionModel(snap.histograms)  # the same statistics, the functions numbered backwards
    order = np.arange(len(snap))[::-1]
    other.merge_in(snap.subset(order))
    assert other.names != snap.names and other.names == [snap.names[i] for i in order]
    want = np.sort(np.concatenate([d.final(snap) for d in dets]))
    assert len(want) > 0
    np.testing.assert_array_equal(np.sort(np.concatenate([d.final(other) for d in dets])), want)


@pytest.mark.parametrize("algo", ["sstd", "hbos"])
def test_calls_added_to_the_local_model_directly_reach_the_server_at_the_next_sync(algo):
    """The Dask plugin adds calls to ``detector.local`` itself; a compiled detector, whose kernels list the
    functions with local calls, lists them again after handing its local model out, so a sync sends them all."""
    names, codes, values = _skewed(12_000, 40, seed=31)
    servers = {}
    for compiled in (True, False):
        server = ParameterServer()
        det = Detector(AnomalyConfig(algo=algo), compiled=compiled)
        det.process(names, codes[:6_000], values[:6_000])
        det.sync(server)
        rest = np.arange(6_000, 12_000)
        hot = codes[rest] == 0        # calls of function 0 since the sync go in by hand only
        det.process(names, codes[rest[~hot]], values[rest[~hot]])
        extra = rest[hot]             # as the plugin does: view and local updated by hand
        det.local.update(det.local.codes(names)[codes[extra]], values[extra])
        det.view.update(det.view.codes(names)[codes[extra]], values[extra])
        det.sync(server)
        servers[compiled] = server.snapshot()
    assert servers[True].count.sum() == 12_000
    _assert_same_model(servers[True], servers[False])


@pytest.mark.parametrize("compiled", [True, False])
def test_detectors_numbered_by_different_lists_agree_with_the_server_by_name(compiled):
    """A fresh view takes the numbering of the list of names it is given, and the server notes where in that list
    each function it numbers sits, so detectors given the same list map the server's functions without looking
    names up; a detector given another list (the same names in another order, and one more) maps them by name.
    Every view ends equal, function by function, to the server's model."""
    names, codes, values = _skewed(40_000, 200, seed=37)
    other = ["extra"] + names[::-1]                # other order, other length: positions differ
    other_codes = len(names) - codes               # the same calls, as codes into ``other``
    server = ParameterServer()
    dets = [Detector(AnomalyConfig(algo="sstd"), compiled=compiled) for _ in range(3)]
    lists = [names, other, names]
    for k, lo in enumerate(range(0, len(codes), 500)):
        p = k % 3
        part = slice(lo, lo + 500)
        dets[p].process(lists[p], (other_codes if p == 1 else codes)[part], values[part])
        dets[p].sync(server)
    for d in dets:
        d.sync(server)
    snap = server.snapshot()
    assert sorted(snap.names) == sorted({names[i] for i in np.unique(codes)})
    for d in dets:
        at = d.view.codes(snap.names)
        for attr in _STATS:
            np.testing.assert_array_equal(getattr(d.view, attr)[at], getattr(snap, attr)[:len(snap)], err_msg=attr)
