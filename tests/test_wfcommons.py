"""The WfCommons importer against every real instance in shared/data/wfinstances, checked with a plain
json.load of the same file; and broken copies of real instances give errors naming file, task and field."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import networkx as nx
import pytest

import flowscope
from flowscope.analysis.critical_path import task_graph_paths
from flowscope.importers import TraceError, detect_format, import_paths
from flowscope.importers.wfcommons import parse_timestamp

# Every executedAt / createdAt string in the shared instances, with the instant it denotes, worked out
# by hand from the text (offset applied; no zone -> UTC; "MM-DD-YY" is WfCommons' month-first form).
# test_every_date_in_the_data_is_listed fails when a new instance brings a string not listed here.
DATES = {
    "2023-03-29T10:02:36-10:00": datetime(2023, 3, 29, 20, 2, 36, tzinfo=UTC),
    "2023-03-21T11:10:20-10:00": datetime(2023, 3, 21, 21, 10, 20, tzinfo=UTC),
    "2020-12-25T20:10:08+00:00": datetime(2020, 12, 25, 20, 10, 8, tzinfo=UTC),
    "20200413T165420+0000": datetime(2020, 4, 13, 16, 54, 20, tzinfo=UTC),
    "20200415T191457+0000": datetime(2020, 4, 15, 19, 14, 57, tzinfo=UTC),
    "20200408T154143+0000": datetime(2020, 4, 8, 15, 41, 43, tzinfo=UTC),
    "05-10-23T16:23:32Z": datetime(2023, 5, 10, 16, 23, 32, tzinfo=UTC),
    "12-19-20T21:31:53Z": datetime(2020, 12, 19, 21, 31, 53, tzinfo=UTC),
    "2023-03-29T20:02:41.814660+00:00": datetime(2023, 3, 29, 20, 2, 41, 814660, tzinfo=UTC),
    "2023-03-21T21:10:29.882550+00:00": datetime(2023, 3, 21, 21, 10, 29, 882550, tzinfo=UTC),
    "2020-12-30T02:24:13.540715": datetime(2020, 12, 30, 2, 24, 13, 540715, tzinfo=UTC),
    "2020-12-19T23:38:32.986156": datetime(2020, 12, 19, 23, 38, 32, 986156, tzinfo=UTC),
    "2023-05-10T16:36:06.775626": datetime(2023, 5, 10, 16, 36, 6, 775626, tzinfo=UTC),
    "2020-04-13T11:44:18.284754Z": datetime(2020, 4, 13, 11, 44, 18, 284754, tzinfo=UTC),
    "2020-04-15T14:10:56.847978Z": datetime(2020, 4, 15, 14, 10, 56, 847978, tzinfo=UTC),
    "2020-04-08T12:58:46.286994Z": datetime(2020, 4, 8, 12, 58, 46, 286994, tzinfo=UTC),
}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ns(dt: datetime) -> int:
    d = dt - EPOCH
    return (d.days * 86400 + d.seconds) * 10**9 + d.microseconds * 1000


# ---- the reference: what a plain json.load of the instance says -------------------------------
def reference(path: Path) -> dict:
    """Tasks (key -> runtime, machine, inputs, outputs), edges, files (id -> size) and dates of one instance."""
    doc = json.loads(path.read_text())
    wf = doc["workflow"]
    ref: dict = {"doc": doc, "tasks": {}, "edges": set(), "files": {}}
    if doc["schemaVersion"] == "1.5":
        runtime = {t["id"]: t for t in wf["execution"]["tasks"]}
        for t in wf["specification"]["tasks"]:
            e = runtime[t["id"]]
            ref["tasks"][t["id"]] = {"runtime": e["runtimeInSeconds"], "machines": e.get("machines") or [],
                                     "in": t["inputFiles"], "out": t["outputFiles"]}
            ref["edges"] |= {(p, t["id"]) for p in t["parents"]} | {(t["id"], c) for c in t["children"]}
        ref["files"] = {f["id"]: f["sizeInBytes"] for f in wf["specification"]["files"]}
        ref["executedAt"], ref["makespan"] = wf["execution"]["executedAt"], wf["execution"]["makespanInSeconds"]
        ref["machines"] = [m["nodeName"] for m in wf["execution"]["machines"]]
    else:  # 1.4: files inline, parents by task name
        assert doc["schemaVersion"] == "1.4"
        for t in wf["tasks"]:
            files = t["files"]
            ref["tasks"][t["name"]] = {"runtime": t["runtimeInSeconds"], "machines": [t["machine"]],
                                       "in": [f["name"] for f in files if f["link"] == "input"],
                                       "out": [f["name"] for f in files if f["link"] == "output"]}
            ref["edges"] |= {(p, t["name"]) for p in t["parents"]}
            ref["files"].update({f["name"]: f["sizeInBytes"] for f in files})
        ref["executedAt"], ref["makespan"] = wf["executedAt"], wf["makespanInSeconds"]
        ref["machines"] = [m["nodeName"] for m in wf["machines"]]
    return ref


def instances(shared: Path) -> list[Path]:
    found = sorted((shared / "wfinstances").glob("*.json")) + sorted((shared / "wfinstances").glob("schema-1.4/*.json"))
    assert len(found) >= 8, f"expected the 8 WfInstances samples in {shared / 'wfinstances'}, found {len(found)}"
    return found


@pytest.fixture(scope="module")
def imported(shared_data, tmp_path_factory) -> dict[Path, tuple[object, dict]]:
    """Each instance imported into its own run: path -> (run, reference)."""
    store = tmp_path_factory.mktemp("wfstore")
    out = {}
    for p in instances(shared_data):
        res = import_paths([p], store)
        assert [f.format for f in res.files] == ["wfcommons"], p
        out[p] = (flowscope.open_run(res.run_dir), reference(p))
    return out


# ---- counts and values equal the JSON's --------------------------------------------------------
def test_counts_equal_the_json(imported):
    versions = set()
    for p, (run, ref) in imported.items():
        versions.add(ref["doc"]["schemaVersion"])
        c = run.counts()
        assert c["spans"] == len(ref["tasks"]), p
        assert c["dependencies"] == len(ref["edges"]), p
        assert c["data_states"] == len(ref["files"]), p
        deps = run.table("dependencies")
        assert set(zip(deps.depends_on, deps.task_key)) == ref["edges"], p
        assert set(deps.graph_id) == {ref["doc"]["name"]}, p
        states = run.table("data_states")
        assert dict(zip(states.state_id, states.size_bytes)) == ref["files"], p
        assert run.meta["imports"][0]["warnings"] == [], p
    assert versions == {"1.4", "1.5"}


def test_runtimes_machines_and_attrs_equal_the_json(imported):
    for p, (run, ref) in imported.items():
        spans = run.table("spans")
        assert spans.task_key.is_unique and set(spans.task_key) == set(ref["tasks"]), p
        machines = set(ref["machines"])
        res = set(run.table("resources").resource_id)
        for key, start, end, rid, attrs in zip(spans.task_key, spans.start_ns, spans.end_ns, spans.resource_id,
                                               spans.attrs):
            t = ref["tasks"][key]
            a = json.loads(attrs)
            assert abs((end - start) - t["runtime"] * 1e9) <= 0.5, (p, key)
            assert a["runtime_s"] == t["runtime"] and a["time_source"] == "derived-asap", (p, key)
            assert rid in res, (p, key)
            if t["machines"]:
                assert rid == f"host:{t['machines'][0]}" and a["machine_source"] == "task", (p, key)
            else:  # no machine on the task: only single-machine instances are attributed, and say so
                assert len(machines) == 1 and rid == f"host:{next(iter(machines))}", (p, key)
                assert a["machine_source"] == "only-machine", (p, key)
        hosts = run.table("resources")
        assert set(hosts.host) == machines | {m for t in ref["tasks"].values() for m in t["machines"][:1]}, p
        assert set(hosts.kind) == {"host"}, p


def test_every_date_in_the_data_is_listed_and_parses_to_its_instant(shared_data):
    seen = set()
    for p in instances(shared_data):
        ref = reference(p)
        for raw in (ref["executedAt"], ref["doc"].get("createdAt")):
            assert raw in DATES, f"{p}: date {raw!r} not in the test's table; add it with its instant"
            seen.add(raw)
            assert parse_timestamp(raw).ns == _ns(DATES[raw]), raw
    forms = {parse_timestamp(s).form for s in seen}
    assert forms == {"iso8601", "iso8601-basic", "mm-dd-yy"}
    assert parse_timestamp("2020-12-30T02:24:13.540715").assumed_utc
    assert not parse_timestamp("05-10-23T16:23:32Z").assumed_utc
    with pytest.raises(ValueError, match="unrecognised date format"):
        parse_timestamp("yesterday at noon")


def test_run_time_bounds_and_flags(imported):
    for p, (run, ref) in imported.items():
        t0 = _ns(DATES[ref["executedAt"]])
        assert run.meta["start_ns"] == t0, p
        assert run.meta["end_ns"] == t0 + round(ref["makespan"] * 1e9), p
        assert run.meta["task_times"] == "durations-only" and run.meta["time_source"] == "derived-asap", p
        meta = run.meta["imports"][0]["meta"]
        assert meta["task_times"] == "durations-only" and meta["executed_at"] == ref["executedAt"], p
        assert meta["makespan_s"] == ref["makespan"] and meta["asap_makespan_s"] <= ref["makespan"], p
        assert meta["tasks"] == len(ref["tasks"]) and meta["edges"] == len(ref["edges"]), p
        wms = ref["doc"].get("runtimeSystem") or ref["doc"].get("wms")
        assert meta["wms"]["name"] == wms["name"] and meta["wms"]["version"] == wms["version"], p
        spans = run.table("spans")
        assert spans.start_ns.min() == t0, p


# ---- the derived schedule --------------------------------------------------------------------
def test_schedule_respects_dependencies_and_is_as_soon_as_possible(imported):
    for p, (run, ref) in imported.items():
        spans = run.table("spans").set_index("task_key")
        t0 = run.meta["start_ns"]
        parents: dict[str, set] = {k: set() for k in ref["tasks"]}
        for a, b in ref["edges"]:
            parents[b].add(a)
        for key, ps in parents.items():
            start = spans.at[key, "start_ns"]
            assert all(start >= spans.at[q, "end_ns"] for q in ps), (p, key)
            # not merely after: exactly when the last parent ended (or at executedAt), nothing invented
            assert start == max((spans.at[q, "end_ns"] for q in ps), default=t0), (p, key)
        # no task starts before its parents end, as one SQL over the run
        late = run.sql("select count(*) as n from dependencies d join spans c on c.task_key = d.task_key "
                       "join spans a on a.task_key = d.depends_on where c.start_ns < a.end_ns")
        assert int(late.n[0]) == 0, p


def test_derived_makespan_is_the_structural_critical_path(imported):
    """The schedule's length equals networkx's longest path through the DAG weighted by runtimes."""
    for p, (run, ref) in imported.items():
        g = nx.DiGraph()
        g.add_nodes_from(ref["tasks"])
        for a, b in ref["edges"]:
            g.add_edge(a, b, w=ref["tasks"][b]["runtime"])
        for k in [k for k in ref["tasks"] if g.in_degree(k) == 0]:  # a source vertex carries the roots' runtimes
            g.add_edge("__start__", k, w=ref["tasks"][k]["runtime"])
        longest = nx.dag_longest_path_length(g, weight="w")
        spans = run.table("spans")
        assert (spans.end_ns.max() - run.meta["start_ns"]) / 1e9 == pytest.approx(longest, rel=1e-9, abs=1e-6), p


def _nx_longest(ref: dict) -> float:
    """networkx's longest path through the instance's DAG weighted by its runtimes (seconds)."""
    g = nx.DiGraph()
    g.add_nodes_from(ref["tasks"])
    for a, b in ref["edges"]:
        g.add_edge(a, b, w=ref["tasks"][b]["runtime"])
    for k in [k for k in ref["tasks"] if g.in_degree(k) == 0]:
        g.add_edge("__start__", k, w=ref["tasks"][k]["runtime"])
    return nx.dag_longest_path_length(g, weight="w")


def _views(run) -> dict:
    """The critical-path and profile views of ``run``: what its report's (the pages file's) pages draw."""
    from flowscope.report.views import critical_path_view, json_safe, profile_view

    return {"critical-path": json_safe(critical_path_view(run)), "profile": json_safe(profile_view(run))}


@pytest.fixture(scope="module")
def reports(imported) -> dict[Path, dict]:
    """The views the report's pages draw, for each imported instance."""
    return {p: _views(run) for p, (run, _) in imported.items()}


