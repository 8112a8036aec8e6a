"""`flowscope.observe()` and `flowscope demo` print the URL of their run's dashboard page, and that URL answers with
the run's page (and its live view) from the collector that records the run; with a token the user gave, the line
says how to hand it over and never prints it."""

from __future__ import annotations

import re

import httpx
import pytest

LINE = re.compile(r"^flowscope dashboard: (http://127\.0\.0\.1:\d+)/ui/runs/(\S+?)(?: \(open (\S+) with the token "
                  r"given by (\S+)\))?$", re.MULTILINE)


def inc(x):
    return x + 1


def _printed(err: str) -> re.Match:
    found = LINE.search(err)
    assert found, f"no dashboard URL in stderr: {err!r}"
    return found


def _serves_the_run(address: str, run_id: str, name: str, client: httpx.Client | None = None) -> dict:
    """GET the run's page and its live view as a browser would; returns the view."""
    get = (client or httpx).get
    page = get(f"{address}/ui/runs/{run_id}", timeout=60)
    assert page.status_code == 200 and "/ui/static/live.js" in page.text
    snap = get(f"{address}/v1/ui/runs/{run_id}/snapshot", timeout=60)
    assert snap.status_code == 200, snap.text
    view = snap.json()
    assert view["run_id"] == run_id and view["name"] == name
    return view


@pytest.mark.parametrize("collector", ["process", "embedded"])
def test_observe_prints_the_dashboard_url_of_its_run(tmp_path, capfd, collector):
    from distributed import Client, LocalCluster

    import flowscope
    from flowscope.sources.dask import stop_collector

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster) as client:
        try:
            with flowscope.observe(client, store=tmp_path / "store", name="urls", collector=collector) as obs:
                assert client.submit(inc, 1, key="inc-1").result() == 2
                found = _printed(capfd.readouterr().err)
                address, run_id = found.group(1), found.group(2)
                assert run_id == obs.run_id and found.group(3) is None  # no token on loopback: none to hand over
                assert obs.dashboard_url == f"{address}/ui/runs/{run_id}"
                _serves_the_run(address, run_id, "urls")
        finally:
            stop_collector()


def test_observe_with_a_token_given_prints_how_to_hand_it_over_and_never_the_token(tmp_path, capfd, monkeypatch):
    import dask

    import flowscope
    from flowscope.sources.dask import stop_collector

    token = "tok-" + "y" * 30
    monkeypatch.setenv("FLOWSCOPE_TOKEN", token)
    try:
        with flowscope.observe(store=tmp_path / "store", name="guarded", hardware_period=0) as obs:
            assert dask.delayed(inc)(1).compute(scheduler="threads") == 2
            err = capfd.readouterr().err
            assert token not in err
            found = _printed(err)
            address, run_id = found.group(1), found.group(2)
            assert run_id == obs.run_id
            assert found.group(3) == f"{address}/ui/runs/{run_id}?token=TOKEN" and found.group(4) == "$FLOWSCOPE_TOKEN"
            # the collector that records the run needs the token: without it, refused; with it once, the page
            assert httpx.get(f"{address}/ui/runs/{run_id}", timeout=60).status_code == 401
            with httpx.Client(follow_redirects=True) as browser_like:
                opened = browser_like.get(found.group(3).replace("TOKEN", token), timeout=60)
                assert opened.status_code == 200 and "token" not in str(opened.url)
                _serves_the_run(address, run_id, "guarded", browser_like)
    finally:
        stop_collector()  # it requires this test's token: no later observe() may reuse it


def test_flowscope_demo_prints_the_dashboard_url_of_its_run(tmp_path, capfd):
    from flowscope.cli.main import main
    from flowscope.sources.dask import stop_collector

    try:
        rc = main(["demo", "--images", "2", "--size", "32", "--workers", "1", "--threads", "1", "--no-report",
                   "--store", str(tmp_path / "store")])
        err = capfd.readouterr().err
        assert rc == 0, err
        found = _printed(err)
        address, run_id = found.group(1), found.group(2)
        assert (tmp_path / "store" / run_id / "run.json").is_file()
        # the demo's collector process outlives the command inside this Python process: the URL still answers,
        # now with the finished run
        view = _serves_the_run(address, run_id, "demo")
        assert view["status"] == "finished" and sum(p["done"] for p in view["progress"].values()) > 0
    finally:
        stop_collector()
