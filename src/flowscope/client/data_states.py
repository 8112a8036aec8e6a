"""Data states and mutations (the Workflow Critical Path graph): schema rules and the producer API.

A data state is a vertex (a piece of data at a place and time); a mutation is an edge
between two states (TRANSFER, CONVERT, APPEND, SPLIT, MERGE, DELETE). The rules, enforced
here and by the collector's /v1/runs/{run}/states and /mutations endpoints alike: a kind
is one of MUTATION_KINDS, both ends of a mutation exist (in the run or in the same batch),
sizes are not negative, a mutation's destination is not older than its source, and an id
names one thing only (repeating a record unchanged is a no-op). :class:`StateIndex` checks
a batch as a whole, so a refused batch writes nothing.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flowscope.model.conform import SchemaError, conform, records_to_table
from flowscope.model.schemas import MUTATION_KINDS

STATES, MUTATIONS = "data_states", "mutations"
_KINDS = pa.array(MUTATION_KINDS)


class DataStateError(SchemaError):
    """A state or mutation breaks a rule of the data-state graph; names the record and the field."""

    def __init__(self, table: str, field: str, message: str, record: int | None = None):
        self.table, self.column, self.field, self.record = table, field, field, record
        self.message = message
        where = f"{table}[{record}].{field}" if record is not None else f"{table}.{field}"
        ValueError.__init__(self, f"{where}: {message}")


def _attrs(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def as_table(table: str, data: pa.Table | Mapping[str, Any] | Iterable[Mapping[str, Any]] | None) -> pa.Table:
    """``data`` (one record, records, a dict of columns or an Arrow table) as a canonical table."""
    if data is None:
        return records_to_table(table, [])
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return conform(table, data)
    if isinstance(data, Mapping):
        if data and all(isinstance(v, (list, tuple)) for v in data.values()):
            return conform(table, pa.table({k: list(v) for k, v in data.items()}))
        data = [data]
    records = []
    for rec in data:
        if isinstance(rec, Mapping) and not isinstance(rec.get("attrs"), (str, type(None))):
            rec = {**rec, "attrs": _attrs(rec["attrs"])}
        records.append(rec)
    return records_to_table(table, records)


def _first(mask: pa.ChunkedArray | pa.Array) -> int:
    return pc.index(mask.fill_null(False), True).as_py()


class StateIndex:
    """What a run's data-state graph holds already: each state's time and size, each mutation's ends.

    Not thread-safe; the collector holds one per run under a lock.
    """

    def __init__(self) -> None:
        self.states: dict[str, tuple[int, int | None]] = {}
        self.mutations: dict[str, tuple[str, str, str]] = {}

    def __len__(self) -> int:
        return len(self.states)

    def check_states(self, data: pa.Table) -> pa.Table:
        """The rows of ``data`` to write (repeats of known states dropped); DataStateError if any is bad."""
        n = data.num_rows
        if not n:
            return data
        size = data.column("size_bytes")
        neg = pc.less(size, 0)
        if pc.any(neg).as_py():
            i = _first(neg)
            raise DataStateError(STATES, "size_bytes", f"negative size {size[i].as_py()} "
                                 f"(state {data.column('state_id')[i].as_py()!r})", i)
        ids = data.column("state_id").to_pylist()
        ts = data.column("ts_ns").to_pylist()
        sizes = size.to_pylist()
        keep, seen = [], {}
        known = self.states
        for i, sid in enumerate(ids):
            if not sid:
                raise DataStateError(STATES, "state_id", "is empty", i)
            have = seen.get(sid) or known.get(sid)
            if have is not None:
                if have != (ts[i], sizes[i]):
                    raise DataStateError(STATES, "state_id", f"{sid!r} exists already with ts_ns={have[0]}, "
                                         f"size_bytes={have[1]}; this record has ts_ns={ts[i]}, "
                                         f"size_bytes={sizes[i]} (a state id names one state)", i)
                continue
            seen[sid] = (ts[i], sizes[i])
            keep.append(i)
        return data if len(keep) == n else data.take(pa.array(keep, pa.int64()))

    def check_mutations(self, data: pa.Table, new_states: pa.Table | None = None) -> pa.Table:
        """The rows of ``data`` to write, with mutation ids filled in; DataStateError if any is bad.

        Source and destination must be states of the run or of ``new_states`` (the same batch)."""
        n = data.num_rows
        if not n:
            return data
        kind = data.column("kind")
        bad = pc.invert(pc.is_in(kind, value_set=_KINDS))
        if pc.any(bad).as_py():
            i = _first(bad)
            raise DataStateError(MUTATIONS, "kind", f"{kind[i].as_py()!r} is not a mutation kind; "
                                 f"kinds are {', '.join(MUTATION_KINDS)}", i)
        extra: dict[str, int] = {}
        if new_states is not None and new_states.num_rows:
            extra = dict(zip(new_states.column("state_id").to_pylist(), new_states.column("ts_ns").to_pylist()))
        known = self.states
        src = data.column("src_state_id").to_pylist()
        dst = data.column("dst_state_id").to_pylist()
        kinds = kind.to_pylist()
        mids = data.column("mutation_id").to_pylist()
        keep, seen = [], {}
        for i in range(n):
            ends = []
            for field, sid in (("src_state_id", src[i]), ("dst_state_id", dst[i])):
                t = extra.get(sid)
                if t is None:
                    k = known.get(sid)
                    if k is None:
                        raise DataStateError(MUTATIONS, field, f"unknown state {sid!r}: post the state first "
                                             f"(or in the same request)", i)
                    t = k[0]
                ends.append(t)
            if src[i] == dst[i]:
                raise DataStateError(MUTATIONS, "dst_state_id", f"is the source itself ({src[i]!r})", i)
            if ends[1] < ends[0]:
                raise DataStateError(MUTATIONS, "dst_state_id", f"state {dst[i]!r} (ts_ns={ends[1]}) is older than "
                                     f"its source {src[i]!r} (ts_ns={ends[0]})", i)
            mid = mids[i] or f"{src[i]}->{dst[i]}:{kinds[i]}"
            mids[i] = mid
            edge = (src[i], dst[i], kinds[i])
            have = seen.get(mid) or self.mutations.get(mid)
            if have is not None:
                if have != edge:
                    raise DataStateError(MUTATIONS, "mutation_id", f"{mid!r} exists already as {have[0]!r} -> "
                                         f"{have[1]!r} ({have[2]})", i)
                continue
            seen[mid] = edge
            keep.append(i)
        data = data.set_column(0, "mutation_id", pa.array(mids, pa.string()))
        return data if len(keep) == n else data.take(pa.array(keep, pa.int64()))

    def add_states(self, data: pa.Table) -> None:
        """Record written states."""
        self.states.update(zip(data.column("state_id").to_pylist(),
                               zip(data.column("ts_ns").to_pylist(), data.column("size_bytes").to_pylist())))

    def add_mutations(self, data: pa.Table) -> None:
        """Record written mutations."""
        self.mutations.update(zip(data.column("mutation_id").to_pylist(),
                                  zip(data.column("src_state_id").to_pylist(), data.column("dst_state_id").to_pylist(),
                                      data.column("kind").to_pylist())))


def file_state_id(path: str | Path, stat: os.stat_result | None = None, host: str | None = None) -> str:
    """The id of a file's content as it is now: host, absolute path, modification time and size.

    Two processes that see the same unchanged file derive the same id, so a step that
    reads what another wrote continues its path."""
    p = Path(path).resolve()
    st = stat or p.stat()
    return f"file:{host or socket.gethostname()}:{p}@{st.st_mtime_ns}:{st.st_size}"


def disk_location(path: str | Path, host: str | None = None) -> str:
    """``host:disk:<mount point>`` for a file, so filters by location group files per file system."""
    p = Path(path).resolve()
    mount = p if p.is_dir() else p.parent
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return f"{host or socket.gethostname()}:disk:{mount}"


class DataStates:
    """Records data states and mutations of one run, checked as they are recorded.

    Each call checks its record against the states this object knows (raising DataStateError
    naming the field); states other processes recorded are checked by the collector when the
    batch is delivered. With ``batch=1`` (the default) every call is delivered at once and a
    refusal raises there; larger batches are delivered by :meth:`flush` (and on leaving a
    ``with`` block), as one all-or-nothing request.
    """

    def __init__(self, client, *, batch: int = 1, host: str | None = None):
        self.client = client
        self.batch = max(1, int(batch))
        self.host = host or socket.gethostname()
        self._index = StateIndex()
        self._states: list[dict] = []
        self._mutations: list[dict] = []
        self._lock = threading.Lock()
        self._seq = 0

    # ---- the two primitives ------------------------------------------------------------------
    def state(self, state_id: str | None = None, *, label: str | None = None, size_bytes: int | None = None,
              ts_ns: int | None = None, origin: str | None = None, location: str | None = None,
              attrs: dict | str | None = None) -> str:
        """Record a data state (default time: now; default id: generated) and return its id."""
        if size_bytes is not None and size_bytes < 0:
            raise DataStateError(STATES, "size_bytes", f"negative size {size_bytes}")
        if ts_ns is not None and not isinstance(ts_ns, int):
            raise DataStateError(STATES, "ts_ns", f"must be an integer (ns since epoch), got {ts_ns!r}")
        with self._lock:
            if state_id is None:
                self._seq += 1
                state_id = f"state:{self.host}:{os.getpid()}:{time.time_ns()}:{self._seq}"
            rec = {"state_id": state_id, "label": label, "size_bytes": size_bytes,
                   "ts_ns": time.time_ns() if ts_ns is None else ts_ns, "origin": origin,
                   "location": location, "attrs": _attrs(attrs)}
            tbl = as_table(STATES, rec)
            if self._index.check_states(tbl).num_rows:
                self._index.add_states(tbl)
                self._states.append(rec)
        self._maybe_flush()
        return state_id

    def mutation(self, src: str, dst: str, kind: str, *, application: str | None = None,
                 attrs: dict | str | None = None, mutation_id: str | None = None) -> str:
        """Record that ``src`` became ``dst`` by ``kind`` and return the mutation's id."""
        rec = {"mutation_id": mutation_id, "src_state_id": src, "dst_state_id": dst, "kind": kind,
               "application": application, "attrs": _attrs(attrs)}
        with self._lock:
            tbl = as_table(MUTATIONS, rec)
            missing = [s for s in (src, dst) if s not in self._index.states]
            if missing:  # recorded elsewhere: the collector checks these when the batch arrives
                out = tbl.set_column(0, "mutation_id", pa.array([mutation_id or f"{src}->{dst}:{kind}"]))
                if kind not in MUTATION_KINDS:
                    raise DataStateError(MUTATIONS, "kind", f"{kind!r} is not a mutation kind; kinds are "
                                         f"{', '.join(MUTATION_KINDS)}")
            else:
                out = self._index.check_mutations(tbl)
            mid = out.column("mutation_id")[0].as_py() if out.num_rows else (mutation_id or f"{src}->{dst}:{kind}")
            if out.num_rows:
                self._index.add_mutations(out)
                rec["mutation_id"] = mid
                self._mutations.append(rec)
        self._maybe_flush()
        return mid

    # ---- helpers for the common cases ---------------------------------------------------------
    def file(self, path: str | Path, *, origin: str | None = None, location: str | None = None,
             label: str | None = None, attrs: dict | None = None) -> str:
        """The state of a file as it is on disk now (size and modification time from the file system)."""
        p = Path(path)
        try:
            st = p.stat()
        except OSError as exc:
            raise DataStateError(STATES, "label", f"cannot stat {str(p)!r}: {exc.strerror or exc}") from None
        return self.state(file_state_id(p, st, self.host), label=label or p.name, size_bytes=st.st_size,
                          ts_ns=st.st_mtime_ns, origin=origin, location=location or disk_location(p, self.host),
                          attrs={"path": str(p.resolve()), **(attrs or {})})

    def file_read(self, path: str | Path, *, application: str | None = None, location: str | None = None,
                  ts_ns: int | None = None) -> str:
        """A file was read into memory: its on-disk state, a new in-memory state (now), a TRANSFER; returns
        the in-memory state."""
        src = self.file(path)
        size = self._index.states[src][1]
        dst = self.state(label=Path(path).name, size_bytes=size, ts_ns=ts_ns, origin=application,
                         location=location or f"{self.host}:memory:{os.getpid()}")
        self.mutation(src, dst, "TRANSFER", application=application)
        return dst

    def file_written(self, path: str | Path, sources: str | Sequence[str] = (), *, application: str | None = None,
                     kind: str = "TRANSFER") -> str:
        """A file was written from ``sources``: its on-disk state (size and time from the file system) and a
        mutation from each source (``kind``, or MERGE when there are several); returns the file's state."""
        srcs = [sources] if isinstance(sources, str) else list(sources)
        dst = self.file(path, origin=application)
        for s in srcs:
            self.mutation(s, dst, "MERGE" if len(srcs) > 1 and kind == "TRANSFER" else kind, application=application)
        return dst

    def split(self, src: str, parts: Sequence[Mapping[str, Any]], *, application: str | None = None) -> list[str]:
        """``src`` was split into parts (each a dict of state fields); returns the parts' ids."""
        out = []
        for part in parts:
            sid = self.state(**{"origin": application, **part})
            self.mutation(src, sid, "SPLIT", application=application)
            out.append(sid)
        return out

    def merge(self, sources: Sequence[str], *, application: str | None = None, **state: Any) -> str:
        """``sources`` were merged into a new state (fields as for :meth:`state`); returns its id."""
        dst = self.state(**{"origin": application, **state})
        for s in sources:
            self.mutation(s, dst, "MERGE", application=application)
        return dst

    # ---- delivery -----------------------------------------------------------------------------------
    def _maybe_flush(self) -> None:
        if len(self._states) + len(self._mutations) >= self.batch:
            self.flush()

    def flush(self) -> dict:
        """Deliver what is recorded as one all-or-nothing batch; raises DataStateError if it is refused."""
        with self._lock:
            states, muts = self._states, self._mutations
            self._states, self._mutations = [], []
        if not states and not muts:
            return {"states": 0, "mutations": 0}
        return self.client.post_data_states(states, muts)

    def __enter__(self) -> DataStates:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.flush()


