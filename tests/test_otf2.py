"""The OTF2 importer on a real Score-P archive, checked against Debian's otf2-print."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from conftest import needs_tool, require_module

require_module("otf2", "the otf2 Python package reads OTF2 archives: pip install -e '.[test]'")

from flowscope import open_run  # noqa: E402
from flowscope.importers import TraceError, detect_format, import_paths, read_head  # noqa: E402
from flowscope.importers import otf2 as otf2_importer  # noqa: E402

OTF2_PRINT = shutil.which("otf2-print")
needs_otf2_print = needs_tool("otf2-print", "otf2-tools")


@pytest.fixture(scope="module")
def archive(shared_data) -> Path:
    return shared_data / "otf2" / "ping-pong-otf2" / "traces.otf2"


@pytest.fixture(scope="module")
def imported(archive, tmp_path_factory):
    res = import_paths([archive], tmp_path_factory.mktemp("otf2") / "store")
    return res, open_run(res.run_dir)


def otf2_print_events(anchor: Path) -> list[tuple[str, int, int, str]]:
    """(event, location, timestamp, rest) for every event line otf2-print prints."""
    out = subprocess.run([OTF2_PRINT, str(anchor)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"^([A-Z_]+)\s+(\d+)\s+(\d+)\s*(.*)$", line)
        if m:
            rows.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)))
    return rows


def test_sniff_claims_the_anchor_file_only(archive):
    assert detect_format(archive) == "otf2"
    for other in ("traces.def", "traces/0.evt", "traces/0.def", "MANIFEST.md"):
        f = archive.parent / other
        assert not otf2_importer.sniff(f, read_head(f)), other


@needs_otf2_print
def test_event_counts_by_type_equal_otf2_print(archive, imported):
    res, run = imported
    ref = Counter(e for e, *_ in otf2_print_events(archive))
    meta = res.files[0].meta
    assert meta["event_counts"] == dict(ref)
    counts = run.counts()
    assert counts["spans"] == ref["ENTER"] == ref["LEAVE"]
    assert counts["transfers"] == ref["MPI_SEND"] + ref.get("MPI_ISEND", 0)
    assert meta["messages_unmatched_sends"] == meta["messages_unmatched_receives"] == 0


@needs_otf2_print
def test_spans_nest_and_times_follow_the_clock_properties(archive, imported):
    _, run = imported
    events = otf2_print_events(archive)
    defs = subprocess.run([OTF2_PRINT, "-G", str(archive)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Ticks per Seconds: (\d+), Global Offset: (\d+)", defs)
    res, off = int(m.group(1)), int(m.group(2))
    spans = run.table("spans")
    # every ENTER of otf2-print is a span start on its location, at (t - offset) * 1e9 / resolution ns
    enters = sorted((loc, (t - off) * 10**9 // res, re.search(r'Region: "(.*)"', rest).group(1))
                    for e, loc, t, rest in events if e == "ENTER")
    got = sorted((int(r.split(":")[-1]), int(s), n)
                 for r, s, n in zip(spans["resource_id"], spans["start_ns"], spans["name"]))
    assert got == enters
    by_id = spans.set_index("span_id")
    for _, s in spans.iterrows():
        depth = json.loads(s["attrs"])["depth"]
        if pd.isna(s["parent_id"]):
            assert depth == 0
            continue
        p = by_id.loc[s["parent_id"]]
        assert p["resource_id"] == s["resource_id"]
        assert p["start_ns"] <= s["start_ns"] and s["end_ns"] <= p["end_ns"]
        assert json.loads(p["attrs"])["depth"] == depth - 1
    # exclusive time is derivable: a parent's own time = its duration minus its children's
    main = spans[spans["name"] == "int main(int, char**)"]
    assert len(main) == 2
    for _, m_ in main.iterrows():
        kids = spans[spans["parent_id"] == m_["span_id"]]
        assert len(kids) > 0
        assert 0 <= (m_["end_ns"] - m_["start_ns"]) - (kids["end_ns"] - kids["start_ns"]).sum()


@needs_otf2_print
def test_messages_pair_sends_with_receives_between_ranks(archive, imported):
    _, run = imported
    events = otf2_print_events(archive)
    sends = [(loc, int(re.search(r"Receiver: (\d+)", r).group(1)), int(re.search(r"Tag: (\d+)", r).group(1)),
              int(re.search(r"Length: (\d+)", r).group(1))) for e, loc, _, r in events if e == "MPI_SEND"]
    tr = run.table("transfers")
    got = sorted((int(s.split(":")[1]), int(d.split(":")[1]), json.loads(a)["tag"], int(n))
                 for s, d, a, n in zip(tr["src_resource_id"], tr["dst_resource_id"], tr["attrs"], tr["nbytes"]))
    assert got == sorted(sends)
    assert (tr["kind"] == "mpi").all()
    assert (tr["end_ns"] >= tr["start_ns"]).all()  # each receive completes after its send began
    res = run.table("resources").set_index("resource_id")
    assert res.loc["rank:0", "kind"] == "rank" and res.loc["rank:0", "parent_id"] == "host:quartz10"
    assert res.loc["otf2:loc:1", "parent_id"] == "rank:1"


def test_run_metadata_names_the_program_and_the_clock(imported):
    res, run = imported
    clock = res.files[0].meta["clock"]
    assert clock["anchor"] == "relative" and clock["timer_resolution"] > 0
    assert run.meta["start_ns"] == 0
    assert run.meta["end_ns"] == clock["trace_length"] * 10**9 // clock["timer_resolution"]
    assert run.meta["command"].endswith("ping-pong.otf2")


def _copy(archive: Path, dst: Path) -> Path:
    shutil.copytree(archive.parent, dst)
    for p in dst.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    return dst / archive.name


@pytest.mark.parametrize("victim,where", [("traces.otf2", "anchor"), ("traces.def", "definitions"),
                                          ("traces/0.evt", "0.evt")])
def test_truncated_archive_gives_one_clear_error_naming_the_file(archive, tmp_path, victim, where):
    anchor = _copy(archive, tmp_path / "copy")
    f = anchor.parent / victim
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    with pytest.raises(TraceError) as err:
        import_paths([anchor], tmp_path / "store", fmt="otf2")
    msg = str(err.value)
    assert str(anchor) in msg
    if where == "0.evt":
        assert "traces/0.evt" in msg and "location 0" in msg
    else:
        assert "not a readable OTF2 archive" in msg


# ---- metrics: an archive written with the otf2 package's own writer -------------------------------------

def _write_metric_archive(root: Path) -> Path:
    """Three processes of two threads each, recording a three-member metric class (UINT64, INT64, DOUBLE
    members, values different at every sample) and a one-member metric, with the otf2 package's writer."""
    import random

    import otf2
    from otf2.enums import MetricMode, MetricType, RecorderKind, Type

    rnd = random.Random(11)
    with otf2.writer.open(str(root), timer_resolution=1_000_000) as trace:
        d = trace.definitions
        node = d.system_tree_node("node01", parent=d.system_tree_node("machine"))
        papi = d.metric_class([
            d.metric_member("PAPI_TOT_CYC", "cycles", MetricType.PAPI, MetricMode.ACCUMULATED_START,
                            Type.UINT64, unit="#"),
            d.metric_member("PAPI_L2_DCM", "L2 data cache misses", MetricType.PAPI, MetricMode.ACCUMULATED_START,
                            Type.INT64, unit="#"),
            d.metric_member("power", "package power", MetricType.OTHER, MetricMode.ABSOLUTE_POINT, Type.DOUBLE,
                            unit="W")], recorder_kind=RecorderKind.CPU)
        temperature = d.metric("temperature", unit="C")
        work = d.region("work")
        for p in range(3):
            group = d.location_group(f"process {p}", system_tree_parent=node)
            for t in range(2):
                w = trace.event_writer(f"thread {t}", group=group)
                cycles = rnd.randrange(10**9, 10**12)
                for i in range(40):
                    ts = 1_000 + 100 * i + 10 * p + t
                    cycles += rnd.randrange(1, 10**7)
                    w.enter(ts, work)
                    w.metric(ts + 1, papi, [cycles, rnd.randrange(-10**6, 10**6), rnd.uniform(1.0, 300.0)])
                    w.metric(ts + 2, temperature, rnd.gauss(60.0, 15.0))
                    w.leave(ts + 50, work)
    return root / "traces.otf2"


