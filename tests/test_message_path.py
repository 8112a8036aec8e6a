"""The critical path through MPI messages and Scalasca's wait states, on an OTF2 archive whose path is known by
construction (written with the otf2 package's own writer) and on the real Score-P ping-pong."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import needs_tool, require_module

require_module("otf2", "the otf2 Python package reads and writes OTF2 archives: pip install -e '.[test]'")

from flowscope.analysis.message_path import LATE_RECEIVER, LATE_SENDER, message_path
from flowscope.analysis.summary import summarize
from flowscope.cli.output import fmt_ns
from flowscope.importers import import_paths
from flowscope.store.run import open_run

OTF2_PRINT = shutil.which("otf2-print")
needs_otf2_print = needs_tool("otf2-print", "otf2-tools")

# the planted run (ticks are ns): rank i computes W[i], sends to rank i+1, which entered its receive early
N = 4
W = [5_000, 3_000, 7_000, 2_000]       # own work of each rank between its receive and its send
RECV_AT = [None, 100, 200, 300]          # when ranks 1..3 enter MPI_Recv (long before the message leaves)
LAT = 400                                # a receive returns LAT after its sender entered MPI_Send
SEND = 50                                # an eager MPI_Send returns after SEND
SSEND_AT = 1_000                         # rank 0 enters a synchronous MPI_Ssend to rank 3 ...
LAT2 = 300                               # ... which returns LAT2 after rank 3 enters the matching MPI_Recv
TAIL = 600                               # rank 0's work after it


def _plan() -> dict:
    """Every call of every rank, and what the path and the waits must be."""
    send_at = [W[0]]
    for i in range(1, N - 1):
        send_at.append(send_at[i - 1] + LAT + W[i])
    calls: dict[int, list[tuple]] = {r: [] for r in range(N)}  # (region, enter, leave, event)
    calls[0].append(("compute", 0, W[0], None))
    calls[0].append(("MPI_Send", send_at[0], send_at[0] + SEND, ("send", 1, 10)))
    for i in range(1, N):
        calls[i].append(("compute", 0, RECV_AT[i], None))
        r_exit = send_at[i - 1] + LAT
        calls[i].append(("MPI_Recv", RECV_AT[i], r_exit, ("recv", i - 1, 10)))
        if i < N - 1:
            calls[i].append(("compute", r_exit, r_exit + W[i], None))
            calls[i].append(("MPI_Send", send_at[i], send_at[i] + SEND, ("send", i + 1, 10)))
    last_recv_exit = send_at[N - 2] + LAT
    r3 = last_recv_exit + W[N - 1]                       # rank 3 enters the receive of the synchronous send
    calls[N - 1].append(("compute", last_recv_exit, r3, None))
    calls[N - 1].append(("MPI_Recv", r3, r3 + LAT2 + 10, ("recv", 0, 20)))
    calls[0].append(("MPI_Ssend", send_at[0] + SSEND_AT, r3 + LAT2, ("send", N - 1, 20)))
    calls[0].append(("compute", r3 + LAT2, r3 + LAT2 + TAIL, None))
    end = r3 + LAT2 + TAIL
    # forward, relative to 0: rank 0's work, then each message and the next rank's work, then the
    # synchronous send's completion and rank 0's tail
    path = [("rank:0", 0, send_at[0], "compute")]
    for i in range(1, N):
        path.append((f"rank:{i}", send_at[i - 1], send_at[i - 1] + LAT, "transfer"))
        path.append((f"rank:{i}", send_at[i - 1] + LAT, send_at[i] if i < N - 1 else r3, "compute"))
    path.append(("rank:0", r3, r3 + LAT2, "transfer"))
    path.append(("rank:0", r3 + LAT2, end, "compute"))
    waits = {(LATE_SENDER, f"rank:{i}"): send_at[i - 1] - RECV_AT[i] for i in range(1, N)}
    waits[(LATE_RECEIVER, "rank:0")] = r3 - (send_at[0] + SSEND_AT)
    return {"calls": calls, "path": path, "waits": waits, "end": end}


def write_planted_archive(root: Path) -> Path:
    """N MPI ranks of one thread each, with the otf2 package's writer: main, compute, MPI_Send / MPI_Recv /
    MPI_Ssend regions with their MPI_SEND / MPI_RECV events on MPI_COMM_WORLD."""
    import otf2
    from otf2.enums import (
        GroupType,
        LocationGroupType,
        LocationType,
        Paradigm,
        RegionRole,
    )

    plan = _plan()
    with otf2.writer.open(str(root), timer_resolution=10**9) as trace:
        d = trace.definitions
        node = d.system_tree_node("node0", parent=d.system_tree_node("machine"))
        locs = []
        for r in range(N):
            lg = d.location_group(f"MPI Rank {r}", system_tree_parent=node,
                                  location_group_type=LocationGroupType.PROCESS)
            locs.append(d.location("Master thread", type=LocationType.CPU_THREAD, group=lg))
        d.group("COMM_LOCATIONS", group_type=GroupType.COMM_LOCATIONS, paradigm=Paradigm.MPI, members=locs)
        world = d.comm("MPI_COMM_WORLD", group=d.group("world", group_type=GroupType.COMM_GROUP,
                                                        paradigm=Paradigm.MPI, members=list(range(N))))
        regions = {"main": d.region("main", region_role=RegionRole.FUNCTION)}
        for name in ("compute", "MPI_Send", "MPI_Recv", "MPI_Ssend"):
            role = RegionRole.FUNCTION if name == "compute" else RegionRole.POINT2POINT
            regions[name] = d.region(name, region_role=role,
                                     paradigm=Paradigm.USER if name == "compute" else Paradigm.MPI)
        for r in range(N):
            w = trace.event_writer_from_location(locs[r])
            calls = sorted(plan["calls"][r], key=lambda c: c[1])
            last = max(c[2] for c in calls)
            w.enter(0, regions["main"])
            for name, enter, leave, ev in calls:
                w.enter(enter, regions[name])
                if ev is not None:
                    what, peer, tag = ev
                    if what == "send":
                        w.mpi_send(enter + 1, peer, world, tag, 4096)
                    else:
                        w.mpi_recv(leave - 1, peer, world, tag, 4096)
                w.leave(leave, regions[name])
            w.leave(last, regions["main"])
    return root / "traces.otf2"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    anchor = write_planted_archive(tmp_path_factory.mktemp("planted") / "archive")
    res = import_paths([anchor], tmp_path_factory.mktemp("planted-store"))
    run = open_run(res.run_dir)
    yield anchor, run
    run.close()


def _relative_steps(mp) -> list[tuple]:
    """The path's steps as (rank resource, start, end, component), times from the path's start."""
    t0 = mp.path.start_ns
    return [(r.location, int(r.start_ns - t0), int(r.end_ns - t0), r.component) for r in mp.path.steps.itertuples()]


def test_planted_late_senders_give_the_exact_path_and_wait_amounts(planted):
    _, run = planted
    mp = message_path(run.table("spans"), run.table("transfers"))
    plan = _plan()
    # the path is on the ranks' threads (otf2:loc:<rank>); name them by rank for the comparison
    rank_of = {f"otf2:loc:{r}": f"rank:{r}" for r in range(N)}
    got = [(rank_of[loc], s, e, c) for loc, s, e, c in _relative_steps(mp)]
    assert got == plan["path"]
    assert mp.path.length_ns == plan["end"]
    assert sum(mp.path.steps["duration_ns"]) == mp.path.length_ns
    # each step names the call it is in: the ranks' own work, the receives the late senders held, the Ssend
    assert list(mp.path.steps["application"]) == ["compute", "MPI_Recv", "compute", "MPI_Recv", "compute",
                                                   "MPI_Recv", "compute", "MPI_Ssend", "compute"]
    assert [rank_of[r] for r in mp.path.ids] == ["rank:0", "rank:1", "rank:2", "rank:3", "rank:0"]
    waits = {(w.kind, rank_of[w.resource_id]): int(w.wait_ns) for w in mp.waits.itertuples()}
    assert waits == plan["waits"]
    assert mp.wait_totals() == {
        LATE_SENDER: sum(v for (k, _), v in plan["waits"].items() if k == LATE_SENDER),
        LATE_RECEIVER: plan["waits"][(LATE_RECEIVER, "rank:0")]}
    # the eager sends returned before their receives were entered late: no late receiver there
    assert (mp.waits["kind"] == LATE_RECEIVER).sum() == 1


def test_message_path_is_in_the_run_summary(planted):
    """`flowscope show --json` gives the path through messages for a run without tasks."""
    _, run = planted
    cp = summarize(run).critical_path
    plan = _plan()
    assert cp["messages"]["length_ns"] == plan["end"]
    assert cp["messages"]["wait_ns"][LATE_SENDER] == sum(v for (k, _), v in plan["waits"].items()
                                                         if k == LATE_SENDER)
    assert cp["messages"]["wait_states"] == N


def _print_calls(anchor: Path) -> tuple[list[dict], int, int]:
    """Every point-to-point message of the archive from otf2-print: sender and receiver ranks, the enter and
    leave ticks of the calls around the MPI_SEND and MPI_RECV events, the message's tag and length."""
    out = subprocess.run([OTF2_PRINT, str(anchor)], capture_output=True, text=True, check=True).stdout
    defs = subprocess.run([OTF2_PRINT, "-G", str(anchor)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Ticks per Seconds: (\d+), Global Offset: (\d+)", defs)
    stack: dict[int, list[list]] = {}
    sends: dict[tuple, list] = {}
    recvs: dict[tuple, list] = {}
    for line in out.splitlines():
        e = re.match(r"^([A-Z_]+)\s+(\d+)\s+(\d+)\s*(.*)$", line)
        if not e:
            continue
        ev, loc, t, rest = e.group(1), int(e.group(2)), int(e.group(3)), e.group(4)
        if ev == "ENTER":
            stack.setdefault(loc, []).append([t, None])
        elif ev == "LEAVE":
            stack[loc].pop()[1] = t
        elif ev in ("MPI_SEND", "MPI_RECV"):
            peer = int(re.search(r"(?:Receiver|Sender): (\d+)", rest).group(1))
            tag = int(re.search(r"Tag: (\d+)", rest).group(1))
            key = (loc, peer, tag) if ev == "MPI_SEND" else (peer, loc, tag)
            (sends if ev == "MPI_SEND" else recvs).setdefault(key, []).append(stack[loc][-1])
    msgs = []
    for key, ss in sends.items():
        for s, r in zip(ss, recvs[key]):
            msgs.append({"src": key[0], "dst": key[1], "send": s, "recv": r})
    return msgs, int(m.group(1)), int(m.group(2))


@needs_otf2_print
def test_ping_pong_wait_states_follow_from_otf2_print(shared_data, tmp_path):
    """On the real ping-pong: each wait state is what the definitions give on otf2-print's enter/leave
    times of the calls around each message, and the path covers the span of the ranks that exchanged them."""
    anchor = shared_data / "otf2" / "ping-pong-otf2" / "traces.otf2"
    res = import_paths([anchor], tmp_path / "store")
    run = open_run(res.run_dir)
    mp = message_path(run.table("spans"), run.table("transfers"))
    msgs, res_, off = _print_calls(anchor)

    def ns(t):
        return (t - off) * 10**9 // res_

    want = {}
    for m in msgs:
        (se, sx), (re_, rx) = m["send"], m["recv"]
        if min(se, rx) > re_:                     # late sender: the receive was entered first
            want[(LATE_SENDER, m["dst"], ns(re_))] = ns(min(se, rx)) - ns(re_)
        if re_ > se and sx > re_:                 # late receiver: the (blocking) send still ran
            want[(LATE_RECEIVER, m["src"], ns(se))] = ns(re_) - ns(se)
    got = {(w.kind, int(w.resource_id.split(":")[-1]), int(w.start_ns)): int(w.wait_ns)
           for w in mp.waits.itertuples()}
    assert got == want and len(got) > 0
    assert {k for k, *_ in want} == {LATE_SENDER, LATE_RECEIVER}  # the pong waits both ways
    spans = run.table("spans")
    assert mp.path.end_ns == spans["end_ns"].max()
    assert mp.path.length_ns == sum(mp.path.steps["duration_ns"])
    assert (mp.path.steps["start_ns"].iloc[1:].to_numpy() == mp.path.steps["end_ns"].iloc[:-1].to_numpy()).all()
    # a rank's own time is split by the innermost call running: each such step lies inside a span of that name
    for st in mp.path.steps[mp.path.steps["kind"] == "RUN"].itertuples():
        inside = spans[(spans["resource_id"] == st.location) & (spans["name"] == st.application)
                       & (spans["start_ns"] <= st.start_ns) & (spans["end_ns"] >= st.end_ns)]
        assert len(inside), st
    assert "MPI_Init" in set(mp.path.steps["application"])  # 0.4 s of the path is MPI_Init on both ranks
    assert json.loads(json.dumps(summarize(run).critical_path))["messages"]["messages"] == len(msgs)
    run.close()


def test_flowscope_show_prints_the_message_path_and_its_wait_states(planted):
    """`flowscope show` on an MPI run without tasks: one line for the path through messages and its waits;
    --json has it under critical_path.messages."""
    import sys

    _, run = planted
    text = subprocess.run([sys.executable, "-m", "flowscope", "show", str(run.path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert text.returncode == 0, text.stderr
    plan = _plan()
    out = " ".join(text.stdout.split())  # the console wraps long lines
    line = out[out.index("critical path through messages"):]
    late_s = sum(v for (k, _), v in plan["waits"].items() if k == LATE_SENDER)
    late_r = plan["waits"][(LATE_RECEIVER, "rank:0")]
    assert line.startswith(f"critical path through messages: {fmt_ns(plan['end'])} through {N} of the {N} messages "
                           f"between {N} resources; {N} wait states: late sender {fmt_ns(late_s)}, late receiver "
                           f"{fmt_ns(late_r)}")
    js = subprocess.run([sys.executable, "-m", "flowscope", "show", str(run.path), "--json"], capture_output=True,
                        text=True, timeout=120, check=True)
    cp = json.loads(js.stdout)["critical_path"]
    assert cp["messages"]["length_ns"] == plan["end"]
    # the run has no tasks: the task-graph path runs over each rank's outermost spans, beside the message path
    assert cp["units"] == "outermost spans"


def test_report_draws_the_message_path_and_the_wait_states_in_chromium(planted, tmp_path):
    """The critical-path page of the planted MPI run's report (its pages file), opened in headless Chromium: the
    path's attribution chart is drawn, its length and messages are the planted ones, its steps and the waits per
    rank are listed with the planted amounts."""
    from test_report import open_view

    from flowscope.report import write_report

    _, run = planted
    plan = _plan()
    with open_view(write_report(run, tmp_path / "report.html"), "critical-path") as (pg, console, errors):
        pg.wait_for_function("() => { const d = document.getElementById('cp-messages-chart'); return d && d.calcdata; }")
        assert pg.evaluate("() => document.querySelectorAll('#cp-messages-chart .trace').length") > 0
        assert float(pg.locator("#cp-messages-length").get_attribute("data-value")) == plan["end"] / 1e9
        facts = pg.locator("#cp-messages-facts").inner_text()
        shown = pg.evaluate("() => flowscopeView.doc.message_path")
        text = pg.locator("#cp-messages").inner_text()
        waits = pg.evaluate("() => Array.from(document.querySelectorAll('#cp-messages table.waits tbody tr')).map(tr => "
                            "[tr.cells[0].textContent, tr.cells[1].textContent, Number(tr.cells[2].dataset.value), "
                            "Number(tr.cells[3].dataset.value)])")
        assert not errors and not [m for m in console if m[0] == "error"]
    assert f"over {N} messages" in facts and shown["vertices"] - 1 == N  # through all N of the N messages
    assert "MPI_Ssend" in text and "late-receiver" in text
    for (kind, rank), ns in plan["waits"].items():
        loc = f"otf2:loc:{rank.split(':')[1]}"
        assert [loc, kind, 1, ns / 1e9] in waits, (loc, kind, waits)
