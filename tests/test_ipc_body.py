"""The Arrow IPC body a client POSTs: written into a buffer sized in advance, byte for byte the stream Arrow's own
writer produces, whatever the table holds (several chunks, dictionaries, metadata, no rows)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flowscope.client.transport import ipc_body, ipc_bytes


def _reference(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _tables() -> dict[str, pa.Table]:
    n = 70_000
    spans = pa.table({"name": pa.array([f"fn-{i % 8}" for i in range(n)]), "start_ns": pa.array(range(n), pa.int64()),
                      "task_key": pa.array([None if i % 5 == 0 else f"k-{i}" for i in range(n)])})
    chunked = pa.concat_tables([spans.slice(0, 10), spans.slice(10, 1000), spans.slice(1010)])
    with_meta = spans.replace_schema_metadata({"flowscope": "x" * 200_000})  # a schema message far beyond a guess
    dictionary = spans.set_column(0, "name", spans.column("name").dictionary_encode())  # dictionary batches too
    return {"plain": spans, "chunked": chunked, "metadata": with_meta, "dictionary": dictionary,
            "empty": spans.slice(0, 0), "lists": pa.table({"x": pa.array([["a", "b"], None, []] * 1000)})}


@pytest.mark.parametrize("name", list(_tables()))
def test_the_body_is_the_stream_arrow_writes(name):
    table = _tables()[name]
    body = ipc_body(table)
    assert isinstance(body, memoryview)
    assert bytes(body) == _reference(table)
    assert ipc_bytes(table) == _reference(table)
    assert pa.ipc.open_stream(pa.py_buffer(body)).read_all().equals(table)
