"""The runs in a store directory, and how a user names one (path, run id, or 'latest')."""

from __future__ import annotations

import os
from pathlib import Path

from flowscope.model.provenance import run_json_problems
from flowscope.store.layout import RUN_JSON, read_json
from flowscope.store.writers import WriterId

DEFAULT_STORE = "flowscope-runs"
#: the environment variable naming the default store
STORE_ENV = "FLOWSCOPE_STORE"


def default_store() -> Path:
    """The store used when none is given: $FLOWSCOPE_STORE, else ./flowscope-runs."""
    return Path(os.environ.get(STORE_ENV) or DEFAULT_STORE)


def run_meta(run_dir: str | Path) -> dict:
    """The run.json of ``run_dir`` for listing: when it cannot be read, or a field does not fit run.json
    (written by hand, or by an older version), the fields that do not fit are left out and ``error`` says
    what is wrong; ``run_id`` is then the directory's name if need be. The file itself is not changed."""
    run_dir = Path(run_dir)
    meta_path = run_dir / RUN_JSON
    try:
        meta = read_json(meta_path)
    except (OSError, ValueError) as exc:
        return {"run_id": run_dir.name, "error": f"{meta_path}: {exc}"}
    problems = run_json_problems(meta)
    if problems:
        whole = problems.pop("", None)
        meta = {} if whole else {k: v for k, v in meta.items() if k not in problems}
        meta.setdefault("run_id", run_dir.name)
        meta["error"] = f"{meta_path}: " + (whole or "; ".join(f"{k}: {why}" for k, why in problems.items()))
    return meta


def list_runs(store: str | Path) -> list[dict]:
    """run.json of every run directly under ``store``, each with its ``path``, oldest first; a run whose
    run.json cannot be read or does not fit carries an ``error`` (see run_meta) and never hides the others."""
    store = Path(store)
    if not store.is_dir():
        raise FileNotFoundError(f"{store}: no such store directory")
    out = []
    for child in sorted(store.iterdir()):
        if not (child / RUN_JSON).is_file():
            continue
        meta = run_meta(child)
        meta["path"] = str(child)
        out.append(meta)
    out.sort(key=lambda m: (m.get("start_ns") or 0, m["run_id"]))
    return out


def resolve_run(name: str | Path, store: str | Path | None = None) -> Path:
    """The directory of the run ``name``: a run directory path, a run id in ``store``, or 'latest'."""
    p = Path(name)
    if (p / RUN_JSON).is_file():
        return p
    store = Path(store) if store is not None else default_store()
    if str(name) == "latest":
        runs = list_runs(store)
        if not runs:
            raise FileNotFoundError(f"{store}: the store has no runs")
        return Path(runs[-1]["path"])
    candidate = store / str(name)
    if (candidate / RUN_JSON).is_file():
        return candidate
    raise FileNotFoundError(f"{name}: not a run directory, nor a run id in store {store}")


class RunBusy(ValueError):
    """Another process is writing the run (an import that is still running)."""


def import_in_progress(meta: dict) -> tuple[dict, WriterId | None] | None:
    """The import run.json records as under way (``importing``) and the process doing it, if any."""
    job = meta.get("importing")
    if not isinstance(job, dict):
        return None
    return job, WriterId.from_dict(job.get("by"))


def run_state(meta: dict) -> str | None:
    """The run's status as a reader should see it: run.json's ``status``, except ``importing`` while an import
    writes it and ``interrupted`` once the importing process is gone (killed: its files are not all in)."""
    found = import_in_progress(meta)
    if found is None:
        return meta.get("status")
    alive = found[1].alive() if found[1] is not None else False
    if alive is False:
        return "interrupted"
    return "importing" if alive else meta.get("status")  # None: on another host, which cannot be judged here


def interruption(meta: dict) -> str | None:
    """One sentence on an interrupted import of the run (who, how far, what to do), or None if there is none."""
    found = import_in_progress(meta)
    if found is None or run_state(meta) != "interrupted":  # (a live run is interrupted otherwise: run.json says why)
        return None
    job, writer = found
    run_id = meta.get("run_id")
    files = job.get("files") if isinstance(job.get("files"), list) else []
    before = job.get("imports_before") if isinstance(job.get("imports_before"), int) else 0
    done = max(0, len(meta.get("imports") or []) - before)
    who = f"the import ({writer.describe()})" if writer is not None else "the import"
    return (f"{who} was interrupted after {done} of {len(files)} files; resume it with "
            f"`flowscope import --resume {run_id}`, or remove the run with `flowscope rm {run_id}`")


def remove_run(run_dir: str | Path, *, force: bool = False) -> None:
    """Delete the run directory ``run_dir``. Refuses (:class:`RunBusy`) a run that an import is writing, and,
    unless ``force``, one whose status is still ``running`` (a collector may be writing it)."""
    import shutil

    run_dir = Path(run_dir)
    meta = read_json(run_dir / RUN_JSON)
    run_id = meta.get("run_id", run_dir.name)
    state = run_state(meta)
    found = import_in_progress(meta)
    if found is not None and state != "interrupted" and not force:
        who = found[1].describe() if found[1] is not None else "another process"
        raise RunBusy(f"run {run_id} is being imported by {who}; stop that import first (or give --force)")
    if state == "running" and not force:
        raise RunBusy(f"run {run_id} is running: a collector may still be writing it; close or stop it first, "
                      f"or give --force if its writer is gone")
    shutil.rmtree(run_dir)
