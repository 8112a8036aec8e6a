"""Reading one run from disk: its metadata, its tables as Arrow or pandas, and SQL over them through DuckDB."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from flowscope.model.conform import type_family
from flowscope.model.schemas import DERIVED_TABLES, TABLES, schema
from flowscope.model.semantics import activity_sql, declared, executors_sql, load_mappings, ordered, override_of
from flowscope.store.layout import RUN_JSON, read_json, segment_files

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")


_DUCK_TYPES = {"int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR"}


def _duck_type(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return _duck_type(t.value_type) + "[]"
    return _DUCK_TYPES[type_family(t)]


def _merged_resources(source: str, target: pa.Schema) -> str:
    """Resources are declared by every producer that sees them, and may be declared again when they end:
    rows with one resource_id merge into one (first non-null of each column, earliest start, latest end)."""
    cols = []
    for f in target:
        if f.name == "resource_id":
            cols.append('"resource_id"')
        elif f.name == "start_ns":
            cols.append('min("start_ns") AS "start_ns"')
        elif f.name == "end_ns":
            cols.append('max("end_ns") AS "end_ns"')
        else:
            cols.append(f'any_value("{f.name}") AS "{f.name}"')
    return f'(SELECT {", ".join(cols)} FROM {source} GROUP BY "resource_id")'


class DamagedSegment(ValueError):
    """A segment file cannot be read (damaged outside flowscope: segments are written atomically)."""

    def __init__(self, path: Path, reason: str):
        self.path = path
        super().__init__(f"{path}: damaged segment ({reason.splitlines()[0]}); move it out of the run "
                         f"directory to read the rest of the run")


def _damaged_path(message: str, run_dir: Path) -> Path | None:
    """The segment of ``run_dir`` that a reader's error message names, if any."""
    m = re.search(r"'([^']+\.parquet)'", message)
    if m and Path(m.group(1)).parent.parent == run_dir:
        return Path(m.group(1))
    return None


def _reraise_damage(exc: Exception, run_dir: Path) -> None:
    bad = _damaged_path(str(exc), run_dir)
    if bad is not None:  # DuckDB names the file it could not read
        raise DamagedSegment(bad, str(exc).removeprefix("Invalid Input Error: ")) from None


class RunNotFound(FileNotFoundError):
    """The path is not a run directory (it has no run.json)."""


