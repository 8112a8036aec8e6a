"""The publication API (SOMA's, docs/publish.md): namespaces of hierarchical records, overwrite and append,
commit and publish frequency, blocking and non-blocking publication, flush at close, analyze, bad input.

Real parts: a collector process on loopback (tests/conftest.py) and the collector embedded in this process."""

from __future__ import annotations

import functools
from collections import OrderedDict
from concurrent.futures import Future

import httpx
import numpy as np
import pytest

import flowscope
from flowscope import Client
from flowscope.analysis.namespaces import namespace_rows, record
from flowscope.client.namespaces import Acknowledgement
from flowscope.model.namespaces import (MAX_TEXT_BYTES, Leaf, NamespaceError, common_leaves, common_leaves_reference,
                                       domain_of, leaves)

DIAGNOSTICS = {  # one rank's record of one step, shaped like Astaroth's (the dissertation's Listing 4.3)
    "pid": 3,
    "timestep": 120,
    "local_mass": 1.25e3,
    "converged": True,
    "solver": "rk3",
    "density": {"min": {"value": 0.5, "location": np.array([4, 7, 1], dtype=np.uint16)},
                "max": {"value": 2.5, "location": [9, 0, 3]},
                "nan": {"count": 0, "cells": []}},
    "tags": ["healthy", "step"],
}
AS_STORED = {  # numbers come back as float64, sequences as lists; an empty list has no row to come back from
    "pid": 3.0, "timestep": 120.0, "local_mass": 1.25e3, "converged": 1.0, "solver": "rk3",
    "density": {"min": {"value": 0.5, "location": [4.0, 7.0, 1.0]}, "max": {"value": 2.5, "location": [9.0, 0.0, 3.0]},
                "nan": {"count": 0.0}},
    "tags": ["healthy", "step"],
}


def _values(run: flowscope.Run, sql: str) -> list:
    return [tuple(r.values()) for r in run.sql_arrow(sql).to_pylist()]


def test_a_nested_record_round_trips_through_metrics_namespace_values_and_sql(tmp_path):
    with Client(store=tmp_path / "store", name="roundtrip", spool_dir=tmp_path / "spool") as fs:
        ns = fs.namespace("application", resource_id="rank:3")
        ns.set("diagnostics", DIAGNOSTICS)
        ack = ns.commit()
        assert isinstance(ack, Acknowledgement) and ack.stored and ack.commits == (1, 1)
        assert ack.rows == {"metrics": 7, "namespace_values": 9}
        run = flowscope.open_run(fs.run_dir)
        # single numbers are metrics rows, named by their path, at the commit's time
        assert _values(run, f"SELECT name, value, ts_ns = {ack.ts_ns}, resource_id FROM metrics "
                            "WHERE namespace = 'application' ORDER BY name") == [
            ("diagnostics/converged", 1.0, True, "rank:3"), ("diagnostics/density/max/value", 2.5, True, "rank:3"),
            ("diagnostics/density/min/value", 0.5, True, "rank:3"),
            ("diagnostics/density/nan/count", 0.0, True, "rank:3"),
            ("diagnostics/local_mass", 1250.0, True, "rank:3"), ("diagnostics/pid", 3.0, True, "rank:3"),
            ("diagnostics/timestep", 120.0, True, "rank:3")]
        # strings and lists are namespace_values rows, one per item
        got = _values(run, "SELECT name, item, value, text FROM namespace_values ORDER BY name, item NULLS FIRST")
        assert got == [
            ("diagnostics/density/max/location", 0, 9.0, None), ("diagnostics/density/max/location", 1, 0.0, None),
            ("diagnostics/density/max/location", 2, 3.0, None), ("diagnostics/density/min/location", 0, 4.0, None),
            ("diagnostics/density/min/location", 1, 7.0, None), ("diagnostics/density/min/location", 2, 1.0, None),
            ("diagnostics/solver", None, None, "rk3"), ("diagnostics/tags", 0, None, "healthy"),
            ("diagnostics/tags", 1, None, "step")]
        # and back: the rows rebuild the record
        assert record(run, "application") == {"diagnostics": AS_STORED}
        assert record(run, "application", resource_id="rank:9") == {}
        assert namespace_rows(run, "application").num_rows == 16


