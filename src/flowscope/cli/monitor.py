"""``flowscope monitor``: this node's hardware sampler as a process of its own, recording into a run it joins by
address, for workflows that are not Dask (a script pipeline, MPI ranks, a batch of tools): one per node."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "monitor", help="sample this node's hardware into a running run (one per node, for non-Dask workflows)",
        description="Join a run that a collector is recording and sample this host's CPU, memory, network, disk and "
                    "GPUs into it every PERIOD seconds, with the same sampler `observe()` and the Dask workers use, "
                    "until the run ends, SIGTERM / Ctrl-C, or --duration. One sampler per host and run: a second "
                    "monitor for the same run on the same host says so and exits 0. The run is given by --address and "
                    "--run (default $FLOWSCOPE_ADDRESS and $FLOWSCOPE_RUN, which `flowscope run` exports to what it "
                    "starts), or found from a Dask scheduler started with --preload flowscope.dask (--scheduler).")
    p.add_argument("--address", default=None, help="the collector, http://HOST:PORT (default $FLOWSCOPE_ADDRESS)")
    p.add_argument("--run", default=None, help="the run to join (default $FLOWSCOPE_RUN)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="find the collector and the run from this Dask scheduler (tcp://HOST:PORT), which was "
                        "started with --preload flowscope.dask")
    p.add_argument("--token", default=None,
                   help="the collector's token (default $FLOWSCOPE_TOKEN; needed when it is bound beyond loopback)")
    p.add_argument("--period", type=float, default=1.0, metavar="SECONDS", help="seconds between samples (default 1)")
    p.add_argument("--check-every", type=float, default=5.0, metavar="SECONDS",
                   help="how often to ask the collector whether the run has ended (default 5)")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds (default: when the run ends or on SIGTERM / Ctrl-C)")
    p.set_defaults(func=run)


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """(collector address, run id) from the options, the environment or the Dask scheduler."""
    address = args.address or os.environ.get("FLOWSCOPE_ADDRESS")
    run_id = args.run or os.environ.get("FLOWSCOPE_RUN")
    if args.scheduler:
        from flowscope.dask import discover

        found = discover(args.scheduler)
        address, run_id = address or found["address"], run_id or found["run_id"]
    if not address:
        raise ValueError("no collector: give --address (or $FLOWSCOPE_ADDRESS, or --scheduler)")
    if not run_id:
        raise ValueError("no run to join: give --run (or $FLOWSCOPE_RUN, or --scheduler)")
    return address, run_id


def _run_status(transport, run_id: str) -> str | None:
    """The run's status as its collector has it (None if the collector cannot say right now)."""
    from flowscope.client.transport import Unreachable

    try:
        status, doc = transport._request("GET", f"/v1/runs/{run_id}", timeout=10.0)
    except (Unreachable, OSError):
        return None
    return doc.get("status") if status == 200 else None


def run(args: argparse.Namespace) -> int:
    from flowscope.client.client import Client
    from flowscope.client.transport import HttpTransport, Unreachable
    from flowscope.model import identifiers as ids
    from flowscope.sources.hardware import HardwareSampler, acquire_host_lease

    for name in ("period", "check_every", "duration"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number of seconds, not {value}")
    address, run_id = _target(args)
    token = args.token or os.environ.get("FLOWSCOPE_TOKEN")
    transport = HttpTransport(address, timeout=10.0, token=token)
    try:
        status, doc = transport._request("GET", f"/v1/runs/{run_id}", timeout=10.0)
    except (Unreachable, OSError) as exc:
        raise RuntimeError(f"collector at {address} unreachable: {exc}") from None
    if status == 404:
        raise ValueError(f"the collector at {address} has no run {run_id!r}")
    if status != 200:
        raise RuntimeError(f"the collector at {address} answered HTTP {status} for run {run_id!r}: "
                           f"{doc.get('error', doc)}")
    if doc.get("status") not in (None, "running"):
        print(f"flowscope monitor: run {run_id} has already ended ({doc.get('status')}); nothing to sample",
              file=sys.stderr)
        return 0
    host = ids.hostname()
    lease = acquire_host_lease(run_id=run_id)
    if lease is None:
        print(f"flowscope monitor: another sampler on {host} already records run {run_id}; nothing to do",
              file=sys.stderr)
        return 0
    stop = threading.Event()
    why = ["stopped"]

    def on_signal(signum, _frame) -> None:
        why[0] = f"stopped by {signal.Signals(signum).name}"
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    client = Client(address, run_id=run_id, token=token)  # joins: the run stays open when this process ends
    sampler = HardwareSampler(client, args.period)
    try:
        sampler.start()
        print(f"flowscope monitor: sampling {host} every {args.period:g} s into run {run_id} at {address}",
              file=sys.stderr, flush=True)
        started = time.monotonic()
        while not stop.wait(args.check_every if args.duration is None
                            else min(args.check_every, max(0.0, started + args.duration - time.monotonic()))):
            if args.duration is not None and time.monotonic() - started >= args.duration:
                why[0] = f"stopped after {args.duration:g} s"
                break
            state = _run_status(transport, run_id)
            if state not in (None, "running"):
                why[0] = f"run {state}"
                break
    finally:
        sampler.stop()
        lease.release()
        client.close()
        transport.close()
    print(f"flowscope monitor: {why[0]}; {sampler.samples} samples of {host} in run {run_id} "
          f"({sampler.errors} errors)", file=sys.stderr)
    return 0