def otf2_print_metrics(anchor: Path) -> list[tuple[int, int, str, str, str]]:
    """(location, tick, member name, type, printed value) for every metric value otf2-print prints."""
    out = []
    for event, loc, t, rest in otf2_print_events(anchor):
        if event == "METRIC":
            for name, typ, value in re.findall(r'\("([^"]*)" <\d+>; (\w+); ([^)]*)\)', rest):
                out.append((loc, t, name, typ, value))
    return out


def _same_value(value: float, typ: str, printed: str) -> bool:
    """otf2-print writes integers exactly and doubles with printf's %g."""
    return int(value) == int(printed) if typ in ("UINT64", "INT64") else f"{value:g}" == printed


def _check_metrics_against_otf2_print(anchor: Path, res) -> int:
    """Every metric row equals otf2-print's value for the same location, tick and member; returns the count."""
    ref = otf2_print_metrics(anchor)
    run = open_run(res.run_dir)
    clock = res.files[0].meta["clock"]
    base = run.table("metrics")
    m = base.assign(loc=base["resource_id"].str.split(":").str[-1].astype(int)).sort_values(
        ["loc", "ts_ns", "name"], kind="stable")
    assert len(m) == len(ref)

    def ns(tick: int) -> int:
        return run.meta["start_ns"] + (tick - clock["global_offset"]) * 10**9 // clock["timer_resolution"]

    expected = sorted(ref, key=lambda r: (r[0], ns(r[1]), f"otf2.{r[2]}"))
    for (loc, t, name, typ, printed), got in zip(expected, m.itertuples()):
        assert (got.loc, got.ts_ns, got.name) == (loc, ns(t), f"otf2.{name}")
        assert _same_value(got.value, typ, printed), (loc, t, name, got.value, printed)
    return len(ref)


