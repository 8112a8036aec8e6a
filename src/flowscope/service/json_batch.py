"""Decode a JSON ingest body (an array of records, or ``{"records": [...]}``) into a canonical table.

The records are parsed a window of about a MiB at a time and each window is converted to Arrow before
the next is parsed, so a batch never exists as one list of Python dicts (which costs 5 to 25 times
the body's size, depending on its shape) and no single call holds the GIL for longer than one window:
the event loop of the collector keeps answering while a large batch is decoded on a worker thread.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator

import orjson
import pyarrow as pa

from flowscope.model.conform import SchemaError, records_to_table

#: characters of text parsed per call on the fast path
WINDOW_CHARS = 1 << 18

_WS = re.compile(r"[ \t\n\r]*")
_STDLIB = json.JSONDecoder()
_SHAPE = 'a JSON batch is an array of records or {"records": [...]}'


class MalformedBatch(ValueError):
    """The body is not a JSON batch; the message says where (line, column, character offset)."""


def _where(text: str, pos: int) -> str:
    return str(json.JSONDecodeError("", text, pos)).lstrip(": ")


def _value(text: str, pos: int) -> tuple[object, int]:
    """One JSON value at ``pos`` with the standard decoder, whose errors say where."""
    try:
        return _STDLIB.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise MalformedBatch(f"malformed JSON batch: {exc}") from None


def _expect(text: str, pos: int, chars: str, what: str) -> tuple[str, int]:
    pos = _WS.match(text, pos).end()
    c = text[pos:pos + 1]
    if not c or c not in chars:
        raise MalformedBatch(f"malformed JSON batch: expecting {what}: {_where(text, pos)}")
    return c, pos + 1


def _records_start(text: str) -> tuple[int, bool]:
    """Where the records array's first element may start, and whether it sits in a ``{"records": ...}``."""
    c, pos = _expect(text, 0, "[{", f"'[' or '{{' ({_SHAPE})")
    if c == "[":
        return pos, False
    while True:
        _c, key_pos = _expect(text, pos, '"}', "a key")
        if _c == "}":
            raise MalformedBatch(f"{_SHAPE}; the object has no 'records' key")
        key, pos = _value(text, key_pos - 1)
        _c, pos = _expect(text, pos, ":", "':'")
        if key == "records":
            c, pos = _expect(text, pos, "[", "the records array")
            return pos, True
        _v, pos = _value(text, _WS.match(text, pos).end())  # another key: skipped, as json.loads would keep it
        _c, pos = _expect(text, pos, ",}", "',' or '}'")
        if _c == "}":
            raise MalformedBatch(f"{_SHAPE}; the object has no 'records' key")


def _finish(text: str, pos: int, in_object: bool) -> None:
    """Check what follows the records array: nothing, or the rest of the ``{"records": ...}`` object."""
    if in_object:
        while True:
            c, pos = _expect(text, pos, ",}", "',' or '}'")
            if c == "}":
                break
            _c, key_pos = _expect(text, pos, '"', "a key")
            key, pos = _value(text, key_pos - 1)
            if key == "records":
                raise MalformedBatch(f"malformed JSON batch: a second 'records' key: {_where(text, key_pos - 1)}")
            _c, pos = _expect(text, pos, ":", "':'")
            _v, pos = _value(text, _WS.match(text, pos).end())
    pos = _WS.match(text, pos).end()
    if pos != len(text):
        raise MalformedBatch(f"malformed JSON batch: extra data after the batch: {_where(text, pos)}")


def _windows(text: str, pos: int) -> Iterator[list]:
    """Lists of records from the array whose first element may start at ``pos``; ``pos`` of the closing
    ``]`` is returned through StopIteration.value."""
    pos = _WS.match(text, pos).end()
    if text.startswith("]", pos):
        return pos + 1
    while True:
        # Fast path: every whole record up to the last "}," of a window, parsed in one call. A cut
        # inside a string or inside a nested value leaves that window unbalanced, which cannot parse,
        # so a window that parses ends exactly on a record.
        cut = text.rfind("},", pos, pos + WINDOW_CHARS)
        records = None
        if cut >= pos:
            try:
                records = orjson.loads("[" + text[pos:cut + 1] + "]")
                pos = cut + 1
            except orjson.JSONDecodeError:
                records = None
        if records is None:  # one record (the last, one larger than a window, or a malformed one)
            record, pos = _value(text, pos)
            records = [record]
        yield records
        c, pos = _expect(text, pos, ",]", "',' or ']' after a record")
        if c == "]":
            return pos
        pos = _WS.match(text, pos).end()


def json_batch_table(table: str, body: bytearray | bytes,
                     on_arrow_bytes: Callable[[int], None] | None = None) -> pa.Table:
    """The canonical ``table`` holding the records of the JSON ``body``.

    A bytearray body is emptied once it has been decoded to text, so its memory is free while the
    records are converted. ``on_arrow_bytes`` is called after each window with the bytes of Arrow
    built so far (the collector counts them against its budget; it may raise to stop). Raises
    MalformedBatch (not JSON, or not a batch) or SchemaError (a record does not fit ``table``; it
    names the record by its index in the whole batch).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedBatch(f"malformed JSON batch: not UTF-8 at byte offset {exc.start}") from None
    if isinstance(body, bytearray):
        body.clear()
    del body
    start, in_object = _records_start(text)
    windows = _windows(text, start)
    parts: list[pa.Table] = []
    done, accepted, arrow_bytes = 0, None, 0
    while True:
        try:
            records = next(windows)
        except StopIteration as stop:
            end = stop.value
            break
        try:
            parts.append(records_to_table(table, records))
        except SchemaError:
            if accepted is not None:
                # Convert again behind `done` copies of an accepted record, so that the error names the
                # record by its position in the whole batch (records_to_table counts from its first row).
                records_to_table(table, itertools.chain(itertools.repeat(accepted, done), records))
            raise
        if accepted is None and records:
            accepted = records[0]
        done += len(records)
        del records
        if on_arrow_bytes is not None:
            arrow_bytes += parts[-1].get_total_buffer_size()
            on_arrow_bytes(arrow_bytes)
    _finish(text, end, in_object)
    if not parts:
        return records_to_table(table, [])
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]
