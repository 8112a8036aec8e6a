"""Memory per worker beyond the process's resident size: the runtime's managed memory (the data it holds) and what
it spilled to disk, as Dask's own dashboard shows them, recorded by the Dask capture from a real LocalCluster whose
workers spill, and drawn by the overview's memory panel."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from test_dashboard import WAIT_MS, browser  # noqa: F401  (fixture)
from test_dashboard_pages import SCREENSHOTS_ENV
from test_run_pages_offline import _open

import flowscope
from flowscope.model.semantics import PROCESS_MEMORY_MANAGED, PROCESS_MEMORY_SPILLED
from flowscope.report import write_report
from flowscope.report.views import memory_view

CHUNK = 8_000_000  # bytes per held array


def _block(i: int) -> np.ndarray:
    return np.full(CHUNK // 8, float(i))


@pytest.fixture(scope="module")
def spilled_run(tmp_path_factory):
    """One worker with a 400 MB limit that spills the data it holds beyond 10 % of it (Dask's ``target``; not on its
    process memory), holding ten 8 MB arrays;
    the run is closed once the capture has sampled the worker holding them all."""
    import dask
    import distributed
    from distributed import Client, LocalCluster

    store = tmp_path_factory.mktemp("worker-memory") / "store"
    held = 10 * CHUNK
    with dask.config.set({"distributed.worker.memory.target": 0.1, "distributed.worker.memory.spill": False,
                          "distributed.worker.memory.pause": False, "distributed.worker.memory.terminate": False}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, memory_limit="400MB",
                         dashboard_address=None, worker_dashboard_address=None) as cluster, Client(cluster) as client, \
            flowscope.observe(client, store=store, name="worker-memory", hardware_period=0.2) as obs:
        futures = [client.submit(_block, i, key=f"block-{i}") for i in range(10)]
        distributed.wait(futures)
        # spilled by now (Dask spills above target when a key is stored); hold the data until the capture has
        # sampled it: the samples' values decide, not a sleep
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            obs.client.flush()
            got = obs.run.sql(f"""SELECT max(value) FILTER (WHERE name = '{PROCESS_MEMORY_MANAGED}') AS managed,
                                         max(value) FILTER (WHERE name = '{PROCESS_MEMORY_SPILLED}') AS spilled
                                  FROM metrics""").iloc[0]
            if got["managed"] == got["managed"] and got["spilled"] == got["spilled"] \
                    and got["managed"] + got["spilled"] >= held and got["spilled"] > 0:
                break
            time.sleep(0.2)
        spilled_disk, managed_bytes = client.run(
            lambda dask_worker: (dask_worker.data.spilled_total.disk, dask_worker.state.nbytes)).popitem()[1]
        del futures
    return obs.run.path, held, spilled_disk, managed_bytes


def test_the_capture_records_each_workers_managed_and_spilled_memory(spilled_run):
    run_dir, held, spilled_disk, managed_bytes = spilled_run
    run = flowscope.open_run(run_dir)
    view = memory_view(run)
    workers = [p for p in view["processes"] if p.get("managed")]
    assert len(workers) == 1
    w = workers[0]
    # the three series are sampled together: one time axis
    assert len(w["t"]) == len(w["bytes"]) == len(w["managed"]) == len(w["spilled"]) > 1
    # what Dask itself counted while the data was held: all of it managed, beyond target spilled to disk
    assert managed_bytes >= held and spilled_disk > 0
    at = int(np.argmax(np.array(w["managed"]) + np.array(w["spilled"])))
    assert w["managed"][at] + w["spilled"][at] >= held
    assert 0 < w["spilled"][at] and 0 < w["managed"][at] < held  # some of it on disk, the rest in memory
    assert all(m <= r for m, r in zip(w["managed"], w["bytes"]))  # the data held is within the process's memory


def test_the_overview_draws_managed_and_spilled_memory_beside_the_resident_size(spilled_run, browser, tmp_path):  # noqa: F811
    run_dir = spilled_run[0]
    out = write_report(run_dir, tmp_path / "report.html")
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = _open(context, out.as_uri())
    pg.wait_for_function("() => { const d = document.getElementById('memory'); return d && d.data && "
                         "d.data.length >= 3; }", timeout=WAIT_MS)
    names = pg.evaluate("() => document.getElementById('memory').data.map(t => t.name)")
    assert any(n.endswith("resident") for n in names), names
    assert any(n.endswith("managed") for n in names), names
    assert any(n.endswith("spilled to disk") for n in names), names
    view = memory_view(flowscope.open_run(run_dir))
    w = next(p for p in view["processes"] if p.get("managed"))
    managed = pg.evaluate("() => document.getElementById('memory').data.find(t => t.name.endsWith('managed')).y")
    assert managed == pytest.approx([b / 1048576 for b in w["managed"]])
    assert pg.errors == [] and pg.outside == []
    if os.environ.get(SCREENSHOTS_ENV):  # docs/img's picture of the panel
        pg.locator("section[aria-labelledby=h-memory]").screenshot(
            path=str(Path(os.environ[SCREENSHOTS_ENV]) / "dashboard-memory-spilled.png"))
    context.close()
