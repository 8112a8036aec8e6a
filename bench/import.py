"""Import: ``flowscope import`` against each format's reference reader, whole processes, on real traces scaled up.

Every measurement is one process started from the shell as a user would: ``flowscope import FILE
--store DIR`` (start-up, imports, parsing, writing the run's Parquet segments) against the peer's own
command. Both run under ``/usr/bin/time`` (peak RSS of the process itself, ``%M``); wall time is taken
around the process. The commands of one case alternate, their order rotating every repetition;
figures are medians of ``--repeat`` (default 5) with min-max. Before anything is timed, one run of
each side is checked: the outputs must be equal (records, or counts where the peer gives only that).

Formats and inputs (``--format``; inputs are built once and kept under ``--cache``):

* ``paje`` -- real traces from ../shared/data/paje scaled to ``--size-mb`` each by
  ``bench/_paje_scale.py`` (K copies of every container, repeated in time; see there): ``starpu``
  (StarPU 1.3's demo: PajeSetState with 11 extra fields, tabs, entity values defined mid-trace, not
  time-ordered), ``native`` (StarPU's native_sample: time-ordered, push/pop and set states,
  variables), ``simgrid`` (SimGrid's ms.trace: Add/Sub variables and links). Peers: ``pj_dump -e
  1e15 FILE`` (pajeng; main peer) and ``pj_dump -o`` (its out-of-core mode, smallest memory). A trace
  that is not time-ordered must be sorted for pj_dump, so the peers read the time-sorted copy (the
  sorting not timed: the peer is favoured); ``starpu_paje_sort+pj_dump`` times what StarPU's tools do
  (the steps of StarPU's ``starpu_paje_sort``: the definitions first, the rest through ``sort -s -V
  -k2,2``, then ``pj_dump``). Check: every record equal to pj_dump's (an order-free digest per kind in
  DuckDB; variable values within pj_dump's single precision).
* ``chrome`` -- viztracer's multithread.json (X slices) and catapult's flow.json (B/E slices, flows)
  scaled by copies of every process and repetitions in time. Peer: ``orjson.loads`` then
  ``pandas.DataFrame`` of the events. Check: events per phase equal; spans = X + B events.
* ``wfcommons`` -- the cycles instance (662 tasks) copied into one workflow of ``--wf-tasks`` tasks.
  Peer: ``json.load`` and a ``networkx.DiGraph`` of the tasks (WfCommons' own ``Instance`` needs to
  download its schema at load time). Check: tasks and edges equal.
* ``otf2`` -- the Score-P ping-pong archive re-written with the ``otf2`` writer as ``--otf2-ranks``
  ranks (copies of its two ranks) repeated in time up to ``--otf2-events`` events. Peers: the
  ``otf2`` Python reader iterating every event (main) and ``otf2-print``. Check: events per type.
* ``darshan`` -- every Darshan log in ../shared/data/darshan (a folder of 47 real logs; Darshan logs
  cannot be scaled without a Darshan writer, which PyDarshan lacks). Peer: PyDarshan's
  ``DarshanReport(read_all=True)`` and every module's DataFrames. Check: DXT segments and logs equal.

``value`` is flowscope's median seconds on the case with the worst ratio to its main peer;
``shapes.<format>:<shape>`` has every case. Target (issue 13): Paje wall <= 1.5x pj_dump and peak RSS
<= 512 MB on every shape. Writes bench/results/import.json (DESIGN.md, "Benchmarks").

    python bench/import.py                                   # everything, 500 MB per Paje shape
    python bench/import.py --format paje --size-mb 50        # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, git_commit, write_result
from _paje_scale import scale as scale_paje

BENCH = "import"
TARGET_RATIO = 1.5
TARGET_RSS_MB = 512
RESULTS = Path(__file__).resolve().parent / "results" / f"{BENCH}.json"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FORMATS = ("paje", "chrome", "wfcommons", "otf2", "darshan")
PAJE_SHAPES = {"starpu": "paje/starpu-demo/paje.trace", "native": "paje/pajeng/native_sample.trace",
               "simgrid": "paje/pajeng/ms.trace"}
PAJE_PEERS = ("pj_dump", "pj_dump -o", "starpu_paje_sort+pj_dump")
CHROME_SHAPES = {"viztracer": "chrome/viztracer/multithread.json", "catapult": "chrome/catapult/flow.json"}
KINDS = {"Container": "containers", "State": "states", "Event": "events", "Link": "links", "Variable": "variables"}


class BenchError(RuntimeError):
    """The benchmark could not run, or the two sides disagree."""


# ---- running one process ------------------------------------------------------------------------
def measure(argv: list[str], stdout: Path | None = None, shell: bool = False) -> dict:
    """Run ``argv`` once under /usr/bin/time: wall seconds, peak RSS (MB) and CPU seconds of the process."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        cmd = ["/usr/bin/time", "-o", tf.name, "-f", "%M %U %S"]
        cmd += ["bash", "-c", argv[0]] if shell else argv
        with open(stdout or os.devnull, "wb") as out:
            t0 = time.perf_counter()
            p = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, check=False)
            wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise BenchError(f"{' '.join(map(str, argv))[:300]} failed (exit {p.returncode}):\n"
                             f"{p.stderr.decode(errors='replace')[-3000:]}")
        rss_kb, user, sys_ = tf.read().split()[-3:]
    return {"seconds": wall, "peak_rss_mb": int(rss_kb) / 1024, "cpu_seconds": float(user) + float(sys_)}


