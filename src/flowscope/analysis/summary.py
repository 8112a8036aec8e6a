"""A run at a glance: rows per table, time range, resources, and where span time goes."""

from __future__ import annotations

from dataclasses import dataclass, field

from flowscope.store.run import Run


@dataclass
class RunSummary:
    run_id: str
    name: str | None
    status: str | None
    rows: dict[str, int]
    start_ns: int | None
    end_ns: int | None
    resources_by_kind: dict[str, int] = field(default_factory=dict)
    top_spans: list[dict] = field(default_factory=list)   # name, kind, count, total_ns, mean_ns, max_ns
    logs_by_level: dict[str, int] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return self.end_ns - self.start_ns

    def to_dict(self) -> dict:
        d = self.__dict__.copy()
        d["duration_ns"] = self.duration_ns
        return d


def summarize(run: Run, top: int = 10) -> RunSummary:
    """Summarise ``run``: counts per table, observed time range, the span names with most total time."""
    meta = run.meta
    rows = run.counts()
    first_last = run.sql("""
        SELECT min(t0) AS t0, max(t1) AS t1 FROM (
            SELECT min(start_ns) AS t0, max(end_ns) AS t1 FROM spans
            UNION ALL SELECT min(ts_ns), max(ts_ns) FROM metrics
            UNION ALL SELECT min(ts_ns), max(ts_ns) FROM logs
            UNION ALL SELECT min(ts_ns), max(ts_ns) FROM transitions)""").iloc[0]
    start = meta.get("start_ns")
    end = meta.get("end_ns")
    if first_last["t0"] == first_last["t0"] and first_last["t0"] is not None:  # not NaN
        start = int(first_last["t0"]) if start is None else min(start, int(first_last["t0"]))
        end = int(first_last["t1"]) if end is None else max(end, int(first_last["t1"]))
    kinds = run.sql("SELECT kind, count(*) AS n FROM resources GROUP BY kind ORDER BY n DESC")
    spans = run.sql(f"""
        SELECT name, kind, count(*) AS count, CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns,
               avg(end_ns - start_ns) AS mean_ns, max(end_ns - start_ns) AS max_ns
        FROM spans GROUP BY name, kind ORDER BY total_ns DESC LIMIT {int(top)}""")
    levels = run.sql("SELECT level, count(*) AS n FROM logs GROUP BY level ORDER BY n DESC")
    return RunSummary(
        run_id=meta["run_id"], name=meta.get("name"), status=meta.get("status"), rows=rows,
        start_ns=start, end_ns=end,
        resources_by_kind=dict(zip(kinds["kind"], map(int, kinds["n"]))),
        top_spans=[{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                   for r in spans.to_dict("records")],
        logs_by_level=dict(zip(levels["level"], map(int, levels["n"]))),
    )
