"""Observe Dask.distributed runs: register flowscope's plugins on a cluster, three ways.

- ``with flowscope.observe(client) as obs:`` records everything the cluster does inside the block
  into a new run (an embedded collector in this process, reachable by the cluster over HTTP);
- ``flowscope.dask.register(client, address, run_id)`` adds the plugins to a cluster for a run
  that already has a collector;
- ``--preload flowscope.dask`` on ``dask scheduler`` / ``dask worker`` (or the dask config
  ``distributed.scheduler.preload`` / ``distributed.worker.preload``) installs them from
  $FLOWSCOPE_ADDRESS and $FLOWSCOPE_RUN, so schedulers and workers started by any script join.

Worker plugins registered through a client are installed on workers that join later, too.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from flowscope.sources.dask.plugins import FlowscopeSchedulerPlugin, FlowscopeWorkerPlugin

__all__ = ["FlowscopeSchedulerPlugin", "FlowscopeWorkerPlugin", "register", "unregister", "observe", "dask_setup"]


def register(dask_client, address: str, run_id: str) -> None:
    """Install the scheduler and worker plugins on ``dask_client``'s cluster for run ``run_id``."""
    dask_client.register_plugin(FlowscopeSchedulerPlugin(address, run_id), name=FlowscopeSchedulerPlugin.name)
    dask_client.register_plugin(FlowscopeWorkerPlugin(address, run_id), name=FlowscopeWorkerPlugin.name)


async def _close_scheduler_plugin(dask_scheduler) -> int:
    plugin = dask_scheduler.plugins.get(FlowscopeSchedulerPlugin.name)
    if plugin is None:
        return 0
    errors = plugin.errors
    await plugin.close()
    return errors


def _worker_errors(dask_worker) -> int:
    plugin = dask_worker.plugins.get(FlowscopeWorkerPlugin.name)
    return plugin.errors if plugin is not None else 0


def unregister(dask_client) -> dict[str, int]:
    """Flush and remove the plugins; returns how many hook calls failed on the scheduler and on each worker."""
    errors = {"scheduler": dask_client.run_on_scheduler(_close_scheduler_plugin)}
    errors.update(dask_client.run(_worker_errors))
    dask_client.unregister_worker_plugin(FlowscopeWorkerPlugin.name)  # teardown flushes and closes
    dask_client.unregister_scheduler_plugin(FlowscopeSchedulerPlugin.name)
    return errors


@dataclass
class Observation:
    """What ``observe`` yields: the run being recorded and, after the block, the hook failure counts."""

    client: object
    run_id: str
    run_dir: Path
    hook_errors: dict[str, int] = field(default_factory=dict)
    anomaly_stats: dict[str, dict] = field(default_factory=dict)  # per worker, with observe(anomalies=True)

    @property
    def run(self):
        from flowscope.store.run import open_run

        return open_run(self.run_dir)


@contextmanager
def observe(dask_client, *, store: str | Path | None = None, name: str | None = None, command: str | None = None,
            collector: str = "process", anomalies: bool | object = False):
    """Record the cluster of ``dask_client`` into a new run while the block runs (like performance_report).

    ``anomalies=True`` also runs a detector on every worker that flags anomalous tasks online against the
    run's global model, synced every second through the collector, and post-prunes them at the end
    (``sources/dask/anomaly_plugin.py``); an ``AnomalyConfig`` sets its parameters, a dict the keyword
    arguments of ``register_anomalies`` (``config``, ``period``, ``mature``).

    ``collector="process"`` (the default) runs the collector in a child process, so ingest never competes
    with a scheduler in this process for its GIL; ``"embedded"`` runs it on threads of this process."""
    from flowscope.client.client import Client
    from flowscope.store.catalog import default_store

    store = Path(store) if store is not None else default_store()
    server = None
    if collector == "process":
        from flowscope.service.process import CollectorProcess

        server = CollectorProcess(store)
        fs = Client(server.address, name=name or "dask", command=command)
    elif collector == "embedded":
        fs = Client("embedded", store=store, serve=True, name=name or "dask", command=command)
    else:
        raise ValueError(f"collector must be 'process' or 'embedded', not {collector!r}")
    try:
        register(dask_client, fs.address, fs.run_id)
        if anomalies:
            from flowscope.sources.dask.anomaly_plugin import register_anomalies

            options = anomalies if isinstance(anomalies, dict) else \
                {} if isinstance(anomalies, bool) else {"config": anomalies}
            register_anomalies(dask_client, fs.address, fs.run_id, **options)
    except BaseException:
        fs.close(status="failed")
        if server:
            server.stop()
        raise
    obs = Observation(fs, fs.run_id, store / fs.run_id)
    status = "failed"
    try:
        yield obs
        status = "finished"
    finally:
        try:
            if anomalies:
                from flowscope.sources.dask.anomaly_plugin import finish_anomalies

                try:
                    obs.anomaly_stats = finish_anomalies(dask_client)
                finally:
                    obs.hook_errors = unregister(dask_client)
            else:
                obs.hook_errors = unregister(dask_client)
        finally:
            try:
                fs.close(status=status)
            finally:
                if server:
                    server.stop()


async def dask_setup(server) -> None:
    """Preload entry point (``--preload flowscope.dask``): install the plugin for this server."""
    address, run_id = os.environ.get("FLOWSCOPE_ADDRESS"), os.environ.get("FLOWSCOPE_RUN")
    if not address or not run_id:
        raise RuntimeError("flowscope.dask preload needs FLOWSCOPE_ADDRESS and FLOWSCOPE_RUN "
                           "(set by `flowscope run`, or Client.env())")
    from distributed import Scheduler

    if isinstance(server, Scheduler):
        # preloads run before the scheduler starts its plugins, so this one is started with the others
        server.add_plugin(FlowscopeSchedulerPlugin(address, run_id), name=FlowscopeSchedulerPlugin.name)
    else:
        await server.plugin_add(FlowscopeWorkerPlugin(address, run_id), name=FlowscopeWorkerPlugin.name)
        if os.environ.get("FLOWSCOPE_ANOMALIES"):  # `flowscope run --anomalies`
            from flowscope.sources.dask.anomaly_plugin import NAME, AnomalyWorkerPlugin

            period = float(os.environ.get("FLOWSCOPE_ANOMALY_PERIOD") or 1.0)
            await server.plugin_add(AnomalyWorkerPlugin(address, run_id, period=period), name=NAME)
