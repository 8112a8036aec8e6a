"""A JSON-text column (``attrs``) handed over as an Arrow struct, written as the text ``json.dumps`` writes for the
same values: fields in order, ``", "`` and ``": "`` between them, strings escaped to ASCII.

A producer that has its attributes as columns (the local-scheduler capture: sizes, groups, threads) can then hand
them over as they are, and the text is made where the run is stored, by :func:`flowscope.model.conform.conform`,
once per distinct string value and vectorised over rows for the rest.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.model.arrow_values import text

__all__ = ["JSON_COLUMNS", "field_problem", "text_bytes", "text_of"]

#: the canonical columns whose values are JSON text, and so may be given as a struct
JSON_COLUMNS = frozenset({"attrs"})



def _scalar_problem(t: pa.DataType) -> str | None:
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_null(t)):
        return None
    return f"has type {t}"


def field_problem(t: pa.DataType) -> str | None:
    """Why a struct of type ``t`` cannot be written as JSON text here (None: it can). A field may be an integer,
    float, boolean, string or null, or a dictionary of one of those."""
    if not pa.types.is_struct(t):
        return f"has type {t}, expected a struct"
    for f in t:
        ft = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        problem = _scalar_problem(ft)
        if problem is not None:
            return f"field {f.name!r} {problem}: give it as JSON text, or as an integer, float, boolean or string"
    return None


def _python_rendered(values: pa.Array) -> pa.Array:
    """Each value as ``json.dumps`` writes it (null as ``null``), one Python call per value: for the few distinct
    values of a dictionary, and for floats, whose shortest round-trip text Arrow does not write."""
    b = pa.lib.StringBuilder()
    b.append_values(["null" if v is None else json.dumps(v) for v in values.to_pylist()])
    return b.finish()


def _rendered(values: pa.Array) -> pa.Array:
    """The JSON text of each value of an array, nulls as ``null``."""
    if isinstance(values, pa.DictionaryArray):
        return _from_dictionary(values)
    t = values.type
    if pa.types.is_null(t):
        return pa.repeat(text("null"), len(values))
    if pa.types.is_integer(t):
        return pc.fill_null(pc.cast(values, pa.string()), text("null"))
    if pa.types.is_boolean(t):
        return pc.fill_null(pc.if_else(values, text("true"), text("false")), text("null"))
    if pa.types.is_floating(t):
        return _python_rendered(values)
    return _from_dictionary(pc.dictionary_encode(values))  # strings: escaped once per distinct value


def _dictionary_text(values: pa.DictionaryArray) -> pa.Array:
    """The JSON text of each value of the dictionary of ``values``."""
    d = values.dictionary
    if pa.types.is_integer(d.type) or pa.types.is_boolean(d.type) or pa.types.is_null(d.type):
        return _rendered(d)
    return _python_rendered(d)  # strings (json.dumps's escaping, to ASCII) and floats


def _from_dictionary(values: pa.DictionaryArray) -> pa.Array:
    return pc.fill_null(_dictionary_text(values).take(values.indices), text("null"))


def text_of(arr: pa.StructArray | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The JSON text of each row of a struct column (a null row stays null)."""
    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array([text_of(c) for c in arr.chunks], pa.string())
    n = len(arr)
    names = [f.name for f in arr.type]
    if not names:
        joined = pa.repeat(text("{}"), n)
    else:
        pieces: list = []
        for i, (name, values) in enumerate(zip(names, map(_rendered, arr.flatten()))):
            pieces += [text(("{" if i == 0 else ", ") + json.dumps(name) + ": "), values]
        pieces += [text("}"), text("")]
        joined = pc.binary_join_element_wise(*pieces)
    if arr.null_count:
        joined = pc.if_else(arr.is_valid(), joined, pa.nulls(n, pa.string()))
    return joined.cast(pa.string())


def text_bytes(arr: pa.StructArray | pa.ChunkedArray) -> int:
    """Bytes the JSON text of ``arr`` takes once written, as a string array (what :func:`text_of` would make),
    counted without making the rows' text: only the distinct strings' texts and the numbers' are made."""
    if isinstance(arr, pa.ChunkedArray):
        return sum(text_bytes(c) for c in arr.chunks)
    n = len(arr)
    total = np.full(n, 2 + max(0, len(arr.type) - 1) * 2, np.int64)  # braces, separators
    for f, values in zip(arr.type, arr.flatten()):
        total += len(json.dumps(f.name)) + 2
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            values = pc.dictionary_encode(values)
        if isinstance(values, pa.DictionaryArray):
            lengths = pc.binary_length(_dictionary_text(values)).to_numpy(zero_copy_only=False).astype(np.int64)
            ind = values.indices
            if ind.null_count:  # a null is written "null"
                valid = ind.is_valid().to_numpy(zero_copy_only=False)
                at = np.where(valid, np.nan_to_num(ind.to_numpy(zero_copy_only=False)), 0).astype(np.int64)
                total += np.where(valid, lengths[at] if len(lengths) else 0, 4)
            else:
                total += lengths[ind.to_numpy(zero_copy_only=False).astype(np.int64)]
        else:  # a number, a boolean or null: its text is at most three times its width in the batch
            total += pc.binary_length(_rendered(values)).to_numpy(zero_copy_only=False)
    return int(total.sum()) + 4 * (n + 1)
