"""``flowscope.anomalies``: act on the anomaly detector's verdicts as they appear.

``when(run, do=callback)`` watches a run's ``anomalies`` table (written live by the detectors that
``observe(client, anomalies=True)`` or ``flowscope run --anomalies`` puts next to the workers, or afterwards by
``flowscope anomalies``) and calls ``callback(anomaly)`` once per anomaly (the table's row as a dict: ``anomaly_id``,
``function``, ``task_key``, ``resource_id``, ``start_ns``, ``end_ns``, ``score``, ``threshold``, ``severity_ns``,
...) that passes the filters: ``min_severity_ns`` (time lost against the function's mean), ``min_score``,
``functions``. ``run`` is what :func:`flowscope.forecast.when` takes: a run directory, a ``Run``, a
``flowscope.Client`` or ``(address, run_id)``. The watch runs on a daemon thread every ``interval`` seconds until
:meth:`AnomalyRule.stop`; :meth:`AnomalyRule.check` does one round in the calling thread.

Every action taken on a live run leaves an audit row in its ``logs`` (category ``feedback``; attrs ``rule``
("anomaly"), ``action``, ``outcome``, ``anomaly_id``, ``function``, ``task_key``, ``resource_id``, ``start_ns``,
``end_ns``, ``score``, ``severity_ns``, and ``result`` when the callback returned a dict: the ready-made actions of
:mod:`flowscope.feedback` do).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flowscope.feedback import auditor

__all__ = ["AnomalyRule", "when"]

_PAGE = 100_000  # the collector's largest page of a table (service/app.py QUERY_LIMIT_MAX)
_AUDITED = ("anomaly_id", "function", "task_key", "resource_id", "start_ns", "end_ns", "score", "severity_ns")


def _rows(run: Any) -> Callable[[], list[dict]]:
    """A function returning the run's anomaly rows now."""
    from flowscope.store.run import Run

    def local(path: Path) -> Callable[[], list[dict]]:
        def get() -> list[dict]:
            r = Run(path)
            try:
                return r.sql_arrow("SELECT * FROM anomalies ORDER BY start_ns").to_pylist()
            finally:
                r.close()
        return get

    def remote(address: str, run_id: str) -> Callable[[], list[dict]]:
        base = f"{address.rstrip('/')}/v1/runs/{urllib.parse.quote(run_id)}/tables/anomalies"

        def get() -> list[dict]:
            out: list[dict] = []
            while True:
                q = urllib.parse.urlencode({"limit": _PAGE, "offset": len(out), "order_by": "start_ns"})
                try:
                    with urllib.request.urlopen(f"{base}?{q}", timeout=60) as resp:
                        page = json.loads(resp.read())
                except urllib.error.HTTPError as exc:
                    raise ValueError(f"{base}: {exc.code} {exc.read().decode(errors='replace')}") from None
                rows = page["rows"] if isinstance(page, dict) else page
                out.extend(rows)
                if len(rows) < _PAGE:
                    return out
        return get

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


class AnomalyRule:
    """A watch started by :func:`when`; ``fired`` lists the anomalies the callback was called for."""

    def __init__(self, get: Callable[[], list[dict]], keep: Callable[[dict], bool], do: Callable[[dict], Any],
                 interval: float, audit: tuple[Callable[[str, dict], None], Callable[[], None]] | None = None):
        self._get, self._keep, self._do, self.interval, self._audit = get, keep, do, interval, audit
        self.fired: list[dict] = []
        self.error: BaseException | None = None  # what stopped the watch, if anything failed
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def check(self) -> list[dict]:
        """One round: read the anomalies; call the callback for each new one that passes the filters. Returns
        those acted on (an action that raises stops the round, and raises)."""
        with self._lock:
            new = [r for r in self._get() if r["anomaly_id"] not in self._seen and self._keep(r)]
            acted = []
            for row in new:
                self._seen.add(row["anomaly_id"])
                self.fired.append(row)
                acted.append(row)
                self._act(row)
            return acted

    def _act(self, row: dict) -> None:
        outcome, result = "ok", None
        try:
            result = self._do(row)
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            if self._audit is not None:
                action = getattr(self._do, "__qualname__", None) or repr(self._do)
                self._audit[0](f"anomaly rule acted: {action} for {row['function']} {row.get('task_key')} "
                               f"(score {row['score']:.3g} >= {row['threshold']:.3g}): {outcome}",
                               {"rule": "anomaly", "action": action, "outcome": outcome,
                                **{k: row.get(k) for k in _AUDITED},
                                **({"result": result} if isinstance(result, dict) else {})})

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - kept for the caller, the watch stops
                self.error = exc
                return
            self._stop.wait(self.interval)

    def start(self) -> AnomalyRule:
        self._thread = threading.Thread(target=self._loop, name="flowscope-anomaly-rule", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """End the watch (after one last round, so that what the run holds now is acted on) and deliver its audit
        rows."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self.error is None:
                try:
                    self.check()
                except Exception as exc:  # noqa: BLE001 - kept for the caller
                    self.error = exc
        if self._audit is not None:
            audit, self._audit = self._audit, None
            audit[1]()

    def __enter__(self) -> AnomalyRule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def when(run: Any, *, do: Callable[[dict], Any], min_severity_ns: int | None = None, min_score: float | None = None,
         functions: Iterable[str] | None = None, interval: float = 1.0, start: bool = True) -> AnomalyRule:
    """Watch ``run`` and call ``do(anomaly)`` once per anomaly that passes the filters (see the module's
    docstring). With ``start=False`` nothing runs until :meth:`AnomalyRule.start` (or call ``check()``)."""
    if not callable(do):
        raise TypeError(f"do: expected a callable, got {type(do).__name__}")
    if interval <= 0:
        raise ValueError(f"interval: must be > 0 seconds, got {interval}")
    names = None if functions is None else frozenset(functions)

    def keep(row: dict) -> bool:
        return ((min_severity_ns is None or row["severity_ns"] >= min_severity_ns)
                and (min_score is None or row["score"] >= min_score)
                and (names is None or row["function"] in names))

    rule = AnomalyRule(_rows(run), keep, do, interval, audit=auditor(run))
    return rule.start() if start else rule
