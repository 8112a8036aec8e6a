"""The runs in a store directory, and how a user names one (path, run id, or 'latest')."""

from __future__ import annotations

import os
from pathlib import Path

from flowscope.model.provenance import run_json_problems
from flowscope.store.layout import RUN_JSON, read_json

DEFAULT_STORE = "flowscope-runs"


def default_store() -> Path:
    """The store used when none is given: $FLOWSCOPE_STORE, else ./flowscope-runs."""
    return Path(os.environ.get("FLOWSCOPE_STORE") or DEFAULT_STORE)


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
