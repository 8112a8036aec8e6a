"""flowscope: observe scientific workflows while they run and explain where their time goes."""

__version__ = "0.1.0"

# The public names are imported when first used (PEP 562): ``import flowscope`` stays cheap (no pyarrow,
# pandas or dask), which matters where flowscope runs inside someone else's process -- the worker processes
# of Dask's processes scheduler import flowscope to run a task flowscope wrapped, and ``flowscope run``
# loads a little of flowscope into every Python process the command starts.
_LAZY = {
    "Client": "flowscope.embedded",
    "FlowscopeError": "flowscope.client.client",
    "now_ns": "flowscope.model.provenance",
    "TABLES": "flowscope.model.schemas",
    "Run": "flowscope.store.run",
    "open_run": "flowscope.store.run",
    "open_store": "flowscope.store.run_set",
    "RunSet": "flowscope.store.run_set",
    "step": "flowscope.embedded",
    "namespace": "flowscope.embedded",
    "trace": "flowscope.sources.python_tracing",
    "trace_modules": "flowscope.sources.python_tracing",
    "observe": "flowscope.sources.dask",
}

__all__ = ["Client", "FlowscopeError", "Run", "RunSet", "TABLES", "namespace", "open_run", "open_store", "now_ns",
           "observe", "step", "trace", "trace_modules", "__version__"]


#: submodules reachable as attributes without importing them first (``flowscope.forecast.when(...)``)
_SUBMODULES = ("anomalies", "feedback", "forecast")


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"flowscope.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flowscope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_SUBMODULES])
