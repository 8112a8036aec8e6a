"""Decoding a trace-event file (object or array form, plain or gzip) one event at a time with bounded memory:
a sliding text window, parsed a window of whole events at a time with orjson when it can, one event at a time
(placing any error at its byte offset) when it cannot."""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO

try:
    import orjson
except ImportError:  # optional: without it every event goes through the stdlib scanner
    orjson = None

CHUNK = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")
#: characters of text decoded per window on the fast path (whole events, parsed in one call)
WINDOW = 4 << 20


def _error(path: Path, msg: str) -> Exception:
    from flowscope.importers import TraceError

    return TraceError(f"{path}: {msg}")


class _Events:
    """Decodes the top-level value of a trace-event file one event at a time with bounded memory.

    Iterating yields each event (a dict); ``meta`` collects the object form's other keys,
    ``form`` is ``"object"`` or ``"array"``, ``unterminated`` whether an array ended without ``]``."""

    def __init__(self, path: Path, raw: BinaryIO, text_offset_note: str):
        self.path = path
        self.raw = raw
        self.note = text_offset_note
        self.dec = codecs.getincrementaldecoder("utf-8")("strict")
        self.scan = json.JSONDecoder().scan_once
        self.buf = ""
        self.pos = 0
        self.base_bytes = 0   # bytes of decoded content before self.buf
        self.eof = False
        self.form = ""
        self.unterminated = False
        self.meta: dict[str, Any] = {}
        self.index = -1        # index of the event being decoded
        self.event_pos = 0     # its position in self.buf
        self.batch_pos = -1    # where the window of events being handed out starts (fast path)
        self.batch_index = 0   # index of its first event
        self.slow_until = 0    # the fast path failed before here: decode one event at a time up to it

    # ---- window --------------------------------------------------------------------------------
    def byte_offset(self, pos: int | None = None) -> int:
        """Byte offset (in the decompressed content) of ``pos`` in the current window."""
        p = self.pos if pos is None else pos
        return self.base_bytes + len(self.buf[:p].encode("utf-8", "surrogatepass"))

    def where(self, pos: int | None = None) -> str:
        return f"byte offset {self.byte_offset(pos)}{self.note}"

    def event_where(self) -> str:
        """Where the current event starts (found again by scanning when it came from a window)."""
        if self.batch_pos < 0:
            return self.where(self.event_pos)
        p = _WS.match(self.buf, self.batch_pos).end()
        for _ in range(self.index - self.batch_index):
            _v, p = self.scan(self.buf, p)
            p = _WS.match(self.buf, p).end() + 1  # the comma
            p = _WS.match(self.buf, p).end()
        return self.where(p)

    def _window(self) -> list | None:
        """The whole events from the cursor to the last ``},`` of a large window, parsed in one call;
        None when that does not parse as a JSON array of objects (then events are decoded one by one,
        which places the error exactly)."""
        while len(self.buf) - self.pos < WINDOW and self._fill():
            pass
        cut = self.buf.rfind("},", self.pos)
        if cut < self.pos:
            self.slow_until = len(self.buf)
            return None
        try:
            events = orjson.loads("[" + self.buf[self.pos:cut + 1] + "]")
        except orjson.JSONDecodeError:
            events = None
        if events is None or not all(e.__class__ is dict for e in events):
            self.slow_until = cut + 1
            return None
        self.batch_pos = self.pos
        self.batch_index = self.index + 1
        self.pos = cut + 1
        return events

    def _fill(self) -> bool:
        """Drop what is consumed, read another chunk; False at end of input."""
        if self.eof:
            return False
        if self.pos:
            self.base_bytes += len(self.buf[:self.pos].encode("utf-8", "surrogatepass"))
            self.event_pos -= self.pos
            self.slow_until -= self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        try:
            data = self.raw.read(CHUNK)
        except (OSError, EOFError, zlib.error) as exc:
            raise _error(self.path, f"cannot read past {self.where(len(self.buf))}: {exc}") from None
        try:
            text = self.dec.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise _error(self.path, f"invalid UTF-8 at byte offset "
                                    f"{self.byte_offset(len(self.buf)) + exc.start}{self.note}") from None
        if not data:
            self.eof = True
        self.buf += text
        return bool(data) or bool(text)

    def _skip_ws(self) -> str:
        """The next non-blank character ("" at end of input), not consumed."""
        if self.pos < len(self.buf) and self.buf[self.pos] not in " \t\n\r":
            return self.buf[self.pos]
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                return ""

    def _value(self, what: str) -> Any:
        """Decode one JSON value at the cursor, reading more input when the window ends inside it."""
        while True:
            try:
                value, end = self.scan(self.buf, self.pos)
                if end == len(self.buf) and not self.eof and not isinstance(value, (dict, list, str)):
                    # a number at the window's end may continue in the next chunk
                    raise json.JSONDecodeError("number at window end", self.buf, len(self.buf))
                self.pos = end
                return value
            except StopIteration as exc:
                err = ("Expecting value", exc.value)
            except json.JSONDecodeError as exc:
                err = (exc.msg, exc.pos)
            except RecursionError:
                raise _error(self.path, f"{what} nested too deeply at {self.where()}") from None
            at_end = err[1] >= len(self.buf) - 8 or err[0].startswith("Unterminated string")
            if at_end and self._fill():
                continue
            pos = min(err[1], len(self.buf))
            if at_end:
                raise _error(self.path, f"truncated: the file ends inside {what} "
                                        f"(which starts at {self.where(self.pos)}; input ends at "
                                        f"{self.where(len(self.buf))})")
            raise _error(self.path, f"invalid JSON in {what} at {self.where(pos)}: {err[0]}")

    def _expect(self, chars: str, what: str) -> str:
        c = self._skip_ws()
        if c == "":
            raise _error(self.path, f"truncated: the file ends where {what} was expected ({self.where()})")
        if c not in chars:
            raise _error(self.path, f"invalid JSON at {self.where()}: expected {what}, found {c!r}")
        self.pos += 1
        return c

    # ---- structure -----------------------------------------------------------------------------
    def __iter__(self):
        c = self._skip_ws()
        if c == "\ufeff":
            self.pos += 1
            c = self._skip_ws()
        if c == "[":
            self.form = "array"
            self.pos += 1
            yield from self._array(top=True)
        elif c == "{":
            self.form = "object"
            self.pos += 1
            yield from self._object()
        elif c == "":
            raise _error(self.path, "empty file: expected a JSON object with traceEvents or an array of events")
        else:
            raise _error(self.path, f"not a trace-event file: expected '{{' or '[' at {self.where()}, found {c!r}")
        if self._skip_ws() != "":
            raise _error(self.path, f"unexpected data after the end of the trace at {self.where()}")

    def _object(self):
        seen_events = False
        if self._skip_ws() == "}":
            self.pos += 1
        else:
            while True:
                self._expect('"', "a key (string)")
                self.pos -= 1
                key = self._value("a key")
                self._expect(":", "':'")
                if key == "traceEvents":
                    self._expect("[", "the traceEvents array '['")
                    seen_events = True
                    yield from self._array(top=False)
                else:
                    if self._skip_ws() == "":
                        raise _error(self.path, f"truncated: the file ends before the value of {key!r} "
                                                f"({self.where()})")
                    self.meta[key] = self._value(f"the value of {key!r}")
                if self._expect(",}", "',' or '}'") == "}":
                    break
        if not seen_events:
            raise _error(self.path, "the JSON object has no traceEvents array")

    def _array(self, top: bool):
        c = self._skip_ws()
        if c == "]":
            self.pos += 1
            return
        while True:
            c = self._skip_ws()
            if c == "" and top and self.index >= 0:
                self.unterminated = True  # Chrome writes the array form without "]" while tracing
                return
            events = self._window() if orjson is not None and self.pos >= self.slow_until else None
            if events is not None:
                for event in events:
                    self.index += 1
                    yield event
                self.batch_pos = -1
            else:
                self.index += 1
                self.event_pos = self.pos
                event = self._value(f"event #{self.index}")
                if not isinstance(event, dict):
                    raise _error(self.path, f"event #{self.index} at {self.where(self.event_pos)} is a "
                                            f"{type(event).__name__}, expected a JSON object")
                yield event
            c = self._skip_ws()
            if c == ",":
                self.pos += 1
                if top and self._skip_ws() == "":
                    self.unterminated = True
                    return
                continue
            if c == "]":
                self.pos += 1
                return
            if c == "" and top:
                self.unterminated = True
                return
            if c == "":
                raise _error(self.path, f"truncated: the file ends inside the traceEvents array ({self.where()})")
            raise _error(self.path, f"invalid JSON at {self.where()}: expected ',' or ']' after event "
                                    f"#{self.index}, found {c!r}")


def _num(event: dict, key: str, ev: _Events, required: bool = True) -> float | int | None:
    v = event.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    if v is None and not required:
        return None
    if v is None:
        raise _error(ev.path, f"event #{ev.index} (ph {event.get('ph')!r}) at {ev.event_where()} "
                              f"has no {key!r} field")
    raise _error(ev.path, f"event #{ev.index} (ph {event.get('ph')!r}) at {ev.event_where()}: "
                          f"field {key!r} is {type(v).__name__} {v!r:.40}, expected a number of microseconds")


def _open(path: Path) -> tuple[BinaryIO, BinaryIO, str]:
    raw = open(path, "rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw, " of the decompressed content"
    raw.seek(0)
    return raw, raw, ""