def _show(run) -> dict:
    out = subprocess.run([sys.executable, "-m", "flowscope", "show", str(run.path), "--json"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_critical_path_is_the_structural_one_through_the_instances_dependencies(imported, reports):
    """Task times are derived (placed as soon as possible), not measured: no "measured" critical path is
    claimed; the structural one is the instance's longest runtime-weighted path (networkx), a chain of its
    own dependencies, as `flowscope show` and the report give it."""
    for p, (run, ref) in imported.items():
        spans = run.table("spans")
        tp = task_graph_paths(spans[spans["kind"] == "task"], run.table("dependencies"), run.table("transfers"))
        assert tp.timeline == "derived" and tp.measured is None, p
        longest = _nx_longest(ref)
        st = tp.structural
        assert st.length_ns / 1e9 == pytest.approx(longest, rel=1e-9, abs=1e-6), p
        assert all((a, b) in ref["edges"] for a, b in zip(st.ids[:-1], st.ids[1:])), (p, st.ids)
        assert sum(ref["tasks"][k]["runtime"] for k in st.ids) == pytest.approx(longest, rel=1e-9, abs=1e-6), p
        shown = _show(run)["critical_path"]
        assert shown["task_times"] == "derived" and shown["measured_ns"] is None, (p, shown)
        assert shown["structural_ns"] == st.length_ns and shown["structural_ids"] == st.ids, p
        # the critical-path page: the structural path (the page says the task times are derived), no measured one
        page = reports[p]["critical-path"]["task_path"]
        assert page["kind"] == "structural" and page["difference_s"] is None, p
        assert page["length_s"] == st.length_ns / 1e9 == page["structural_s"], p
        assert page["tasks"] == len(st.ids) and [x["id"] for x in page["steps"]] == st.ids[:len(page["steps"])], p


def test_structural_path_names_the_machine_each_task_ran_on(imported):
    """Each task step of the structural path says where the task ran: the host of the machine the instance names
    for it (or its only machine), the resource its span is on."""
    for p, (run, ref) in imported.items():
        spans = run.table("spans")
        st = task_graph_paths(spans[spans["kind"] == "task"], run.table("dependencies"), run.table("transfers")).structural
        steps = st.steps[st.steps["kind"] == "task"]
        machines = set(ref["machines"])
        want = [f"host:{(ref['tasks'][k]['machines'] or sorted(machines))[0]}" for k in steps["id"]]
        assert steps["location"].tolist() == want, (p, steps[["id", "location"]].head())


def _utilisation_from_json(ref: dict) -> float:
    """Task time over (cores of the machines the tasks ran on x the recorded makespan), from the JSON."""
    doc, wf = ref["doc"], ref["doc"]["workflow"]
    machines = wf["execution"]["machines"] if "execution" in wf else wf["machines"]
    cores = {m["nodeName"]: m["cpu"].get("coreCount", m["cpu"].get("count")) for m in machines}
    used = {t["machines"][0] if t["machines"] else next(iter(cores)) for t in ref["tasks"].values()}
    busy = sum(t["runtime"] for t in ref["tasks"].values())
    assert doc["schemaVersion"] in ("1.4", "1.5")
    return busy / (sum(cores[m] for m in used) * ref["makespan"])


def test_utilisation_is_task_time_over_cores_times_the_recorded_makespan(imported, reports):
    for p, (run, ref) in imported.items():
        want = _utilisation_from_json(ref)
        u = _show(run)["utilisation"]
        assert u["value"] == pytest.approx(want, rel=1e-9), (p, u)
        assert 0 < u["value"] <= 1, (p, u)
        assert u["makespan_ns"] == round(ref["makespan"] * 1e9), (p, u)
        # the profile page's utilisation of the run: the same, at most 100 %, over the run's recorded duration
        shown = reports[p]["profile"]["run_utilisation"]
        assert shown["value"] == pytest.approx(want, rel=1e-9) and 0 < shown["value"] <= 1, (p, shown)
        assert shown["over"] == "run" and shown["makespan_s"] == u["makespan_ns"] / 1e9, (p, shown)


def test_each_hosts_utilisation_is_over_the_recorded_makespan_and_never_above_its_cores(imported, reports):
    """Per host, as for the whole run: task time over the host's cores times the run's recorded makespan (the
    schedule's own extent is a placement's, not the run's), so the hosts' figures add up to the run's, weighted by
    capacity; a host whose recorded tasks take more than its cores hold over that time has no figure (it is over its
    capacity, and says so) rather than one above 100 %. The profile page's table shows the same."""
    from flowscope.analysis.summary import UTILISATION_SLACK, utilisation
    from flowscope.analysis.timeline import utilisation_by_resource

    for p, (run, ref) in imported.items():
        util = utilisation_by_resource(run)
        u = utilisation(run)
        makespan = round(ref["makespan"] * 1e9)
        assert (util["window_ns"] == makespan).all(), (p, util)
        known = util[util["slots"].notna()]
        for r in known.itertuples():
            fits = r.busy_ns <= r.slots * makespan * (1 + UTILISATION_SLACK)
            assert bool(r.over_capacity) == (not fits), (p, r)
            if fits:
                assert r.utilisation == pytest.approx(min(1.0, r.busy_ns / (r.slots * makespan)), rel=1e-12), (p, r)
            else:
                assert r.utilisation is None, (p, r)
        if u.value is not None:  # the hosts' busy time and capacity add up to the run's
            assert known["busy_ns"].sum() / (known["slots"].sum() * makespan) == pytest.approx(u.value, rel=1e-9), p
        table = reports[p]["profile"]["utilisation"]
        for row in table["rows"] if table else []:
            for cell in row[2:]:
                if cell.endswith(" %"):
                    assert float(cell[:-2].replace(",", "")) <= 100.0 * (1 + UTILISATION_SLACK), (p, row)
            assert row[2] == "over its slots" or row[2] == "unknown" or row[2].endswith(" %"), (p, row)


def test_utilisation_without_core_counts_says_unknown(shared_data, tmp_path):
    """A copy of a real instance whose machines do not give their cores: no number, the reason instead."""

    doc = json.loads((shared_data / "wfinstances" / "seismology-chameleon-1000p-001.json").read_text())
    for m in doc["workflow"]["execution"]["machines"][:2]:
        del m["cpu"]["coreCount"]
    bad = tmp_path / "no-cores.json"
    bad.write_text(json.dumps(doc))
    res = import_paths([bad], tmp_path / "store")
    run = flowscope.open_run(res.run_dir)
    u = _show(run)["utilisation"]
    assert u["value"] is None and "core count" in u["reason"] and "host:" in u["reason"], u
    # the profile page of its report: utilisation unknown, with the reason, drawn as such in chromium
    from test_report import open_view

    from flowscope.report import write_report

    shown = _views(run)["profile"]["run_utilisation"]
    assert shown["value"] is None and shown["reason"] == u["reason"], shown
    with open_view(write_report(run, tmp_path / "report.html"), "profile") as (pg, _console, errors):
        facts = pg.locator("#pf-utilisation-run").inner_text()
        assert not errors, errors
    assert "utilisation" in facts and "unknown" in facts and "core count" in facts, facts
    assert not re.search(r"\d %", facts), facts


# ---- the data-state graph --------------------------------------------------------------------
def test_data_state_graph_is_consistent(imported):
    for p, (run, ref) in imported.items():
        states = run.table("data_states").set_index("state_id")
        muts = run.table("mutations")
        assert set(muts.src_state_id) <= set(states.index) and set(muts.dst_state_id) <= set(states.index), p
        orphans = run.sql("select count(*) as n from mutations m left join data_states a on a.state_id = m.src_state_id "
                          "left join data_states b on b.state_id = m.dst_state_id "
                          "where a.state_id is null or b.state_id is null")
        assert int(orphans.n[0]) == 0, p
        assert muts.mutation_id.is_unique, p
        # each task: one mutation per (input, output) pair; its kind from how many inputs/outputs it has
        expected = 0
        spans = run.table("spans").set_index("task_key")
        for key, t in ref["tasks"].items():
            outs = set(t["out"])
            ins = set(t["in"]) - outs
            mine = muts[muts.application == key]
            assert len(mine) == len(ins) * len(outs), (p, key)
            expected += len(mine)
            if len(mine):
                want = "MERGE" if len(ins) > 1 else ("SPLIT" if len(outs) > 1 else "CONVERT")
                assert set(mine.kind) == {want}, (p, key)
                assert set(mine.src_state_id) == ins and set(mine.dst_state_id) == outs, (p, key)
            for f in outs:  # an output appears when its producer ends, where it ran
                assert states.at[f, "origin"] == key, (p, key, f)
                assert states.at[f, "ts_ns"] == spans.at[key, "end_ns"], (p, key, f)
        assert len(muts) == expected, p
        produced = {f for t in ref["tasks"].values() for f in t["out"]}
        for f in set(ref["files"]) - produced:  # workflow inputs: present when the run starts
            assert states.at[f, "ts_ns"] == run.meta["start_ns"] and states.at[f, "location"] == "shared-fs", (p, f)
        # time flows forward along every mutation
        back = run.sql("select count(*) as n from mutations m join data_states a on a.state_id = m.src_state_id "
                       "join data_states b on b.state_id = m.dst_state_id where b.ts_ns < a.ts_ns")
        assert int(back.n[0]) == 0, p


def test_mutation_rows_name_each_task_pair_in_order(imported):
    """Row for row: a task's pairs are numbered ``<task>#<n>`` inputs first (each input with every output, in
    the instance's order), and carry the task's key, group and time source."""
    for p, (run, ref) in imported.items():
        spans = run.table("spans").set_index("task_key")
        want = []
        for key, t in ref["tasks"].items():
            outs = list(dict.fromkeys(t["out"]))
            ins = [f for f in dict.fromkeys(t["in"]) if f not in outs]
            pairs = [(i, o) for i in ins for o in outs]
            group = json.loads(spans.at[key, "attrs"])["category"]
            want += [(f"{key}#{n}", i, o, key, {"task_key": key, "group": group, "time_source": "derived-asap"})
                     for n, (i, o) in enumerate(pairs)]
        muts = run.table("mutations")
        assert len(muts) == len(want), p
        got = [(m, s, d, a, json.loads(at)) for m, s, d, a, at in  # (DataFrame.attrs is pandas' own metadata)
               zip(muts["mutation_id"], muts["src_state_id"], muts["dst_state_id"], muts["application"], muts["attrs"])]
        assert sorted(got, key=lambda r: r[0]) == sorted(want, key=lambda r: r[0]), p


def test_detected_from_content_by_the_cli(shared_data, tmp_path):
    src = shared_data / "wfinstances" / "helloworld-chain-5-chameleon.json"
    renamed = tmp_path / "instance.data"  # no .json: detection must use the content
    renamed.write_bytes(src.read_bytes())
    assert detect_format(renamed) == "wfcommons"
    out = subprocess.run([sys.executable, "-m", "flowscope", "import", str(renamed), "--store", str(tmp_path / "s"),
                          "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    text = json.dumps(rows)
    ref = reference(src)
    for table, n in (("spans", len(ref["tasks"])), ("dependencies", len(ref["edges"])),
                     ("data_states", len(ref["files"]))):
        assert f'"{table}": {n}' in text, (table, text)
    for other in sorted((shared_data / "chrome").rglob("*.json"))[:20]:
        assert detect_format(other) != "wfcommons", other


# ---- bad input: broken copies of real instances ------------------------------------------------
def _import_error(path: Path, tmp_path: Path) -> str:
    with pytest.raises(TraceError) as exc:
        import_paths([path], tmp_path / "store", fmt="wfcommons")
    return str(exc.value)


def test_truncated_instance(shared_data, tmp_path):
    for name in ("blast-chameleon-small-001.json", "schema-1.4/epigenomics-chameleon-hep-1seq-100k-001.json"):
        data = (shared_data / "wfinstances" / name).read_bytes()
        for cut in (len(data) // 3, len(data) - 2):
            bad = tmp_path / f"cut-{cut}-{Path(name).name}"
            bad.write_bytes(data[:cut])
            msg = _import_error(bad, tmp_path)
            assert str(bad) in msg and "invalid JSON at line" in msg, msg


def _modified(shared_data: Path, tmp_path: Path, name: str, change) -> Path:
    doc = json.loads((shared_data / "wfinstances" / name).read_text())
    change(doc)
    out = tmp_path / Path(name).name
    out.write_text(json.dumps(doc))
    return out


def test_string_runtime_names_file_task_and_field(shared_data, tmp_path):
    def v15(doc):
        doc["workflow"]["execution"]["tasks"][3]["runtimeInSeconds"] = "12.5"

    bad = _modified(shared_data, tmp_path, "srasearch-chameleon-10a-001.json", v15)
    task = json.loads(bad.read_text())["workflow"]["execution"]["tasks"][3]["id"]
    msg = _import_error(bad, tmp_path)
    assert str(bad) in msg and repr(task) in msg and "runtimeInSeconds must be a number, got str" in msg, msg

    def v14(doc):
        doc["workflow"]["tasks"][5]["runtimeInSeconds"] = "fast"

    bad = _modified(shared_data, tmp_path, "schema-1.4/epigenomics-chameleon-hep-1seq-100k-001.json", v14)
    task = json.loads(bad.read_text())["workflow"]["tasks"][5]["name"]
    msg = _import_error(bad, tmp_path)
    assert str(bad) in msg and repr(task) in msg and "runtimeInSeconds" in msg, msg


def test_parent_that_does_not_exist_is_dropped_with_a_warning(shared_data, tmp_path):
    def change(doc):
        doc["workflow"]["specification"]["tasks"][2]["parents"].append("NO_SUCH_TASK")

    bad = _modified(shared_data, tmp_path, "blast-chameleon-small-001.json", change)
    task = json.loads(bad.read_text())["workflow"]["specification"]["tasks"][2]["id"]
    res = import_paths([bad], tmp_path / "store")
    warnings = res.files[0].warnings
    assert any(str(bad) in w and repr(task) in w and "'NO_SUCH_TASK'" in w for w in warnings), warnings
    ref = reference(shared_data / "wfinstances" / "blast-chameleon-small-001.json")
    assert res.rows["dependencies"] == len(ref["edges"])  # the real edges, not the dangling one


def test_other_broken_fields(shared_data, tmp_path):
    name = "helloworld-chain-5-chameleon.json"

    def cycle(doc):
        t = doc["workflow"]["specification"]["tasks"]
        t[0]["parents"].append(t[4]["id"])

    msg = _import_error(_modified(shared_data, tmp_path, name, cycle), tmp_path)
    assert "cycle" in msg, msg

    def date(doc):
        doc["workflow"]["execution"]["executedAt"] = "last tuesday"

    msg = _import_error(_modified(shared_data, tmp_path, name, date), tmp_path)
    assert "executedAt" in msg and "last tuesday" in msg, msg

    def size(doc):
        doc["workflow"]["specification"]["files"][1]["sizeInBytes"] = -5

    msg = _import_error(_modified(shared_data, tmp_path, name, size), tmp_path)
    f = json.loads((shared_data / "wfinstances" / name).read_text())["workflow"]["specification"]["files"][1]["id"]
    assert repr(f) in msg and "sizeInBytes must be >= 0" in msg, msg

    def no_exec(doc):
        doc["workflow"]["execution"]["tasks"].pop(2)

    bad = _modified(shared_data, tmp_path, name, no_exec)
    task = json.loads((shared_data / "wfinstances" / name).read_text())["workflow"]["execution"]["tasks"][2]["id"]
    msg = _import_error(bad, tmp_path)
    assert repr(task) in msg and "no entry in workflow.execution.tasks" in msg, msg


# ---- fuzz: mutated real instances give a TraceError or an import, never another exception ----------
FUZZ_EXAMPLES = int(__import__("os").environ.get("FLOWSCOPE_FUZZ_EXAMPLES", "600"))


def _read_only(path: Path) -> None:
    """Run the importer into a sink that conforms every batch but writes nothing."""
    from flowscope.importers import wfcommons
    from flowscope.importers.sink import ImportSink

    sink = ImportSink("fuzz", path, "wfcommons", lambda *a: None)
    wfcommons.read(path, sink)
    sink.flush()


def _json_paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _json_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:4]):  # the first few items of each list are enough to reach every field
            yield from _json_paths(v, (*prefix, i))


def test_fuzz_mutated_instances(shared_data, tmp_path):
    import hypothesis
    import hypothesis.strategies as st

    sources = [shared_data / "wfinstances" / "helloworld-chain-5-chameleon.json",
               shared_data / "wfinstances" / "schema-1.4" / "epigenomics-chameleon-hep-1seq-100k-001.json"]
    raws = [s.read_bytes() for s in sources]
    docs = [json.loads(r) for r in raws]
    paths = [[p for p in _json_paths(d) if p] for d in docs]
    target = tmp_path / "fuzz.json"
    counts = {"examples": 0, "errors": 0}
    extremes = st.sampled_from([float("nan"), float("inf"), -1, 2**70, 1e300, 1.5, "", "12", "9999-12-31T23:59:59Z"])
    values = st.one_of(extremes, st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                       st.text(max_size=12), st.just([]), st.just({}), st.lists(st.text(max_size=5), max_size=3))

    def run(data: bytes) -> None:
        target.write_bytes(data)
        counts["examples"] += 1
        try:
            _read_only(target)
        except TraceError as exc:
            assert str(target) in str(exc)
            counts["errors"] += 1

    @hypothesis.settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None)
    @hypothesis.given(which=st.integers(0, 1), cut=st.integers(0, 10**6),
                      flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4))
    def bytes_level(which, cut, flips):
        data = bytearray(raws[which][: cut % (len(raws[which]) + 1)] if cut % 3 == 0 else raws[which])
        for pos, b in flips:
            if data:
                data[pos % len(data)] = b
        run(bytes(data))

    @hypothesis.settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None)
    @hypothesis.given(which=st.integers(0, 1), pick=st.integers(0, 10**6), value=values, delete=st.booleans())
    def field_level(which, pick, value, delete):
        doc = json.loads(raws[which])
        where = paths[which][pick % len(paths[which])]
        parent = doc
        for k in where[:-1]:
            parent = parent[k]
        if delete and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = value
        run(json.dumps(doc).encode())

    bytes_level()
    field_level()
    assert counts["examples"] >= FUZZ_EXAMPLES  # hypothesis ran them all; every failure was a TraceError
    print(f"wfcommons fuzz: {counts['examples']} inputs, {counts['errors']} TraceErrors, no other exception")


def test_the_import_command_names_the_file_of_a_warning_once(shared_data, tmp_path, capsys):
    """`flowscope import` prints each warning after its file's path; a warning that already says where (the
    WfCommons and OTF2 importers name the file) is not prefixed a second time, and a name that looks like the
    console's markup is printed as it is."""
    from flowscope.cli.main import main as cli_main

    def change(doc):
        doc["workflow"]["specification"]["tasks"][2]["parents"].append("NO_SUCH_TASK[/b]")

    bad = _modified(shared_data, tmp_path, "blast-chameleon-small-001.json", change)
    assert cli_main(["import", str(bad), "--store", str(tmp_path / "store")]) == 0
    line = next(w for w in capsys.readouterr().err.splitlines() if "NO_SUCH_TASK" in w)  # one line: not wrapped
    assert line.startswith("warning ") and line.count(str(bad)) == 1 and "'NO_SUCH_TASK[/b]'" in line, line
