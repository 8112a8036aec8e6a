"""The I/O job summary (flowscope.analysis.io_summary) of imported Darshan logs, every figure checked against
PyDarshan computing the same quantity from the same log; the same summary over a real Dask run's own I/O rows;
``flowscope io`` and the report's I/O summary section."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import require_module

darshan = require_module("darshan", "PyDarshan reads Darshan logs: pip install -e '.[test]'")

from darshan.backend.cffi_backend import accumulate_records  # noqa: E402
from darshan.experimental.plots import heatmap_handling  # noqa: E402
from darshan.experimental.plots.plot_io_cost import get_io_cost_df  # noqa: E402

from flowscope import open_run  # noqa: E402
from flowscope.analysis.io_summary import SIZE_BUCKETS, io_summary, io_timeline  # noqa: E402
from flowscope.importers import import_paths  # noqa: E402

#: what the brief names: MPI with 32 ranks and DXT, non-MPI DXT, HDF5, STDIO only, partial DXT, empty, releases
SETS = ("mpi_io_test_with_dxt", "nonmpi_dxt_anonymized", "hdf5_diagonal_write_only", "stdio_no_posix",
        "partial_data_dxt", "empty_log", "release_logs")
#: the counter prefix and the operation counters of each module PyDarshan reads (darshan-log-format's names)
OPS = {"POSIX": ("POSIX", ["READS"], ["WRITES"]),
       "MPI-IO": ("MPIIO", ["INDEP_READS", "COLL_READS", "SPLIT_READS", "NB_READS"],
                  ["INDEP_WRITES", "COLL_WRITES", "SPLIT_WRITES", "NB_WRITES"]),
       "STDIO": ("STDIO", ["READS"], ["WRITES"]), "H5F": ("H5F", [], []), "H5D": ("H5D", ["READS"], ["WRITES"])}
LOWER = ("POSIX", "STDIO")  # the modules that do not sit on another one: a run's totals come from them
TIME_TOL = 1e-9  # relative, for sums of float seconds added in another order
#: absolute, per record summed: the io table holds each record's time in whole nanoseconds (rounded)
NS_ROUNDING = 0.5e-9


def logs(shared: Path) -> list[Path]:
    return sorted(p for s in SETS for p in (shared / "darshan" / s).glob("*.darshan"))


@pytest.fixture(scope="module")
def imported(shared_data, tmp_path_factory):
    store = tmp_path_factory.mktemp("io-summary") / "store"
    out = {}
    for log in logs(shared_data):
        res = import_paths([log], store)
        out[log] = open_run(res.run_dir)
    return out


def _records(rep, mod: str) -> pd.DataFrame | None:
    if mod not in rep.records or not len(rep.records[mod]):
        return None
    d = rep.records[mod].to_df()
    c, f = d["counters"], d["fcounters"]
    df = c.merge(f, on=["id", "rank"], suffixes=("", "_f"))
    df["path"] = [rep.name_records[i] for i in df["id"]]
    return df


@functools.cache
def reference(log: Path) -> dict:
    """The job summary PyDarshan gives for ``log``."""
    rep = darshan.DarshanReport(str(log), read_all=True)
    nprocs = rep.metadata["job"]["nprocs"]
    mods, sizes, files, ranks, shared, file_times = {}, {}, {}, {}, {}, {}
    cost = get_io_cost_df(rep) if rep.modules else pd.DataFrame()
    for mod, (p, rd, wr) in OPS.items():
        df = _records(rep, mod)
        if df is None:
            continue
        if mod in ("POSIX", "MPI-IO", "STDIO"):  # darshan-util's accumulator: file categories and volumes
            acc = accumulate_records(rep.records[mod].to_df(), mod, nprocs).derived_metrics
            cats = [acc.category_counters[i] for i in range(4)]
            m = {"files": int(cats[0].count), "read_only_files": int(cats[1].count),
                 "write_only_files": int(cats[2].count), "read_write_files": int(cats[3].count),
                 "read_bytes": int(cats[0].total_read_volume_bytes),
                 "write_bytes": int(cats[0].total_write_volume_bytes)}
        else:  # it has none for HDF5 ("does not support derived metric calculation"): the records themselves
            m = {"files": int(df["id"].nunique()),
                 "read_bytes": int(df[f"{p}_BYTES_READ"].sum()) if f"{p}_BYTES_READ" in df else 0,
                 "write_bytes": int(df[f"{p}_BYTES_WRITTEN"].sum()) if f"{p}_BYTES_WRITTEN" in df else 0}
        m.update({
             "reads": int(sum(df[f"{p}_{c}"].sum() for c in rd)),
             "writes": int(sum(df[f"{p}_{c}"].sum() for c in wr))})
        # PyDarshan's I/O cost figure: seconds per process, averaged over nprocs (H5F and H5D summed as HDF5)
        key = {"MPI-IO": "MPIIO"}.get(mod, mod)
        for op, col in (("read_s", "Read"), ("write_s", "Write"), ("meta_s", "Meta")):
            t = df[f"{p}_F_{col.upper()}_TIME"] if f"{p}_F_{col.upper()}_TIME" in df else pd.Series([0.0])
            m[op] = float(t.sum())
            m.setdefault("negative", {})[op] = bool((t < 0).any())
        m["cost_key"] = "HDF5" if mod in ("H5F", "H5D") else key
        m["records"] = len(df)
        mods[mod] = m
        for path, g in df.groupby("path"):  # seconds per file (all ranks' records of it)
            ft = {"records": len(g)}
            for op, col in (("read_s", "READ"), ("write_s", "WRITE"), ("meta_s", "META")):
                t = g[f"{p}_F_{col}_TIME"] if f"{p}_F_{col}_TIME" in g else pd.Series([0.0])
                ft[op], ft[f"{op}_negative"] = float(t.sum()), bool((t < 0).any())
            file_times[(mod, path)] = ft
        for op in ("READ", "WRITE"):
            cols = [c for c in df.columns if c.startswith((f"{p}_SIZE_{op}_", f"{p}_SIZE_{op}_AGG_"))]
            if cols:
                sizes[(mod, op.lower())] = [int(df[c].sum()) for c in cols]
        if mod in LOWER:
            for path, g in df.groupby("path"):
                b = int(g.get(f"{p}_BYTES_READ", 0).sum() + g.get(f"{p}_BYTES_WRITTEN", 0).sum())
                files[path] = files.get(path, 0) + b
            for rank, b in zip(df["rank"], df[f"{p}_BYTES_READ"] + df[f"{p}_BYTES_WRITTEN"]):
                if rank >= 0:
                    ranks[int(rank)] = ranks.get(int(rank), 0) + int(b)
                    continue
            sh = df[df["rank"] < 0]
            for path, b in zip(sh["path"], sh[f"{p}_BYTES_READ"] + sh[f"{p}_BYTES_WRITTEN"]):
                shared[(mod, path)] = shared.get((mod, path), 0) + int(b)
    # shared records (rank -1) are split over ranks by their DXT segments, where the log has them
    dxt = {}
    for mod in ("DXT_POSIX", "DXT_MPIIO"):
        for rec in rep.records[mod].to_df() if mod in rep.records else ():
            for op in ("read", "write"):
                seg = rec[f"{op}_segments"]
                if len(seg):
                    k = (mod, rec["rank"], rep.name_records[rec["id"]])
                    dxt[k] = dxt.get(k, 0) + int(seg["length"].sum())
    unattributed = 0
    for (mod, path), b in shared.items():
        covered = 0
        for (dmod, rank, dpath), db in dxt.items():
            if dmod == f"DXT_{mod}" and dpath == path:
                ranks[int(rank)] = ranks.get(int(rank), 0) + db
                covered += db
        unattributed += max(b - covered, 0)
    return {"nprocs": nprocs, "modules": mods, "sizes": sizes, "files": files, "ranks": ranks,
            "unattributed": unattributed, "cost": cost, "rep": rep, "dxt": dxt, "file_times": file_times}


def close(a: float, b: float, records: int = 1) -> bool:
    return math.isclose(a, b, rel_tol=TIME_TOL, abs_tol=NS_ROUNDING * records + 1e-12)


def test_the_summary_covers_every_log_the_brief_names(imported, shared_data):
    assert {p.parent.name for p in imported} == set(SETS)
    assert len(imported) >= 40


def test_bytes_operations_files_and_times_per_module_equal_pydarshan(imported):
    checked = set()
    for log, run in imported.items():
        ref = reference(log)
        s = io_summary(run)
        got = s.by_interface.set_index("interface")
        assert set(got.index) == set(ref["modules"]), log
        for mod, m in ref["modules"].items():
            g = got.loc[mod]
            for k in ("files", "read_only_files", "write_only_files", "read_write_files", "read_bytes", "write_bytes",
                      "reads", "writes"):
                if k not in m:
                    continue
                assert int(g[k]) == m[k], (log.name, mod, k, g[k], m[k])
            for k in ("read_s", "write_s", "meta_s"):
                if m["negative"][k]:  # Darshan wrote a negative time: unknown, not a figure to add up
                    assert math.isnan(g[k]), (log.name, mod, k, g[k])
                    continue
                assert close(float(g[k]), m[k], m["records"]), (log.name, mod, k, g[k], m[k])
            checked.add(mod)
        # PyDarshan's I/O cost figure (seconds per process): ours divided by the number of processes
        if not ref["cost"].empty:
            records = sum(m["records"] for m in ref["modules"].values())
            per_proc = s.by_interface.assign(
                key=s.by_interface["interface"].map(lambda i: {"MPI-IO": "MPIIO", "H5F": "HDF5", "H5D": "HDF5"}.get(i, i))
            ).groupby("key")[["read_s", "write_s", "meta_s"]].sum() / ref["nprocs"]
            for key, row in ref["cost"].iterrows():
                for ours, theirs in (("read_s", "Read"), ("write_s", "Write"), ("meta_s", "Meta")):
                    if any(m["negative"][ours] for m in ref["modules"].values() if m["cost_key"] == key):
                        continue
                    assert close(float(per_proc.loc[key, ours]), float(row[theirs]), records), (log.name, key, ours)
    assert {"POSIX", "MPI-IO", "STDIO", "H5F", "H5D"} <= checked


def test_seconds_per_file_equal_pydarshans(imported):
    """Read, write and metadata seconds of every file of every module: the sum of its records' F_*_TIME counters
    over all ranks, as PyDarshan reads them (a negative counter: unknown)."""
    checked = 0
    for log, run in imported.items():
        want = reference(log)["file_times"]
        got = io_summary(run).by_file.set_index(["interface", "path"])
        assert set(got.index) == set(want), log.name
        for key, ft in want.items():
            for op in ("read_s", "write_s", "meta_s"):
                if ft[f"{op}_negative"]:
                    assert math.isnan(got.loc[key, op]), (log.name, key, op)
                else:
                    assert close(float(got.loc[key, op]), ft[op], ft["records"]), (log.name, key, op, got.loc[key, op])
                checked += 1
    assert checked > 1000


def test_totals_count_each_byte_once(imported, shared_data):
    """MPI-IO and HDF5 sit on POSIX: the run's totals are POSIX + STDIO, never the sum over all layers."""
    for log, run in imported.items():
        ref = reference(log)
        s = io_summary(run)
        want_r = sum(ref["modules"][m]["read_bytes"] for m in LOWER if m in ref["modules"])
        want_w = sum(ref["modules"][m]["write_bytes"] for m in LOWER if m in ref["modules"])
        assert (s.totals["read_bytes"], s.totals["write_bytes"]) == (want_r, want_w), log.name
        if any(ref["modules"][m]["negative"][k] for m in LOWER if m in ref["modules"] for k in ("read_s", "write_s",
                                                                                              "meta_s")):
            assert not s.totals["timed"] or math.isnan(s.totals["meta_s"]), log.name  # unknown, said so
            continue
        want_t = sum(ref["modules"][m][k] for m in LOWER if m in ref["modules"] for k in ("read_s", "write_s"))
        records = sum(ref["modules"][m]["records"] for m in LOWER if m in ref["modules"])
        assert close(s.totals["data_s"], want_t, 2 * records), log.name
        want_meta = sum(ref["modules"][m]["meta_s"] for m in LOWER if m in ref["modules"])
        assert close(s.totals["meta_s"], want_meta, records), log.name
    mpi = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    assert io_summary(imported[mpi]).totals["read_bytes"] == 2147483648  # not 2x (MPI-IO over POSIX) nor 3x (+DXT)


