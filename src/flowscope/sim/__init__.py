"""Workflow simulators: the Crux paper's five patterns run as real processes (patterns.py, worker.py) and
random layered DAGs for benchmarks (dag.py)."""

from flowscope.sim.dag import layered_dag
from flowscope.sim.patterns import PATTERNS, Plan, build, execute

__all__ = ["PATTERNS", "Plan", "build", "execute", "layered_dag"]
