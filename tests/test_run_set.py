"""The catalogue across runs: every run of one or several stores queryable together, with a run_id column and
the runs' provenance to group by (flowscope.open_store, `flowscope sql --all`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys

import pytest

import flowscope
from flowscope.cli.main import main
from flowscope.importers import import_paths
from flowscope.model.schemas import TABLES


@pytest.fixture(scope="module")
def starpu_store(shared_data, tmp_path_factory):
    store = tmp_path_factory.mktemp("starpu") / "store"
    res = import_paths([shared_data / "paje" / "starpu-demo" / "paje.trace"], store)
    return store, res.run_dir.name


def test_every_table_counts_per_run_equal_each_runs_own_counts(repeated_runs):
    rs = flowscope.open_store(repeated_runs["store"])
    assert rs.run_ids == repeated_runs["run_ids"]
    for table in TABLES:
        got = dict(rs.sql(f'SELECT run_id, count(*) AS n FROM "{table}" GROUP BY run_id').itertuples(index=False))
        want = {i: rs.run(i).counts()[table] for i in rs.run_ids}
        assert {i: got.get(i, 0) for i in rs.run_ids} == want, table
    got = rs.sql("SELECT run_id, role, count(*) AS n FROM activity GROUP BY ALL")
    for i in rs.run_ids:
        want = rs.run(i).sql("SELECT role, count(*) AS n FROM activity GROUP BY ALL")
        assert dict(zip(want["role"], want["n"])) == dict(zip(*(got[got["run_id"] == i][c] for c in ("role", "n"))))
    tasks = rs.sql("SELECT run_id, count(*) AS n FROM activity WHERE role = 'task' GROUP BY run_id")
    assert set(tasks["n"]) == {37}  # 12 load, 12 work, 12 combine, total


def test_runs_carry_their_provenance_as_columns_to_group_by(repeated_runs):
    import dask
    import distributed

    rs = flowscope.open_store(repeated_runs["store"])
    runs = rs.runs
    assert list(runs["run_id"]) == repeated_runs["run_ids"]
    assert set(runs["name"]) == {"pipeline"} and set(runs["status"]) == {"finished"}
    assert set(runs["host"]) == {socket.gethostname()}
    assert set(runs["dask_version"]) == {dask.__version__}
    assert set(runs["distributed_version"]) == {distributed.__version__}
    main_file = getattr(sys.modules["__main__"], "__file__", None)
    if main_file is None:  # a session with no main script (pytest-xdist's workers): no hash, said as missing
        assert runs["script_sha256"].isna().all() and runs["script_path"].isna().all()
    else:
        with open(main_file, "rb") as f:
            assert set(runs["script_sha256"]) == {hashlib.sha256(f.read()).hexdigest()}
        assert set(runs["script_path"]) == {os.path.abspath(main_file)}
    stealing = rs.sql("""SELECT DISTINCT json_extract(dask_config, '$.distributed.scheduler."work-stealing"')
                         AS v FROM runs""")["v"]
    assert [json.loads(v) for v in stealing] == [dask.config.get("distributed.scheduler.work-stealing")]
    by_script = rs.sql("SELECT script_sha256, host, count(*) AS runs FROM runs GROUP BY ALL")
    assert list(by_script["runs"]) == [4]
    # a table joins its run's provenance
    joined = rs.sql("SELECT r.host, count(*) AS n FROM spans s JOIN runs r USING (run_id) GROUP BY ALL")
    assert int(joined["n"].sum()) == sum(rs.run(i).counts()["spans"] for i in rs.run_ids)


def test_several_stores_and_sources_side_by_side(repeated_runs, starpu_store):
    store, starpu_id = starpu_store
    rs = flowscope.open_store(repeated_runs["store"], store)
    assert len(rs) == 5 and starpu_id in rs.run_ids
    # each run's own semantic mapping: StarPU codelet states are tasks, as Dask tasks are
    tasks = dict(rs.sql("SELECT run_id, count(*) AS n FROM activity WHERE role = 'task' GROUP BY run_id")
                 .itertuples(index=False))
    assert tasks[starpu_id] == 36 and all(tasks[i] == 37 for i in repeated_runs["run_ids"])
    # resource ids join within a run only
    kinds = rs.sql("""SELECT a.run_id, count(*) FILTER (WHERE a.resource_kind IS DISTINCT FROM r.kind) AS wrong
                      FROM activity a LEFT JOIN resources r ON r.run_id = a.run_id AND r.resource_id = a.resource_id
                      GROUP BY ALL""")
    assert int(kinds["wrong"].sum()) == 0
    execs = rs.sql("SELECT run_id, count(*) FILTER (WHERE executes) AS n FROM executors GROUP BY run_id")
    for run_id, n in execs.itertuples(index=False):
        assert n == int(rs.run(run_id).sql("SELECT count(*) FILTER (WHERE executes) AS n FROM executors")["n"][0])


def test_a_run_id_in_two_stores_is_refused_naming_both(repeated_runs, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    first = repeated_runs["run_ids"][0]
    shutil.copytree(repeated_runs["store"] / first, other / first)
    with pytest.raises(ValueError, match=f"run id {first} is in two places"):
        flowscope.open_store(repeated_runs["store"], other)


def test_sql_all_over_a_store_and_several(repeated_runs, starpu_store, capsys):
    store = str(repeated_runs["store"])
    query = "SELECT run_id, count(*) AS n FROM transitions GROUP BY run_id ORDER BY run_id"
    assert main(["sql", "--all", store, query, "--json"]) == 0
    got = {r["run_id"]: r["n"] for r in json.loads(capsys.readouterr().out)}
    rs = flowscope.open_store(store)
    assert got == {i: rs.run(i).counts()["transitions"] for i in rs.run_ids}
    both = os.pathsep.join([store, str(starpu_store[0])])
    assert main(["sql", "--all", both, "SELECT count(DISTINCT run_id) AS n FROM runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 5}]
    assert main(["sql", "--all", str(repeated_runs["store"] / "nope"), "SELECT 1"]) == 1
    assert "no such store directory" in capsys.readouterr().err


def test_script_of_a_command_is_hashed(tmp_path):
    from flowscope.model.provenance import script_of_command

    script = tmp_path / "job.py"
    script.write_text("print('hi')\n")
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    assert script_of_command(["python3", "-u", str(script), "--x"])["sha256"] == digest
    assert script_of_command([sys.executable, str(script)])["path"] == str(script)
    assert script_of_command(["python3", "-c", "print(1)"]) is None
    assert script_of_command(["python3", "-m", "json.tool"])["module"] == "json.tool"