def test_access_size_histograms_equal_pydarshans(imported):
    seen = 0
    for log, run in imported.items():
        ref = reference(log)
        h = io_summary(run).sizes
        got = {}
        for (mod, op), g in h.groupby(["interface", "op"]):
            got[(mod, op)] = g.set_index("bucket").reindex(SIZE_BUCKETS)["count"].fillna(0).astype(int).tolist()
        want = {k: v for k, v in ref["sizes"].items() if any(v)}  # a direction with no access has no histogram
        assert {k: v for k, v in got.items() if k[0] in OPS} == want, log.name
        seen += bool(want)
    assert seen >= 40


def test_top_files_are_pydarshans_largest(imported):
    for log, run in imported.items():
        ref = reference(log)
        top = io_summary(run, top=5).top_files
        want = sorted(((b, p) for p, b in ref["files"].items()), key=lambda x: (-x[0], x[1]))[:5]
        got = [(int(b), p) for b, p in zip(top["bytes"], top["path"])]
        assert got == want, log.name
        # and their seconds, from the same layers as their bytes (POSIX + STDIO: MPI-IO sits on POSIX)
        for f in top.to_dict("records"):
            ft = [v for (mod, path), v in ref["file_times"].items() if mod in LOWER and path == f["path"]]
            records = sum(v["records"] for v in ft)
            for ours, ops in (("data_s", ("read_s", "write_s")), ("meta_s", ("meta_s",))):
                if any(v[f"{op}_negative"] for v in ft for op in ops):
                    assert math.isnan(f[ours]), (log.name, f["path"], ours)
                else:
                    assert close(f[ours], sum(v[op] for v in ft for op in ops), 2 * records), (log.name, f, ours)


