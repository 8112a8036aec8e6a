"""The Darshan importer on every real log in the shared data, checked against PyDarshan's own DataFrames;
I/O attribution to tasks on a real Dask run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import dask
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
        io = io[io["source"] == "darshan-dxt"]  # the counters' aggregate rows are test_io_summary's
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
    assert set(io["source"]) == {"darshan-dxt", "darshan-counters"}
    io = io[io["source"] == "darshan-dxt"]
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
    prefix = f"darshan:log:{log.name.removesuffix('.darshan')}"
    want = sorted((f"{prefix}:rank:{r}" if r >= 0 else f"{prefix}:shared", f"darshan.POSIX.POSIX_BYTES_WRITTEN:{names[i]}",
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
    from flowscope.analysis.io_attribution import TASK_SPANS_SQL

    return run.sql(TASK_SPANS_SQL)  # on the I/O rows' clock


def shifting_write(path: str, nbytes: int, stay_s: float, shift_s: float, *after) -> int:
    """Write ``nbytes`` to ``path``, stay ``stay_s`` on the thread, then move the worker's estimate of its offset
    to the scheduler's clock by ``shift_s``, as a heartbeat may: Dask stamps the next task's times with it."""
    import time

    from distributed import get_worker

    with open(path, "wb") as f:
        f.write(os.urandom(nbytes))
        f.flush()
    time.sleep(stay_s)
    get_worker().scheduler_delay += shift_s
    return nbytes


def test_attribution_re_derives_the_dask_runs_own_io_task_keys(tmp_path):
    """No Darshan log of a Dask run can be made here (no darshan-runtime): a Dask run's own proc-io rows, which
    the worker plugin attributed at the source, are cleared and re-derived from host + thread + time.

    The hard case, made certain rather than left to chance: on one thread, a long task (1 s), then a short one
    whose times Dask stamps with an offset estimate 0.9 s lower (as a heartbeat can move it), so that in
    Dask's clock the short task lies inside the long one (unless it starts more than 0.9 s after it). I/O rows are in the worker's own clock; task spans
    carry the offset Dask added (``clock_offset_ns``), and attribution joins the two on the local clock. Each
    task writes its own number of bytes, which says independently which task each row belongs to."""
    from distributed import Client, LocalCluster

    from flowscope import observe

    kib = 64 * 1024
    sizes: dict[str, int] = {}
    # one thread runs the chain in order; no heartbeat moves the offset estimate but the tasks
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None, heartbeat_interval="1h") as cluster, Client(cluster) as client:
        # level full: every call's own I/O rows (at the default level a call under 1 ms, as a short task may be,
        # has its I/O charged to the next measured call, so the bytes would not name one task)
        # in Dask's clock (the workers share the scheduler's host, where the records would use the local one)
        with dask.config.set({"flowscope.clock": "scheduler"}), \
                observe(client, store=tmp_path / "store", name="io-attribution", level="full") as obs:
            prev = None
            for i in range(3):
                sizes[f"long-{i}"], sizes[f"short-{i}"] = (2 * i + 1) * kib, (2 * i + 2) * kib
                long_ = client.submit(shifting_write, str(tmp_path / f"l{i}.bin"), sizes[f"long-{i}"], 1.0, -0.9,
                                      *([prev] if prev is not None else []), key=f"long-{i}")
                prev = client.submit(shifting_write, str(tmp_path / f"s{i}.bin"), sizes[f"short-{i}"], 0.0, 0.9,
                                     long_, key=f"short-{i}")
            assert client.gather(prev) == sizes["short-2"]
    run = obs.run
    spans = run.sql("SELECT task_key, start_ns, end_ns FROM spans WHERE kind = 'task'").set_index("task_key")
    for i in range(3):  # the hard case happened: in Dask's clock each short task lies inside its long one
        s, lo = spans.loc[f"short-{i}"], spans.loc[f"long-{i}"]
        assert lo["start_ns"] <= s["start_ns"] and s["end_ns"] <= lo["end_ns"], (i, s.to_dict(), lo.to_dict())
    io = run.table("io")
    io = io[io["source"] == "proc-io"].reset_index(drop=True)
    # the truth, from the bytes: each call's write row names its task; the read row of a call shares its window
    writes = io[io["op"] == "write"]
    by_window = {}
    for row in writes.itertuples():
        key = [k for k, n in sizes.items() if n <= row.nbytes < n + kib]
        assert len(key) == 1, (row.nbytes, key)
        by_window[(row.tid, row.start_ns, row.end_ns)] = key[0]
    assert sorted(by_window.values()) == sorted(sizes)
    truth = [by_window[(r.tid, r.start_ns, r.end_ns)] for r in io.itertuples()]
    assert io["task_key"].astype(object).tolist() == truth  # the plugin's own attribution
    tasks = _task_spans(run)
    cleared = io.assign(task_key=None)
    assert attribute_io(cleared, tasks).tolist() == truth
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


# ---- many logs in one run -----------------------------------------------------------------------

COUNTER_MODULES = ("POSIX", "MPI-IO", "STDIO", "H5F", "H5D", "PNETCDF_FILE", "PNETCDF_VAR")


@pytest.fixture(scope="module")
def one_run(shared_data, tmp_path_factory):
    """Every shared Darshan log imported from its folder into a single run (as `flowscope import <folder>` does)."""
    res = import_paths([shared_data / "darshan"], tmp_path_factory.mktemp("one-run") / "store")
    return res, open_run(res.run_dir)


def _reference_counters(log: Path) -> list[tuple[int, int, str, float]]:
    """(rank, record id, counter, value) of every per-file counter PyDarshan's DataFrames hold for the log."""
    rep = darshan.DarshanReport(str(log), read_all=True)
    out = []
    for mod in COUNTER_MODULES:
        if mod not in rep.records:
            continue
        dfs = rep.records[mod].to_df()
        for part in ("counters", "fcounters"):
            df = dfs[part]
            for col in df.columns[2:]:
                out += [(int(r), int(i), f"darshan.{mod}.{col}", float(v))
                        for r, i, v in zip(df["rank"], df["id"], df[col])]
    return out


