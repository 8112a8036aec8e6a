"""Forecasting what a run's resources will do next: frequency analysis of event occurrences (Pallipuram,
DiMarco and Taufer, "Applying frequency analysis techniques to DAG-based workflows to benchmark and predict
resource behavior on non-dedicated clusters").

* :mod:`.signal` -- event-occurrence signals from the resource-state timeline, sampled at the paper's rate.
"""

from flowscope.analysis.forecast.signal import EVENTS, MAX_RATE_HZ, MAX_SAMPLES, EventSignal, event_signal, run_signal

__all__ = ["EVENTS", "MAX_RATE_HZ", "MAX_SAMPLES", "EventSignal", "event_signal", "run_signal"]
