"""Whether a run's task times were measured or derived.

A span's times are measured unless its ``attrs`` say otherwise: ``time_source`` absent or ``"measured"``
means observed; any other value (e.g. ``"derived-asap"``: placed as soon as possible from durations and
dependencies) means a rule placed the span, so its start, its end's position and the waits between spans
are not observations. Analyses that read waits or concurrency (the measured critical path, utilisation
over the spans' extent) check this first.
"""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa

TIME_SOURCE = "time_source"
MEASURED = "measured"
DERIVED = "derived"


def span_time_sources(attrs: pd.Series) -> set[str]:
    """The distinct ``time_source`` values of spans' ``attrs`` (JSON text), ``"measured"`` for spans that
    do not say."""
    text = attrs.dropna().astype(str)
    tagged = text[text.str.contains('"time_source"', regex=False)]
    out = {MEASURED} if len(tagged) < len(attrs) else set()
    for value in tagged.unique():
        try:
            v = json.loads(value).get(TIME_SOURCE, MEASURED)
        except (ValueError, AttributeError):
            v = MEASURED
        out.add(str(v))
    return out


def task_timeline(spans: pd.DataFrame | pa.Table) -> str | None:
    """``"measured"`` when every task span's times were observed, ``"derived"`` when any was placed by a
    rule, None when there are no task spans."""
    df = spans.to_pandas() if isinstance(spans, pa.Table) else spans
    if "kind" in df.columns:
        df = df[df["kind"] == "task"]
    if not len(df):
        return None
    if "attrs" not in df.columns:
        return MEASURED
    return MEASURED if span_time_sources(df["attrs"]) <= {MEASURED} else DERIVED