def test_logs_of_one_folder_keep_their_own_ranks_and_records(one_run, shared_data):
    res, run = one_run
    assert len(res.files) == len(logs(shared_data))
    resources = run.table("resources")
    assert resources["resource_id"].is_unique
    metrics = run.table("metrics")
    assert not metrics.duplicated(["resource_id", "name"]).any()  # no two records of two logs share a row key
    io = run.table("io")
    ranks = resources[resources["kind"] == "rank"]
    prefixes = [f.meta["log_resource"] for f in res.files]
    assert len(set(prefixes)) == len(prefixes)
    # the rows of each log: those whose resource id starts with its resource's id and ":" (matched once per distinct
    # id, not per row and log: the metrics of ~50 logs are 10^5 rows)
    owners = {}
    for rid in set(metrics["resource_id"]) | set(io["resource_id"].dropna()):
        mine = [p for p in prefixes if rid.startswith(p + ":")]
        assert len(mine) <= 1, (rid, mine)
        owners[rid] = mine[0] if mine else None
    metrics_of = dict(tuple(metrics.groupby(metrics["resource_id"].map(owners), sort=False)))
    dxt = io[io["source"] == "darshan-dxt"]
    io_of = dict(tuple(dxt.groupby(dxt["resource_id"].map(owners), sort=False)))
    for f in res.files:
        log = Path(f.path)
        prefix = f.meta["log_resource"]
        rep = darshan.DarshanReport(str(log), read_all=True)
        # every rank of the log is its own resource, under the log
        mine = ranks[ranks["parent_id"] == prefix]
        assert sorted(mine["resource_id"]) == sorted(f"{prefix}:rank:{r}" for r in range(rep.metadata["job"]["nprocs"]))
        # per-file counters equal PyDarshan's DataFrames, record by record and rank by rank
        names = rep.name_records
        want = sorted((f"{prefix}:rank:{r}" if r >= 0 else f"{prefix}:shared", f"{c}:{names[i]}", v)
                      for r, i, c, v in _reference_counters(log))
        # Lustre layouts are no per-file counter DataFrame; PyDarshan 3.5 lists BG/Q but gives no BG/Q record
        got = metrics_of.get(prefix, metrics.iloc[:0])
        got = got[~got["name"].str.startswith(("darshan.LUSTRE.", "darshan.BG/Q."))]
        got = sorted(zip(got["resource_id"], got["name"], got["value"]))
        assert len(got) == len(want), log
        for (gr, gn, gv), (wr, wn, wv) in zip(got, want):
            assert (gr, gn) == (wr, wn) and (gv == wv or (math.isnan(gv) and math.isnan(wv))), (log, gr, gn, gv, wv)
        # DXT segments per rank and record equal PyDarshan's, on this log's rank resources
        want_dxt = {}
        for mod in ("DXT_POSIX", "DXT_MPIIO"):
            for rec in rep.records[mod].to_df() if mod in rep.records else ():
                n = len(rec["read_segments"]) + len(rec["write_segments"])
                if n:
                    key = (mod, f"{prefix}:rank:{rec['rank']}", f"{rec['id']:#x}")
                    want_dxt[key] = want_dxt.get(key, 0) + n
        mine_io = io_of.get(prefix, dxt.iloc[:0])
        got_dxt = {}
        for rid, a in zip(mine_io["resource_id"], mine_io["attrs"]):
            a = json.loads(a)
            key = (a["module"], rid, a["record_id"])
            got_dxt[key] = got_dxt.get(key, 0) + 1
        assert got_dxt == want_dxt, log


def test_two_logs_of_the_same_file_name_stay_apart(shared_data, tmp_path):
    import shutil

    for sub, version in (("a", "3.4.6"), ("b", "3.4.7")):
        (tmp_path / sub).mkdir()
        shutil.copy(shared_data / "darshan" / "release_logs" / f"mpi-io-test-x86_64-{version}.darshan",
                    tmp_path / sub / "job.darshan")
    res = import_paths([tmp_path / "a", tmp_path / "b"], tmp_path / "store")
    assert [f.meta["log_resource"] for f in res.files] == ["darshan:log:job", "darshan:log:job~2"]
    ranks = open_run(res.run_dir).sql("select parent_id, count(*) as n from resources where kind = 'rank' "
                                      "group by parent_id order by parent_id")
    assert ranks.values.tolist() == [["darshan:log:job", 4], ["darshan:log:job~2", 4]]
