"""``flowscope serve``: run the collector service in the foreground."""

from __future__ import annotations

import argparse
import os
import sys

from flowscope.service.collector import MiB, Collector
from flowscope.cli.output import STORE_HELP
from flowscope.store.catalog import default_store

#: For tests only: the collector kills itself (SIGKILL) right after renaming its N-th segment into place,
#: before it acknowledges that batch, so that a test can replay a batch that is on disk but unacknowledged.
KILL_AFTER_SEGMENTS_ENV = "FLOWSCOPE_TEST_KILL_AFTER_SEGMENTS"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the collector service (HTTP, loopback by default)",
                       description="Run the collector: batched ingest, run open/close, health and per-table "
                                   "JSON queries, written to the run store as batches arrive.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1); any other than loopback requires a token")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--store", default=None, help=STORE_HELP)
    p.add_argument("--address-file", default=None,
                   help="append this instance's address to FILE (clients spread over the listed instances)")
    p.add_argument("--namespaces", default=None, metavar="GLOB[,GLOB...]",
                   help="this instance serves the namespaces matching these patterns (written next to its address "
                        "in --address-file): clients send those namespaces' publications here, and the rest elsewhere")
    p.add_argument("--queue-mb", type=float, default=256,
                   help="memory bound for batches received and not yet written, MiB (default 256)")
    p.add_argument("--max-request-mb", type=float, default=64, help="largest accepted request body, MiB (default 64)")
    p.add_argument("--writers", type=int, default=2, help="writer threads (default 2)")
    p.add_argument("--fsync", action="store_true", help="fsync each segment before acknowledging it")
    p.add_argument("--writer-delay", type=float, default=0.0, metavar="SECONDS",
                   help="sleep before each segment write: simulates a slow file system (backpressure tests)")
    p.add_argument("--nice", type=int, default=0, metavar="N",
                   help="add N to the collector's CPU niceness before it starts (default 0): with N > 0, on a "
                        "saturated machine the processes it observes run first and its ingest catches up in idle time")
    broker = p.add_argument_group("Redis Streams", "Producers that cannot reach a collector, or many collector "
                                  "instances sharing the work: clients send to redis://HOST:PORT[/DB][?stream=NAME] "
                                  "(as their address or $FLOWSCOPE_ADDRESS); every instance serving that stream takes "
                                  "its share (docs/redis.md)")
    broker.add_argument("--redis", default=None, metavar="URL",
                        help="also read batches from this Redis stream (redis://HOST:PORT[/DB][?stream=NAME], "
                             "stream 'flowscope' by default), as one instance of its consumer group")
    broker.add_argument("--redis-claim-idle", type=float, default=30.0, metavar="SECONDS",
                        help="take over entries another instance took and left unacknowledged this long (it died), "
                             "and retry entries whose run was not open yet (default 30)")
    p.add_argument("--exit-with", type=int, default=None, metavar="PID",
                   help="stop when process PID ends (observe() starts its collector so): the runs still open are "
                        "marked interrupted, every acknowledged record kept, and the address file removed if it "
                        "lists no other instance")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="server log verbosity (default warning)")
    auth = p.add_argument_group("access", "A collector bound beyond loopback answers only requests that carry its "
                                "token (Authorization: Bearer TOKEN). Clients send $FLOWSCOPE_TOKEN, or the token "
                                "written next to the address in --address-file.")
    auth.add_argument("--token", default=None,
                      help="the token clients must send (default $FLOWSCOPE_TOKEN; beyond loopback, else a new one "
                           "is generated and printed); on loopback a token is required only when given")
    auth.add_argument("--insecure", action="store_true",
                      help="bind beyond loopback without a token: anyone who can reach the port may write and read runs")
    auth.add_argument("--ssl-keyfile", default=None, metavar="FILE", help="serve HTTPS with this private key (PEM)")
    auth.add_argument("--ssl-certfile", default=None, metavar="FILE",
                      help="... and this certificate (PEM); clients verify it (SSL_CERT_FILE for a private CA)")
    add_forecast_model(p)
    p.set_defaults(func=run)


def add_forecast_model(p: argparse.ArgumentParser) -> None:
    """The ``--forecast-model`` option of a command that serves the forecast route."""
    p.add_argument("--forecast-model", action="append", default=None, metavar="FILE",
                   help="window-size model written by `flowscope forecast bench` (one per event; repeat for "
                        "several): the forecast (the overview's panel) takes its frame size from it; default "
                        "$FLOWSCOPE_FORECAST_MODEL, else the documented default window")


