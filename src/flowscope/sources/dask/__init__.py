"""Observe Dask runs: Dask.distributed clusters through flowscope's plugins, Dask's local schedulers (threads,
processes, synchronous) through Dask's callbacks.

- ``with flowscope.observe(client) as obs:`` records everything the cluster of ``client`` does inside the
  block into a new run (an embedded collector in this process, reachable by the cluster over HTTP);
- ``with flowscope.observe() as obs:`` (no client) records every computation Dask's local schedulers run
  inside the block (``sources/dask/local.py``) and samples this host's hardware;
- ``flowscope.dask.register(client, address, run_id)`` adds the plugins to a cluster for a run
  that already has a collector;
- ``--preload flowscope.dask`` on ``dask scheduler`` / ``dask worker`` (or the dask config
  ``distributed.scheduler.preload`` / ``distributed.worker.preload``) installs them from
  $FLOWSCOPE_ADDRESS and $FLOWSCOPE_RUN, so schedulers and workers started by any script join; as a client
  preload (``distributed.client.preload``, set by ``flowscope run``) it notes which scheduler each Client
  connects to, so that a run with no tasks can say which cluster went unobserved.

Worker plugins registered through a client are installed on workers that join later, too.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import sys
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FlowscopeSchedulerPlugin", "FlowscopeWorkerPlugin", "FlowscopeStandardWorkerPlugin", "LEVELS",
           "NothingObservedWarning", "register", "unregister", "observe", "start_collector", "stop_collector", "dask_setup",
           "dask_teardown", "discover"]

#: Capture levels (docs/dask.md, "Capture levels"): ``standard`` (the default) records scheduler transitions,
#: execution spans on threads, transfers, warnings, hardware and the I/O of calls of 1 ms or more (shorter calls'
#: I/O charged to the next measured call on the thread), with no per-transition hook on the workers; ``full``
#: adds every worker transition and each task's own I/O however short. On Dask's local schedulers the levels
#: differ only in per-task I/O, by the same 1 ms rule (sources/dask/local.py).
LEVELS = ("standard", "full")
DEFAULT_LEVEL = "standard"
LEVEL_ENV = "FLOWSCOPE_LEVEL"


def check_level(level: str) -> str:
    """``level`` if it is a capture level, else ValueError naming it and the levels."""
    if level not in LEVELS:
        raise ValueError(f"capture level {level!r} is not one of {', '.join(repr(x) for x in LEVELS)}")
    return level


def __getattr__(name: str):
    # the plugins need dask.distributed, slow to import and not needed to observe the local schedulers
    if name in ("FlowscopeSchedulerPlugin", "FlowscopeWorkerPlugin", "FlowscopeStandardWorkerPlugin"):
        from flowscope.sources.dask import plugins

        return getattr(plugins, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class NothingObservedWarning(UserWarning):
    """An ``observe()`` block recorded no work; the message says why and what to do."""


def worker_plugin(address: str, run_id: str, level: str = DEFAULT_LEVEL, **kwargs):
    """The worker plugin of capture level ``level`` for run ``run_id``."""
    from flowscope.sources.dask.plugins import FlowscopeStandardWorkerPlugin, FlowscopeWorkerPlugin

    cls = FlowscopeWorkerPlugin if check_level(level) == "full" else FlowscopeStandardWorkerPlugin
    return cls(address, run_id, **kwargs)


def register(dask_client, address: str, run_id: str, level: str = DEFAULT_LEVEL) -> None:
    """Install the scheduler and worker plugins of capture level ``level`` on ``dask_client``'s cluster for run
    ``run_id``."""
    from flowscope.sources.dask.plugins import FlowscopeSchedulerPlugin

    plugin = worker_plugin(address, run_id, level)
    dask_client.register_plugin(FlowscopeSchedulerPlugin(address, run_id), name=FlowscopeSchedulerPlugin.name)
    dask_client.register_plugin(plugin, name=plugin.name)


async def _close_scheduler_plugin(dask_scheduler) -> tuple[int, int]:
    from flowscope.sources.dask.plugins import FlowscopeSchedulerPlugin

    plugin = dask_scheduler.plugins.get(FlowscopeSchedulerPlugin.name)
    if plugin is None:
        return 0, 0
    await plugin.close()  # delivers what it holds first: a batch that could not be made counts as a failure
    return plugin.errors, plugin.finished


def _worker_errors(dask_worker) -> int:
    from flowscope.sources.dask.plugins import FlowscopeWorkerPlugin

    plugin = dask_worker.plugins.get(FlowscopeWorkerPlugin.name)
    if plugin is None:
        return 0
    plugin.flush()  # rows are made into batches when delivered: a batch that could not be made counts as a failure
    return plugin.errors


def unregister(dask_client, seen: dict | None = None) -> dict[str, int]:
    """Flush and remove the plugins; returns how many hook calls failed on the scheduler and on each worker.
    ``seen``, if given, receives ``finished``: how many tasks the scheduler plugin saw leave ``processing``."""
    from flowscope.sources.dask.plugins import FlowscopeSchedulerPlugin, FlowscopeWorkerPlugin

    # the scheduler's last rows and the workers' go to the collector at the same time: each is a round trip that
    # waits for the collector's acknowledgement, and neither needs the other's
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="flowscope-unregister") as pool:
        workers = pool.submit(dask_client.run, _worker_errors)
        sched_errors, finished = dask_client.run_on_scheduler(_close_scheduler_plugin)
        worker_errors = workers.result()
    if seen is not None:
        seen["finished"] = finished
    errors = {"scheduler": sched_errors}
    errors.update(worker_errors)
    dask_client.unregister_worker_plugin(FlowscopeWorkerPlugin.name)  # teardown flushes and closes
    dask_client.unregister_scheduler_plugin(FlowscopeSchedulerPlugin.name)
    return errors


@dataclass
class Observation:
    """What ``observe`` yields: the run being recorded and, after the block, the hook failure counts (per
    distributed server, or ``{"local": n}`` for the local schedulers) and, when the block recorded no work,
    why (``nothing_observed``; also given as a :class:`NothingObservedWarning`)."""

    client: object
    run_id: str
    run_dir: Path
    level: str = DEFAULT_LEVEL
    collector_pid: int | None = None  # the collector process the run was recorded by (None: embedded)
    dashboard_url: str | None = None  # the run's dashboard page, served while the block runs (printed on stderr)
    hook_errors: dict[str, int] = field(default_factory=dict)
    anomaly_stats: dict[str, dict] = field(default_factory=dict)  # per worker, with observe(anomalies=True)
    nothing_observed: list = field(default_factory=list)          # analysis.nothing_observed.Reason
    local_compiled: bool | None = None  # no client: the local capture's per-task path is the compiled one

    @property
    def run(self):
        from flowscope.store.run import open_run

        return open_run(self.run_dir)


_collector = None  # the CollectorProcess this Python process shares between its observe() blocks
_collector_lock = threading.Lock()


def start_collector(store: str | Path | None = None):
    """The collector process this Python process uses, serving ``store`` (default: the default store), started now
    if it is not running. There is one per Python process: ``observe()`` starts it on its first use and keeps it
    for the later blocks; a block for another store replaces it. Call this before creating a cluster so that the
    collector's start-up does not compete with it. Stopped at exit."""
    global _collector
    from flowscope.service.process import CollectorProcess
    from flowscope.store.catalog import default_store

    path = Path(store if store is not None else default_store()).resolve()
    with _collector_lock:
        old = _collector
        if old is not None and old.owner != os.getpid():  # inherited through a fork: the parent's, not ours
            old = _collector = None
        if old is not None and old.proc.poll() is None and old.store == path:
            return old
        if old is not None:
            old.stop()  # it finishes its queued writes first
        else:
            atexit.register(stop_collector)
        _collector = CollectorProcess(path)
        _collector.owner = os.getpid()
        return _collector


