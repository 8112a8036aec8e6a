"""Queries over one namespace's published records (docs/publish.md): its rows (``metrics`` and
``namespace_values`` together), one SELECT over them in a sandbox, named reductions, and the record they rebuild.

What the collector's ``POST /v1/runs/{run}/namespaces/{namespace}/analyze`` runs, and ``Namespace.analyze``.
"""

from __future__ import annotations

import decimal
import math
from typing import Any

import duckdb
import pyarrow as pa

from flowscope.model.namespaces import NamespaceError, check_namespace, rebuild
from flowscope.store.run import Run

#: a named reduction: its aggregate over the numbers of each path (in commit order for first and last)
REDUCTIONS = {
    "count": "count(value)",
    "sum": "sum(value)",
    "mean": "avg(value)",
    "min": "min(value)",
    "max": "max(value)",
    "first": "first(value ORDER BY ts_ns, item NULLS FIRST)",
    "last": "last(value ORDER BY ts_ns, item NULLS FIRST)",
}
GROUPS = ("resource_id",)
REQUEST_FIELDS = ("sql", "reduce", "name", "by", "limit")
ROW_LIMIT = 100_000

ROWS_SQL = """
SELECT ts_ns, resource_id, name, CAST(NULL AS BIGINT) AS item, value, CAST(NULL AS VARCHAR) AS text
FROM metrics WHERE namespace = ?
UNION ALL
SELECT ts_ns, resource_id, name, item, value, text FROM namespace_values WHERE namespace = ?
ORDER BY ts_ns, name, item NULLS FIRST
"""


def namespace_rows(run: Run, namespace: str) -> pa.Table:
    """Every value published into ``namespace`` in ``run``: ts_ns (its commit), resource_id (its publisher),
    name (its path), item (its position in a list, null for a single value), value (a number) or text."""
    check_namespace(namespace)
    return run.sql_arrow(ROWS_SQL, [namespace, namespace])


def record(run: Run, namespace: str, resource_id: str | None = None) -> dict:
    """The record ``namespace``'s rows rebuild (of one publisher when given): nested keys, lists in commit order,
    the latest commit's single values."""
    rows = namespace_rows(run, namespace).to_pylist()
    return rebuild(r for r in rows if resource_id is None or r["resource_id"] == resource_id)


