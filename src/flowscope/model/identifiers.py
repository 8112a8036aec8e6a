"""The resource ids every source uses, so rows from different sources about the same thing join."""

from __future__ import annotations

import os
import socket
import threading

_HOST = socket.gethostname()


def hostname() -> str:
    return _HOST


def host_id(host: str | None = None) -> str:
    return f"host:{host or _HOST}"


def process_id(pid: int | None = None, host: str | None = None) -> str:
    return f"process:{host or _HOST}:{pid if pid is not None else os.getpid()}"


def thread_id(tid: int | None = None, pid: int | None = None, host: str | None = None) -> str:
    """Thread resource id keyed by the OS native thread id (gettid), unique on a host while the thread lives."""
    return f"thread:{host or _HOST}:{pid if pid is not None else os.getpid()}:" \
           f"{tid if tid is not None else threading.get_native_id()}"


def worker_id(address: str) -> str:
    """A Dask worker (or any addressable service) by its address, e.g. worker:tcp://10.0.0.3:4242."""
    return f"worker:{address}"


def call_key(span_id: int) -> str:
    """The ``task_key`` given to a call span that a dependency or a transfer names (a message's send or
    receive call, a flow's ends) when the call belongs to no task: ``call:<span_id>``."""
    return f"call:{int(span_id)}"