@needs_otf2_print
def test_metric_values_equal_otf2_print_value_by_value(tmp_path):
    anchor = _write_metric_archive(tmp_path / "archive")
    res = import_paths([anchor], tmp_path / "store")
    assert _check_metrics_against_otf2_print(anchor, res) == 3 * 2 * 40 * 4
    m = open_run(res.run_dir).table("metrics")
    # every member varies over time, as written: no location holds one constant value per metric
    assert (m.groupby(["resource_id", "name"])["value"].nunique() == 40).all()
    assert m.groupby("resource_id")["name"].nunique().to_dict() == {f"otf2:loc:{i}": 4 for i in range(6)}


@needs_otf2_print
def test_the_real_archive_has_the_metrics_otf2_print_shows(archive, imported):
    # the ping-pong run was measured without PAPI, rusage or perf metrics (scorep.cfg beside it): otf2-print
    # shows no METRIC event there, so what this checks on a real archive is that none is invented or lost
    res, _ = imported
    assert _check_metrics_against_otf2_print(archive, res) == 0


@pytest.mark.parametrize("victim", ["traces.otf2", "traces.def", "traces/0.evt"])
def test_truncated_archive_through_the_cli_prints_only_flowscopes_one_line(archive, tmp_path, victim):
    """The OTF2 library's own diagnostics (C, on stderr) are folded into flowscope's one-line error."""
    import sys

    anchor = _copy(archive, tmp_path / "copy")
    f = anchor.parent / victim
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    out = subprocess.run([sys.executable, "-m", "flowscope", "import", str(anchor), "--store", str(tmp_path / "s")],
                         check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("flowscope import: error: ") and str(anchor) in lines[0]
    assert "[OTF2]" not in out.stderr
    assert "; the OTF2 library said: " in lines[0]  # what the library reported is kept, on that line
