"""The analyses of a run too large for one process, on a real Dask cluster (analysis/partitioned.py): the run's
spans regrouped by resource in several parts, the parts' results merged. They must equal the single-process
breakdown, per-group statistics and anomalies of the same run: a Dask workflow written by two collector instances
through Redis, and traces of other tools with nested calls."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import numpy as np
import pytest

import flowscope
from flowscope import Client
from flowscope.analysis.anomalies.detect import detect_run
from flowscope.analysis.breakdown import breakdown, task_groups
from flowscope.analysis.partitioned import analyse
from conftest import CollectorProcess, require_module


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client as DaskClient
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            DaskClient(cluster) as dc:
        yield dc


def _same_breakdown(got, want) -> None:
    g, w = got.to_dict(), want.to_dict()
    assert g.keys() == w.keys()
    for k in w:
        if isinstance(w[k], float):
            assert g[k] == pytest.approx(w[k], rel=1e-9, abs=1e-9), k
        elif isinstance(w[k], dict):
            assert g[k].keys() == w[k].keys(), k
            for c in w[k]:
                assert g[k][c] == pytest.approx(w[k][c], rel=1e-9, abs=1e-9), (k, c)
        else:
            assert g[k] == w[k], k


def _same_groups(got, want) -> None:
    assert list(got.columns) == list(want.columns)
    assert got["group"].tolist() == want["group"].tolist()
    for c in ("role", "category", "count"):
        assert got[c].tolist() == want[c].tolist(), c
    for c in ("total_s", "mean_s", "std_s", "max_s", "cv"):
        np.testing.assert_allclose(got[c].to_numpy(float), want[c].to_numpy(float), rtol=1e-9, atol=1e-12, err_msg=c)


def _same_anomalies(got, want) -> None:
    assert got.schema == want.schema
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        g, w = got[name].to_pylist(), want[name].to_pylist()
        if name == "severity_ns":
            assert np.abs(np.asarray(g) - np.asarray(w)).max(initial=0) <= 1, name
        elif name in ("score", "threshold"):
            np.testing.assert_allclose(np.asarray(g, float), np.asarray(w, float), rtol=1e-9, err_msg=name)
        elif name == "model":
            continue  # the same model, its figures rounded differently: compared through score and threshold
        else:
            assert g == w, name


def _check(run, dask_client, rows_per_partition: int) -> None:
    want_b, want_g, want_a = breakdown(run), task_groups(run), detect_run(run).anomalies
    got = analyse(run, dask_client, rows_per_partition=rows_per_partition)
    total = sum(run.counts()["spans"] for _ in [0])
    assert got.rows == total
    assert got.partitions == max(1, math.ceil(total / rows_per_partition))
    _same_breakdown(got.breakdown, want_b)
    _same_groups(got.task_groups, want_g)
    _same_anomalies(got.anomalies, want_a)
    assert not [p for p in run.path.parent.iterdir() if p.name.startswith(".flowscope-partitioned-")]


def test_a_dask_run_written_by_two_collectors_through_redis_is_analysed_as_in_one_process(redis_url, tmp_path,
                                                                                           dask_client):
    """A real LocalCluster workflow (three task groups, one task slowed) sends its records through Redis Streams to
    two collector instances of one store; the run they wrote together, read in 7 parts, gives the single-process
    breakdown, groups and anomalies."""
    from distributed import Client as DaskClient
    from distributed import LocalCluster

    from flowscope.sources.dask import register, unregister

    url = f"{redis_url}?stream=fs-partitioned"
    store = tmp_path / "store"
    collectors = [CollectorProcess(store, tmp_path, ["--redis", url]).start() for _ in range(2)]
    try:
        owner = Client(url, name="two instances", spool_dir=tmp_path / "spool")
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster, \
                DaskClient(cluster) as dc:
            register(dc, url, owner.run_id)

            def work(i: int) -> int:
                time.sleep(0.2 if i == 77 else 0.001 * (1 + i % 3))
                return i

            xs = [dc.submit(work, i, key=f"work-{i}") for i in range(240)]
            ys = [dc.submit(lambda a, b: a + b, xs[i], xs[i + 1], key=f"pair-{i}") for i in range(0, 240, 2)]
            total = dc.submit(sum, ys, key="total")
            assert total.result() == sum(range(240))
            assert not any(unregister(dc).values())
        owner.close()
        r = require_module("redis", "the Redis Streams transport").Redis.from_url(redis_url)
        deadline = time.monotonic() + 180
        while r.xlen("fs-partitioned") or any(g["pending"] for g in r.xinfo_groups("fs-partitioned")):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        writers = {p.name.split("-")[1] for p in (store / owner.run_id / "spans").glob("*.parquet")}
        run = flowscope.open_run(store / owner.run_id)
    finally:
        for c in collectors:
            c.stop()
    assert len(run.segments("spans")) >= 2
    assert int(run.sql("SELECT count(*) AS n FROM activity WHERE role = 'task'")["n"].iloc[0]) == 361
    assert len(detect_run(run).anomalies) >= 1  # the slowed task at least: there is something to agree on
    assert writers  # segments named by their writers
    _check(run, dask_client, rows_per_partition=30)  # more than 8 parts: the candidates merge in two rounds


@pytest.mark.parametrize("rel", ["otf2/ping-pong-otf2/traces.otf2", "chrome/viztracer/multithread.json",
                                 "paje/starpu-demo/paje.trace"])
def test_traces_with_nested_calls_are_analysed_as_in_one_process(shared_data, tmp_path, dask_client, rel):
    """Traces of other tools (MPI calls nested in their callers, Python calls on threads, StarPU states): the
    parts regroup each resource's calls whole, so exclusive times, call stacks and windows match."""
    from flowscope.importers import import_paths

    res = import_paths([shared_data / rel], tmp_path / "store")
    run = flowscope.open_run(res.run_dir)
    spans = run.counts()["spans"]
    assert spans > 20
    _check(run, dask_client, rows_per_partition=max(1, spans // 5))


def test_the_command_starts_its_own_cluster_and_prints_the_single_process_figures(shared_data, tmp_path,
                                                                                 dask_client):
    """`flowscope analyse RUN --json` on a LocalCluster of its own: the breakdown and groups it prints are the
    single-process ones; on a running cluster given by address, the same; a bad option and a damaged segment are
    refused, each saying what and where."""
    import json

    from flowscope.importers import import_paths

    res = import_paths([shared_data / "paje/starpu-demo/paje.trace"], tmp_path / "store")
    cmd = [sys.executable, "-m", "flowscope", "analyse", str(res.run_dir), "--workers", "2", "--rows-per-part", "200"]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    run = flowscope.open_run(res.run_dir)
    assert doc["partitions"] == math.ceil(run.counts()["spans"] / 200) > 1
    assert doc["breakdown"]["compute_s"] == pytest.approx(breakdown(run).compute_s, rel=1e-9)
    assert [g["group"] for g in doc["task_groups"]] == task_groups(run)["group"].tolist()
    assert doc["anomalies"] == detect_run(run).anomalies.num_rows

    given = subprocess.run([*cmd[:4], str(res.run_dir), "--scheduler", dask_client.scheduler.address, "--json"],
                           capture_output=True, text=True, timeout=600)
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["breakdown"] == doc["breakdown"]
    assert json.loads(given.stdout)["partitions"] == 1  # the default part size holds this run

    bad = subprocess.run([*cmd[:-1], "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "--rows-per-part must be at least 1, not 0" in bad.stderr

    seg = run.segments("spans")[0]
    seg.write_bytes(seg.read_bytes()[: seg.stat().st_size // 2])
    broken = subprocess.run([*cmd[:4], str(res.run_dir), "--scheduler", dask_client.scheduler.address],
                            capture_output=True, text=True, timeout=600)
    assert broken.returncode == 1
    assert seg.name in broken.stderr, broken.stderr


def test_a_run_without_spans_is_said_to_have_nothing_to_analyse(tmp_path):
    """No table of zeros and no cluster started: the run holds no span, and the command says so."""
    c = Client(store=tmp_path / "store", name="empty")
    c.close()
    out = subprocess.run([sys.executable, "-m", "flowscope", "analyse", "latest", "--store", str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "has no spans: nothing to analyse" in " ".join(out.stdout.split())
    assert "compute" not in out.stdout
