"""What both Paje readers share about the format: splitting a line into fields, the time limit, the comment
flowscope's exporter writes, the lane suffix of exported kinds, and the signal that a trace is not time-ordered.

The line simulator (paje.py) and the vectorised path (paje_fast.py) both import it, so neither imports the other
for it.
"""

from __future__ import annotations

import re

from flowscope.importers import TraceError

#: |origin + time| in ns must stay below this (int64 timestamps; times are checked as if in seconds)
TIME_LIMIT = 9.2e18
#: the comment flowscope's Paje exporter writes, so a round trip restores absolute times and ids
FLOWSCOPE_MARK = re.compile(r"#\s*flowscope paje export:\s*time_origin_ns=(-?\d+)")
#: the ``~N`` suffix of the extra state types flowscope's exporter writes for spans that overlap without nesting
LANE = re.compile(r"~\d+$")
_TOKEN = re.compile(r'"([^"]*)"|(\S+)')


class Unordered(Exception):
    """Raised in the streaming pass when a timed event goes back in time."""

    def __init__(self, where: str, t: float, prev: float):
        self.where, self.t, self.prev = where, t, prev


def split_fields(line: str, where: str) -> list[str]:
    """The fields of an event line: blank-separated, a double-quoted field may hold blanks."""
    if '"' not in line:
        return line.split()
    if line.count('"') % 2:
        raise TraceError(f"{where}: unterminated quoted string")
    return [m.group(1) if m.group(1) is not None else m.group(2) for m in _TOKEN.finditer(line)]
