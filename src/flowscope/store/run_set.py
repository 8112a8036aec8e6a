"""Many runs read as one: the runs of one or several stores, every table with a ``run_id`` column, and a
``runs`` table of each run's provenance to group by.

The tables are DuckDB views over the runs' Parquet segments (one ``read_parquet`` per run, unioned by column
name, so runs written by different versions still line up); ``activity`` and ``executors`` apply each run's own
semantic mappings (model/semantics.py), so a Dask run and an imported StarPU trace sit side by side in the
model's vocabulary.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from flowscope.model.schemas import DERIVED_TABLES, TABLES
from flowscope.model.semantics import (
    activity_sql,
    declared,
    executors_sql,
    ordered,
    override_of,
    phase_sql,
)
from flowscope.store.catalog import list_runs, run_state
from flowscope.store.layout import segment_files
from flowscope.store.run import Run, _duck_type, _merged_resources, _reraise_damage

if TYPE_CHECKING:
    import pandas as pd

#: the columns of the ``runs`` table, in order (docs/compare.md describes each)
RUN_COLUMNS = ("run_id", "name", "status", "start_ns", "end_ns", "duration_s", "command", "store", "path",
               "host", "platform", "cpu_model", "cpu_logical", "memory_bytes", "python", "flowscope_version",
               "dask_version", "distributed_version", "numpy_version", "capture_level", "script_path",
               "script_sha256", "job_env", "dask_config", "packages", "error")


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _json_or_none(value: Any) -> str | None:
    return json.dumps(value, sort_keys=True, default=str) if value not in (None, {}, []) else None


def run_row(meta: dict, store: Path) -> dict:
    """One row of the ``runs`` table from a run's run.json (as :func:`~flowscope.store.catalog.list_runs`
    gives it, with ``path``)."""
    prov = meta.get("provenance") if isinstance(meta.get("provenance"), dict) else {}
    packages = prov.get("packages") if isinstance(prov.get("packages"), dict) else {}
    script = meta.get("script") if isinstance(meta.get("script"), dict) else {}
    start, end = meta.get("start_ns"), meta.get("end_ns")
    return {
        "run_id": meta["run_id"], "name": meta.get("name"), "status": run_state(meta) if "error" not in meta
        else meta.get("status"), "start_ns": start, "end_ns": end,
        "duration_s": (end - start) / 1e9 if isinstance(start, int) and isinstance(end, int) else None,
        "command": meta.get("command"), "store": str(store), "path": meta["path"],
        "host": prov.get("hostname"), "platform": prov.get("platform"), "cpu_model": prov.get("cpu_model"),
        "cpu_logical": prov.get("cpu_logical"), "memory_bytes": prov.get("memory_bytes"),
        "python": prov.get("python"), "flowscope_version": packages.get("flowscope"),
        "dask_version": packages.get("dask"), "distributed_version": packages.get("distributed"),
        "numpy_version": packages.get("numpy"), "capture_level": meta.get("capture_level"),
        "script_path": script.get("path") or script.get("module"), "script_sha256": script.get("sha256"),
        "job_env": _json_or_none(prov.get("environment")), "dask_config": _json_or_none(meta.get("dask_config")),
        "packages": _json_or_none(packages), "error": meta.get("error"),
    }


def _runs_table(rows: list[dict]) -> pa.Table:
    types = {"start_ns": pa.int64(), "end_ns": pa.int64(), "duration_s": pa.float64(), "cpu_logical": pa.int64(),
             "memory_bytes": pa.int64()}
    return pa.table({c: pa.array([r.get(c) for r in rows], types.get(c, pa.string())) for c in RUN_COLUMNS})


class RunSet:
    """Several runs queried together. ``runs`` is the catalogue (one row per run, :data:`RUN_COLUMNS`);
    :meth:`sql` sees a ``runs`` table and every canonical table, ``activity`` and ``executors`` with ``run_id``
    as their first column."""

    def __init__(self, metas: Sequence[dict], stores: Sequence[Path]):
        self.stores = list(stores)
        self._metas = list(metas)
        seen: dict[str, str] = {}
        for m in self._metas:
            if m["run_id"] in seen:
                raise ValueError(f"run id {m['run_id']} is in two places: {seen[m['run_id']]} and {m['path']}; "
                                 f"open the stores separately")
            seen[m["run_id"]] = m["path"]
        self._runs = _runs_table([run_row(m, Path(m["store"])) for m in self._metas])
        self._con: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RunSet({len(self)} runs from {', '.join(map(str, self.stores))})"

    def __len__(self) -> int:
        return len(self._metas)

    @property
    def run_ids(self) -> list[str]:
        """The runs' ids, oldest first."""
        return [m["run_id"] for m in self._metas]

    @property
    def runs(self) -> pd.DataFrame:
        """The catalogue: one row per run, oldest first, with its provenance (:data:`RUN_COLUMNS`)."""
        import pandas as pd

        return self._runs.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(), pa.string(): pd.StringDtype()}.get)

    def run(self, run_id: str) -> Run:
        """One run of the set."""
        for m in self._metas:
            if m["run_id"] == run_id:
                return Run(m["path"])
        raise KeyError(f"run {run_id} is not in this set of runs ({len(self)} runs)")

    def select(self, run_ids: Iterable[str] | None = None, names: Iterable[str] | None = None) -> RunSet:
        """The runs of this set whose id is in ``run_ids`` or whose name is in ``names`` (in this set's order);
        ValueError naming what matches no run."""
        ids, names = list(run_ids or []), list(names or [])
        missing = [i for i in ids if i not in self.run_ids]
        if missing:
            raise ValueError(f"no run {missing[0]} in {', '.join(map(str, self.stores))}")
        have = {m.get("name") for m in self._metas}
        missing = [n for n in names if n not in have]
        if missing:
            raise ValueError(f"no run named {missing[0]!r} in {', '.join(map(str, self.stores))}")
        keep = [m for m in self._metas if m["run_id"] in ids or m.get("name") in names]
        return RunSet(keep, self.stores)

    def _table_sql(self, name: str, target: pa.Schema) -> str:
        parts = []
        for m in self._metas:
            path = Path(m["path"])
            if not segment_files(path, name):
                continue
            source = f"read_parquet({_sql_text(str(path / name / '*.parquet'))})"
            if name == "resources":
                source = _merged_resources(source, target)
            parts.append(f"SELECT {_sql_text(m['run_id'])} AS run_id, * FROM {source}")
        if parts:
            return "\nUNION ALL BY NAME\n".join(parts)
        cols = ", ".join(f'CAST(NULL AS {_duck_type(f.type)}) AS "{f.name}"' for f in target)
        return f"SELECT CAST(NULL AS VARCHAR) AS run_id, {cols} WHERE false"

    def _mapping_groups(self) -> list[tuple[list, list[str]]]:
        """(semantic mappings, the ids of the runs read under them), one per distinct set of mappings."""
        by_mapping: dict[str, tuple[list, list[str]]] = {}
        for m in self._metas:
            try:
                mappings = ordered(override_of(m), declared(m))
            except ValueError as exc:
                raise ValueError(f"{m['path']}: {exc}") from None
            key = json.dumps(mappings, sort_keys=True, default=str)
            by_mapping.setdefault(key, (mappings, []))[1].append(m["run_id"])
        return list(by_mapping.values())

    def phase_sql(self, alias: str = "t") -> str:
        """The SQL expression of a transition's phase (``model.semantics.phase_sql``) over the relation ``alias``,
        which has ``run_id``: each run's transitions read under that run's mappings."""
        groups = self._mapping_groups()
        if len(groups) <= 1:
            return phase_sql(groups[0][0] if groups else ordered(), alias)
        cases = " ".join(f"WHEN {alias}.run_id IN ({', '.join(_sql_text(i) for i in ids)}) "
                         f"THEN {phase_sql(mappings, alias)}" for mappings, ids in groups)
        return f"(CASE {cases} ELSE 'other' END)"

    def _semantic_views(self, con: duckdb.DuckDBPyConnection) -> None:
        acts, execs = [], []
        for mappings, ids in self._mapping_groups():
            where = "run_id IN (" + ", ".join(_sql_text(i) for i in ids) + ")"
            spans = f"(SELECT * FROM spans WHERE {where})"
            resources = f"(SELECT * FROM resources WHERE {where})"
            acts.append(activity_sql(mappings, spans, resources, run_key="run_id"))
            execs.append(executors_sql(mappings, resources))
        if not acts:  # no runs: the views still exist, empty
            acts.append(activity_sql(ordered(), run_key="run_id"))
            execs.append(executors_sql(ordered()))
        con.execute("CREATE OR REPLACE VIEW activity AS " + "\nUNION ALL BY NAME\n".join(acts))
        con.execute("CREATE OR REPLACE VIEW executors AS " + "\nUNION ALL BY NAME\n".join(execs))

    def connection(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB cursor with the ``runs`` table and one view per table over every run (refreshed on every
        call: segments written since are seen)."""
        with self._lock:
            if self._con is None:
                self._con = duckdb.connect(":memory:")
            con = self._con
            con.register("_runs_arrow", self._runs)
            con.execute("CREATE OR REPLACE TABLE runs AS SELECT * FROM _runs_arrow")
            con.unregister("_runs_arrow")
            for name, target in {**TABLES, **DERIVED_TABLES}.items():
                try:
                    con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {self._table_sql(name, target)}')
                except duckdb.Error as exc:
                    for m in self._metas:
                        _reraise_damage(exc, Path(m["path"]))
                    raise
            self._semantic_views(con)
            return con.cursor()

    def sql(self, query: str, params: list | None = None) -> pd.DataFrame:
        """Run ``query`` over the runs (tables as in :meth:`flowscope.store.run.Run.sql`, plus ``run_id``, and
        the ``runs`` catalogue) and return a DataFrame."""
        try:
            return self.connection().execute(query, params or None).df()
        except duckdb.Error as exc:
            for m in self._metas:
                _reraise_damage(exc, Path(m["path"]))
            raise

    def sql_arrow(self, query: str, params: list | None = None) -> pa.Table:
        """Like :meth:`sql` but returns Arrow."""
        rel = self.connection().sql(query, params=params or None)
        if rel is None:
            return pa.table({})
        to_arrow = getattr(rel, "to_arrow_table", None) or rel.arrow
        return to_arrow()

    def table(self, name: str) -> pd.DataFrame:
        """Every row of ``name`` (a canonical table, ``activity``, ``executors`` or ``runs``) over the runs."""
        if name not in {**TABLES, **DERIVED_TABLES} and name not in ("activity", "executors", "runs"):
            raise KeyError(f"no table {name!r}; known: runs, activity, executors, {', '.join(TABLES)}")
        return self.sql(f'SELECT * FROM "{name}"')

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None


def open_store(*stores: str | os.PathLike, runs: Iterable[str] | None = None,
               names: Iterable[str] | None = None) -> RunSet:
    """Every run of the store directories ``stores`` (the default store if none), queryable together
    (:class:`RunSet`); ``runs`` / ``names`` keep only the runs with those ids / names."""
    from flowscope.store.catalog import default_store

    dirs = [Path(s) for s in stores] or [default_store()]
    metas = []
    for d in dirs:
        for m in list_runs(d):
            metas.append({**m, "store": str(d)})
    metas.sort(key=lambda m: (m.get("start_ns") or 0, m["run_id"]))
    rs = RunSet(metas, dirs)
    return rs.select(runs, names) if runs is not None or names is not None else rs