def test_overwrite_keeps_the_last_value_and_append_keeps_every_value(tmp_path):
    with Client(store=tmp_path / "store", spool_dir=tmp_path / "spool") as fs:
        ns = fs.namespace("state", publish_every=3)
        acks = []
        for step in range(3):
            ns.set("energy", 10.0 + step)                 # overwrite: one value survives the publication
            ns.set("phase", f"phase-{step}")
            ns.append("rank/0/nan_count", step)         # append: every value, each at its commit
            ns.append("rank/0/nan_count", [100 + step])  # twice in one commit: two items of that commit
            acks.append(ns.commit())
        assert acks[:2] == [None, None] and acks[2].commits == (1, 3)
        run = flowscope.open_run(fs.run_dir)
        assert _values(run, "SELECT name, value FROM metrics WHERE namespace = 'state'") == [("energy", 12.0)]
        assert _values(run, "SELECT text FROM namespace_values WHERE name = 'phase'") == [("phase-2",)]
        rows = _values(run, "SELECT ts_ns, item, value FROM namespace_values WHERE name = 'rank/0/nan_count' "
                            "ORDER BY ts_ns, item")
        assert [(i, v) for _, i, v in rows] == [(0, 0.0), (1, 100.0), (0, 1.0), (1, 101.0), (0, 2.0), (1, 102.0)]
        commit_times = sorted({ts for ts, _, _ in rows})
        assert len(commit_times) == 3 and commit_times[-1] == acks[2].ts_ns
        # the overwritten value carries the time of the commit that set it last
        assert _values(run, "SELECT ts_ns FROM metrics WHERE name = 'energy'") == [(commit_times[-1],)]
        assert record(run, "state") == {"energy": 12.0, "phase": "phase-2",
                                        "rank": {"0": {"nan_count": [0.0, 100.0, 1.0, 101.0, 2.0, 102.0]}}}


def test_publish_every_k_commits_stores_exactly_those_commits_and_close_flushes_the_rest(collector, tmp_path):
    fs = Client(collector.address, name="every-5", spool_dir=tmp_path / "spool")
    ns = fs.namespace("performance", publish_every=5)
    answers = []
    for i in range(1, 13):
        ns.set("commit", i)
        ns.append("history", i)
        answers.append(ns.commit())
    published = [(i + 1, a.commits) for i, a in enumerate(answers) if a is not None]
    assert published == [(5, (1, 5)), (10, (6, 10))]
    assert all(a.stored for a in answers if a is not None)
    run = flowscope.open_run(collector.store / fs.run_id)
    # blocking: stored before commit() returned, so queryable now; commits 11 and 12 are not published yet
    assert _values(run, "SELECT value FROM metrics WHERE name = 'commit' ORDER BY value") == [(5.0,), (10.0,)]
    assert _values(run, "SELECT count(*), min(value), max(value) FROM namespace_values") == [(10, 1.0, 10.0)]
    ns.set("uncommitted", 1.0)  # an update not committed yet is published at close too
    fs.close()
    assert _values(run, "SELECT value FROM metrics WHERE name = 'commit' ORDER BY value") == [(5.0,), (10.0,), (12.0,)]
    assert _values(run, "SELECT value FROM metrics WHERE name = 'uncommitted'") == [(1.0,)]
    assert [v for (v,) in _values(run, "SELECT value FROM namespace_values ORDER BY ts_ns")] == \
        [float(i) for i in range(1, 13)]
    assert _values(run, "SELECT count(DISTINCT ts_ns) FROM metrics WHERE namespace = 'performance'") == [(4,)]
    assert run.meta["status"] == "finished"


