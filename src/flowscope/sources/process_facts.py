"""What one observed Python process did that says why a run may hold no work: whether it imported Dask, how
many graphs it ran on Dask's local schedulers, which Dask schedulers its distributed Clients connected to,
and how many times it forked without exec (work in such a child is invisible to flowscope).

``flowscope run`` loads this module into every Python process the command starts (``sources/_boot``), with
nothing beyond the standard library until Dask is imported: then it installs the local-scheduler capture
(``sources/dask/local.py``). It also sets the Dask config ``distributed.client.preload`` (through
$DASK_DISTRIBUTED__CLIENT__PRELOAD, unless already set) so that each Client notes its scheduler. At exit, a process that imported Dask or forked writes its facts as one JSON
file into $FLOWSCOPE_FACTS_DIR (no network, no flowscope client); ``flowscope run`` turns each file into an
``observation`` row of the ``logs`` table when the command has ended. ``observe()`` records the same facts
for its own block directly.
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import sys
import threading
import time

FACTS_DIR_ENV = "FLOWSCOPE_FACTS_DIR"
CATEGORY = "observation"  # logs.category of a process's facts

# this process's facts (a forked child starts from zero: what its parent did is the parent's)
FACTS: dict = {"forks": 0, "dask_imported": False, "local_graphs": 0, "local_tasks": 0, "clients": []}
_pid = os.getpid()
_installed = False


def _forking() -> None:
    FACTS["forks"] += 1


def _forked_child() -> None:
    global _pid
    _pid = os.getpid()
    FACTS.update(forks=0, local_graphs=0, local_tasks=0, clients=[], forked_child=True)


def note_client(scheduler_address: str | None) -> None:
    """A distributed Client of this process connected to the scheduler at ``scheduler_address``."""
    if scheduler_address and scheduler_address not in FACTS["clients"]:
        FACTS["clients"].append(scheduler_address)


def snapshot() -> dict:
    """A copy of this process's facts, with its pid and the time taken."""
    return {**FACTS, "clients": list(FACTS["clients"]), "pid": os.getpid(), "ts_ns": time.time_ns()}


def message(facts: dict) -> str:
    """One line saying what the facts say, for the ``observation`` log row."""
    parts = [f"pid {facts.get('pid')}",
             "imported dask" if facts.get("dask_imported") else "did not import dask",
             f"{facts.get('local_graphs', 0)} graphs ({facts.get('local_tasks', 0)} tasks) on local schedulers"]
    if facts.get("clients"):
        parts.append("distributed clients of " + ", ".join(facts["clients"]))
    if facts.get("forks"):
        parts.append(f"forked {facts['forks']} times")
    return "; ".join(parts)



def spec_from_other_finders(me: object, busy: threading.local, fullname: str, path, target):
    """The spec the finders on ``sys.meta_path`` other than ``me`` give for ``fullname`` (None if none); ``busy.on``
    is set meanwhile, so that ``me`` can decline the nested lookups this causes."""
    busy.on = True
    try:
        for finder in sys.meta_path:
            if finder is me or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None
    finally:
        busy.on = False

class _DaskImported(importlib.abc.MetaPathFinder):
    """Runs ``callback`` once, right after the ``dask`` package has been imported (a post-import hook)."""

    def __init__(self, callback):
        self.callback = callback
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "dask" or getattr(self._busy, "on", False):
            return None
        spec = spec_from_other_finders(self, self._busy, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenCall(spec.loader, self)
        return spec

    def imported(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.callback()


class _ThenCall(importlib.abc.Loader):
    def __init__(self, inner, finder: _DaskImported):
        self.inner, self.finder = inner, finder

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.finder.imported()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _dask_imported() -> None:
    FACTS["dask_imported"] = True
    try:
        from flowscope.sources.dask.local import install_from_env

        install_from_env()
    except Exception as exc:  # never keep the user's program from running
        print(f"flowscope: Dask's local schedulers are not observed: {exc!r}", file=sys.stderr)


def _is_worker_process() -> bool:
    """A process a multiprocessing pool started (Dask's processes scheduler, LocalCluster's workers): its
    parent reports for it."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def _write_facts() -> None:
    directory = os.environ.get(FACTS_DIR_ENV)
    if not directory or os.getpid() != _pid or FACTS.get("forked_child"):
        return
    if not (FACTS["dask_imported"] or FACTS["forks"] or FACTS["clients"]) or _is_worker_process():
        return
    try:
        path = os.path.join(directory, f"{os.getpid()}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({**snapshot(), "argv": sys.argv[:8]}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def install() -> None:
    """Count forks, install the local-scheduler capture once Dask is imported, and write this process's facts at
    exit (``flowscope run`` calls this in every Python process the command starts)."""
    global _installed
    if _installed:
        return
    _installed = True
    # each distributed Client of this process notes the scheduler it connects to (flowscope.dask.dask_setup);
    # set here rather than by flowscope run for every process, because a Python that cannot import
    # flowscope would fail to start a Client with this preload. Dask reads it when it is imported.
    os.environ.setdefault("DASK_DISTRIBUTED__CLIENT__PRELOAD", "['flowscope.dask']")
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_forking, after_in_child=_forked_child)
    if "dask" in sys.modules:
        _dask_imported()
    else:
        sys.meta_path.insert(0, _DaskImported(_dask_imported))
    atexit.register(_write_facts)


def read_facts_dir(directory: str | os.PathLike) -> list[dict]:
    """The facts the command's processes wrote into ``directory``, oldest first (unreadable files left out)."""
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda f: f.get("ts_ns") or 0)
