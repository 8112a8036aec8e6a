"""The live view's update per batch (analysis/live.py) and its deltas as pages receive them (service/live_hub.py),
fed with the batches of a real Dask run recorded by flowscope.observe."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flowscope.analysis.live import HOST_METRICS, PALETTE, LiveRun, pending_segments
from flowscope.model.schemas import schema
from flowscope.service.frames import read_message
from flowscope.store.run import Run


def _inc(x):
    return x + 1


def _add(a, b):
    return a + b


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real Dask run's directory: three task groups over 2 worker processes x 2 threads, with dependencies
    (transfers between workers), its scheduler's transitions and the hardware sampler's metrics."""
    from distributed import Client, LocalCluster

    import flowscope

    store = tmp_path_factory.mktemp("live-view") / "store"
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client, \
            flowscope.observe(client, store=store, name="live-view", hardware_period=0.2) as obs:
        xs = [client.submit(_inc, i, key=f"inc-{i}") for i in range(60)]
        ys = [client.submit(_add, xs[i], xs[-1 - i], key=f"add-{i}") for i in range(60)]
        total = client.submit(sum, ys, key="total-0")
        assert total.result() == 60 * 61
    return obs.run.path


def _segments(run_dir: Path) -> list[tuple[str, str, pa.Table]]:
    run = Run(run_dir)
    probe = LiveRun(run.meta, run.mappings())
    return [(table, sid, pq.read_table(path, schema=schema(table))) for table, sid, path in pending_segments(run_dir, probe)]


# ---- the per-record update as it was, kept as the reference the vectorised one must match -----------------------
class ReferenceLiveRun(LiveRun):
    """LiveRun with its per-record Python update of task spans, transfers, host metrics and scheduler transitions
    (before issue 15)."""

    def _apply_transitions(self, batch: pa.Table, delta: dict) -> None:
        t = batch.filter(pc.equal(batch["observer"], "scheduler"))
        if not t.num_rows:
            return
        grp = pc.coalesce(t["prefix"], t["group"], t["task_key"]).to_pylist()
        changed = set()
        new_groups: list[dict] = []
        for g in [g for g in dict.fromkeys(grp) if g not in self._group_of]:  # colour fixed when first known
            self._group(g, new_groups)
        if new_groups:
            delta["groups"] = new_groups
        for ts, key, state, g in zip(t["ts_ns"].to_pylist(), t["task_key"].to_pylist(), t["to_state"].to_pylist(), grp):
            cur = self._state.get(key)
            if cur is None:
                cur = self._state[key] = [ts, None, g]
                self._groups.setdefault(g, Counter())["total"] += 1
            elif ts < cur[0]:
                continue  # an older transition arriving late: the key's state is the latest one
            counts = self._groups.setdefault(cur[2], Counter())
            if cur[1] is not None:
                self._by_state[cur[1]] -= 1
                if cur[1] in ("processing", "executing"):
                    counts["running"] -= 1
            cur[0], cur[1] = ts, state
            self._by_state[state] += 1
            if state in ("processing", "executing"):
                counts["running"] += 1
            if state in ("memory", "erred") and key not in self._done:
                self._done.add(key)
                counts["done"] += 1
                if state == "erred":
                    counts["erred"] += 1
            changed.add(cur[2])
        self.last_ns = max(self.last_ns, int(pc.max(t["ts_ns"]).as_py()))
        delta["progress"] = self._progress(changed)
        delta["states"] = self._states()

    def _stream_spans(self, batch: pa.Table) -> pa.Table:
        """Role and group by the activity query over each batch (one DuckDB query per batch)."""
        self._con.register("spans", batch)
        self._con.register("resources", pa.table({"resource_id": list(self._res),
                                                  "kind": [r["kind"] for r in self._res.values()]},
                                                 schema=pa.schema([("resource_id", pa.string()), ("kind", pa.string())])))
        try:
            rel = self._con.sql(f"""SELECT resource_id, start_ns, end_ns, task_key, role, "group"
                                    FROM ({self._activity}) WHERE role IN ('task', 'call', 'state', 'other')
                                    ORDER BY start_ns, end_ns, resource_id, task_key, "group" """)
            a = (getattr(rel, "to_arrow_table", None) or rel.arrow)()
        finally:
            self._con.unregister("spans")
            self._con.unregister("resources")
        return a

    def _apply_spans(self, batch: pa.Table, delta: dict) -> None:
        a = self._stream_spans(batch)
        if a.num_rows:
            a = self._drawn_spans(a, delta)  # tasks and calls, else states, else others: the same choice
        if not a.num_rows:
            return
        new_rows: list[str] = []
        new_groups: list[dict] = []
        row = np.array([self._row(r, new_rows) for r in a["resource_id"].to_pylist()], dtype=np.int32)
        names = a["group"].to_pylist()
        group = np.array([self._group(g if g is not None else "?", new_groups) for g in names], dtype=np.int32)
        start = (a["start_ns"].to_numpy() - self.t0_ns) / 1e9
        end = (a["end_ns"].to_numpy() - self.t0_ns) / 1e9
        keys = a["task_key"].to_pylist()
        self._tasks.add(start, end, row, group, pa.array(keys, pa.string()))
        self.last_ns = max(self.last_ns, int(pc.max(a["end_ns"]).as_py()))
        tasks = a.filter(pc.equal(a["role"], "task"))
        changed = set()
        for g in tasks["group"].to_pylist():
            self._span_tasks[g] += 1
            changed.add(g)
        if tasks.num_rows:
            secs = (tasks["end_ns"].to_numpy() - self.t0_ns) // 1_000_000_000
            s, n = np.unique(secs, return_counts=True)
            for sec, k in zip(s.tolist(), n.tolist()):
                self._finished[sec] += k
            delta["throughput"] = {str(sec): self._finished[sec] for sec in s.tolist()}
        if new_rows:
            delta["rows"], delta["row_ids"] = new_rows, self._rows[-len(new_rows):]
        if new_groups:
            delta["groups"] = new_groups
        delta["tasks"] = {"start": start.tolist(), "end": end.tolist(), "row": row.tolist(), "group": group.tolist(),
                          "key": keys}
        if changed and not self._state:
            delta["progress"] = self._progress(changed)
            delta["states"] = self._states()

    def _apply_transfers(self, batch: pa.Table, delta: dict) -> None:
        new_rows: list[str] = []
        src = np.array([self._row(r, new_rows) for r in batch["src_resource_id"].to_pylist()], dtype=np.int32)
        dst = np.array([self._row(r, new_rows) for r in batch["dst_resource_id"].to_pylist()], dtype=np.int32)
        start = (batch["start_ns"].to_numpy() - self.t0_ns) / 1e9
        end = (batch["end_ns"].to_numpy() - self.t0_ns) / 1e9
        self._xfers.append((start, end, src, dst))
        if new_rows:
            delta["rows"], delta["row_ids"] = new_rows, self._rows[-len(new_rows):]
        delta["transfers"] = {"start": start.tolist(), "end": end.tolist(), "src": src.tolist(), "dst": dst.tolist()}

    def _apply_metrics(self, batch: pa.Table, delta: dict) -> None:
        hw = batch.filter(pc.equal(batch["namespace"], "hardware"))
        if not hw.num_rows:
            return
        names = set(pc.unique(hw["name"]).to_pylist())
        points: dict[str, dict[str, dict]] = {}
        for panel, choices in HOST_METRICS.items():
            name = self._metric_names.get(panel) or next((n for n in choices if n in names), None)
            if name is None or name not in names:
                continue
            self._metric_names[panel] = name
            m = hw.filter(pc.and_(pc.equal(hw["name"], name), pc.is_finite(hw["value"])))
            if not m.num_rows:
                continue
            for rid, ts, v in zip(m["resource_id"].to_pylist(), m["ts_ns"].to_pylist(), m["value"].to_pylist()):
                xs, ys = self._series.setdefault((panel, rid), ([], []))
                t = (ts - self.t0_ns) / 1e9
                xs.append(t)
                ys.append(v)
                p = points.setdefault(panel, {}).setdefault(rid, {"label": self._label(rid), "t": [], "v": []})
                p["t"].append(t)
                p["v"].append(v)
            self.last_ns = max(self.last_ns, int(pc.max(m["ts_ns"]).as_py()))
        if points:
            delta["metrics"] = {"names": dict(self._metric_names), "series": points}


