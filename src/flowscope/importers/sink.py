"""Where an importer puts what it reads: canonical batches written as segments of one run, plus notes.

An importer never touches the store's layout. It hands tables (or columns, or rows) to an
:class:`ImportSink`, which conforms them to the canonical schema (a misfit raises
:class:`~flowscope.model.conform.SchemaError` naming table.column), buffers them per table and
writes them as segments of the run. Segment names derive from the imported file's content (a hash of
its bytes), so a file whose bytes are already in the run adds nothing.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from flowscope.model.conform import SchemaError, conform, records_to_table
from flowscope.model.schemas import schema

#: rows buffered per table before a segment is written
SEGMENT_ROWS = 250_000


def content_key(files: Sequence[Path]) -> str | None:
    """A hash of the bytes of ``files`` (BLAKE2b, 128 bits, hex), read in 1 MiB blocks; None when one of them
    is not a regular file (a pipe cannot be read twice: once to hash it, once to import it)."""
    h = hashlib.blake2b(digest_size=16)
    buf = bytearray(2**20)
    view = memoryview(buf)
    for f in files:
        if not Path(f).is_file():
            return None
        h.update(b"\0file\0")
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                h.update(view[:n])
    return h.hexdigest()


def _column(values: Any, typ: pa.DataType | None, table: str, name: str) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    try:
        return pa.array(values if hasattr(values, "__len__") else list(values), type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise SchemaError(table, f"cannot be read as {typ}: {exc}", name) from None


class ImportSink:
    """Receives one file's canonical batches for a run and writes them as segments.

    ``write(run_id, table, segment_id, data)`` is the store-side writer (the embedded collector's
    ``ingest``); ``run_dir`` the run's directory (rows this sink writes appear there as it flushes); ``progress(done)`` is called with the bytes of input consumed so far when an importer
    reports them through :meth:`advance`. ``key`` is the file's :func:`content_key` (computed here when not
    given); the segments are named ``import-<format>-<key>-<n>`` (:attr:`token` is the part before ``-<n>``)."""

    def __init__(self, run_id: str, path: Path, fmt: str,
                 write: Callable[[str, str, str, pa.Table], Any],
                 progress: Callable[[int], None] | None = None, run_dir: Path | None = None,
                 key: str | None = None):
        self.run_id = run_id
        #: the run's directory: an importer that adds to an existing run may read what is there
        self.run_dir = run_dir
        self.path = path
        self.format = fmt
        self._write = write
        self._progress = progress
        key = key or content_key([path]) or uuid.uuid4().hex  # a pipe: no content to name it by
        self.token = f"import-{fmt}-{key}"
        self._pending: dict[str, list[pa.Table]] = {}
        self._pending_rows: dict[str, int] = {}
        self._seq: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.warnings: list[str] = []
        self.meta: dict[str, Any] = {}
        self.run_fields: dict[str, Any] = {}

    # ---- data -----------------------------------------------------------------------------
    def add(self, table: str, data: pa.Table | pa.RecordBatch | Mapping[str, Iterable] | Iterable[Mapping]) -> int:
        """Add rows to ``table``: an Arrow table/batch, a dict of columns, or an iterable of row dicts.

        Returns the number of rows added. Missing nullable columns are filled with nulls."""
        target = schema(table)
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        elif isinstance(data, Mapping):
            data = pa.table({k: _column(v, target.field(k).type if k in target.names else None, table, k)
                             for k, v in data.items()})
        elif not isinstance(data, pa.Table):
            data = records_to_table(table, list(data))
        data = conform(table, data)
        if data.num_rows == 0:
            return 0
        self._pending.setdefault(table, []).append(data)
        self._pending_rows[table] = self._pending_rows.get(table, 0) + data.num_rows
        self.counts[table] = self.counts.get(table, 0) + data.num_rows
        if self._pending_rows[table] >= SEGMENT_ROWS:
            self._flush_table(table)
        return data.num_rows

    def _flush_table(self, table: str) -> None:
        parts = self._pending.pop(table, None)
        self._pending_rows.pop(table, None)
        if not parts:
            return
        seq = self._seq.get(table, 0)
        self._seq[table] = seq + 1
        self._write(self.run_id, table, f"{self.token}-{seq:06d}", pa.concat_tables(parts).combine_chunks())

    def flush(self) -> None:
        """Write every buffered row."""
        for table in list(self._pending):
            self._flush_table(table)

    # ---- notes ----------------------------------------------------------------------------
    def warn(self, message: str) -> None:
        """Something the user should know about the input that did not stop the import
        (say where: line, byte offset, record)."""
        self.warnings.append(message)

    def set_meta(self, **fields: Any) -> None:
        """Facts about the imported file kept in run.json under this import's entry (``imports[i].meta``)."""
        self.meta.update(fields)

    def set_run_fields(self, **fields: Any) -> None:
        """Top-level run.json fields the trace determines (``start_ns``, ``end_ns``, ``command``, ...)."""
        self.run_fields.update(fields)

    def advance(self, done_bytes: int) -> None:
        """Report progress: bytes of the input file consumed so far."""
        if self._progress is not None:
            self._progress(done_bytes)
