"""`flowscope import` on folders of real traces: what it skips, what it refuses, what --keep-going keeps."""

from __future__ import annotations

import json
import shutil

import flowscope
from flowscope.cli.main import main as cli_main


def _folder(shared_data, tmp_path):
    """A folder with two valid Paje traces, the deliberately invalid one, and a README nobody claims."""
    d = tmp_path / "traces"
    d.mkdir()
    for name in ("states.trace", "links.trace", "native_paje.trace"):
        shutil.copy(shared_data / "paje" / "pajeng" / name, d / name)
    (d / "README.md").write_text("not a trace\n")
    return d


def test_a_folder_with_an_unreadable_trace_fails_whole_by_default(shared_data, tmp_path, capsys):
    d = _folder(shared_data, tmp_path)
    store = tmp_path / "store"
    assert cli_main(["import", str(d), "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert "native_paje.trace:1:" in err and "Type" in err
    # links.trace came before it and was imported; the run says the import stopped part way
    runs = [p for p in store.iterdir()] if store.exists() else []
    assert len(runs) == 1
    meta = flowscope.open_run(runs[0]).meta
    assert meta["status"] == "imported-partly"
    assert [i["path"].rsplit("/", 1)[1] for i in meta["imports"]] == ["links.trace"]


def test_keep_going_imports_what_it_can_and_lists_the_rest(shared_data, tmp_path, capsys):
    d = _folder(shared_data, tmp_path)
    store = tmp_path / "store"
    assert cli_main(["import", str(d), "--store", str(store), "--keep-going", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert sorted(f["path"].rsplit("/", 1)[1] for f in out["files"]) == ["links.trace", "states.trace"]
    assert [f["path"].rsplit("/", 1)[1] for f in out["failed"]] == ["native_paje.trace"]
    assert "native_paje.trace:1:" in out["failed"][0]["error"]
    assert [p.rsplit("/", 1)[1] for p in out["skipped"]] == ["README.md"]
    run = flowscope.open_run(out["run_dir"])
    assert run.meta["status"] == "imported-partly"
    assert [f["path"].rsplit("/", 1)[1] for f in run.meta["import_failures"]] == ["native_paje.trace"]
    # what the two readable traces hold, and nothing of the third
    assert run.counts()["spans"] == sum(f["rows"].get("spans", 0) for f in out["files"]) > 0
