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


@needs_pj_dump
@pytest.mark.parametrize("rel", VALID)
def test_counts_equal_pj_dump(shared_data, tmp_path, rel):
    path = shared_data / "paje" / rel
    assert detect_format(path) == "paje"
    res, run = imported(path, tmp_path / "store")
    got = res.files[0].meta["paje_counts"]
    rows = res.rows
    # the counts are the rows really written
    assert got["containers"] == rows.get("resources", 0)
    assert got["states"] == rows.get("spans", 0)
    assert got["events"] == rows.get("logs", 0)
    assert got["links"] == rows.get("transfers", 0)
    assert got["variables"] == rows.get("metrics", 0)
    unordered = any("not time-ordered" in w for w in res.files[0].warnings)
    ref = path
    if unordered:
        # pj_dump simulates file order; flowscope the time-sorted trace: compare with pj_dump on that
        ref = time_sorted_copy(path, tmp_path / "sorted.trace")
    rc, want, err = pj_dump(ref)
    assert rc == 0, err
    want["containers"] -= 1  # pj_dump lists its implicit root container "0"; it is not a resource
    assert {k: got[k] for k in KINDS.values()} == {k: want.get(k, 0) for k in KINDS.values()}
    spans = run.table("spans")
    assert (spans["end_ns"] >= spans["start_ns"]).all()
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


@needs_pj_dump
@pytest.mark.parametrize("rel", ["starpu-demo/paje.trace", "pajeng/ms.trace", "pajeng/native_sample.trace"])
def test_round_trip_of_an_imported_run(shared_data, tmp_path, rel):
    res, run = imported(shared_data / "paje" / rel, tmp_path / "a")
    out, counts = export_run(res.run_dir, "paje", tmp_path / "out.paje")
    rc, want, err = pj_dump(out)
    assert rc == 0, err
    assert want["states"] == counts["states"] == res.rows.get("spans", 0)
    assert want["links"] == counts["links"] == res.rows.get("transfers", 0)
    assert want["events"] == counts["events"] == res.rows.get("logs", 0)
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