def flowscope_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("flowscope")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "flowscope.cli.main"]


@dataclass
class Case:
    """One input: flowscope's command, the peers' commands, and the check that their outputs agree."""

    fmt: str
    shape: str
    inputs: dict
    path: Path
    peers: dict[str, list[str]]  # name -> argv (a one-element list is run by bash when in ``shell``)
    main_peer: str
    check: Callable[[Path], dict]
    shell: set[str] = field(default_factory=set)
    import_args: list[str] = field(default_factory=list)

    def ours(self, store: Path) -> list[str]:
        return [*flowscope_cmd(), "import", str(self.path), *self.import_args, "--store", str(store), "--json"]


def run_case(case: Case, repeat: int, scratch: Path, partial: Path | None = None) -> dict:
    """Check the outputs once, then time flowscope and the peers alternately (each repetition's runs are
    written to ``partial`` as they come, so an interrupted benchmark keeps what it measured)."""
    store = scratch / "check-store"
    shutil.rmtree(store, ignore_errors=True)
    out = scratch / "check.json"
    measure(case.ours(store), stdout=out)
    run_dir = Path(json.loads(out.read_text())["run_dir"])
    print(f"{case.fmt}:{case.shape}: checking outputs", file=sys.stderr)
    checked = case.check(run_dir)
    shutil.rmtree(store, ignore_errors=True)
    names = ["flowscope", *case.peers]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(repeat):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            if name == "flowscope":
                store = scratch / f"store-{rep}"
                r = measure(case.ours(store))
                shutil.rmtree(store, ignore_errors=True)
            else:
                r = measure(case.peers[name], shell=name in case.shell)
            runs[name].append(r)
            print(f"{case.fmt}:{case.shape} rep {rep + 1}/{repeat} {name}: {r['seconds']:.2f} s, "
                  f"{r['peak_rss_mb']:.0f} MB", file=sys.stderr)
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"case": f"{case.fmt}:{case.shape}", "input": case.inputs,
                                           "checked": checked, "repetitions_done": rep + 1, "runs": runs,
                                           "load_average": os.getloadavg()}, indent=1) + "\n")

    def summary(rs: list[dict]) -> dict:
        s = [r["seconds"] for r in rs]
        return {"seconds": round(statistics.median(s), 3), "spread": [round(min(s), 3), round(max(s), 3)],
                "seconds_all": [round(x, 3) for x in s],
                "cpu_seconds": round(statistics.median(r["cpu_seconds"] for r in rs), 3),
                "peak_rss_mb": round(max(r["peak_rss_mb"] for r in rs))}

    ours = summary(runs["flowscope"])
    peers = {n: summary(runs[n]) for n in case.peers}
    ratio = ours["seconds"] / peers[case.main_peer]["seconds"]
    return {"format": case.fmt, "shape": case.shape, "input": case.inputs, "flowscope": ours, "peers": peers,
            "main_peer": case.main_peer, "ratio_vs_peer": round(ratio, 3),
            "cpu_ratio_vs_peer": round(ours["cpu_seconds"] / max(1e-9, peers[case.main_peer]["cpu_seconds"]), 3),
            "checked": checked}


# ---- Paje ---------------------------------------------------------------------------------------
def _duck():
    import duckdb

    return duckdb.connect()


def paje_pj_digest(csv: Path, unit_ns: float) -> tuple[dict, object]:
    """pj_dump's records (``-l 9`` output) per kind: count and an order-free digest; the variables apart."""
    con = _duck()
    cols = ", ".join(f"'c{i}': 'VARCHAR'" for i in range(9))
    con.execute(f"""CREATE VIEW pj AS SELECT {', '.join(f'trim(c{i}) AS c{i}' for i in range(9))}
                    FROM read_csv('{csv}', delim=',', header=false, quote='', escape='', null_padding=true,
                                  auto_detect=false, strict_mode=false,
                                  columns={{{cols}}})""")
    ns = f"CAST(round(CAST(%s AS DOUBLE) * {unit_ns}) AS BIGINT)"
    q = {
        "containers": "SELECT hash(c1, c2, c6) FROM pj WHERE c0 = 'Container'",
        "states": f"SELECT hash(c1, c2, {ns % 'c3'}, {ns % 'c4'}, CAST(CAST(c6 AS DOUBLE) AS BIGINT), c7) "
                  f"FROM pj WHERE c0 = 'State'",
        "events": f"SELECT hash(c1, c2, {ns % 'c3'}, c4) FROM pj WHERE c0 = 'Event'",
        "links": f"SELECT hash(c1, c2, {ns % 'c3'}, {ns % 'c4'}, c6, c7, c8) FROM pj WHERE c0 = 'Link'",
        "variables": f"SELECT hash(c1, c2, {ns % 'c3'}, {ns % 'c4'}) FROM pj WHERE c0 = 'Variable'",
    }
    out = {k: tuple(con.execute(f"SELECT count(*), coalesce(sum(CAST(h AS HUGEINT)), 0)::VARCHAR "
                                f"FROM ({v}) t(h)").fetchone()) for k, v in q.items()}
    con.execute(f"CREATE TABLE pjc AS SELECT c1 AS parent, c2 AS ty, c6 AS name, CAST(c3 AS DOUBLE) * {unit_ns} AS t0, "
                f"CAST(c4 AS DOUBLE) * {unit_ns} AS t1 FROM pj WHERE c0 = 'Container'")
    con.execute(f"CREATE TABLE pjv AS SELECT c1 AS cont, c2 AS ty, {ns % 'c3'} AS ts, CAST(c6 AS DOUBLE) AS v "
                f"FROM pj WHERE c0 = 'Variable'")
    return out, con


