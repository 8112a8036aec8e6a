"""An instability detector for application diagnostics: a quantity that a healthy run keeps bounded (the energy a
dissipative scheme loses, the magnitude of an extremum) and that an unstable run makes grow geometrically, step after
step, until the numbers overflow and the program crashes (the SOMA dissertation's Figs. 15-16: the diagnostic is seen
before the crash). The same rule online (:class:`InstabilityDetector`, fed one step at a time, e.g. from a namespace's
publications) and offline (:func:`find_instability` over a stored series) gives the same verdict at the same step.

The rule: the last ``window`` steps each multiplied the value by more than ``min_ratio`` (1: it only grew) and together
by at least ``growth``. A lone spike does not pass (it comes down again); a value that is no longer finite fires at
once, as the last warning there is.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

__all__ = ["InstabilityDetector", "find_instability"]


class InstabilityDetector:
    """Online: ``update(step, value)`` returns the verdict the first time the rule holds (then None ever after):
    ``{"step", "value", "growth" (over the window), "rate" (per step, geometric mean), "reason"}``, reason
    ``"geometric growth"`` or ``"non-finite value"``."""

    def __init__(self, window: int = 8, growth: float = 100.0, min_ratio: float = 1.0):
        if not isinstance(window, int) or window < 2:
            raise ValueError(f"window: at least 2 steps, got {window!r}")
        if not growth > 1.0:
            raise ValueError(f"growth: a factor above 1, got {growth!r}")
        if not min_ratio >= 1.0:
            raise ValueError(f"min_ratio: at least 1 (the value never shrinks inside the window), got {min_ratio!r}")
        self.window, self.growth, self.min_ratio = window, float(growth), float(min_ratio)
        self._last: deque[float] = deque(maxlen=window + 1)
        self.verdict: dict | None = None

    def update(self, step: int, value: float) -> dict | None:
        if self.verdict is not None:
            return None
        v = float(value)
        if not math.isfinite(v):
            first = self._last[0] if self._last else math.nan
            self.verdict = {"step": step, "value": v, "growth": math.inf, "rate": math.inf if first else math.nan,
                            "reason": "non-finite value"}
            return self.verdict
        self._last.append(v)
        if len(self._last) <= self.window:
            return None
        vals = list(self._last)
        if vals[0] > 0 and all(b > a * self.min_ratio for a, b in zip(vals, vals[1:])):
            g = vals[-1] / vals[0]
            if g >= self.growth:
                self.verdict = {"step": step, "value": v, "growth": g, "rate": g ** (1.0 / self.window),
                                "reason": "geometric growth"}
                return self.verdict
        return None


def find_instability(steps: Sequence[int], values: Sequence[float], *, window: int = 8, growth: float = 100.0,
                     min_ratio: float = 1.0) -> dict | None:
    """The first verdict of the rule over a stored series (``steps`` in order, ``values`` beside them), or None."""
    if len(steps) != len(values):
        raise ValueError(f"steps and values must be as long as each other: {len(steps)} and {len(values)}")
    d = InstabilityDetector(window, growth, min_ratio)
    for s, v in zip(steps, values):
        got = d.update(int(s), v)
        if got is not None:
            return got
    return None
