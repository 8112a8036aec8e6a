"""The I/O job summary of a run, from its ``io`` table: bytes, operations and time by I/O interface and by
file, access-size histograms, the largest files, metadata against data time, per-rank volume and its
imbalance, and a timeline of the timed operations.

It reads what the model holds (docs/data-model.md, "I/O rows that total many operations"): a row is one
operation, or an aggregate of ``attrs.ops`` operations that took ``attrs.busy_ns`` between ``start_ns`` and
``end_ns``; ``attrs.interface`` names the I/O layer (POSIX, MPI-IO, STDIO, HDF5...; the row's ``source``
when absent); ``attrs.in_totals = false`` marks rows whose bytes other rows of the run already count (a
layer above another, or operations an aggregate row also sums), which run-wide totals skip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from flowscope.store.run import Run

#: access-size buckets (bytes, upper bound inclusive), the bins Darshan and most I/O profilers use
SIZE_EDGES = np.array([100, 1024, 10 * 1024, 100 * 1024, 1 << 20, 4 << 20, 10 << 20, 100 << 20, 1 << 30])
SIZE_BUCKETS = ("0-100", "100-1K", "1K-10K", "10K-100K", "100K-1M", "1M-4M", "4M-10M", "10M-100M", "100M-1G",
                "1G+")
DATA_OPS = ("read", "write")
IF_COLUMNS = ["interface", "files", "read_only_files", "write_only_files", "read_write_files", "reads", "writes",
              "metadata_ops", "read_bytes", "write_bytes", "read_s", "write_s", "meta_s", "in_totals", "detail"]

#: said wherever a run has no I/O rows: what would supply them
IO_ABSENT = ("no I/O records in this run. They come from a Darshan log (`flowscope import job.darshan`, or "
             "`--run RUN` to add it to a run: its counters give bytes, operations and time per file, its DXT "
             "traces each operation), from flowscope's Dask capture (bytes each task read and wrote, files it "
             "opened), or from `client.emit(\"io\", ...)` in your own code.")

#: the run's io rows that its totals count (``attrs.in_totals`` not false), an aggregate's ``end_ns`` replaced by
#: ``start_ns + attrs.busy_ns`` (null when unknown) so that ``end_ns - start_ns`` is the time its operations took
IO_TOTALS_SQL = """
    SELECT * REPLACE (CASE WHEN coalesce(TRY_CAST(json_extract_string(attrs, '$.aggregate') AS BOOLEAN), false)
                           THEN start_ns + TRY_CAST(json_extract_string(attrs, '$.busy_ns') AS BIGINT)
                           ELSE end_ns END AS end_ns)
    FROM io WHERE coalesce(TRY_CAST(json_extract_string(attrs, '$.in_totals') AS BOOLEAN), true)"""

_FIELDS = """
    SELECT coalesce(json_extract_string(attrs, '$.interface'), source) AS interface, source, op, path, rank,
           nbytes, start_ns, end_ns,
           coalesce(TRY_CAST(json_extract_string(attrs, '$.aggregate') AS BOOLEAN), false) AS aggregate,
           coalesce(TRY_CAST(json_extract_string(attrs, '$.in_totals') AS BOOLEAN), true) AS in_totals,
           TRY_CAST(json_extract_string(attrs, '$.ops') AS BIGINT) AS agg_ops,
           TRY_CAST(json_extract_string(attrs, '$.busy_ns') AS BIGINT) AS agg_busy_ns,
           json_extract_string(attrs, '$.sizes') AS agg_sizes
    FROM io"""

# one row per kind of I/O (interface, op, file, rank, ...), operations summed in DuckDB: a DXT trace of a million
# segments becomes a row per rank, file, direction and size bucket
_ROWS_SQL = f"""
    WITH f AS ({_FIELDS}),
    r AS (SELECT interface, source, op, path, rank, aggregate, in_totals, nbytes,
                 CASE WHEN aggregate THEN coalesce(agg_ops, 0) ELSE 1 END AS ops,
                 CASE WHEN aggregate THEN agg_busy_ns ELSE end_ns - start_ns END AS busy_ns,
                 CASE WHEN aggregate THEN agg_sizes END AS sizes,
                 CASE WHEN aggregate OR op NOT IN ('read', 'write') OR nbytes IS NULL THEN NULL
                      {" ".join(f"WHEN nbytes <= {int(e)} THEN {k}" for k, e in enumerate(SIZE_EDGES))}
                      ELSE {len(SIZE_EDGES)} END AS bucket
          FROM f)
    SELECT interface, source, op, path, rank, aggregate, in_totals, sizes, bucket,
           count(*) AS records, sum(ops) AS ops, sum(nbytes) AS nbytes, sum(busy_ns) AS busy_ns,
           count(*) FILTER (WHERE busy_ns IS NULL AND (aggregate OR op IN ('read', 'write'))) AS untimed
    FROM r GROUP BY ALL"""


@dataclass
class IOSummary:
    """What :func:`io_summary` returns. Seconds are summed over the resources that did the I/O (two ranks
    reading for 1 s each count 2 s); a time is NaN where some row of it carries bytes but no duration."""

    rows: int
    sources: list[str]
    #: per interface: files, read_only_files, write_only_files, read_write_files, reads, writes, metadata_ops,
    #: read_bytes, write_bytes, read_s, write_s, meta_s, in_totals (its bytes are in the run's totals),
    #: detail (its figures come from per-operation rows rather than aggregates)
    by_interface: pd.DataFrame
    #: per interface and file: read_bytes, write_bytes, reads, writes, read_s, write_s, meta_s, ranks
    by_file: pd.DataFrame
    #: the largest files of the run's totals: path, bytes, read_bytes, write_bytes, data_s (read + write
    #: seconds), meta_s, interfaces (a time is NaN where a record has none or Darshan wrote a negative one)
    top_files: pd.DataFrame
    #: access-size histograms: interface, op, bucket (one of SIZE_BUCKETS), count
    sizes: pd.DataFrame
    #: per rank: rank, read_bytes, write_bytes, bytes
    ranks: pd.DataFrame
    #: ranks, mean_bytes, min_bytes, max_bytes, max_rank, max_over_mean, imbalance ((max - mean) / max),
    #: unattributed_bytes (bytes of the totals that no row ties to a rank)
    imbalance: dict[str, Any]
    #: read_bytes, write_bytes, reads, writes, files, data_s, meta_s, timed
    totals: dict[str, Any]
    #: the interfaces that have per-operation timed rows (a timeline: :func:`io_timeline`)
    timeline_interfaces: list[str] = field(default_factory=list)
    absent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        def records(df: pd.DataFrame) -> list[dict]:
            return [{k: _plain(v) for k, v in r.items()} for r in df.to_dict("records")]

        return {"rows": self.rows, "sources": self.sources, "totals": {k: _plain(v) for k, v in self.totals.items()},
                "by_interface": records(self.by_interface), "top_files": records(self.top_files),
                "sizes": records(self.sizes), "ranks": records(self.ranks),
                "imbalance": {k: _plain(v) for k, v in self.imbalance.items()},
                "timeline_interfaces": self.timeline_interfaces, "absent": self.absent}


def _plain(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if np.isnan(v) else float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if v is pd.NA:
        return None
    return v


def io_rows(run: Run) -> pd.DataFrame:
    """The run's ``io`` rows grouped by what the summary tells apart (interface, source, op, path, rank,
    aggregate, in_totals, sizes, size bucket), with records, ops (operations), nbytes and busy_ns (the time in
    the operations; NaN when some of them carry bytes but no duration) summed."""
    df = run.sql(_ROWS_SQL)
    for c in ("interface", "source", "op", "path", "sizes"):  # all-null string columns come back as float
        df[c] = df[c].astype(object).where(df[c].notna(), None)
    df["aggregate"] = df["aggregate"].astype(bool)
    df["in_totals"] = df["in_totals"].astype(bool)
    df["ops"] = df["ops"].fillna(0).astype(np.int64)
    df["nbytes"] = df["nbytes"].astype(float)
    df["busy_ns"] = df["busy_ns"].astype(float).where(df["untimed"].fillna(0) == 0, np.nan)
    return df


def _used(df: pd.DataFrame) -> pd.Series:
    """Rows an interface's figures come from: its aggregates when it has any, else its operations."""
    has_agg = df.groupby("interface")["aggregate"].transform("any")
    return df["aggregate"] | ~has_agg