def paje_our_digest(run_dir: Path, con) -> dict:
    """The run's rows as pj_dump's records (tests/test_paje.py, our_records), digested the same way."""
    def t(name: str) -> str:
        return f"read_parquet('{run_dir}/{name}/*.parquet', union_by_name=true)" \
            if any((run_dir / name).glob("*.parquet")) else None

    con.execute(f"CREATE TABLE res AS SELECT resource_id, kind, name, parent_id, start_ns, end_ns "
                f"FROM {t('resources')}")
    con.execute("""CREATE TABLE ourc AS SELECT coalesce(p.name, '0') AS parent,
                          CASE WHEN r.resource_id = 'paje:0' THEN '0' ELSE r.kind END AS ty, r.name AS name,
                          r.start_ns AS t0, r.end_ns AS t1 FROM res r LEFT JOIN res p ON p.resource_id = r.parent_id""")
    q = {"containers": "SELECT hash(parent, ty, name) FROM ourc"}
    if t("spans"):
        q["states"] = f"""SELECT hash(r.name, json_extract_string(s.attrs, '$.paje_type'), s.start_ns, s.end_ns,
                                      CAST(json_extract_string(s.attrs, '$.depth') AS BIGINT), s.name)
                          FROM {t('spans')} s JOIN res r USING (resource_id)"""
    if t("logs"):
        q["events"] = f"""SELECT hash(coalesce(r.name, '0'), g.category, g.ts_ns, g.message)
                          FROM {t('logs')} g LEFT JOIN res r USING (resource_id)"""
    if t("transfers"):
        q["links"] = f"""SELECT hash(json_extract_string(x.attrs, '$.container'), json_extract_string(x.attrs, '$.paje_type'),
                                     x.start_ns, x.end_ns, json_extract_string(x.attrs, '$.value'), a.name, b.name)
                         FROM {t('transfers')} x JOIN res a ON a.resource_id = x.src_resource_id
                         JOIN res b ON b.resource_id = x.dst_resource_id"""
    if t("metrics"):
        con.execute(f"""CREATE TABLE ourv AS SELECT r.name AS cont, m.name AS ty, m.ts_ns AS ts, m.value AS v,
                               coalesce(lead(m.ts_ns) OVER (PARTITION BY m.resource_id, m.namespace, m.name
                                                            ORDER BY m.ts_ns), r.end_ns) AS te
                        FROM {t('metrics')} m JOIN res r USING (resource_id)""")
        q["variables"] = "SELECT hash(cont, ty, ts, te) FROM ourv"
    out = {k: tuple(con.execute(f"SELECT count(*), coalesce(sum(CAST(h AS HUGEINT)), 0)::VARCHAR "
                                f"FROM ({v}) t(h)").fetchone()) for k, v in q.items()}
    for k in ("states", "events", "links", "variables"):
        out.setdefault(k, (0, "0"))
    return out


def paje_check(run_dir: Path, pj_input: Path, scratch: Path, minus_root_for: Path | None = None) -> dict:
    meta = json.loads((run_dir / "run.json").read_text())["imports"][0]["meta"]
    unit_ns = 1e6 if meta["time_unit"] == "ms" else 1e9
    csv = scratch / "pj_dump.csv"
    measure(["pj_dump", "-l", "9", "-e", "1e15", str(pj_input)], stdout=csv)
    theirs, con = paje_pj_digest(csv, unit_ns)
    ours = paje_our_digest(run_dir, con)
    if ours != theirs:
        bad = {k: {"flowscope": ours.get(k), "pj_dump": theirs.get(k)} for k in theirs if ours.get(k) != theirs.get(k)}
        raise BenchError(f"flowscope's records differ from pj_dump's: {bad}")
    # container times: pj_dump prints them with 6 significant digits only
    joined, cworst = con.execute("""SELECT count(*), coalesce(max(greatest(abs(o.t0 - p.t0), abs(o.t1 - p.t1))
                                           / greatest(1.0, abs(p.t0), abs(p.t1))), 0)
                                    FROM ourc o JOIN pjc p USING (parent, ty, name)""").fetchone()
    if cworst > 1e-5 or joined < theirs["containers"][0]:
        raise BenchError(f"container times differ from pj_dump's: {joined} joined, worst relative {cworst}")
    worst = 0.0
    if theirs["variables"][0]:
        worst = con.execute("""SELECT coalesce(max(abs(o.v - p.v) / greatest(1.0, abs(o.v), abs(p.v))), 0)
                               FROM ourv o JOIN pjv p USING (cont, ty, ts)""").fetchone()[0]
        joined = con.execute("SELECT count(*) FROM ourv o JOIN pjv p USING (cont, ty, ts)").fetchone()[0]
        if joined != theirs["variables"][0] or worst > 1e-6:
            raise BenchError(f"variable values differ from pj_dump's: {joined} joined, worst relative {worst}")
    csv.unlink()
    counts = {k: v[0] for k, v in theirs.items()}
    if meta.get("read_path") != "vectorised":
        raise BenchError(f"the vectorised path was not used: {meta.get('vectorised_path_not_used')}")
    return {"records_equal_pj_dump": True, "records": counts, "variable_values_max_rel_diff": worst,
            "read_path": meta["read_path"], "sorted_by_time": meta.get("sorted_by_time")}