def step_kind(n_inputs: int, n_outputs: int) -> str:
    """The mutation kind linking a step's inputs to its outputs: one to one CONVERT, one to many SPLIT,
    several inputs MERGE."""
    if n_inputs > 1:
        return "MERGE"
    return "SPLIT" if n_outputs > 1 else "CONVERT"


class Step:
    """A step in progress (see :func:`step`): its recorder and its declared files."""

    def __init__(self, name: str, ds: DataStates, inputs: Sequence[str | Path], outputs: Sequence[str | Path]):
        self.name = name
        self.ds = ds
        self.client = ds.client
        self.inputs = [Path(p) for p in inputs]
        self.outputs = [Path(p) for p in outputs]
        self.input_states: list[str] = []
        self.output_states: list[str] = []
        self.skipped: list[str] = []  # declared outputs the step did not write
        self.start_ns = self.end_ns = 0

    def begin(self) -> None:
        """Record the inputs' states as they are before the step runs (missing input: DataStateError)."""
        for p in self.inputs:
            if not p.exists():
                raise DataStateError(STATES, "label", f"declared input {str(p)!r} does not exist")
        self.input_states = [self.ds.file(p) for p in self.inputs]
        self.ds.flush()
        self.start_ns = time.time_ns()

    def end(self, attrs: dict | None = None, resource_id: str | None = None) -> None:
        """Record the step's span, its outputs' states and the mutations from inputs to outputs."""
        self.end_ns = time.time_ns()
        written = []
        for p in self.outputs:
            try:
                st = p.stat()
            except OSError:
                self.skipped.append(f"{p}: missing")
                continue
            if st.st_mtime_ns < self.start_ns - 2_000_000_000 and self.inputs:  # coarse file-system clocks
                self.skipped.append(f"{p}: not modified by the step")
                continue
            written.append(p)
        kind = step_kind(len(self.inputs), len(written))
        for p in written:
            sid = self.ds.file(p, origin=self.name)
            self.output_states.append(sid)
            ts = self.ds._index.states[sid][0]
            for src in self.input_states:
                if ts >= self.ds._index.states[src][0]:
                    self.ds.mutation(src, sid, kind, application=self.name,
                                     attrs={"step": self.name, "start_ns": self.start_ns})
                else:
                    self.skipped.append(f"{p}: older than input {src}")
        self.ds.flush()
        self.client.span(self.name, self.start_ns, self.end_ns, kind="step", resource_id=resource_id,
                         attrs={"inputs": [str(p) for p in self.inputs], "outputs": [str(p) for p in self.outputs],
                                "input_states": self.input_states, "output_states": self.output_states,
                                **(attrs or {})})


