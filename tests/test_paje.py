"""Paje import and export, checked against pajeng's pj_dump on real traces (Debian package pajeng)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from conftest import needs_tool

from flowscope.exporters import export_run
from flowscope.importers import TraceError, detect_format, import_paths
from flowscope.store.run import open_run

PJ_DUMP = shutil.which("pj_dump")
needs_pj_dump = needs_tool("pj_dump", "pajeng")

# the real traces pj_dump accepts (native_paje.trace is deliberately invalid, tested below)
VALID = ["pajeng/categories.trace", "pajeng/containers.trace", "pajeng/events.trace", "pajeng/gattaca.trace",
         "pajeng/gattaca2.trace", "pajeng/gattaca3.trace", "pajeng/links.trace", "pajeng/ms.trace",
         "pajeng/native_sample.trace", "pajeng/replay_output_shurakai_extract.trace", "pajeng/simgrid-fg126.trace",
         "pajeng/states.trace", "pajeng/variables.trace", "pajeng/multiple_files/root.trace",
         "starpu-demo/paje.trace", "starvz_lu_old_data_header_only_paje.trace"]
KINDS = {"Container": "containers", "State": "states", "Event": "events", "Link": "links", "Variable": "variables"}


def pj_dump(path: Path) -> tuple[int, Counter, str]:
    """pj_dump's return code and its records per kind. ``-e`` far beyond the trace: pj_dump otherwise
    cuts its dump at the time of the file's last line, which is not the latest time in a trace that is
    not globally time-ordered."""
    p = subprocess.run([PJ_DUMP, "-e", "1e15", str(path)], capture_output=True, text=True, timeout=60, check=False)
    counts = Counter(KINDS[line.split(",", 1)[0]] for line in p.stdout.splitlines()
                     if line.split(",", 1)[0] in KINDS)
    return p.returncode, counts, p.stderr + p.stdout[-2000:]


def time_sorted_copy(path: Path, out: Path) -> Path:
    """The trace with its timed events stably sorted by time after the header and untimed events (what
    StarVZ's paje_sort does before handing a StarPU trace to pj_dump). Parsed here independently of
    the importer: each event id's Time position comes from the %EventDef blocks."""
    lines = path.read_text().splitlines()
    time_pos: dict[str, int] = {}
    cur, fields = None, []
    head, untimed, timed = [], [], []
    for line in lines:
        s = line.strip()
        if s.startswith("%"):
            head.append(line)
            parts = s[1:].split()
            if parts and parts[0] == "EventDef":
                cur, fields = parts[2], []
            elif parts and parts[0] == "EndEventDef":
                if "Time" in fields:
                    time_pos[cur] = fields.index("Time") + 1
            elif parts:
                fields.append(parts[0])
        elif not s or s.startswith("#"):
            head.append(line)
        else:
            toks = s.split()
            if toks[0] in time_pos:
                timed.append((float(toks[time_pos[toks[0]]]), len(timed), line))
            else:
                untimed.append(line)
    timed.sort(key=lambda r: (r[0], r[1]))
    out.write_text("\n".join(head + untimed + [r[2] for r in timed]) + "\n")
    return out


def imported(path: Path, store: Path):
    res = import_paths([path], store, fmt="paje")
    return res, open_run(res.run_dir)


# every valid trace takes the vectorised path: set/reset states, add/sub variables, definitions after
# timed events, tabs and blank runs, extra fields, includes, traces that are not time-ordered (sorted mode)
VECTORISED = set(VALID)


def test_every_paje_trace_in_the_shared_folder_is_checked(shared_data):
    found = {str(p.relative_to(shared_data / "paje")) for p in (shared_data / "paje").rglob("*.trace")}
    assert found == set(VALID) | {"pajeng/native_paje.trace"}


# ---- records, line by line, against pj_dump ---------------------------------------------------------------
#
# One record per pj_dump line: (kind, container, type, start, end, ...). Times are int64 ns (what flowscope
# stores), except a container's, which pj_dump prints with six significant digits only: those are compared as
# such. pj_dump keeps variable values in single precision (41279125 prints as 41279124), so variable values are
# compared within 1e-6 of their magnitude; everything else is exact.

def pj_records(path: Path, unit_ns: float) -> tuple[int, list[tuple], str]:
    """pj_dump's return code, its records, and its stderr."""
    p = subprocess.run([PJ_DUMP, "-l", "9", "-e", "1e15", str(path)], capture_output=True, text=True, timeout=60,
                       check=False)

    def ns(x: str) -> int:
        return round(float(x) * unit_ns)

    def sig6(x: str) -> str:
        return f"{float(x) * unit_ns / 1e9:.6g}"

    out = []
    for line in p.stdout.splitlines():
        f = [x.strip() for x in line.split(",")]
        if f[0] == "Container":
            out.append(("Container", f[1], f[2], sig6(f[3]), sig6(f[4]), f[6]))
        elif f[0] == "State":
            out.append(("State", f[1], f[2], ns(f[3]), ns(f[4]), int(float(f[6])), f[7]))
        elif f[0] == "Event":
            out.append(("Event", f[1], f[2], ns(f[3]), f[4]))
        elif f[0] == "Link":
            out.append(("Link", f[1], f[2], ns(f[3]), ns(f[4]), f[6], f[7], f[8]))
        elif f[0] == "Variable":
            out.append(("Variable", f[1], f[2], ns(f[3]), ns(f[4]), float(f[6])))
    return p.returncode, out, p.stderr


def _na(v):
    return None if v is None or pd.isna(v) else v


def our_records(run) -> list[tuple]:
    """The run's rows as pj_dump's records of the trace they came from: a resource is a container (named by
    its name, its parent by the parent's name, "0" for none), a span a state, a log an event, a transfer a
    link, and each metric value a variable record that lasts until the next value or the container's end."""
    res = run.table("resources")
    name = {r: n for r, n in zip(res["resource_id"], res["name"])}
    end = {r: e for r, e in zip(res["resource_id"], res["end_ns"])}
    out = []
    for r in res.itertuples(index=False):
        p = _na(r.parent_id)
        kind = "0" if r.resource_id == "paje:0" else r.kind  # the root: Paje's type "0", flowscope's kind "root"
        out.append(("Container", "0" if p is None else name[p], kind, f"{r.start_ns / 1e9:.6g}",
                    f"{r.end_ns / 1e9:.6g}", r.name))
    for s in run.table("spans").itertuples(index=False):
        a = json.loads(s.attrs)
        out.append(("State", name[s.resource_id], a["paje_type"], int(s.start_ns), int(s.end_ns), a["depth"], s.name))
    for g in run.table("logs").itertuples(index=False):
        rid = _na(g.resource_id)
        out.append(("Event", "0" if rid is None else name[rid], g.category, int(g.ts_ns), g.message))
    for t in run.table("transfers").itertuples(index=False):
        a = json.loads(t.attrs)
        out.append(("Link", a["container"], a["paje_type"], int(t.start_ns), int(t.end_ns), a["value"],
                    name[t.src_resource_id], name[t.dst_resource_id]))
    m = run.sql("SELECT resource_id, name, ts_ns, value, lead(ts_ns) OVER (PARTITION BY resource_id, namespace, name "
                "ORDER BY ts_ns) AS next_ns FROM metrics")
    for r in m.itertuples(index=False):
        stop = _na(r.next_ns)
        out.append(("Variable", name[r.resource_id], r.name, int(r.ts_ns),
                    int(end[r.resource_id] if stop is None else stop), float(r.value)))
    return out


def assert_same_records(ours: list[tuple], theirs: list[tuple], what: str) -> None:
    """Equal as multisets; variable values within pj_dump's single precision."""
    def key(r):
        return r[:-1] if r[0] == "Variable" else r

    a = Counter(key(r) for r in ours)
    b = Counter(key(r) for r in theirs)
    only_ours, only_theirs = a - b, b - a
    assert not only_ours and not only_theirs, (
        f"{what}: {sum(only_ours.values())} record(s) only in flowscope's, {sum(only_theirs.values())} only in "
        f"pj_dump's; e.g. ours {sorted(only_ours, key=str)[:6]}, pj_dump's {sorted(only_theirs, key=str)[:6]}")
    va = sorted((key(r), r[-1]) for r in ours if r[0] == "Variable")
    vb = sorted((key(r), r[-1]) for r in theirs if r[0] == "Variable")
    bad = [(x, y) for x, y in zip(va, vb) if abs(x[1] - y[1]) > 1e-6 * max(1.0, abs(x[1]), abs(y[1]))]
    assert not bad, f"{what}: {len(bad)} variable value(s) differ, e.g. {bad[:6]}"


def _import(path: Path, store: Path, fast: bool, monkeypatch):
    from flowscope.importers import paje

    monkeypatch.setattr(paje, "FAST", fast)
    return imported(path, store)


def _reference(path: Path, res, tmp_path: Path) -> Path:
    """The file pj_dump reads for comparison: the trace, or its time-sorted copy when flowscope sorted it
    (pj_dump simulates file order and refuses or cuts a trace that goes back in time)."""
    if any("not time-ordered" in w for w in res.files[0].warnings):
        return time_sorted_copy(path, tmp_path / "sorted.trace")
    return path


@needs_pj_dump
@pytest.mark.parametrize("path_kind", ["line", "vectorised"])
@pytest.mark.parametrize("rel", VALID)
def test_records_equal_pj_dump(shared_data, tmp_path, monkeypatch, rel, path_kind):
    path = shared_data / "paje" / rel
    assert detect_format(path) == "paje"
    res, run = _import(path, tmp_path / "store", path_kind == "vectorised", monkeypatch)
    meta = res.files[0].meta
    if path_kind == "line":
        assert meta["read_path"] == "line simulator"
    else:
        assert rel in VECTORISED and meta["read_path"] == "vectorised", meta.get("vectorised_path_not_used")
    # the counts are the rows really written
    counts, rows = meta["paje_counts"], res.rows
    assert [counts["containers"], counts["states"], counts["events"], counts["links"], counts["variables"]] == \
        [rows.get(t, 0) for t in ("resources", "spans", "logs", "transfers", "metrics")]
    unit_ns = 1e6 if meta["time_unit"] == "ms" else 1e9
    rc, want, err = pj_records(_reference(path, res, tmp_path), unit_ns)
    assert rc == 0, err
    assert_same_records(our_records(run), want, f"{rel} ({meta['read_path']})")
    assert "" not in set(run.table("resources")["resource_id"])
    run.close()


def test_starpu_trace_is_not_time_ordered_and_pj_dump_cuts_it(shared_data, tmp_path):
    """The StarPU demo trace goes back in time (per-worker flushes): imported with a warning; pj_dump on
    the file as written drops the variable changes it sees after a container's destruction."""
    path = shared_data / "paje" / "starpu-demo" / "paje.trace"
    res, run = imported(path, tmp_path / "store")
    warn = [w for w in res.files[0].warnings if "not time-ordered" in w]
    assert warn and re.search(r"paje\.trace:\d+:", warn[0])
    assert res.files[0].meta["time_unit"] == "ms"
    run.close()


@needs_pj_dump
def test_native_paje_is_refused_with_file_line_and_field(shared_data, tmp_path):
    path = shared_data / "paje" / "pajeng" / "native_paje.trace"
    rc, _, _ = pj_dump(path)
    assert rc != 0  # pajeng's own test expects this
    with pytest.raises(TraceError) as exc:
        import_paths([path], tmp_path / "store", fmt="paje")
    msg = str(exc.value)
    assert "native_paje.trace:1:" in msg and "PajeDefineContainerType" in msg and "Type" in msg
    # nothing half-written: no run holds rows
    runs = list((tmp_path / "store").glob("*/spans/*.parquet")) if (tmp_path / "store").exists() else []
    assert runs == []


def _rec(path: Path) -> list[dict[str, str]]:
    out, cur = [], {}
    for line in path.read_text().splitlines():
        if not line.strip():
            if cur:
                out.append(cur)
            cur = {}
            continue
        k, _, v = line.partition(":")
        cur[k.strip()] = v.strip()
    if cur:
        out.append(cur)
    return out


def test_starpu_demo_agrees_with_starpu_tasks_rec(shared_data, tmp_path):
    """Same tasks, same workers, same start/end times (StarPU writes both in ms; tolerance 1 ns)."""
    demo = shared_data / "paje" / "starpu-demo"
    records = _rec(demo / "tasks.rec")
    # the 36 scal/axpy tasks ran on a worker; the 8 starpu_data_unregister records are ghost tasks that
    # never execute (no WorkerId, StartTime or EndTime)
    tasks = [t for t in records if "StartTime" in t]
    assert len(tasks) == 36 and all(t["Name"] == "starpu_data_unregister" for t in records if t not in tasks)
    _, run = imported(demo / "paje.trace", tmp_path / "store")
    spans = run.sql("""SELECT s.name, s.start_ns, s.end_ns, json_extract_string(s.attrs, '$.JobId') AS job,
                              r.name AS worker
                       FROM spans s JOIN resources r USING (resource_id)
                       WHERE json_extract_string(s.attrs, '$.JobId') IS NOT NULL""")
    assert len(spans) == len(tasks)
    by_job = {int(r["job"]): r for _, r in spans.iterrows()}
    assert set(by_job) == {int(t["JobId"]) for t in tasks}
    for t in tasks:
        s = by_job[int(t["JobId"])]
        assert s["name"] == t["Name"]
        assert s["worker"] == f"CPU{t['WorkerId']}"
        assert abs(s["start_ns"] - round(float(t["StartTime"]) * 1e6)) <= 1
        assert abs(s["end_ns"] - round(float(t["EndTime"]) * 1e6)) <= 1, (t, s)
    run.close()


def _spans(run) -> list[tuple]:
    df = run.sql("SELECT resource_id, kind, name, start_ns, end_ns, task_key FROM spans")
    return sorted(tuple(None if v is None or pd.isna(v) else v for v in row) for row in df.itertuples(index=False))


def _export_origin(path: Path) -> int:
    first = path.read_text().split("\n", 1)[0]
    return int(re.search(r"time_origin_ns=(-?\d+)", first).group(1))


def _as_exported(records: list[tuple]) -> list[tuple]:
    """What of a record the Paje exporter keeps: a state's type is its span kind (plus a lane) and its
    imbrication its lane's, a link's type and value are "transfer" and the transfer's kind, a variable's
    type is ``namespace:name``, the imported root container's type its kind "root"; containers, times, state
    values, events and variable values are kept."""
    out = []
    for r in records:
        if r[0] == "State":
            out.append(("State", r[1], r[3], r[4], r[6]))
        elif r[0] == "Link":
            out.append(("Link", r[3], r[4], r[6], r[7]))
        elif r[0] == "Variable":
            out.append(("Variable", r[1], r[2].removeprefix("paje:"), *r[3:]))
        elif r[0] == "Container" and r[1:3] == ("0", "root") and r[5] == "0":
            out.append(("Container", "0", "0", *r[3:]))  # the imported root: type "0" written as kind "root"
        else:
            out.append(r)
    return out


@needs_pj_dump
@pytest.mark.parametrize("rel", VALID)
def test_round_trip_of_an_imported_run(shared_data, tmp_path, rel):
    """import -> export -> pj_dump gives pj_dump's records of the original trace (plus the export's own
    implicit root container), and importing the export gives the same rows."""
    path = shared_data / "paje" / rel
    res, run = imported(path, tmp_path / "a")
    out, counts = export_run(res.run_dir, "paje", tmp_path / "out.paje")
    origin = _export_origin(out)
    assert origin == 0  # these traces have no negative times: the export keeps their clock
    rc, got, err = pj_records(out, 1e9)
    assert rc == 0, err
    unit_ns = 1e6 if res.files[0].meta["time_unit"] == "ms" else 1e9
    rc, want, err = pj_records(_reference(path, res, tmp_path), unit_ns)
    assert rc == 0, err
    roots = [r for r in got if r[0] == "Container" and r[1] == "0" and r[2] == "0" and r[5] == "0"]
    got.remove(max(roots, key=lambda r: float(r[4])))  # the export's implicit root
    assert_same_records(_as_exported(got), _as_exported(want), f"{rel} exported")
    assert counts["states"] == res.rows.get("spans", 0)
    assert counts["containers"] == res.rows.get("resources", 0)
    _, run2 = imported(out, tmp_path / "b")
    assert _spans(run2) == _spans(run)  # same resources, names, kinds, exact ns times
    assert sorted(run2.table("resources")["resource_id"]) == sorted(run.table("resources")["resource_id"])
    t1 = run.sql("SELECT src_resource_id, dst_resource_id, start_ns, end_ns FROM transfers ORDER BY ALL")
    t2 = run2.sql("SELECT src_resource_id, dst_resource_id, start_ns, end_ns FROM transfers ORDER BY ALL")
    assert t1.equals(t2)
    m1 = run.sql("SELECT resource_id, name, ts_ns, value FROM metrics ORDER BY ALL")
    m2 = run2.sql("SELECT resource_id, name, ts_ns, value FROM metrics ORDER BY ALL")
    assert m1.equals(m2)
    run.close()
    run2.close()


def _with_lines(src: Path, out: Path, after: str | None, lines: list[str]) -> Path:
    """A copy of a real trace with ``lines`` inserted after the line ``after`` (None: at the end)."""
    text = src.read_text().splitlines()
    i = len(text) if after is None else text.index(after) + 1
    out.write_text("\n".join(text[:i] + lines + text[i:]) + "\n")
    return out


@needs_pj_dump
@pytest.mark.parametrize("path_kind", ["line", "vectorised"])
def test_destroying_the_root_container_matches_pj_dump(shared_data, tmp_path, monkeypatch, path_kind):
    """SimGrid ends a trace by destroying its containers and then the root container "0". Destroying a
    container ends its children (pj_dump destroys recursively); a container destroyed twice is not an
    error for pj_dump. The root is a resource (id ``paje:0``, name "0", kind "root": Paje reserves the type
    name "0"), never one with an empty id,
    and the run exports to a trace pj_dump accepts and flowscope re-imports."""
    ms = shared_data / "paje" / "pajeng" / "ms.trace"
    cont = shared_data / "paje" / "pajeng" / "containers.trace"
    cases = {
        # the SimGrid shape: the root destroyed last
        "ms-root.trace": _with_lines(ms, tmp_path / "ms-root.trace", None, ["7 4.485137 0 0"]),
        # the root destroyed mid-trace (its children end with it), a container created after it, then the
        # root's child destroyed a second time
        "cont-root.trace": _with_lines(cont, tmp_path / "cont-root.trace", "7 0.760000000 PROCESS p2",
                                       ["7 1.000000000 0 0", '6 1.2 p4 PROCESS root "p4"']),
    }
    for name, path in cases.items():
        rc, want, err = pj_records(path, 1e9)
        assert rc == 0, err
        res, run = _import(path, tmp_path / f"s-{name}", path_kind == "vectorised", monkeypatch)
        if path_kind == "line":
            assert res.files[0].meta["read_path"] == "line simulator"
        elif name == "cont-root.trace":
            assert res.files[0].meta["read_path"] == "vectorised"
        assert_same_records(our_records(run), want, name)
        resources = run.table("resources")
        assert "" not in set(resources["resource_id"])
        root = resources[resources["resource_id"] == "paje:0"]
        assert len(root) == 1 and root.iloc[0]["kind"] == "root" and root.iloc[0]["name"] == "0"
        out, _ = export_run(res.run_dir, "paje", tmp_path / f"{name}.paje")
        rc, _, err = pj_records(out, 1e9)
        assert rc == 0, err
        _, run2 = imported(out, tmp_path / f"b-{name}")
        assert sorted(run2.table("resources")["resource_id"]) == sorted(resources["resource_id"])
        assert _spans(run2) == _spans(run)
        run.close()
        run2.close()


def inc(x):
    return x + 1


def add(a, b):
    return a + b


@needs_pj_dump
def test_round_trip_of_a_real_dask_run(tmp_path):
    from dask import delayed
    from distributed import Client, LocalCluster

    from flowscope import observe

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        xs = [delayed(inc, pure=True)(i, dask_key_name=f"inc-{i}") for i in range(8)]
        ys = [delayed(add, pure=True)(xs[i], xs[(i + 3) % 8], dask_key_name=f"add-{i}") for i in range(8)]
        with observe(client, store=tmp_path / "store", name="paje-rt") as obs:
            client.compute(ys, sync=True)
    run = obs.run
    assert len(run.sql("SELECT * FROM spans WHERE kind = 'task'")) == 16
    out, counts = export_run(run.path, "paje", tmp_path / "dask.paje")
    rc, want, err = pj_dump(out)
    assert rc == 0, err
    assert want["states"] == counts["states"] == len(run.table("spans"))
    assert want["containers"] - 1 == counts["containers"]
    _, run2 = imported(out, tmp_path / "b")
    assert _spans(run2) == _spans(run)
    run2.close()


# ---- bad input: broken copies of real traces ----------------------------------------------------------------

def _err(path: Path, store: Path) -> str:
    with pytest.raises(TraceError) as exc:
        import_paths([path], store, fmt="paje")
    return str(exc.value)


def test_truncated_trace(shared_data, tmp_path):
    src = (shared_data / "paje" / "pajeng" / "states.trace").read_text()
    lines = src.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("12 0.86"))
    bad = tmp_path / "cut.trace"
    bad.write_text("\n".join(lines[:i]) + "\n" + lines[i][:8])  # cut mid-line
    msg = _err(bad, tmp_path / "s")
    assert f"cut.trace:{i + 1}:" in msg and "fields" in msg
    head = tmp_path / "cut-header.trace"
    head.write_text(src[: src.index("%EndEventDef")])  # cut inside the header
    msg = _err(head, tmp_path / "s2")
    assert "cut-header.trace:" in msg and "not closed" in msg


