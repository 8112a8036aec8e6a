"""Packs the records of one table, as they are emitted, into a compact row buffer that becomes Arrow cheaply.

Why not a list of tuples: millions of buffered Python objects cost the garbage
collector and a per-value conversion at flush; together they halved the client's
throughput. Here each record is one ``struct.pack`` into a bytearray (integers and
floats as themselves, strings as per-batch dictionary codes) and only optional
object columns (``attrs``, lists) keep Python objects. Turning a batch into Arrow
is then a numpy view per column plus a dictionary ``take`` per string column.

Values are checked as they are packed, so a record that does not fit its table
raises :class:`SchemaError` in the producer's own call, naming the column.
"""

from __future__ import annotations

import json
import struct
import threading
from typing import Any

import numpy as np
import pyarrow as pa

from flowscope.model.conform import SchemaError, interval_columns, type_family
from flowscope.model.schemas import MOSTLY_UNIQUE, schema

# Nullable integer columns store null as INT64_MIN (1677-09-21 as a timestamp: never a real value).
NULL_INT = -(2**63)

# Mostly unique string columns are kept as plain str objects: a dictionary would miss on almost every record.
PLAIN_STR = MOSTLY_UNIQUE - {"attrs"}


def _kind(t: pa.DataType) -> str:
    """How a column is packed: int and float as themselves, str as dictionary codes, the rest as objects."""
    family = type_family(t)
    return family if family in ("int", "float", "str") else "obj"


def _to_json(value: Any) -> str:
    return json.dumps(value, default=str)


