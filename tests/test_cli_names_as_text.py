"""Names that came from the observed program (a run's name, task keys, group names) are printed by the commands as
they are: the console's markup (``[b]``, ``[/b]``) in them is neither applied nor fatal."""

from __future__ import annotations

import dask
from dask import delayed

import flowscope
from flowscope.cli.main import main as cli_main

NAME = "nightly [/b] run [red]x"
KEY = "load[/b]-[bold]1"


def _inc(x):
    return x + 1


def test_show_explain_and_lineage_print_markup_in_names_as_text(tmp_path, capsys):
    with flowscope.observe(store=tmp_path / "store", name=NAME, hardware_period=0) as obs:
        a = delayed(_inc)(1, dask_key_name=KEY)
        b = delayed(_inc)(a, dask_key_name="sum-1")
        assert dask.compute(b, scheduler="sync") == (3,)
    capsys.readouterr()
    run = str(obs.run_dir)
    assert cli_main(["show", run]) == 0
    assert NAME in capsys.readouterr().out.replace("\n", "")
    assert cli_main(["explain", run]) == 0
    assert NAME in capsys.readouterr().out.replace("\n", "")
    assert cli_main(["lineage", run, KEY]) == 0
    assert KEY in capsys.readouterr().out