def test_wrong_typed_field(shared_data, tmp_path):
    lines = (shared_data / "paje" / "pajeng" / "variables.trace").read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("9 0.32"))
    lines[i] = lines[i].replace("3.000000", "three")
    bad = tmp_path / "wrong.trace"
    bad.write_text("\n".join(lines) + "\n")
    msg = _err(bad, tmp_path / "s")
    assert f"wrong.trace:{i + 1}:" in msg and "field Value" in msg and "'three'" in msg
    lines[i] = lines[i].replace("9 0.32", "9 zero.32")
    bad.write_text("\n".join(lines) + "\n")
    assert "field Time" in _err(bad, tmp_path / "s2")


def test_unknown_event_id_and_undefined_container(shared_data, tmp_path):
    lines = (shared_data / "paje" / "pajeng" / "events.trace").read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("20 2.43"))
    bad = tmp_path / "id.trace"
    bad.write_text("\n".join(lines[:i] + ["99" + lines[i][2:]] + lines[i + 1:]) + "\n")
    msg = _err(bad, tmp_path / "s")
    assert f"id.trace:{i + 1}:" in msg and "unknown event id '99'" in msg
    bad2 = tmp_path / "cont.trace"
    bad2.write_text("\n".join(lines[:i] + [lines[i].replace(" p1 ", " p9 ")] + lines[i + 1:]) + "\n")
    msg = _err(bad2, tmp_path / "s2")
    assert f"cont.trace:{i + 1}:" in msg and "field Container" in msg and "'p9'" in msg


