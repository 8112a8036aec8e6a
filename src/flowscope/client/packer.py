"""Buffers the records of one table, as they are emitted, column by column, so they become Arrow cheaply.

Each column is a Python list that ``add`` appends to. Integers, floats and strings
are atoms the garbage collector does not track, so millions of buffered values cost
it nothing (a list of tuples would). The string columns with few distinct values
(resource ids, kinds, names) are stored together as one integer code per record,
looked up in a dictionary keyed by their tuple: one lookup per record, whatever
the number of such columns. Turning a batch into Arrow is then one conversion per
column in C (``numpy.fromiter`` for numbers, ``pyarrow.array`` for strings) and a
dictionary ``take`` per coded column.

Values are checked as they are added, before anything is appended, so a record that
does not fit its table raises :class:`SchemaError` in the producer's own call,
naming the column, and leaves the buffer as it was.

One thread appends to a packer (the client gives each producing thread its own);
another may ``take`` its records at any time without a lock on the appending side:
a record's values are appended to the column lists in a fixed order, the last list
is appended to last, so the first ``len(last list)`` entries of every list are
complete records, which ``take`` cuts off the front (``del lst[:n]``: one atomic
operation per list; the appending thread only ever adds at the end). Codes stay
valid until the appending thread itself resets the dictionary, which it does only
while holding the take lock with every record it added taken.
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from flowscope.model.arrow_values import fixed, texts
from flowscope.model.conform import SchemaError, interval_columns, type_family
from flowscope.model.schemas import MOSTLY_UNIQUE, schema

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Mostly unique string columns are kept as plain str objects: a dictionary would miss on almost every record.
PLAIN_STR = MOSTLY_UNIQUE - {"attrs"}

# The code generator below writes the body of a record-adding function once per table; the same body serves
# Packer.add (values as positional arguments, buffers bound as globals) and the per-record methods the client
# generates (values as keyword arguments, buffers unpacked from the calling thread's state): see recorder().


def _kind(t: pa.DataType) -> str:
    """How a column is buffered: int, float, coded str, plain str, or an object (attrs JSON, lists)."""
    family = type_family(t)
    return family if family in ("int", "float", "str") else "obj"


# json.dumps(value, default=str) builds a new JSONEncoder on every call (it reuses one only with default
# arguments): half the cost of turning a small attrs dict into JSON. One encoder, same text.
_to_json = json.JSONEncoder(default=str).encode


def _is_bool(v: Any) -> bool:
    return v.__class__ is bool or isinstance(v, np.bool_)


# Arrays are built from buffers and with pyarrow's builders (model/arrow_values.py), never with pa.array(): its
# first call in a process imports pandas (0.3 s of CPU), which a process that records need not pay (a Dask worker,
# a traced program).


def _from_objects(values: list, t: pa.DataType) -> pa.Array:
    """A column kept as Python objects: strings (None for null) or, for a list<string> column, lists of strings."""
    if pa.types.is_string(t):
        return texts(values)
    if pa.types.is_list(t) and pa.types.is_string(t.value_type):
        lengths = np.fromiter((len(v) if v is not None else 0 for v in values), dtype=np.int32, count=len(values))
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        flat = [x for v in values if v is not None for x in v]
        nulls = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
        valid = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
        return pa.ListArray.from_buffers(t, len(values), [valid, pa.py_buffer(offsets)],
                                         null_count=int(nulls.sum()), children=[texts(flat)])
    return pa.array(values, type=t)  # no such column in today's tables


class Packer:
    """Buffer of one table's records. ``add(*values)`` takes the columns in schema order; ``take()`` may run on
    another thread. ``on_full(packer)`` is called on the adding thread once the batch holds ``flush_rows``
    records (and when the string dictionary holds that many entries); it should ``take(reset=True)``."""

    def __init__(self, table: str, owner: threading.Thread | None = None, *, flush_rows: int | None = None,
                 on_full: Callable[[Packer], None] | None = None):
        self.table = table
        self.owner = owner
        self.rid: str | None = None  # the owning thread's resource id, the default for its records
        self.since = 0.0  # when the builder first saw this batch non-empty (for flush by age)
        self.keep = False  # a row writer may still add after the owner thread ended: never dropped
        self.schema = schema(table)
        self.columns = tuple(self.schema.names)
        self.colset = frozenset(self.columns)
        self.kinds = ["obj" if f.name == "attrs" else "plain" if f.name in PLAIN_STR else _kind(f.type)
                      for f in self.schema]
        self._coded = [i for i, k in enumerate(self.kinds) if k == "str"]
        self._stored = [i for i, k in enumerate(self.kinds) if k != "str"]
        self.flush_rows = int(flush_rows) if flush_rows else 2**62
        self.on_full = on_full
        self._take_lock = threading.Lock()
        # These objects live as long as the packer (take() cuts lists in place, a reset clears them in place),
        # so the generated functions can hold them.
        self._codes: list[int] = []
        self._lists: list[list] = [[] for _ in self._stored]
        self._dict: dict = {}
        self._values: list = []  # code -> the coded columns' values (a tuple when there are several)
        self._all = ([self._codes] if self._coded else []) + self._lists
        self._rows = self._all[-1]  # appended to last: its length is the number of complete records
        self.source, self.add = _compile(self)

    # ---- what the generated code calls out of line: the uncommon cases, and refusals -------------------
    def state(self) -> tuple:
        """The objects the generated code uses, in the order recorder() unpacks them."""
        return (*(lst.append for lst in self._all), self._dict.get, self._rows, self.flush_rows, self._code,
                self.on_full, self, self.rid)

    def _refuse(self, i: int, message: str) -> SchemaError:
        return SchemaError(self.table, message, self.columns[i])

    def _got(self, v: Any) -> str:
        return f"{type(v).__name__} {v!r:.80}"

    def _int(self, i: int, v: Any) -> int | None:
        """``v`` as an int64 for column ``i`` (None where the column allows it), or SchemaError."""
        if v is None:
            if self.schema.field(i).nullable:
                return None
            raise self._refuse(i, "is required but was None")
        want = "an int64 (ns)" if self.columns[i].endswith("_ns") else "an int64"
        if _is_bool(v):
            raise self._refuse(i, f"expected {want}, got {self._got(v)}")
        try:
            n = operator.index(v)  # int subclasses, numpy integers; not floats, not strings
        except TypeError:
            raise self._refuse(i, f"expected {want}, got {self._got(v)}") from None
        if not INT64_MIN <= n <= INT64_MAX:
            raise self._refuse(i, f"expected {want}, got {self._got(v)} (beyond int64)")
        return int(n)

    def _float(self, i: int, v: Any) -> float | None:
        if v is None:
            if self.schema.field(i).nullable:
                return None
            raise self._refuse(i, "is required but was None")
        if _is_bool(v) or isinstance(v, (str, bytes, bytearray)):
            raise self._refuse(i, f"expected a float, got {self._got(v)}")
        try:
            return float(v)
        except (TypeError, ValueError, OverflowError):
            raise self._refuse(i, f"expected a float, got {self._got(v)}") from None

    def _interval(self, s: Any, e: Any) -> tuple[int, int]:
        """Both ends checked as int64 (start first), then their order."""
        si, ei = (self.columns.index(c) for c in interval_columns(self.table))
        s, e = self._int(si, s), self._int(ei, e)
        if s is not None and e is not None and e < s:
            raise self._refuse(ei, f"ends before it starts ({self.columns[si]} {s}, {self.columns[ei]} {e})")
        return s, e

    def _str(self, i: int, v: Any) -> str | None:
        if v is None:
            if self.schema.field(i).nullable:
                return None
            raise self._refuse(i, "is required but was None")
        if not isinstance(v, str):
            raise self._refuse(i, f"expected a string, got {self._got(v)}")
        return str(v)  # a str subclass is stored as plain str

    def _obj(self, i: int, v: Any) -> Any:
        t = self.schema.field(i).type
        if pa.types.is_list(t):
            if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__") or not all(isinstance(x, str) for x in v):
                raise self._refuse(i, f"expected a list of strings, got {v!r:.80}")
            return [str(x) for x in v]
        return v

    def _code(self, key: Any) -> int:
        """The code of a new combination of the coded columns' values (checked here), adding it."""
        values = (key,) if len(self._coded) == 1 else key
        for v in values:  # the common miss (a new name): plain strings, kept as they are
            if v.__class__ is not str:
                checked = tuple(self._str(i, v) for i, v in zip(self._coded, values))
                break
        else:
            checked = values
        if len(self._values) >= self.flush_rows and self.on_full is not None:
            self.on_full(self)  # the dictionary is as large as a batch: send what uses it, then start afresh
        code = len(self._values)
        self._values.append(checked[0] if len(checked) == 1 else checked)
        self._dict[key] = code
        return code

    def writer(self, elsewhere: Callable[..., None]) -> Callable[..., None]:
        """``add`` for the owner thread that hands the values of a call from any other thread to
        ``elsewhere`` (which records them in that thread's own buffer): one thread appends, always."""
        return _compile(self, guard=(self.owner.ident if self.owner is not None else threading.get_ident(),
                                     elsewhere))[1]

    # ---- the other side: batches ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._rows)

    def take(self, reset: bool = False) -> pa.Table | None:
        """The complete records added so far as a canonical Arrow table (None if none), removed from the buffer.

        ``reset=True`` also empties the string dictionary; only the adding thread may ask for it."""
        with self._take_lock:
            n = len(self._rows)
            parts = []
            if n:
                for lst in self._all:
                    parts.append(lst[:n])
                    del lst[:n]
            values = self._values[:] if n and self._coded else None
            if reset:
                self._dict.clear()
                self._values.clear()
        if not n:
            return None
        return self._to_arrow(n, parts, values)

    def _to_arrow(self, n: int, parts: list[list], values: list | None) -> pa.Table:
        arrays: list[pa.Array | None] = [None] * len(self.columns)
        if self._coded:
            codes = np.fromiter(parts[0], dtype=np.int32, count=n)
            if len(values) > 2 * n + 64:  # a dictionary kept across batches: only the entries this one uses
                used, codes = np.unique(codes, return_inverse=True)
                values = [values[u] for u in used]
            indices = fixed(pa.int32(), np.ascontiguousarray(codes, dtype=np.int32))
            columns = [values] if len(self._coded) == 1 else (list(c) for c in zip(*values))
            for i, col in zip(self._coded, columns):
                arrays[i] = texts(col).take(indices)
            parts = parts[1:]
        for i, col in zip(self._stored, parts):
            field, k = self.schema.field(i), self.kinds[i]
            if k in ("int", "float"):
                dtype = np.int64 if k == "int" else np.float64
                nulls = col.count(None) if field.nullable else 0
                if nulls == n:
                    arrays[i] = pa.nulls(n, field.type)
                elif nulls:
                    mask = np.fromiter((v is None for v in col), dtype=bool, count=n)
                    arrays[i] = fixed(field.type, np.fromiter((0 if v is None else v for v in col), dtype=dtype,
                                                               count=n), mask)
                else:
                    arrays[i] = fixed(field.type, np.fromiter(col, dtype=dtype, count=n))
            else:
                arrays[i] = _from_objects(col, field.type)
        return pa.Table.from_arrays(arrays, schema=self.schema)


