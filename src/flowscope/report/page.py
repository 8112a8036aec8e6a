"""The report page: one self-contained HTML file (inline CSS, plotly.js embedded once, no external resource)."""

from __future__ import annotations

import datetime as dt
import html
import json
import re

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

import flowscope
from flowscope.analysis.breakdown import IO_TIME_UNKNOWN, Breakdown, breakdown, task_groups
from flowscope.analysis.nothing_observed import why_nothing_observed
from flowscope.analysis.summary import TASK_STEP, Utilisation, utilisation
from flowscope.report import Progress, charts
from flowscope.report.anomalies import anomaly_section
from flowscope.report.chart_sections import CHART_SECTIONS, utilisation_table
from flowscope.report.context import Context
from flowscope.report.formats import fmt_bytes, fmt_duration, fmt_s  # noqa: F401  (also imported from here)
from flowscope.report.profile import flame_graph, hot_paths
from flowscope.report.io_summary import io_summary_section
from flowscope.report.stream import JS as STREAM_JS
from flowscope.report.stream import StreamFigure

PLOT_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}

SECTIONS = (  # id, title
    ("summary", "Run"),
    ("breakdown", "Computation, communication and I/O"),
    ("task-stream", "Task stream"),
    ("task-states", "Tasks by state over time"),
    ("hardware", "CPU and memory per host"),
    ("io", "I/O per thread"),
    ("io-summary", "I/O summary"),
    ("communication", "Communication: time vs size"),
    ("task-groups", "Task groups"),
    ("profile", "Call profile"),
    ("critical-path", "Critical path"),
    ("warnings", "Warnings over time"),
)

CSS = """
:root { --fg: #1d1d1f; --muted: #666; --line: #e3e3e3; --accent: #1f5fa8; --bg-soft: #f6f7f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); background: white; }
header.top { padding: 18px 28px 10px; border-bottom: 1px solid var(--line); background: var(--bg-soft); }
header.top h1 { margin: 0 0 4px; font-size: 22px; font-weight: 600; }
header.top .sub { color: var(--muted); }
nav { padding: 8px 28px; border-bottom: 1px solid var(--line); position: sticky; top: 0; background: white; z-index: 10; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; white-space: nowrap; }
nav a:hover { text-decoration: underline; }
main { padding: 0 28px 40px; max-width: 1500px; }
section { padding: 14px 0 8px; border-bottom: 1px solid var(--line); }
section h2 { font-size: 17px; margin: 6px 0 4px; font-weight: 600; }
p.help { margin: 2px 0 10px; color: var(--muted); max-width: 980px; }
p.nodata { padding: 14px 16px; background: var(--bg-soft); border: 1px dashed #c9c9c9; color: var(--muted);
           border-radius: 4px; max-width: 980px; }
p.note { color: var(--muted); font-size: 12.5px; max-width: 640px; }
div.nothing-observed { margin: 8px 0 12px; padding: 10px 16px; background: #fff8e6; border: 1px solid #e8c66a;
                       border-radius: 4px; max-width: 980px; }
div.nothing-observed h3 { margin: 0 0 6px; font-size: 15px; }
p.why { margin: 4px 0; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 18px; margin: 8px 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
.cols { display: flex; flex-wrap: wrap; gap: 10px 40px; align-items: flex-start; }
.cols > * { flex: 0 1 auto; }
.cols > .grow { flex: 1 1 520px; min-width: 320px; }
table.data { border-collapse: collapse; margin: 6px 0 10px; font-variant-numeric: tabular-nums; }
table.data th, table.data td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: right; }
table.data th { background: var(--bg-soft); font-weight: 600; }
table.data td.l, table.data th.l { text-align: left; }
.sw { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 6px; vertical-align: -1px; }
.plot { width: 100%; }
code { background: var(--bg-soft); padding: 0 3px; border-radius: 3px; }
footer { padding: 14px 28px; color: var(--muted); font-size: 12px; }
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _code(text: str) -> str:
    """Escaped text with `backquoted` parts as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


