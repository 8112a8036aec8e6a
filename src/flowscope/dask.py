"""``flowscope.dask``: the Dask integration's public face, and the module ``--preload flowscope.dask`` loads."""

from flowscope.sources.dask import (FlowscopeSchedulerPlugin, FlowscopeWorkerPlugin, Observation,  # noqa: F401
                                    dask_setup, dask_teardown, discover, observe, register, unregister)
