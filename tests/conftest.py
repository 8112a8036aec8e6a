"""Shared fixtures: a real collector process on loopback, and the shared folder of other tools' data."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """$FLOWSCOPE_SHARED_DATA, else ../shared/data next to the repository."""
    return Path(os.environ.get("FLOWSCOPE_SHARED_DATA") or REPO.parent / "shared" / "data")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = shared_data_dir()
    if not d.is_dir():
        if os.environ.get("FLOWSCOPE_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(f"shared data folder {d} is missing and FLOWSCOPE_REQUIRE_SHARED_DATA=1")
        pytest.skip(f"shared data folder {d} is absent (set FLOWSCOPE_SHARED_DATA to run these tests)")
    return d


# ---- optional dependencies: a user without one is told and skipped; CI fails --------------------------------
# (FLOWSCOPE_REQUIRE_SHARED_DATA=1 is set by .ci/run, whose scripts/test.sh installs every test dependency:
# there a missing one is a broken set-up, not a reason to skip.)
import importlib
from types import ModuleType
from typing import NoReturn


def dependencies_required() -> bool:
    """True under CI (FLOWSCOPE_REQUIRE_SHARED_DATA=1): a missing test dependency fails instead of skipping."""
    return os.environ.get("FLOWSCOPE_REQUIRE_SHARED_DATA") == "1"


def missing_dependency(why: str) -> NoReturn:
    """Skip the calling test (or test module, at import time) because ``why``; fail under CI."""
    if dependencies_required():
        pytest.fail(f"{why}, and FLOWSCOPE_REQUIRE_SHARED_DATA=1 requires it", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def require_module(name: str, purpose: str) -> ModuleType:
    """Import the optional module ``name`` (``purpose``: what it is for, and how to install it) and return it.
    Use this, not ``pytest.importorskip``, wherever a test needs an optional dependency: where it cannot be
    imported the test is skipped with the reason, except under CI, where it fails."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing_dependency(f"{name} cannot be imported ({purpose}): {exc}")

# ---- end of optional dependencies ----------------------------------------------------------------------------


def needs_tool(executable: str, package: str) -> pytest.MarkDecorator:
    """Skip a test when a reference tool from a Debian package is missing, except in CI
    (FLOWSCOPE_REQUIRE_SHARED_DATA=1, set by .ci/run, whose scripts/test.sh installs it): there the
    test runs and fails."""
    import shutil

    missing = shutil.which(executable) is None and os.environ.get("FLOWSCOPE_REQUIRE_SHARED_DATA") != "1"
    return pytest.mark.skipif(missing, reason=f"{executable} (Debian package {package}) is not installed")