def _when(ns: int | None) -> str:
    if not ns:
        return "-"
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(columns: list[str], rows: list[list], left: int | set[int] = 1) -> str:
    """An HTML table; the first ``left`` columns (or the columns in ``left``) are text, left-aligned, the
    others numbers. Cells are escaped unless given as ``Markup``."""
    text = set(range(left)) if isinstance(left, int) else left
    head = "".join(f'<th class="{"l" if i in text else ""}">{_e(c)}</th>' for i, c in enumerate(columns))
    body = []
    for r in rows:
        cells = "".join(f'<td class="{"l" if i in text else ""}">{v if isinstance(v, Markup) else _e(v)}</td>'
                        for i, v in enumerate(r))
        body.append(f"<tr>{cells}</tr>")
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


class Markup(str):
    """HTML that is already escaped."""


def _nodata(what: str) -> str:
    return f'<p class="nodata">No data: {what}</p>'


class _Figures:
    """Numbers the figures and turns each into a div plus the script that draws it."""

    def __init__(self) -> None:
        self.count = 0
        self.stream_js = False

    def html(self, fig: go.Figure | StreamFigure, name: str) -> str:
        self.count += 1
        div = f"fig-{name}"
        if isinstance(fig, StreamFigure):
            helper = "" if self.stream_js else f"<script>{STREAM_JS}</script>\n"
            self.stream_js = True
            return f'<div class="plot" id="{div}"></div>\n{helper}<script>{fig.script(div, PLOT_CONFIG)}</script>'
        payload = pio.to_json(fig, validate=False)  # numpy arrays become base64 typed arrays
        payload = payload.replace("</", "<\\/")
        return (f'<div class="plot" id="{div}"></div>\n<script>(function(){{var f={payload};'
                f'Plotly.newPlot("{div}",f.data,f.layout,{json.dumps(PLOT_CONFIG)});}})();</script>')


# ---- sections ---------------------------------------------------------------------------------------------

def _section(sid: str, body: str, help_text: str = "") -> str:
    title = dict(SECTIONS)[sid]
    help_html = f'<p class="help">{help_text}</p>' if help_text else ""
    return f'<section id="{sid}">\n<h2>{_e(title)}</h2>\n{help_html}\n{body}\n</section>'


def summary_section(ctx: Context) -> str:
    meta = ctx.run.meta
    prov = meta.get("provenance") or {}
    pkgs = prov.get("packages") or {}
    start, end = meta.get("start_ns"), meta.get("end_ns")
    duration = (end - start) / 1e9 if start and end else (ctx.extent_s or None)
    cores = None
    if prov.get("cpu_logical") or prov.get("cpu_physical"):
        cores = f"{prov.get('cpu_logical') or '?'} logical, {prov.get('cpu_physical') or '?'} physical"
    facts = [
        ("run id", meta.get("run_id")),
        ("status", meta.get("status")),
        ("started", _when(start or ctx.t0_ns)),
        ("duration", fmt_duration(duration) if duration else "-"),
        ("command", meta.get("command")),
        ("host", prov.get("hostname")),
        ("CPU", prov.get("cpu_model")),
        ("cores", cores),
        ("memory", fmt_bytes(prov.get("memory_bytes")) if prov.get("memory_bytes") else None),
        ("GPUs", ", ".join(g.get("name", "?") for g in prov.get("gpus") or []) or None),
        ("platform", prov.get("platform")),
        ("Python", prov.get("python")),
        ("dask / distributed", " / ".join(pkgs[p] for p in ("dask", "distributed") if p in pkgs) or None),
        ("flowscope", pkgs.get("flowscope")),
        ("run directory", str(ctx.run.path)),
    ]
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts if v not in (None, ""))
    rows = [[k, f"{v:,}"] for k, v in ctx.counts.items() if v]
    counts = _table(["table", "rows"], rows) if rows else _nodata("the run has no rows in any table yet.")
    why = "".join(f'<p class="why"><b>{_code(r.why)}</b> {_code(r.what_to_do)}</p>'
                  for r in why_nothing_observed(ctx.run))
    if why:
        why = f'<div class="nothing-observed"><h3>No work was recorded in this run</h3>{why}</div>'
    return _section("summary", f'{why}<div class="cols"><dl class="facts grow">{dl}</dl><div>{counts}</div></div>')


