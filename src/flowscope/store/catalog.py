"""The runs in a store directory, and how a user names one (path, run id, or 'latest')."""

from __future__ import annotations

import os
from pathlib import Path

from flowscope.store.layout import RUN_JSON, read_json

DEFAULT_STORE = "flowscope-runs"


def default_store() -> Path:
    """The store used when none is given: $FLOWSCOPE_STORE, else ./flowscope-runs."""
    return Path(os.environ.get("FLOWSCOPE_STORE") or DEFAULT_STORE)


def list_runs(store: str | Path) -> list[dict]:
    """run.json of every run directly under ``store``, oldest first; unreadable ones carry an 'error'."""
    store = Path(store)
    if not store.is_dir():
        raise FileNotFoundError(f"{store}: no such store directory")
    out = []
    for child in sorted(store.iterdir()):
        meta_path = child / RUN_JSON
        if not meta_path.is_file():
            continue
        try:
            meta = read_json(meta_path)
        except (OSError, ValueError) as exc:
            meta = {"run_id": child.name, "error": f"{meta_path}: {exc}"}
        meta["path"] = str(child)
        out.append(meta)
    out.sort(key=lambda m: (m.get("start_ns") or 0, m.get("run_id", "")))
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
