"""The collector's HTTP API (Starlette): run open/close, batched ingest, health, per-table JSON queries.

Ingest bodies are Arrow IPC streams (``application/vnd.apache.arrow.stream``) or
JSON arrays of records (``application/json``). Errors are JSON ``{"error": ...}``
with a 4xx status that names the problem, or 503 with Retry-After when busy.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid

import pyarrow as pa
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from flowscope import __version__
from flowscope.model.conform import SchemaError, records_to_table
from flowscope.model.provenance import check_close_request, check_run_id
from flowscope.model.schemas import DERIVED_TABLES, TABLES, schema
from flowscope.service.collector import Collector, CollectorBusy, UnknownRun
from flowscope.store.catalog import list_runs, run_meta
from flowscope.store.run import Run
from flowscope.service.anomaly_server import anomaly_routes
from flowscope.service.wcp_routes import data_state_routes

ARROW_STREAM = "application/vnd.apache.arrow.stream"
SEGMENT_HEADER = "x-flowscope-segment"
QUERY_LIMIT_MAX = 100_000


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        self.status, self.message, self.headers = status, message, headers


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


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
        raise ApiError(404, f"unknown run {run_id!r}: open it first with POST /v1/runs")
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


def _decode_batch(table: str, body: bytes, content_type: str) -> pa.Table:
    if content_type.startswith(ARROW_STREAM) or content_type.startswith("application/octet-stream"):
        try:
            with pa.ipc.open_stream(pa.py_buffer(body)) as reader:
                return reader.read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            raise ApiError(400, f"malformed Arrow IPC stream ({len(body)} bytes): {exc}") from None
    if content_type.startswith("application/json"):
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise ApiError(400, f"malformed JSON batch: {exc}") from None
        records = doc.get("records") if isinstance(doc, dict) else doc
        if not isinstance(records, list):
            raise ApiError(400, "a JSON batch is an array of records or {\"records\": [...]}")
        return records_to_table(table, records)
    raise ApiError(415, f"unsupported Content-Type {content_type!r}: use {ARROW_STREAM} or application/json")


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
                return JSONResponse({"rows": None, "duplicate": True, "segment_id": segment_id})
        except ValueError as exc:
            raise ApiError(400, f"{SEGMENT_HEADER}: {exc}") from None
        declared = int(request.headers.get("content-length") or 0)
        reservation = 2 * min(max(declared, 0), collector.max_request_bytes) or 2**20
        try:
            collector.reserve(reservation)
        except CollectorBusy as exc:
            raise ApiError(503, str(exc), {"Retry-After": "1"}) from None
        try:
            body = await _read_body(request, collector.max_request_bytes)
            data = _decode_batch(table, body, request.headers.get("content-type", ""))
            del body
        except BaseException:
            collector.release(reservation)
            raise
        try:
            fut = collector.submit(run_id, table, segment_id, data, reserved=reservation)
        except SchemaError as exc:
            raise ApiError(422, str(exc)) from None
        except UnknownRun as exc:
            raise ApiError(404, str(exc)) from None
        result = await asyncio.wrap_future(fut)
        return JSONResponse({"rows": result.rows, "duplicate": result.duplicate, "segment_id": segment_id})

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
        return _error(exc.status, exc.message, exc.headers)

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, exc.detail)

    async def schema_error(request: Request, exc: SchemaError) -> JSONResponse:
        return _error(422, str(exc))

    async def unknown_run(request: Request, exc: UnknownRun) -> JSONResponse:
        return _error(404, str(exc))

    async def server_error(request: Request, exc: Exception) -> Response:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    routes = [
        Route("/v1/health", health, methods=["GET"]),
        Route("/v1/runs", runs, methods=["GET", "POST"]),
        Route("/v1/runs/{run_id}", run_info, methods=["GET"]),
        Route("/v1/runs/{run_id}/close", close, methods=["POST"]),
        Route("/v1/runs/{run_id}/tables/{table}", ingest, methods=["POST"]),
        Route("/v1/runs/{run_id}/tables/{table}", query, methods=["GET"]),
        *data_state_routes(collector),
        *anomaly_routes(),
    ]
    return Starlette(routes=routes, exception_handlers={
        ApiError: api_error, HTTPException: http_error, SchemaError: schema_error,
        UnknownRun: unknown_run, Exception: server_error,
    })