def breakdown_section(ctx: Context, b: Breakdown, figs: _Figures) -> str:
    help_text = ("Where the time of the resources that execute work (threads, MPI locations, StarPU workers, GPU "
                 "streams, hosts' cores) went, by the category each source's spans map onto (docs/data-model.md, "
                 "'Semantic vocabulary'): computing, communicating (the executors' communication calls, else "
                 "the transfers' durations), timed I/O (I/O states, spilling to disk and I/O records that carry a "
                 "duration), waiting, runtime overhead, idle. Each is slot-time summed over the executing "
                 "resources (a nested call is counted once), so they can exceed the makespan. Bytes are what "
                 "was moved. Utilisation: busy slot-time / (slots x makespan), per resource below; over the "
                 "run's recorded duration when the task times are derived, not measured.")
    if not (b.categories or b.transfers or b.io_s is None or b.io_read_bytes or b.io_write_bytes):
        return _section("breakdown", _nodata("no spans on resources that execute work, no transfers and no I/O "
                                             "records in this run: a source's spans become busy time once its "
                                             "mapping says what they are (flowscope semantics)."), help_text)
    if b.io_s is None:
        io_time, io_note = "unknown", f'<p class="note">{_e(IO_TIME_UNKNOWN)}</p>'
    elif b.io_untimed:
        io_time = f"{fmt_s(b.io_s)} + untimed"
        io_note = (f'<p class="note">The time covers the I/O records that carry a duration; '
                   f'{b.io_untimed:,} records carry bytes only. {_e(IO_TIME_UNKNOWN)}</p>')
    else:
        io_time, io_note = fmt_s(b.io_s), ""
    threads = b.executors
    util = utilisation(ctx.run)
    rows = [
        ["computation", fmt_s(b.compute_s), "-", f"{b.tasks:,} tasks"],
        ["communication", fmt_s(b.communication_s), fmt_bytes(b.communication_bytes), f"{b.transfers:,} transfers"],
        ["I/O", io_time, f"{fmt_bytes(b.io_read_bytes)} read, {fmt_bytes(b.io_write_bytes)} written", ""],
    ]
    rows += [[name, fmt_s(v), "-", ""] for name, v in (("waiting", b.wait_s), ("runtime overhead", b.runtime_s),
                                                        ("other", b.other_s), ("idle", b.idle_s)) if v]
    table = _table(["category", "time", "bytes", "count"], rows)
    facts = [("makespan (the executing resources' first to last activity)", fmt_s(b.makespan_s))]
    if threads:
        facts.append(("resources that execute work", f"{threads:,}"))
    if util is not None:
        facts.extend(_utilisation_facts(util))
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    fig = charts.breakdown_chart(b)
    chart = figs.html(fig, "breakdown") if fig is not None else ""
    body = (f'<div class="cols"><div>{table}{io_note}<dl class="facts">{dl}</dl></div>'
            f'<div class="grow">{chart}</div></div>') + _utilisation_table(ctx)
    return _section("breakdown", body, help_text)


def _utilisation_table(ctx: Context, limit: int = 50) -> str:
    """Per executing resource: its slots, utilisation and the share of its slot-time in each category."""
    t = utilisation_table(ctx, limit)
    if t is None:
        return ""
    columns, left, rows, more = t
    note = f'<p class="note">{more:,} more resources not shown.</p>' if more else ""
    return ('<h3 id="utilisation-per-resource">Utilisation per executing resource</h3>'
            + _table(columns, rows, left=left) + note)


def _utilisation_facts(u: Utilisation) -> list[tuple[str, str]]:
    if u.value is None:
        return [("utilisation", f"unknown: {u.reason}")]
    over = "the run's recorded duration" if u.makespan_source == "run" else "the makespan"
    return [("task slots (threads, cores)", f"{u.slots:,}"),
            (f"utilisation: task time / (slots × {over})",
             f"{100 * u.value:.1f} % ({fmt_s(u.busy_ns / 1e9)} / ({u.slots:,} × {fmt_s(u.makespan_ns / 1e9)}))")]


def figure_section(sid: str, fig: go.Figure | StreamFigure | None, figs: _Figures, help_text: str, nodata: str,
                   extra: str = "", no_chart: str = "") -> str:
    """A section of one figure and what follows it (``extra``). Without the figure: ``no_chart`` (why the rows
    there are give no chart) above ``extra`` when there is ``extra``, else "No data" and ``nodata``."""
    if fig is None and extra:
        return _section(sid, f'<p class="note">{no_chart}</p>' + extra, help_text)
    if fig is None:
        return _section(sid, _nodata(nodata), help_text)
    return _section(sid, figs.html(fig, sid) + extra, help_text)