def stop_collector() -> None:
    """Stop the collector process ``start_collector`` started, if any (it finishes its queued writes first)."""
    global _collector
    with _collector_lock:
        server, _collector = _collector, None
    if server is not None and server.owner == os.getpid():
        server.stop()


def _dashboard_url(address: str, run_id: str, served_by_process: bool) -> str:
    """The run's dashboard page on the collector at ``address``. A collector process is ``flowscope serve``, which
    requires $FLOWSCOPE_TOKEN when the user set it (a token the user gave is never printed); the embedded one's
    server requires none on loopback."""
    from flowscope.service.auth import TOKEN_ENV
    from flowscope.ui import dashboard_url

    token = os.environ.get(TOKEN_ENV) if served_by_process else None
    return dashboard_url(address, run_id, token, f"${TOKEN_ENV}" if token else None)


def _default_client_address(exclude=None) -> str | None:
    """The scheduler address of the distributed Client ``compute()`` would use now, if there is one (and it
    is not ``exclude``)."""
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import default_client

        client = default_client()
    except (ValueError, ImportError, AttributeError):
        return None
    if client is exclude:
        return None
    try:
        return client.scheduler.address
    except AttributeError:
        return None


def _record_observation(fs, facts_before: dict, dask_client) -> dict:
    """The block's own facts as an ``observation`` log row (what ``analysis.nothing_observed`` reads); returns
    them."""
    from flowscope.sources import process_facts

    now = process_facts.snapshot()
    facts = {"via": "observe()", "pid": now["pid"], "dask_imported": "dask" in sys.modules,
             "local_graphs": now["local_graphs"] - facts_before["local_graphs"],
             "local_tasks": now["local_tasks"] - facts_before["local_tasks"],
             "forks": now["forks"] - facts_before["forks"], "clients": []}
    if dask_client is None:
        address = _default_client_address()
        if address:
            facts["clients"].append(address)
    else:
        facts["observed_cluster"] = getattr(getattr(dask_client, "scheduler", None), "address", None) or "?"
    fs.log(process_facts.message(facts), category=process_facts.CATEGORY, resource_id=fs.process_resource(),
           attrs=facts)
    return facts


