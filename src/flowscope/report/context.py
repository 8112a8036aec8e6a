"""What every chart of a report shares: the run, its time origin, row labels for resources, group colours."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from flowscope.store.run import Run

# Task groups take colours from this list in order of total time; kinds that are not tasks have fixed colours
# (red and brown are kept out of the list so that transfers and spilling stand out, as in Dask's dashboard).
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
    "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#f7b6d2", "#9edae5", "#dbdb8d", "#393b79",
    "#637939", "#8c6d31", "#7b4173", "#3182bd",
)
KIND_COLORS = {"transfer": "#d62728", "disk-read": "#8c564b", "disk-write": "#5d3a2e", "io": "#6b6b6b"}
OTHER_COLOR = "#c7c7c7"
MAX_GROUPS = len(PALETTE)  # groups beyond these share one "other" colour
#: what the report reads: tables, and the semantic views over them (model/semantics.py)
REPORT_TABLES = ("spans", "transfers", "io", "metrics", "logs", "resources", "activity", "executors")


def natural_key(text: str) -> tuple:
    """Sort key that orders 'worker 2' before 'worker 10'."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def _text(value) -> str | None:
    """A non-empty string, or None for a null (None, NaN, pd.NA) or empty value."""
    return value if isinstance(value, str) and value else None


def _int(value) -> int | None:
    try:
        return None if value is None or pd.isna(value) else int(value)
    except (TypeError, ValueError):
        return None


def _short_address(address: str | None) -> str | None:
    if not address:
        return None
    return address.split("://", 1)[-1]


