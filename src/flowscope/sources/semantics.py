"""What the spans and resources of flowscope's own live sources mean (model/semantics.py).

Kept apart from the sources themselves (which re-export theirs as ``SEMANTICS``) so that a run can declare
them when it opens without importing Dask."""

from __future__ import annotations

#: Dask.distributed (sources/dask/plugins.py): a task's execution on the worker thread that ran it computes;
#: the worker's fetches (``transfer``) communicate and its spill (``disk-read``/``disk-write``) is I/O, both
#: on the worker, whose threads are what executes
DASK_DISTRIBUTED = {
    "source": "dask-distributed",
    "spans": [
        {"when": {"kind": "task"}, "category": "compute", "role": "task", "group": "name"},
        {"when": {"kind": "transfer"}, "category": "communication", "role": "other", "group": "name"},
        {"when": {"kind": ["disk-read", "disk-write"]}, "category": "io", "role": "other", "group": "name"},
    ],
    "resources": [
        {"when": {"kind": "thread"}, "executes": True, "slots": 1},
        {"when": {"kind": ["worker", "scheduler", "client", "host", "process"]}, "executes": False},
    ],
}

#: Dask's local schedulers (sources/dask/local.py): tasks on the pool's (or the caller's) threads
DASK_LOCAL = {
    "source": "dask-local",
    "spans": [{"when": {"kind": "task"}, "category": "compute", "role": "task", "group": "name"}],
    "resources": [
        {"when": {"kind": "thread"}, "executes": True, "slots": 1},
        {"when": {"kind": ["host", "process"]}, "executes": False},
    ],
}

#: Python tracing (sources/python_tracing.py) and the client's own spans: traced calls on their thread
PYTHON_TRACING = {
    "source": "python-tracing",
    "spans": [{"when": {"kind": "call"}, "category": "compute", "role": "call", "group": "name"}],
    "resources": [
        {"when": {"kind": "thread"}, "executes": True, "slots": 1},
        {"when": {"kind": ["host", "process"]}, "executes": False},
    ],
}

#: what ``flowscope run`` may record from the command it observes
LIVE = [DASK_DISTRIBUTED, DASK_LOCAL, PYTHON_TRACING]
