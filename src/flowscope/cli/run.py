"""``flowscope run -- COMMAND``: observe a command, and any Dask cluster it starts, as one run."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flowscope.cli.output import STORE_HELP, err_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="observe a command and any Dask cluster it starts",
                       description="Run COMMAND with an embedded collector: any Dask scheduler or worker the "
                                   "command starts loads flowscope's plugins (through Dask's preload config, no "
                                   "code change), every computation of Dask's local schedulers (threads, processes, "
                                   "synchronous) in the command's Python processes is recorded through Dask's "
                                   "callbacks, the host's hardware is sampled, a progress line shows tasks done "
                                   "/ total, and when the command ends the run is finalised and its report written "
                                   "(a run with no tasks says why). The exit status is the command's.",
                       usage="flowscope run [options] -- COMMAND [ARG ...]")
    p.add_argument("--store", default=None, help=STORE_HELP)
    p.add_argument("--name", default=None, help="run name (default: the command's name)")
    p.add_argument("--sample-period", type=float, default=1.0, metavar="SECONDS",
                   help="hardware sampling period (default 1 s; 0 turns sampling off)")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    p.add_argument("--quiet", action="store_true", help="no progress line and no summary")
    p.add_argument("--anomalies", action="store_true",
                   help="run an anomaly detector on every Dask worker (flags anomalous tasks online, Chimbuko's "
                        "design; docs/anomalies.md)")
    p.add_argument("--level", default="standard", choices=("standard", "full"),
                   help="Dask capture level (default standard: scheduler transitions, execution spans, transfers, "
                        "warnings, hardware, the I/O of calls of 1 ms or more; full: also every worker transition "
                        "and each task's own I/O; docs/dask.md)")
    p.add_argument("--trace", action="append", default=[], metavar="PATTERN",
                   help="trace the Python functions PATTERN names ('module_glob[:function_glob]', repeatable) in "
                        "every Python process the command starts, as nested call spans")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command to observe, after --")
    p.set_defaults(func=run)


def _progress(run_dir: Path) -> str:
    from flowscope.store.run import open_run

    try:
        run = open_run(run_dir)
        row = run.sql("""
            SELECT count(DISTINCT task_key) FILTER (WHERE to_state IN ('memory', 'erred')) AS done,
                   count(DISTINCT task_key) AS total
            FROM transitions WHERE observer = 'scheduler'""").iloc[0]
        if not int(row["total"]):  # the local schedulers: task spans of the graphs submitted so far
            row = run.sql("""
                SELECT (SELECT count(*) FROM activity WHERE role = 'task') AS done,
                       (SELECT coalesce(sum(CAST(json_extract(attrs, '$.tasks') AS BIGINT)), 0) FROM logs
                        WHERE category = 'graph-submitted') AS total""").iloc[0]
    except Exception:  # a segment being renamed into place; try again next tick
        return ""
    return f"tasks {int(row['done'])}/{int(row['total'])}" if int(row["total"]) else ""


def _record_process_facts(fs, directory: str) -> None:
    """Each observed Python process's facts (``sources/process_facts.py``) as an ``observation`` log row."""
    from flowscope.model import identifiers as ids
    from flowscope.sources import process_facts

    for facts in process_facts.read_facts_dir(directory):
        facts["via"] = "flowscope run"
        pid = facts.get("pid")
        fs.log(process_facts.message(facts), category=process_facts.CATEGORY,
               resource_id=ids.process_id(pid) if pid else None, ts_ns=facts.get("ts_ns"), attrs=facts)


def _hardware(fs, period: float):
    if period <= 0:
        return None
    try:
        from flowscope.sources.hardware import HardwareSampler, acquire_host_lease
    except ImportError:
        return None
    lease = acquire_host_lease(run_id=fs.run_id)  # the command's Dask workers will find it taken
    if lease is None:  # another flowscope process samples this host already
        return None
    sampler = HardwareSampler(fs, period)
    sampler.start()
    sampler.lease = lease
    return sampler


