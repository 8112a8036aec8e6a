"""``flowscope.feedback``: ready-made actions for a rule on a live analysis (``flowscope.forecast.when(..., do=...)``)
that act on the workflow: signal or stop a process, scale a Dask cluster directly or through its adaptive API.

Each action is called with the frame the rule acted on and returns what it changed; the rule writes both into
the action's audit row (``logs``, category ``feedback``: ``action`` is the action's repr, e.g.
``signal_process(pid=4242, signal=SIGUSR1)``, ``result`` what it returned). An action that fails raises, and its
audit row says so. Submitting work needs no helper: ``do=lambda frame: client.submit(...)``.
"""

from __future__ import annotations

import os
import signal as _signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Action", "Watch", "adapt_cluster", "auditor", "run_source", "scale_cluster", "signal_process",
           "stop_process"]


def auditor(run: Any) -> tuple[Callable[[str, dict], None], Callable[[], None]] | None:
    """Where a rule's actions leave their audit rows (``logs``, category ``feedback``): (write a row, deliver the
    rows) for a live ``run`` (a Client, or (address, run_id)); None for a run read from its directory, which is
    not written to."""
    if isinstance(run, tuple) and len(run) == 2:
        from flowscope.client.client import Client

        client = Client(str(run[0]), run_id=str(run[1]))  # joins the run: never closes it
        return (lambda msg, attrs: client.log(msg, category="feedback", attrs=attrs)), client.close
    if callable(getattr(run, "log", None)) and getattr(run, "run_id", None):  # a Client, its collector embedded or not
        return (lambda msg, attrs: run.log(msg, category="feedback", attrs=attrs)), lambda: run.flush()
    return None


def run_source(run: Any, local: Callable[[Path], Any], remote: Callable[[str, str], Any]) -> Any:
    """``local(run directory)`` or ``remote(address, run_id)``, for what ``run`` names: a run directory, a ``Run``, a
    ``flowscope.Client`` (embedded: its directory; else its collector) or ``(address, run_id)``."""
    from flowscope.store.run import Run

    if isinstance(run, Run):
        return local(run.path)
    if isinstance(run, (str, Path)):
        return local(Path(run))
    if isinstance(run, tuple) and len(run) == 2:
        return remote(str(run[0]), str(run[1]))
    if getattr(run, "run_dir", None) is not None:  # an embedded Client
        return local(Path(run.run_dir))
    if getattr(run, "address", None) and getattr(run, "run_id", None):
        return remote(run.address, run.run_id)
    raise TypeError(f"run: expected a run directory, a Run, a flowscope.Client or (address, run_id), "
                    f"got {type(run).__name__}")


