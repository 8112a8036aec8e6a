"""Tasks that Dask's work stealing moves from one worker to another are recorded (a ``processing -> processing``
transition onto the thief) and found by analysis/compare_figures.py's ``reassignments``, on a real LocalCluster
where every task is placed on one worker (loosely: others allowed) and the other worker is idle."""

from __future__ import annotations

import time

import flowscope
from flowscope.analysis.compare_figures import reassignments


def _slow(x, i):
    time.sleep(0.1)
    return i


def test_tasks_stolen_by_an_idle_worker_are_transitions_from_one_worker_to_the_other(tmp_path, chromium):
    from distributed import Client, LocalCluster

    store = tmp_path / "store"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cl, Client(cl) as client:
        busy, idle = sorted(client.scheduler_info()["workers"])
        with flowscope.observe(client, store=store, name="stealing") as obs:
            # every task placed on one worker, other workers allowed: the idle one steals from it
            futures = [client.submit(_slow, None, i, key=f"slow-{i}", workers=[busy], allow_other_workers=True)
                       for i in range(40)]
            assert client.gather(futures) == list(range(40))
        events = client.get_events("stealing")
    confirmed = [m for _, m in events if m[0] == "confirm"]
    # the scheduler's own log of the steals it carried out: (confirm, key, state, victim, thief, stimulus)
    assert confirmed, "the idle worker stole nothing from the busy one"
    runs = flowscope.open_store(store)
    moved = reassignments(runs)
    assert sorted(moved["task_key"]) == sorted(str(m[1]) for m in confirmed)
    want = {str(m[1]): (f"worker:{m[3]}", f"worker:{m[4]}") for m in confirmed}
    assert {r.task_key: (r.from_worker, r.to_worker) for r in moved.itertuples()} == want
    # the stolen tasks ran where they were moved to
    ran = runs.sql("""SELECT a.task_key, r.parent_id FROM activity a JOIN resources r
                      ON r.run_id = a.run_id AND r.resource_id = a.resource_id WHERE a.role = 'task'""")
    where = dict(zip(ran["task_key"], ran["parent_id"]))
    assert all(where[k] == thief for k, (_, thief) in want.items())
    assert set(moved["run_id"]) == {obs.run_id}
    # and the compare page says so: its static file, read in chromium
    from flowscope.cli.main import main

    out = tmp_path / "compare.html"
    assert main(["compare", obs.run_id, "--store", str(store), "--html", str(out)]) == 0
    pg = chromium.new_page()
    pg.goto(out.as_uri())
    pg.wait_for_function("() => window.flowscopeCompare && flowscopeCompare.renders > 0")
    assert pg.evaluate("() => flowscopeCompare.errors") == []
    shown = pg.evaluate("() => Number(document.querySelector('#cmp-placement table.moves td.moved').dataset.value)")
    assert shown == len(moved)


def test_a_reassignment_is_read_from_the_runs_state_phases_not_from_dasks_state_names(tmp_path):
    """Another scheduler's log (recorded through the Client, its states named its own way): a task moved from one
    worker to another while it stays placed is a reassignment once the run's mapping says what 'placed' means."""
    import json

    from flowscope.cli.main import main

    store = tmp_path / "store"
    with flowscope.Client(store=store, name="own scheduler") as fs:
        for ts, key, before, after, worker in [
                (1, "t1", None, "ready", None), (2, "t1", "ready", "placed", "node-a"),
                (3, "t1", "placed", "placed", "node-b"), (4, "t1", "placed", "finished", "node-b"),
                (1, "t2", None, "ready", None), (2, "t2", "ready", "placed", "node-a"),
                (5, "t2", "placed", "finished", "node-a"), (6, "t2", "finished", "finished", "node-b")]:
            fs.emit("transitions", ts_ns=ts, task_key=key, group="g", from_state=before, to_state=after,
                    observer="scheduler", worker=worker)
        run_id = fs.run_id
    assert reassignments(flowscope.open_store(store)).empty  # 'placed' has no phase yet: nothing is assigned
    mapping = {"source": "own", "transitions": [{"when": {"to_state": "ready"}, "phase": "waiting"},
                                                {"when": {"to_state": "placed"}, "phase": "queued"}]}
    assert main(["semantics", run_id, "--store", str(store), "--set", json.dumps(mapping)]) == 0
    moved = reassignments(flowscope.open_store(store))
    # t1 moved while placed; t2's worker changed only after it finished (done: not a reassignment)
    assert [(r.task_key, r.from_worker, r.to_worker) for r in moved.itertuples()] == [("t1", "node-a", "node-b")]
