"""Every command's help names the store it really uses when --store is not given."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from flowscope.cli.main import build_parser
from flowscope.store.catalog import DEFAULT_STORE


def _store_options() -> dict[str, argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if "--store" in action.option_strings:
                out[name] = action
    return out


def test_every_store_option_names_the_default_store():
    options = _store_options()
    assert {"run", "demo", "show", "sql", "report", "anomalies", "import", "export", "serve", "runs",
            "ingest-spool", "simulate", "rm"} <= set(options)
    for command, action in options.items():
        assert "$FLOWSCOPE_STORE" in action.help and f"./{DEFAULT_STORE}" in action.help, (command, action.help)
        assert "~" not in action.help, (command, action.help)


def test_the_named_default_is_the_one_used(tmp_path):
    """The documented default, ./flowscope-runs in the working directory, is where a run lands and is found."""
    env = {k: v for k, v in os.environ.items() if k != "FLOWSCOPE_STORE"}
    code = "import flowscope\nwith flowscope.Client(name='where') as fs:\n    fs.span('x', 1, 2)\n"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, timeout=120)
    assert len(list((tmp_path / DEFAULT_STORE).iterdir())) == 1
    for command in (["runs"], ["show", "latest"], ["anomalies", "latest", "--json"]):
        res = subprocess.run([sys.executable, "-m", "flowscope", *command], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (command, res.stderr)
