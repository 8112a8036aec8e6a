"""Turn what a producer hands us into a table with exactly the canonical schema, or say precisely why not."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import numbers
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.model import json_columns
from flowscope.model.schemas import INT64_MAX, schema


class SchemaError(ValueError):
    """A batch does not fit its table's canonical schema; names the table and the column."""

    def __init__(self, table: str, message: str, column: str | None = None):
        self.table = table
        self.column = column
        where = f"{table}.{column}" if column else table
        super().__init__(f"{where}: {message}")


def type_family(t: pa.DataType) -> str:
    """The family of an Arrow type (int, float, str, list, timestamp, bool, null, ...), ignoring width."""
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_dictionary(t):
        return type_family(t.value_type)
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list"
    if pa.types.is_boolean(t):
        return "bool"
    return str(t)


# which incoming families may be cast to which canonical family without changing meaning
_CASTABLE = {
    "int": {"int", "null"},
    "float": {"float", "int", "null"},
    "str": {"str", "null"},
    "list": {"list", "null"},
}


def _encoded(table: str, field: pa.Field, col: pa.ChunkedArray | pa.Array) -> bool:
    """Whether ``col`` is an encoding of ``field``'s values that a producer may hand over as it is: a string
    column dictionary-encoded, or a JSON-text column as a struct (checked here)."""
    have = col.type
    if pa.types.is_struct(have) and field.name in json_columns.JSON_COLUMNS and type_family(field.type) == "str":
        problem = json_columns.field_problem(have)
        if problem is not None:
            raise SchemaError(table, problem, field.name)
        return True
    return (pa.types.is_dictionary(have) and type_family(field.type) == "str"
            and type_family(have.value_type) == "str")