def test_per_rank_volume_and_imbalance_equal_pydarshans(imported, shared_data):
    for log, run in imported.items():
        ref = reference(log)
        s = io_summary(run)
        got = {int(r): int(b) for r, b in zip(s.ranks["rank"], s.ranks["bytes"])}
        assert got == ref["ranks"], log.name
        assert s.imbalance["unattributed_bytes"] == ref["unattributed"], log.name
        if ref["ranks"]:
            v = np.array(list(ref["ranks"].values()), dtype=float)
            assert s.imbalance["ranks"] == len(v)
            assert close(s.imbalance["max_over_mean"], v.max() / v.mean() if v.mean() else 1.0)
            assert s.imbalance["max_bytes"] == int(v.max())
    mpi = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    assert io_summary(imported[mpi]).imbalance["ranks"] == 32
    partial = shared_data / "darshan" / "partial_data_dxt" / "partial_data_dxt.darshan"
    assert io_summary(imported[partial]).imbalance["unattributed_bytes"] > 0  # DXT filled its buffer


def test_dxt_timeline_equals_pydarshans_heat_map(imported, shared_data):
    checked = 0
    for log, run in imported.items():
        ref = reference(log)
        rep = ref["rep"]
        for mod, interface in (("DXT_POSIX", "POSIX"), ("DXT_MPIIO", "MPI-IO")):
            try:
                agg = heatmap_handling.get_aggregate_data(rep, mod=mod, ops=["read", "write"])
            except (ValueError, KeyError):
                assert not any(k[0] == mod for k in ref["dxt"]), log.name
                continue
            bins = 50
            max_time = float(agg["end_time"].max())
            hmap = heatmap_handling.get_heatmap_df(agg, bins, ref["nprocs"], max_time=max_time)
            t0 = run.meta["start_ns"]
            tl = io_timeline(run, bins=bins, interface=interface, start_ns=t0,
                             end_ns=t0 + int(round(max_time * 1e9)))
            grid = tl.pivot_table(index="rank", columns="bin", values="nbytes", aggfunc="sum").reindex(
                index=hmap.index, columns=range(bins)).fillna(0.0)
            # per rank the bytes are all there; per bin they agree to within the ns rounding of the segment times
            assert np.allclose(grid.sum(axis=1).to_numpy(), agg.groupby("rank")["length"].sum().reindex(
                hmap.index).fillna(0).to_numpy()), (log.name, mod)
            assert np.allclose(grid.to_numpy(), hmap.to_numpy(), rtol=1e-3, atol=1e-3 * agg["length"].max()), \
                (log.name, mod)
            checked += 1
    assert checked >= 8