class Run:
    """A run directory, live or finished. Every read sees the segments complete at that moment."""

    def __init__(self, path: str | Path, semantics: Any = None):
        self.path = Path(path)
        if not (self.path / RUN_JSON).is_file():
            raise RunNotFound(f"{self.path}: not a flowscope run (no {RUN_JSON})")
        #: the caller's override of the run's semantic mappings (model/semantics.py), tried before all others
        self.semantics: list[dict] = load_mappings(semantics) if semantics is not None else []
        self._con: duckdb.DuckDBPyConnection | None = None
        #: what the connection's views were made for: which tables had segments, and the mappings (as JSON)
        self._views_state: tuple | None = None
        self._lock = threading.Lock()
        #: name -> (the run's state it was computed for, value): see :meth:`memo`
        self._memo: dict[str, tuple[tuple, Any]] = {}
        #: (run.json's bytes, the mappings they give, those mappings as JSON): see :meth:`_mappings_now`
        self._mappings: tuple[bytes, list[dict], str] | None = None

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @property
    def meta(self) -> dict:
        """run.json as it is now."""
        return read_json(self.path / RUN_JSON)

    @property
    def run_id(self) -> str:
        return self.meta["run_id"]

    def segments(self, table: str) -> list[Path]:
        schema(table)
        return segment_files(self.path, table)

    def arrow(self, table: str, columns: list[str] | None = None) -> pa.Table:
        """All rows of ``table`` as an Arrow table with the canonical schema (empty if none yet)."""
        target = schema(table)
        files = segment_files(self.path, table)
        if table == "resources" and files:
            merged = self.sql_arrow("SELECT * FROM resources ORDER BY start_ns, resource_id").cast(target)
            return merged.select(columns) if columns else merged
        if not files:
            empty = target.empty_table()
            return empty.select(columns) if columns else empty
        parts = []
        for f in files:
            try:
                parts.append(pq.read_table(f, columns=columns, schema=target))
            except (pa.ArrowInvalid, OSError) as exc:
                raise DamagedSegment(f, str(exc)) from None
        return pa.concat_tables(parts)

    def table(self, table: str, columns: list[str] | None = None) -> pd.DataFrame:
        """All rows of ``table`` as a pandas DataFrame (integers stay exact: nullable Int64, never float)."""
        import pandas as pd

        return self.arrow(table, columns).to_pandas(
            types_mapper={pa.int64(): pd.Int64Dtype(), pa.string(): pd.StringDtype()}.get)

    def counts(self) -> dict[str, int]:
        """Rows per table (distinct resources), read from Parquet footers where possible."""
        out = {}
        for name in TABLES:
            if name == "resources" and segment_files(self.path, name):
                out[name] = int(self.sql("SELECT count(*) AS n FROM resources")["n"].iloc[0])
                continue
            total = 0
            for f in segment_files(self.path, name):
                try:
                    total += pq.ParquetFile(f).metadata.num_rows
                except (pa.ArrowInvalid, OSError) as exc:
                    raise DamagedSegment(f, str(exc)) from None
            out[name] = total
        return out

    def connection(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with one view per table, derived tables (anomalies) included. A table's view reads
        its folder's segments as they are at each query; the views are made again when a table gains its first
        segment or loses its last, or when the semantic mappings change (checked on every call)."""
        with self._lock:
            if self._con is None:
                self._con = duckdb.connect(":memory:")
            con = self._con
            tables = {**TABLES, **DERIVED_TABLES}
            present = {name: bool(segment_files(self.path, name)) for name in tables}
            mappings, mappings_json = self._mappings_now()
            state = (present, mappings_json)
            if state == self._views_state:  # the same views: each one's glob finds new segments by itself
                return con.cursor()
            self._views_state = None  # until all are made
            for name, target in tables.items():
                if present[name]:
                    glob = str(self.path / name / "*.parquet").replace("'", "''")
                    source = f"read_parquet('{glob}')"
                    if name == "resources":
                        source = _merged_resources(source, target)
                    try:
                        con.execute(f"CREATE OR REPLACE VIEW \"{name}\" AS SELECT * FROM {source}")
                    except duckdb.Error as exc:
                        _reraise_damage(exc, self.path)
                        raise
                else:
                    cols = ", ".join(f'CAST(NULL AS {_duck_type(f.type)}) AS "{f.name}"' for f in target)
                    con.execute(f"CREATE OR REPLACE VIEW \"{name}\" AS SELECT {cols} WHERE false")
            con.execute(f"CREATE OR REPLACE VIEW activity AS {activity_sql(mappings)}")
            con.execute(f"CREATE OR REPLACE VIEW executors AS {executors_sql(mappings)}")
            self._views_state = state
            return con.cursor()

    def mappings(self) -> list[dict]:
        """The semantic mappings in the order their rules are tried: the caller's override, the override
        stored with the run, the mappings its sources declared, the generic defaults."""
        return list(self._mappings_now()[0])

    def _mappings_now(self) -> tuple[list[dict], str]:
        """The mappings and their JSON (sorted keys), read from run.json and checked again only when its bytes
        changed: every query asks, and checking a source's mapping costs milliseconds."""
        data = (self.path / RUN_JSON).read_bytes()  # a few kB: far cheaper than parsing and checking it
        cached = self._mappings
        if cached is None or cached[0] != data:
            meta = json.loads(data)
            mappings = ordered([*self.semantics, *override_of(meta)], declared(meta))
            cached = self._mappings = (data, mappings, json.dumps(mappings, sort_keys=True, default=str))
        return cached[1], cached[2]

    def sql(self, query: str, params: list | None = None) -> pd.DataFrame:
        """Run ``query`` with one view per table (spans, transitions, ...) and return a DataFrame."""
        try:
            return self.connection().execute(query, params or None).df()
        except duckdb.Error as exc:
            _reraise_damage(exc, self.path)
            raise

    def sql_arrow(self, query: str, params: list | None = None) -> pa.Table:
        """Like ``sql`` but returns Arrow."""
        try:
            rel = self.connection().sql(query, params=params or None)
            if rel is None:  # a statement with no result
                return pa.table({})
            to_arrow = getattr(rel, "to_arrow_table", None) or rel.arrow
            return to_arrow()
        except duckdb.Error as exc:
            _reraise_damage(exc, self.path)
            raise

    def state(self) -> tuple:
        """What every read of the run depends on: each table's segment files, and the semantic mappings."""
        tables = {**TABLES, **DERIVED_TABLES}
        return (tuple(tuple(p.name for p in segment_files(self.path, t)) for t in tables), self._mappings_now()[1])

    def memo(self, name: str, compute: Callable[[], T]) -> T:
        """``compute()``, computed once per :meth:`state` of the run and kept on this object: several analyses
        of one run that need the same intermediate (the resources' timeline, the task graph) compute it once,
        and a segment written since, in any table, makes the next call compute it again. The value is shared:
        callers must not change it."""
        state = self.state()
        hit = self._memo.get(name)
        if hit is not None and hit[0] == state:
            return hit[1]
        value = compute()
        self._memo[name] = (state, value)
        return value

    def close(self) -> None:
        self._memo.clear()
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
                self._views_state = None


def open_run(path: str | Path, semantics: Any = None) -> Run:
    """Open the run directory at ``path`` (live or finished). ``semantics``: mappings that override the
    run's own (a mapping, a list of them, JSON text or a JSON file's path; see :mod:`flowscope.model.semantics`)."""
    return Run(path, semantics)
