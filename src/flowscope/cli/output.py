"""Terminal output shared by the commands: tables, JSON, progress."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from flowscope.store.catalog import DEFAULT_STORE, STORE_ENV

#: the --store help of every command: the store used when none is given (catalog.default_store)
STORE_HELP = f"run store directory (default ${STORE_ENV}, else ./{DEFAULT_STORE})"
#: the --store help of the commands that look a run id up in a store
LOOKUP_STORE_HELP = f"store to look the run id up in (default ${STORE_ENV}, else ./{DEFAULT_STORE})"

console = Console()
err_console = Console(stderr=True)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    """A table of ``rows`` under ``columns``; every cell as plain text (names come from the observed program: the
    console's markup in them is shown, not applied)."""
    t = Table(title=Text(title) if title is not None else None, show_lines=False)
    for c in columns:
        t.add_column(Text(str(c)), overflow="fold")
    for r in rows:
        t.add_row(*(Text("" if v is None else str(v)) for v in r))
    console.print(t)


def progress() -> Progress:
    """A progress bar on stderr (hidden when stderr is not a terminal)."""
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=err_console, transient=True, disable=not err_console.is_terminal)


def fmt_ns(ns: float | None) -> str:
    """A duration in ns, in the unit a person reads best."""
    if ns is None:
        return "-"
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"