def _explain_if_empty(obs: Observation, work_seen: bool) -> None:
    """Explain a block that recorded no work. ``work_seen``: the capture itself saw tasks run, so the run holds
    work and the store need not be read (a query of the run costs more than the rest of the teardown)."""
    if work_seen:
        return
    from flowscope.analysis.nothing_observed import why_nothing_observed

    try:
        obs.nothing_observed = why_nothing_observed(obs.run)
    except Exception:  # noqa: BLE001 - explaining an empty run must not fail the block
        return
    if obs.nothing_observed:
        warnings.warn("flowscope.observe() recorded no tasks: "
                      + " ".join(r.text() for r in obs.nothing_observed), NothingObservedWarning, stacklevel=4)


def run_provenance(argv: list[str] | None = None) -> dict:
    """What run.json keeps about what was run, to group runs by: the client script with its hash (``script``:
    the command's script given ``argv``, else this program's main script) and Dask's configuration as this
    process sees it (``dask_config``: its YAML files, DASK_* variables and any ``dask.config.set`` in force)."""
    import dask

    from flowscope.model.provenance import jsonable, main_script, script_of_command

    script = script_of_command(argv) if argv is not None else main_script()
    return {"script": script, "dask_config": jsonable(dask.config.config)}


@contextmanager
def observe(dask_client=None, *, store: str | Path | None = None, name: str | None = None,
            command: str | None = None, collector: str = "process", anomalies: bool | object = False,
            hardware_period: float = 1.0, task_io: bool = True, level: str = DEFAULT_LEVEL):
    """Record a Dask workflow into a new run while the block runs (like performance_report).

    With ``dask_client``: everything its cluster does. Without: every computation Dask's local schedulers
    (threads, processes, synchronous) run in this process inside the block, each task on the thread or
    process that ran it (``sources/dask/local.py``), with each task's I/O as ``level`` says (``task_io=False``:
    without; it costs a read of the thread's /proc counters per measured task), and this host's hardware every
    ``hardware_period`` seconds (0: not sampled). A block that records no work says why in a :class:`NothingObservedWarning`
    (and ``obs.nothing_observed``).

    ``anomalies=True`` also runs a detector on every worker that flags anomalous tasks online against the
    run's global model, synced every second through the collector, and post-prunes them at the end
    (``sources/dask/anomaly_plugin.py``); an ``AnomalyConfig`` sets its parameters, a dict the keyword
    arguments of ``register_anomalies`` (``config``, ``period``, ``mature``). It needs a distributed client.

    ``level`` is the capture level (``LEVELS``; docs/dask.md, "Capture levels"): ``"standard"`` (the default)
    or ``"full"``; it is kept in run.json as ``capture_level``. On the local schedulers it decides per-task
    I/O: at ``standard`` a task's counters are read when its call took 1 ms or more, a shorter call's I/O
    being charged to the next measured call on its thread; at ``full`` every task's are.

    ``collector="process"`` (the default) runs the collector in a child process, so ingest never competes
    with a scheduler in this process for its GIL; that process is started on the first ``observe()`` for a store
    (or by :func:`start_collector`, before the cluster exists) and kept for the later ones. ``"embedded"`` runs
    the collector on threads of this process."""
    from flowscope.embedded import Client
    from flowscope.sources import process_facts
    from flowscope.sources import semantics as _semantics
    from flowscope.store.catalog import default_store

    if anomalies and dask_client is None:
        raise ValueError("observe(anomalies=...) needs a distributed client: the detector runs on its workers")
    if collector not in ("process", "embedded"):
        raise ValueError(f"collector must be 'process' or 'embedded', not {collector!r}")
    check_level(level)
    store = Path(store) if store is not None else default_store()
    # what the run's rows will mean (model/semantics.py): the plugins' mapping, or the local schedulers'
    declared = [_semantics.DASK_DISTRIBUTED if dask_client is not None else _semantics.DASK_LOCAL]
    server = None
    meta = {"capture_level": level, "semantics": declared, **run_provenance()}
    if collector == "process":
        server = start_collector(store)
        fs = Client(server.address, name=name or "dask", command=command, meta=meta)
    else:
        fs = Client("embedded", store=store, serve=True, name=name or "dask", command=command, meta=meta)
    url = _dashboard_url(fs.address, fs.run_id, served_by_process=server is not None)
    print(f"flowscope dashboard: {url}", file=sys.stderr, flush=True)
    capture = sampler = lease = None
    facts_before = process_facts.snapshot()
    try:
        if dask_client is None:
            from flowscope.sources.dask.local import LocalSchedulerCapture

            if hardware_period > 0:
                from flowscope.sources.hardware import HardwareSampler, acquire_host_lease

                lease = acquire_host_lease(run_id=fs.run_id)
                if lease is not None:
                    sampler = HardwareSampler(fs, hardware_period).start()
            capture = LocalSchedulerCapture(fs, io=task_io, level=level)
            capture.register()
        else:
            register(dask_client, fs.address, fs.run_id, level)
            if anomalies:
                from flowscope.sources.dask.anomaly_plugin import register_anomalies

                options = anomalies if isinstance(anomalies, dict) else \
                    {} if isinstance(anomalies, bool) else {"config": anomalies}
                register_anomalies(dask_client, fs.address, fs.run_id, **options)
    except BaseException:
        if capture is not None:
            capture.close()
        if sampler is not None:
            sampler.stop()
        if lease is not None:
            lease.release()
        fs.close(status="failed")
        raise
    obs = Observation(fs, fs.run_id, store / fs.run_id, level=level,
                      collector_pid=server.proc.pid if server is not None else None, dashboard_url=url,
                      local_compiled=capture.compiled if capture is not None else None)
    status = "failed"
    seen: dict = {}
    facts: dict = {}
    try:
        yield obs
        status = "finished"
    finally:
        try:
            if capture is not None:
                capture.close()
                obs.hook_errors = {"local": capture.errors}
                if sampler is not None:
                    sampler.stop()
                    lease.release()
            elif anomalies:
                from flowscope.sources.dask.anomaly_plugin import finish_anomalies

                try:
                    obs.anomaly_stats = finish_anomalies(dask_client)
                finally:
                    obs.hook_errors = unregister(dask_client, seen)
            else:
                obs.hook_errors = unregister(dask_client, seen)
            if dask_client is not None:  # a worker killed while it sampled this host left its lock file
                from flowscope.sources.hardware import remove_abandoned_lease

                remove_abandoned_lease(run_id=fs.run_id)
            facts = _record_observation(fs, facts_before, dask_client)
        finally:
            fs.close(status=status)
    _explain_if_empty(obs, bool(seen.get("finished") or facts.get("local_tasks")))


