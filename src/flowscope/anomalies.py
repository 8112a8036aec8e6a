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
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flowscope.feedback import Watch, auditor, run_source

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

    return run_source(run, local, remote)


class AnomalyRule(Watch):
    """A watch started by :func:`when`; ``fired`` lists the anomalies the callback was called for. :meth:`stop`
    does one last round, so that what the run holds then is acted on."""

    thread_name = "flowscope-anomaly-rule"
    final_round = True

    def __init__(self, get: Callable[[], list[dict]], keep: Callable[[dict], bool], do: Callable[[dict], Any],
                 interval: float, audit: tuple[Callable[[str, dict], None], Callable[[], None]] | None = None):
        super().__init__(do, interval, audit)
        self._get, self._keep = get, keep
        self._seen: set[int] = set()

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
                self._act(row, lambda action, outcome, row=row: (
                    f"anomaly rule acted: {action} for {row['function']} {row.get('task_key')} "
                    f"(score {row['score']:.3g} >= {row['threshold']:.3g}): {outcome}"),
                    {"rule": "anomaly", **{k: row.get(k) for k in _AUDITED}})
            return acted


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
