"""What every benchmark records about the tree and machine it measured."""

from __future__ import annotations

import subprocess
from pathlib import Path

import flowscope
from flowscope.model.provenance import cpu_model  # noqa: F401 - re-exported for the benchmarks


def git_commit() -> str | None:
    """The commit of the flowscope tree being measured (with -dirty if src/ has uncommitted changes)."""
    root = Path(flowscope.__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("-dirty" if dirty else "")) or None


def write_result(result: dict, path: Path) -> dict:
    """Complete ``result`` with the fields DESIGN.md's Benchmarks section fixes (machine, when) and write it."""
    import datetime as _dt
    import json
    import os
    import platform

    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    result["when"] = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result
