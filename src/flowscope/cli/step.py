"""``flowscope step NAME --in FILE... --out FILE... -- COMMAND``: run one step of a script-driven workflow and
record it as a span, its input and output files as data states, and the mutations between them."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

from flowscope.store.catalog import DEFAULT_STORE, STORE_ENV

DESCRIPTION = ("Run COMMAND as the workflow step NAME. Its declared input files are recorded as data states before "
               "it runs and its output files after (size and time from the file system), with a mutation from each "
               "input to each output (one to one CONVERT, one to many SPLIT, many MERGE) and a span for the step. "
               "A file one step writes and another reads is the same state, so steps chain into one graph. Joins "
               "$FLOWSCOPE_RUN at $FLOWSCOPE_ADDRESS (as set by `flowscope run`) unless --run / --address say "
               "otherwise; without an address, writes to the run store directly. The exit status is the command's.")
USAGE = "flowscope step NAME [--in FILE ...] [--out FILE ...] [options] -- COMMAND [ARG ...]"


def register(sub: argparse._SubParsersAction) -> None:
    # argparse cannot mix a leading positional, list options and a trailing command: the words are parsed
    # by parser() once split at "--"
    p = sub.add_parser("step", help="run one workflow step and record its files as data states",
                       description=DESCRIPTION, usage=USAGE, add_help=False)
    p.add_argument("words", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=lambda args: main(args.words))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowscope step", usage=USAGE, description=DESCRIPTION)
    p.add_argument("name", metavar="NAME", help="the step's name (its application in the graph)")
    p.add_argument("--in", dest="inputs", nargs="+", action="extend", default=[], metavar="FILE",
                   help="files the step reads (must exist)")
    p.add_argument("--out", dest="outputs", nargs="+", action="extend", default=[], metavar="FILE",
                   help="files the step writes")
    p.add_argument("--run", default=None, help="the run to record into (default $FLOWSCOPE_RUN, else a new run)")
    p.add_argument("--address", default=None, metavar="URL",
                   help="collector address (default $FLOWSCOPE_ADDRESS, else the store is written directly)")
    p.add_argument("--store", default=None, help=f"run store written when no collector address is given "
                                                 f"(default ${STORE_ENV}, else ./{DEFAULT_STORE})")
    return p


def parse(words: list[str]) -> argparse.Namespace:
    """NAME and options before the first "--", the command after it."""
    if "--" in words:
        cut = words.index("--")
        head, cmd = words[:cut], words[cut + 1:]
    else:
        head, cmd = words, []
    args = parser().parse_args(head)
    args.argv = cmd
    return args


def run(args: argparse.Namespace) -> int:
    from flowscope.client.data_states import DataStates, Step
    from flowscope.embedded import step_client
    from flowscope.model import identifiers as ids

    cmd = list(args.argv)
    if not cmd:
        raise ValueError("no command given: flowscope step NAME [--in FILE ...] [--out FILE ...] -- COMMAND")
    client = step_client(args.address, args.run, args.store, name=args.name)
    st = Step(args.name, DataStates(client, batch=1_000_000), args.inputs, args.outputs)
    try:
        st.begin()
        proc = subprocess.Popen(cmd)
    except BaseException as exc:
        client.close(status="failed")
        if isinstance(exc, OSError):
            raise ValueError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from None
        raise
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    host = ids.hostname()
    child = client.resource("process", ids.process_id(proc.pid), name=f"{host}:{proc.pid}", parent_id=ids.host_id(),
                            host=host, pid=proc.pid, attrs={"argv": cmd[:16]}, start_ns=st.start_ns)
    try:
        st.end({"argv": cmd, "exit_code": rc}, resource_id=child)
    finally:
        client.close(status="finished" if rc == 0 else "failed")
    for why in st.skipped:
        print(f"flowscope step {args.name}: output not recorded: {why}", file=sys.stderr)
    if client.owns_run or args.run is None:
        print(f"flowscope step {args.name}: run {client.run_id} "
              f"({len(st.input_states)} in, {len(st.output_states)} out)", file=sys.stderr)
    return rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's convention


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m flowscope.cli.step`` (the same as ``flowscope step``)."""
    args = parse(sys.argv[1:] if argv is None else list(argv))
    try:
        return run(args)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"flowscope step: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