def chart_section(sid: str, ctx: Context, figs: _Figures) -> str:
    """One of the charts the dashboard's charts page shows too (report/chart_sections.py), with its table."""
    c = CHART_SECTIONS[sid]
    t = c.table(ctx)
    extra = _table(t[0], t[2], left=t[1]) if t is not None else ""
    return figure_section(sid, c.figure(ctx), figs, _code(c.help), _code(c.nodata), extra=extra,
                          no_chart=_code(c.no_chart))


def _path_table(path, limit: int = 200) -> str:
    rows = []
    for r in path.steps.head(limit).itertuples(index=False):
        share = r.duration_ns / path.length_ns if path.length_ns else 0.0
        rows.append([r.id, r.kind, r.component, r.application or "", r.location or "",
                     fmt_duration(r.duration_ns / 1e9), f"{share:.1%}"])
    note = (f'<p class="note">{len(path.steps) - limit:,} more steps not shown.</p>'
            if len(path.steps) > limit else "")
    return _table(["task / state", "kind", "component", "group / application", "location", "time", "share"],
                  rows, left=5) + note


def critical_path_section(ctx: Context, figs: _Figures) -> str:
    """The task graph's measured and structural critical paths, and the data-state graph with its path."""
    from flowscope.analysis.critical_path import (IDLE_COMPONENT, IO_UNIT, data_state_path, missing_path_reason,
                                                  task_graph_paths, work_units)
    from flowscope.analysis.dataflow import data_states_from_tasks
    from flowscope.report.critical_path import attribution_figure, graph_view

    help_text = ("The chain of work that bounds the makespan. <b>Measured</b>: traced back from the last task to "
                 "finish, taking at each task the input that arrived last (with the transfer that brought it) or, "
                 "when its inputs were ready earlier, the task before it on its thread (queueing). "
                 "<b>Structural</b>: the longest path through the task graph with the tasks' durations and "
                 "transfer times, i.e. the makespan with unlimited workers; the difference is what scheduling and "
                 "contention for workers cost. A run whose task times were derived (placed by a rule from "
                 "durations and dependencies, not observed) has no measured path, only the structural one. "
                 "<b>Through messages</b> (runs whose transfers link a send call to a receive call, e.g. MPI): "
                 "the chain of work and messages that bounds the run, and the wait states messages caused. "
                 "A run whose only timed work is I/O operations (a Darshan log with DXT) gets the timeline of the "
                 "resource whose I/O ended last: its operations and the idle gaps between them. "
                 "Below, the data-state graph (task outputs, transfers and files "
                 "as states; recorded with the data-state API or derived from the tasks) with its critical path "
                 "in red.")
    body = []
    units = work_units(ctx.run)
    tasks = int(units["task_key"].notna().sum())

    def failed(what: str, exc: Exception) -> str:
        return f'<p class="nodata">The {what} could not be computed: {_e(str(exc))}</p>'

    tp = None
    if tasks:
        try:
            tp = task_graph_paths(units, ctx.run.table("dependencies"), ctx.run.table("transfers"))
        except ValueError as exc:  # a table that breaks the analysis' rules must not cost the whole report
            body.append(failed("task graph's critical path", exc))
    if tp is not None and tp.measured is None:
        st = tp.structural
        body.append(f'<p>The task times of this run are derived (placed by a rule from the durations and '
                    f'dependencies), not measured: there is no measured critical path, no queueing to trace. '
                    f'Structural critical path: <b>{fmt_s(st.length_ns / 1e9)}</b> through {len(st.ids):,} tasks '
                    f'(the longest path through the dependencies with the tasks\' durations).</p>')
        body.append(figs.html(attribution_figure(st), "critical-path-attribution"))
        body.append(_path_table(st))
    elif tp is not None and str(units["unit"].iloc[0]) == IO_UNIT:
        m = tp.measured
        by = m.by_component().set_index("component")["duration_ns"]
        body.append(f'<p>Measured critical path: <b>{fmt_s(m.length_ns / 1e9)}</b>, the timeline of '
                    f'<b>{_e(str(m.steps["location"].iloc[-1]))}</b>, the resource whose I/O ended last: '
                    f'{int((m.steps["kind"] == TASK_STEP).sum()):,} I/O operations, <b>{fmt_s(by.get("io", 0) / 1e9)}'
                    f'</b> in I/O and <b>{fmt_s(by.get(IDLE_COMPONENT, 0) / 1e9)}</b> between them (the resource ran '
                    f'no traced I/O: it computed, communicated or waited), from the first traced operation of the run. '
                    f'The run has no tasks or spans, only timed I/O operations, and nothing links the operations of '
                    f'one resource to another\'s (no dependencies, no messages): the path is that resource\'s own '
                    f'sequence.</p>')
        body.append(figs.html(attribution_figure(m), "critical-path-attribution"))
        body.append(_path_table(m))
    elif tp is not None:
        m, st = tp.measured, tp.structural
        body.append(f'<p>Measured critical path: <b>{fmt_s(m.length_ns / 1e9)}</b> through '
                    f'{int((m.steps["kind"] == TASK_STEP).sum()):,} tasks; structural (unlimited workers): '
                    f'<b>{fmt_s(st.length_ns / 1e9)}</b>; scheduling and contention cost '
                    f'<b>{fmt_s(tp.difference_ns / 1e9)}</b>.</p>')
        body.append(figs.html(attribution_figure(m), "critical-path-attribution"))
        body.append(_path_table(m))
    states, mutations = ctx.run.table("data_states"), ctx.run.table("mutations")
    if states.empty and tasks:
        states, mutations = data_states_from_tasks(ctx.run)
    path = None
    if not states.empty and not mutations.empty:
        try:
            path = data_state_path(states, mutations)
        except ValueError as exc:
            body.append(failed("data-state graph's critical path", exc))
    if path is not None:
        body.append(f"<p>Data-state graph: {len(states):,} states, {len(mutations):,} mutations; its critical "
                    f"path passes {len(path.ids):,} states over {fmt_s(path.length_ns / 1e9)}.</p>")
        figs.count += 1  # collapsed by application/step above 2,000 states, groups expand on demand
        body.append(graph_view(states, mutations, path, div_id="fig-critical-path-graph", plot_config=PLOT_CONFIG))
        if not tasks:
            body.append(figs.html(attribution_figure(path), "critical-path-attribution"))
            body.append(_path_table(path))
    body.extend(_message_path_parts(ctx, figs, failed))
    if not body:
        reason = missing_path_reason(ctx.run).removeprefix("No critical path: ")
        return _section("critical-path", _nodata(_e(reason)), help_text)
    return _section("critical-path", "\n".join(body), help_text)