def starpu_paje_sort_cmd(path: Path, scratch: Path) -> str:
    """The steps of StarPU's starpu_paje_sort on a copy, then pj_dump (what StarPU's own tests run)."""
    d = scratch / "sortwork"
    return (f"set -e; mkdir -p {d}; f={path}; "
            "get() { grep \"^%EventDef[ \t]$1\" $f | sed -e \"s/.*$1[ \t]*//\"; }; "
            "g=\"^\\\\(%\\\\|$(get PajeDefineContainerType) \\\\|$(get PajeDefineEventType) \\\\|"
            "$(get PajeDefineStateType) \\\\|$(get PajeDefineVariableType) \\\\|$(get PajeDefineLinkType) \\\\|"
            "$(get PajeDefineEntityValue) \\\\|$(get PajeCreateContainer) \\\\|$(get PajeAddVariable) \\\\)\"; "
            "g=${g//[ \t]/[ \t]}; "
            f"grep -e \"$g\" $f > {d}/start.trace; grep -e \"$g\" -v $f > {d}/end.trace || true; "
            f"sort -s -V --key=2,2 {d}/end.trace > {d}/endSorted.trace; "
            f"cat {d}/start.trace {d}/endSorted.trace > {d}/sorted.trace; rm -f {d}/start.trace {d}/end.trace "
            f"{d}/endSorted.trace; pj_dump -e 1e15 {d}/sorted.trace; rm -f {d}/sorted.trace")


def paje_cases(args: argparse.Namespace, scratch: Path) -> list[Case]:
    if shutil.which("pj_dump") is None:
        raise BenchError("pj_dump not found (apt-get install pajeng)")
    cases = []
    for shape in args.paje_shapes:
        src = args.data / PAJE_SHAPES[shape]
        d = args.cache / f"paje3-{shape}-{args.size_mb}mb-k{args.copies}"
        path, sorted_path, info_p = d / "trace.paje", d / "sorted.paje", d / "info.json"
        if not info_p.is_file():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            t0 = time.perf_counter()
            s = scale_paje(src, path, args.size_mb * 1_000_000, args.copies, sorted_path)
            info = {"source": PAJE_SHAPES[shape], "copies": s.copies, "repeats": s.repeats,
                    "same_containers_in_every_repeat": s.reuse_containers, "lines": s.lines,
                    "file_mb": round(s.bytes / 1e6, 1), "span": s.span, "jitter": s.jitter,
                    "generate_seconds": round(time.perf_counter() - t0, 1)}
            info_p.write_text(json.dumps(info, indent=2))
            print(f"paje:{shape}: generated {info}", file=sys.stderr)
        info = json.loads(info_p.read_text())
        ordered = _time_ordered(src)
        info["time_ordered"] = ordered
        pj_in = path if ordered else sorted_path
        peers = {"pj_dump": ["pj_dump", "-e", "1e15", str(pj_in)], "pj_dump -o": ["pj_dump", "-o", "-e", "1e15",
                                                                                  str(pj_in)]}
        shell = set()
        if not ordered:
            peers["starpu_paje_sort+pj_dump"] = [starpu_paje_sort_cmd(path, scratch)]
            shell.add("starpu_paje_sort+pj_dump")
        peers = {k: v for k, v in peers.items() if k in args.paje_peers}
        cases.append(Case("paje", shape, info, path, peers, "pj_dump",
                          lambda run_dir, _p=pj_in: paje_check(run_dir, _p, scratch), shell, ["--format", "paje"]))
    return cases