def test_empty_log_summary_says_what_would_supply_it(imported, shared_data):
    run = imported[shared_data / "darshan" / "empty_log" / "empty_log.darshan"]
    s = io_summary(run)
    assert s.rows == 0 and s.by_interface.empty
    assert "darshan" in s.absent.lower() and "flowscope import" in s.absent


def test_aggregate_rows_are_marked_in_the_io_table(imported, shared_data):
    mpi = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    io = imported[mpi].table("io")
    agg = io[io["source"] == "darshan-counters"]
    attrs = [json.loads(a) for a in agg["attrs"]]
    assert agg.shape[0] > 0 and all(a["aggregate"] is True for a in attrs)
    layers = {(a["interface"], a.get("in_totals", True)) for a in attrs}
    assert ("POSIX", True) in layers and ("MPI-IO", False) in layers
    dxt = [json.loads(a) for a in io.loc[io["source"] == "darshan-dxt", "attrs"]]
    assert dxt and all(a["in_totals"] is False for a in dxt)


def test_breakdown_counts_each_byte_and_second_once(imported, shared_data):
    """The run's compute / communication / I/O breakdown sees the counters' volume once: POSIX + STDIO bytes and
    their read + write time, not MPI-IO's bytes again nor the DXT segments' a third time."""
    from flowscope.analysis.breakdown import breakdown

    for sub in ("mpi_io_test_with_dxt", "nonmpi_dxt_anonymized", "stdio_no_posix"):
        log = next((shared_data / "darshan" / sub).glob("*.darshan"))
        ref = reference(log)
        b = breakdown(imported[log])
        mods = [ref["modules"][m] for m in LOWER if m in ref["modules"]]
        assert b.io_read_bytes == sum(m["read_bytes"] for m in mods), sub
        assert b.io_write_bytes == sum(m["write_bytes"] for m in mods), sub
        assert close(b.io_s, sum(m["read_s"] + m["write_s"] for m in mods), 2 * sum(m["records"] for m in mods)), sub