def _message_path_parts(ctx: Context, figs: _Figures, failed) -> list[str]:
    """The critical path through messages and the wait states (late sender / late receiver), where transfers
    link the calls they were sent and received in."""
    from flowscope.analysis.message_path import LATE_RECEIVER, LATE_SENDER, message_path
    from flowscope.report.critical_path import attribution_figure

    transfers = ctx.sql("SELECT * FROM transfers WHERE attrs LIKE '%\"dst_call\"%'")
    if not len(transfers):
        return []
    try:
        mp = message_path(ctx.run.table("spans"), transfers)
    except ValueError as exc:
        return [failed("critical path through messages", exc)]
    if mp is None:
        return []
    w = mp.wait_totals()
    out = [(f'<p id="message-path">Critical path through messages: <b>{fmt_s(mp.path.length_ns / 1e9)}</b>, '
           f'through {len(mp.path.ids) - 1:,} of the {mp.messages:,} messages between '
           f'{len(set(mp.path.ids)):,} resources (walked back from the resource that finished last: at each wait it '
           f'suffered, on to the resource it waited for). Wait states (Scalasca\'s definitions): '
           f'<b>{len(mp.waits):,}</b>, late sender <b>{fmt_s(w[LATE_SENDER] / 1e9)}</b> (a receive entered before '
           f'its send), late receiver <b>{fmt_s(w[LATE_RECEIVER] / 1e9)}</b> (a blocking send still running when '
           f'its receive was entered).</p>'),
           figs.html(attribution_figure(mp.path), "message-path-attribution"), _path_table(mp.path)]
    by = mp.waits_by_resource()
    if len(by):
        out.append(_table(["waiting resource", "wait state", "count", "time waited"],
                          [[r.resource_id, r.kind, f"{int(r.count):,}", fmt_duration(r.wait_ns / 1e9)]
                           for r in by.head(50).itertuples(index=False)], left=2))
    return out


