"""How the report and the dashboard's tables print seconds, durations and bytes."""

from __future__ import annotations

import pandas as pd


def fmt_s(seconds: float | None) -> str:
    """Seconds as the report prints them in tables (fixed 3 decimals, so they can be found as text)."""
    if seconds is None or pd.isna(seconds):
        return "-"
    return f"{seconds:,.3f} s"


def fmt_duration(seconds: float | None) -> str:
    """A duration in the unit a person reads best."""
    if seconds is None or pd.isna(seconds):
        return "-"
    s = float(seconds)
    if abs(s) >= 1:
        return f"{s:,.3f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} µs"


def fmt_bytes(n: float | None) -> str:
    if n is None or pd.isna(n):
        return "-"
    n = float(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"
