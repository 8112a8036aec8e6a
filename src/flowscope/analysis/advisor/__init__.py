"""Why is this run slow, and why did it change: the advisor.

:func:`explain` attributes one run's makespan to what the chain that bounded it was doing (client-side graph
construction and submission, scheduler overhead, queueing, transfers, compute, I/O, GC and event-loop stalls,
spilling; with the idle capacity beside it: :mod:`~flowscope.analysis.advisor.attribution`), then ranks
findings by the time they could recover, each with its evidence and a concrete change
(:mod:`~flowscope.analysis.advisor.rules`). :func:`explain_runs` adds, for two or more runs, what changed
between them and how much of the difference each change explains
(:mod:`~flowscope.analysis.advisor.changes`). Plain functions over a run's tables, in the model's vocabulary
(spans' semantic categories, transitions, transfers, io, logs); ``facts`` gathers what they read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from flowscope.analysis.advisor import rules as R
from flowscope.analysis.advisor.attribution import attribute, capacity
from flowscope.analysis.advisor.facts import RunFacts, run_facts
from flowscope.analysis.advisor.rules import Finding
from flowscope.store.run import Run
from flowscope.store.run_set import RunSet

__all__ = ["Explanation", "Finding", "RunFacts", "explain", "explain_runs", "find", "rank", "run_facts"]


@dataclass
class Explanation:
    """One run explained: its wall time (``wall_s``), the task phase, the makespan's attribution (a table, see
    :func:`~flowscope.analysis.advisor.attribution.attribute`), the idle capacity, the findings ranked, and with
    several runs ``changes`` (what changed and how much of the difference each part explains) and ``compared``."""

    run_id: str
    name: str | None
    wall_s: float
    task_phase_s: float
    tasks: int
    slots: int
    attribution: pd.DataFrame
    capacity: dict
    findings: list[Finding]
    changes: pd.DataFrame | None = None
    compared: dict | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready."""
        def rows(df: pd.DataFrame | None) -> list[dict] | None:
            if df is None:
                return None
            return json.loads(df.to_json(orient="records", double_precision=15)) if len(df) else []

        return {"run_id": self.run_id, "name": self.name, "wall_s": self.wall_s, "task_phase_s": self.task_phase_s,
                "tasks": self.tasks, "slots": self.slots, "attribution": rows(self.attribution),
                "capacity": self.capacity, "findings": [f.to_dict() for f in self.findings],
                "changes": rows(self.changes), "compared": self.compared, "notes": self.notes}


def find(facts: RunFacts) -> list[Finding]:
    """Every finding the rules support, unranked."""
    out: list[Finding] = []
    for rule in R.SIMPLE_RULES:
        out.extend(rule(facts))
    slow = R.slow_workers(facts)
    out.extend(slow)
    skewed = R.skewed_tasks(facts, {g for f in slow for g in f.about.get("groups", [])})
    out.extend(skewed)
    # flagged tasks of a slow worker's group there, or of an unbalanced group, are those findings' evidence
    covered = {(g, w) for f in slow for g in f.about.get("groups", []) for w in f.about.get("workers", [])}
    covered |= {(g, w) for f in skewed for g in f.about.get("groups", []) for w in facts.tasks["worker"].unique()}
    out.extend(R.anomalies(facts, covered))
    return out


def _shares(a: dict, b: dict) -> bool:
    return any(set(a.get(k, ())) & set(b.get(k, ())) for k in ("groups", "workers", "keys", "paths"))


def rank(findings: list[Finding], task_phase_s: float) -> list[Finding]:
    """Findings by recoverable time, largest first (unknown last); a finding that recovers less than
    :data:`~flowscope.analysis.advisor.rules.MIN_SHARE` of the task phase is left out; a symptom that a cause
    about the same group, worker, key or file explains is listed after the findings nobody explains, naming it."""
    kept = [f for f in findings
            if f.recoverable_s is None or f.recoverable_s >= R.MIN_SHARE * max(task_phase_s, 0.0) and f.recoverable_s > 0]
    causes = sorted([f for f in kept if f.kind == "cause"], key=lambda f: -(f.recoverable_s or 0.0))
    for f in kept:
        if f.kind == "symptom":
            by = next((c for c in causes if _shares(c.about, f.about)), None)
            f.explained_by = by.rule if by is not None else None

    def key(f: Finding):
        return (f.explained_by is not None, f.recoverable_s is None, -(f.recoverable_s or 0.0))
    return sorted(kept, key=key)


def explain(run: Run, facts: RunFacts | None = None) -> Explanation:
    """Explain ``run``: the makespan's attribution and the ranked findings (:class:`Explanation`)."""
    f = facts or run_facts(run)
    notes = []
    if not len(f.tasks):
        notes.append("the run has no tasks: nothing to attribute beyond its wall time")
    elif f.paths is None or f.paths.measured is None:
        notes.append("no measured critical path (task times derived): replays and path findings are unavailable")
    return Explanation(run_id=run.run_id, name=run.meta.get("name"), wall_s=f.wall_s, task_phase_s=f.task_phase_s,
                       tasks=len(f.tasks), slots=f.slots, attribution=attribute(f), capacity=capacity(f),
                       findings=rank(find(f), f.task_phase_s), notes=notes)


def explain_runs(runs: RunSet, before: list[str] | None = None, after: list[str] | None = None) -> Explanation:
    """Explain the last run of ``runs`` (of ``after`` when given) and what changed against the others (or
    ``before``): :func:`~flowscope.analysis.advisor.changes.what_changed`."""
    from flowscope.analysis.advisor.changes import what_changed

    ids = runs.run_ids
    if not ids:
        raise ValueError("no runs to explain")
    after = list(after) if after else ids[-1:]
    before = list(before) if before else [i for i in ids if i not in after]
    e = explain(runs.run(after[-1]))
    if before:
        e.changes, e.compared = what_changed(runs, before, after)
    return e