def groups_section(ctx: Context, groups: pd.DataFrame, limit: int = 60) -> str:
    help_text = ("Tasks grouped by their group (Dask's task prefix, a StarPU codelet, a WfCommons category; a run "
                 "without tasks groups its calls, e.g. MPI functions, or else its states), largest total time first. "
                 "CV is the coefficient of variation of the durations (standard deviation / mean): "
                 "near 0 the tasks of a group take the same time, above 1 their durations vary widely.")
    if groups.empty:
        return _section("task-groups", _nodata(
            "no tasks, calls or states in this run. Groups come from spans: Dask tasks (by prefix), StarPU "
            "codelets and other Paje states, OTF2 regions, Chrome / Perfetto slices, WfCommons tasks (by "
            "category)."), help_text)
    rows = []
    for r in groups.head(limit).itertuples():
        sw = Markup(f'<span class="sw" style="background:{ctx.color(r.group)}"></span>{_e(r.group)}')
        rows.append([sw, f"{int(r.count):,}", fmt_s(r.total_s), fmt_duration(r.mean_s), f"{r.cv:.2f}",
                     fmt_duration(r.max_s)])
    note = (f'<p class="note">{len(groups) - limit:,} more groups not shown.</p>' if len(groups) > limit else "")
    return _section("task-groups", _table(["group", "count", "total", "mean", "CV", "max"], rows) + note,
                    help_text)


def profile_section(ctx: Context, figs: _Figures) -> str:
    from flowscope.analysis.call_tree import run_call_tree

    help_text = ("The call tree of the spans that nest (OTF2 regions, Chrome slices, traced Python functions, "
                 "nested <code>Client.span</code>s) as a flame graph: each box is a call path, as wide as its "
                 "inclusive time, its callers below it; boxes are merged across resources (hover for calls, "
                 "exclusive time, the min / mean / max over resources and the imbalance (max - mean) / max), and "
                 "the menu shows one resource instead. Click a box to zoom into it. <code>flowscope profile</code> "
                 "prints the same tree; <code>call_tree</code> in <code>flowscope sql</code> holds its rows.")
    if not ctx.counts.get("spans"):
        return _section("profile", _nodata(
            "no spans in this run. A call profile is built from spans that nest on a resource: OTF2 enter/leave "
            "regions, Chrome / Perfetto slices, functions traced with <code>@flowscope.trace</code>, "
            "<code>Client.span</code>s with <code>parent_id</code>."), help_text)
    try:
        tree = run_call_tree(ctx.run)
    except ValueError as exc:  # parent links that are not a tree: say so, draw the rest of the report
        return _section("profile", _nodata(f"the call tree cannot be built: {exc}"), help_text)
    lab = ctx.rows(tree.resources)
    labels = dict(zip(lab["resource_id"], lab["label"]))
    fig = flame_graph(tree, labels)
    def path_cell(names: list[str]) -> Markup:  # long paths elided in the middle, whole in the tooltip
        shown = names if len(names) <= 3 else [names[0], "…", *names[-2:]]
        return Markup(f'<span title="{_e(" > ".join(names))}">' + " &gt; ".join(_e(n) for n in shown[:-1])
                      + (" &gt; " if len(shown) > 1 else "") + f"<b>{_e(shown[-1])}</b></span>")

    rows = [[path_cell(r["call_path"]), len(r["call_path"]) - 1, f"{r['calls']:,}",
             fmt_duration(r["exclusive_ns"] / 1e9), fmt_duration(r["inclusive_ns"] / 1e9),
             fmt_duration(r["exclusive_mean_ns"] / 1e9), fmt_duration(r["exclusive_max_ns"] / 1e9),
             f"{100 * r['exclusive_imbalance']:.1f} %"] for r in hot_paths(tree)]
    flat = sum(v == "flat" for v in tree.nesting.values())
    derived = sum(v == "derived" for v in tree.nesting.values())
    note = (f'<p class="note">{flat} resource(s) have spans that overlap without nesting; their spans are drawn '
            f"flat, each a root.</p>" if flat else "")
    note += (f'<p class="note">On {derived} resource(s) the span times were placed by a rule, not observed; their '
             f"spans are drawn flat, each a root.</p>" if derived else "")
    if not (tree.path_depth > 0).any():
        note += ('<p class="note">No span of this run nests in another: each is a root, and the graph is a flat '
                 "profile. Nested spans (OTF2 enter/leave regions, Chrome slices, <code>@flowscope.trace</code>) "
                 "give call paths.</p>")
    table = ("<h3>Call paths with the most exclusive time</h3>"
             + _table(["call path", "depth", "calls", "exclusive", "inclusive", "exclusive mean / resource",
                       "exclusive max / resource", "imbalance"], rows))
    return _section("profile", figs.html(fig, "profile") + note + table, help_text)


