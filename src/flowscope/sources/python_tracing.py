"""Selective tracing of Python functions into nested call spans (only what the user names is traced).

- ``@flowscope.trace`` (or ``@trace(name="...")``) records each call of a function as a span of kind
  ``call`` on the calling thread, with ``span_id`` and ``parent_id``: the enclosing traced call in the
  same thread (or asyncio task; the parent is held in a context variable, which each thread starts
  empty), so the anomaly detector scores exclusive time.
- ``trace_modules(["pkg.*", "pkg.io:read_*", "pkg.model:Solver.step"])`` wraps, when a module whose
  name matches a pattern's module glob is imported (a ``sys.meta_path`` finder wraps its loader and
  instruments the module right after it executes; modules already imported are instrumented at once),
  the functions and methods defined in that module whose name (``func`` or ``Class.method``) matches
  the pattern's function glob (``*`` when the pattern has no ``:``). Calls through references taken
  before the module was instrumented (``from m import f`` run earlier) are not traced.

Spans go to a flowscope Client: the one given to ``start(client)``, else one made on the first traced
call from $FLOWSCOPE_ADDRESS / $FLOWSCOPE_RUN (as ``flowscope run`` sets them), or an embedded
collector writing a new run to the default store, closed at exit. A span's name is the function's
``module.qualname``. A generator function's call is the creation of the generator, not its iteration.
"""

from __future__ import annotations

import atexit
import contextvars
import fnmatch
import functools
import importlib.abc
import inspect
import itertools
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from flowscope.sources.process_facts import spec_from_other_finders
from flowscope.sources import semantics as _semantics

#: what this source's rows mean to the analyses (model/semantics.py)
SEMANTICS = _semantics.PYTHON_TRACING

F = TypeVar("F", bound=Callable[..., Any])

_parent: contextvars.ContextVar[int | None] = contextvars.ContextVar("flowscope_trace_parent", default=None)
# span ids unique within a run across processes: a random 23-bit prefix per process, a counter below it
_ids = itertools.count((secrets.randbits(23) << 40) | 1)
_local = threading.local()
_state: dict[str, Any] = {"client": None, "owned": False}
_lock = threading.Lock()
# where a traced call's start and end times come from (int ns since the epoch); read when a function is wrapped
clock: Callable[[], int] = time.time_ns


def start(client=None):
    """Send traced calls to ``client`` (default: a Client made from the environment); returns it."""
    with _lock:
        if client is None:
            from flowscope.embedded import Client

            client = Client(name="python-trace", meta={"semantics": [SEMANTICS]}) \
                if not os.environ.get("FLOWSCOPE_ADDRESS") else Client(meta={"semantics": [SEMANTICS]})
            _state["owned"] = True
            atexit.register(stop)
            _warm_arrow()
        else:
            _state["owned"] = False
        _state["client"] = client
        _state["generation"] = _state.get("generation", 0) + 1
    return client


def _warm_arrow() -> None:
    """pyarrow imports pandas the first time it builds an array; pandas imports concurrent.futures, which
    cannot be imported once the interpreter is shutting down. A client closed at exit would build its first
    batch then, on its builder thread, and fail: pay the import now."""
    import pyarrow as pa

    pa.array([0])


def stop() -> None:
    """Flush the traced calls; close the client if ``start`` made it."""
    with _lock:
        client, owned = _state["client"], _state["owned"]
        _state["client"] = None
        _state["generation"] = _state.get("generation", 0) + 1
    if client is not None:
        if owned:
            client.close()
        else:
            client.flush(30)


def _writer():
    """The calling thread's (row writer, thread resource) for the current client."""
    gen = _state.get("generation", 0)
    w = getattr(_local, "w", None)
    if w is None or w[2] != gen:
        client = _state["client"] or start()
        w = _local.w = (client.row_writer("spans"), client.thread_resource(), _state.get("generation", 0))
    return w


