"""A collector bound beyond loopback answers only requests that carry its token (or was told --insecure);
clients send the token from their environment or the address file, and TLS goes through uvicorn."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import flowscope

T0 = 1_700_000_000_000_000_000


def _host_ip() -> str:
    """An address of this machine other than loopback (the first IPv4 of `hostname -I`), else 0.0.0.0."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.split()
    v4 = [a for a in out if ":" not in a and not a.startswith("127.")]
    return v4[0] if v4 else "0.0.0.0"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FLOWSCOPE_TOKEN"}
    env.update(extra)
    return env


class Serve:
    """`flowscope serve` in a child process; its stderr goes to a file so it can never block."""

    def __init__(self, tmp: Path, *args: str, env: dict | None = None, store: Path | None = None):
        n = len(list(tmp.glob("serve-*.log")))
        self.store = store or tmp / "store"
        self.addr_file = tmp / f"address-{n}"
        self.log_path = tmp / f"serve-{n}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flowscope", "serve", "--port", "0", "--store", str(self.store),
                 "--address-file", str(self.addr_file), *args],
                stdout=subprocess.DEVNULL, stderr=log, env=env if env is not None else _env())
        deadline = time.monotonic() + 30
        while not (self.addr_file.exists() and self.addr_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"flowscope serve exited: {self.log}")
            assert time.monotonic() < deadline, self.log
            time.sleep(0.02)
        self.line = self.addr_file.read_text().splitlines()[0]
        self.bound = self.line.split()[0]
        # a collector bound to 0.0.0.0 is reached through 127.0.0.1
        self.address = self.bound.replace("0.0.0.0", "127.0.0.1")

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, **kw) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{self.address}/v1/health", timeout=1, **kw)
                return
            except httpx.TransportError:
                assert time.monotonic() < deadline, self.log
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def serve(tmp_path):
    started: list[Serve] = []

    def make(*args: str, **kw) -> Serve:
        s = Serve(tmp_path, *args, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ROUTES = [("GET", "/v1/health"), ("GET", "/v1/runs"), ("POST", "/v1/runs"), ("GET", "/v1/runs/r1"),
          ("POST", "/v1/runs/r1/close"), ("POST", "/v1/runs/r1/tables/spans"), ("GET", "/v1/runs/r1/tables/spans"),
          ("GET", "/v1/runs/r1/states"), ("POST", "/v1/runs/r1/mutations"), ("GET", "/v1/runs/r1/critical-path"),
          ("GET", "/v1/runs/r1/anomaly-model"), ("GET", "/no/such/route")]


def _record_in_child(env: dict[str, str], n: int = 500) -> subprocess.CompletedProcess:
    code = ("import flowscope\n"
            "c = flowscope.Client(name='remote')\n"
            f"for i in range({n}):\n"
            f"    c.span('step', {T0} + i, {T0} + i + 3)\n"
            "c.close()\n"
            "print(c.run_id)\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_a_collector_bound_beyond_loopback_refuses_requests_without_its_token(serve, tmp_path):
    host = _host_ip()
    s = serve("--host", host)
    s.wait_ready()
    assert s.bound.startswith(f"http://{host}:")
    found = re.search(r"FLOWSCOPE_TOKEN=(\S+)", s.log)
    assert found, s.log                                         # generated and printed
    token = found.group(1)
    assert len(token) >= 32

    for method, path in ROUTES:
        for headers in ({}, _bearer("x" * len(token)), _bearer(token[:-1]), {"Authorization": token}):
            res = httpx.request(method, f"{s.address}{path}", headers=headers, json={})
            assert res.status_code == 401, (method, path, headers, res.text)
            assert "token" in res.json()["error"]
            assert res.headers["www-authenticate"].startswith("Bearer")
    assert not s.store.exists() or not any(s.store.iterdir())    # nothing was opened
    ok = httpx.get(f"{s.address}/v1/health", headers=_bearer(token))
    assert ok.status_code == 200 and ok.json()["status"] == "ok"

    # the address file carries the token for the clients that read it, and only its owner may read it
    assert s.line == f"{s.bound} token={token}"
    assert stat.S_IMODE(s.addr_file.stat().st_mode) == 0o600

    # a client with the token in its environment records a run end to end
    res = _record_in_child(_env(FLOWSCOPE_ADDRESS=s.address, FLOWSCOPE_TOKEN=token,
                                FLOWSCOPE_SPOOL=str(tmp_path / "spool-ok")))
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.split()[-1]
    run = flowscope.open_run(s.store / run_id)
    assert run.counts()["spans"] == 500 and run.meta["status"] == "finished"

    # one that reads the address file needs no environment
    res = _record_in_child(_env(FLOWSCOPE_ADDRESS_FILE=str(s.addr_file), FLOWSCOPE_SPOOL=str(tmp_path / "spool-f")))
    assert res.returncode == 0, res.stderr
    assert flowscope.open_run(s.store / res.stdout.split()[-1]).counts()["spans"] == 500

    # without it the client is refused and says so; what it recorded stays in its spool
    res = _record_in_child(_env(FLOWSCOPE_ADDRESS=s.address, FLOWSCOPE_SPOOL=str(tmp_path / "spool-no")))
    assert res.returncode != 0
    assert "HTTP 401" in res.stderr and "token" in res.stderr, res.stderr


def test_a_given_token_is_required_and_not_printed(serve, tmp_path):
    s = serve("--host", "0.0.0.0", "--token", "s3cret-token-given-on-the-command-line")
    s.wait_ready()
    assert "s3cret" not in s.log and "must send the token" in s.log
    assert httpx.get(f"{s.address}/v1/health").status_code == 401
    assert httpx.get(f"{s.address}/v1/health", headers=_bearer("s3cret-token-given-on-the-command-line")).status_code \
        == 200
    fs = flowscope.Client(s.address, token="s3cret-token-given-on-the-command-line", spool_dir=tmp_path / "spool",
                          name="given")
    fs.span("step", T0, T0 + 1)
    assert fs.env()["FLOWSCOPE_TOKEN"] == "s3cret-token-given-on-the-command-line"   # children join with it
    fs.close()
    assert flowscope.open_run(s.store / fs.run_id).counts()["spans"] == 1
    env_served = serve("--host", "0.0.0.0", env=_env(FLOWSCOPE_TOKEN="from-the-environment-0123456789"))
    env_served.wait_ready()
    assert httpx.get(f"{env_served.address}/v1/health").status_code == 401
    assert httpx.get(f"{env_served.address}/v1/health",
                     headers=_bearer("from-the-environment-0123456789")).status_code == 200


def test_loopback_needs_no_token_unless_one_is_given_and_insecure_is_explicit(serve, tmp_path):
    plain = serve()
    plain.wait_ready()
    assert httpx.get(f"{plain.address}/v1/health").status_code == 200
    assert "must send the token" not in plain.log
    guarded = serve("--token", "loopback-token-0123456789abcdef")
    guarded.wait_ready()
    assert httpx.get(f"{guarded.address}/v1/health").status_code == 401
    insecure = serve("--host", "0.0.0.0", "--insecure")
    insecure.wait_ready()
    assert httpx.get(f"{insecure.address}/v1/health").status_code == 200
    assert "--insecure" in insecure.log and "no token" in insecure.log
    both = subprocess.run([sys.executable, "-m", "flowscope", "serve", "--host", "0.0.0.0", "--insecure", "--token",
                           "x", "--store", str(tmp_path / "s")], capture_output=True, text=True, timeout=60,
                          check=False)
    assert both.returncode == 1 and "--insecure" in both.stderr and "--token" in both.stderr, both.stderr


def test_ingest_spool_sends_the_token(serve, tmp_path):
    spool = tmp_path / "spool"
    c = flowscope.Client("http://127.0.0.1:9", name="offline", spool_dir=spool)   # nothing listens on port 9
    for i in range(100):
        c.span("step", T0 + i, T0 + i + 1)
    with pytest.raises(flowscope.FlowscopeError, match="ingest-spool"):
        c.close()
    s = serve("--host", "0.0.0.0", "--token", "spool-token-0123456789abcdef")
    s.wait_ready()
    cmd = [sys.executable, "-m", "flowscope", "ingest-spool", str(spool), "--address", s.address]
    refused = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120, check=False)
    assert refused.returncode == 1 and "401" in refused.stderr, refused.stderr
    assert any(spool.rglob("*.arrows"))                               # kept for the next try
    ok = subprocess.run(cmd, capture_output=True, text=True, env=_env(FLOWSCOPE_TOKEN="spool-token-0123456789abcdef"),
                        timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    run = flowscope.open_run(s.store / c.run_id)
    assert run.counts()["spans"] == 100 and run.meta["status"] == "finished"
    assert not any(spool.rglob("*.arrows"))
    again = subprocess.run([*cmd, "--token", "spool-token-0123456789abcdef", "--json"], capture_output=True,
                           text=True, env=_env(), timeout=120, check=False)
    assert again.returncode == 0 and json.loads(again.stdout)["batches"] == 0, again.stderr


def test_tls_through_uvicorn_with_a_token(serve, tmp_path):
    host = _host_ip()
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    san = f"IP:{host}" if host != "0.0.0.0" else "IP:127.0.0.1"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=flowscope-test", "-addext", f"subjectAltName={san}"],
                   check=True, capture_output=True)
    s = serve("--host", host, "--ssl-keyfile", str(key), "--ssl-certfile", str(cert))
    trusted = ssl.create_default_context(cafile=str(cert))
    s.wait_ready(verify=trusted)
    assert s.address.startswith("https://"), s.line
    token = re.search(r"FLOWSCOPE_TOKEN=(\S+)", s.log).group(1)
    assert httpx.get(f"{s.address}/v1/health", verify=trusted).status_code == 401
    assert httpx.get(f"{s.address}/v1/health", verify=trusted, headers=_bearer(token)).status_code == 200
    with pytest.raises(httpx.TransportError):                           # plain HTTP is not served
        httpx.get(s.address.replace("https://", "http://") + "/v1/health", headers=_bearer(token))
    res = _record_in_child(_env(FLOWSCOPE_ADDRESS=s.address, FLOWSCOPE_TOKEN=token, SSL_CERT_FILE=str(cert),
                                FLOWSCOPE_SPOOL=str(tmp_path / "spool")))
    assert res.returncode == 0, res.stderr
    assert flowscope.open_run(s.store / res.stdout.split()[-1]).counts()["spans"] == 500
