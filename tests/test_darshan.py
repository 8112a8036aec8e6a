"""The Darshan importer on every real log in the shared data, checked against PyDarshan's own DataFrames;
I/O attribution to tasks on a real Dask run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import require_module

darshan = require_module("darshan", "PyDarshan reads Darshan logs: pip install -e '.[test]'")

from flowscope import open_run  # noqa: E402
from flowscope.analysis.io_attribution import attribute_io  # noqa: E402
from flowscope.importers import TraceError, detect_format, import_paths, read_head  # noqa: E402
from flowscope.importers import darshan as darshan_importer  # noqa: E402


def logs(shared: Path) -> list[Path]:
    return sorted((shared / "darshan").rglob("*.darshan"))


@pytest.fixture(scope="module")
def all_imported(shared_data, tmp_path_factory):
    """Every log imported into its own run: path -> (ImportResult, Run)."""
    store = tmp_path_factory.mktemp("darshan") / "store"
    out = {}
    for log in logs(shared_data):
        res = import_paths([log], store)
        out[log] = (res, open_run(res.run_dir))
    return out


def reference(log: Path) -> dict:
    """What PyDarshan itself reports: DXT segments and bytes per module and op, job header, partial modules."""
    rep = darshan.DarshanReport(str(log), read_all=True)
    dxt = {}
    for mod in ("DXT_POSIX", "DXT_MPIIO"):
        if mod not in rep.records:
            continue
        for rec in rep.records[mod].to_df():
            for op in ("read", "write"):
                seg = rec[f"{op}_segments"]
                n, b = dxt.get((mod, op), (0, 0))
                dxt[(mod, op)] = (n + len(seg), b + (int(seg["length"].sum()) if len(seg) else 0))
    job = rep.metadata["job"]
    partial = sorted(m for m, i in rep.modules.items() if i["partial_flag"])
    return {"dxt": {k: v for k, v in dxt.items() if v[0]}, "job": job, "exe": rep.metadata["exe"],
            "partial": partial, "modules": set(rep.modules)}


def test_there_are_logs_to_check(shared_data):
    names = {p.parent.name for p in logs(shared_data)}
    assert {"release_logs", "empty_log", "partial_data_dxt", "mpi_io_test_with_dxt"} <= names
    assert len(logs(shared_data)) >= 40


def test_sniff_recognises_every_log_and_nothing_else(shared_data):
    for log in logs(shared_data):
        assert detect_format(log) == "darshan", log
    for other in (shared_data / "darshan").rglob("README.md"):
        assert not darshan_importer.sniff(other, read_head(other))


def test_dxt_segment_counts_and_bytes_equal_pydarshan(all_imported):
    checked = 0
    for log, (_, run) in all_imported.items():
        ref = reference(log)
        io = run.table("io")
        got = {}
        if len(io):
            io["module"] = [json.loads(a)["module"] for a in io["attrs"]]
            for (mod, op), g in io.groupby(["module", "op"]):
                got[(mod, op)] = (len(g), int(g["nbytes"].sum()))
        assert got == ref["dxt"], log
        checked += bool(ref["dxt"])
    assert checked >= 10  # logs with DXT data among the samples


def test_metadata_matches_pydarshan(all_imported):
    for log, (res, run) in all_imported.items():
        ref = reference(log)
        job = res.files[0].meta["job"]
        assert job["jobid"] == ref["job"]["jobid"] and job["uid"] == ref["job"]["uid"], log
        assert job["nprocs"] == ref["job"]["nprocs"]
        assert job["exe"] == ref["exe"]
        assert run.meta["start_ns"] == ref["job"]["start_time_sec"] * 10**9 + ref["job"]["start_time_nsec"]
        assert run.meta["end_ns"] == ref["job"]["end_time_sec"] * 10**9 + ref["job"]["end_time_nsec"]
        assert run.meta["job"]["scheduler_job_id"] == ref["job"]["jobid"]
        ranks = run.sql("select count(*) as n from resources where kind = 'rank'")["n"].iloc[0]
        assert ranks == ref["job"]["nprocs"]
        assert set(res.files[0].meta["modules"]) == ref["modules"]


def test_dxt_rows_carry_rank_host_and_times_within_the_job(all_imported, shared_data):
    log = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    _, run = all_imported[log]
    io = run.table("io")
    rep = darshan.DarshanReport(str(log), read_all=True)
    hosts = {rec["rank"]: rec["hostname"] for rec in rep.records["DXT_POSIX"].to_df()}
    assert io["rank"].notna().all()
    for rank, host in zip(io["rank"], io["host"]):
        assert hosts.get(int(rank), host) == host
    assert set(io["rank"].astype(int)) == set(range(32))
    slack = 10**9  # the header's start/end are whole seconds
    assert (io["start_ns"] >= run.meta["start_ns"]).all() and (io["end_ns"] <= run.meta["end_ns"] + slack).all()
    assert (io["end_ns"] >= io["start_ns"]).all()
    assert io["path"].str.startswith("/").all()
    assert (io["source"] == "darshan-dxt").all()


def test_counters_become_metrics_per_rank_and_file(all_imported, shared_data):
    log = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    _, run = all_imported[log]
    rep = darshan.DarshanReport(str(log), read_all=True)
    c = rep.records["POSIX"].to_df()["counters"]
    names = rep.name_records
    got = run.sql("select resource_id, name, value from metrics where name like 'darshan.POSIX.POSIX_BYTES_WRITTEN:%'")
    want = sorted((f"rank:{r}" if r >= 0 else "darshan:shared", f"darshan.POSIX.POSIX_BYTES_WRITTEN:{names[i]}",
                   float(v)) for r, i, v in zip(c["rank"], c["id"], c["POSIX_BYTES_WRITTEN"]))
    assert sorted(zip(got["resource_id"], got["name"], got["value"])) == want
    mods = set(run.sql("select distinct split_part(name, '.', 2) as m from metrics")["m"])
    assert {"POSIX", "MPI-IO", "STDIO"} <= mods
    # HDF5 and Lustre counters too, from the logs that have them
    for sub, mod in (("hdf5_diagonal_write_only", "H5D"), ("release_logs", "LUSTRE")):
        found = False
        for lg, (_, r) in all_imported.items():
            if lg.parent.name == sub and mod in reference(lg)["modules"]:
                n = r.sql(f"select count(*) as n from metrics where name like 'darshan.{mod}.%'")["n"].iloc[0]
                assert n > 0, lg
                found = True
        assert found, mod


def test_partial_data_is_flagged(all_imported, shared_data):
    log = shared_data / "darshan" / "partial_data_dxt" / "partial_data_dxt.darshan"
    res, run = all_imported[log]
    meta = res.files[0].meta
    assert meta["partial_modules"] == reference(log)["partial"] == ["DXT_MPIIO", "DXT_POSIX"]
    assert any("DXT_POSIX" in w and "incomplete" in w for w in res.files[0].warnings)
    assert run.meta["imports"][0]["meta"]["partial_modules"] == ["DXT_MPIIO", "DXT_POSIX"]
    for log2, (r2, _) in all_imported.items():
        if not reference(log2)["partial"]:
            assert r2.files[0].meta["partial_modules"] == [], log2


def test_empty_log_imports_with_a_note(all_imported, shared_data):
    log = shared_data / "darshan" / "empty_log" / "empty_log.darshan"
    res, run = all_imported[log]
    assert any("no module data" in w for w in res.files[0].warnings)
    assert run.counts()["io"] == 0 and run.counts()["metrics"] == 0
    assert run.meta["job"]["nprocs"] == reference(log)["job"]["nprocs"]


@pytest.mark.parametrize("cut", [100, 3000, -500])
def test_truncated_log_gives_one_clear_error_naming_the_file(shared_data, tmp_path, cut):
    src = next((shared_data / "darshan" / "mpi_io_test_with_dxt").glob("*.darshan"))
    data = src.read_bytes()
    bad = tmp_path / "cut.darshan"
    bad.write_bytes(data[:cut] if cut > 0 else data[:len(data) + cut])
    with pytest.raises(TraceError) as err:
        import_paths([bad], tmp_path / "store", fmt="darshan")
    msg = str(err.value)
    assert str(bad) in msg and ("truncated" in msg or "not a readable" in msg)


# ---- attribution ------------------------------------------------------------------------------

def write_block(path: str, i: int) -> int:
    data = os.urandom(256 * 1024)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
    return i


@pytest.fixture(scope="module")
def dask_run(tmp_path_factory):
    """A real observed Dask run whose tasks write files (so the run has proc-io rows with task keys)."""
    from distributed import Client, LocalCluster

    from flowscope import observe

    tmp = tmp_path_factory.mktemp("dask-io")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        with observe(client, store=tmp / "store", name="io-attribution") as obs:
            futs = [client.submit(write_block, str(tmp / f"f{i}.bin"), i, key=f"write-{i}") for i in range(16)]
            client.gather(futs)
    return obs.run


def _task_spans(run) -> pd.DataFrame:
    return run.sql("select s.start_ns, s.end_ns, s.task_key, r.host, r.pid, r.tid, r.thread_ident "
                   "from spans s join resources r using (resource_id) where s.kind = 'task'")


def test_attribution_re_derives_the_dask_runs_own_io_task_keys(dask_run):
    """No Darshan log of a Dask run can be made here (no darshan-runtime): the Dask run's own proc-io rows,
    which the worker plugin attributed at the source, are cleared and re-derived from host + thread + time."""
    io = dask_run.table("io")
    io = io[(io["source"] == "proc-io") & io["task_key"].notna()].reset_index(drop=True)
    assert len(io) >= 16
    tasks = _task_spans(dask_run)
    want = io["task_key"].astype(object).tolist()
    cleared = io.assign(task_key=None)
    got = attribute_io(cleared, tasks).tolist()
    assert got == want
    # a row on a thread but outside every task's time stays unattributed
    far = cleared.head(1).assign(start_ns=1, end_ns=2)
    assert attribute_io(far, tasks).tolist() == [None]


def test_host_only_rows_are_attributed_only_when_one_task_contains_them(dask_run):
    io = dask_run.table("io")
    io = io[(io["source"] == "proc-io") & io["task_key"].notna()].reset_index(drop=True)
    tasks = _task_spans(dask_run)
    host_only = io.assign(pid=None, tid=None, thread_ident=None, task_key=None)
    got = attribute_io(host_only, tasks)
    for (_, row), key, truth in zip(host_only.iterrows(), got, io["task_key"]):
        end = row["end_ns"] if pd.notna(row["end_ns"]) else row["start_ns"]
        containing = tasks[(tasks["host"] == row["host"]) & (tasks["start_ns"] <= row["start_ns"])
                           & (tasks["end_ns"] >= end)]
        if len(containing) == 1:
            assert key == truth == containing["task_key"].iloc[0]
        else:
            assert key is None


def test_a_darshan_log_added_to_a_dask_run_goes_through_attribution(dask_run, shared_data):
    log = shared_data / "darshan" / "nonmpi_dxt_anonymized" / "nonmpi_dxt_anonymized.darshan"
    res = import_paths([log], run=dask_run.path)
    assert not res.created
    meta = res.files[0].meta
    # the log comes from another machine: none of its segments share a host with the run's tasks
    assert meta["attributed_to_tasks"] == 0
    io = open_run(dask_run.path).table("io")
    dxt = io[io["source"] == "darshan-dxt"]
    assert len(dxt) == meta["dxt"]["DXT_POSIX"]["segments"] and dxt["task_key"].isna().all()
    assert (io[io["source"] == "proc-io"]["task_key"].notna()).any()