# ---- other sources, the command line and the report ------------------------------------------------------

def write_file(path: str, nbytes: int) -> int:
    with open(path, "wb") as f:
        f.write(b"x" * nbytes)
        f.flush()
    return nbytes


@pytest.fixture(scope="module")
def dask_run(tmp_path_factory):
    """A real observed Dask run whose tasks write files of known sizes (per-task I/O rows and opened files)."""
    from distributed import Client, LocalCluster

    from flowscope import observe

    tmp = tmp_path_factory.mktemp("dask-io")
    sizes = {str(tmp / f"out-{i}.bin"): (i + 1) * 64 * 1024 for i in range(8)}
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        with observe(client, store=tmp / "store", name="io-summary") as obs:
            client.gather([client.submit(write_file, p, n, key=f"write-{i}") for i, (p, n) in enumerate(sizes.items())])
    return obs.run, sizes


def test_a_dask_runs_own_io_is_summarised_without_inventing_times(dask_run):
    run, sizes = dask_run
    s = io_summary(run)
    io = run.table("io")
    by = s.by_interface.set_index("interface")
    # per-task byte counters: one row totals a task's write calls; bytes and calls add up, their time is unknown
    proc = io[io["source"] == "proc-io"]
    w = proc[proc["op"] == "write"]
    assert int(by.loc["syscalls", "write_bytes"]) == int(w["nbytes"].sum()) >= sum(sizes.values())
    assert int(by.loc["syscalls", "writes"]) == sum(json.loads(a)["syscw"] for a in w["attrs"])
    assert math.isnan(by.loc["syscalls", "write_s"])
    assert not s.totals["timed"]
    # the audit hook's opens: every file the tasks wrote is one of the interface's files
    opened = set(s.by_file.loc[s.by_file["interface"] == "audit", "path"])
    assert set(sizes) <= opened
    assert s.imbalance["ranks"] == 0 and s.timeline_interfaces == []


