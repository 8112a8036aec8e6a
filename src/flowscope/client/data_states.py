"""Data states and mutations (the Workflow Critical Path graph): the producer API.

A data state is a vertex (a piece of data at a place and time); a mutation is an edge
between two states (TRANSFER, CONVERT, APPEND, SPLIT, MERGE, DELETE). What a record must
keep is the model's (model/data_states.py): :class:`DataStates` checks each record as it is
recorded, and the collector checks each delivered batch against the run's graph with the same
:class:`StateIndex`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowscope.model.data_states import (
    _KINDS,
    MUTATIONS,
    STATES,
    DataStateError,
    StateIndex,
    _attrs,
    _first,
    as_table,
    mutation_ids,
)
from flowscope.model.schemas import MUTATION_KINDS


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
    ``with`` block), as one all-or-nothing request. :meth:`add` takes whole tables.
    """

    def __init__(self, client, *, batch: int = 1, host: str | None = None):
        self.client = client
        self.batch = max(1, int(batch))
        self.host = host or socket.gethostname()
        self._known: dict[str, tuple[int, int | None]] = {}      # states recorded through this object
        self._known_m: dict[str, tuple[str, str, str]] = {}
        self._states: list[dict] = []
        self._mutations: list[dict] = []
        self._tables: list[tuple[pa.Table, pa.Table]] = []
        self._pending = 0
        self._lock = threading.Lock()
        self._seq = 0

    # ---- the two primitives ------------------------------------------------------------------
    def state(self, state_id: str | None = None, *, label: str | None = None, size_bytes: int | None = None,
              ts_ns: int | None = None, origin: str | None = None, location: str | None = None,
              attrs: dict | str | None = None) -> str:
        """Record a data state (default time: now; default id: generated) and return its id."""
        if size_bytes is not None and (not isinstance(size_bytes, int) or size_bytes < 0):
            raise DataStateError(STATES, "size_bytes", f"negative size {size_bytes}" if isinstance(size_bytes, int)
                                 else f"must be an integer (bytes), got {size_bytes!r}")
        if ts_ns is not None and not isinstance(ts_ns, int):
            raise DataStateError(STATES, "ts_ns", f"must be an integer (ns since epoch), got {ts_ns!r}")
        if state_id is not None and (not isinstance(state_id, str) or not state_id):
            raise DataStateError(STATES, "state_id", f"must be a non-empty string, got {state_id!r}")
        with self._lock:
            if state_id is None:
                self._seq += 1
                state_id = f"state:{self.host}:{os.getpid()}:{time.time_ns()}:{self._seq}"
            ts = time.time_ns() if ts_ns is None else ts_ns
            have = self._known.get(state_id)
            if have is not None:
                if have != (ts, size_bytes):
                    raise DataStateError(STATES, "state_id", f"{state_id!r} exists already with ts_ns={have[0]}, "
                                         f"size_bytes={have[1]}; this record has ts_ns={ts}, size_bytes={size_bytes}"
                                         f" (a state id names one state)")
                return state_id
            self._known[state_id] = (ts, size_bytes)
            self._states.append({"state_id": state_id, "label": label, "size_bytes": size_bytes, "ts_ns": ts,
                                 "origin": origin, "location": location, "attrs": _attrs(attrs)})
            self._pending += 1
        self._maybe_flush()
        return state_id

    def mutation(self, src: str, dst: str, kind: str, *, application: str | None = None,
                 attrs: dict | str | None = None, mutation_id: str | None = None) -> str:
        """Record that ``src`` became ``dst`` by ``kind`` and return the mutation's id."""
        if kind not in MUTATION_KINDS:
            raise DataStateError(MUTATIONS, "kind", f"{kind!r} is not a mutation kind; kinds are "
                                 f"{', '.join(MUTATION_KINDS)}")
        if src == dst:
            raise DataStateError(MUTATIONS, "dst_state_id", f"is the source itself ({src!r})")
        mid = mutation_id or f"{src}->{dst}:{kind}"
        with self._lock:
            a, b = self._known.get(src), self._known.get(dst)
            if a is not None and b is not None and b[0] < a[0]:
                # both recorded here; states recorded elsewhere are checked by the collector
                raise DataStateError(MUTATIONS, "dst_state_id", f"state {dst!r} (ts_ns={b[0]}) is older than "
                                     f"its source {src!r} (ts_ns={a[0]})")
            have = self._known_m.get(mid)
            if have is not None:
                if have != (src, dst, kind):
                    raise DataStateError(MUTATIONS, "mutation_id", f"{mid!r} exists already as {have[0]!r} -> "
                                         f"{have[1]!r} ({have[2]})")
                return mid
            self._known_m[mid] = (src, dst, kind)
            self._mutations.append({"mutation_id": mid, "src_state_id": src, "dst_state_id": dst, "kind": kind,
                                    "application": application, "attrs": _attrs(attrs)})
            self._pending += 1
        self._maybe_flush()
        return mid

    def add(self, states: pa.Table | Mapping[str, Any] | Iterable[Mapping[str, Any]] | None = None,
            mutations: pa.Table | Mapping[str, Any] | Iterable[Mapping[str, Any]] | None = None) -> None:
        """Record many states and mutations at once (Arrow tables, dicts of columns or records), checked as a
        whole against each other (their references to other states are checked by the collector); delivered
        with the next :meth:`flush`, or now when ``batch`` records are waiting."""
        st, mu = as_table(STATES, states), as_table(MUTATIONS, mutations)
        check = StateIndex()
        st = check.check_states(st)
        mu = mu.set_column(0, "mutation_id", mutation_ids(mu))
        local = pc.and_(pc.is_in(mu.column("src_state_id"), value_set=st.column("state_id")),
                        pc.is_in(mu.column("dst_state_id"), value_set=st.column("state_id")))
        bad = pc.invert(pc.is_in(mu.column("kind"), value_set=_KINDS))
        if pc.any(bad).as_py():
            i = _first(bad)
            raise DataStateError(MUTATIONS, "kind", f"{mu.column('kind')[i].as_py()!r} is not a mutation kind; "
                                 f"kinds are {', '.join(MUTATION_KINDS)}", i)
        try:  # mutations between states of this call: time order, self loops, ids
            check.check_mutations(mu.filter(local), st)
        except DataStateError as exc:
            exc.record = int(np.flatnonzero(local.to_numpy(zero_copy_only=False))[exc.record])
            raise DataStateError(exc.table, exc.field, exc.message, exc.record) from None
        with self._lock:
            self._tables.append((st, mu))
            self._pending += st.num_rows + mu.num_rows
        self._maybe_flush()

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
        size = self._known[src][1]
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
        if self._pending >= self.batch:
            self.flush()

    def flush(self) -> dict:
        """Deliver what is recorded as one all-or-nothing batch; raises DataStateError if it is refused."""
        with self._lock:
            states, muts, tables = self._states, self._mutations, self._tables
            self._states, self._mutations, self._tables, self._pending = [], [], [], 0
        if not states and not muts and not tables:
            return {"states": 0, "mutations": 0}
        if not tables and len(states) + len(muts) <= 64:  # small: JSON
            return self.client.post_data_states(states, muts)
        st = [as_table(STATES, states)] if states else []
        mu = [as_table(MUTATIONS, muts)] if muts else []
        st = pa.concat_tables(st + [t[0] for t in tables]) if st or tables else as_table(STATES, None)
        mu = pa.concat_tables(mu + [t[1] for t in tables]) if mu or tables else as_table(MUTATIONS, None)
        return post_tables(self.client, st, mu)

    def __enter__(self) -> DataStates:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.flush()


