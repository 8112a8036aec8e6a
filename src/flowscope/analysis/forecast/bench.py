"""The benchmarking phase over runs: each run's event signal and hit-rate curve (a corpus entry), then the
window-size model of the corpus."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from flowscope.analysis.forecast.model import CorpusEntry
from flowscope.analysis.forecast.signal import MAX_RATE_HZ, MAX_SAMPLES, run_signal, run_tasks
from flowscope.analysis.forecast.windows import ALPHA, candidate_windows, hit_rates

if TYPE_CHECKING:
    from flowscope.store.run import Run


def bench_run(run: Run, event: str, windows: Sequence[int] | None = None, *, count: int = 50, alpha: float = ALPHA,
              source: str | None = None, max_rate_hz: float = MAX_RATE_HZ, max_samples: int = MAX_SAMPLES,
              progress: Callable[[int, int], None] | None = None) -> CorpusEntry:
    """``run``'s hit-rate curve for ``event`` over the window sizes ``windows`` (default:
    :func:`~flowscope.analysis.forecast.windows.candidate_windows`: ``count`` sizes suited to its signal's
    length). ``progress(done, total)`` is called after each window size."""
    sig = run_signal(run, event, max_rate_hz=max_rate_hz, max_samples=max_samples)
    ws = list(windows) if windows is not None else candidate_windows(len(sig.counts), count=count)
    if not ws:
        raise ValueError(f"run {run.run_id}: its {len(sig.counts)} samples leave no window size with 2 windows")
    curve = hit_rates(sig.counts, ws, alpha, progress=progress)
    return CorpusEntry(source=source or str(run.path), run_id=run.run_id, resources=sig.resources,
                       tasks=run_tasks(run), samples=len(sig.counts), period_ns=sig.period_ns,
                       capped_by=sig.capped_by, curve=curve)
