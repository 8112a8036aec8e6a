"""The embedded mode: a collector in this process for a client that has no collector address (with
``serve=True``, also its HTTP server on loopback, so child processes join the run).

It composes client/ (the producer API) and service/ (the collector) from above, so neither of them imports the
other. ``flowscope.Client`` and ``flowscope.step`` are the classes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from flowscope.client import client as _client
from flowscope.client.transport import Busy, Rejected, RunNotOpen
from flowscope.model.conform import SchemaError
from flowscope.model.provenance import check_close_request
from flowscope.service.collector import Collector, CollectorBusy, UnknownRun
from flowscope.store.catalog import default_store

EMBEDDED = _client.EMBEDDED


class EmbeddedTransport:
    """Direct calls into a collector in this process: same validation and store, no network."""

    def __init__(self, collector: Collector):
        self.collector = collector
        self.address = f"embedded:{collector.store}"

    def health(self, timeout: float = 2.0) -> dict:
        return self.collector.health()

    def open_run(self, meta: dict) -> dict:
        try:
            return self.collector.open_run(meta)
        except ValueError as exc:  # as the HTTP API answers it
            raise Rejected(422, str(exc)) from None

    def close_run(self, run_id: str, info: dict) -> dict:
        try:
            end_ns, status = check_close_request(info)
        except ValueError as exc:
            raise Rejected(422, str(exc)) from None
        return self.collector.close_run(run_id, end_ns=end_ns, status=status)

    def send(self, run_id: str, table: str, segment_id: str, data: pa.Table | bytes) -> dict:
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        try:
            res = self.collector.ingest(run_id, table, segment_id, data)
        except CollectorBusy as exc:
            raise Busy(str(exc)) from None
        except UnknownRun as exc:  # as over HTTP: retried, then spooled (the owner may open it in a moment)
            raise RunNotOpen(str(exc)) from None
        except (SchemaError, ValueError) as exc:
            raise Rejected(422 if isinstance(exc, SchemaError) else 404, str(exc)) from None
        except OSError as exc:  # the store could not be written (disk full, permissions): retry, then spool
            raise Busy(f"store write failed: {exc}") from None
        return {"rows": res.rows, "duplicate": res.duplicate, "watched": self.collector.watched(run_id)}

    def close(self) -> None:
        pass


class EmbeddedCollector:
    """A collector in this process writing to ``store`` (default $FLOWSCOPE_STORE or ./flowscope-runs), with its
    HTTP server on a loopback port when ``serve``: what an address-less :class:`Client` writes to."""

    def __init__(self, store: str | Path | None = None, options: dict | None = None, *, serve: bool = False,
                 token: str | None = None):
        self.collector = Collector(store if store is not None else default_store(), **(options or {}))
        self.transport = EmbeddedTransport(self.collector)
        self.server = None
        if serve:
            from flowscope.service.server import BackgroundServer

            self.server = BackgroundServer(self.collector, token=token)
        self.address = self.server.address if self.server else EMBEDDED

    def run_dir(self, run_id: str) -> Path:
        return self.collector.run_dir(run_id)

    def post_data_states(self, run_id: str, states, mutations) -> dict:
        """Check and write states and mutations, all or nothing (the collector's /states endpoint, called)."""
        from flowscope.service.wcp_routes import ingest

        return ingest(self.collector, run_id, states, mutations)

    def analyze(self, run_id: str, namespace: str, request: dict) -> dict:
        """Run an analysis request over a namespace's rows (the collector's /analyze endpoint, called)."""
        from flowscope.service.namespace_routes import analyze

        return analyze(self.collector, run_id, namespace, request)

    def stop(self) -> None:
        """Stop the server, then let the collector finish its queued writes."""
        if self.server:
            self.server.stop()
        self.collector.shutdown(wait=True)


class Client(_client.Client):
    """``flowscope.Client``: :class:`flowscope.client.client.Client`, and when no collector address is known
    (no ``address``, ``address_file``, $FLOWSCOPE_ADDRESS or $FLOWSCOPE_ADDRESS_FILE) a collector in this process
    writing to ``store``; ``serve=True`` also serves it on a loopback port, so child processes can join the run
    (``env()``). ``collector_options`` go to the collector."""

    def _embed(self, store, collector_options: dict, serve: bool, token: str | None) -> EmbeddedCollector:
        return EmbeddedCollector(store, collector_options, serve=serve, token=token)


def namespace(name: str, *, client: _client.Client | None = None, publish_every: int = 1, blocking: bool = True,
              resource_id: str | None = None, run_name: str | None = None, **client_options):
    """``flowscope.namespace``: a :class:`~flowscope.client.namespaces.Namespace` publishing into ``client``'s run
    or, without one, into the run (named ``run_name``) of a Client made with ``client_options`` (which joins
    $FLOWSCOPE_ADDRESS and $FLOWSCOPE_RUN when set, else runs a collector in this process); closing the namespace
    then closes that client. SOMA's four domains are the namespaces ``performance``, ``application``, ``hardware``
    and ``workflow`` (and their sub-namespaces, ``application.astaroth``); any other valid name is a namespace of
    your own."""
    from flowscope.model.namespaces import check_namespace

    check_namespace(name)  # before a client (and maybe a collector) is started for it
    if client is not None:
        return client.namespace(name, publish_every=publish_every, blocking=blocking, resource_id=resource_id)
    made = Client(name=run_name, **client_options)
    try:
        ns = made.namespace(name, publish_every=publish_every, blocking=blocking, resource_id=resource_id)
    except BaseException:
        made.close()
        raise
    ns._owns_client = True
    return ns


# client/data_states.py is imported when a step is made, not with this module: it imports pandas, which a
# program that only records through a Client does not pay for (tests/test_layout.py checks it)

def step_client(address: str | None = None, run_id: str | None = None, store: str | Path | None = None,
                name: str | None = None, serve: bool = False) -> Client:
    """A Client that joins ``run_id`` (or $FLOWSCOPE_RUN) at ``address`` (or $FLOWSCOPE_ADDRESS), or an embedded
    one writing to ``store`` when no collector address is known."""
    from flowscope.client.data_states import step_client as join_or_embed

    return join_or_embed(address, run_id, store, name=name, serve=serve, client_class=Client)


def step(name: str, inputs: Sequence[str | Path] = (), outputs: Sequence[str | Path] = (), *, client=None,
         address: str | None = None, run_id: str | None = None, store: str | Path | None = None):
    """``flowscope.step``: ``with step("name", inputs=[...], outputs=[...]):`` records the block as a step (see
    :class:`flowscope.client.data_states.step`), writing to an embedded collector (``store``) when neither
    ``client`` nor a collector address is known."""
    from flowscope.client.data_states import step as recorded_step

    made = recorded_step(name, inputs, outputs, client=client, address=address, run_id=run_id, store=store)
    made.client_class = Client
    return made