@dataclass
class Context:
    """A run read once for a report: the time origin (``t0_ns``, the first event), the extent, rows per table."""

    run: Run
    t0_ns: int | None
    t1_ns: int | None
    counts: dict[str, int]
    _resources: pd.DataFrame | None = field(default=None, repr=False)
    _colors: dict[str, str] = field(default_factory=dict, repr=False)
    _labels: dict[str, str] | None = field(default=None, repr=False)
    _con: object = field(default=None, repr=False)

    @classmethod
    def of(cls, run: Run) -> Context:
        ctx = cls(run=run, t0_ns=None, t1_ns=None, counts=run.counts())
        parts = []
        for table, lo, hi in (("spans", "start_ns", "end_ns"), ("transfers", "start_ns", "end_ns"),
                              ("io", "start_ns", "coalesce(end_ns, start_ns)"), ("metrics", "ts_ns", "ts_ns"),
                              ("logs", "ts_ns", "ts_ns")):
            if ctx.counts.get(table):
                parts.append(f"SELECT min({lo}) AS t0, max({hi}) AS t1 FROM {table}")
        if parts:
            row = ctx.sql(f"SELECT min(t0) AS t0, max(t1) AS t1 FROM ({' UNION ALL '.join(parts)})").iloc[0]
            if pd.notna(row["t0"]):
                ctx.t0_ns, ctx.t1_ns = int(row["t0"]), int(row["t1"])
        if ctx.t0_ns is None:
            meta = run.meta
            ctx.t0_ns, ctx.t1_ns = meta.get("start_ns"), meta.get("end_ns") or meta.get("start_ns")
        return ctx

    @property
    def extent_s(self) -> float:
        if self.t0_ns is None or self.t1_ns is None:
            return 0.0
        return max(0.0, (self.t1_ns - self.t0_ns) / 1e9)

    @property
    def t0(self) -> int:
        """The time origin as an integer to put in SQL (0 when the run has no timed rows)."""
        return int(self.t0_ns or 0)

    def x_range(self) -> list[float]:
        """The time axis every chart over time shares, in seconds since ``t0_ns``."""
        ext = self.extent_s or 1.0
        pad = ext * 0.01
        return [-pad, ext + pad]

    # ---- colours ---------------------------------------------------------------------------------------
    def set_group_order(self, groups: list[str]) -> None:
        """Give task groups their colours, in order of importance (largest total time first)."""
        for g in groups:
            if g not in self._colors and g not in KIND_COLORS:
                n = len(self._colors)
                self._colors[g] = PALETTE[n] if n < MAX_GROUPS else OTHER_COLOR

    def color(self, group: str) -> str:
        return KIND_COLORS.get(group) or self._colors.get(group, OTHER_COLOR)

    def has_own_color(self, group: str) -> bool:
        return group in KIND_COLORS or self._colors.get(group, OTHER_COLOR) != OTHER_COLOR

    # ---- resources and their labels -------------------------------------------------------------------
    @property
    def resources(self) -> pd.DataFrame:
        """Each resource with its parent's kind, name and address (one row per resource_id)."""
        if self._resources is None:
            self._resources = self.sql("""
                SELECT r.resource_id, r.kind, r.name, r.parent_id, r.host, r.pid, r.tid, r.address,
                       p.kind AS p_kind, p.name AS p_name, p.address AS p_address
                FROM resources r LEFT JOIN resources p ON p.resource_id = r.parent_id""")
        return self._resources

    def rows(self, resource_ids) -> pd.DataFrame:
        """Row order and label for each resource id (a thread row is 'worker 0 / tid 4242'), sorted so that
        the threads of one worker or process sit together, followed by the worker's own row."""
        ids = pd.Index(pd.unique(pd.Series(list(resource_ids), dtype=object).dropna()))
        res = self.resources.set_index("resource_id")
        out = []
        for rid in ids:
            r = res.loc[rid] if rid in res.index else None
            owner, own_row, sub = self._label_parts(str(rid), r)
            out.append((rid, owner, own_row, sub))
        df = pd.DataFrame(out, columns=["resource_id", "owner", "own_row", "sub"])
        if df.empty:
            return df.assign(label=pd.Series(dtype=object), row=pd.Series(dtype=int))
        df["label"] = np.where(df["sub"] == "", df["owner"], df["owner"] + " / " + df["sub"])
        df["_k"] = [(natural_key(o), own, natural_key(s)) for o, own, s in zip(df["owner"], df["own_row"], df["sub"])]
        df = df.sort_values("_k", kind="stable").drop(columns="_k").reset_index(drop=True)
        df["row"] = np.arange(len(df))
        return df

    def _label_parts(self, rid: str, r) -> tuple[str, int, str]:
        """(owner label, 0 for a thread / 1 for the owner's own row, label within the owner)."""
        if r is None:
            return rid, 1, ""
        kind = _text(r["kind"])
        if kind == "thread":
            if _text(r["parent_id"]):
                owner = self._owner_label(_text(r["p_kind"]), _text(r["p_name"]), _text(r["p_address"]),
                                          _text(r["parent_id"]))
            else:  # a thread whose process was not declared: name the process by host and pid
                host, pid = _text(r["host"]), _int(r["pid"])
                owner = ":".join(str(x) for x in (host, pid) if x is not None) or "threads"
            name, tid = _text(r["name"]), _int(r["tid"])
            if name and len(name) <= 20:
                sub = name
            elif tid is not None:
                sub = f"tid {tid}"
            else:
                sub = name or rid
            return owner, 0, sub
        owner = self._owner_label(kind, _text(r["name"]), _text(r["address"]), rid)
        if kind == "worker":
            return owner, 1, "comm, disk"
        return owner, 1, ""

    @staticmethod
    def _owner_label(kind: str | None, name: str | None, address: str | None, rid: str | None) -> str:
        address = _short_address(address)
        if kind == "worker":
            if name and name != address and "://" not in name and len(name) <= 24:
                return f"worker {name}"
            return f"worker {address or name or rid}"
        return name or address or str(rid or "unknown")

    def rid_label(self, rid: str) -> str:
        """A short readable name for one resource (a worker, a host) in hover text and tables."""
        if self._labels is None:
            res = self.resources
            self._labels = {r: self._owner_label(_text(k), _text(n), _text(a), r)
                            for r, k, n, a in zip(res["resource_id"], res["kind"], res["name"], res["address"])}
        label = self._labels.get(rid)
        if label is None:
            label = _short_address(rid.split(":", 1)[-1] if rid.startswith(("worker:", "host:")) else rid) or rid
        return label

    # ---- SQL ------------------------------------------------------------------------------------------------
    def sql(self, query: str, params: list | None = None) -> pd.DataFrame:
        """SQL over the tables the report reads (spans, transfers, io, metrics, logs, resources), each read
        from the run once and then held in memory: a run's table is many small Parquet segments, and the
        report queries each table several times."""
        return self._connection().execute(query, params or None).df()

    def sql_arrow(self, query: str, params: list | None = None):
        rel = self._connection().sql(query, params=params or None)
        to_arrow = getattr(rel, "to_arrow_table", None) or rel.arrow
        return to_arrow()

    def _connection(self):
        if self._con is None:
            import duckdb

            con = duckdb.connect(":memory:")
            views = self.run.connection()  # one set of views for all the tables
            for name in REPORT_TABLES:
                query = f'SELECT * FROM "{name}"'
                try:
                    rel = views.sql(query)
                    table = (getattr(rel, "to_arrow_table", None) or rel.arrow)()
                except duckdb.Error:
                    table = self.run.sql_arrow(query)  # raises the run's own message (a damaged segment...)
                con.register(name, table)
            self._con = con
        return self._con

    @property
    def tables(self) -> _Tables:
        """The in-memory tables in the form the analyses take a run (they only call ``sql``)."""
        return _Tables(self)


class _Tables:
    """A run's tables as the report holds them, passed to analyses in place of the Run (they only use ``sql``)."""

    def __init__(self, ctx: Context):
        self._ctx = ctx

    def sql(self, query: str, params: list | None = None) -> pd.DataFrame:
        return self._ctx.sql(query, params)

    @property
    def meta(self) -> dict:
        """The run's run.json."""
        return self._ctx.run.meta
