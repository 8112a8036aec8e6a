"""The canonical tables every source produces and every analysis reads.

Each table is an Arrow schema. Timestamps are int64 nanoseconds since the UTC
epoch; durations are derived (end_ns - start_ns), never stored. ``attrs`` is a
JSON object serialised as a string (DuckDB's json functions read it), for the
fields one source has and the others do not. docs/data-model.md documents
every column and the identifiers that join the tables.
"""

from __future__ import annotations

import pyarrow as pa

NS = pa.int64()
STR = pa.string()
INT64_MAX = 2**63 - 1  # the latest ns timestamp (2262-04-11), and the largest value of every integer column


def _schema(name: str, fields: list[tuple[str, pa.DataType, bool]]) -> pa.Schema:
    return pa.schema(
        [pa.field(col, typ, nullable=nullable) for col, typ, nullable in fields],
        metadata={b"flowscope.table": name.encode()},
    )


RESOURCES = _schema("resources", [
    ("resource_id", STR, False),   # unique within a run; the join key used by every other table
    ("kind", STR, False),          # host | process | worker | scheduler | client | thread | device | rank | container
    ("name", STR, True),           # human-readable label
    ("parent_id", STR, True),      # the resource this one nests in (thread -> process -> host)
    ("host", STR, True),
    ("pid", pa.int64(), True),
    ("tid", pa.int64(), True),          # OS native thread id (threading.get_native_id, gettid)
    ("thread_ident", pa.int64(), True),  # pthread id (threading.get_ident), what Dask and Darshan report
    ("address", STR, True),        # network address (a Dask worker's tcp://...), or MPI rank as text
    ("start_ns", NS, True),
    ("end_ns", NS, True),
    ("attrs", STR, True),
])

SPANS = _schema("spans", [
    ("span_id", pa.int64(), True),   # unique within a run when given; parent_id refers to it
    ("parent_id", pa.int64(), True),
    ("resource_id", STR, False),
    ("kind", STR, False),            # task | call | transfer | io | state | step | ...
    ("name", STR, False),            # function / task group / state value
    ("start_ns", NS, False),
    ("end_ns", NS, False),
    ("task_key", STR, True),
    ("attrs", STR, True),
])

TRANSITIONS = _schema("transitions", [
    ("ts_ns", NS, False),
    ("task_key", STR, False),
    ("group", STR, True),
    ("prefix", STR, True),
    ("from_state", STR, True),
    ("to_state", STR, False),
    ("observer", STR, True),       # where the transition happened: "scheduler" or a worker's resource_id
    ("worker", STR, True),         # the worker the task is on / assigned to, when known
    ("stimulus_id", STR, True),
    ("attrs", STR, True),
])

DEPENDENCIES = _schema("dependencies", [
    ("graph_id", STR, True),       # a run may submit many graphs
    ("task_key", STR, False),      # the dependent task
    ("depends_on", STR, False),    # the task whose output it needs
    ("ts_ns", NS, True),           # when the edge became known
])

TRANSFERS = _schema("transfers", [
    ("transfer_id", pa.int64(), True),
    ("kind", STR, False),          # dask-fetch | mpi | paje-link | ...
    ("src_resource_id", STR, False),
    ("dst_resource_id", STR, False),
    ("nbytes", pa.int64(), True),
    ("start_ns", NS, False),
    ("end_ns", NS, False),
    ("keys", pa.list_(STR), True),  # task keys (data) moved
    ("attrs", STR, True),
])

IO = _schema("io", [
    ("resource_id", STR, True),
    ("host", STR, True),
    ("pid", pa.int64(), True),
    ("tid", pa.int64(), True),           # native thread id
    ("thread_ident", pa.int64(), True),  # pthread id (Darshan DXT, Dask)
    ("rank", pa.int64(), True),          # MPI rank when known
    ("source", STR, False),        # proc-io | audit | darshan-dxt | darshan-counters | ...
    ("op", STR, False),            # read | write | open | close | seek | sync | ...
    ("path", STR, True),
    ("offset", pa.int64(), True),
    ("nbytes", pa.int64(), True),
    ("start_ns", NS, False),
    ("end_ns", NS, True),          # null for instantaneous observations (an open)
    ("task_key", STR, True),       # the task the I/O is attributed to, when attributed
    ("attrs", STR, True),
])

METRICS = _schema("metrics", [
    ("ts_ns", NS, False),
    ("resource_id", STR, False),
    ("namespace", STR, False),     # SOMA-style stream: hardware, performance, application, workflow
    ("name", STR, False),          # hierarchical key, e.g. cpu.core3.percent
    ("value", pa.float64(), False),
])

# The leaves of namespace records that are not a single number (model/namespaces.py; single numbers are metrics)
NAMESPACE_VALUES = _schema("namespace_values", [
    ("ts_ns", NS, False),          # the commit the value belongs to
    ("resource_id", STR, False),   # the publisher
    ("namespace", STR, False),     # application, performance, hardware, workflow, or a user-defined name
    ("name", STR, False),          # the leaf's path, keys joined by '/', e.g. rank/3/extrema/location
    ("item", pa.int64(), True),    # position among the leaf's values of that commit; null for a single string
    ("value", pa.float64(), True),  # a number
    ("text", STR, True),           # a string
])

