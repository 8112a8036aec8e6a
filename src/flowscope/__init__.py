"""flowscope: observe scientific workflows while they run and explain where their time goes."""

__version__ = "0.1.0"

from flowscope.client.client import Client, FlowscopeError  # noqa: E402
from flowscope.model.provenance import now_ns  # noqa: E402
from flowscope.model.schemas import TABLES  # noqa: E402
from flowscope.store.run import Run, open_run  # noqa: E402
from flowscope.client.data_states import step  # noqa: E402
from flowscope.sources.python_tracing import trace, trace_modules  # noqa: E402,F401

__all__ = ["Client", "FlowscopeError", "Run", "TABLES", "open_run", "now_ns", "observe", "step", "__version__"]


def __getattr__(name: str):
    # observe() needs dask.distributed, which is slow to import: load it only when asked for
    if name == "observe":
        from flowscope.sources.dask import observe

        return observe
    raise AttributeError(f"module 'flowscope' has no attribute {name!r}")