def step_client(address: str | None = None, run_id: str | None = None, store: str | Path | None = None,
                name: str | None = None, serve: bool = False):
    """A Client that joins ``run_id`` (or $FLOWSCOPE_RUN) at ``address`` (or $FLOWSCOPE_ADDRESS), or an embedded
    one writing to ``store`` when no collector address is known."""
    from flowscope.client.client import EMBEDDED, Client

    address = address or os.environ.get("FLOWSCOPE_ADDRESS") or None
    run_id = run_id or os.environ.get("FLOWSCOPE_RUN") or None
    if address is None and not os.environ.get("FLOWSCOPE_ADDRESS_FILE"):
        address = EMBEDDED
    return Client(address, store=store, run_id=run_id, name=name, serve=serve)


class step:
    """``with step("name", inputs=[...], outputs=[...]):`` records the block as a step: its span, its
    input files' states before, its output files' states after (size and time from the file system), and
    mutations from inputs to outputs. Joins $FLOWSCOPE_RUN at $FLOWSCOPE_ADDRESS when set, else ``client``,
    else an embedded collector (``store``)."""

    def __init__(self, name: str, inputs: Sequence[str | Path] = (), outputs: Sequence[str | Path] = (), *,
                 client=None, address: str | None = None, run_id: str | None = None,
                 store: str | Path | None = None):
        self._own = client is None
        self._client = client
        self._args = (name, inputs, outputs, address, run_id, store)
        self.step: Step | None = None

    def __enter__(self) -> Step:
        name, inputs, outputs, address, run_id, store = self._args
        if self._client is None:
            self._client = step_client(address, run_id, store, name=name)
        self.step = Step(name, DataStates(self._client, batch=1_000_000), inputs, outputs)
        try:
            self.step.begin()
        except BaseException:
            if self._own:
                self._client.close(status="failed")
            raise
        return self.step

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.step.end({"error": f"{exc_type.__name__}: {exc}"} if exc_type else None)
        finally:
            if self._own:
                self._client.close(status="failed" if exc_type else "finished")