LOGS = _schema("logs", [
    ("ts_ns", NS, False),
    ("resource_id", STR, True),
    ("level", STR, False),         # debug | info | warning | error
    ("category", STR, False),      # event-loop-unresponsive | gc | spill | task-error | worker-joined | ...
    ("message", STR, True),
    ("task_key", STR, True),
    ("attrs", STR, True),
])

DATA_STATES = _schema("data_states", [
    ("state_id", STR, False),
    ("label", STR, True),
    ("size_bytes", pa.int64(), True),
    ("ts_ns", NS, False),          # when the data reached this state
    ("origin", STR, True),         # producing application / task
    ("location", STR, True),       # e.g. node1:disk1, worker-3:memory
    ("attrs", STR, True),
])

MUTATIONS = _schema("mutations", [
    ("mutation_id", STR, True),
    ("src_state_id", STR, False),
    ("dst_state_id", STR, False),
    ("kind", STR, False),          # TRANSFER | CONVERT | APPEND | SPLIT | MERGE | DELETE
    ("application", STR, True),
    ("attrs", STR, True),
])

# Derived tables: written by an analysis into a run (never by a producer), read like the others.
ANOMALIES = _schema("anomalies", [
    ("anomaly_id", pa.int64(), False),   # 0.. within the run, most severe first
    ("call_id", pa.int64(), False),      # the span: spans.span_id, else its position in (resource, start, end, name) order
    ("resource_id", STR, False),         # thread / worker / rank the call ran on
    ("function", STR, False),            # spans.name: function, or the Dask task prefix
    ("kind", STR, False),                # spans.kind of the call
    ("task_key", STR, True),
    ("start_ns", NS, False),             # entry
    ("end_ns", NS, False),               # exit
    ("inclusive_ns", NS, False),         # end - start
    ("exclusive_ns", NS, False),         # inclusive minus the inclusive time of direct children
    ("metric", STR, False),              # exclusive | inclusive: what was scored
    ("algo", STR, False),                # hbos | sstd
    ("score", pa.float64(), False),      # the algorithm's score (hbos: -log2 p, sstd: |x - mean| / std)
    ("threshold", pa.float64(), False),  # the score from which a call is flagged
    ("severity_ns", NS, False),          # metric value minus the function's mean: time lost (negative: too fast)
    ("step", pa.int64(), False),         # (start - run start) // step length
    ("depth", pa.int64(), False),        # 0 for a root call
    ("parent_call_id", pa.int64(), True),
    ("call_stack", pa.list_(STR), True),  # function names, root first, ending with this call's function
    ("children", pa.int64(), False),     # direct children count
    ("messages", pa.int64(), False),     # transfers touching the call's resource (or its parent) during the call
    ("window_before", pa.list_(pa.int64()), True),  # call_ids of up to k calls before, same resource
    ("window_after", pa.list_(pa.int64()), True),   # call_ids of up to k calls after, same resource
    ("exemplar_call_id", pa.int64(), True),         # one normal call of the same function in the same step
    ("exemplar_ns", NS, True),                      # its metric value
    ("model", STR, False),               # JSON: the function's model parameters the call was judged against
    ("run_id", STR, True),               # the run the call was recorded in
    ("provenance", STR, True),           # JSON: the run's provenance reference (name, command, host, start)
])

DERIVED_TABLES: dict[str, pa.Schema] = {
    "anomalies": ANOMALIES,
}

TABLES: dict[str, pa.Schema] = {
    "resources": RESOURCES,
    "spans": SPANS,
    "transitions": TRANSITIONS,
    "dependencies": DEPENDENCIES,
    "transfers": TRANSFERS,
    "io": IO,
    "metrics": METRICS,
    "namespace_values": NAMESPACE_VALUES,
    "logs": LOGS,
    "data_states": DATA_STATES,
    "mutations": MUTATIONS,
}

MUTATION_KINDS = ("TRANSFER", "CONVERT", "APPEND", "SPLIT", "MERGE", "DELETE")


# String columns whose values are mostly unique (task keys, messages, state ids, paths, JSON attrs): a
# dictionary would miss on almost every value, in the client's packer and in a segment's Parquet file alike.
MOSTLY_UNIQUE = frozenset({"task_key", "message", "stimulus_id", "state_id", "mutation_id", "src_state_id",
                           "dst_state_id", "depends_on", "label", "path", "attrs"})


def dictionary_columns(s: pa.Schema) -> list[str]:
    """The string columns of ``s`` worth dictionary-encoding in a segment's Parquet file: those with few
    distinct values (states, resource ids, names). Encoding the rest costs twice the write time for a
    file two to three times larger."""
    return [f.name for f in s if pa.types.is_string(f.type) and f.name not in MOSTLY_UNIQUE]


def schema(table: str) -> pa.Schema:
    """The canonical schema of ``table``; KeyError naming the known tables otherwise."""
    try:
        return TABLES[table] if table in TABLES else DERIVED_TABLES[table]
    except KeyError:
        raise KeyError(f"unknown table {table!r}; known tables: {', '.join([*TABLES, *DERIVED_TABLES])}") from None