def test_flowscope_io_prints_the_summary_and_json(imported, shared_data, capsys):
    from flowscope.cli.main import main

    log = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    run = imported[log]
    assert main(["io", str(run.path), "--json", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = reference(log)
    assert out["totals"]["read_bytes"] == ref["modules"]["POSIX"]["read_bytes"] + ref["modules"]["STDIO"]["read_bytes"]
    assert {i["interface"] for i in out["by_interface"]} == {"POSIX", "MPI-IO", "STDIO"}
    assert len(out["top_files"]) == 3 and out["imbalance"]["ranks"] == 32
    assert out["timeline_interfaces"] == ["MPI-IO", "POSIX"]
    assert main(["io", str(run.path)]) == 0
    text = capsys.readouterr().out
    assert "by interface" in text and "MPI-IO" in text and "top 10 files" in text and "32 ranks" in text
    empty = imported[shared_data / "darshan" / "empty_log" / "empty_log.darshan"]
    assert main(["io", str(empty.path)]) == 0
    assert "no I/O records" in capsys.readouterr().out
    assert main(["io", str(shared_data / "no-such-run")]) == 1
    assert "flowscope io: error" in capsys.readouterr().err


def test_the_report_draws_the_io_summary_in_chromium(imported, shared_data, tmp_path):
    """The charts page of a Darshan import's report (its pages file) has the I/O summary drawn, with PyDarshan's
    figures in its tables; a run with no I/O says what would supply it."""
    from test_report import open_view

    from flowscope.report import write_report

    log = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    ref = reference(log)
    out = write_report(imported[log], tmp_path / "mpi.html")
    with open_view(out, "charts") as (page, console, errors):
        page.wait_for_function("() => [...document.querySelectorAll('#ch-io-summary .js-plotly-plot')]"
                               ".filter(d => d.calcdata).length >= 4", timeout=60_000)
        section = page.inner_text("#ch-io-summary")
        drawn = page.evaluate("""() => [...document.querySelectorAll('#ch-io-summary .js-plotly-plot')]
                                       .map(d => ({traces: d.data.length, title: (d.layout.title && d.layout.title.text) || ''}))""")
        assert errors == [] and not [m for m in console if m[0] == "error"]
    for mod in ("POSIX", "MPI-IO", "STDIO"):
        assert mod in section
    assert "32 ranks" in section and "imbalance" in section
    top = max(ref["files"].items(), key=lambda kv: kv[1])[0]
    assert top in section
    titles = " | ".join(d["title"] for d in drawn)
    assert "time per interface" in titles and "access sizes" in titles and "bytes per rank" in titles
    assert "POSIX: bytes per rank over time" in titles and "MPI-IO: bytes per rank over time" in titles
    assert all(d["traces"] > 0 for d in drawn)

    empty = write_report(imported[shared_data / "darshan" / "empty_log" / "empty_log.darshan"], tmp_path / "e.html")
    with open_view(empty, "charts") as (page, console, errors):
        text = page.inner_text("#ch-io-summary")
    assert "no I/O records" in text and "flowscope import job.darshan" in text