# ---- the page ---------------------------------------------------------------------------------------------

def build_html(ctx: Context, progress: Progress | None = None) -> str:
    """The whole report of ``ctx.run`` as one HTML string."""
    steps = ["breakdown", "task stream", "hardware", "I/O", "communication", "task groups", "call profile",
             "critical path", "warnings"]
    total = len(steps) + 1

    def step(i: int, what: str) -> None:
        if progress is not None:
            progress(what, i, total)

    figs = _Figures()
    parts = [summary_section(ctx)]
    step(0, "breakdown")
    b = breakdown(ctx.tables)
    groups = task_groups(ctx.tables)
    ctx.set_group_order(list(groups["group"]))
    parts.append(breakdown_section(ctx, b, figs))
    step(1, "task stream")
    parts.append(figure_section(
        "task-stream", charts.task_stream(ctx), figs,
        "One row per worker thread; each bar is a task, coloured by its group (click a legend entry to hide it, "
        "double-click to isolate it; drag to zoom, double-click the plot to reset). Red bars on a worker's own "
        "row are incoming transfers; brown bars there are spilling to and from disk. Gaps in a thread's row are "
        "time it sat idle.",
        "no spans or transfers in this run. Spans come from a recorded run (Dask tasks, "
        "<code>@flowscope.trace</code>, <code>Client.span</code>) or an imported trace (Paje states, OTF2 regions, "
        "Chrome / Perfetto slices, WfCommons tasks); transfers from data moved between Dask workers, MPI messages "
        "(OTF2), Paje links and Chrome / Perfetto flows."))
    parts.append(chart_section("task-states", ctx, figs))
    step(2, "hardware")
    parts.append(figure_section(
        "hardware", charts.hardware(ctx), figs,
        "CPU busy time and memory in use per host, sampled by flowscope's hardware sampler, with the rate of task "
        "starts underneath on the same time axis: CPU low while tasks start means the work is waiting on "
        "something else (the scheduler, communication, I/O).",
        "no hardware metrics (<code>cpu.percent</code>, <code>memory.used_bytes</code> in namespace "
        "<code>hardware</code>) in this run. flowscope's hardware sampler records them while "
        "<code>flowscope run</code> or <code>observe()</code> watches a run; a trace imported from another tool "
        "carries none."))
    step(3, "I/O")
    parts.append(chart_section("io", ctx, figs))
    parts.append(io_summary_section(ctx, figs, _section, _table, _nodata))
    step(4, "communication")
    parts.append(chart_section("communication", ctx, figs))
    step(5, "task groups")
    parts.append(groups_section(ctx, groups))
    step(6, "call profile")
    parts.append(profile_section(ctx, figs))
    step(7, "critical path")
    parts.append(critical_path_section(ctx, figs))
    step(8, "warnings")
    parts.append(chart_section("warnings", ctx, figs))
    anomalies = anomaly_section(ctx.run)
    if anomalies:
        parts.append(anomalies)
        figs.count += 1  # the section's figures need plotly.js
    step(9, "writing")

    meta = ctx.run.meta
    title = f"{meta.get('name') or 'run'} {meta.get('run_id', '')}".strip()
    nav = "".join(f'<a href="#{sid}">{_e(t)}</a>' for sid, t in SECTIONS) + (
        '<a href="#anomalies">Anomalies</a>' if anomalies else "")
    plotly_js = get_plotlyjs() if figs.count else ""
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sub = " · ".join(_e(x) for x in (meta.get("status"), _when(meta.get("start_ns") or ctx.t0_ns),
                                      meta.get("command")) if x)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>flowscope report: {_e(title)}</title>",
        f"<style>{CSS}</style>",
        f'<script type="text/javascript">{plotly_js}</script>' if plotly_js else "",
        "</head><body>",
        f'<header class="top"><h1>flowscope report: {_e(title)}</h1><div class="sub">{sub}</div></header>',
        f"<nav>{nav}</nav>",
        "<main>",
        *parts,
        "</main>",
        f"<footer>Written by flowscope {_e(flowscope.__version__)} on {when} from the run's tables "
        f"(<code>{_e(ctx.run.path)}</code>). Times are seconds since the run's first event.</footer>",
        "</body></html>",
    ])