def trace(func: F | None = None, *, name: str | None = None) -> F:
    """Decorator: record every call of ``func`` as a nested span named ``name`` (default module.qualname)."""
    if func is None:
        return functools.partial(trace, name=name)  # type: ignore[return-value]
    if getattr(func, "__flowscope_traced__", False):
        return func
    label = name or f"{func.__module__}.{func.__qualname__}"
    time_ns, get_parent, set_parent, reset = clock, _parent.get, _parent.set, _parent.reset

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def traced_async(*args, **kwargs):
            sid = next(_ids)
            parent = get_parent()
            token = set_parent(sid)
            t0 = time_ns()
            try:
                return await func(*args, **kwargs)
            finally:
                t1 = time_ns()
                reset(token)
                add, rid, _ = _writer()
                add(sid, parent, rid, "call", label, t0, t1, None, None)
        traced = traced_async
    else:
        @functools.wraps(func)
        def traced_sync(*args, **kwargs):
            sid = next(_ids)
            parent = get_parent()
            token = set_parent(sid)
            t0 = time_ns()
            try:
                return func(*args, **kwargs)
            finally:
                t1 = time_ns()
                reset(token)
                w = getattr(_local, "w", None)
                if w is None or w[2] != _state.get("generation", 0):
                    w = _writer()
                w[0](sid, parent, w[1], "call", label, t0, t1, None, None)
        traced = traced_sync
    traced.__flowscope_traced__ = True  # type: ignore[attr-defined]
    return traced  # type: ignore[return-value]


# ---- module / function patterns applied at import time ----------------------------------------------
def _parse(patterns: Iterable[str]) -> list[tuple[str, str]]:
    out = []
    for p in patterns:
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"trace pattern must be a non-empty 'module[:function]' glob, not {p!r}")
        mod, _, fn = p.strip().partition(":")
        if not mod:
            raise ValueError(f"trace pattern {p!r}: the module glob before ':' is empty")
        out.append((mod, fn or "*"))
    return out


def instrument(module, function_globs: Iterable[str]) -> list[str]:
    """Wrap the functions and methods defined in ``module`` whose name matches one of ``function_globs``
    (``func`` or ``Class.method``); returns the traced names."""
    globs = list(function_globs)
    done = []

    def wanted(n: str) -> bool:
        return any(fnmatch.fnmatchcase(n, g) for g in globs)

    for attr, obj in list(vars(module).items()):
        if inspect.isfunction(obj) and obj.__module__ == module.__name__ and wanted(attr):
            setattr(module, attr, trace(obj))
            done.append(attr)
        elif inspect.isclass(obj) and obj.__module__ == module.__name__:
            for mname, m in list(vars(obj).items()):
                qual = f"{attr}.{mname}"
                if not wanted(qual):
                    continue
                if isinstance(m, (staticmethod, classmethod)) and inspect.isfunction(m.__func__):
                    setattr(obj, mname, type(m)(trace(m.__func__)))
                elif inspect.isfunction(m):
                    setattr(obj, mname, trace(m))
                else:
                    continue
                done.append(qual)
    return done


class _InstrumentingLoader(importlib.abc.Loader):
    def __init__(self, inner, finder: TraceFinder):
        self.inner, self.finder = inner, finder

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.finder.apply(module)

    def __getattr__(self, name: str):  # get_source, get_code, is_package, resource readers: the inner loader's
        return getattr(self.inner, name)


class TraceFinder(importlib.abc.MetaPathFinder):
    """Finds modules through the other finders and instruments those the patterns name once they ran."""

    def __init__(self, patterns: Iterable[str]):
        self.patterns = _parse(patterns)
        self.traced: dict[str, list[str]] = {}
        self._busy = threading.local()

    def globs_for(self, module_name: str) -> list[str]:
        return [fn for mod, fn in self.patterns if fnmatch.fnmatchcase(module_name, mod)]

    def find_spec(self, fullname, path=None, target=None):
        if not self.globs_for(fullname) or getattr(self._busy, "on", False):
            return None
        spec = spec_from_other_finders(self, self._busy, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _InstrumentingLoader(spec.loader, self)
        return spec

    def apply(self, module) -> None:
        globs = self.globs_for(module.__name__)
        if globs:
            self.traced[module.__name__] = instrument(module, globs)

    def remove(self) -> None:
        """Stop instrumenting modules imported from now on (traced functions stay traced)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def trace_modules(patterns: str | Iterable[str]) -> TraceFinder:
    """Trace the functions named by ``patterns`` ("module_glob[:function_glob]", see the module doc) in
    modules imported from now on, and in matching modules already imported."""
    finder = TraceFinder([patterns] if isinstance(patterns, str) else patterns)
    for name, module in list(sys.modules.items()):
        if module is not None and finder.globs_for(name) and name != __name__:
            finder.apply(module)
    sys.meta_path.insert(0, finder)
    return finder


def install_from_env() -> TraceFinder | None:
    """``trace_modules`` from $FLOWSCOPE_TRACE (patterns separated by commas), as ``flowscope run --trace`` sets."""
    spec = os.environ.get("FLOWSCOPE_TRACE")
    if not spec:
        return None
    return trace_modules([p for p in spec.split(",") if p.strip()])
