"""A critical path as contiguous steps in time, each one component of the elapsed time (compute, transfer, io,
wait, queue; idle in a path through a resource's own units), and its attribution (by kind, location, application,
component); the row helpers every path builder uses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

COMPONENTS = ("compute", "transfer", "io", "wait", "queue")
#: the component of a gap in a path through a resource's own sequence of units (its outermost spans, its I/O
#: operations; no scheduler placed them): the resource ran none of them. Not in :data:`COMPONENTS` (which every
#: attribution lists, zeros included): it appears only in such paths
IDLE_COMPONENT = "idle"
#: the ``kind`` of a step that is a unit of work (a task, an outermost span, a timed I/O operation: any source's), as
#: opposed to the gaps between units ("WAIT", "QUEUE") and a data-state path's mutations
UNIT_STEP = "task"
STEP_COLUMNS = ["id", "label", "kind", "start_ns", "end_ns", "duration_ns", "component", "location", "application"]


@dataclass
class CriticalPath:
    """A critical path as contiguous steps in time order.

    ``steps`` has one row per vertex reached (a state or a task, ``kind`` the mutation or "task") and one per
    wait, queue or transfer before it; ``duration_ns`` sums to ``length_ns``. ``ids`` lists the path's vertices
    in order (the first one, where the path starts, included)."""

    steps: pd.DataFrame
    length_ns: int
    ids: list[str] = field(default_factory=list)

    @property
    def start_ns(self) -> int | None:
        return int(self.steps["start_ns"].iloc[0]) if len(self.steps) else None

    @property
    def end_ns(self) -> int | None:
        return int(self.steps["end_ns"].iloc[-1]) if len(self.steps) else None

    def attribute(self, column: str) -> pd.DataFrame:
        """The path's time per value of ``column`` of ``steps``: ``duration_ns``, ``share`` (of the length),
        ``steps``; largest first."""
        if column not in self.steps.columns:
            raise KeyError(f"no column {column!r} in the critical path steps; known: {', '.join(self.steps.columns)}")
        s = self.steps[self.steps["duration_ns"] > 0]
        df = (s.groupby(s[column].fillna("(none)"), sort=False)["duration_ns"]
              .agg(["sum", "count"]).rename(columns={"sum": "duration_ns", "count": "steps"}).reset_index())
        df = df.rename(columns={column: column})
        df["duration_ns"] = df["duration_ns"].astype("int64")
        df["share"] = df["duration_ns"] / self.length_ns if self.length_ns > 0 else 0.0
        return df.sort_values("duration_ns", ascending=False, kind="stable").reset_index(drop=True)

    def by_kind(self) -> pd.DataFrame:
        """Time per mutation kind (TRANSFER, CONVERT, ..., "task", "WAIT", "QUEUE")."""
        return self.attribute("kind")

    def by_location(self) -> pd.DataFrame:
        """Time per location (a disk, a worker's memory, a thread)."""
        return self.attribute("location")

    def by_application(self) -> pd.DataFrame:
        """Time per application / task group."""
        return self.attribute("application")

    def by_component(self) -> pd.DataFrame:
        """Time split into compute / transfer / io / wait / queue (every component listed, zeros included)."""
        df = self.attribute("component").set_index("component")
        df = df.reindex(list(COMPONENTS) + [c for c in df.index if c not in COMPONENTS])
        df["duration_ns"] = df["duration_ns"].fillna(0).astype("int64")
        df["steps"] = df["steps"].fillna(0).astype("int64")
        df["share"] = df["share"].fillna(0.0)
        return df.reset_index()

    def to_dict(self) -> dict:
        """JSON-ready: length, vertex ids and steps (what the collector serves)."""
        return {"length_ns": int(self.length_ns), "ids": list(self.ids),
                "steps": json.loads(self.steps.to_json(orient="records"))}


def _steps_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=STEP_COLUMNS)
    for c in ("start_ns", "end_ns", "duration_ns"):
        df[c] = df[c].astype("int64")
    return df


def _step(id_, label, kind, start, end, component, location, application) -> dict:
    return {"id": id_, "label": label, "kind": kind, "start_ns": int(start), "end_ns": int(end),
            "duration_ns": int(end - start), "component": component, "location": location,
            "application": application}