def _plain(v):
    """``v`` with its columns (numpy, Arrow: what the live channel sends as buffers) as lists."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (pa.Array, pa.ChunkedArray)):
        return v.to_pylist()
    return v


def _feed_both(run_dir: Path, feed: list[tuple[str, str, pa.Table]]) -> tuple[LiveRun, LiveRun]:
    run = Run(run_dir)
    new, ref = LiveRun(run.meta, run.mappings()), ReferenceLiveRun(run.meta, run.mappings())
    for i, (table, sid, data) in enumerate(feed):
        got, want = _plain(new.apply(table, sid, data)), _plain(ref.apply(table, sid, data))
        assert got == want, (i, table, sid)
        # the same JSON a page receives (dict equality ignores the order of keys; a page's arrays do not)
        if got is not None:
            assert json.loads(json.dumps(got)) == json.loads(json.dumps(want))
    assert new.snapshot() == ref.snapshot()
    assert json.dumps(new.snapshot()) == json.dumps(ref.snapshot())
    assert new.counts() == ref.counts()
    return new, ref


def _rows(t: pa.Table) -> list[pa.Table]:
    return [t.slice(i, 1) for i in range(t.num_rows)]


def test_the_vectorised_update_matches_the_per_record_one_on_a_real_dask_run(recorded):
    segs = _segments(recorded)
    tables = {t for t, _, _ in segs}
    assert {"resources", "spans", "transitions", "transfers", "metrics"} <= tables, tables
    new, _ = _feed_both(recorded, segs)
    snap = new.snapshot()
    assert len(snap["tasks"]["key"]) >= 121 and {"inc-0", "add-0", "total-0"} <= set(snap["tasks"]["key"])
    assert snap["transfers"]["start"] and snap["metrics"]["series"]
    # each row of the stream names its resource (a page's ?resource= finds its row by it), the label beside it
    run = Run(recorded)
    spans = run.sql("SELECT DISTINCT resource_id FROM spans WHERE task_key IN ('inc-0', 'add-0', 'total-0')")
    run.close()
    assert len(snap["row_ids"]) == len(snap["rows"]) == len(set(snap["row_ids"]))
    assert set(spans["resource_id"]) <= set(snap["row_ids"])
    assert snap["rows"] == [new._label(rid) for rid in snap["row_ids"]]

    # each batch again, row by row, as one-row segments: spans of keys seen before, rows known before
    again = [(t, f"{sid}-row{i}", r) for t, sid, d in segs if t in ("spans", "transfers", "metrics")
             for i, r in enumerate(_rows(d))]
    _feed_both(recorded, segs + again)


def test_the_vectorised_update_matches_with_nulls_many_groups_and_batches_seen_in_any_order(recorded):
    segs = _segments(recorded)
    spans = pa.concat_tables([d for t, _, d in segs if t == "spans"])
    n = spans.num_rows
    rng = np.random.default_rng(15)
    # many groups (more than the palette's colours): Dask key prefixes the semantic mapping reads
    many = spans.set_column(spans.schema.get_field_index("name"), "name",
                            pa.array([f"g{int(i)}" for i in rng.integers(0, 400, n)], spans.schema.field("name").type))
    # nulls where the schema allows them: task keys
    nullable = [f.name for f in spans.schema if f.nullable and f.name == "task_key"]
    holes = spans
    for name in nullable:
        col = holes[name].combine_chunks()
        holes = holes.set_column(holes.schema.get_field_index(name), name,
                                 pc.if_else(pa.array(rng.random(n) < 0.3), pa.nulls(n, col.type), col))
    # transfers whose resources no span named, metrics of hosts in a shuffled order
    xfers = pa.concat_tables([d for t, _, d in segs if t == "transfers"])
    metrics = pa.concat_tables([d for t, _, d in segs if t == "metrics"])
    shuffled = metrics.take(pa.array(rng.permutation(metrics.num_rows)))
    head = [(t, sid, d) for t, sid, d in segs if t in ("resources", "transitions")]
    feed = [("spans", "many", many), ("spans", "holes", holes), ("metrics", "shuffled", shuffled)]
    feed += [("spans", "many-shuffled", many.take(pa.array(rng.permutation(n))))]
    _feed_both(recorded, [("transfers", "xfers-first", xfers)] + head + feed)
    _feed_both(recorded, feed)  # without resources or transitions: progress from the task spans
    new, _ = _feed_both(recorded, [(t, sid, d) for t, sid, d in segs if t != "transitions"] + feed)
    assert len(new.snapshot()["groups"]) > 3 * len(PALETTE)  # the colours run out: the rest share one


def _with(t: pa.Table, name: str, values) -> pa.Table:
    """``t`` with column ``name`` replaced by ``values`` (the same field: type and nullability)."""
    f = t.schema.field(name)
    return t.set_column(t.schema.get_field_index(name), f, pa.array(values, f.type) if isinstance(values, list)
                        else values.cast(f.type))


def test_the_vectorised_transitions_match_the_per_record_ones_late_repeated_and_erred(recorded):
    """Scheduler transitions in any order (an older one arriving after a newer one is ignored), several per task
    in one batch, equal times, tasks that err after (or instead of) finishing, other observers' rows, one row per
    batch or all at once: the same progress, states and deltas as the per-record update."""
    segs = _segments(recorded)
    trans = pa.concat_tables([d for t, _, d in segs if t == "transitions"])
    assert trans.num_rows > 100 and set(pc.unique(trans["observer"]).to_pylist()) >= {"scheduler"}
    rng = np.random.default_rng(150)
    n = trans.num_rows
    shuffled = trans.take(pa.array(rng.permutation(n)))
    # equal times and late errors: some tasks' last transition again at the same time, then to erred
    sched = trans.filter(pc.equal(trans["observer"], "scheduler"))
    some = sched.take(pa.array(rng.choice(sched.num_rows, 40, replace=False)))
    erred = _with(some, "to_state", ["erred"] * some.num_rows)
    later = _with(erred, "ts_ns", pc.add(erred["ts_ns"], 1))
    # tasks no other row names, whose only transitions are erred and then memory
    fresh = _with(later, "task_key", [f"fresh-{i}" for i in range(later.num_rows)])
    head = [(t, sid, d) for t, sid, d in segs if t == "resources"]
    cut = [shuffled.slice(i, 97) for i in range(0, n, 97)]
    feed = head + [("transitions", f"part-{i}", c) for i, c in enumerate(cut)]
    feed += [("transitions", "same-time", some), ("transitions", "erred", erred), ("transitions", "later", later),
             ("transitions", "fresh", pa.concat_tables([fresh, _with(fresh, "to_state", ["memory"] * fresh.num_rows)]))]
    new, _ = _feed_both(recorded, feed)
    snap = new.snapshot()
    assert snap["states"].get("erred", 0) >= 1 and sum(p["erred"] for p in snap["progress"].values()) >= 1
    _feed_both(recorded, [("transitions", "all", pa.concat_tables([shuffled, some, later, erred]))])
    _feed_both(recorded, head + [("transitions", f"row-{i}", r) for i, r in enumerate(_rows(shuffled.slice(0, 300)))])


def test_roles_and_groups_decided_per_kind_of_span_match_the_activity_query_under_any_mappings(recorded):
    """The stream's spans, roles and groups decided once per combination of the columns the rules test equal the
    activity query's per batch, under mappings whose rules test the span's attrs (those spans go through the query),
    its resource's kind (known before or only after its spans), globs and lists, and groups read from several fields
    or from attrs."""
    from flowscope.model.semantics import GENERIC, load_mappings
    from flowscope.sources.semantics import DASK_DISTRIBUTED

    segs = _segments(recorded)
    spans = pa.concat_tables([d for t, _, d in segs if t == "spans"])
    n = spans.num_rows
    rng = np.random.default_rng(1500)
    attrs = pa.array([None if i % 5 == 0 else json.dumps({"phase": ["setup", "run"][i % 2], "label": f"L{i % 3}"})
                      for i in range(n)], spans.schema.field("attrs").type)
    spans = spans.set_column(spans.schema.get_field_index("attrs"), "attrs", attrs)
    kinds = pa.array([["task", "call", "transfer", "step"][int(i)] for i in rng.integers(0, 4, n)],
                     spans.schema.field("kind").type)
    mixed = spans.set_column(spans.schema.get_field_index("kind"), "kind", kinds)
    override = load_mappings([{
        "spans": [
            {"when": {"kind": "task", "attrs.phase": "setup"}, "role": "other"},
            {"when": {"kind": "call", "resource_kind": "thread", "name": ["inc*", "a?d"]}, "role": "task",
             "group": ["attrs.label", "task_key"]},
            {"when": {"kind": "call", "resource_kind": None}, "role": "call", "group": ["task_key", "name"]},
            {"when": {"kind": "step", "name": "[it]*"}, "role": "call", "group": "resource_kind"},
            {"when": {"kind": "transfer"}, "role": "task", "group": ["resource_id", "name"]},
        ]}])
    resources = [(t, sid, d) for t, sid, d in segs if t == "resources"]
    feed = [("spans", "before-resources", mixed.slice(0, n // 2))] + resources + \
        [("spans", "after-resources", mixed.slice(n // 2)), ("spans", "plain", spans),
         ("spans", "shuffled", mixed.take(pa.array(rng.permutation(n))))]
    run = Run(recorded)
    for mappings in ([*override, DASK_DISTRIBUTED, GENERIC], run.mappings(), [GENERIC]):
        new, ref = LiveRun(run.meta, mappings), ReferenceLiveRun(run.meta, mappings)
        for i, (table, sid, data) in enumerate(feed):
            assert _plain(new.apply(table, sid, data)) == _plain(ref.apply(table, sid, data)), (i, sid)
        assert json.dumps(new.snapshot()) == json.dumps(ref.snapshot())
        assert len(new.snapshot()["tasks"]["key"]) > 0


@contextlib.contextmanager
def _replaying(src: Run, store: Path) -> Iterator[tuple[object, object, str, object]]:
    """A collector on ``store`` with its live hub and a run opened to replay ``src``'s segments into: (collector, hub,
    run id, the run's watched view); the collector is shut down after."""
    from flowscope.service.collector import Collector
    from flowscope.service.live_hub import LiveHub

    collector = Collector(store)
    try:
        hub = LiveHub(collector.store, collector)
        doc = collector.open_run({"name": "replay", "start_ns": src.meta["start_ns"],
                                  "semantics": src.meta.get("semantics")})
        yield collector, hub, doc["run_id"], hub.watch(doc["run_id"])
    finally:
        collector.shutdown()