def _time_ordered(src: Path) -> bool:
    """Whether a real trace is time-ordered; its scaled copies are exactly when it is (copies are shifted by
    constants and merged by time)."""
    from flowscope.importers.paje import _split

    defs: dict[str, int | None] = {}
    cur, fields = None, []
    last = float("-inf")
    for line in src.read_text().splitlines():
        s = line.strip()
        if not s or s[0] == "#":
            continue
        if s[0] == "%":
            p = s[1:].split()
            if p and p[0] == "EventDef":
                cur, fields = p[2], []
            elif p and p[0] == "EndEventDef":
                defs[cur] = fields.index("Time") + 1 if "Time" in fields else None
            elif p:
                fields.append(p[0])
            continue
        toks = _split(s, str(src))
        i = defs.get(toks[0])
        if i is not None:
            t = float(toks[i])
            if t < last:
                return False
            last = t
    return True


# ---- Chrome -------------------------------------------------------------------------------------
def scale_chrome(src: Path, out: Path, target_bytes: int, copies: int) -> dict:
    """K copies of every process (pid + k * stride; flow and async ids made unique), repeated in time."""
    import orjson

    doc = orjson.loads(src.read_bytes())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    pids = [e["pid"] for e in events if isinstance(e.get("pid"), int)]
    stride = (max(pids) if pids else 0) + 1
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = (max(ts) - min(ts)) if ts else 0
    shift_r = int(span) + 1000
    one = sum(len(orjson.dumps(e)) + 2 for e in events)
    repeats = max(1, round(target_bytes / max(1, one * copies)))
    n = 0
    with open(out, "wb") as f:
        f.write(b'{"traceEvents": [\n')
        first = True
        for r in range(repeats):
            for k in range(copies):
                for e in events:
                    if e.get("ph") == "M" and r:
                        continue
                    e2 = dict(e)
                    if isinstance(e2.get("pid"), int):
                        e2["pid"] = e2["pid"] + k * stride
                    if isinstance(e2.get("ts"), (int, float)):
                        e2["ts"] = e2["ts"] + r * shift_r
                    if "id" in e2:
                        e2["id"] = f"{e2['id']}-{k}-{r}"
                    if "bind_id" in e2:
                        e2["bind_id"] = f"{e2['bind_id']}-{k}-{r}"
                    f.write((b"" if first else b",\n") + orjson.dumps(e2))
                    first = False
                    n += 1
        f.write(b"\n]}\n")
    return {"source_events": len(events), "copies": copies, "repeats": repeats, "events": n,
            "file_mb": round(out.stat().st_size / 1e6, 1)}


CHROME_PEER = """
import sys, orjson, pandas as pd
with open(sys.argv[1], "rb") as f:
    doc = orjson.loads(f.read())
df = pd.DataFrame(doc["traceEvents"] if isinstance(doc, dict) else doc)
print(df["ph"].value_counts().to_json())
"""


def chrome_check(run_dir: Path, path: Path, scratch: Path) -> dict:
    out = scratch / "chrome-peer.json"
    measure([sys.executable, "-c", CHROME_PEER, str(path)], stdout=out)
    theirs = json.loads(out.read_text())
    meta = json.loads((run_dir / "run.json").read_text())["imports"][0]
    ours = meta["meta"]["events_by_phase"]
    if {k: int(v) for k, v in ours.items()} != {k: int(v) for k, v in theirs.items()}:
        raise BenchError(f"events per phase differ: flowscope {ours}, pandas {theirs}")
    spans = meta["rows"].get("spans", 0)
    want = theirs.get("X", 0) + theirs.get("B", 0)
    if spans != want:
        raise BenchError(f"flowscope has {spans} spans, the events have {want} X and B")
    return {"events_by_phase_equal": True, "events_by_phase": theirs, "spans": spans, "rows": meta["rows"]}


def chrome_cases(args: argparse.Namespace, scratch: Path) -> list[Case]:
    cases = []
    for shape, rel in CHROME_SHAPES.items():
        d = args.cache / f"chrome-{shape}-{args.chrome_mb}mb"
        path, info_p = d / "trace.json", d / "info.json"
        if not info_p.is_file():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            info = {"source": rel, **scale_chrome(args.data / rel, path, args.chrome_mb * 1_000_000, 16)}
            info_p.write_text(json.dumps(info))
        info = json.loads(info_p.read_text())
        cases.append(Case("chrome", shape, info, path, {"orjson+pandas": [sys.executable, "-c", CHROME_PEER,
                                                                          str(path)]},
                          "orjson+pandas", lambda run_dir, _p=path: chrome_check(run_dir, _p, scratch),
                          import_args=["--format", "chrome"]))
    return cases


# ---- WfCommons ----------------------------------------------------------------------------------
WF_SOURCE = "wfinstances/cycles-chameleon-5l-2c-9p-001.json"
WF_PEER = """
import json, sys, networkx as nx
with open(sys.argv[1]) as f:
    inst = json.load(f)
spec, exe = inst["workflow"]["specification"], inst["workflow"].get("execution", {})
runs = {t["id"]: t for t in exe.get("tasks", [])}
g = nx.DiGraph()
for t in spec["tasks"]:
    g.add_node(t["id"], **runs.get(t["id"], {}))
for t in spec["tasks"]:
    g.add_edges_from((p, t["id"]) for p in t.get("parents", []))
    g.add_edges_from((t["id"], c) for c in t.get("children", []))
print(json.dumps({"tasks": g.number_of_nodes(), "edges": g.number_of_edges()}))
"""