def test_blocking_returns_once_stored_and_non_blocking_returns_a_future_of_the_acknowledgement(collector, tmp_path):
    fs = Client(collector.address, name="modes", spool_dir=tmp_path / "spool")
    run_dir = collector.store / fs.run_id
    blocking = fs.namespace("application", blocking=True)
    blocking.set("mesh/energy", 1.2e3)
    ack = blocking.commit()
    assert isinstance(ack, Acknowledgement) and ack.stored
    for seg in ack.segments:  # on disk when commit() returned
        assert (run_dir / "metrics" / f"{seg}.parquet").is_file()
    assert _values(flowscope.open_run(run_dir), "SELECT value FROM metrics WHERE name = 'mesh/energy'") == [(1200.0,)]

    quiet = fs.namespace("workflow", blocking=False)
    futures = []
    for step in range(4):
        quiet.set("tasks/running", step)
        quiet.set("tasks/state", ["running"] * step or ["idle"])
        futures.append(quiet.commit())
    assert all(isinstance(f, Future) for f in futures)
    acks = [f.result(timeout=120) for f in futures]
    assert [a.commits for a in acks] == [(1, 1), (2, 2), (3, 3), (4, 4)] and all(a.stored for a in acks)
    got = _values(flowscope.open_run(run_dir), "SELECT value FROM metrics WHERE namespace = 'workflow' ORDER BY ts_ns")
    assert got == [(0.0,), (1.0,), (2.0,), (3.0,)]
    fs.close()


def test_close_publishes_pending_non_blocking_commits(tmp_path):
    ns = flowscope.namespace("application.solver", publish_every=50, blocking=False, store=tmp_path / "store",
                             spool_dir=tmp_path / "spool", run_name="pending")
    assert ns.domain == "application"
    for step in range(7):
        ns.set("residual", 10.0 ** -step)
        assert ns.commit() is None  # 7 commits, fewer than 50: nothing published yet
    run_dir = ns.client.run_dir
    assert not (run_dir / "metrics").exists()
    ns.close()
    run = flowscope.open_run(run_dir)
    assert _values(run, "SELECT value FROM metrics WHERE name = 'residual'") == [(1e-6,)]  # the last overwrite
    assert run.meta["name"] == "pending" and run.meta["status"] == "finished"