def test_a_delta_is_encoded_once_and_the_same_message_goes_to_every_page(recorded, tmp_path):
    """Every page that is up to date receives the very same message text (encoded once, not once per page);
    a page that missed deltas gets them in one message, numbered without gaps."""
    with _replaying(Run(recorded), tmp_path / "store") as (collector, hub, run_id, w):
        kind, snap = w.since(None, None)
        assert kind == "snapshot" and snap["seq"] == 0
        segs = _segments(recorded)
        seen = 0  # the seq two pages that keep up have applied; a third stays at 0
        for table, sid, data in segs:
            collector.ingest(run_id, table, sid, data, timeout=60)
            hub.flush()  # the view takes the batch after its acknowledgement
            bodies = [w.since(w.epoch, seen) for _ in range(2)]
            if w.live.seq == seen:
                assert all(b == ("deltas", None) for b in bodies)
                continue
            (k0, (m0, s0)), *others = bodies
            assert k0 == "deltas" and s0 == w.live.seq
            for k, (m, s) in others:
                assert k == "deltas" and s == s0 and m is m0  # one message object for every page
            msg = read_message(m0)
            assert set(msg) == {"type", "epoch", "deltas"} and msg["type"] == "deltas" and msg["epoch"] == w.epoch
            assert [d["seq"] for d in msg["deltas"]] == list(range(seen + 1, s0 + 1))
            if table == "spans":  # the stream's columns travel as binary buffers (service/frames.py)
                assert isinstance(m0, bytes)
                assert msg["deltas"][-1]["tasks"]["key"] == [k or "" for k in w.live._tasks.key[-1].to_pylist()]
                assert np.array_equal(msg["deltas"][-1]["tasks"]["start"], w.live._tasks.start[-1])
            seen = s0
        kind, (missed, last) = w.since(w.epoch, 0)
        msg = read_message(missed)
        assert kind == "deltas" and last == w.live.seq
        assert [d["seq"] for d in msg["deltas"]] == list(range(1, last + 1))