def check_request(request: Any) -> dict:
    """The request as analyze() takes it: ``{"sql": "SELECT ..."}`` or ``{"reduce": how, "name": glob,
    "by": "resource_id"}``, with an optional ``limit``; NamespaceError names the field that is wrong."""
    if not isinstance(request, dict):
        raise NamespaceError("body", f"a JSON object with 'sql' or 'reduce', got {type(request).__name__}")
    unknown = sorted(set(request) - set(REQUEST_FIELDS))
    if unknown:
        raise NamespaceError(unknown[0], f"unknown field; a request has {', '.join(REQUEST_FIELDS)}")
    if ("sql" in request) == ("reduce" in request):
        raise NamespaceError("sql", "give either 'sql' (one SELECT over the table namespace) or 'reduce' "
                                    f"({', '.join(REDUCTIONS)})")
    limit = request.get("limit", ROW_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= ROW_LIMIT:
        raise NamespaceError("limit", f"a whole number of rows within 0..{ROW_LIMIT}, got {limit!r}")
    if "sql" in request:
        extra = sorted({"name", "by"} & set(request))
        if extra:
            raise NamespaceError(extra[0], "goes with 'reduce', not with 'sql' (filter in the query)")
        if not isinstance(request["sql"], str) or not request["sql"].strip():
            raise NamespaceError("sql", f"a SELECT statement as a string, got {request['sql']!r:.80}")
        return {"sql": request["sql"], "limit": limit}
    how = request["reduce"]
    if how not in REDUCTIONS:
        raise NamespaceError("reduce", f"{how!r:.40} is not one of {', '.join(REDUCTIONS)}")
    name = request.get("name", "*")
    if not isinstance(name, str) or not name:
        raise NamespaceError("name", f"a glob over paths (e.g. 'rank/*/mass'), got {name!r:.80}")
    by = request.get("by")
    if by is not None and by not in GROUPS:
        raise NamespaceError("by", f"{by!r:.40} is not one of {', '.join(GROUPS)}")
    return {"reduce": how, "name": name, "by": by, "limit": limit}


def _arrow(rel: duckdb.DuckDBPyRelation) -> pa.Table:
    to_arrow = getattr(rel, "to_arrow_table", None) or rel.arrow  # the name changed across DuckDB versions
    out = to_arrow()
    return out.read_all() if isinstance(out, pa.RecordBatchReader) else out


def _jsonable(v: Any) -> Any:
    """A result value as JSON can carry it: NaN and infinities as null, decimals as floats, times as ISO text."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, decimal.Decimal):
        return _jsonable(float(v))
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return str(v)


def _sandbox(rows: pa.Table) -> duckdb.DuckDBPyConnection:
    """A connection holding ``rows`` as the table ``namespace`` that can read or write nothing else."""
    con = duckdb.connect(":memory:")
    con.register("_rows", rows)
    con.execute("CREATE TABLE namespace AS SELECT * FROM _rows")
    con.unregister("_rows")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def query(rows: pa.Table, sql: str, limit: int = ROW_LIMIT) -> tuple[pa.Table, bool]:
    """Run one SELECT ``sql`` over ``rows`` (the table ``namespace``) with no access to files or settings; the
    result's first ``limit`` rows and whether there were more. NamespaceError (field ``sql``) says why a query
    is refused or fails."""
    con = _sandbox(rows)
    try:
        try:
            statements = con.extract_statements(sql)
        except duckdb.Error as exc:
            raise NamespaceError("sql", f"does not parse: {exc}") from None
        if len(statements) != 1:
            raise NamespaceError("sql", f"one statement, got {len(statements)}")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise NamespaceError("sql", f"only a SELECT runs here, got {statements[0].type.name}")
        try:
            out = _arrow(con.sql(sql).limit(limit + 1))
        except duckdb.Error as exc:
            raise NamespaceError("sql", str(exc).splitlines()[0]) from None
        return out.slice(0, limit), out.num_rows > limit
    finally:
        con.close()


def reduce(rows: pa.Table, how: str, name: str = "*", by: str | None = None) -> pa.Table:
    """The reduction ``how`` of the numbers of each path matching the glob ``name`` (per publisher with
    ``by="resource_id"``): columns name, [resource_id,] and ``how``."""
    check_request({"reduce": how, "name": name, **({"by": by} if by else {})})
    keys = ["name", *([by] if by else [])]
    cols = ", ".join(keys)
    con = _sandbox(rows)
    try:
        return _arrow(con.sql(f"SELECT {cols}, {REDUCTIONS[how]} AS \"{how}\" FROM namespace WHERE value IS NOT "
                              f"NULL AND name GLOB ? GROUP BY {cols} ORDER BY {cols}", params=[name]))
    finally:
        con.close()


def analyze(run: Run, namespace: str, request: Any) -> dict:
    """Run ``request`` (see check_request) over ``namespace``'s rows in ``run``: ``{"namespace", "columns",
    "rows", "truncated"}`` with values JSON can carry (NaN and infinities as null)."""
    check_namespace(namespace)
    req = check_request(request)
    rows = namespace_rows(run, namespace)
    if "sql" in req:
        table, truncated = query(rows, req["sql"], req["limit"])
    else:
        table = reduce(rows, req["reduce"], req["name"], req["by"])
        truncated = table.num_rows > req["limit"]
        table = table.slice(0, req["limit"])
    out = [{k: _jsonable(v) for k, v in row.items()} for row in table.to_pylist()]
    return {"namespace": namespace, "columns": table.column_names, "rows": out, "truncated": truncated}