# ---- the code generator -------------------------------------------------------------------------------------
def _body(p: Packer, v: list[str], store: bool = True) -> list[str]:
    """Lines (indented 4) that check the values named ``v`` (one per column), append them, and flush when full;
    with ``store=False``, lines that only check and convert them (the coded strings as ``_code`` checks them).

    Names the lines use: ``append_<j>`` per buffered list, ``get``, ``rows``, ``limit``, ``code``, ``on_full``,
    ``packer``, and the module-level helpers bound in _namespace()."""
    lines = []
    interval = interval_columns(p.table)
    pair = None
    if interval is not None:
        si, ei = (p.columns.index(c) for c in interval)
        if not p.schema.field(si).nullable and not p.schema.field(ei).nullable:
            pair = (si, ei)
            # the common case in one test: both exact ints, in order, within int64; anything else is decided
            # (converted, or refused naming the column) out of line
            lines.append(f"    if {v[si]}.__class__ is not int or {v[ei]}.__class__ is not int or "
                         f"not INT64_MIN <= {v[si]} <= {v[ei]} <= INT64_MAX: "
                         f"{v[si]}, {v[ei]} = packer._interval({v[si]}, {v[ei]})")
    for i, field in enumerate(p.schema):
        k, x = p.kinds[i], v[i]
        if pair and i in pair:
            continue
        if k == "int":
            test = f"{x}.__class__ is not int or not INT64_MIN <= {x} <= INT64_MAX"
            if field.nullable:
                test = f"{x} is not None and ({test})"
            lines.append(f"    if {test}: {x} = packer._int({i}, {x})")
        elif k == "float":
            lines.append(f"    if {x}.__class__ is not float: {x} = packer._float({i}, {x})")
        elif k == "plain":
            none_ok = f" and {x} is not None" if field.nullable else ""
            lines.append(f"    if {x}.__class__ is not str{none_ok}: {x} = packer._str({i}, {x})")
        elif k == "obj" and p.columns[i] == "attrs":
            lines.append(f"    if {x} is not None and {x}.__class__ is not str: {x} = to_json({x})")
        elif k == "obj":
            lines.append(f"    if {x} is not None: {x} = packer._obj({i}, {x})")
    if interval is not None and pair is None:
        s, e = (v[p.columns.index(c)] for c in interval)
        lines.append(f"    if {s} is not None and {e} is not None and {e} < {s}: packer._interval({s}, {e})")
    if not store:
        return lines + [f"    if {v[i]}.__class__ is not str: {v[i]} = packer._str({i}, {v[i]})" for i in p._coded]
    appends = []
    if p._coded:
        key = v[p._coded[0]] if len(p._coded) == 1 else "(" + ", ".join(v[i] for i in p._coded) + ")"
        # a hit can only be a combination of values checked when it was added; an unhashable value (a list
        # where a string belongs) is a miss, refused by code()
        lines += ["    try:", f"        k = get({key})", "    except TypeError:", "        k = None",
                  "    if k is None:", f"        k = code({key})"]
        appends.append("k")
    appends += [v[i] for i in p._stored]
    lines += [f"    append_{j}({a})" for j, a in enumerate(appends)]
    if p.on_full is not None:
        lines.append("    if len(rows) >= limit: on_full(packer)")
    return lines