def _op_frame(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Bytes, operation counts and seconds per ``keys``, read / write / metadata apart."""
    is_r, is_w = df["op"] == "read", df["op"] == "write"
    is_m = ~(is_r | is_w)
    busy = df["busy_ns"].astype(float)
    x = pd.DataFrame({
        **{k: df[k] for k in keys},
        "read_bytes": np.where(is_r, df["nbytes"].fillna(0).astype(float), 0.0),
        "write_bytes": np.where(is_w, df["nbytes"].fillna(0).astype(float), 0.0),
        "reads": np.where(is_r, df["ops"], 0), "writes": np.where(is_w, df["ops"], 0),
        "metadata_ops": np.where(is_m, df["ops"], 0),
        "read_s": np.where(is_r, busy, 0.0) / 1e9, "write_s": np.where(is_w, busy, 0.0) / 1e9,
        "meta_s": np.where(is_m, busy, 0.0) / 1e9,
        # a data row with no duration makes its direction's time unknown (per-task byte counters)
        "r_untimed": is_r & df["busy_ns"].isna(), "w_untimed": is_w & df["busy_ns"].isna(),
        "m_untimed": is_m & df["busy_ns"].isna(),
    })
    g = x.groupby(keys, sort=True, dropna=False).sum()
    for t, u in (("read_s", "r_untimed"), ("write_s", "w_untimed"), ("meta_s", "m_untimed")):
        g[t] = g[t].where(~g[u].astype(bool), np.nan)
    g = g.drop(columns=["r_untimed", "w_untimed", "m_untimed"])
    for c in ("read_bytes", "write_bytes"):
        g[c] = g[c].astype(np.int64)
    return g.reset_index()


def _sizes(df: pd.DataFrame) -> pd.DataFrame:
    """Access-size histograms: an interface's aggregates' ``sizes`` where it has aggregates, else its
    operations binned by ``nbytes``."""
    out = []
    data = df[df["op"].isin(DATA_OPS)]
    agg = data[data["aggregate"] & data["sizes"].notna()]
    if len(agg):
        counts = np.array([_parse_sizes(s) for s in agg["sizes"]], dtype=np.int64)
        h = pd.DataFrame(counts, columns=list(SIZE_BUCKETS))
        h["interface"], h["op"] = agg["interface"].to_numpy(), agg["op"].to_numpy()
        out.append(h.groupby(["interface", "op"]).sum().reset_index().melt(
            id_vars=["interface", "op"], var_name="bucket", value_name="count"))
    ops = data[~data["aggregate"] & data["bucket"].notna()]
    if len(ops):
        h = pd.DataFrame({"interface": ops["interface"].to_numpy(), "op": ops["op"].to_numpy(),
                          "bucket": np.array(SIZE_BUCKETS, dtype=object)[ops["bucket"].astype(np.int64)],
                          "count": ops["ops"].to_numpy()})
        out.append(h.groupby(["interface", "op", "bucket"])["count"].sum().reset_index())
    if not out:
        return pd.DataFrame(columns=["interface", "op", "bucket", "count"])
    res = pd.concat(out, ignore_index=True)
    res = res[res.groupby(["interface", "op"])["count"].transform("sum") > 0]
    res["bucket"] = pd.Categorical(res["bucket"], categories=SIZE_BUCKETS, ordered=True)
    res = res.sort_values(["interface", "op", "bucket"]).reset_index(drop=True)
    res["bucket"] = res["bucket"].astype(str)
    res["count"] = res["count"].astype(np.int64)
    return res


def _parse_sizes(s: str) -> list[int]:
    import json

    v = json.loads(s)
    return [int(x) for x in v][:len(SIZE_BUCKETS)] + [0] * (len(SIZE_BUCKETS) - len(v))


def _ranks(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Bytes per rank from the rows in the totals; an aggregate with no rank (a file shared by all ranks) is
    split by the rank of the operations recorded on the same interface and file, where there are any. Returns
    the per-rank frame and the bytes left with no rank."""
    tot = df[df["in_totals"] & df["op"].isin(DATA_OPS)]
    ranked = tot[tot["rank"].notna()]
    present = df[df["in_totals"] & df["rank"].notna()][["rank"]].drop_duplicates()  # ranks that only opened files
    parts = [ranked[["rank", "op", "nbytes"]]]
    shared = tot[tot["rank"].isna()]
    unattributed = 0.0
    if len(shared):
        sb = shared.groupby(["interface", "path"], dropna=False)["nbytes"].sum().rename("shared")
        detail = df[~df["aggregate"] & ~df["in_totals"] & df["rank"].notna() & df["op"].isin(DATA_OPS)]
        detail = detail.merge(sb.reset_index()[["interface", "path"]], on=["interface", "path"])
        parts.append(detail[["rank", "op", "nbytes"]])
        covered = detail.groupby(["interface", "path"])["nbytes"].sum().rename("covered")
        j = pd.concat([sb, covered], axis=1).fillna(0)
        unattributed = float((j["shared"] - j["covered"]).clip(lower=0).sum())
    x = pd.concat(parts, ignore_index=True)
    x["nbytes"] = x["nbytes"].fillna(0).astype(float)
    x["read_bytes"] = np.where(x["op"] == "read", x["nbytes"], 0.0)
    x["write_bytes"] = np.where(x["op"] == "write", x["nbytes"], 0.0)
    g = x.groupby("rank")[["read_bytes", "write_bytes"]].sum()
    g = g.reindex(sorted(set(g.index) | set(present["rank"]))).fillna(0).astype(np.int64)
    g["bytes"] = g["read_bytes"] + g["write_bytes"]
    g.index = g.index.astype(np.int64)
    return g.rename_axis("rank").reset_index(), int(unattributed)


def _imbalance(ranks: pd.DataFrame, unattributed: int) -> dict[str, Any]:
    v = ranks["bytes"].to_numpy(dtype=float)
    if not len(v):
        return {"ranks": 0, "mean_bytes": None, "min_bytes": None, "max_bytes": None, "max_rank": None,
                "max_over_mean": None, "imbalance": None, "unattributed_bytes": unattributed}
    mean, mx = float(v.mean()), float(v.max())
    return {"ranks": len(v), "mean_bytes": mean, "min_bytes": int(v.min()), "max_bytes": int(mx),
            "max_rank": int(ranks["rank"].iloc[int(v.argmax())]),
            "max_over_mean": mx / mean if mean else 1.0, "imbalance": (mx - mean) / mx if mx else 0.0,
            "unattributed_bytes": unattributed}


#: the largest files: bytes and seconds from the layers the run's totals count (Darshan: POSIX + STDIO)
TOP_FILE_COLUMNS = ["path", "bytes", "read_bytes", "write_bytes", "data_s", "meta_s", "interfaces"]


def io_summary(run: Run, top: int = 10) -> IOSummary:
    """The I/O job summary of ``run`` (see :class:`IOSummary`); ``top`` largest files."""
    df = io_rows(run)
    if not len(df):
        return IOSummary(0, [], pd.DataFrame(columns=IF_COLUMNS), pd.DataFrame(columns=["interface", "path"]),
                         pd.DataFrame(columns=TOP_FILE_COLUMNS), _sizes(df), pd.DataFrame(columns=["rank", "read_bytes",
                         "write_bytes", "bytes"]), _imbalance(pd.DataFrame({"rank": [], "bytes": []}), 0),
                         {"read_bytes": 0, "write_bytes": 0, "reads": 0, "writes": 0, "files": 0, "data_s": 0.0,
                          "meta_s": 0.0, "timed": False}, [], IO_ABSENT)
    used = df[_used(df)]
    by_if = _op_frame(used, ["interface"])
    # files and how each was accessed (by bytes moved), per interface
    per_file = _op_frame(used, ["interface", "path"])
    per_file = per_file[per_file["path"].notna()].astype({"path": object})  # no path at all: float NaN
    ranks_per_file = used[used["path"].notna()].groupby(["interface", "path"])["rank"].nunique()
    per_file = per_file.merge(ranks_per_file.rename("ranks").reset_index().astype({"path": object}),
                              on=["interface", "path"], how="left")
    r, w = per_file["read_bytes"] > 0, per_file["write_bytes"] > 0
    cats = pd.DataFrame({"interface": per_file["interface"], "files": 1, "read_only_files": r & ~w,
                         "write_only_files": w & ~r, "read_write_files": r & w}).groupby("interface").sum()
    by_if = by_if.merge(cats.astype(np.int64).reset_index(), on="interface", how="left")
    for c in ("files", "read_only_files", "write_only_files", "read_write_files"):
        by_if[c] = by_if[c].fillna(0).astype(np.int64)
    flags = df.groupby("interface").agg(in_totals=("in_totals", "any"), detail=("aggregate", lambda a: not a.any()))
    by_if = by_if.merge(flags.reset_index(), on="interface", how="left")
    by_if = by_if[IF_COLUMNS]

    tot = df[df["in_totals"]]
    t = _op_frame(tot.assign(_all=0), ["_all"]).iloc[0] if len(tot) else None
    files = tot[tot["path"].notna()].groupby("path").agg(
        interfaces=("interface", lambda s: ", ".join(sorted(set(s)))))
    fb = _op_frame(tot[tot["path"].notna()], ["path"]).set_index("path")
    files = files.join(fb[["read_bytes", "write_bytes", "read_s", "write_s", "meta_s"]])
    files["bytes"] = files["read_bytes"] + files["write_bytes"]
    files["data_s"] = files["read_s"] + files["write_s"]   # unknown (NaN) when either direction is
    top_files = files.reset_index().sort_values(["bytes", "path"], ascending=[False, True]).head(top)
    top_files = top_files[TOP_FILE_COLUMNS].reset_index(drop=True)
    ranks, unattributed = _ranks(df)
    timed_ops = df[~df["aggregate"] & df["op"].isin(DATA_OPS) & df["busy_ns"].notna()]
    totals = {"read_bytes": int(t["read_bytes"]) if t is not None else 0,
              "write_bytes": int(t["write_bytes"]) if t is not None else 0,
              "reads": int(t["reads"]) if t is not None else 0, "writes": int(t["writes"]) if t is not None else 0,
              "files": int(tot["path"].nunique()),
              "data_s": float(t["read_s"] + t["write_s"]) if t is not None else 0.0,
              "meta_s": float(t["meta_s"]) if t is not None else 0.0}
    totals["timed"] = totals["data_s"] is not None and not np.isnan(totals["data_s"])
    return IOSummary(
        rows=int(df["records"].sum()), sources=sorted(df["source"].unique()), by_interface=by_if.reset_index(drop=True),
        by_file=per_file.reset_index(drop=True), top_files=top_files, sizes=_sizes(used), ranks=ranks,
        imbalance=_imbalance(ranks, unattributed), totals=totals,
        timeline_interfaces=sorted(timed_ops["interface"].unique()))


def io_timeline(run: Run, bins: int = 100, interface: str | None = None, start_ns: int | None = None,
                end_ns: int | None = None) -> pd.DataFrame:
    """Bytes moved per time bin by the run's timed per-operation rows (e.g. Darshan DXT segments), per interface,
    rank and operation: ``bins`` equal bins over [start_ns, end_ns] (default: the rows' extent); each operation's
    bytes are spread over the bins its interval overlaps, in proportion to the overlap (an instantaneous one
    falls in the bin of its start). Columns: interface, rank, op, bin, start_ns, nbytes, ops (operations that
    start in the bin)."""
    where = "" if interface is None else "AND interface = ?"
    df = run.sql(f"""SELECT interface, rank, op, nbytes, start_ns, end_ns FROM ({_FIELDS})
                     WHERE NOT aggregate AND op IN ('read', 'write') AND end_ns IS NOT NULL AND nbytes IS NOT NULL
                     {where}""", [interface] if interface is not None else None)
    cols = ["interface", "rank", "op", "bin", "start_ns", "nbytes", "ops"]
    if not len(df) or bins < 1:
        return pd.DataFrame(columns=cols)
    t0 = int(df["start_ns"].min()) if start_ns is None else int(start_ns)
    t1 = int(df["end_ns"].max()) if end_ns is None else int(end_ns)
    width = max(t1 - t0, 1) / bins
    s = (df["start_ns"].to_numpy(dtype=np.int64) - t0).astype(float)
    e = (df["end_ns"].to_numpy(dtype=np.int64) - t0).astype(float)
    nb = df["nbytes"].to_numpy(dtype=float)
    first = np.clip(np.floor(s / width), 0, bins - 1).astype(np.int64)
    last = np.clip(np.ceil(e / width) - 1, 0, bins - 1).astype(np.int64)
    last = np.maximum(last, first)
    n = last - first + 1
    row = np.repeat(np.arange(len(df)), n)
    b = np.repeat(first, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    lo, hi = b * width, (b + 1) * width
    dur = (e - s)[row]
    overlap = np.clip(np.minimum(e[row], hi) - np.maximum(s[row], lo), 0, None)
    frac = np.where(dur > 0, overlap / np.where(dur > 0, dur, 1), (b == first[row]).astype(float))
    out = pd.DataFrame({"interface": df["interface"].to_numpy()[row], "rank": df["rank"].to_numpy()[row],
                        "op": df["op"].to_numpy()[row], "bin": b, "nbytes": nb[row] * frac,
                        "ops": (b == first[row]).astype(np.int64)})
    g = out.groupby(["interface", "rank", "op", "bin"], dropna=False)[["nbytes", "ops"]].sum().reset_index()
    g["start_ns"] = t0 + np.round(g["bin"].to_numpy() * width).astype(np.int64)
    return g[cols]