#: the scheduler metadata key under which a scheduler hosting its run publishes it (``discover``)
METADATA_KEY = "flowscope"
COLLECTOR_ENV = "FLOWSCOPE_COLLECTOR"        # "process" (default) or "embedded": where a scheduler hosts it
RUN_NAME_ENV = "FLOWSCOPE_RUN_NAME"


@dataclass
class _HostedRun:
    """The collector and run a scheduler started by ``dask_setup`` hosts (no $FLOWSCOPE_ADDRESS given)."""

    fs: object                 # the flowscope Client that opened the run
    level: str                 # the capture level workers record at
    collector: object = None   # the CollectorProcess, or None when embedded (fs holds it)


_hosted: dict[int, _HostedRun] = {}  # id(scheduler) -> what it hosts


def discover(scheduler_address: str, timeout: float = 30.0) -> dict:
    """``{"address", "run_id", "level"}`` of the run a scheduler started with ``--preload flowscope.dask`` records
    into, read from the scheduler at ``scheduler_address``: how any producer given only the scheduler's address
    joins the run. LookupError if that scheduler publishes none."""
    import asyncio

    from distributed.core import rpc

    async def fetch():
        async with rpc(scheduler_address, timeout=timeout) as r:
            return await r.get_metadata(keys=[METADATA_KEY], default=None)

    # on a thread of its own: the caller may be inside an event loop (a notebook, a Dask server)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="flowscope-discover") as pool:
        found = pool.submit(asyncio.run, fetch()).result()
    if not found:
        raise LookupError(f"the scheduler at {scheduler_address} publishes no flowscope run "
                          "(start it with --preload flowscope.dask)")
    return found