def _state_names(p: Packer) -> list[str]:
    return [f"append_{j}" for j in range(len(p._all))] + ["get", "rows", "limit", "code", "on_full", "packer", "rid"]


def _namespace() -> dict:
    return {"INT64_MIN": INT64_MIN, "INT64_MAX": INT64_MAX, "to_json": _to_json}


def _compile(p: Packer, guard: tuple[int, Callable] | None = None) -> tuple[str, Callable]:
    """Packer.add: the columns as positional arguments, the buffers bound as globals. With ``guard`` (a thread
    ident, a function): a call from another thread goes to the function instead."""
    v = [f"c{i}" for i in range(len(p.columns))]
    lines = [f"def add({', '.join(v)}):"]
    ns = {**_namespace(), **dict(zip(_state_names(p), p.state()))}
    if guard is not None:
        ns.update(get_ident=threading.get_ident, owner_ident=guard[0], elsewhere=guard[1])
        lines.append(f"    if get_ident() != owner_ident: return elsewhere({', '.join(v)})")
    source = "\n".join([*lines, *_body(p, v)])
    exec(source, ns)  # noqa: S102 - source built from the schema, no user input
    return source, ns["add"]


def checker(table: str) -> Callable[..., tuple]:
    """A function taking a record of ``table`` (its values in column order) and returning them as ``Packer.add``
    stores them (exact ints and strs, attrs as JSON), or raising the SchemaError ``Packer.add`` raises: what the
    compiled span recorder (span_recorder.py) calls for any value outside its common case."""
    p = Packer(table)
    v = [f"c{i}" for i in range(len(p.columns))]
    lines = [f"def check({', '.join(v)}):", *_body(p, v, store=False), f"    return ({', '.join(v)},)"]
    ns = {**_namespace(), "packer": p}
    exec("\n".join(lines), ns)  # noqa: S102 - source built from the schema, no user input
    return ns["check"]


