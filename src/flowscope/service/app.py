"""The collector's HTTP API (Starlette): run open/close, batched ingest, health, per-table JSON queries.

Ingest bodies are Arrow IPC streams (``application/vnd.apache.arrow.stream``) or
JSON arrays of records (``application/json``). Errors are JSON ``{"error": ...}``
with a 4xx status that names the problem, or 503 with Retry-After when busy.
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
import uuid

import pyarrow as pa
import pyarrow.compute as pc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from flowscope import __version__
from flowscope.model import json_columns
from flowscope.model.conform import SchemaError, conform
from flowscope.model.provenance import check_close_request, check_run_id
from flowscope.model.schemas import DERIVED_TABLES, TABLES, schema
from flowscope.service.collector import Collector, CollectorBusy, UnknownRun
from flowscope.store.catalog import list_runs, run_meta
from flowscope.store.run import Run
from flowscope.service.anomaly_server import anomaly_routes
from flowscope.service.dashboard_routes import dashboard_routes
from flowscope.service.live_hub import LiveHub
from flowscope.service.metrics_route import metrics_routes
from flowscope.service.json_batch import WINDOW_CHARS, MalformedBatch, json_batch_table
from flowscope.service.forecast_routes import forecast_routes
from flowscope.service.namespace_routes import namespace_routes
from flowscope.service.wcp_routes import data_state_routes

ARROW_STREAM = "application/vnd.apache.arrow.stream"
SEGMENT_HEADER = "x-flowscope-segment"
QUERY_LIMIT_MAX = 100_000


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None, reason: str | None = None):
        self.status, self.message, self.headers, self.reason = status, message, headers, reason


#: the ``reason`` of a 404 for a run this collector does not know (yet): a joining producer retries it
UNKNOWN_RUN = "unknown-run"


def _error(status: int, message: str, headers: dict | None = None, reason: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, **({"reason": reason} if reason else {})}, status_code=status,
                        headers=headers)


def _table_name(request: Request) -> str:
    table = request.path_params["table"]
    if table not in TABLES and table not in DERIVED_TABLES:  # anomalies: recorded by the workers' detectors
        raise ApiError(404, f"unknown table {table!r}; tables are {', '.join([*TABLES, *DERIVED_TABLES])}")
    return table


def _run_id(request: Request, collector: Collector) -> str:
    run_id = request.path_params["run_id"]
    try:
        check_run_id(run_id)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    if not collector.has_run(run_id):
        raise ApiError(404, f"unknown run {run_id!r}: open it first with POST /v1/runs", reason=UNKNOWN_RUN)
    return run_id


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise ApiError(400, f"bad Content-Length {declared!r}") from None
        if n > limit:
            raise ApiError(413, f"request body of {n} bytes exceeds the limit of {limit} bytes; send smaller batches")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes; send smaller batches")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(request: Request, limit: int = 16 * 2**20) -> dict:
    body = await _read_body(request, limit)
    if not body:
        return {}
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(400, f"body must be a JSON object, got {type(doc).__name__}")
    return doc


# What an ingest body costs in memory, in bytes, from admission until its segment is written: the
# collector's budget counts it (docs/performance.md, "Collector memory", has the measurements).
#: Arrow IPC: the body, which the decoded table references, plus as much again for columns that
#: conform() has to convert; counted again from the decoded table before the batch is queued
ARROW_COST_PER_BYTE = 2
#: JSON: the body, its text (1 byte a character when the body is ASCII, else up to 4), the Python
#: objects of the window being parsed (up to 25 times its text, for `[{},{},...]`), and the Arrow table
#: built, taken to be as large as the body and counted as it is built
JSON_WINDOW_PER_BYTE = 25


class _Held:
    """The part of the collector's write budget one request holds."""

    def __init__(self, collector: Collector, nbytes: int):
        collector.reserve(nbytes)
        self.collector, self.nbytes = collector, nbytes

    def resize(self, nbytes: int) -> None:
        self.nbytes = self.collector.resize(self.nbytes, nbytes)

    def release(self) -> None:
        self.collector.release(self.nbytes)
        self.nbytes = 0


def _body_kind(content_type: str) -> str:
    if content_type.startswith((ARROW_STREAM, "application/octet-stream")):
        return "arrow"
    if content_type.startswith("application/json"):
        return "json"
    raise ApiError(415, f"unsupported Content-Type {content_type!r}: use {ARROW_STREAM} or application/json")