def use_forecast_models(args: argparse.Namespace) -> None:
    """Check the models ``--forecast-model`` names (ValueError naming a file that is not one) and hand them to the
    forecast route, and to any collector this process starts, through $FLOWSCOPE_FORECAST_MODEL."""
    if not args.forecast_model:
        return  # the forecast's modules (pandas) wait for the first forecast a page asks for
    from pathlib import Path

    from flowscope.analysis.forecast.model import MODELS_ENV, load_models

    load_models(args.forecast_model)
    os.environ[MODELS_ENV] = os.pathsep.join(str(Path(f).resolve()) for f in args.forecast_model)


def _access(args: argparse.Namespace) -> tuple[str | None, str]:
    """The token to require (None: none) and the line that tells the user how clients get in."""
    from flowscope.service.auth import TOKEN_ENV, is_loopback, new_token

    given = args.token or os.environ.get(TOKEN_ENV) or None
    if args.insecure:
        if args.token:
            raise ValueError("--insecure and --token contradict each other: give one of them")
        return None, (f"--insecure: no token required; anyone who can reach {args.host}:{args.port} may write and "
                      f"read runs")
    if given:
        source = "--token" if args.token else f"${TOKEN_ENV}"
        return given, f"clients must send the token given by {source} (${TOKEN_ENV}, or the address file)"
    if is_loopback(args.host):
        return None, ""
    token = new_token()
    return token, (f"bound beyond loopback: clients must send the token, e.g. in their environment "
                   f"{TOKEN_ENV}={token} (or --token / ${TOKEN_ENV} to choose it, --insecure for none)")


def _given(args: argparse.Namespace) -> str | None:
    """Where the user gave the token (None: not given, so generated or none)."""
    from flowscope.service.auth import TOKEN_ENV

    if getattr(args, "insecure", False):
        return None
    return "--token" if args.token else (f"${TOKEN_ENV}" if os.environ.get(TOKEN_ENV) else None)


def dashboard_url(address: str, token: str | None, given: str | None = None) -> str:
    """The dashboard's runs list on a server at ``address`` (``flowscope.ui.dashboard_url``)."""
    from flowscope.ui import dashboard_url as url

    return url(address, None, token, given)


def _lower_priority(increment: int) -> None:
    """Add ``increment`` to this process's niceness, on every thread: Linux keeps a niceness per thread, a new thread
    takes its creator's, and native threads (pyarrow's allocator) may already run, so each is set."""
    level = os.nice(increment)
    tasks = f"/proc/{os.getpid()}/task"
    for tid in os.listdir(tasks) if os.path.isdir(tasks) else ():
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), level)
        except OSError:  # a thread that ended meanwhile
            pass


def _namespace_patterns(text: str) -> str:
    """``--namespaces`` as the address file writes it; ValueError names a bad pattern."""
    patterns = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in patterns if any(c.isspace() or c == "=" for c in p)]
    if not patterns or bad:
        raise ValueError(f"--namespaces {text!r}: give comma-separated glob patterns of namespace names, without "
                         f"spaces or '='" + (f" ({bad[0]!r})" if bad else ""))
    return ",".join(patterns)


def run(args: argparse.Namespace) -> int:
    from flowscope.service.server import serve_forever

    if args.namespaces is not None:
        args.namespaces = _namespace_patterns(args.namespaces)
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together")
    use_forecast_models(args)
    token, access = _access(args)
    if args.nice:
        _lower_priority(args.nice)
    store = args.store or default_store()
    collector = Collector(store, queue_bytes=int(args.queue_mb * MiB), max_request_bytes=int(args.max_request_mb * MiB),
                          writers=args.writers, writer_delay=args.writer_delay, fsync=args.fsync,
                          kill_after_segments=int(os.environ.get(KILL_AFTER_SEGMENTS_ENV) or 0))

    consumer = None
    if args.redis:
        from flowscope.service.redis_consumer import RedisConsumer

        consumer = RedisConsumer(collector, args.redis, claim_idle_s=args.redis_claim_idle)

    def ready(address: str) -> None:
        if consumer is not None:
            consumer.start()
            print(f"flowscope collector reading the Redis stream {consumer.stream!r} at {args.redis} as "
                  f"{consumer.consumer!r}", file=sys.stderr, flush=True)
        print(f"flowscope collector listening on {address} (store {store})", file=sys.stderr, flush=True)
        if access:
            print(f"flowscope collector: {access}", file=sys.stderr, flush=True)
        print(f"flowscope dashboard: {dashboard_url(address, token, _given(args))}", file=sys.stderr, flush=True)

    serve_forever(collector, args.host, args.port, address_file=args.address_file, log_level=args.log_level,
                  on_ready=ready, on_stop=consumer.stop if consumer is not None else None, token=token,
                  ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, namespaces=args.namespaces,
                  exit_with=args.exit_with)
    return 0
