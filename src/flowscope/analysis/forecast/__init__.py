"""Forecasting what a run's resources will do next: frequency analysis of event occurrences (Pallipuram,
DiMarco and Taufer, "Applying frequency analysis techniques to DAG-based workflows to benchmark and predict
resource behavior on non-dedicated clusters").

* :mod:`.signal` -- event-occurrence signals from the resource-state timeline, sampled at the paper's rate;
* :mod:`.windows` -- windowed ECDFs and the KS test between successive windows, many window sizes at once;
* :mod:`.model` -- hit-rate surfaces, the 4th-order surface fit and its 95 % cut: the window-size model;
* :mod:`.bench` -- the benchmarking phase over runs;
* :mod:`.predict` -- the prediction phase, frame by frame.
"""

from flowscope.analysis.forecast.bench import bench_run
from flowscope.analysis.forecast.model import (
    CorpusEntry,
    Surface,
    WindowModel,
    build_model,
    default_window,
    fit_surface,
    load_model,
)
from flowscope.analysis.forecast.predict import Prediction, check_fraction, predict, predict_signal
from flowscope.analysis.forecast.signal import EVENTS, MAX_RATE_HZ, MAX_SAMPLES, EventSignal, event_signal, run_signal
from flowscope.analysis.forecast.windows import ALPHA, candidate_windows, critical_d, hit_rates, ks_hits

__all__ = ["ALPHA", "EVENTS", "MAX_RATE_HZ", "MAX_SAMPLES", "CorpusEntry", "EventSignal", "Prediction", "Surface",
           "WindowModel", "bench_run", "build_model", "candidate_windows", "check_fraction", "critical_d",
           "default_window", "event_signal", "fit_surface", "hit_rates", "ks_hits", "load_model", "predict",
           "predict_signal", "run_signal"]
