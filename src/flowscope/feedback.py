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
from collections.abc import Callable
from typing import Any

__all__ = ["Action", "adapt_cluster", "auditor", "scale_cluster", "signal_process", "stop_process"]


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
