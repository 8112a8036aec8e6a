"""``flowscope ui [STORE]``: serve the dashboard over a store, read-only, and open it in a browser."""

from __future__ import annotations

import argparse
import sys

from flowscope.cli.output import STORE_HELP
from flowscope.store.catalog import default_store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="serve the dashboard over a store (read-only) and open it",
                       description="Serve the dashboard over a store, read-only: the runs, live or finished, with "
                                   "their progress, task stream and host charts. Runs that another process is "
                                   "writing are followed as their segments reach the disk. Prints the URL and "
                                   "opens it in a browser.")
    p.add_argument("store", nargs="?", default=None, help=STORE_HELP)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1); any other than loopback requires a token")
    p.add_argument("--port", type=int, default=8766, help="port (default 8766; 0 picks a free one)")
    p.add_argument("--no-open", action="store_true", help="print the URL only; do not open a browser")
    p.add_argument("--token", default=None,
                   help="the token a browser must present (default $FLOWSCOPE_TOKEN; beyond loopback, else a new "
                        "one is generated); the printed URL carries it")
    p.add_argument("--insecure", action="store_true",
                   help="bind beyond loopback without a token: anyone who can reach the port may read the runs")
    from flowscope.cli.serve import add_forecast_model

    add_forecast_model(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flowscope.cli.serve import _access, _given, dashboard_url, use_forecast_models
    from flowscope.service.auth import TokenAuth
    from flowscope.service.dashboard_routes import dashboard_app
    from flowscope.service.server import address_of, bind, run_uvicorn

    store = Path(args.store or default_store())
    if not store.is_dir():
        raise FileNotFoundError(f"{store}: no such store directory")
    use_forecast_models(args)
    token, access = _access(args)
    app = dashboard_app(store)
    if token:
        app = TokenAuth(app, token)
    sock = bind(args.host, args.port)
    given = _given(args)
    url = dashboard_url(address_of(sock), token, given)
    print(f"flowscope dashboard (read-only) over {store}: {url}", file=sys.stderr, flush=True)
    if access:
        print(f"flowscope ui: {access}", file=sys.stderr, flush=True)
    if not args.no_open:
        import webbrowser

        webbrowser.open(url if not (token and given) else f"{address_of(sock)}/ui/")
    run_uvicorn(app, sock)
    return 0