def test_analyze_runs_a_query_or_a_reduction_over_the_namespace_on_the_collector(collector, tmp_path):
    fs = Client(collector.address, name="analyze", spool_dir=tmp_path / "spool")
    ranks = [fs.namespace("application", resource_id=f"rank:{r}") for r in range(3)]
    other = fs.namespace("hardware")
    other.set("mass", 1e9)  # another namespace: never in application's results
    other.commit()
    for step in range(4):
        for r, ns in enumerate(ranks):
            ns.set("mass", 100.0 + r * 10 + step)
            ns.set("label", f"r{r}")
            ns.commit()
    got = ranks[0].analyze("SELECT resource_id, max(value) AS peak, count(*) AS n FROM namespace "
                           "WHERE name = 'mass' GROUP BY resource_id ORDER BY resource_id")
    assert got["columns"] == ["resource_id", "peak", "n"]
    assert got["rows"] == [{"resource_id": f"rank:{r}", "peak": 103.0 + r * 10, "n": 4} for r in range(3)]
    assert ranks[0].analyze(reduce="max", name="m*")["rows"] == [{"name": "mass", "max": 123.0}]
    assert ranks[1].analyze(reduce="first", by="resource_id")["rows"] == [
        {"name": "mass", "resource_id": f"rank:{r}", "first": 100.0 + r * 10} for r in range(3)]
    assert other.analyze(reduce="count")["rows"] == [{"name": "mass", "count": 1}]

    # bad input: 4xx naming the field, over HTTP and through the API
    url = f"{collector.address}/v1/runs/{fs.run_id}/namespaces/application/analyze"
    for body, field in [({"sql": "COPY namespace TO 'x.csv'"}, "sql"),
                        ({"sql": "SELECT * FROM read_csv('/etc/passwd')"}, "sql"),
                        ({"sql": "SELECT 1; SELECT 2"}, "sql"),
                        ({"sql": "SELECT nope FROM namespace"}, "sql"),
                        ({"reduce": "median"}, "reduce"), ({"reduce": "max", "by": "host"}, "by"),
                        ({"sql": "SELECT 1", "reduce": "max"}, "sql"), ({"sqll": "SELECT 1"}, "sqll"),
                        ({"reduce": "max", "limit": -1}, "limit")]:
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 422 and r.json()["field"] == field, (body, r.text)
    r = httpx.post(url.replace("/application/", "/bad name!/"), json={"reduce": "max"}, timeout=60)
    assert r.status_code == 422 and r.json()["field"] == "namespace", r.text
    r = httpx.post(url, content=b"{not json", timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "body"
    with pytest.raises(NamespaceError) as err:
        ranks[0].analyze("DROP TABLE namespace")
    assert err.value.field == "sql" and "SELECT" in str(err.value)
    fs.close()


def test_analyze_in_the_embedded_collector_sees_what_was_published(tmp_path):
    with Client(store=tmp_path / "store", spool_dir=tmp_path / "spool") as fs:
        ns = fs.namespace("diagnostics", publish_every=2)
        for step in range(4):
            ns.append("rank/3/nan_count", [0, step])
            ns.commit()
        assert ns.analyze(reduce="sum", name="rank/*/nan_count")["rows"] == [{"name": "rank/3/nan_count", "sum": 6.0}]
        got = ns.analyze("SELECT count(*) AS n FROM namespace WHERE item = 1")
        assert got == {"namespace": "diagnostics", "columns": ["n"], "rows": [{"n": 4}], "truncated": False}
        with pytest.raises(NamespaceError) as err:
            ns.analyze(reduce="avg")
        assert err.value.field == "reduce"


@pytest.mark.parametrize("path, value, field, words", [
    ("a/b", object(), "a/b", "cannot be published"),
    ("a", {"b": {"c": {1, 2}}}, "a/b/c", "cannot be published"),
    ("a", {"b": [1, {"x": 1}]}, "a/b[1]", "not a dict"),
    ("a//b", 1.0, "'a//b'", "empty key"),
    ("/a", 1.0, "'/a'", "empty key"),
    ("", 1.0, "''", "is empty"),
    ("a\nb", 1.0, "'a\\nb'", "control character"),
    ("a/b\n", 1.0, "'a/b\\n'", "control character"),
    (7, 1.0, "7", "a path is a string"),
    ("a", {3: 1.0}, "a/3", "keys of a record are strings"),
    ("big/text", "x" * (MAX_TEXT_BYTES + 1), "big/text", "at most"),
    ("big/int", 2**60, "big/int", "too large"),
    ("big/list", list(range(1_000_001)), "big/list", "at most"),
    ("grid", np.zeros((2, 2)), "grid", "2-D array"),
    ("gone", None, "gone", "None is not a value"),
    ("empty", {}, "empty", "empty mapping"),
])
def test_bad_input_names_the_path_and_changes_nothing(tmp_path, path, value, field, words):
    with Client(store=tmp_path / "store", spool_dir=tmp_path / "spool") as fs:
        ns = fs.namespace("application")
        ns.set("kept", 1.0)
        with pytest.raises(NamespaceError) as err:
            ns.set(path, value)
        assert err.value.field == field and words in str(err.value), str(err.value)
        ack = ns.commit()
        assert ack.rows == {"metrics": 1}  # only what was set before the refused call
        run = flowscope.open_run(fs.run_dir)
        assert _values(run, "SELECT name FROM metrics WHERE namespace = 'application'") == [("kept",)]


def test_shape_conflicts_modes_and_names_are_refused_naming_what_is_wrong(tmp_path):
    with Client(store=tmp_path / "store", spool_dir=tmp_path / "spool") as fs:
        ns = fs.namespace("application")
        ns.set("rank/3/mass", 1.0)
        for call, field, words in [(lambda: ns.set("rank/3/mass/x", 1.0), "rank/3/mass/x", "holds a value"),
                                   (lambda: ns.set("rank/3", 2.0), "rank/3", "has keys below it"),
                                   (lambda: ns.append("rank/3/mass", 2.0), "rank/3/mass", "single value"),
                                   # within one call: a key with '/' in it names a path below another leaf
                                   (lambda: ns.update({"q": 1.0, "q/r": 2.0}), "q/r", "holds a value"),
                                   (lambda: ns.update({"s/t": 1.0, "s": 2.0}), "s", "has keys below it"),
                                   (lambda: ns.update("x", 1, mode="merge"), "mode", "overwrite, append"),
                                   (lambda: ns.set("x"), "value", "missing")]:
            with pytest.raises(NamespaceError) as err:
                call()
            assert err.value.field == field and words in str(err.value), str(err.value)
        for bad in ("", "bad name", "-x", "a/b", "x" * 65, 3):
            with pytest.raises(NamespaceError) as err:
                fs.namespace(bad)
            assert err.value.field == "namespace"
        for every in (0, -1, 1.5, True):
            with pytest.raises(NamespaceError) as err:
                fs.namespace("ok", publish_every=every)
            assert err.value.field == "publish_every"
        ack = ns.commit()
        ns.set("rank/3", 2.0)  # after a publication the record starts empty: any shape again
        ns.commit()
        assert ack.rows == {"metrics": 1}
    assert [domain_of(n) for n in ("performance", "application.astaroth", "hardware", "workflow", "diagnostics",
                                   "applications")] == ["performance", "application", "hardware", "workflow", None,
                                                        None]


def test_the_collector_refuses_namespace_values_that_break_the_tables_rules(collector):
    run_id = httpx.post(f"{collector.address}/v1/runs", json={"name": "raw"}).json()["run_id"]
    url = f"{collector.address}/v1/runs/{run_id}/tables/namespace_values"
    good = {"ts_ns": 1, "resource_id": "r", "namespace": "application", "name": "a/b", "item": 0, "value": 1.0}
    assert httpx.post(url, json=[good]).status_code == 200
    for change, column in [({"name": "a//b"}, "name"), ({"namespace": "bad name"}, "namespace"),
                           ({"text": "both"}, "value"), ({"value": None}, "value")]:
        r = httpx.post(url, json=[good, {**good, **change}])
        assert r.status_code == 422 and f"namespace_values.{column}: row 1" in r.json()["error"], r.text


def test_namespaces_go_to_the_instances_the_address_file_maps_them_to(collector_factory, tmp_path):
    """SOMA maps namespaces to service instances. An instance started with ``--namespaces GLOB`` serves the
    namespaces that match (its line in the address file says so); the other namespaces are spread round-robin over
    the instances that claim none. Each namespace's rows reach its instance, and the run, in the store they share,
    is one run holding all of them."""
    store = tmp_path / "shared-store"
    a, b = collector_factory(store=store), collector_factory(store=store)
    hw = collector_factory("--namespaces", "hardware*,gpu", store=store)
    listed = [line for line in (tmp_path).glob("address-*") for line in line.read_text().splitlines()]
    assert f"{hw.address} namespaces=hardware*,gpu" in listed  # serve --namespaces writes it
    addr_file = tmp_path / "instances"
    addr_file.write_text(f"{a.address}\n{b.address}\n{hw.address} namespaces=hardware*,gpu\n")
    with Client(address_file=addr_file, name="mapped", spool_dir=tmp_path / "spool") as fs:
        assert fs.address in (a.address, b.address)  # the client's own records: an instance claiming no namespace
        published = {}
        for name, n in (("hardware.node0", 3), ("application", 5), ("diagnostics", 7), ("gpu", 2)):
            ns = fs.namespace(name)
            for step in range(n):
                ns.set("step", step)
                ns.set("value", float(step))
                ns.commit()
            published[name] = 2 * n
        run_id = fs.run_id
    rows = {c.address: httpx.get(f"{c.address}/v1/health", timeout=10).json()["rows_by_table"].get("metrics", 0)
            for c in (a, b, hw)}
    assert rows[hw.address] == published["hardware.node0"] + published["gpu"]
    # application and diagnostics: round-robin over a and b, one each
    assert sorted([rows[a.address], rows[b.address]]) == sorted([published["application"], published["diagnostics"]])
    run = flowscope.open_run(store / run_id)
    got = run.sql("SELECT namespace, count(*) AS n FROM metrics GROUP BY namespace")
    assert dict(zip(got["namespace"], got["n"])) == published
    assert run.meta["status"] == "finished"


def test_non_blocking_publications_queued_behind_a_slow_collector_travel_together_and_are_stored_once(
        collector_factory, tmp_path):
    """While the senders wait for a slow collector (each segment takes it a second to write), the publications
    queued behind them for one table go as one batch: fewer requests and segments than publications, every
    acknowledgement naming a segment that holds its rows, every row stored once."""
    slow = collector_factory("--writer-delay", "1.0")
    fs = Client(slow.address, name="coalesced", spool_dir=tmp_path / "spool")
    ns = fs.namespace("application", blocking=False)
    futures = []
    for step in range(12):
        ns.set("step", step)
        ns.set("mesh/energy", float(step) / 2)
        futures.append(ns.commit())
    acks = [f.result(120) for f in futures]
    fs.close()
    run_dir = slow.store / fs.run_id
    assert all(a.stored for a in acks)
    for a in acks:
        assert a.segments and all((run_dir / "metrics" / f"{seg}.parquet").is_file() for seg in a.segments)
    written = {p.stem for p in (run_dir / "metrics").glob("*.parquet")}
    assert set().union(*(a.segments for a in acks)) <= written
    assert len(written) < len(acks)  # queued publications were merged
    run = flowscope.open_run(run_dir)
    assert _values(run, "SELECT value FROM metrics WHERE name = 'step' ORDER BY value") == \
        [(float(i),) for i in range(12)]
    assert _values(run, "SELECT count(*) FROM metrics") == [(24,)]


def test_non_blocking_publications_held_for_the_linger_travel_as_one_batch(collector, tmp_path, monkeypatch):
    """A non-blocking publication waits for the next ones (Kafka's linger.ms; by default as long as the client lets
    any record wait), so that the rows of publications close together go as one batch per table, not as a request
    and a segment each: here every publication of the loop is held (a linger of a minute) until flush() sends them,
    and each acknowledgement still names its own commits and rows. With the default linger a lone publication goes
    by itself, no flush needed."""
    import flowscope.client.namespaces as namespaces

    monkeypatch.setattr(namespaces, "LINGER_S", 60.0)
    fs = Client(collector.address, name="linger", spool_dir=tmp_path / "spool")
    ns = fs.namespace("application", blocking=False)
    futures = []
    for step in range(30):
        ns.set("step", step)
        ns.set("mesh/energy", step / 2)
        ns.set("mesh/where", [step, step + 1])
        futures.append(ns.commit())
    assert not any(f.done() for f in futures)  # held, not sent
    ns.flush(timeout=120)
    acks = [f.result(0) for f in futures]
    assert [a.commits for a in acks] == [(i, i) for i in range(1, 31)] and all(a.stored for a in acks)
    assert [a.rows for a in acks] == [{"metrics": 2, "namespace_values": 2}] * 30
    run_dir = collector.store / fs.run_id
    for table in ("metrics", "namespace_values"):
        written = {p.stem for p in (run_dir / table).glob("*.parquet")}
        assert len(written) == 1, (table, written)
        assert all(set(a.segments) & written for a in acks)
    run = flowscope.open_run(run_dir)
    assert _values(run, "SELECT value FROM metrics WHERE name = 'step' ORDER BY value") == \
        [(float(i),) for i in range(30)]
    assert _values(run, "SELECT count(*) FROM namespace_values") == [(60,)]

    monkeypatch.setattr(namespaces, "LINGER_S", None)  # the default: as long as the client lets a record wait
    lone = fs.namespace("workflow", blocking=False)
    assert lone._linger() == fs.flush_interval
    lone.set("tasks/running", 3)
    ack = lone.commit().result(timeout=120)  # sent once its linger ended: nothing else asked for it
    assert ack.stored and ack.commits == (1, 1)
    fs.close()


def test_a_program_that_exits_without_closing_still_sends_its_held_publications(collector, tmp_path):
    """A producer that ends right after a non-blocking commit, its client never closed: what the linger held is
    sent as the interpreter exits, not lost with it."""
    import subprocess
    import sys

    script = tmp_path / "producer.py"
    script.write_text(
        "import sys\n"
        "import flowscope.client.namespaces as namespaces\n"
        "from flowscope import Client\n"
        "namespaces.LINGER_S = 60.0  # held far longer than the program lives\n"
        f"fs = Client({collector.address!r}, name='exits', spool_dir={str(tmp_path / 'spool')!r})\n"
        "ns = fs.namespace('application', blocking=False)\n"
        "ns.set('mesh/energy', 42.0)\n"
        "ns.commit()\n"
        "print(fs.run_id)\n", encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run_dir = collector.store / out.stdout.strip()
    assert _values(flowscope.open_run(run_dir), "SELECT value FROM metrics WHERE name = 'mesh/energy'") == [(42.0,)]


def test_coalescing_merges_only_queued_publications_of_one_table_within_the_row_limit():
    import pyarrow as pa

    from flowscope.client.client import coalesce

    def item(table, n, publication=True):
        fut = Future() if publication else None
        t = pa.table({"x": list(range(n))})
        return (table, f"seg-{table}-{n}-{id(t)}", t, fut) if publication else (table, f"seg-{id(t)}", t)

    a1, a2, b1, a3, plain, a4 = item("metrics", 3), item("metrics", 4), item("namespace_values", 2), \
        item("metrics", 5), item("metrics", 6, publication=False), item("metrics", 9)
    groups = coalesce([a1, a2, b1, a3, plain, a4], max_rows=12)
    # publications of one table merge in order up to 12 rows; a plain batch and another table stay apart
    assert [[i[1] for i in g] for g in groups] == [[a1[1], a2[1], a3[1]], [b1[1]], [plain[1]], [a4[1]]]


# Records for the quick walk (model.namespaces.common_leaves) against the general one (leaves): the common shapes it
# takes, and every case it must hand back (None) or refuse with the general walk's own error.
_WALKED = [
    ("step", 3), ("step", 3.5), ("flag", True), ("flag", np.bool_(False)), ("name", "rk3"), ("diagnostics", DIAGNOSTICS),
    ("", {"mass": 1.0, "rank": {"3": {"nan": 0}}}), ("a/b", {"c": {"d": [1, 2.5, "x"]}}), ("m", np.float64(2.5)),
    ("m", np.int64(7)), ("m", np.float32(0.5)), ("loc", np.array([1, 2], dtype=np.int64)), ("loc", np.arange(40)),
    ("loc", np.array([0.5, np.nan])), ("loc", np.array(["a", "b"])), ("loc", (1, 2)), ("loc", []),
    ("x", float("nan")), ("x", -(2**53)), ("x", 2**53 + 1), ("x", {"y": 2**60}), ("x", {"y": None}), ("x", {}),
    ("x", {"y": {}}), ("x", {3: 1.0}), ("x", {"y": [[1]]}), ("x", {"y": np.zeros((2, 2))}), ("x", {"a\nb": 1.0}),
    ("x", {"y": "z" * (MAX_TEXT_BYTES // 4 + 1)}), ("x", {"y": "\u00e9" * (MAX_TEXT_BYTES // 2 + 1)}),
    ("x", {"y": object()}), ("x", {"": 1.0}), ("x", {"y/z": 1.0}), ("x", OrderedDict(y=1.0)), ("x", 1 + 2j),
    ("deep", functools.reduce(lambda v, _: {"k": v}, range(70), 1.0)), ("x" * 1020, {"abcde": 1.0}),
    # arrays and lists the compiled walk converts itself, and those it hands to the general conversion
    *[("arr", np.array([0, 1, 7], dtype=t)) for t in ("?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8")],
    ("arr", np.array([2**53, -(2**53)], dtype="i8")), ("arr", np.array([2**53 + 1], dtype="i8")),
    ("arr", np.array([2**63 + 5], dtype="u8")), ("arr", np.array([0.1, np.inf, -np.inf, np.nan], dtype="f4")),
    ("arr", np.arange(10)[::3]), ("arr", np.array([1, 2], dtype=">i4")), ("arr", np.array([1.5], dtype="f2")),
    ("arr", np.array(5)), ("arr", np.arange(5000)), ("arr", np.array([1 + 2j])), ("arr", np.array(["a", "b"])),
    ("lst", [1, 2.5, -(2**53)]), ("lst", [2**53 + 1]), ("lst", [True, 1]), ("lst", [1, "a"]), ("lst", [1, None]),
    ("lst", [np.float64(1.5)]), ("lst", list(range(5000))), ("m", np.float64("nan")), ("m", {"v": np.float64(-0.0)}),
]


def _walked(walk, path, value):
    try:
        got = walk(path, value)
    except NamespaceError as exc:
        return ("error", exc.field, str(exc))
    if got is None:
        return None
    got = [(p, leaf.values, leaf.single) if isinstance(leaf, Leaf) else (p, leaf, *rest) for p, leaf, *rest in got]
    return [(p, ["NaN" if v != v else v for v in values], single) for p, values, single in got]  # NaN != NaN


@pytest.mark.parametrize("walk", [common_leaves_reference, common_leaves], ids=["reference", "compiled"])
@pytest.mark.parametrize("path,value", _WALKED, ids=[f"{i}-{p[:12]}" for i, (p, _) in enumerate(_WALKED)])
def test_the_quick_walk_gives_the_general_walks_leaves_or_hands_the_record_back(path, value, walk):
    general = _walked(leaves, path, value)
    quick = _walked(walk, path, value)
    if quick is not None:  # what it took, it took exactly as the general walk does: the same leaves, or its error
        assert quick == general
    # the shapes a simulation publishes every step take the quick walk (else it would speed nothing up)
    if path in ("step", "name", "diagnostics", "") or (path == "loc" and value is not None and len(value) <= 16
                                                        and not isinstance(value, tuple)) or (
            path == "m" and isinstance(value, np.float64)):
        assert quick is not None, (path, value)


def test_the_compiled_quick_walk_is_the_one_used_where_it_was_built():
    from flowscope.model import namespaces

    assert namespaces._record_walk is not None, "flowscope.model._record_walk is not built (pip install -e .)"
    assert common_leaves is namespaces._record_walk.walk


def test_a_record_set_every_step_publishes_the_same_rows_with_the_quick_walk_or_without_it(tmp_path, monkeypatch):
    import flowscope.client.namespaces as client_namespaces

    def publish(store: str, quick: bool) -> list:
        if not quick:
            monkeypatch.setattr(client_namespaces, "common_leaves", lambda path, value: None)
        with Client(store=tmp_path / store, spool_dir=tmp_path / f"spool-{store}") as fs:
            ns = fs.namespace("application", publish_every=2)
            for step in range(4):
                ns.set("step", step)
                ns.set("diagnostics", {**DIAGNOSTICS, "local_mass": 1.0 + step})
                ns.append("rank/0/seen", step)
                if step == 2:
                    with pytest.raises(NamespaceError, match="has keys below it"):
                        ns.set("diagnostics", 1.0)
                    with pytest.raises(NamespaceError, match="holds a value"):
                        ns.set("step", {"sub": 1.0})
                ns.commit()
            run = flowscope.open_run(fs.run_dir)
            rows = _values(run, "SELECT name, value, ts_ns FROM metrics WHERE namespace = 'application' "
                                "ORDER BY ts_ns, name")
            rows += _values(run, "SELECT name, item, value, text, ts_ns FROM namespace_values ORDER BY ts_ns, name, item")
        monkeypatch.undo()
        base = min(r[-1] for r in rows)
        return [(*r[:-1], r[-1] > base) for r in rows]  # commit times differ between the two runs; their order not

    quick, general = publish("quick", True), publish("general", False)
    # overwritten leaves: the last commit's of each publication (8 metrics, 9 list items); appended: every one
    assert quick == general and len(quick) == 2 * 8 + 2 * 9 + 4
