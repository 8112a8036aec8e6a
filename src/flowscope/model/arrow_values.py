"""Arrow arrays and scalars made from Python values without going through pyarrow's pandas shim.

pyarrow imports pandas, when it is installed, the first time it converts Python objects or a numpy array
(``pa.array``, ``pa.scalar``, ``pa.table`` of lists, a Python value handed to a compute function): it checks whether
the value is a pandas object. In a process flowscope records in (a user's program, a Dask worker), that import
would cost 0.24-0.3 s and ~29,000 more objects for the garbage collector to walk at every full collection. The
recording paths build their arrays here instead, from buffers and with pyarrow's builders; the arrays are the same.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["bools", "fixed", "int32s", "int64s", "repeat_int64", "repeat_text", "text", "texts"]


def fixed(t: pa.DataType, values: np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
    """A fixed-width array of type ``t`` over ``values`` (a contiguous numpy array of its width); ``nulls``: where
    the values are null."""
    if nulls is None or not nulls.any():
        return pa.Array.from_buffers(t, len(values), [None, pa.py_buffer(values)], null_count=0)
    valid = np.packbits(~nulls, bitorder="little")
    return pa.Array.from_buffers(t, len(values), [pa.py_buffer(valid), pa.py_buffer(values)],
                                 null_count=int(nulls.sum()))


def _numbers(values: Any, dtype: type, t: pa.DataType, nulls: np.ndarray | None) -> pa.Array:
    if isinstance(values, (bytes, bytearray, memoryview)):
        arr = np.frombuffer(values, dtype)
    else:
        arr = np.ascontiguousarray(np.asarray(values, dtype))
    return fixed(t, arr, nulls)


def int64s(values: Any, nulls: np.ndarray | None = None) -> pa.Array:
    """An int64 array from raw native-endian bytes, a numpy array or a sequence of ints; ``nulls`` True = null."""
    return _numbers(values, np.int64, pa.int64(), nulls)


def int32s(values: Any, nulls: np.ndarray | None = None) -> pa.Array:
    """An int32 array, as :func:`int64s`."""
    return _numbers(values, np.int32, pa.int32(), nulls)


def bools(values: np.ndarray) -> pa.Array:
    """A boolean array from a numpy bool array (no nulls)."""
    values = np.asarray(values, bool)
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(np.packbits(values, bitorder="little"))])


def texts(values: Sequence[str | None]) -> pa.Array:
    """A string array of ``values`` (str, or None for null)."""
    b = pa.lib.StringBuilder()
    b.append_values(values)
    return b.finish()


@functools.lru_cache(maxsize=256)
def text(value: str) -> pa.StringScalar:
    """A string scalar, for the compute functions (a Python str handed to them goes through the shim)."""
    return texts([value])[0]


def repeat_text(value: str, n: int) -> pa.Array:
    """A string array of ``n`` times ``value``."""
    return pa.repeat(text(value), n)


def repeat_int64(value: int, n: int) -> pa.Array:
    """An int64 array of ``n`` times ``value``."""
    return fixed(pa.int64(), np.full(n, value, np.int64))