def _check_reachable(address: str) -> None:
    """RuntimeError naming $FLOWSCOPE_ADDRESS when the collector (or the Redis stream) there does not answer."""
    from flowscope.client.client import REDIS_SCHEMES
    from flowscope.client.redis_transport import RedisTransport
    from flowscope.client.transport import HttpTransport

    try:
        if address.startswith(REDIS_SCHEMES):
            RedisTransport(address, timeout=5.0).health(timeout=5.0)
        else:
            HttpTransport(address, timeout=5.0).health(timeout=5.0)
    except Exception as exc:  # noqa: BLE001 - any failure to answer is the same error for the user
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise RuntimeError(f"flowscope.dask preload: the collector at FLOWSCOPE_ADDRESS={address} cannot be "
                           f"reached ({reason})") from None


def _host_run(scheduler) -> _HostedRun:
    """Start a collector for ``scheduler`` (a child process unless $FLOWSCOPE_COLLECTOR=embedded), writing to the
    default store, and open a run in it."""
    from flowscope.embedded import Client
    from flowscope.sources import semantics as _semantics
    from flowscope.store.catalog import default_store

    how = os.environ.get(COLLECTOR_ENV) or "process"
    if how not in ("process", "embedded"):
        raise RuntimeError(f"${COLLECTOR_ENV} must be 'process' or 'embedded', not {how!r}")
    level = check_level(os.environ.get(LEVEL_ENV) or DEFAULT_LEVEL)
    meta = {"capture_level": level, "semantics": [_semantics.DASK_DISTRIBUTED], **run_provenance([])}
    name = os.environ.get(RUN_NAME_ENV) or "dask-scheduler"
    command = " ".join(sys.argv)
    store = default_store().resolve()
    if how == "process":
        from flowscope.service.process import CollectorProcess

        collector = CollectorProcess(store)
        try:
            fs = Client(collector.address, name=name, command=command, meta=meta)
        except BaseException:
            collector.stop()
            raise
        return _HostedRun(fs, level, collector)
    return _HostedRun(Client("embedded", store=store, serve=True, name=name, command=command, meta=meta), level)