def _stop_hardware(sampler) -> None:
    """Stop the sampler ``_hardware`` started, if any, and let its host lease go (removing the lock file)."""
    if sampler is not None:
        sampler.stop()
        sampler.lease.release()


def run(args: argparse.Namespace) -> int:
    from flowscope import Client
    from flowscope.sources.dask import run_provenance
    from flowscope.sources.semantics import LIVE
    from flowscope.model import identifiers as ids

    cmd = list(args.argv)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("no command given: flowscope run [options] -- COMMAND [ARG ...]")
    if getattr(args, "trace", None):
        from flowscope.sources.python_tracing import _parse

        _parse(args.trace)  # a bad pattern is refused here, not in the child
    level = getattr(args, "level", None) or "standard"
    fs = Client("embedded", store=args.store, serve=True, name=args.name or Path(cmd[0]).name,
                command=shlex.join(cmd), meta={"semantics": LIVE, "capture_level": level, **run_provenance(cmd)})
    facts_dir = tempfile.mkdtemp(prefix="flowscope-facts-")
    # every Python process the command starts loads sources/_boot/sitecustomize.py: the local schedulers'
    # capture once it imports dask, and the facts that explain a run with no tasks
    boot = str(Path(__file__).resolve().parents[1] / "sources" / "_boot")
    env = {**os.environ, **fs.env(),
           "PYTHONPATH": os.pathsep.join([boot, *filter(None, [os.environ.get("PYTHONPATH")])]),
           "FLOWSCOPE_FACTS_DIR": facts_dir,
           # every Dask scheduler and worker the command starts loads the plugins (clients note their scheduler:
           # set by sources/process_facts.py, only in processes that can import flowscope)
           "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": "['flowscope.dask']",
           "DASK_DISTRIBUTED__WORKER__PRELOAD": "['flowscope.dask']",
           "FLOWSCOPE_LEVEL": level}
    if getattr(args, "anomalies", False):
        env["FLOWSCOPE_ANOMALIES"] = "1"
    if getattr(args, "trace", None):
        env["FLOWSCOPE_TRACE"] = ",".join(args.trace)
    sampler = _hardware(fs, args.sample_period)
    t0 = time.time_ns()
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        _stop_hardware(sampler)
        fs.close(status="failed")
        shutil.rmtree(facts_dir, ignore_errors=True)
        raise ValueError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from None
    # the embedded collector's server serves the dashboard while the command runs
    print(f"flowscope dashboard: {fs.address}/ui/runs/{fs.run_id}", file=sys.stderr, flush=True)
    rc = None
    try:
        if args.quiet:
            rc = proc.wait()
        else:
            with err_console.status(f"running {shlex.join(cmd)[:60]}") as status:
                while (rc := proc.poll()) is None:
                    time.sleep(0.5)
                    done = _progress(fs.run_dir)
                    status.update(f"running {shlex.join(cmd)[:60]}  {done}  {(time.time_ns() - t0) / 1e9:.0f} s")
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    t1 = time.time_ns()
    host = ids.hostname()
    child = fs.resource("process", ids.process_id(proc.pid), name=f"{host}:{proc.pid}", parent_id=ids.host_id(),
                        host=host, pid=proc.pid, attrs={"argv": cmd[:16]}, start_ns=t0)
    fs.span(Path(cmd[0]).name, t0, t1, kind="step", resource_id=child,
            attrs={"argv": cmd, "exit_code": rc, "role": "command"})
    _record_process_facts(fs, facts_dir)
    shutil.rmtree(facts_dir, ignore_errors=True)
    _stop_hardware(sampler)
    fs.close(status="finished" if rc == 0 else "failed")
    from flowscope.store.run import open_run

    run = open_run(fs.run_dir)
    report = None
    if not args.no_report:
        try:
            from flowscope.report import write_report
        except ImportError:
            write_report = None
        if write_report is not None:
            report = write_report(run)
    if not args.quiet:
        from flowscope.cli.summary import print_run_summary

        print_run_summary(run, report)
    return rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's convention
