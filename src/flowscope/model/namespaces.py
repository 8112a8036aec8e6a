"""What a record published into a namespace must be, and the rows it becomes (docs/publish.md).

A namespace is a SOMA-style named stream of hierarchical records (Conduit trees): nested keys whose leaves are
numbers, strings, or lists of them. A leaf's path joins its keys with ``/`` (``mesh/energy``,
``rank/3/nan_count``). Where a leaf is stored depends only on its value:

- a single number (int, float, bool, numpy scalar) is a row of ``metrics``: ``namespace``, ``name`` = the path,
  ``value``, ``ts_ns`` = the time of the commit it belongs to;
- a string, or a list (a sequence, a 1-D numpy array, or values appended) is one row per item of
  ``namespace_values``: the same columns, plus ``item`` (its position among the leaf's values of that commit,
  null for a single string) and ``text`` for a string item.

Both client and collector check records here, so a bad record is refused in the producer's own call with the
path that is wrong (:class:`NamespaceError`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.model.schemas import METRICS, NAMESPACE_VALUES

#: SOMA's four domains, each a namespace of that name (any other valid name is a user-defined namespace)
DOMAINS: dict[str, str] = {
    "performance": "performance profiles (TAU, Caliper: per-region times and counters)",
    "application": "application diagnostics (conserved quantities, extrema and their locations, NaN counts)",
    "hardware": "hardware metrics (CPU, memory, network, disk per node)",
    "workflow": "workflow states (tasks and pilots or executors, with their times)",
}

OVERWRITE, APPEND = "overwrite", "append"
MODES = (OVERWRITE, APPEND)

SEPARATOR = "/"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: a path: keys joined by "/", none empty, no control character (RE2 syntax too: the collector checks columns)
PATH_PATTERN = r"^[^/\x00-\x1f\x7f]+(/[^/\x00-\x1f\x7f]+)*$"
_PATH_RE = re.compile(PATH_PATTERN)
MAX_PATH_CHARS = 1024
MAX_DEPTH = 64
#: the largest string leaf, in UTF-8 bytes, and the most items one leaf may take in one call
MAX_TEXT_BYTES = 2**20
MAX_ITEMS = 1_000_000
#: integers beyond this magnitude are not exact as float64, the type every number is stored as
MAX_EXACT_INT = 2**53


class NamespaceError(ValueError):
    """A namespace, path, value or request that cannot be published or analysed; ``field`` names what is wrong
    (a leaf's path, ``namespace``, or a request field such as ``sql``)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


def domain_of(namespace: str) -> str | None:
    """The SOMA domain a namespace belongs to (its name, or the part before its first '.', when that is one of
    DOMAINS: ``application.astaroth`` is application diagnostics), else None (a user-defined namespace)."""
    head = namespace.split(".", 1)[0]
    return head if head in DOMAINS else None


def check_namespace(name: Any) -> str:
    """``name`` if it is a valid namespace name (letters, digits, ``_ . -``; at most 64; starts with a letter or
    digit), else NamespaceError."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise NamespaceError("namespace", f"{name!r:.80} is not a namespace name (letters, digits, '_', '.', '-'; "
                                          f"starting with a letter or digit; at most 64 characters)")
    return name


#: paths found valid (a producer sets the same paths every step: the checks run once per path)
VALID_PATHS: set[str] = set()
VALID_PATHS_MAX = 65_536


def check_path(path: Any) -> str:
    """``path`` if it is a valid leaf path, else NamespaceError naming it."""
    if path.__class__ is str and path in VALID_PATHS:
        return path
    if not isinstance(path, str):
        raise NamespaceError(repr(path)[:80], f"a path is a string of keys joined by '/', got {type(path).__name__}")
    if len(path) > MAX_PATH_CHARS:
        raise NamespaceError(path[:80] + "...", f"path of {len(path)} characters; at most {MAX_PATH_CHARS}")
    if not _PATH_RE.fullmatch(path):
        why = ("is empty" if not path else "has an empty key (a leading, trailing or doubled '/')"
               if "" in path.split(SEPARATOR) else "has a control character")
        raise NamespaceError(repr(path), f"not a path: it {why}")
    if path.count(SEPARATOR) >= MAX_DEPTH:
        raise NamespaceError(path, f"{path.count(SEPARATOR) + 1} levels deep; at most {MAX_DEPTH}")
    if len(VALID_PATHS) >= VALID_PATHS_MAX:
        VALID_PATHS.clear()
    VALID_PATHS.add(path)
    return path


def join(prefix: str, key: Any, path_for_errors: str) -> str:
    """``prefix/key`` for a key of a nested mapping (keys must be strings)."""
    if not isinstance(key, str):
        raise NamespaceError(f"{path_for_errors}/{key!r}" if path_for_errors else repr(key),
                             f"keys of a record are strings, got {type(key).__name__}")
    return f"{prefix}{SEPARATOR}{key}" if prefix else key


@dataclass(slots=True)
class Leaf:
    """One leaf as a call gave it: its values (floats or strs) and whether it is a single value (a scalar set)."""

    values: list
    single: bool


def _number(path: str, v: Any) -> float:
    if isinstance(v, (bool, np.bool_)):
        return 1.0 if v else 0.0
    if isinstance(v, (int, np.integer)):
        if abs(int(v)) > MAX_EXACT_INT:
            raise NamespaceError(path, f"the integer {int(v)} is too large to be stored exactly (numbers are float64: "
                                       f"at most 2**53 in magnitude); publish it as a string")
        return float(v)
    return float(v)  # float, np.floating: NaN and infinities are data (a NaN count's cause)


def _item(path: str, v: Any) -> float | str:
    cls = v.__class__
    if cls is float:
        return v
    if cls is int and -MAX_EXACT_INT <= v <= MAX_EXACT_INT:
        return float(v)
    if isinstance(v, str):
        if len(v) > MAX_TEXT_BYTES // 4 and len(v.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise NamespaceError(path, f"a string of {len(v.encode('utf-8', 'surrogatepass'))} bytes; at most "
                                       f"{MAX_TEXT_BYTES} bytes per leaf")
        return v
    if isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating)):
        return _number(path, v)
    if v is None:
        raise NamespaceError(path, "None is not a value: a leaf holds a number or a string (leave the key out)")
    raise NamespaceError(path, f"a {type(v).__name__} cannot be published: a leaf holds numbers, strings, or a "
                               f"list or 1-D array of them ({v!r:.60})")


def _sequence(path: str, value: Any) -> list:
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise NamespaceError(path, f"a {value.ndim}-D array; publish 1-D arrays (one per row, e.g. "
                                       f"{path}/0, {path}/1, ...)")
        if value.size > MAX_ITEMS:
            raise NamespaceError(path, f"an array of {value.size} items; at most {MAX_ITEMS} per leaf and call")
        if value.dtype.kind in "biuf":
            if value.dtype.kind in "iu" and value.size <= 16:  # a location's few coordinates: exact, in Python
                ints = value.tolist()
                for v in ints:
                    if v > MAX_EXACT_INT or v < -MAX_EXACT_INT:
                        raise NamespaceError(path, "an integer array with values too large to be stored exactly as "
                                                   "float64")
                return [float(v) for v in ints]
            if value.dtype.kind in "iu" and value.size and np.abs(value.astype(np.float64)).max() > MAX_EXACT_INT:
                raise NamespaceError(path, "an integer array with values too large to be stored exactly as float64")
            return value.astype(np.float64).tolist()
        return [_item(path, v) for v in value.tolist()]
    n = len(value)
    if n > MAX_ITEMS:
        raise NamespaceError(path, f"a list of {n} items; at most {MAX_ITEMS} per leaf and call")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, (Mapping, list, tuple, np.ndarray)):
            raise NamespaceError(f"{path}[{i}]", f"a list item is a number or a string, not a "
                                                 f"{type(v).__name__} (use keys for nesting)")
        out.append(_item(f"{path}[{i}]", v))
    return out


def leaves(path: str, value: Any, *, depth: int = 0) -> list[tuple[str, Leaf]]:
    """The (path, Leaf) pairs of ``value`` set at ``path``: a mapping is walked (its keys extend the path), a
    list, tuple or 1-D array is one leaf of several values, anything else one single value. NamespaceError
    names the first path that cannot be published."""
    out: list[tuple[str, Leaf]] = []
    _walk(path, value, depth, out)
    return out


def _walk(path: str, value: Any, depth: int, out: list) -> None:
    cls = value.__class__
    if cls is float or cls is int:  # the common leaf, first
        out.append((check_path(path), Leaf([_item(path, value)], True)))
        return
    if cls is dict or (cls is not str and isinstance(value, Mapping)):
        if not value:
            raise NamespaceError(path or "(root)", "an empty mapping has no leaf to publish")
        if depth > MAX_DEPTH:
            raise NamespaceError(path, f"nested more than {MAX_DEPTH} levels")
        for key, sub in value.items():
            _walk(join(path, key, path), sub, depth + 1, out)
        return
    check_path(path)
    if isinstance(value, (list, tuple, np.ndarray)):
        out.append((path, Leaf(_sequence(path, value), False)))
    else:
        out.append((path, Leaf([_item(path, value)], True)))


#: (path, key) -> the path of the key below it, for the quick walk (a producer sets the same shapes every step)
_JOINED: dict[tuple[str, str], str] = {}


def common_leaves_reference(path: str, value: Any) -> list[tuple[str, list, bool]] | None:
    """The leaves of a value of the shapes a program publishes every step -- a number (int, bool, float or a float
    subclass such as numpy's float64), a string, a list or 1-D array of them, or a dict of those with string keys --
    as (path, values, single), walked with fewer checks: those of :func:`leaves`, or its NamespaceError; None for
    anything else (an int too large to be exact, another numpy scalar, a long string, another Mapping, a path not
    checked before...), which :func:`leaves` must judge.
    The pure-Python reference of :func:`common_leaves` (compiled: ``_record_walk.c``, the same steps)."""
    out: list[tuple[str, list, bool]] = []
    return out if _common_walk(path, value, 0, out) else None


def _common_walk(path: str, value: Any, depth: int, out: list) -> bool:
    cls = value.__class__
    if cls is dict:
        if not value or depth > MAX_DEPTH:
            return False
        for key, sub in value.items():
            p = _JOINED.get((path, key)) if key.__class__ is str else None
            if p is None:  # first met (checked by the general walk, then remembered), or not a str key
                if key.__class__ is not str or len(_JOINED) >= VALID_PATHS_MAX:
                    return False
                p = _JOINED[(path, key)] = f"{path}{SEPARATOR}{key}" if path else key
            if not _common_walk(p, sub, depth + 1, out):
                return False
        return True
    if path not in VALID_PATHS:  # a leaf's path is checked once, by the general walk
        return False
    if cls is float:
        out.append((path, [value], True))
    elif cls is int:
        if not -MAX_EXACT_INT <= value <= MAX_EXACT_INT:
            return False
        out.append((path, [float(value)], True))
    elif cls is bool:
        out.append((path, [1.0 if value else 0.0], True))
    elif cls is str:
        if len(value) > MAX_TEXT_BYTES // 4:
            return False
        out.append((path, [value], True))
    elif cls is np.ndarray or cls is list:
        out.append((path, _sequence(path, value), False))
    elif isinstance(value, float):  # numpy's float64 (a reduction's result) and other float subclasses
        out.append((path, [float(value)], True))
    else:
        return False
    return True


try:  # the compiled walk, built with the package (pip install -e .); FLOWSCOPE_COMPILED=0 runs the reference
    from flowscope.model import _record_walk
except ImportError:  # pragma: no cover - a source tree that was not built
    _record_walk = None
if _record_walk is not None:
    _record_walk.configure(VALID_PATHS, _sequence, np.ndarray, MAX_EXACT_INT, MAX_TEXT_BYTES // 4, MAX_DEPTH,
                           VALID_PATHS_MAX)
common_leaves = (_record_walk.walk if _record_walk is not None and os.environ.get("FLOWSCOPE_COMPILED", "1") != "0"
                 else common_leaves_reference)


# ---- rows ----------------------------------------------------------------------------------------------------
def _ints(values: list[int | None]) -> pa.Array:
    nulls = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
    data = np.fromiter((0 if v is None else v for v in values), dtype=np.int64, count=len(values))
    valid = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
    return pa.Array.from_buffers(pa.int64(), len(values), [valid, pa.py_buffer(data)], null_count=int(nulls.sum()))


def _floats(values: list[float | None]) -> pa.Array:
    nulls = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
    data = np.fromiter((0.0 if v is None else v for v in values), dtype=np.float64, count=len(values))
    valid = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
    return pa.Array.from_buffers(pa.float64(), len(values), [valid, pa.py_buffer(data)],
                                 null_count=int(nulls.sum()))


def _strings(values: list[str | None]) -> pa.Array:
    b = pa.lib.StringBuilder()  # not pa.array(): its first call imports pandas, which a publisher need not pay
    b.append_values(values)
    return b.finish()


def tables(namespace: str, resource_id: str, parts: Iterable[tuple[str, int, list, bool]]) -> dict[str, pa.Table]:
    """The ``metrics`` and ``namespace_values`` rows of committed leaves ``(path, commit ts_ns, values, single)``, as
    canonical tables (a table with no rows is left out)."""
    m_ts, m_name, m_value = [], [], []
    v_ts, v_name, v_item, v_value, v_text = [], [], [], [], []
    for path, ts, values, single in parts:
        if single and not isinstance(values[0], str):
            m_ts.append(ts)
            m_name.append(path)
            m_value.append(values[0])
            continue
        for i, v in enumerate(values):
            v_ts.append(ts)
            v_name.append(path)
            v_item.append(None if single else i)
            if isinstance(v, str):
                v_value.append(None)
                v_text.append(v)
            else:
                v_value.append(v)
                v_text.append(None)
    out = {}
    if m_ts:
        n = len(m_ts)
        out["metrics"] = pa.Table.from_arrays(
            [_ints(m_ts), _strings([resource_id] * n), _strings([namespace] * n), _strings(m_name),
             _floats(m_value)], schema=METRICS)
    if v_ts:
        n = len(v_ts)
        out["namespace_values"] = pa.Table.from_arrays(
            [_ints(v_ts), _strings([resource_id] * n), _strings([namespace] * n), _strings(v_name), _ints(v_item),
             _floats(v_value), _strings(v_text)], schema=NAMESPACE_VALUES)
    return out


def check_namespace_values(data: pa.Table) -> tuple[str, str] | None:
    """(column, why) when a canonical ``namespace_values`` table breaks the table's rules (a bad namespace or
    path, a row with both or neither of value and text), naming the row; None when it keeps them."""
    if data.num_rows == 0:
        return None
    ns_ok = pc.match_substring_regex(data.column("namespace"), NAME_RE.pattern.join("^$"))
    if not pc.all(ns_ok).as_py():
        row = pc.index(ns_ok, False).as_py()
        return "namespace", f"row {row}: {data.column('namespace')[row].as_py()!r:.80} is not a namespace name"
    path_ok = pc.match_substring_regex(data.column("name"), PATH_PATTERN)
    if not pc.all(path_ok).as_py():
        row = pc.index(path_ok, False).as_py()
        return "name", f"row {row}: {data.column('name')[row].as_py()!r:.80} is not a path (keys joined by '/')"
    one = pc.xor(pc.is_valid(data.column("value")), pc.is_valid(data.column("text")))
    if not pc.all(one).as_py():
        row = pc.index(one, False).as_py()
        return "value", f"row {row}: a row holds a number (value) or a string (text), exactly one of them"
    return None


def rebuild(rows: Iterable[Mapping[str, Any]]) -> dict:
    """The nested record that rows of one namespace hold (``name``, ``item``, ``value``, ``text``, ``ts_ns``, as
    the analysis ``namespace_rows`` returns them): lists in (ts_ns, item) order; a path given again later (a
    later commit) replaces a single value. Numbers come back as floats."""
    rows = sorted(rows, key=lambda r: (r["ts_ns"], -1 if r.get("item") is None else r["item"]))
    tree: dict = {}
    lists: dict[str, list] = {}
    for r in rows:
        v = r.get("text") if r.get("text") is not None else r.get("value")
        keys = r["name"].split(SEPARATOR)
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if r.get("item") is None:
            node[keys[-1]] = v
        else:
            lst = lists.get(r["name"])
            if lst is None:
                lst = lists[r["name"]] = node[keys[-1]] = []
            lst.append(v)
    return tree