def recorder(table: str, signature: str, values: dict[str, str], prologue: list[str], doc: str,
             state_attr: str, first: str) -> Callable:
    """A method recording one row of ``table`` into the calling thread's buffer, generated like Packer.add.

    ``signature``: its parameters after ``self``; ``values``: column -> expression of them; ``prologue``:
    lines run first (they may use ``rid``, the thread's resource id). The buffers come from
    ``self._local.<state_attr>`` (a Packer.state() tuple), set up by ``self.<first>(table)`` on a thread's
    first record."""
    p = Packer(table, on_full=lambda _p: None)  # a template: the generated text depends on the schema only
    v = [values[c] if values.get(c, "").isidentifier() else f"v{i}" for i, c in enumerate(p.columns)]
    names = ", ".join(_state_names(p))
    lines = [f"def method(self, {signature}):", "    try:", f"        {names} = self._local.{state_attr}",
             "    except AttributeError:", f"        {names} = self.{first}({table!r})", *prologue]
    lines += [f"    {v[i]} = {values.get(c) or 'None'}" for i, c in enumerate(p.columns) if v[i] != values.get(c)]
    lines += _body(p, v)
    ns = _namespace()
    exec("\n".join(lines), ns)  # noqa: S102 - source built from the schema and the caller's constant text
    method = ns["method"]
    method.__doc__ = doc
    method.__source__ = "\n".join(lines)
    return method