def scale_wfcommons(src: Path, out: Path, tasks: int) -> dict:
    """Copies of the workflow side by side in one instance: task and file ids suffixed ``@k``."""
    inst = json.loads(src.read_text())
    spec, exe = inst["workflow"]["specification"], inst["workflow"]["execution"]
    k = max(1, round(tasks / len(spec["tasks"])))

    def ren(x: str, i: int) -> str:
        return f"{x}@{i}"

    new_tasks, new_files, new_exe = [], [], []
    for i in range(k):
        for t in spec["tasks"]:
            new_tasks.append({**t, "id": ren(t["id"], i), "name": ren(t["name"], i),
                              "parents": [ren(p, i) for p in t.get("parents", [])],
                              "children": [ren(c, i) for c in t.get("children", [])],
                              "inputFiles": [ren(f, i) for f in t.get("inputFiles", [])],
                              "outputFiles": [ren(f, i) for f in t.get("outputFiles", [])]})
        new_files += [{**f, "id": ren(f["id"], i)} for f in spec.get("files", [])]
        new_exe += [{**t, "id": ren(t["id"], i)} for t in exe["tasks"]]
    inst["workflow"]["specification"] = {"tasks": new_tasks, "files": new_files}
    inst["workflow"]["execution"] = {**exe, "tasks": new_exe}
    out.write_text(json.dumps(inst))
    return {"source": WF_SOURCE, "copies": k, "tasks": len(new_tasks), "files": len(new_files),
            "file_mb": round(out.stat().st_size / 1e6, 1)}


def wfcommons_check(run_dir: Path, path: Path, scratch: Path) -> dict:
    out = scratch / "wf-peer.json"
    measure([sys.executable, "-c", WF_PEER, str(path)], stdout=out)
    theirs = json.loads(out.read_text())
    rows = json.loads((run_dir / "run.json").read_text())["imports"][0]["rows"]
    ours = {"tasks": rows.get("spans", 0), "edges": rows.get("dependencies", 0)}
    if ours != theirs:
        raise BenchError(f"WfCommons: flowscope {ours}, networkx {theirs}")
    return {"tasks_and_edges_equal": True, **theirs, "rows": rows}


def wfcommons_cases(args: argparse.Namespace, scratch: Path) -> list[Case]:
    d = args.cache / f"wfcommons-{args.wf_tasks}"
    path, info_p = d / "instance.json", d / "info.json"
    if not info_p.is_file():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        info_p.write_text(json.dumps(scale_wfcommons(args.data / WF_SOURCE, path, args.wf_tasks)))
    info = json.loads(info_p.read_text())
    return [Case("wfcommons", "cycles", info, path, {"json+networkx": [sys.executable, "-c", WF_PEER, str(path)]},
                 "json+networkx", lambda run_dir: wfcommons_check(run_dir, path, scratch),
                 import_args=["--format", "wfcommons"])]


# ---- OTF2 ---------------------------------------------------------------------------------------
OTF2_SOURCE = "otf2/ping-pong-otf2/traces.otf2"
OTF2_PEER = """
import collections, json, sys, otf2
n = collections.Counter()
with otf2.reader.open(sys.argv[1]) as trace:
    for location, event in trace.events:
        n[type(event).__name__] += 1
print(json.dumps(n))
"""