def _decode_cost(kind: str, nbytes: int, ascii_text: bool, arrow_bytes: int | None = None) -> int:
    """Bytes a body of ``nbytes`` needs while it is decoded (``arrow_bytes``: the Arrow built from a JSON
    body so far, when it is more than the body)."""
    if kind == "arrow":
        return ARROW_COST_PER_BYTE * nbytes or 1
    text = nbytes if ascii_text else 4 * nbytes
    window = JSON_WINDOW_PER_BYTE * min(nbytes, WINDOW_CHARS)
    return nbytes + text + window + max(nbytes, arrow_bytes or 0) or 1


def _declared_length(request: Request, limit: int) -> int | None:
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    try:
        n = int(declared)
    except ValueError:
        n = -1
    if n < 0:
        raise ApiError(400, f"bad Content-Length {declared!r}")
    if n > limit:
        raise ApiError(413, f"request body of {n} bytes exceeds the limit of {limit} bytes; send smaller batches")
    return n


async def _read_batch_body(request: Request, declared: int | None, limit: int) -> bytearray:
    """The body, counted as it streams in: never more than ``declared`` (when given) or ``limit`` bytes."""
    bound = limit if declared is None else declared
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > bound:
            if declared is None:
                raise ApiError(413, f"request body exceeds the limit of {limit} bytes; send smaller batches")
            raise ApiError(400, f"request body longer than its Content-Length of {declared} bytes")
        body += chunk
    return body


def _compressed_message(body: bytearray) -> str | None:
    """Which message of an Arrow IPC stream first has compressed buffers ("message 1, a record batch"), if any.

    A compressed body decodes to an amount of memory its length does not bound, so the collector
    refuses it before decoding. Arrow's Python API does not say whether a message is compressed;
    its flatbuffer header does: a RecordBatch (or a DictionaryBatch's data) with a ``compression`` field.
    """
    def field(meta: bytes, table: int, index: int) -> int | None:
        vtable = table - struct.unpack_from("<i", meta, table)[0]
        if 4 + 2 * index >= struct.unpack_from("<H", meta, vtable)[0]:
            return None
        offset = struct.unpack_from("<H", meta, vtable + 4 + 2 * index)[0]
        return table + offset if offset else None

    def target(meta: bytes, at: int) -> int:
        return at + struct.unpack_from("<I", meta, at)[0]

    try:
        for i, message in enumerate(pa.ipc.MessageReader.open_stream(pa.py_buffer(body))):
            if message.type not in ("record batch", "dictionary batch"):
                continue
            meta = message.metadata.to_pybytes()
            header = field(meta, target(meta, 0), 2)  # Message.header
            batch = target(meta, header) if header is not None else None
            if batch is not None and message.type == "dictionary batch":
                data = field(meta, batch, 1)  # DictionaryBatch.data
                batch = target(meta, data) if data is not None else None
            if batch is not None and field(meta, batch, 3) is not None:  # RecordBatch.compression
                return f"message {i}, a {message.type}"
    except (pa.ArrowInvalid, OSError, struct.error):
        return None  # not a well-formed stream: reading it says what is wrong
    return None