class Watch:
    """What every rule on a live analysis shares: ``check()`` (one round, the subclass's) on a daemon thread every
    ``interval`` seconds until :meth:`stop`, the callback ``do`` run with its audit row, ``fired`` and ``error``
    (what stopped the watch). With ``final_round``, :meth:`stop` does one last round first."""

    thread_name = "flowscope-rule"
    final_round = False

    def __init__(self, do: Callable[[dict], Any], interval: float,
                 audit: tuple[Callable[[str, dict], None], Callable[[], None]] | None = None):
        self._do, self.interval, self._audit = do, interval, audit
        self.fired: list[dict] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def check(self) -> Any:
        raise NotImplementedError

    def _act(self, subject: dict, describe: Callable[[str, str], str], attrs: dict) -> None:
        """``do(subject)``, then its audit row: ``describe(action, outcome)`` as the message, ``attrs`` with the
        action, its outcome and what it returned (a dict) as attrs. An action that raises raises on."""
        outcome, result = "ok", None
        try:
            result = self._do(subject)
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            if self._audit is not None:
                action = getattr(self._do, "__qualname__", None) or repr(self._do)
                self._audit[0](describe(action, outcome),
                               {"rule": attrs["rule"], "action": action, "outcome": outcome, **attrs,
                                **({"result": result} if isinstance(result, dict) else {})})

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - kept for the caller, the watch stops
                self.error = exc
                return
            self._stop.wait(self.interval)

    def start(self) -> Watch:
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """End the watch (waits for a round under way; with ``final_round`` one more round, so that what the run
        holds now is acted on) and deliver its audit rows."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self.final_round and self.error is None:
                try:
                    self.check()
                except Exception as exc:  # noqa: BLE001 - kept for the caller
                    self.error = exc
        if self._audit is not None:
            audit, self._audit = self._audit, None
            audit[1]()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Action:
    """A feedback action: ``action(frame)`` acts and returns what it changed (a dict for the audit row)."""

    def __call__(self, frame: dict) -> dict:
        raise NotImplementedError


def _cluster_name(cluster: Any) -> str:
    return type(cluster).__name__


class signal_process(Action):  # noqa: N801 - used like a function: do=signal_process(pid)
    """Send ``signal`` (default SIGUSR1, which a program can catch to checkpoint, shed load, ...) to process
    ``pid``."""

    def __init__(self, pid: int, signal: int = _signal.SIGUSR1):
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise ValueError(f"pid: expected a positive process id, got {pid!r}")
        self.pid, self.signal = pid, _signal.Signals(signal)
        self._name = "signal_process"

    def __call__(self, frame: dict) -> dict:
        os.kill(self.pid, self.signal)
        return {"pid": self.pid, "signal": self.signal.name}

    def __repr__(self) -> str:
        return f"{self._name}(pid={self.pid}, signal={self.signal.name})"


def stop_process(pid: int, signal: int = _signal.SIGTERM) -> signal_process:
    """Ask process ``pid`` to stop (SIGTERM; SIGKILL if asked)."""
    action = signal_process(pid, signal)
    action._name = "stop_process"
    return action


class scale_cluster(Action):  # noqa: N801
    """Change a Dask cluster's workers by ``by`` (negative: fewer) through ``cluster.scale``, kept within
    [``minimum``, ``maximum``]; the cluster is one whose ``workers`` lists its workers and whose ``scale(n)`` sets
    their number: LocalCluster and the other SpecCluster deployments (dask-jobqueue's, ...)."""

    def __init__(self, cluster: Any, by: int = -1, minimum: int = 1, maximum: int | None = None):
        if not isinstance(by, int) or by == 0:
            raise ValueError(f"by: expected a non-zero number of workers, got {by!r}")
        if minimum < 0 or (maximum is not None and maximum < minimum):
            raise ValueError(f"minimum: must be >= 0 and <= maximum, got {minimum!r} and {maximum!r}")
        self.cluster, self.by, self.minimum, self.maximum = cluster, by, minimum, maximum

    def __call__(self, frame: dict) -> dict:
        before = len(self.cluster.workers)
        after = max(self.minimum, before + self.by)
        if self.maximum is not None:
            after = min(self.maximum, after)
        if after != before:
            self.cluster.scale(after)
        return {"workers_before": before, "workers_after": after}

    def __repr__(self) -> str:
        return (f"scale_cluster({_cluster_name(self.cluster)}, by={self.by}, minimum={self.minimum}, "
                f"maximum={self.maximum})")


class adapt_cluster(Action):  # noqa: N801
    """Set the bounds of a Dask cluster's adaptive scaling (``cluster.adapt(minimum=, maximum=, **adaptive)``):
    Dask then retires idle workers down to ``minimum`` and adds workers up to ``maximum`` as the work needs;
    ``adaptive`` goes to Dask's Adaptive (``interval``, ``wait_count``, ...). ``adaptive`` is the Adaptive object
    once the action ran."""

    def __init__(self, cluster: Any, minimum: int = 1, maximum: int = 1, **adaptive: Any):
        if minimum < 0 or maximum < minimum:
            raise ValueError(f"minimum: must be <= maximum and >= 0, got {minimum!r} and {maximum!r}")
        self.cluster, self.minimum, self.maximum, self.options = cluster, minimum, maximum, adaptive
        self.adaptive: Any = None

    def __call__(self, frame: dict) -> dict:
        self.adaptive = self.cluster.adapt(minimum=self.minimum, maximum=self.maximum, **self.options)
        return {"minimum": self.minimum, "maximum": self.maximum}

    def __repr__(self) -> str:
        return f"adapt_cluster({_cluster_name(self.cluster)}, minimum={self.minimum}, maximum={self.maximum})"
