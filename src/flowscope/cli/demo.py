"""``flowscope demo``: observe a small real workload end to end with the embedded collector."""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from flowscope.cli.output import console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="observe a small bundled workload and summarise it",
                       description="Start an embedded collector, run a small multi-threaded workload "
                                   "(generate, transform and write arrays) recording it through the client "
                                   "API, store the run, and print its summary.")
    p.add_argument("--store", default=None, help="run store (default $FLOWSCOPE_STORE or ./flowscope-runs)")
    p.add_argument("--tasks", type=int, default=48, help="work items (default 48)")
    p.add_argument("--threads", type=int, default=4, help="worker threads (default 4)")
    p.add_argument("--size", type=int, default=400_000, help="array elements per item (default 400000)")
    p.set_defaults(func=run)


def _work_item(client, i: int, size: int, outdir: Path) -> int:
    rng = np.random.default_rng(i)
    key = f"item-{i}"
    with client.timed("generate", kind="task", task_key=key):
        data = rng.standard_normal(size)
    with client.timed("fft", kind="task", task_key=key):
        spectrum = np.abs(np.fft.rfft(data))
    with client.timed("sort", kind="task", task_key=key):
        spectrum.sort()
    path = outdir / f"{key}.npy"
    with client.timed("write", kind="io", task_key=key):
        np.save(path, spectrum)
    t0 = time.time_ns()
    with client.timed("read", kind="io", task_key=key):
        back = np.load(path)
    client.emit("io", resource_id=client.thread_resource(), pid=os.getpid(), tid=threading.get_native_id(),
                thread_ident=threading.get_ident(), source="demo", op="read", path=str(path), offset=0,
                nbytes=int(back.nbytes), start_ns=t0, end_ns=time.time_ns(), task_key=key)
    if back.shape != spectrum.shape:
        client.log(f"{key}: read back {back.shape}, wrote {spectrum.shape}", level="error", category="integrity")
    return int(back.nbytes)


def _sample(client, stop: threading.Event, period: float) -> None:
    import psutil

    proc = psutil.Process()
    proc.cpu_percent(None)
    while not stop.wait(period):
        client.metric("process.cpu.percent", proc.cpu_percent(None), namespace="hardware")
        client.metric("process.memory.rss_bytes", proc.memory_info().rss, namespace="hardware")


def run(args: argparse.Namespace) -> int:
    from flowscope import Client, open_run
    from flowscope.cli.runs import cmd_show

    t0 = time.perf_counter()
    client = Client("embedded", store=args.store, name="demo", command="flowscope demo")
    console.print(f"recording run [bold]{client.run_id}[/bold] with an embedded collector")
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(client, stop, 0.05), daemon=True)
    sampler.start()
    written = 0
    with tempfile.TemporaryDirectory(prefix="flowscope-demo-") as tmp, \
            ThreadPoolExecutor(args.threads, thread_name_prefix="demo-worker") as pool:
        client.log(f"starting {args.tasks} items on {args.threads} threads", category="workflow")
        futures = [pool.submit(_work_item, client, i, args.size, Path(tmp)) for i in range(args.tasks)]
        for fut in futures:
            written += fut.result()
        client.log(f"done: {written} bytes written and read back", category="workflow")
    stop.set()
    sampler.join()
    run_dir = client.run_dir
    client.close()
    console.print(f"workload took {time.perf_counter() - t0:.2f} s; run stored in {run_dir}")
    open_run(run_dir)  # fails loudly if the run is not readable
    return cmd_show(argparse.Namespace(run=str(run_dir), store=None, top=10, json=False))