def _plain_bytes(column: pa.ChunkedArray) -> int:
    """Bytes a dictionary-encoded column, or a struct given for JSON text, takes once decoded to plain values, as
    conform() stores it."""
    if pa.types.is_struct(column.type):  # one conform() refuses (a field it cannot write) is not counted here
        return json_columns.text_bytes(column) if json_columns.field_problem(column.type) is None else 0
    total = 0
    for chunk in column.chunks:
        n = len(chunk)
        if pa.types.is_string(chunk.dictionary.type) or pa.types.is_binary(chunk.dictionary.type):
            lengths = pc.binary_length(chunk.dictionary).take(chunk.indices)
            total += (pc.sum(lengths).as_py() or 0) + 4 * (n + 1)
        else:
            total += n * max(1, chunk.dictionary.type.bit_width // 8)
    return total


def _decode_batch(table: str, body: bytearray, kind: str, held: _Held, limit: int) -> pa.Table:
    """The batch as a canonical table; ``held`` is resized to the bytes the table keeps until it is written.
    ``limit`` is the largest body accepted; no batch may decode to more than it could."""
    nbytes = len(body)
    if kind == "arrow":
        held.resize(_decode_cost(kind, nbytes, True))
        compressed = _compressed_message(body)
        if compressed is not None:
            raise ApiError(415, f"compressed Arrow IPC stream ({compressed}, has compressed buffers): its "
                                f"decoded size is not bounded by its length; send it uncompressed")
        try:
            with pa.ipc.open_stream(pa.py_buffer(body)) as reader:
                raw = reader.read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            raise ApiError(400, f"malformed Arrow IPC stream ({nbytes} bytes): {exc}") from None
        # conform() decodes dictionary-encoded columns: a few bytes of indices can stand for gigabytes
        plain = 0
        for f in raw.schema:
            what = ("a dictionary-encoded column" if pa.types.is_dictionary(f.type)
                    else "an encoded column" if pa.types.is_struct(f.type) else None)
            if what is not None:
                column_bytes = _plain_bytes(raw.column(f.name))
                plain += column_bytes
                if nbytes + plain > ARROW_COST_PER_BYTE * limit:
                    raise ApiError(413, f"{table}.{f.name}: {what} that decodes to "
                                        f"{column_bytes} bytes; a batch may decode to at most "
                                        f"{ARROW_COST_PER_BYTE * limit} bytes (2 x --max-request-mb): send it "
                                        f"plain or in smaller batches")
        if plain:
            held.resize(nbytes + plain)
        data = conform(table, raw)
        # a column conform() kept as it was still points into the body; one it converted or added does not
        kept = {f.name: f.type for f in raw.schema}
        converted = sum(data.column(i).get_total_buffer_size() for i, f in enumerate(data.schema)
                        if kept.get(f.name) != f.type)
        held.resize(nbytes + converted)
        return data
    ascii_text = body.isascii()
    held.resize(_decode_cost(kind, nbytes, ascii_text))

    def count(arrow_bytes: int) -> None:
        if arrow_bytes > nbytes:
            held.resize(_decode_cost(kind, nbytes, ascii_text, arrow_bytes))

    try:
        data = json_batch_table(table, body, count)
    except MalformedBatch as exc:
        raise ApiError(400, str(exc)) from None
    held.resize(data.get_total_buffer_size())
    return data


def build_app(collector: Collector) -> Starlette:
    """The ASGI application serving ``collector``."""

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({**collector.health(), "version": __version__})

    async def runs(request: Request) -> JSONResponse:
        if request.method == "POST":
            meta = await _json_body(request)
            try:
                doc = await asyncio.to_thread(collector.open_run, meta)
            except ValueError as exc:
                raise ApiError(422, str(exc)) from None
            return JSONResponse(doc, status_code=201)
        return JSONResponse({"runs": list_runs(collector.store)})

    async def run_info(request: Request) -> JSONResponse:
        run_id = _run_id(request, collector)
        run = Run(collector.run_dir(run_id))
        meta = run_meta(run.path)
        meta["rows"] = await asyncio.to_thread(run.counts)
        return JSONResponse(meta)

    async def close(request: Request) -> JSONResponse:
        run_id = _run_id(request, collector)
        body = await _json_body(request)
        try:
            end_ns, status = check_close_request(body)
        except ValueError as exc:
            raise ApiError(422, str(exc)) from None
        doc = await asyncio.to_thread(collector.close_run, run_id, end_ns=end_ns, status=status)
        return JSONResponse(doc)

    async def ingest(request: Request) -> JSONResponse:
        run_id = _run_id(request, collector)
        table = _table_name(request)
        segment_id = request.headers.get(SEGMENT_HEADER) or f"http-{uuid.uuid4().hex}"
        try:
            if collector.segment_exists(run_id, table, segment_id):
                collector.count_duplicate()
                return JSONResponse({"rows": None, "duplicate": True, "segment_id": segment_id,
                                     "watched": collector.watched(run_id)})
        except ValueError as exc:
            raise ApiError(400, f"{SEGMENT_HEADER}: {exc}") from None
        kind = _body_kind(request.headers.get("content-type", ""))
        limit = collector.max_request_bytes
        declared = _declared_length(request, limit)
        # A body without a Content-Length may be as large as the limit: it is admitted as if it were. The
        # text of a JSON body is taken to be ASCII until the body has been read.
        try:
            held = _Held(collector, _decode_cost(kind, limit if declared is None else declared, True))
        except CollectorBusy as exc:
            raise ApiError(503, str(exc), {"Retry-After": "1"}) from None
        try:
            body = await _read_batch_body(request, declared, limit)
            collector.decoding(+1)
            try:
                # off the event loop: decoding a large batch takes seconds of CPU
                data = await asyncio.to_thread(_decode_batch, table, body, kind, held, limit)
            finally:
                collector.decoding(-1)
            del body
        except CollectorBusy as exc:
            held.release()
            raise ApiError(503, str(exc), {"Retry-After": "1"}) from None
        except SchemaError as exc:
            held.release()
            raise ApiError(422, str(exc)) from None
        except BaseException:
            held.release()
            raise
        try:  # submit() releases the reservation itself if it refuses the batch
            fut = collector.submit(run_id, table, segment_id, data, reserved=held.nbytes)
        except SchemaError as exc:
            raise ApiError(422, str(exc)) from None
        except UnknownRun as exc:
            raise ApiError(404, str(exc), reason=UNKNOWN_RUN) from None
        del data  # the writer holds it until it is written, then releases its reservation
        result = await asyncio.wrap_future(fut)
        return JSONResponse({"rows": result.rows, "duplicate": result.duplicate, "segment_id": segment_id,
                             "watched": collector.watched(run_id)})

    async def query(request: Request) -> JSONResponse:
        run_id = _run_id(request, collector)
        table = _table_name(request)
        params = dict(request.query_params)
        try:
            limit = int(params.pop("limit", 1000))
            offset = int(params.pop("offset", 0))
        except ValueError:
            raise ApiError(400, "limit and offset must be integers") from None
        if not 0 <= limit <= QUERY_LIMIT_MAX or offset < 0:
            raise ApiError(400, f"limit must be within 0..{QUERY_LIMIT_MAX} and offset >= 0")
        cols = schema(table).names
        order_by = params.pop("order_by", None)
        if order_by is not None and order_by not in cols:
            raise ApiError(400, f"order_by: unknown column {order_by!r} of {table}")
        where, args = [], []
        for key, value in params.items():
            col, _, op = key.partition("__")
            if col not in cols:
                raise ApiError(400, f"unknown filter column {col!r} of {table}; columns are {', '.join(cols)}")
            sql_op = {"": "=", "gte": ">=", "lte": "<=", "gt": ">", "lt": "<", "ne": "<>"}.get(op)
            if sql_op is None:
                raise ApiError(400, f"unknown filter operator {op!r} in {key!r}: use gt, gte, lt, lte, ne")
            where.append(f'"{col}" {sql_op} ?')
            args.append(value)
        sql = f'SELECT * FROM "{table}"'
        if where:
            sql += " WHERE " + " AND ".join(where)
        if order_by:
            sql += f' ORDER BY "{order_by}"'
        sql += f" LIMIT {limit} OFFSET {offset}"
        run = Run(collector.run_dir(run_id))
        try:
            result = await asyncio.to_thread(run.sql_arrow, sql, args)
        except Exception as exc:  # DuckDB conversion errors on filter values
            raise ApiError(400, f"query failed: {exc}") from None
        finally:
            run.close()
        rows = result.to_pylist()
        for row in rows:  # NaN/inf are not JSON
            for k, v in row.items():
                if isinstance(v, float) and not math.isfinite(v):
                    row[k] = None
        return JSONResponse({"table": table, "columns": result.column_names, "rows": rows,
                             "limit": limit, "offset": offset})

    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.headers, exc.reason)

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, exc.detail)

    async def schema_error(request: Request, exc: SchemaError) -> JSONResponse:
        return _error(422, str(exc))

    async def unknown_run(request: Request, exc: UnknownRun) -> JSONResponse:
        return _error(404, str(exc), reason=UNKNOWN_RUN)

    async def server_error(request: Request, exc: Exception) -> Response:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    hub = LiveHub(collector.store, collector)  # the dashboard's live views; it also tells the forecast when a run moved
    routes = [
        Route("/v1/health", health, methods=["GET"]),
        Route("/v1/runs", runs, methods=["GET", "POST"]),
        Route("/v1/runs/{run_id}", run_info, methods=["GET"]),
        Route("/v1/runs/{run_id}/close", close, methods=["POST"]),
        Route("/v1/runs/{run_id}/tables/{table}", ingest, methods=["POST"]),
        Route("/v1/runs/{run_id}/tables/{table}", query, methods=["GET"]),
        *data_state_routes(collector),
        *forecast_routes(collector, hub=hub),
        *namespace_routes(collector),
        *anomaly_routes(collector),
        *metrics_routes(collector),
        *dashboard_routes(hub),
    ]
    return Starlette(routes=routes, exception_handlers={
        ApiError: api_error, HTTPException: http_error, SchemaError: schema_error,
        UnknownRun: unknown_run, Exception: server_error,
    })
