"""Workflow Critical Path (WCP): which chain of work and waiting decided when a workflow finished.

Two graphs, used offline (over a stored run) and online (the collector, through
:class:`IncrementalDataStatePath`):

* the data-state graph of the Crux paper (vertices: ``data_states``; edges: ``mutations``). Every path between
  two timestamped states spans the same elapsed time, so the critical path is the *gating* chain: traced back
  from the final state, at each state the input that arrived last (:func:`data_state_path`);
* the task graph (``spans`` of kind task, ``dependencies``, ``transfers``): the *measured* path, traced back
  from the last task to finish through the gating input or the wait for a thread, and the *structural* path,
  the longest path through the DAG with the tasks' durations (:func:`task_graph_paths`); per-task slack,
  near-critical paths and what-if replays with scaled durations. When the task times were derived rather
  than measured (see :mod:`flowscope.analysis.timeline`), there were no waits to trace: only the structural
  path is given. Over a stored run, the vertices are its units of work (:func:`work_units`): its tasks, else each
  executing resource's outermost spans, else its timed I/O operations; with no dependencies between them the
  measured path is the sequence of the resource that finished last, its gaps idle.

Every path is a :class:`CriticalPath`: a table of contiguous steps, each one component of the elapsed time
(compute, transfer, io, wait, queue; idle), plus attribution helpers. A run with no path at all gets the reason
and what would supply one (:func:`missing_path_reason`).

The modules: ``steps`` (the path as steps, and its attribution), ``tables`` (reading the input tables),
``data_states`` (the data-state graph's path, offline and incremental), ``task_graph`` (the task graph built
from the tables, and a run's units of work), ``missing`` (why a run has no path, and what would give it one),
``longest`` (longest paths of a weighted DAG) and ``task_paths`` (measured and structural
paths, slack, near-critical paths, what-if). This package's names are the public ones.
"""

from __future__ import annotations

from flowscope.analysis.critical_path.data_states import (
    IncrementalDataStatePath,
    data_state_path,
)
from flowscope.analysis.critical_path.longest import longest_path, longest_path_length
from flowscope.analysis.critical_path.missing import missing_path_reason
from flowscope.analysis.critical_path.steps import (
    COMPONENTS,
    IDLE_COMPONENT,
    CriticalPath,
)
from flowscope.analysis.critical_path.steps import STEP_COLUMNS as STEP_COLUMNS
from flowscope.analysis.critical_path.task_graph import (
    IO_UNIT as IO_UNIT,
)
from flowscope.analysis.critical_path.task_graph import (
    SPAN_UNIT as SPAN_UNIT,
)
from flowscope.analysis.critical_path.task_graph import (
    TASK_UNIT as TASK_UNIT,
)
from flowscope.analysis.critical_path.task_graph import (
    work_units as work_units,  # not in __all__, as before
)
from flowscope.analysis.critical_path.task_paths import (
    TaskPaths,
    near_critical_paths,
    slack,
    task_graph_paths,
    what_if,
)

__all__ = [
    "COMPONENTS", "IDLE_COMPONENT", "CriticalPath", "TaskPaths", "IncrementalDataStatePath", "data_state_path",
    "task_graph_paths", "longest_path", "longest_path_length", "slack", "near_critical_paths", "what_if",
    "missing_path_reason",
]
