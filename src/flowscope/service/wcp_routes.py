"""The collector's data-state endpoints: states, mutations and the run's current critical path.

POST /v1/runs/{run}/states and /v1/runs/{run}/mutations take JSON (one record, a list, or
``{"states": [...], "mutations": [...]}`` for both at once) or an Arrow IPC stream; the
whole request is checked against the run's graph (model/data_states.py: StateIndex) before
anything is written, and a bad record gets 422 ``{"error", "table", "field", "record"}``.
GET on the same paths lists rows, filtered by column (``?location=node1:disk1``,
``?kind=MERGE``, ``?ts_ns__gte=...``). GET /v1/runs/{run}/critical-path serves the path
maintained incrementally: each request adds the batches acknowledged since the previous one
(O(new records)), so posting stays at the cost of checking and writing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
import weakref

import pyarrow as pa
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from flowscope.model.conform import SchemaError
from flowscope.model.data_states import (
    MUTATIONS,
    STATES,
    DataStateError,
    StateIndex,
    as_table,
)
from flowscope.model.provenance import check_run_id
from flowscope.model.schemas import TABLES
from flowscope.service.collector import Collector, CollectorBusy
from flowscope.store.run import Run

ARROW_STREAM = "application/vnd.apache.arrow.stream"
BODY_LIMIT = 256 * 2**20
LIMIT_MAX = 100_000
_OPS = {"": "=", "gte": ">=", "lte": "<=", "gt": ">", "lt": "<", "ne": "<>"}


def _incremental_path():
    """A new IncrementalDataStatePath, or None while the analysis module is not installed."""
    try:
        from flowscope.analysis.critical_path import IncrementalDataStatePath
    except ImportError:
        return None
    return IncrementalDataStatePath()


class RunGraph:
    """One run's data-state graph as the collector knows it: the index that checks new records, and
    the incrementally maintained critical path."""

    def __init__(self, collector: Collector, run_id: str):
        self.collector = collector
        self.run_id = run_id
        self.lock = threading.Lock()
        self.index = StateIndex()
        self.path = _incremental_path()
        self._unpathed: list[tuple[pa.Table, pa.Table]] = []   # checked and written, not yet in the path
        self._on_disk = (0, 0)
        self._reload()

    def _disk_counts(self) -> tuple[int, int]:
        counts = Run(self.collector.run_dir(self.run_id)).counts()
        return counts[STATES], counts[MUTATIONS]

    def _reload(self) -> None:
        """Rebuild from the run on disk (first use, or rows written by another collector instance or by the
        generic table endpoint)."""
        run = Run(self.collector.run_dir(self.run_id))
        states, muts = run.arrow(STATES), run.arrow(MUTATIONS)
        self.index = StateIndex()
        self.index.add_states(states, checked=False)
        self.index.add_mutations(muts, checked=False)
        self.path = _incremental_path()
        self._unpathed = []
        if self.path is not None and (states.num_rows or muts.num_rows):
            self.path.add(states, muts)
        self._on_disk = (states.num_rows, muts.num_rows)

    def _write(self, parts: list[tuple[str, pa.Table]]) -> None:
        """Write the tables (in parallel on the collector's writers) and wait until all are on disk."""
        total = sum(d.nbytes for _, d in parts)
        self.collector.reserve(total)  # all or none: busy before anything is queued
        futures = []
        for i, (table, data) in enumerate(parts):
            futures.append(self.collector.submit(self.run_id, table, f"ds-{uuid.uuid4().hex}", data,
                                                 reserved=data.nbytes if i < len(parts) - 1 else
                                                 total - sum(d.nbytes for _, d in parts[:-1])))
        for f in futures:
            f.result()

    def _catch_up(self) -> None:
        """Bring the critical path up to date with the batches written since it was last asked for."""
        if self.path is not None and self._unpathed:
            self.path.add(pa.concat_tables([s for s, _ in self._unpathed]),
                          pa.concat_tables([m for _, m in self._unpathed]))
        self._unpathed = []

    def ingest(self, states: pa.Table, mutations: pa.Table) -> dict:
        """Check both batches against the graph, then write states before mutations; DataStateError (nothing
        written) if a record breaks a rule."""
        with self.lock:
            try:
                new_states = self.index.check_states(states)
                new_muts = self.index.check_mutations(mutations, states)
            except DataStateError as exc:
                if exc.field not in ("src_state_id", "dst_state_id") or self._disk_counts() == self._on_disk:
                    raise
                self._reload()  # another writer added states: check again against everything
                new_states = self.index.check_states(states)
                new_muts = self.index.check_mutations(mutations, states)
            self._write([(t, d) for t, d in ((STATES, new_states), (MUTATIONS, new_muts)) if d.num_rows])
            self.index.add_states(new_states)
            self.index.add_mutations(new_muts)
            self._on_disk = (self._on_disk[0] + new_states.num_rows, self._on_disk[1] + new_muts.num_rows)
            if new_states.num_rows or new_muts.num_rows:
                self._unpathed.append((new_states, new_muts))
            return {"states": new_states.num_rows, "mutations": new_muts.num_rows,
                    "repeated": states.num_rows + mutations.num_rows - new_states.num_rows - new_muts.num_rows}

    def critical_path(self) -> dict:
        """The current critical path: state ids in path order, its length, and its steps."""
        with self.lock:
            if self._disk_counts() != self._on_disk:
                self._reload()
            self._catch_up()
            if self.path is None:
                raise LookupError("critical-path analysis is not available in this collector "
                                  "(flowscope.analysis.critical_path is missing)")
            cp = self.path.current()
            n_states, n_muts = len(self.index), self.index.n_mutations
        return {"run_id": self.run_id, **cp.to_dict(), "n_states": n_states, "n_mutations": n_muts}


_graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_graphs_lock = threading.Lock()


def graph_for(collector: Collector, run_id: str) -> RunGraph:
    """The collector's RunGraph for ``run_id`` (created, from the run on disk, on first use)."""
    with _graphs_lock:
        per_run = _graphs.setdefault(collector, {})
        g = per_run.get(run_id)
        if g is None:
            g = per_run[run_id] = RunGraph(collector, run_id)
        return g


def ingest(collector: Collector, run_id: str, states, mutations) -> dict:
    """Check and write ``states`` and ``mutations`` (records or Arrow tables) into ``run_id``: all or nothing."""
    return graph_for(collector, run_id).ingest(as_table(STATES, states), as_table(MUTATIONS, mutations))


class _Refused(Exception):
    def __init__(self, status: int, body: dict, headers: dict | None = None):
        self.status, self.body, self.headers = status, body, headers


def _run_id(request: Request, collector: Collector) -> str:
    run_id = request.path_params["run_id"]
    try:
        check_run_id(run_id)
    except ValueError as exc:
        raise _Refused(400, {"error": str(exc)}) from None
    if not collector.has_run(run_id):
        raise _Refused(404, {"error": f"unknown run {run_id!r}: open it first with POST /v1/runs"})
    return run_id


def _split_body(table: str, body: bytes, content_type: str) -> tuple[pa.Table, pa.Table]:
    """The (states, mutations) a request carries; ``table`` is what the path names."""
    empty = {STATES: None, MUTATIONS: None}
    if content_type.startswith(ARROW_STREAM):
        try:  # on /states, a second stream after the first carries mutations (one request for both)
            source = pa.BufferReader(pa.py_buffer(body))
            with pa.ipc.open_stream(source) as reader:
                parts = {**empty, table: reader.read_all()}
            if table == STATES and source.tell() < len(body):
                with pa.ipc.open_stream(source) as reader:
                    parts[MUTATIONS] = reader.read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            raise _Refused(400, {"error": f"malformed Arrow IPC stream ({len(body)} bytes): {exc}"}) from None
    elif content_type.startswith("application/json") or not content_type:
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise _Refused(400, {"error": f"body is not valid JSON: {exc}"}) from None
        if isinstance(doc, dict) and ("states" in doc or "mutations" in doc):
            unknown = set(doc) - {"states", "mutations"}
            if unknown:
                raise _Refused(422, {"error": f"unknown key(s) {sorted(unknown)}: a graph body has 'states' and "
                                              f"'mutations'", "field": sorted(unknown)[0]})
            parts = {STATES: doc.get("states"), MUTATIONS: doc.get("mutations")}
        elif isinstance(doc, (dict, list)):
            parts = {**empty, table: doc}
        else:
            raise _Refused(400, {"error": "body must be a JSON object, a list of objects, or "
                                          "{\"states\": [...], \"mutations\": [...]}"})
        for name, val in parts.items():
            if val is not None and not isinstance(val, (dict, list)):
                raise _Refused(422, {"error": f"{name} must be an object or a list of objects", "table": name})
    else:
        raise _Refused(415, {"error": f"unsupported Content-Type {content_type!r}: use application/json "
                                      f"or {ARROW_STREAM}"})
    return as_table(STATES, parts[STATES]), as_table(MUTATIONS, parts[MUTATIONS])


def _filters(table: str, params: dict) -> tuple[str, list, int, int]:
    try:
        limit = int(params.pop("limit", 1000))
        offset = int(params.pop("offset", 0))
    except ValueError:
        raise _Refused(400, {"error": "limit and offset must be integers"}) from None
    if not 0 <= limit <= LIMIT_MAX or offset < 0:
        raise _Refused(400, {"error": f"limit must be within 0..{LIMIT_MAX} and offset >= 0"})
    cols = TABLES[table].names
    where, args = [], []
    for key, value in params.items():
        col, _, op = key.partition("__")
        if col == "application" and table == STATES:
            col = "origin"  # a state's application is the one that produced it
        if col not in cols:
            raise _Refused(400, {"error": f"unknown filter {key!r}; columns of {table} are {', '.join(cols)}",
                                 "field": col})
        if op not in _OPS:
            raise _Refused(400, {"error": f"unknown filter operator {op!r} in {key!r}: use gt, gte, lt, lte, ne"})
        where.append(f'"{col}" {_OPS[op]} ?')
        args.append(value)
    order = "ts_ns, state_id" if table == STATES else "mutation_id"
    sql = f'SELECT * FROM "{table}"' + (" WHERE " + " AND ".join(where) if where else "")
    return f"{sql} ORDER BY {order} LIMIT {limit} OFFSET {offset}", args, limit, offset


def data_state_routes(collector: Collector) -> list[Route]:
    """The routes to mount on the collector's app."""

    def guarded(handler):
        async def endpoint(request: Request) -> JSONResponse:
            try:
                return await handler(request)
            except _Refused as exc:
                return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)
            except DataStateError as exc:
                return JSONResponse({"error": str(exc), "table": exc.table, "field": exc.field,
                                     "record": exc.record, "message": exc.message}, status_code=422)
            except SchemaError as exc:
                return JSONResponse({"error": str(exc), "table": exc.table, "field": exc.column}, status_code=422)
            except CollectorBusy as exc:
                return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})
        return endpoint

    def post(table: str):
        async def handler(request: Request) -> JSONResponse:
            run_id = _run_id(request, collector)
            chunks, total = [], 0
            async for chunk in request.stream():
                total += len(chunk)
                if total > BODY_LIMIT:
                    raise _Refused(413, {"error": f"request body exceeds {BODY_LIMIT} bytes; send smaller batches"})
                chunks.append(chunk)
            states, muts = _split_body(table, b"".join(chunks), request.headers.get("content-type", ""))
            g = await asyncio.to_thread(graph_for, collector, run_id)
            result = await asyncio.to_thread(g.ingest, states, muts)
            return JSONResponse(result, status_code=201)
        return handler

    def get(table: str):
        async def handler(request: Request) -> JSONResponse:
            run_id = _run_id(request, collector)
            sql, args, limit, offset = _filters(table, dict(request.query_params))
            run = Run(collector.run_dir(run_id))
            try:
                if not run.segments(table):
                    rows = []
                else:
                    rows = (await asyncio.to_thread(run.sql_arrow, sql, args)).to_pylist()
            except Exception as exc:  # DuckDB conversion errors on filter values
                raise _Refused(400, {"error": f"query failed: {exc}"}) from None
            finally:
                run.close()
            key = "states" if table == STATES else "mutations"
            return JSONResponse({key: rows, "count": len(rows), "limit": limit, "offset": offset})
        return handler

    async def critical_path(request: Request) -> JSONResponse:
        run_id = _run_id(request, collector)
        g = await asyncio.to_thread(graph_for, collector, run_id)
        try:
            doc = await asyncio.to_thread(g.critical_path)
        except LookupError as exc:
            raise _Refused(501, {"error": str(exc)}) from None
        return JSONResponse(doc)

    return [
        Route("/v1/runs/{run_id}/states", guarded(post(STATES)), methods=["POST"]),
        Route("/v1/runs/{run_id}/states", guarded(get(STATES)), methods=["GET"]),
        Route("/v1/runs/{run_id}/mutations", guarded(post(MUTATIONS)), methods=["POST"]),
        Route("/v1/runs/{run_id}/mutations", guarded(get(MUTATIONS)), methods=["GET"]),
        Route("/v1/runs/{run_id}/critical-path", guarded(critical_path), methods=["GET"]),
    ]
