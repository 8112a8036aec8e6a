"""``flowscope.forecast``: act on what a run's resources are predicted to do next.

``when(run, event="idle", fraction=0.25, likelihood=0.8, do=callback)`` watches a run (live or finished)
and calls ``callback(frame)`` once for each frame whose predicted likelihood -- that at least ``fraction``
of the resources are in state ``event`` during the frame, read from the previous frame's ECDF
(analysis/forecast/predict.py) -- is at least ``likelihood``. ``frame`` is the prediction's ``next``
entry (``frame``, ``start_ns``, ``end_ns``, ``likelihood``) plus ``run_id``, ``event``, ``fraction``,
``threshold`` (resources) and ``resources``.

``run`` is a run directory, a :class:`~flowscope.store.run.Run`, a :class:`flowscope.Client` (its run: read
from the store when the collector is embedded, else through the collector's
``/v1/runs/{run}/forecast``), or ``(address, run_id)`` of a collector. The watch runs on a daemon thread
every ``interval`` seconds until :meth:`Rule.stop`; :meth:`Rule.check` does one round in the calling thread.

Every action taken on a live run (a Client's run, or ``(address, run_id)``) leaves an audit row in the run's
``logs``: category ``feedback``, attrs ``rule`` ("forecast"), ``action`` (the callback's qualified name),
``outcome`` ("ok", or the exception's type), ``frame``, ``start_ns``, ``end_ns``, ``likelihood``, ``threshold``
(the rule's likelihood), ``event``, ``fraction``, and ``result`` when the callback returned a dict (what the
ready-made actions of :mod:`flowscope.feedback` return: what they changed). A finished run read from its directory
is not written to.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowscope.feedback import Watch, auditor, run_source

__all__ = ["Rule", "when"]


def _source(run: Any, event: str, fraction: float, model: Any, window: int | None) -> Callable[[], dict | None]:
    """A function returning the current prediction's JSON (None while the run has nothing to sample)."""
    from flowscope.analysis.forecast import predict
    from flowscope.store.run import Run

    def local(path: Path) -> Callable[[], dict | None]:
        def get() -> dict | None:
            r = Run(path)
            try:
                return predict(r, event, fraction, model, window=window).as_dict()
            except ValueError as exc:
                if "no executing resource" in str(exc):
                    return None
                raise
            finally:
                r.close()
        return get

    def remote(address: str, run_id: str) -> Callable[[], dict | None]:
        if model is not None:
            raise ValueError("model: a run read through a collector uses its window (give window= instead)")
        q = {"event": event, "fraction": fraction, **({"window": window} if window else {})}
        url = f"{address.rstrip('/')}/v1/runs/{urllib.parse.quote(run_id)}/forecast?{urllib.parse.urlencode(q)}"

        def get() -> dict | None:
            try:
                with urllib.request.urlopen(url, timeout=60) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 409:  # nothing to sample yet
                    return None
                raise ValueError(f"{url}: {exc.code} {exc.read().decode(errors='replace')}") from None
        return get

    return run_source(run, local, remote)


class Rule(Watch):
    """A watch started by :func:`when`; ``fired`` lists the frames the callback was called for, ``last`` the last
    prediction read."""

    thread_name = "flowscope-forecast-rule"

    def __init__(self, get: Callable[[], dict | None], likelihood: float, do: Callable[[dict], Any],
                 interval: float, audit: tuple[Callable[[str, dict], None], Callable[[], None]] | None = None):
        super().__init__(do, interval, audit)
        self._get, self.likelihood = get, likelihood
        self.last: dict | None = None
        self._done_frames: set[int] = set()

    def check(self) -> dict | None:
        """One round: read the prediction; call the callback for its next frame if the likelihood is reached
        and the frame was not acted on yet. Returns the frame acted on, or None."""
        with self._lock:
            doc = self._get()
            self.last = doc
            if not doc or not doc.get("next"):
                return None
            nxt = doc["next"]
            if nxt["likelihood"] < self.likelihood or nxt["frame"] in self._done_frames:
                return None
            self._done_frames.add(nxt["frame"])
            frame = {**nxt, **{k: doc[k] for k in ("run_id", "event", "fraction", "threshold", "resources")}}
            self.fired.append(frame)
        self._act(frame, lambda action, outcome: (f"forecast rule acted: {action} for frame {frame['frame']} "
                                                  f"(likelihood {frame['likelihood']:.3f} >= {self.likelihood:g}): "
                                                  f"{outcome}"),
                  {"rule": "forecast", "frame": frame["frame"], "start_ns": frame["start_ns"],
                   "end_ns": frame["end_ns"], "likelihood": frame["likelihood"], "threshold": self.likelihood,
                   "event": frame["event"], "fraction": frame["fraction"]})
        return frame


def when(run: Any, event: str = "idle", fraction: float = 0.25, likelihood: float = 0.8, *,
         do: Callable[[dict], Any], model: Any = None, window: int | None = None, interval: float = 1.0,
         start: bool = True) -> Rule:
    """Watch ``run`` and call ``do(frame)`` once per frame predicted to have at least ``fraction`` of the
    resources in ``event`` with a likelihood >= ``likelihood`` (see the module's docstring). ``model``: a
    :class:`~flowscope.analysis.forecast.WindowModel` or the path of one; ``window`` forces the frame size.
    With ``start=False`` nothing runs until :meth:`Rule.start` (or call :meth:`Rule.check` yourself)."""
    from flowscope.analysis.forecast import check_fraction, load_model
    from flowscope.analysis.forecast.signal import check_event

    check_event(event)
    f = check_fraction(fraction)
    try:
        lk = float(likelihood)
    except (TypeError, ValueError):
        raise ValueError(f"likelihood: expected a number within [0, 1], got {likelihood!r}") from None
    if not 0.0 <= lk <= 1.0:
        raise ValueError(f"likelihood: must be within [0, 1], got {likelihood!r}")
    if not callable(do):
        raise TypeError(f"do: expected a callable, got {type(do).__name__}")
    if interval <= 0:
        raise ValueError(f"interval: must be > 0 seconds, got {interval}")
    if isinstance(model, (str, Path)):
        model = load_model(model)
    rule = Rule(_source(run, event, f, model, window), lk, do, interval, audit=auditor(run))
    return rule.start() if start else rule