class Packer:
    """Packer for one table. ``add(*values)`` takes the columns in schema order and returns the bytes
    held; ``take()`` may run on another thread. The client gives each producing thread its own."""

    def __init__(self, table: str, owner: threading.Thread | None = None, *, flush_rows: int | None = None,
                 on_full=None):
        self.table = table
        self.owner = owner
        self.rid: str | None = None  # the owning thread's resource id, the default for its records
        self.since = 0.0  # when the builder first saw this batch non-empty (for flush by age)
        self.schema = schema(table)
        self.columns = tuple(self.schema.names)
        self.colset = frozenset(self.columns)
        # attrs (mostly unique JSON) and PLAIN_STR columns are kept as objects; other strings are coded
        self.kinds = ["obj" if f.name == "attrs" else "plain" if f.name in PLAIN_STR else _kind(f.type)
                      for f in self.schema]
        self._packed = [i for i, k in enumerate(self.kinds) if k in ("int", "float", "str")]
        self._strs = [i for i, k in enumerate(self.kinds) if k == "str"]
        self._objs = [i for i, k in enumerate(self.kinds) if k in ("obj", "plain")]
        codes = {"int": "q", "float": "d", "str": "i"}
        self._struct = struct.Struct("<" + "".join(codes[self.kinds[i]] for i in self._packed))
        self.row_bytes = self._struct.size
        sizes = [struct.calcsize(codes[self.kinds[i]]) for i in self._packed]
        self._dtype = np.dtype({
            "names": [self.columns[i] for i in self._packed],
            "formats": [{"int": "<i8", "float": "<f8", "str": "<i4"}[self.kinds[i]] for i in self._packed],
            "offsets": [int(x) for x in np.cumsum([0] + sizes)[:-1]],
            "itemsize": self.row_bytes,
        })
        # on_full(packer, nbytes) is called by add() once the batch holds flush_rows records
        self.flush_bytes = flush_rows * self.row_bytes if flush_rows else 2**62
        self._lock = threading.Lock()
        # The buffers live as long as the packer (take() copies and clears them in place), so the
        # generated add() can bind them as constants.
        self._data = bytearray()
        self._dicts: list[dict] = [{} for _ in self._strs]
        self._values: list[list[str]] = [[] for _ in self._strs]
        self._objects: list[list] = [[] for _ in self._objs]
        self.add = self._compile(on_full)

    # The per-record function is generated for the table's columns, like dataclasses generates
    # __init__: straight-line code with no per-column loop is what makes it fast.
    def _compile(self, on_full):
        args = [f"c{i}" for i in range(len(self.columns))]
        ns = {"NULL_INT": NULL_INT, "to_json": _to_json, "check_obj": self._check_obj, "check_str": self._check_str,
              "acquire": self._lock.acquire, "release": self._lock.release, "new_code": self._new_code,
              "pack": self._struct.pack, "data": self._data, "extend": self._data.extend,
              "struct_error": struct.error, "diagnose": self._diagnose, "packer": self, "on_full": on_full}
        body = [f"def add({', '.join(args)}):"]
        interval = interval_columns(self.table)
        if interval is not None:
            # one comparison on the hot path; a None or a non-number makes it raise TypeError, and diagnose()
            # then names the column. The check comes first, before None becomes NULL_INT.
            s, e = (self.columns.index(c) for c in interval)
            ns["misordered"] = self._misordered
            test = f"c{e} < c{s}"
            if self.schema.field(s).nullable:
                test = f"c{s} is not None and {test}"
            if self.schema.field(e).nullable:
                test = f"c{e} is not None and {test}"
            body += ["    try:", f"        if {test}: misordered(c{s}, c{e})", "    except TypeError:",
                     f"        diagnose({', '.join(args)})"]
        for i, field in enumerate(self.schema):
            k = self.kinds[i]
            if k in ("int", "float"):
                # bool is an int subclass that struct would pack as 0 or 1: refused like any other non-number
                bool_test = f"if c{i}.__class__ is bool: diagnose({', '.join(args)})"
                if k == "int" and field.nullable:
                    body += [f"    if c{i} is None: c{i} = NULL_INT", f"    el{bool_test}"]
                else:
                    body.append(f"    {bool_test}")
            elif k == "obj" and self.columns[i] == "attrs":
                body.append(f"    if c{i} is not None and c{i}.__class__ is not str: c{i} = to_json(c{i})")
            elif k == "obj":
                body.append(f"    if c{i} is not None: c{i} = check_obj({i}, c{i})")
            elif k == "plain":
                none_ok = f" and c{i} is not None" if field.nullable else ""
                body.append(f"    if c{i}.__class__ is not str{none_ok}: c{i} = check_str({i}, c{i})")
        body += ["    acquire()", "    try:"]
        for j, i in enumerate(self._strs):
            ns[f"get{i}"], ns[f"dict{i}"], ns[f"values{i}"] = self._dicts[j].get, self._dicts[j], self._values[j]
            body += [f"        k{i} = get{i}(c{i})",
                     f"        if k{i} is None:",
                     f"            if c{i}.__class__ is str:",
                     f"                k{i} = dict{i}[c{i}] = len(values{i})",
                     f"                values{i}.append(c{i})",
                     "            else:",  # None, or not a string: decided (or refused) out of line
                     f"                k{i} = new_code({j}, {i}, c{i})"]
        packed = ", ".join(f"k{i}" if self.kinds[i] == "str" else f"c{i}" for i in self._packed)
        body += ["        try:", f"            extend(pack({packed}))", "        except struct_error:",
                 f"            diagnose({', '.join(args)})"]
        for j, i in enumerate(self._objs):
            ns[f"append{i}"] = self._objects[j].append
            body.append(f"        append{i}(c{i})")
        body += ["        n = len(data)", "    finally:", "        release()"]
        if on_full is not None:
            body.append(f"    if n >= {int(self.flush_bytes)}: on_full(packer, n)")
        self.source = "\n".join(body)
        exec(self.source, ns)  # noqa: S102 - source built above from the schema, no user input
        return ns["add"]

    def _new_code(self, j: int, col: int, value: Any) -> int:
        if value is None:
            if not self.schema.field(col).nullable:
                raise SchemaError(self.table, "is required but was None", self.columns[col])
            code = -1
        elif not isinstance(value, str):
            raise SchemaError(self.table, f"expected a string, got {type(value).__name__} {value!r:.80}",
                              self.columns[col])
        else:
            code = len(self._values[j])
            self._values[j].append(str(value))  # a str subclass is stored as plain str
        self._dicts[j][value] = code
        return code

    def _check_str(self, col: int, value: Any) -> str:
        if value is None:
            raise SchemaError(self.table, "is required but was None", self.columns[col])
        if not isinstance(value, str):
            raise SchemaError(self.table, f"expected a string, got {type(value).__name__} {value!r:.80}",
                              self.columns[col])
        return str(value)

    def _check_obj(self, col: int, value: Any) -> Any:
        t = self.schema.field(col).type
        if pa.types.is_list(t):
            if isinstance(value, (str, bytes)) or not all(isinstance(v, str) for v in value):
                raise SchemaError(self.table, f"expected a list of strings, got {value!r:.80}", self.columns[col])
            return list(value)
        return value

    def _check_number(self, i: int, v: Any) -> None:
        k = self.kinds[i]
        if v is None:
            if self.schema.field(i).nullable:
                return
            raise SchemaError(self.table, "is required but was None", self.columns[i])
        try:
            if v.__class__ is bool:
                raise struct.error("bool")
            struct.pack("<q" if k == "int" else "<d", v)
        except struct.error:
            want = "an int64 (ns)" if self.columns[i].endswith("_ns") else ("an int64" if k == "int" else "a float")
            raise SchemaError(self.table, f"expected {want}, got {type(v).__name__} {v!r:.80}",
                              self.columns[i]) from None

    def _diagnose(self, *values: Any) -> None:
        for i in self._packed:
            if self.kinds[i] != "str":
                self._check_number(i, values[i])
        raise SchemaError(self.table, f"record does not fit: {values!r:.200}")

    def _misordered(self, start: Any, end: Any) -> None:
        s, e = (self.columns.index(c) for c in interval_columns(self.table))
        self._check_number(s, start)
        self._check_number(e, end)
        raise SchemaError(self.table, f"ends before it starts ({self.columns[s]} {start}, {self.columns[e]} {end})",
                          self.columns[e])

    def __len__(self) -> int:
        return len(self._data) // self.row_bytes

    def take(self) -> pa.Table | None:
        """Everything packed so far as a canonical Arrow table (None if nothing), leaving the packer empty."""
        with self._lock:
            if not self._data:
                return None
            data = bytes(self._data)
            self._data.clear()
            values = [v[:] for v in self._values]
            objects = [o[:] for o in self._objects]
            for d in self._dicts:
                d.clear()
            for v in self._values:
                v.clear()
            for o in self._objects:
                o.clear()
        rows = np.frombuffer(data, dtype=self._dtype)
        arrays = []
        str_j = obj_j = 0
        for i, field in enumerate(self.schema):
            k = self.kinds[i]
            if k in ("obj", "plain"):
                arrays.append(pa.array(objects[obj_j], type=field.type))
                obj_j += 1
                continue
            col = np.ascontiguousarray(rows[field.name])
            if k == "int":
                mask = (col == NULL_INT) if field.nullable else None
                arrays.append(pa.array(col, type=field.type, mask=mask if mask is not None and mask.any() else None))
            elif k == "float":
                arrays.append(pa.array(col, type=field.type))
            else:
                dictionary = pa.array(values[str_j], type=pa.string())
                str_j += 1
                nulls = col < 0
                if not nulls.any():
                    arrays.append(dictionary.take(pa.array(col)))
                elif len(dictionary):
                    arrays.append(dictionary.take(pa.array(np.where(nulls, 0, col), mask=nulls)))
                else:
                    arrays.append(pa.nulls(len(col), pa.string()))
        return pa.Table.from_arrays(arrays, schema=self.schema)