def scale_otf2(src: Path, out_dir: Path, ranks: int, events: int) -> dict:
    """The archive's two ranks copied to ``ranks`` ranks (messages kept within each copied pair), repeated in
    time until about ``events`` events, written with the otf2 writer."""
    import otf2
    from otf2.enums import GroupFlag, GroupType, LocationType, Paradigm

    with otf2.reader.open(str(src)) as tr:
        clock = tr.definitions.clock_properties
        per_loc: dict[int, list] = {}
        locs = list(tr.definitions.locations)
        for loc, ev in tr.events:
            per_loc.setdefault(locs.index(loc), []).append(ev)
    base = min(ev.time for evs in per_loc.values() for ev in evs)
    span = max(ev.time for evs in per_loc.values() for ev in evs) - base + 1000
    n_src = sum(len(v) for v in per_loc.values())
    copies = max(1, ranks // len(locs))
    repeats = max(1, round(events / (n_src * copies)))
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    n = 0
    with otf2.writer.open(str(out_dir), "traces", timer_resolution=clock.timer_resolution) as trace:
        d = trace.definitions
        root = d.system_tree_node("machine")
        nranks = copies * len(locs)
        groups, writers, locations = [], [], []
        for r in range(nranks):
            node = d.system_tree_node(f"node {r // 16}", parent=root) if r % 16 == 0 else groups[-1].system_tree_parent
            g = d.location_group(f"MPI Rank {r}", system_tree_parent=node)
            groups.append(g)
            loc = d.location(f"Master thread {r}", type=LocationType.CPU_THREAD, group=g)
            locations.append(loc)
            writers.append(trace.event_writer_from_location(loc))
        members = locations
        world = d.group("MPI_COMM_WORLD", group_type=GroupType.COMM_LOCATIONS, paradigm=Paradigm.MPI,
                        group_flags=GroupFlag.NONE, members=members)
        comm_group = d.group("MPI_COMM_WORLD", group_type=GroupType.COMM_GROUP, paradigm=Paradigm.MPI,
                             group_flags=GroupFlag.NONE, members=list(range(nranks)))
        comm = d.comm("MPI_COMM_WORLD", comm_group)
        del world
        regions: dict[str, object] = {}

        def region(rg):
            r = regions.get(rg.name)
            if r is None:
                r = regions[rg.name] = d.region(rg.name, canonical_name=rg.canonical_name, paradigm=rg.paradigm,
                                                region_role=rg.region_role)
            return r

        for rep in range(repeats):
            for c in range(copies):
                for li, evs in per_loc.items():
                    w = writers[c * len(locs) + li]
                    for ev in evs:
                        t = ev.time - base + rep * span + c * 7
                        kind = type(ev).__name__
                        if kind == "Enter":
                            w.enter(t, region(ev.region))
                        elif kind == "Leave":
                            w.leave(t, region(ev.region))
                        elif kind == "MpiSend":
                            w.mpi_send(t, c * len(locs) + ev.receiver, comm, ev.msg_tag, ev.msg_length)
                        elif kind == "MpiRecv":
                            w.mpi_recv(t, c * len(locs) + ev.sender, comm, ev.msg_tag, ev.msg_length)
                        else:
                            continue
                        n += 1
    size = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    return {"source": OTF2_SOURCE, "ranks": copies * len(locs), "repeats": repeats, "events": n,
            "archive_mb": round(size / 1e6, 1)}


def otf2_check(run_dir: Path, path: Path, scratch: Path) -> dict:
    out = scratch / "otf2-peer.txt"
    measure(["otf2-print", str(path)], stdout=out)
    theirs: dict[str, int] = {}
    with open(out) as f:
        for line in f:
            w = line.split(" ", 1)[0]
            if w.isupper() and w.replace("_", "").isalpha():
                theirs[w] = theirs.get(w, 0) + 1
    out.unlink()
    imp = json.loads((run_dir / "run.json").read_text())["imports"][0]
    ours = imp["meta"]["event_counts"]
    if {k: v for k, v in ours.items() if v} != theirs:
        raise BenchError(f"OTF2 event counts: flowscope {ours}, otf2-print {theirs}")
    if imp["rows"].get("spans", 0) != theirs.get("ENTER", 0):
        raise BenchError(f"OTF2: {imp['rows'].get('spans')} spans for {theirs.get('ENTER')} ENTER events")
    return {"event_counts_equal_otf2_print": True, "event_counts": theirs, "rows": imp["rows"]}


def otf2_cases(args: argparse.Namespace, scratch: Path) -> list[Case]:
    d = args.cache / f"otf2-r{args.otf2_ranks}-e{args.otf2_events}"
    info_p = d / "info.json"
    if not info_p.is_file():
        info = scale_otf2(args.data / OTF2_SOURCE, d / "archive", args.otf2_ranks, args.otf2_events)
        info_p.write_text(json.dumps(info))
    info = json.loads(info_p.read_text())
    path = d / "archive" / "traces.otf2"
    return [Case("otf2", "ping-pong", info, path,
                 {"otf2 reader": [sys.executable, "-c", OTF2_PEER, str(path)], "otf2-print": ["otf2-print", str(path)]},
                 "otf2 reader", lambda run_dir: otf2_check(run_dir, path, scratch),
                 import_args=["--format", "otf2"])]


# ---- Darshan ------------------------------------------------------------------------------------
DARSHAN_PEER = """
import json, sys, pathlib, darshan
logs = sorted(pathlib.Path(sys.argv[1]).rglob("*.darshan"))
dxt = 0
for log in logs:
    rep = darshan.DarshanReport(str(log), read_all=True)
    for mod in rep.records:
        if mod in ("APMPI", "BG/Q"):  # PyDarshan 3.5's to_df() fails on these (KeyError 'counters')
            continue
        dfs = rep.records[mod].to_df()
        if mod.startswith("DXT_"):
            dxt += sum(len(r["read_segments"]) + len(r["write_segments"]) for r in dfs)
print(json.dumps({"logs": len(logs), "dxt_segments": dxt}))
"""


def darshan_check(run_dir: Path, folder: Path, scratch: Path) -> dict:
    out = scratch / "darshan-peer.json"
    measure([sys.executable, "-c", DARSHAN_PEER, str(folder)], stdout=out)
    theirs = json.loads(out.read_text())
    meta = json.loads((run_dir / "run.json").read_text())
    # io rows are DXT segments plus, per module record with counters, aggregate rows (attrs.aggregate): count
    # the segments, which is what PyDarshan's DXT records hold
    from flowscope.store.run import open_run
    segments = open_run(run_dir).sql(
        "SELECT count(*) AS n FROM io WHERE coalesce(json_extract(attrs, '$.aggregate')::BOOLEAN, false) = false")
    ours = {"logs": len(meta["imports"]), "dxt_segments": int(segments["n"].iloc[0])}
    if ours != theirs:
        raise BenchError(f"Darshan: flowscope {ours}, PyDarshan {theirs}")
    return {"logs_and_dxt_segments_equal": True, **theirs}


def darshan_cases(args: argparse.Namespace, scratch: Path) -> list[Case]:
    folder = args.data / "darshan"
    info = {"source": "darshan/ (every log)", "logs": len(list(folder.rglob("*.darshan"))),
            "folder_mb": round(sum(p.stat().st_size for p in folder.rglob("*.darshan")) / 1e6, 2)}
    return [Case("darshan", "shared-logs", info, folder,
                 {"pydarshan": [sys.executable, "-c", DARSHAN_PEER, str(folder)]}, "pydarshan",
                 lambda run_dir: darshan_check(run_dir, folder, scratch), import_args=["--format", "darshan"])]


# ---- main ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    p.add_argument("--paje-shapes", default=",".join(PAJE_SHAPES), help="Paje shapes to time")
    p.add_argument("--paje-peers", default=",".join(PAJE_PEERS),
                   help="Paje peers to time (pj_dump, the main peer, always is)")
    p.add_argument("--size-mb", type=int, default=500, help="size of each scaled Paje trace (default 500)")
    p.add_argument("--copies", type=int, default=64, help="container copies in a scaled Paje trace (default 64)")
    p.add_argument("--chrome-mb", type=int, default=300, help="size of each scaled Chrome trace (default 300)")
    p.add_argument("--wf-tasks", type=int, default=20_000, help="tasks of the scaled WfCommons instance")
    p.add_argument("--otf2-ranks", type=int, default=64, help="ranks of the scaled OTF2 archive")
    p.add_argument("--otf2-events", type=int, default=5_000_000, help="events of the scaled OTF2 archive")
    p.add_argument("--repeat", type=int, default=5, help="repetitions; figures are medians (default 5)")
    p.add_argument("--data", type=Path, default=DATA, help=f"the shared real traces (default {DATA})")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "flowscope-bench-import",
                   help="where scaled inputs are kept between runs")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    a = p.parse_args(argv)
    a.format = [f for f in a.format.split(",") if f]
    a.paje_shapes = [s for s in a.paje_shapes.split(",") if s]
    a.paje_peers = {"pj_dump", *(s for s in a.paje_peers.split(",") if s)}
    if a.paje_peers - set(PAJE_PEERS):
        p.error(f"unknown Paje peer: {', '.join(sorted(a.paje_peers - set(PAJE_PEERS)))}")
    unknown = set(a.format) - set(FORMATS) | set(a.paje_shapes) - set(PAJE_SHAPES)
    if unknown:
        p.error(f"unknown format or shape: {', '.join(sorted(unknown))}")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="flowscope-bench-import-"))
    builders = {"paje": paje_cases, "chrome": chrome_cases, "wfcommons": wfcommons_cases, "otf2": otf2_cases,
                "darshan": darshan_cases}
    results: dict[str, dict] = {}
    try:
        for fmt in args.format:
            for case in builders[fmt](args, scratch):
                results[f"{case.fmt}:{case.shape}"] = run_case(
                    case, args.repeat, scratch, args.output.with_name(f"{args.output.stem}.{case.fmt}-{case.shape}"
                                                                      ".partial.json"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    worst_key = max(results, key=lambda k: results[k]["ratio_vs_peer"])
    worst = results[worst_key]
    paje = [r for r in results.values() if r["format"] == "paje"]
    meets = bool(paje) and all(r["ratio_vs_peer"] <= TARGET_RATIO and r["flowscope"]["peak_rss_mb"] <= TARGET_RSS_MB
                               for r in paje)
    result = {
        "benchmark": BENCH, "metric": "import_seconds", "value": worst["flowscope"]["seconds"], "unit": "s",
        "target": f"Paje: <= {TARGET_RATIO} x pj_dump wall and <= {TARGET_RSS_MB} MB peak RSS on every shape",
        "meets_target": meets,
        "peers": {worst["main_peer"]: {"value": worst["peers"][worst["main_peer"]]["seconds"], "unit": "s"}},
        "ratio_vs_peer": worst["ratio_vs_peer"],
        "shapes": results,
        "params": {"worst_case": worst_key, "repeat": args.repeat, "size_mb": args.size_mb, "copies": args.copies,
                   "paje_peers": sorted(args.paje_peers),
                   "timing": "whole process, wall around it, peak RSS from /usr/bin/time %M; commands alternate",
                   "load_average": os.getloadavg(), "commit": git_commit(), "cpu": cpu_model()},
    }
    write_result(result, args.output)
    print("import: " + "; ".join(
        f"{k} flowscope {r['flowscope']['seconds']:.2f} s / {r['main_peer']} {r['peers'][r['main_peer']]['seconds']:.2f} s"
        f" = {r['ratio_vs_peer']:.2f}x, peak {r['flowscope']['peak_rss_mb']} MB vs "
        f"{r['peers'][r['main_peer']]['peak_rss_mb']} MB" for k, r in results.items())
        + f"; target met: {meets}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
