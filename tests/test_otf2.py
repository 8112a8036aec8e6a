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