def arrow_body(states: pa.Table, mutations: pa.Table) -> bytes:
    """The body of one all-or-nothing POST .../states carrying both tables: two Arrow IPC streams, states
    then mutations."""
    out = pa.BufferOutputStream()
    for t in (states, mutations):
        with pa.ipc.new_stream(out, t.schema) as w:
            w.write_table(t)
    return out.getvalue().to_pybytes()


def post_tables(client, states: pa.Table, mutations: pa.Table) -> dict:
    """Deliver canonical ``states`` and ``mutations`` tables to ``client``'s run in one all-or-nothing request
    (Arrow IPC); DataStateError names a refused field."""
    client._opened.wait()  # the sender thread opens the run
    if client._embedded is not None:
        return client._embedded.post_data_states(client.run_id, states, mutations)
    transport = getattr(client._local, "ds_transport", None)
    if transport is None:  # one kept-alive connection per thread
        transport = client._local.ds_transport = client._http_transport("data states")
    status, doc = transport._request("POST", f"/v1/runs/{client.run_id}/states", arrow_body(states, mutations),
                                     {"Content-Type": "application/vnd.apache.arrow.stream"})
    if status == 422:
        raise DataStateError(doc.get("table") or STATES, doc.get("field") or "?",
                             doc.get("message") or doc.get("error", "refused"), doc.get("record"))
    return transport._check(status, doc)


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
            ts = self.ds._known[sid][0]
            for src in self.input_states:
                if ts >= self.ds._known[src][0]:
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
                name: str | None = None, serve: bool = False, *, client_class: type | None = None):
    """A Client that joins ``run_id`` (or $FLOWSCOPE_RUN) at ``address`` (or $FLOWSCOPE_ADDRESS), or an embedded
    one writing to ``store`` when no collector address is known (``client_class`` then needs to embed one, as
    ``flowscope.Client`` does: flowscope.embedded.step_client)."""
    from flowscope.client.client import EMBEDDED, Client

    address = address or os.environ.get("FLOWSCOPE_ADDRESS") or None
    run_id = run_id or os.environ.get("FLOWSCOPE_RUN") or None
    if address is None and not os.environ.get("FLOWSCOPE_ADDRESS_FILE"):
        address = EMBEDDED
    return (client_class or Client)(address, store=store, run_id=run_id, name=name, serve=serve)


class step:
    """``with step("name", inputs=[...], outputs=[...]):`` records the block as a step: its span, its
    input files' states before, its output files' states after (size and time from the file system), and
    mutations from inputs to outputs. Joins $FLOWSCOPE_RUN at $FLOWSCOPE_ADDRESS when set, else ``client``,
    else an embedded collector (``store``) when ``client_class`` embeds one (``flowscope.step`` does)."""

    #: the Client made when none is given (flowscope.embedded.step sets one that can embed a collector)
    client_class: type | None = None

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
            self._client = step_client(address, run_id, store, name=name, client_class=self.client_class)
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
