"""The ``flowscope`` command: one sub-command per verb, each defined in its own module."""

from __future__ import annotations

import argparse
import os
import sys

from flowscope import __version__
from flowscope.cli import (
    analyse,
    anomalies,
    compare,
    demo,
    explain,
    export,
    forecast,
    importing,
    io,
    lineage,
    monitor,
    profile,
    remove,
    report,
    run,
    runs,
    semantics,
    serve,
    simulate,
    spool,
    step,
    ui,
)

GROUPS = (demo, run, step, simulate, serve, monitor, ui, runs, report, explain, lineage, compare, profile, anomalies, analyse, forecast, io,
          semantics, importing, export, spool, remove)


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowscope",
                                     description="Observe scientific workflows and explain where their time goes.")
    parser.add_argument("--version", action="version", version=f"flowscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["step"]:  # parses its own words: NAME, list options, then a command after "--"
        return step.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("flowscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except (UserError, OSError, ValueError, KeyError, RuntimeError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"flowscope {args.command}: error: {msg}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug: still one line, with the traceback on request
        if os.environ.get("FLOWSCOPE_DEBUG"):
            raise
        print(f"flowscope {args.command}: internal error: {type(exc).__name__}: {exc} "
              f"(set FLOWSCOPE_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