@needs_pj_dump
def test_events_out_of_order_are_sorted_with_a_warning(shared_data, tmp_path):
    """Swap two state changes of one container: pj_dump refuses; flowscope warns and imports what the
    time-ordered trace holds."""
    path = shared_data / "paje" / "pajeng" / "states.trace"
    lines = path.read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("12 0.32"))
    lines[i], lines[i + 1] = lines[i + 1], lines[i]  # the pop at 0.53 now comes before the push at 0.32
    bad = tmp_path / "swapped.trace"
    bad.write_text("\n".join(lines) + "\n")
    rc, _, _ = pj_dump(bad)
    assert rc != 0
    res, run = imported(bad, tmp_path / "s")
    assert any("swapped.trace:" in w and "not time-ordered" in w for w in res.files[0].warnings)
    _, ref = imported(path, tmp_path / "t")
    assert _spans(run) == _spans(ref)
    run.close()
    ref.close()


@needs_pj_dump
def test_includes_are_read_in_place_and_cycles_warned(shared_data, tmp_path):
    # the pajeng sample includes itself: one warning naming the line, nothing else
    root = shared_data / "paje" / "pajeng" / "multiple_files" / "root.trace"
    res, run = imported(root, tmp_path / "s")
    assert any(re.search(r"root\.trace:\d+: PajeTraceFile includes root\.trace", w) for w in res.files[0].warnings)
    run.close()
    # states.trace split in two: its events moved to a file the first includes
    lines = (shared_data / "paje" / "pajeng" / "states.trace").read_text().splitlines()
    cut = next(n for n, line in enumerate(lines) if line.startswith("11 "))
    (tmp_path / "part2.trace").write_text("\n".join(lines[cut:]) + "\n")
    main = tmp_path / "main.trace"
    main.write_text("\n".join(["%EventDef PajeTraceFile 99", "% Filename string", "%EndEventDef"]
                              + lines[:cut] + ['99 "part2.trace"']) + "\n")
    res, run = imported(main, tmp_path / "s2")
    _, want, _ = pj_dump(shared_data / "paje" / "pajeng" / "states.trace")
    assert res.files[0].meta["paje_counts"]["states"] == want["states"] == 3
    spans = run.table("spans")
    assert sorted(spans["name"]) == ["Fim", "Inicio", "Meio"]
    # imbrication: Meio and Fim are pushed over Inicio, one level deep, with Inicio as parent
    inicio = spans[spans["name"] == "Inicio"].iloc[0]
    for name in ("Meio", "Fim"):
        row = spans[spans["name"] == name].iloc[0]
        assert row["parent_id"] == inicio["span_id"] and json.loads(row["attrs"])["depth"] == 1
    run.close()