def test_the_collector_acknowledges_batches_without_waiting_for_the_live_view(recorded, tmp_path):
    """The view is updated after the acknowledgement, in the order the batches were written: a view held busy
    (here by its lock, as while a page's snapshot is built) does not hold up ingest, and its deltas stay numbered
    without gaps, the run's close last."""
    src = Run(recorded)
    with _replaying(src, tmp_path / "store") as (collector, hub, run_id, w):
        segs = _segments(recorded)
        with w.lock:  # the view is busy the whole time these batches are sent
            for table, sid, data in segs:
                res = collector.ingest(run_id, table, sid, data, timeout=120)
                assert res.rows == data.num_rows and not res.duplicate
            assert w.live.seq == 0  # nothing applied yet: every batch was acknowledged first
        collector.close_run(run_id)
        hub.flush()
        kind, (message, last) = w.since(w.epoch, 0)
        deltas = read_message(message)["deltas"]
        assert kind == "deltas" and [d["seq"] for d in deltas] == list(range(1, last + 1))
        assert deltas[-1]["status"] == "finished" and all("status" not in d for d in deltas[:-1])
        # the same view as one fed directly, batch by batch
        direct = LiveRun(w.live.snapshot() | {"start_ns": src.meta["start_ns"]}, src.mappings())
        for table, sid, data in segs:
            direct.apply(table, sid, data)
        got, want = w.live.snapshot(), direct.snapshot()
        for k in ("tasks", "transfers", "progress", "states", "rows", "groups", "throughput", "warning_count"):
            assert got[k] == want[k], k