# ---- one headless Chromium per test module ---------------------------------------------------------------------
# Launching Playwright's driver and Chromium costs seconds of CPU; ~30 tests render a page. The tests of a module
# share one browser and each opens its pages in a context of its own (a fresh profile: no cookie, cache or storage
# carried over), closed when the test ends. Not one per session: while Playwright's sync API is started it marks
# its event loop as the main thread's running loop, so asyncio.run() there fails ("cannot be called from a running
# event loop"); stopping it when the module ends keeps that from reaching the modules that follow.
CHROMIUM = os.environ.get("FLOWSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


class _SharedChromium:
    """Playwright and a Chromium started on first use and kept until the module ends (started again if the
    browser went away, e.g. crashed)."""

    def __init__(self) -> None:
        self.playwright = None
        self.browser = None

    def get(self):
        if self.browser is not None and self.browser.is_connected():
            return self.browser
        self.close()
        sync_api = require_module("playwright.sync_api", "Playwright drives the browser: pip install -e '.[test]'")
        if not Path(CHROMIUM).exists():
            missing_dependency(f"{CHROMIUM} is missing (apt-get install chromium)")
        self.playwright = sync_api.sync_playwright().start()
        self.browser = self.playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        return self.browser

    def close_contexts(self) -> None:
        """Close every context (and so every page) still open: a test leaves no page running into the next."""
        if self.browser is not None and self.browser.is_connected():
            for context in list(self.browser.contexts):
                context.close()

    def close(self) -> None:
        try:
            if self.browser is not None and self.browser.is_connected():
                self.browser.close()
        finally:
            if self.playwright is not None:
                self.playwright.stop()
            self.playwright = self.browser = None


_CHROMIUM = _SharedChromium()


def shared_browser():
    """The module's Playwright Chromium :class:`Browser` (skipped with the reason where Playwright or chromium is
    missing; failed under CI). Open pages with ``browser.new_page()`` or in ``browser.new_context()``: either is a
    fresh profile. Prefer the ``chromium`` fixture in tests, which closes them when the test ends."""
    return _CHROMIUM.get()


@pytest.fixture
def chromium():
    """The module's Chromium; every context the test opened is closed when it ends."""
    try:
        yield shared_browser()
    finally:
        _CHROMIUM.close_contexts()


@pytest.fixture(scope="module", autouse=True)
def _chromium_stops_with_its_module():
    """Stop the shared Chromium (if this module started it) when the module's tests are done."""
    yield
    _CHROMIUM.close()


class _StartWait:
    """How long to wait for a child to start: until it has used ``cpu_s`` seconds of CPU time (a busy machine
    can keep a child from running for far longer than that: starved is not stuck), or ``wall_s`` passed."""

    def __init__(self, proc: subprocess.Popen, cpu_s: float, wall_s: float = 600.0):
        self.proc, self.cpu_s, self.wall_deadline = proc, cpu_s, time.monotonic() + wall_s

    def goes_on(self) -> bool:
        import psutil

        try:
            t = psutil.Process(self.proc.pid).cpu_times()
            used = t.user + t.system
        except psutil.Error:
            used = 0.0
        return used <= self.cpu_s and time.monotonic() <= self.wall_deadline


class CollectorProcess:
    """`flowscope serve` in a child process on 127.0.0.1. Its output goes to ``log_path`` (a file, not a
    pipe: a pipe nobody reads fills at 64 KiB and then freezes the collector's next write to it)."""

    def __init__(self, store: Path, workdir: Path, extra: list[str] | None = None, env: dict | None = None):
        self.store = store
        self.workdir = workdir
        self.extra = extra or []
        self.env = env or {}
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.log_path = workdir / f"collector-{time.monotonic_ns()}.log"

    def start(self, timeout: float = 30.0, env: dict | None = None) -> CollectorProcess:
        """Start (or restart, on the same port and store); ``env`` replaces the extra environment variables."""
        if env is not None:
            self.env = env
        addr_file = self.workdir / f"address-{time.monotonic_ns()}"
        cmd = [sys.executable, "-m", "flowscope", "serve", "--port", str(self.port), "--store", str(self.store),
               "--address-file", str(addr_file), *self.extra]
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        waiting = _StartWait(self.proc, timeout)
        while waiting.goes_on():
            if addr_file.exists() and addr_file.read_text().strip():
                self.address = addr_file.read_text().split()[0]
                self.port = int(self.address.rsplit(":", 1)[1])
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"collector exited: {self.log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(0.02)
        else:
            raise TimeoutError("collector did not start")
        import httpx

        # a collector given a token (--token) answers only requests that carry it
        token = self.extra[self.extra.index("--token") + 1] if "--token" in self.extra else None
        headers = {"Authorization": f"Bearer {token}"} if token else None
        while waiting.goes_on():  # the address is written just before uvicorn accepts
            try:
                httpx.get(f"{self.address}/v1/health", timeout=1, headers=headers).raise_for_status()
                return self
            except httpx.HTTPError:
                time.sleep(0.02)
        raise TimeoutError("collector did not answer /v1/health")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def alone_in_hbos_bin(functions, values) -> "np.ndarray":
    """Per call (its function's name and its value): whether HBOS must flag it at its default parameters. Such a
    call has no other call of its function within one bin width of it (Scott's rule over the function's calls,
    at most 200 bins), plus the 0.8 % of the model's grid each of the two values may move by, so it is alone in
    its bin; and its function has more calls than bins, so some bin holds two and the function is judged. A bin
    of one is then the rarest there is, flagged at any threshold (docs/anomalies.md): what a test can expect on
    a machine whose load stretches other calls by any amount."""
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"f": np.asarray(functions, object), "v": np.asarray(values, np.float64)})
    by = df.groupby("f")["v"]
    count, span = by.transform("count"), by.transform("max") - by.transform("min")
    scott = 3.49 * by.transform("std").fillna(0.0) * count ** (-1.0 / 3.0)
    nbins = np.clip(np.ceil(span / scott.where(scott > 0)).fillna(1), 1, 200)
    width = np.maximum(scott, span / 200).to_numpy()
    v, f = df["v"].to_numpy(), df["f"].to_numpy()
    others = (f[:, None] == f[None, :]) & ~np.eye(len(v), dtype=bool)
    near = np.abs(v[:, None] - v[None, :]) <= width[:, None] + 0.008 * (v[:, None] + v[None, :])
    return ~(others & near).any(axis=1) & (count > nbins).to_numpy()


