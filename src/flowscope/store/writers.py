"""Which process writes into a store, and whether it still runs.

Several processes may write one store at once (collectors on a shared file system, a spool replay, an
import). Each leaves its identity -- host, pid and the process's start time -- where others can read it:
in the names of its temp files and, for an import, in run.json. Another process then tells a writer that
died (its temp files and staged segments are garbage; its import was interrupted) from one that is still
writing. The start time tells a reused pid apart; a writer on another host cannot be judged from here.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import dataclass
from typing import Any

import psutil

_TAG = re.compile(r"^[A-Za-z0-9-]{1,40}$")
_TOKEN = re.compile(r"^(?P<host>[A-Za-z0-9-]{1,40})\+(?P<pid>\d{1,10})\+(?P<started>\d{1,16})$")
#: a process whose start time differs from the recorded one by more than this is another process
START_TOLERANCE_MS = 1000


def host_tag(host: str) -> str:
    """``host`` as a short file-name-safe tag (letters, digits, '-'; at most 40), distinct per host name."""
    if _TAG.match(host):
        return host
    safe = re.sub(r"[^A-Za-z0-9-]", "-", host)[:31]
    return f"{safe}-{hashlib.blake2b(host.encode(), digest_size=4).hexdigest()}"


def _process_start_ms(pid: int) -> int:
    return round(psutil.Process(pid).create_time() * 1000)


@dataclass(frozen=True)
class WriterId:
    """A process that writes into the store: host name (or its tag), pid, start time (ms since the epoch)."""

    host: str
    pid: int
    started_ms: int

    @classmethod
    def current(cls) -> WriterId:
        """This process (computed again after a fork)."""
        global _current
        pid = os.getpid()
        if _current is None or _current.pid != pid:
            _current = cls(socket.gethostname(), pid, _process_start_ms(pid))
        return _current

    @property
    def host_tag(self) -> str:
        return host_tag(self.host)

    @property
    def token(self) -> str:
        """The identity as a file-name part: ``<host tag>+<pid>+<start ms>``."""
        return f"{self.host_tag}+{self.pid}+{self.started_ms}"

    @classmethod
    def from_token(cls, token: str) -> WriterId | None:
        """The writer a :attr:`token` names (its host as a tag), or None if ``token`` is not one."""
        m = _TOKEN.match(token)
        if m is None:
            return None
        return cls(m["host"], int(m["pid"]), int(m["started"]))

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started_ms": self.started_ms}

    @classmethod
    def from_dict(cls, d: Any) -> WriterId | None:
        """The writer recorded as ``d`` (from :meth:`to_dict`), or None if ``d`` is not such a record."""
        try:
            return cls(str(d["host"]), int(d["pid"]), int(d["started_ms"]))
        except (TypeError, KeyError, ValueError):
            return None

    def alive(self) -> bool | None:
        """True if the process still runs, False if it is gone, None if it runs on another host."""
        if self.host_tag != host_tag(socket.gethostname()):
            return None
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            return abs(round(proc.create_time() * 1000) - self.started_ms) <= START_TOLERANCE_MS
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:  # it exists; only its owner may look closer
            return True

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


_current: WriterId | None = None
