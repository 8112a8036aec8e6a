"""`flowscope import` on folders of real traces: what it skips, what it refuses, what --keep-going keeps."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

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
    """Without --keep-going an import is all or nothing: the user fixes the bad file and runs the same command
    again, which must not leave a second copy of the good files behind."""
    d = _folder(shared_data, tmp_path)
    store = tmp_path / "store"
    assert cli_main(["import", str(d), "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert "native_paje.trace:1:" in err and "Type" in err
    # links.trace came before it and had been read: the message says it was taken out again, and nothing stays
    assert "nothing was imported" in err and "links.trace" in err and "--keep-going" in err
    assert not store.exists() or not [p for p in store.iterdir() if not p.name.startswith(".")]


def test_a_failed_import_into_an_existing_run_leaves_that_run_as_it_was(shared_data, tmp_path, capsys):
    store = tmp_path / "store"
    traces = shared_data / "paje" / "pajeng"
    assert cli_main(["import", str(traces / "states.trace"), "--store", str(store), "--json"]) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    before = flowscope.open_run(run_dir)
    counts, meta = before.counts(), before.meta
    segments = sorted(p.relative_to(run_dir) for p in before.path.rglob("*.parquet"))
    assert cli_main(["import", str(traces / "links.trace"), str(traces / "native_paje.trace"), "--run", run_dir,
                     "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert "native_paje.trace:1:" in err and "nothing was imported" in err and "links.trace" in err
    after = flowscope.open_run(run_dir)
    assert after.counts() == counts and after.meta == meta
    assert sorted(p.relative_to(run_dir) for p in after.path.rglob("*.parquet")) == segments


def test_the_same_bytes_are_imported_once_whatever_the_files_name_or_mtime(shared_data, tmp_path, capsys):
    store = tmp_path / "store"
    original = shared_data / "paje" / "pajeng" / "native_sample.trace"
    copy = tmp_path / "copy-of-native_sample.trace"
    shutil.copy(original, copy)
    assert cli_main(["import", str(original), "--store", str(store), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    run_dir = first["run_dir"]
    counts = flowscope.open_run(run_dir).counts()
    assert counts["spans"] > 0

    # a byte-identical copy under another name, and the copy touched (another mtime)
    for _ in range(2):
        assert cli_main(["import", str(copy), "--run", run_dir, "--store", str(store), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["rows"] == {} and out["files"] == []
        assert out["duplicates"] == [{"path": str(copy), "format": "paje", "same_as": str(original.resolve())}]
        assert flowscope.open_run(run_dir).counts() == counts
        os.utime(copy, ns=(1_000_000_000, 1_000_000_000))
    # the same content twice in one command: read once, the second named as skipped in the table
    assert cli_main(["import", str(original), str(copy), "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "already imported" in out and "same content as" in out
    newest = max((p for p in store.iterdir() if p.name != Path(run_dir).name), key=lambda p: p.name)
    assert flowscope.open_run(newest).counts() == counts
    assert len(flowscope.open_run(newest).meta["imports"]) == 1
    # another content under the same name is imported
    shutil.copy(shared_data / "paje" / "pajeng" / "states.trace", copy)
    assert cli_main(["import", str(copy), "--run", run_dir, "--store", str(store), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["duplicates"] == [] and out["rows"]["spans"] > 0


def test_import_paths_returns_what_it_skipped_as_already_imported(shared_data, tmp_path):
    from flowscope.importers import import_paths

    trace = shared_data / "chrome" / "viztracer" / "multithread.json"
    copy = tmp_path / "again.json"
    shutil.copy(trace, copy)
    res = import_paths([trace, copy], tmp_path / "store")
    assert [f.path for f in res.files] == [str(trace)]
    assert [(d.path, d.same_as) for d in res.duplicates] == [(str(copy), str(trace.resolve()))]
    assert res.rows == res.files[0].rows


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


def test_an_otf2_archive_is_keyed_on_all_its_files(shared_data, tmp_path):
    from flowscope.importers import content_files, import_paths
    from flowscope.importers.sink import content_key

    archive = tmp_path / "copy"
    shutil.copytree(shared_data / "otf2" / "ping-pong-otf2", archive)
    original = shared_data / "otf2" / "ping-pong-otf2" / "traces.otf2"
    res = import_paths([original], tmp_path / "store")
    again = import_paths([archive / "traces.otf2"], run=res.run_dir)
    assert again.files == [] and [d.same_as for d in again.duplicates] == [str(original.resolve())]
    members = content_files(archive / "traces.otf2", "otf2")
    assert {p.name for p in members} >= {"traces.otf2", "traces.def", "0.evt", "1.evt", "0.def", "1.def"}
    before = content_key(members)
    (archive / "traces" / "1.evt").chmod(0o644)
    with open(archive / "traces" / "1.evt", "ab") as f:  # one location's events differ: another trace
        f.write(b"\0")
    assert content_key(members) != before