def _null_rows(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_dictionary(col.type):  # a null index, or an index of a null value
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        return pa.chunked_array([pc.or_kleene(pc.is_null(c.indices), pc.is_null(c.dictionary).take(c.indices))
                                 for c in chunks], pa.bool_())
    return pc.is_null(col)


def _conform_column(table: str, field: pa.Field, col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    want = field.type
    have = col.type
    if have == want:
        return col
    if pa.types.is_struct(have) and _encoded(table, field, col):
        return json_columns.text_of(col)
    fam_want, fam_have = type_family(want), type_family(have)
    if fam_have == "timestamp" and fam_want == "int":
        try:
            return col.cast(pa.timestamp("ns")).cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(table, f"{_row_of(col)}cannot be read as int64 ns since the epoch: {exc}",
                              field.name) from None
    if fam_have not in _CASTABLE.get(fam_want, {fam_want}):
        raise SchemaError(table, f"has type {have}, expected {want}", field.name)
    if fam_want == "list":
        vt = have.value_type
        if type_family(vt) not in ("str", "null"):
            raise SchemaError(table, f"has type {have}, expected {want}", field.name)
    try:
        return col.cast(want, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(table, f"{_row_of(col)}cannot be read as {want}: {exc}", field.name) from None


_NS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _row_of(col: pa.ChunkedArray | pa.Array) -> str:
    """'row N: ' for the first value of an integer or timestamp column beyond int64 (ns), else ''."""
    t = col.type
    if pa.types.is_unsigned_integer(t) and t.bit_width == 64:
        beyond = pc.greater(col, pa.scalar(INT64_MAX, t))
    elif pa.types.is_timestamp(t):
        limit = INT64_MAX // _NS_PER_UNIT[t.unit]
        raw = col.cast(pa.int64())
        beyond = pc.or_(pc.greater(raw, limit), pc.less(raw, -limit))
    else:
        return ""
    return f"row {pc.index(beyond, True).as_py()}: " if pc.any(beyond).as_py() else ""


def interval_columns(table: str) -> tuple[str, str] | None:
    """The (start, end) columns of ``table`` when its rows are intervals, else None."""
    names = schema(table).names
    return ("start_ns", "end_ns") if "start_ns" in names and "end_ns" in names else None


def check_intervals(table: str, data: pa.Table) -> None:
    """Raise SchemaError naming the first row of ``data`` whose interval ends before it starts
    (rows with a null start or end are open intervals and pass)."""
    cols = interval_columns(table)
    if cols is None or data.num_rows == 0:
        return
    start, end = data.column(cols[0]), data.column(cols[1])
    reversed_ = pc.less(end, start)
    if pc.any(reversed_).as_py():
        row = pc.index(reversed_, True).as_py()
        raise SchemaError(table, f"row {row} ends before it starts ({cols[0]} {start[row].as_py()}, "
                                 f"{cols[1]} {end[row].as_py()})", cols[1])


def conform(table: str, data: pa.Table | pa.RecordBatch, *, decode: bool = True) -> pa.Table:
    """Return ``data`` as a table with ``table``'s canonical schema (column order, types, nullability).

    Missing nullable columns are filled with nulls; unknown columns, missing required
    columns, incompatible types, nulls in required columns and intervals that end before
    they start raise SchemaError. A string column may come dictionary-encoded, and a JSON-text
    column (``attrs``) as a struct (json_columns.py): they are stored plain. ``decode=False``
    (a producer's check before sending) keeps those two encodings as they came, checked, so
    that the text is made where the run is stored.
    """
    target = schema(table)
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    names = set(data.column_names)
    unknown = sorted(names - set(target.names))
    if unknown:
        raise SchemaError(table, f"unknown column(s) {', '.join(map(repr, unknown))}; "
                                 f"columns are {', '.join(target.names)}", unknown[0])
    if len(data.column_names) != len(names):
        raise SchemaError(table, "duplicate column names")
    n = data.num_rows
    columns = []
    fields = []
    for field in target:
        if field.name in names:
            col = data.column(field.name)
            if not decode and _encoded(table, field, col):
                field = field.with_type(col.type)
            else:
                col = _conform_column(table, field, col)
            if not field.nullable and (col.null_count or pa.types.is_dictionary(col.type)):
                nulls = _null_rows(col)
                if pc.any(nulls).as_py():
                    raise SchemaError(table, f"is required but row {pc.index(nulls, True).as_py()} is null",
                                      field.name)
        else:
            if not field.nullable:
                raise SchemaError(table, "is required but missing", field.name)
            col = pa.nulls(n, field.type)
        columns.append(col)
        fields.append(field)
    out = pa.Table.from_arrays(columns, schema=target if decode else pa.schema(fields, metadata=target.metadata))
    check_intervals(table, out)
    if table == "namespace_values":
        from flowscope.model.namespaces import check_namespace_values

        broken = check_namespace_values(out)
        if broken is not None:
            raise SchemaError(table, broken[1], broken[0])
    return out


def records_to_table(table: str, records: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Build a canonical table from row dicts (JSON ingest, small producers)."""
    target = schema(table)
    records = list(records)
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise SchemaError(table, f"record {i} is a {type(rec).__name__}, expected an object")
        extra = set(rec) - set(target.names)
        if extra:
            col = sorted(extra)[0]
            raise SchemaError(table, f"record {i} has unknown column {col!r}", col)
    cols = {}
    for field in target:
        values = [rec.get(field.name) for rec in records]
        _check_numbers(table, field, values)
        try:
            cols[field.name] = pa.array(values, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            bad = next((i for i, v in enumerate(values) if not _fits(v, field.type)), None)
            at = f" (record {bad}: {values[bad]!r})" if bad is not None else ""
            raise SchemaError(table, f"expected {field.type}{at}: {exc}", field.name) from None
    return conform(table, pa.table(cols))


# What a value in a numeric column may be. bool is an int subclass and a float in an integer column would be
# truncated by Arrow, so both are refused rather than converted; numpy's scalars count as what they are.
_NUMBER_TYPES = {"int": {int, type(None)}, "float": {int, float, type(None)}}
_NUMBER_ABCS = {"int": numbers.Integral, "float": numbers.Real}
_NUMBER_WORDS = {"int": "an integer (int64)", "float": "a number"}


def _check_numbers(table: str, field: pa.Field, values: list) -> None:
    family = type_family(field.type)
    allowed = _NUMBER_TYPES.get(family)
    if allowed is None or set(map(type, values)) <= allowed:  # the common case, at C speed
        return
    abc = _NUMBER_ABCS[family]
    for row, value in enumerate(values):
        if value is not None and (not isinstance(value, abc) or isinstance(value, (bool, np.bool_))):
            raise SchemaError(table, f"record {row}: expected {_NUMBER_WORDS[family]}, got {type(value).__name__} "
                                     f"{value!r:.80}", field.name)


def _fits(value: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([value], type=typ)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False