def test_a_programs_own_series_are_drawn_the_first_eight_by_publication_and_watched_for_instability():
    """Numbers published into the program's own namespaces (application domain, or none) become the view's
    diagnostics, the first APP_SERIES_MAX series in the order they were first published; performance, hardware and
    workflow namespaces stay out; a series that grows geometrically yields one warning."""
    from flowscope.analysis.live import APP_SERIES_MAX
    from flowscope.model.schemas import schema

    t0 = 1_700_000_000_000_000_000
    live = LiveRun({"run_id": "r", "start_ns": t0}, [])
    names = [f"s{i:02d}" for i in range(APP_SERIES_MAX + 2)]
    rows = {"ts_ns": [], "namespace": [], "name": [], "resource_id": [], "value": []}

    def add(ts, ns, name, value):
        for col, x in (("ts_ns", ts), ("namespace", ns), ("name", name), ("resource_id", "proc:1"), ("value", value)):
            rows[col].append(x)

    for step in range(12):
        for i, n in enumerate(reversed(names)):  # published in reverse name order: first seen = last name
            add(t0 + step * 1000 + i, "application" if i % 2 else "mine", n, 3.0 ** step if n == "s09" else 1.0)
        add(t0 + step * 1000 + 500, "performance", "process.memory.rss_bytes", 1e6)
        add(t0 + step * 1000 + 600, "workflow", "queued", 2.0 ** (4 * step))
    fields = {f.name: f.type for f in schema("metrics")}
    batch = pa.table({k: pa.array(v, fields[k]) for k, v in rows.items()})
    delta = live.apply("metrics", "seg-1", batch)
    snap = live.snapshot()
    first = [f"{'application' if i % 2 else 'mine'}:{n}" for i, n in enumerate(reversed(names))][:APP_SERIES_MAX]
    assert sorted(snap["diagnostics"]) == sorted(first) and sorted(delta["diagnostics"]) == sorted(first)
    assert snap["diagnostics"]["mine:s09"]["proc:1"]["v"] == [3.0 ** k for k in range(12)]
    warn = [w for w in snap["warnings"] if w["category"] == "instability"]
    assert len(warn) == 1 and warn[0]["message"].startswith("mine s09 grew")


def test_what_pages_receive_is_json_a_browser_parses_with_numpy_values_and_non_finite_numbers_as_null():
    """The text sent to pages (deltas, snapshots, views) is strict JSON: numpy arrays and scalars as their
    values, NaN and infinities as null (a browser's JSON.parse refuses NaN), integer keys as strings, integers
    beyond 64 bits exact, markup left as it is (the pages escape it)."""
    from flowscope.service.json_text import encode

    doc = {"tasks": {"start": np.array([0.5, 1.25]), "row": np.array([3, 4], dtype=np.int32)},
           "n": np.int64(7), "x": np.float32(0.5), "bad": [float("nan"), float("inf"), -float("inf")],
           "relabel": {2: "worker <b>a</b>"}, "big": 2 ** 70, "key": "('<script>x</script>', 1)"}
    text = encode(doc)
    assert isinstance(text, str) and "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"tasks": {"start": [0.5, 1.25], "row": [3, 4]}, "n": 7, "x": 0.5,
                                "bad": [None, None, None], "relabel": {"2": "worker <b>a</b>"}, "big": 2 ** 70,
                                "key": "('<script>x</script>', 1)"}


def _replayed(collector, recorded: Path, segs: list, name: str) -> tuple[dict, Path]:
    """A run opened in ``collector`` with the recorded run's start, holding ``segs`` (ingested as the collector takes
    a batch): its run.json document and its folder."""
    doc = collector.open_run({"name": name, "start_ns": Run(recorded).meta["start_ns"]})
    for table, sid, data in segs:
        collector.ingest(doc["run_id"], table, sid, data, timeout=60)
    return doc, collector.store / doc["run_id"]


