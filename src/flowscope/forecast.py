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
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowscope.feedback import auditor

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

    if isinstance(run, Run):
        return local(run.path)
    if isinstance(run, (str, Path)):
        return local(Path(run))
    if isinstance(run, tuple) and len(run) == 2:
        return remote(str(run[0]), str(run[1]))
    run_dir = getattr(run, "run_dir", None)
    if run_dir is not None:  # an embedded Client
        return local(Path(run_dir))
    if getattr(run, "address", None) and getattr(run, "run_id", None):
        return remote(run.address, run.run_id)
    raise TypeError(f"run: expected a run directory, a Run, a flowscope.Client or (address, run_id), "
                    f"got {type(run).__name__}")


class Rule:
    """A watch started by :func:`when`; ``fired`` lists the frames the callback was called for."""

    def __init__(self, get: Callable[[], dict | None], likelihood: float, do: Callable[[dict], Any],
                 interval: float, audit: tuple[Callable[[str, dict], None], Callable[[], None]] | None = None):
        self._get, self.likelihood, self._do, self.interval = get, likelihood, do, interval
        self._audit = audit
        self.fired: list[dict] = []
        self.last: dict | None = None  # the last prediction read
        self.error: BaseException | None = None  # what stopped the watch, if anything failed
        self._done_frames: set[int] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

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
        outcome, result = "ok", None
        try:
            result = self._do(frame)
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            if self._audit is not None:
                action = getattr(self._do, "__qualname__", None) or repr(self._do)
                self._audit[0](f"forecast rule acted: {action} for frame {frame['frame']} "
                               f"(likelihood {frame['likelihood']:.3f} >= {self.likelihood:g}): {outcome}",
                               {"rule": "forecast", "action": action, "outcome": outcome, "frame": frame["frame"],
                                "start_ns": frame["start_ns"], "end_ns": frame["end_ns"],
                                "likelihood": frame["likelihood"], "threshold": self.likelihood,
                                "event": frame["event"], "fraction": frame["fraction"],
                                **({"result": result} if isinstance(result, dict) else {})})
        return frame

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - kept for the caller, the watch stops
                self.error = exc
                return
            self._stop.wait(self.interval)

    def start(self) -> Rule:
        self._thread = threading.Thread(target=self._loop, name="flowscope-forecast-rule", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """End the watch (waits for a round under way) and deliver its audit rows."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._audit is not None:
            audit, self._audit = self._audit, None
            audit[1]()

    def __enter__(self) -> Rule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