def check_exactly_once(run, n: int) -> None:
    """``run``'s spans are exactly the ``n`` a test's producers sent: span ids 0..n-1 once each, and the durations
    ``i % 1000`` they were given."""
    got = run.sql("""SELECT count(*) AS n, count(DISTINCT span_id) AS distinct_ids, sum(span_id) AS id_sum,
                            sum(end_ns - start_ns) AS dur_sum FROM spans""").iloc[0]
    assert int(got["n"]) == n
    assert int(got["distinct_ids"]) == n
    assert int(got["id_sum"]) == n * (n - 1) // 2
    assert int(got["dur_sum"]) == sum(i % 1000 for i in range(n))


@pytest.fixture
def collector_factory(tmp_path):
    started: list[CollectorProcess] = []

    def make(*extra: str, store: Path | None = None, env: dict | None = None) -> CollectorProcess:
        c = CollectorProcess(store or tmp_path / "store", tmp_path, list(extra), env)
        started.append(c)
        return c.start()

    yield make
    for c in started:
        c.stop()


@pytest.fixture
def collector(collector_factory) -> CollectorProcess:
    return collector_factory()


# ---- several recorded runs of one small Dask workflow, one with a planted slowdown ---------------------------
#: the task group made slower in the planted run, and by how much per task (against tasks of about 1 ms)
PLANTED_GROUP, PLANTED_SLEEP_S = "work", 0.2
#: objects a quarter of the planted tasks hold while they collect garbage: a pause of about 0.1 s, logged by the
#: worker as a warning (longer than 50 ms)
PLANTED_HEAP = 1_500_000


def _pipeline(delay: float):
    """load-i -> work-i -> combine-i (with work-(i+1)) -> total: four task groups with fixed key names."""
    from dask import delayed

    def load(i):
        return list(range(i, i + 1000))

    def work(xs, delay, heap):
        time.sleep(delay)
        if heap:  # a long garbage collection, which the worker logs as a warning (category gc)
            held = [[i] for i in range(heap)]
            gc.collect()
            del held
        return sum(x * x for x in xs)

    def combine(a, b):
        return a + b

    n = 12
    loads = [delayed(load, pure=True)(i, dask_key_name=f"load-{i}") for i in range(n)]
    heap = PLANTED_HEAP if delay else 0
    works = [delayed(work, pure=True)(loads[i], delay, heap if i % 4 == 0 else 0, dask_key_name=f"work-{i}")
             for i in range(n)]
    combs = [delayed(combine, pure=True)(works[i], works[(i + 1) % n], dask_key_name=f"combine-{i}")
             for i in range(n)]
    return delayed(sum, pure=True)(combs, dask_key_name="total")


@pytest.fixture(scope="session")
def repeated_runs(tmp_path_factory) -> dict:
    """Four runs named 'pipeline' of the same workflow on one real LocalCluster (2 worker processes, 2
    threads each) in a fresh store: three as written and, last, one whose ``work`` tasks each sleep
    PLANTED_SLEEP_S. Returns the store, the run ids in order, and the planted run's id."""
    from distributed import Client, LocalCluster

    import flowscope

    store = tmp_path_factory.mktemp("repeated") / "store"
    ids = []
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        for delay in (0.0, 0.0, 0.0, PLANTED_SLEEP_S):
            graph = _pipeline(delay)
            with flowscope.observe(client, store=store, name="pipeline") as obs:
                client.compute(graph).result()
            ids.append(obs.run_id)
    return {"store": store, "run_ids": ids, "baseline": ids[:3], "planted": ids[3],
            "group": PLANTED_GROUP}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A real redis-server on loopback for the module's tests; its address."""
    import shutil

    redis = require_module("redis", "the Redis Streams transport: pip install 'flowscope[redis]'")
    exe = shutil.which("redis-server") or missing_dependency("redis-server is missing (apt-get install redis-server)")
    port, workdir = _free_port(), tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    r = redis.Redis(port=port)
    deadline = time.monotonic() + 60
    while True:
        try:
            r.ping()
            break
        except redis.ConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(30)
