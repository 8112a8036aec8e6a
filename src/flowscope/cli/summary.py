"""The end-of-run summary `flowscope demo` and `flowscope run` print: tasks, makespan, where time went."""

from __future__ import annotations

from pathlib import Path

from flowscope.analysis.breakdown import breakdown, task_groups
from flowscope.analysis.nothing_observed import why_nothing_observed
from flowscope.cli.output import console, fmt_ns, print_table
from flowscope.store.run import Run


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def print_run_summary(run: Run, report: Path | None = None, top: int = 5) -> None:
    """Print tasks, makespan, compute / communication / I/O totals, slowest task groups, the critical path and
    warnings."""
    meta = run.meta
    b = breakdown(run)
    reasons = why_nothing_observed(run) if not b.tasks else []
    if reasons:  # no table of zeros: why nothing was recorded, and what to do
        console.print(f"[bold]{meta.get('name')}[/bold] run {meta['run_id']}: {meta.get('status')}, "
                      "[bold yellow]no tasks recorded[/bold yellow]")
        for r in reasons:
            console.print(f"  {r.why}\n    {r.what_to_do}")
        console.print(f"  run directory: {run.path}")
        if report is not None:
            console.print(f"  report: {report}")
        return
    console.print(f"[bold]{meta.get('name')}[/bold] run {meta['run_id']}: {meta.get('status')}, "
                  f"{b.tasks} tasks, makespan {fmt_ns(b.makespan_s * 1e9)}")
    if b.io_s is None:
        io_time = ", I/O time unknown (byte counters only)"
    else:
        io_time = f", {fmt_ns(b.io_s * 1e9)} timed" if b.io_s else ""
    console.print(f"  compute {fmt_ns(b.compute_s * 1e9)} | communication {fmt_ns(b.communication_s * 1e9)} "
                  f"in {b.transfers} transfers ({_bytes(b.communication_bytes)}) | I/O read "
                  f"{_bytes(b.io_read_bytes)}, written {_bytes(b.io_write_bytes)}" + io_time)
    groups = task_groups(run).head(top)
    if len(groups):
        print_table("slowest task groups", ["group", "count", "total", "mean", "CV"],
                    [[g["group"], int(g["count"]), fmt_ns(g["total_s"] * 1e9), fmt_ns(g["mean_s"] * 1e9),
                      f"{g['cv']:.2f}"] for g in groups.to_dict("records")])
    if b.tasks:
        from flowscope.analysis.critical_path import task_graph_paths

        spans = run.table("spans")
        tp = task_graph_paths(spans[spans["kind"] == "task"], run.table("dependencies"), run.table("transfers"))
        if tp.measured is None:
            console.print(f"  critical path {fmt_ns(tp.structural.length_ns)} through {len(tp.structural.ids)} tasks "
                          f"(structural: task times are derived, not measured)")
        else:
            by = tp.measured.by_component()
            console.print(f"  critical path {fmt_ns(tp.measured.length_ns)} measured ("
                          + ", ".join(f"{c} {s:.0%}" for c, s in zip(by["component"], by["share"]) if s >= 0.005)
                          + f"), {fmt_ns(tp.structural.length_ns)} with unlimited workers")
    warnings = run.sql("""SELECT category, count(*) AS n FROM logs WHERE level IN ('warning', 'error')
                          GROUP BY 1 ORDER BY n DESC""")
    if len(warnings):
        console.print("  warnings: " + ", ".join(f"{n} {c}" for c, n in zip(warnings["category"], warnings["n"])))
    else:
        console.print("  warnings: none")
    console.print(f"  run directory: {run.path}")
    if report is not None:
        console.print(f"  report: {report}")