def test_a_views_recomputation_keeps_its_cadence_however_many_pages_ask(recorded, tmp_path):
    """While a run changes, a view is recomputed at most once per max(VIEW_DEBOUNCE_S, its predicted cost / share)
    for every page together, the predicted cost being the last computation's scaled by how much the run grew since
    (its segments of the tables the view reads), at most VIEW_GROWTH_CAP-fold: a run that grew by half waits half
    as long again, so that a young run's cheap first computation does not let a costly one follow at once, and one
    that grew twentyfold waits no more than the cap allows (a view is never held back for ever). A page asking
    sooner gets the kept view and how long until a fresher one may be computed; once that time has passed, the
    next ask recomputes it."""
    import asyncio

    from flowscope.service.collector import Collector
    from flowscope.service.dashboard_routes import VIEW_DEBOUNCE_S, VIEW_GROWTH_CAP, _Views

    segs = [s for s in _segments(recorded) if s[0] in ("metrics", "resources")]
    metrics = [s for s in segs if s[0] == "metrics"]
    assert metrics, "the recorded run has no metrics segment"
    now = [1000.0]
    collector = Collector(tmp_path / "store")
    try:
        doc, run_dir = _replayed(collector, recorded, segs, "cadence")
        views = _Views(clock=lambda: now[0])

        def grow(times: float, segments: int) -> None:  # the same samples again, as new segments
            for i in range(round((times - 1) * segments)):
                table, _, data = metrics[i % len(metrics)]
                collector.ingest(doc["run_id"], table, f"more-{times}-{i}", data, timeout=60)

        async def pages():
            # the clock is set to where each wait ends by the same sum the views compute (computed at + allowed):
            # stepping there by parts could fall an ulp short
            t_first = now[0]
            first, wait = await views.get(run_dir, "memory", share=0.05)
            assert wait is None  # computed now: fresh
            again, wait = await views.get(run_dir, "memory", share=0.05)
            assert again is first and wait is None  # nothing changed: the kept view
            before = sum(first["segments"].values())
            extra = max(1, before // 2)  # the run grows by about half (less than the cap)
            assert (before + extra) / before < VIEW_GROWTH_CAP
            grow(1 + extra / before, before)
            allowed = max(VIEW_DEBOUNCE_S, (before + extra) / before * first["cost_s"] / 0.05)
            now[0] = t_first + allowed / 2
            answers = [await views.get(run_dir, "memory", share=0.05) for _ in range(5)]  # five pages
            for got, wait in answers:
                assert got is first and wait == pytest.approx(allowed / 2)
            now[0] = t_newer = t_first + allowed
            newer, wait = await views.get(run_dir, "memory", share=0.05)
            assert newer is not first and wait is None
            assert sum(newer["segments"].values()) == before + extra
            grow(20, before + extra)  # twentyfold more: the wait is the cap's
            capped = max(VIEW_DEBOUNCE_S, VIEW_GROWTH_CAP * newer["cost_s"] / 0.05)
            now[0] = t_newer + capped * 0.9
            kept, wait = await views.get(run_dir, "memory", share=0.05)
            assert kept is newer and wait == pytest.approx(capped * 0.1)
            now[0] = t_newer + capped
            last, wait = await views.get(run_dir, "memory", share=0.05)
            assert last is not newer and wait is None and sum(last["segments"].values()) == 20 * (before + extra)
        asyncio.run(pages())
    finally:
        collector.shutdown()


def test_a_view_held_off_the_cores_by_other_programs_is_not_held_back_longer(recorded, tmp_path, monkeypatch):
    """A view's cadence follows what its computation cost the collector's process in CPU, not the wall time it
    took: on a machine whose cores other programs take, the wall time of a cheap view grows many times (and with it,
    at a panel's share of 2 %, the wait before its next recomputation: minutes), while what it costs the collector
    does not. Here the view is kept off the cores by a sleep of 2 s inside its computation."""
    import asyncio

    from flowscope.report import views as view_module
    from flowscope.service.collector import Collector
    from flowscope.service.dashboard_routes import PANEL_CPU_SHARE, VIEW_DEBOUNCE_S, _Views

    fn, tables = view_module.VIEWS["memory"]

    def descheduled(run):
        time.sleep(2.0)
        return fn(run)

    monkeypatch.setitem(view_module.VIEWS, "memory", (descheduled, tables))
    segs = _segments(recorded)  # the spans too: the memory view shows the processes that ran work
    now = [1000.0]
    collector = Collector(tmp_path / "store")
    try:
        doc, run_dir = _replayed(collector, recorded, segs, "held-off")
        views = _Views(clock=lambda: now[0])

        async def page():
            first, wait = await views.get(run_dir, "memory", share=PANEL_CPU_SHARE)
            assert first["processes"] and first["compute_s"] >= 2.0
            assert 0 < first["cost_s"] <= first["compute_s"] - 1.0  # the sleep cost no CPU
            table, _, data = next(s for s in segs if s[0] == "metrics")
            collector.ingest(doc["run_id"], table, "one-more", data, timeout=60)
            kept, wait = await views.get(run_dir, "memory", share=PANEL_CPU_SHARE)
            grown = sum(views.signature(run_dir, "memory")[1:]) / sum(first["segments"].values())
            assert kept is first
            assert wait == pytest.approx(max(VIEW_DEBOUNCE_S, first["cost_s"] * grown / PANEL_CPU_SHARE))
            assert wait < first["compute_s"] * grown / PANEL_CPU_SHARE - 1.0 / PANEL_CPU_SHARE
        asyncio.run(page())
    finally:
        collector.shutdown()


def test_pending_segments_are_read_ahead_in_their_order_and_a_damaged_one_is_reported_in_its_place(recorded, tmp_path):
    import shutil

    from flowscope.analysis.live import read_pending

    run_dir = tmp_path / recorded.name
    shutil.copytree(recorded, run_dir)
    run = Run(run_dir)
    expected = _segments(run_dir)
    assert len(expected) > 8  # more than the read-ahead below, so that reads overlap
    damaged = next(p for t, sid, p in pending_segments(run_dir, LiveRun(run.meta, run.mappings()))
                   if t == "spans")
    damaged.write_bytes(damaged.read_bytes()[:40])  # a truncated segment
    got = list(read_pending(run_dir, LiveRun(run.meta, run.mappings()), ahead=4))
    assert [(t, sid) for t, sid, _, _ in got] == [(t, sid) for t, sid, _ in expected]
    for (t, sid, path, data), (_, _, want) in zip(got, expected):
        if path == damaged:
            assert isinstance(data, Exception) and not isinstance(data, pa.Table)
        else:
            assert data.equals(want)


def test_the_runs_lists_findings_of_a_running_run_wait_for_their_cost_scaled_by_the_runs_growth(recorded, tmp_path):
    """The runs list shows a running run's findings kept from their last computation for max(RUNNING_FINDINGS_S,
    its cost x the run's growth since / RUNNING_FINDINGS_SHARE), the growth (its segments of the tables the findings
    read) at most VIEW_GROWTH_CAP-fold, as the analysis views do: a young run's cheap computation must not let a
    costly one follow at once. Computing the findings is made to cost 0.5 s on a fake clock."""
    import threading

    from flowscope.service.collector import Collector
    from flowscope.service.dashboard_routes import RUNNING_FINDINGS_SHARE, RUNNING_FINDINGS_S, VIEW_GROWTH_CAP, _Findings

    segs = [s for s in _segments(recorded) if s[0] in ("spans", "resources")]
    spans = [s for s in segs if s[0] == "spans"]
    now = [1000.0]

    def clock() -> float:  # each reading on the findings' thread is half a second later: a computation costs 0.5 s
        if threading.current_thread().name.startswith("flowscope-findings"):
            now[0] += 0.5
        return now[0]

    collector = Collector(tmp_path / "store")
    findings = _Findings(clock=clock)
    try:
        doc = collector.open_run({"name": "findings", "start_ns": Run(recorded).meta["start_ns"]})
        run_dir = collector.store / doc["run_id"]
        for table, sid, data in segs:
            collector.ingest(doc["run_id"], table, sid, data, timeout=60)

        def settled() -> list[str] | None:  # what the list shows once the findings' thread has nothing queued
            findings._pool.submit(lambda: None).result(timeout=120)
            return findings.get(run_dir, running=True)

        assert findings.get(run_dir, running=True) is None  # the first: computing
        first = settled()
        assert first is not None
        before = len(spans)
        for i in range(before // 2 or 1):  # the run grows by about half
            table, _, data = spans[i % len(spans)]
            collector.ingest(doc["run_id"], table, f"more-{i}", data, timeout=60)
        grown = min(VIEW_GROWTH_CAP, (before + (before // 2 or 1)) / before)
        allowed = max(RUNNING_FINDINGS_S, 0.5 * grown / RUNNING_FINDINGS_SHARE)
        assert allowed > 0.5 / RUNNING_FINDINGS_SHARE  # longer than the cost alone would wait
        now[0] += 0.5 * (allowed + 0.5 / RUNNING_FINDINGS_SHARE)  # past the cost alone's wait, before the scaled one
        assert findings.get(run_dir, running=True) is first and settled() is first  # kept, nothing recomputed
        now[0] += allowed
        assert findings.get(run_dir, running=True) is first  # shown while the fresher ones are computed
        assert settled() is not first
    finally:
        collector.shutdown()


def _imported(shared_data: Path, rel: str, store: Path) -> Path:
    from flowscope.importers import import_paths

    return import_paths([shared_data / rel], store).run_dir


def test_a_run_of_states_alone_draws_its_states_and_a_run_with_tasks_only_its_tasks(shared_data, tmp_path):
    """The stream draws a run's tasks and calls; a run that has neither (a Paje trace of container states) draws its
    states instead, and one with none of those its other spans (Chrome async slices). A run whose states came before its first task (StarPU's Paje trace, its state spans sent
    first) starts its stream again at that task: the delta says so, and the view ends as if the states had never
    come: the same rows, groups and spans as a view fed every span at once."""
    from flowscope.store.run import Run

    states_only = Run(_imported(shared_data, "paje/pajeng/states.trace", tmp_path / "a"))
    view = LiveRun(states_only.meta, states_only.mappings())
    for table, sid, data in _segments(states_only.path):
        view.apply(table, sid, data)
    snap = view.snapshot()
    want = states_only.sql("""SELECT resource_id, start_ns, "group" FROM activity WHERE role = 'state'
                              ORDER BY start_ns""")
    assert len(want) == 3 and len(snap["tasks"]["start"]) == 3
    t0 = states_only.meta["start_ns"]
    assert sorted(snap["tasks"]["start"]) == pytest.approx(sorted((want["start_ns"] - t0) / 1e9))
    assert sorted(snap["groups"][g]["name"] for g in snap["tasks"]["group"]) == sorted(want["group"])
    assert len(snap["rows"]) == want["resource_id"].nunique() and snap["drawn"] == "state"

    # a trace of async slices alone (role other): its slices
    slices = Run(_imported(shared_data, "chrome/catapult/nestable_async.json", tmp_path / "c"))
    view = LiveRun(slices.meta, slices.mappings())
    for table, sid, data in _segments(slices.path):
        view.apply(table, sid, data)
    n = slices.sql("SELECT count(*) FROM activity WHERE role = 'other'").iloc[0, 0]
    assert n > 0 and not slices.sql("SELECT count(*) FROM activity WHERE role <> 'other'").iloc[0, 0]
    assert len(view.snapshot()["tasks"]["start"]) == n and view.snapshot()["drawn"] == "other"

    starpu = Run(_imported(shared_data, "paje/starpu-demo/paje.trace", tmp_path / "b"))
    segs = _segments(starpu.path)
    spans = pa.concat_tables([d for t, _, d in segs if t == "spans"])
    others = [(t, sid, d) for t, sid, d in segs if t != "spans"]
    is_state = pc.equal(spans["kind"], "state")
    assert 0 < pc.sum(is_state).as_py() < spans.num_rows
    whole = LiveRun(starpu.meta, starpu.mappings())
    for table, sid, data in others + [("spans", "all", spans)]:
        assert "reset" not in (whole.apply(table, sid, data) or {})
    split = LiveRun(starpu.meta, starpu.mappings())
    for table, sid, data in others:
        split.apply(table, sid, data)
    first = split.apply("spans", "states", spans.filter(is_state))
    assert "reset" not in first and len(first["tasks"]["start"]) == pc.sum(is_state).as_py()
    assert len(split.snapshot()["tasks"]["start"]) == pc.sum(is_state).as_py()  # states drawn while there is no task
    then = split.apply("spans", "tasks", spans.filter(pc.invert(is_state)))
    assert then["reset"] is True
    a, b = whole.snapshot(), split.snapshot()
    tasks = starpu.sql("SELECT count(*) FROM activity WHERE role IN ('task', 'call')").iloc[0, 0]
    assert len(a["tasks"]["start"]) == tasks == 36
    for k in ("rows", "groups", "tasks", "transfers", "progress", "throughput"):
        assert a[k] == b[k], k


def test_a_stream_that_starts_again_sends_every_page_a_new_snapshot(shared_data, tmp_path):
    """When the stream starts again (a run's first task after its states were drawn), a page that is up to date
    gets a snapshot of a new epoch, not deltas it could not apply."""
    src = Run(_imported(shared_data, "paje/starpu-demo/paje.trace", tmp_path / "src"))
    segs = _segments(src.path)
    spans = pa.concat_tables([d for t, _, d in segs if t == "spans"])
    is_state = pc.equal(spans["kind"], "state")
    with _replaying(src, tmp_path / "store") as (collector, hub, run_id, w):
        feed = [(t, sid, d) for t, sid, d in segs if t != "spans"] + [("spans", "states", spans.filter(is_state))]
        for table, sid, data in feed:
            collector.ingest(run_id, table, sid, data, timeout=60)
        hub.flush()
        kind, snap = w.since(None, None)
        assert kind == "snapshot" and len(snap["tasks"]["start"]) == pc.sum(is_state).as_py()
        epoch, seq = snap["epoch"], snap["seq"]
        collector.ingest(run_id, "spans", "tasks", spans.filter(pc.invert(is_state)), timeout=60)
        hub.flush()
        kind, again = w.since(epoch, seq)
        assert kind == "snapshot" and again["epoch"] != epoch
        assert len(again["tasks"]["start"]) == 36 and again["seq"] > seq
        assert w.since(again["epoch"], again["seq"]) == ("deltas", None)


def test_the_view_lists_states_and_groups_in_name_order_however_its_batches_came(recorded):
    """One batch in which a task passes through a state no task ends in while another ends in it: the per-record
    update meets the states in another order than the vectorised one, and the views (their JSON, as a page reads
    it) are the same all the same."""
    segs = _segments(recorded)
    trans = pa.concat_tables([d for t, _, d in segs if t == "transitions"])
    one = trans.filter(pc.equal(trans["observer"], "scheduler")).slice(0, 1)
    rows = pa.concat_tables([one] * 3)
    rows = _with(rows, "task_key", ["zz-a", "aa-b", "zz-a"])
    rows = _with(rows, "prefix", ["zz", "aa", "zz"])
    rows = _with(rows, "to_state", ["waiting", "processing", "memory"])
    rows = _with(rows, "ts_ns", pc.add(rows["ts_ns"], pa.array([0, 1, 2], pa.int64())))
    head = [(t, sid, d) for t, sid, d in segs if t == "resources"]
    new, _ = _feed_both(recorded, head + [("transitions", "one", rows)])
    snap = new.snapshot()
    assert list(snap["states"]) == ["memory", "processing"] and list(snap["progress"]) == ["aa", "zz"]
