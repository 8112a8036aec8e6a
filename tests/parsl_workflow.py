"""A small real Parsl workflow with Parsl's monitoring on (its SQLite database), for tests/test_parsl.py.

Six ``work`` tasks (50 ms each), six ``double`` tasks each needing one of them, a ``total`` needing every ``double``,
and a ``boom``, submitted first, that raises (the workflow catches it), on a local HighThroughputExecutor of WORKERS worker processes.

    python tests/parsl_workflow.py OUT_DIR     # writes OUT_DIR/monitoring.db; prints the result as JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import parsl
from parsl import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.monitoring.monitoring import MonitoringHub
from parsl.providers import LocalProvider

WORKERS = 2
N = 6


@python_app
def work(i):
    import time

    time.sleep(0.05)
    return i + 1


@python_app
def double(x):
    import time

    time.sleep(0.02)
    return 2 * x


@python_app
def total(*xs):
    return sum(xs)


@python_app
def boom():
    raise ValueError("planted failure")


def main(out: Path) -> dict:
    cfg = Config(executors=[HighThroughputExecutor(label="htex", max_workers_per_node=WORKERS,
                                                   provider=LocalProvider(init_blocks=1, max_blocks=1))],
                 monitoring=MonitoringHub(hub_address="127.0.0.1", logging_endpoint=f"sqlite:///{out / 'monitoring.db'}",
                                          resource_monitoring_interval=1),
                 run_dir=str(out / "runinfo"), retries=0)
    with parsl.load(cfg):
        failing = boom()  # first: it fails while the others run, and total stays the last task to end
        doubled = [double(work(i)) for i in range(N)]
        result = total(*doubled).result()
        try:
            failing.result()
            failed = None
        except ValueError as exc:
            failed = str(exc)
    return {"result": result, "failed": failed}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]).resolve())))