async def dask_setup(server) -> None:
    """Preload entry point (``--preload flowscope.dask``): install the plugin for this scheduler or worker; for
    a Client (``distributed.client.preload``), note the scheduler it connected to.

    With $FLOWSCOPE_ADDRESS and $FLOWSCOPE_RUN (``flowscope run``) they join that run. Without, a scheduler hosts
    a collector and opens a run, published in its metadata (``discover``), and a worker joins the run its
    scheduler publishes."""
    import asyncio

    from distributed import Client, Scheduler

    if isinstance(server, Client):
        from flowscope.sources import process_facts

        process_facts.note_client(getattr(server.scheduler, "address", None))
        return
    from flowscope.sources.dask.plugins import FlowscopeSchedulerPlugin

    address, run_id = os.environ.get("FLOWSCOPE_ADDRESS"), os.environ.get("FLOWSCOPE_RUN")
    level = os.environ.get(LEVEL_ENV) or None
    if address and not run_id:
        raise RuntimeError("flowscope.dask preload: FLOWSCOPE_ADDRESS is set but FLOWSCOPE_RUN is not "
                           "(set both, as `flowscope run` does, or neither to let the scheduler host the run)")
    if address:
        await asyncio.to_thread(_check_reachable, address)
    elif isinstance(server, Scheduler):
        hosted = await asyncio.to_thread(_host_run, server)
        _hosted[id(server)] = hosted
        address, run_id = hosted.fs.address, hosted.fs.run_id
        level = hosted.level
        server.set_metadata([METADATA_KEY], {"address": address, "run_id": run_id, "level": level})
    else:
        found = await server.scheduler.get_metadata(keys=[METADATA_KEY], default=None)
        if not found:
            raise RuntimeError("flowscope.dask preload: no FLOWSCOPE_ADDRESS and FLOWSCOPE_RUN, and the scheduler "
                               "publishes no run (start it with --preload flowscope.dask, or use `flowscope run`)")
        address, run_id, level = found["address"], found["run_id"], level or found.get("level")

    if isinstance(server, Scheduler):
        # preloads run before the scheduler starts its plugins, so this one is started with the others
        server.add_plugin(FlowscopeSchedulerPlugin(address, run_id), name=FlowscopeSchedulerPlugin.name)
    else:
        plugin = worker_plugin(address, run_id, level or DEFAULT_LEVEL)
        await server.plugin_add(plugin, name=plugin.name)
        if os.environ.get("FLOWSCOPE_ANOMALIES"):  # `flowscope run --anomalies`
            from flowscope.sources.dask.anomaly_plugin import NAME, AnomalyWorkerPlugin

            period = float(os.environ.get("FLOWSCOPE_ANOMALY_PERIOD") or 1.0)
            await server.plugin_add(AnomalyWorkerPlugin(address, run_id, period=period), name=NAME)


async def dask_teardown(server) -> None:
    """Preload exit point: a scheduler that hosts its run has its workers deliver and remove their plugins, then
    delivers its own rows, closes the run (finished) and stops the collector. Nothing to do otherwise."""
    import asyncio

    from flowscope.sources.dask.plugins import FlowscopeSchedulerPlugin, FlowscopeWorkerPlugin

    hosted = _hosted.pop(id(server), None)
    if hosted is None:
        return
    try:
        # before the scheduler tells its workers to close: each delivers what it holds while the collector runs
        await server.broadcast(msg={"op": "plugin-remove", "name": FlowscopeWorkerPlugin.name}, on_error="return")
        plugin = server.plugins.get(FlowscopeSchedulerPlugin.name)
        if plugin is not None:
            await plugin.close()
    finally:
        def close() -> None:
            try:
                hosted.fs.close(status="finished")
            finally:
                if hosted.collector is not None:
                    hosted.collector.stop()

        await asyncio.to_thread(close)
