"""The semantic vocabulary: what a span means to the analyses, and which resources execute work.

Every source names things its own way (a Dask task prefix, a StarPU codelet state, an MPI function, a
Kineto kernel). The analyses do not read those names. They read three attributes of a span:

* ``category`` -- what the time was spent on: one of :data:`CATEGORIES`;
* ``role`` -- what kind of interval it is: one of :data:`ROLES` (a ``task`` is a unit of work of a task
  graph, a ``call`` a function call, a ``state`` a state a resource was in);
* ``group`` -- the name the analyses group by (Dask's task prefix, a StarPU codelet, an MPI function);

and two attributes of a resource:

* ``executes`` -- whether it runs work (a worker thread, an MPI location, a StarPU worker, a GPU stream, a
  host's slots), so that its time is capacity: busy in some category, or idle;
* ``slots`` -- how many units of work it runs at once (None when unknown);

and one attribute of a task's state (``transitions.to_state``): its ``phase``, one of :data:`PHASES` (waiting,
queued, running, done, erred), which the progress counts read (Dask's ``memory`` and Parsl's ``exec_done`` are
both ``done``).

A *mapping* gives these attributes as data::

    {"source": "starpu",
     "spans": [{"when": {"kind": "state", "name": ["Sleeping", "Idle"]}, "category": "idle", "role": "state"}],
     "resources": [{"when": {"kind": "Worker"}, "executes": true, "slots": 1}]}

``when`` maps a column to a glob (``*``, ``?``, ``[...]``, case-sensitive) or a list of globs (any matches);
JSON ``null`` matches a null. Span rules may test the ``spans`` columns, ``resource_kind`` (the kind of the
span's resource) and ``attrs.KEY`` (a key of the span's JSON attrs); resource rules the ``resources``
columns and ``attrs.KEY``; transition rules ``to_state``. ``group`` and ``slots`` are a literal or a reference
to such a field (``"name"``, ``"attrs.cpu_cores"``), or a list of references of which the first non-null is taken.

For each attribute the first rule that matches and sets it wins, looking at the mappings in this order:
the user's override, the mappings the run's sources declared (run.json ``semantics``), then
:data:`GENERIC` (defaults by ``kind``). The rules compile to SQL: a run's ``activity`` view is ``spans``
with the three span attributes, its ``executors`` view ``resources`` with the two resource attributes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: what a span's time was spent on
CATEGORIES = ("compute", "communication", "io", "wait", "idle", "runtime", "other")
#: what kind of interval a span is
ROLES = ("task", "call", "state", "other")
#: what a task's state (``transitions.to_state``) means for its progress: not ready yet, ready and waiting for a
#: place to run, running, finished (its result exists), failed, or none of these
PHASES = ("waiting", "queued", "running", "done", "erred", "other")
#: what a resource's time is at a moment when none of its spans runs
IDLE = "idle"
#: the metric every source that samples a process's resident memory writes it as (``metrics.name``, on the
#: process's resource); the analyses read per-process memory by this name only
PROCESS_MEMORY = "process.memory.rss_bytes"
#: of it, the bytes of the runtime's own data that the process holds in memory (Dask's "managed" memory: the
#: results and inputs a worker keeps), sampled with it
PROCESS_MEMORY_MANAGED = "process.memory.managed_bytes"
#: the bytes of the runtime's data the process has spilled to disk (not in its resident memory), sampled with it
PROCESS_MEMORY_SPILLED = "process.memory.spilled_bytes"

SPAN_COLUMNS = ("span_id", "parent_id", "resource_id", "kind", "name", "start_ns", "end_ns", "task_key",
                "attrs", "resource_kind")
RESOURCE_COLUMNS = ("resource_id", "kind", "name", "parent_id", "host", "pid", "tid", "thread_ident",
                    "address", "start_ns", "end_ns", "attrs")
TRANSITION_COLUMNS = ("to_state",)
_SPAN_KEYS = ("category", "role", "group")
_RESOURCE_KEYS = ("executes", "slots")
_TRANSITION_KEYS = ("phase",)

#: defaults by kind, used after every mapping a run declares: the kinds of the data model (docs/data-model.md)
GENERIC: dict = {
    "source": "generic",
    "spans": [
        # the span `flowscope run` records for the command it observes: context, not work
        {"when": {"kind": "step", "attrs.role": "command"}, "category": "other", "role": "other"},
        {"when": {"kind": ["task", "step"]}, "category": "compute", "role": "task"},
        {"when": {"kind": "call"}, "category": "compute", "role": "call"},
        {"when": {"kind": ["transfer", "dask-fetch", "mpi", "send", "recv", "communication"]},
         "category": "communication", "role": "other"},
        {"when": {"kind": ["io", "disk-read", "disk-write", "read", "write"]}, "category": "io", "role": "other"},
        {"when": {"kind": ["wait", "barrier"]}, "category": "wait", "role": "other"},
        {"when": {"kind": "idle"}, "category": "idle", "role": "state"},
        {"when": {"kind": "state"}, "category": "other", "role": "state"},
        {"when": {}, "category": "other", "role": "other", "group": "name"},
    ],
    "resources": [
        {"when": {"kind": "thread"}, "executes": True, "slots": 1},
        {"when": {"kind": ["rank", "device", "stream", "gpu"]}, "executes": True, "slots": 1},
        {"when": {"kind": ["scheduler", "client", "container", "process", "worker"]}, "executes": False},
        {"when": {}, "executes": True, "slots": ["attrs.cpu_cores", "attrs.nthreads"]},
    ],
    # common state names; Dask's among them, for runs recorded before its sources declared their own
    "transitions": [
        {"when": {"to_state": ["memory", "done", "finished", "completed", "succeeded", "success"]}, "phase": "done"},
        {"when": {"to_state": ["erred", "error", "failed", "failure"]}, "phase": "erred"},
        {"when": {"to_state": ["processing", "executing", "running"]}, "phase": "running"},
        {"when": {"to_state": ["no-worker", "queued", "ready", "scheduled"]}, "phase": "queued"},
        {"when": {"to_state": ["waiting", "pending", "released"]}, "phase": "waiting"},
    ],
}


class SemanticsError(ValueError):
    """A mapping does not fit the vocabulary; the message names where (``<where> spans[2].category: ...``)."""


def _check_ref(value: Any, columns: Sequence[str], where: str) -> None:
    refs = value if isinstance(value, list) else [value]
    for r in refs:
        if not isinstance(r, str) or not (r in columns or (r.startswith("attrs.") and len(r) > 6)):
            raise SemanticsError(f"{where}: expected a column ({', '.join(columns)}) or attrs.KEY, or a list of "
                                 f"them, got {r!r}")


def _check_when(when: Any, columns: Sequence[str], where: str) -> None:
    if not isinstance(when, Mapping):
        raise SemanticsError(f"{where}: expected an object of column -> glob, got {type(when).__name__}")
    for key, pat in when.items():
        if not isinstance(key, str) or not (key in columns or (key.startswith("attrs.") and len(key) > 6)):
            raise SemanticsError(f"{where}: {key!r} is not a column ({', '.join(columns)}) nor attrs.KEY")
        pats = pat if isinstance(pat, list) else [pat]
        if not pats or any(p is not None and not isinstance(p, (str, int)) or isinstance(p, bool) for p in pats):
            raise SemanticsError(f"{where}.{key}: expected a glob, a list of globs or null, got {pat!r}")


def check_mapping(mapping: Any, where: str = "semantics") -> dict:
    """``mapping`` as a dict when it fits the vocabulary, else :class:`SemanticsError` naming the field."""
    if not isinstance(mapping, Mapping):
        raise SemanticsError(f"{where}: expected an object with 'spans' and/or 'resources', "
                             f"got {type(mapping).__name__}")
    unknown = sorted(set(mapping) - {"source", "spans", "resources", "transitions", "description"})
    if unknown:
        raise SemanticsError(f"{where}: unknown key {unknown[0]!r} (a mapping has source, spans, resources, "
                             f"transitions)")
    for table, keys, columns in (("spans", _SPAN_KEYS, SPAN_COLUMNS), ("resources", _RESOURCE_KEYS, RESOURCE_COLUMNS),
                                 ("transitions", _TRANSITION_KEYS, TRANSITION_COLUMNS)):
        rules = mapping.get(table, [])
        if not isinstance(rules, list):
            raise SemanticsError(f"{where}.{table}: expected a list of rules, got {type(rules).__name__}")
        for i, rule in enumerate(rules):
            w = f"{where}.{table}[{i}]"
            if not isinstance(rule, Mapping):
                raise SemanticsError(f"{w}: expected an object, got {type(rule).__name__}")
            bad = sorted(set(rule) - {"when", *keys})
            if bad:
                raise SemanticsError(f"{w}: unknown key {bad[0]!r} (a {table} rule has when, {', '.join(keys)})")
            _check_when(rule.get("when", {}), columns, f"{w}.when")
            if "category" in rule and rule["category"] not in CATEGORIES:
                raise SemanticsError(f"{w}.category: {rule['category']!r} is not one of {', '.join(CATEGORIES)}")
            if "phase" in rule and rule["phase"] not in PHASES:
                raise SemanticsError(f"{w}.phase: {rule['phase']!r} is not one of {', '.join(PHASES)}")
            if "role" in rule and rule["role"] not in ROLES:
                raise SemanticsError(f"{w}.role: {rule['role']!r} is not one of {', '.join(ROLES)}")
            if "group" in rule:
                _check_ref(rule["group"], columns, f"{w}.group")
            if "executes" in rule and not isinstance(rule["executes"], bool):
                raise SemanticsError(f"{w}.executes: expected true or false, got {rule['executes']!r}")
            if "slots" in rule:
                s = rule["slots"]
                if isinstance(s, bool) or not (s is None or (isinstance(s, int) and s >= 1)):
                    _check_ref(s, columns, f"{w}.slots")
    return dict(mapping)


def load_mappings(value: Any, where: str = "semantics") -> list[dict]:
    """Mappings from a mapping, a list of them, JSON text, or the path of a JSON file holding one of those;
    :class:`SemanticsError` names the file or the field that does not fit."""
    if isinstance(value, (str, Path)):
        text = str(value)
        if not text.lstrip().startswith(("{", "[")):
            path = Path(text)
            try:
                text = path.read_text()
            except OSError as exc:
                raise SemanticsError(f"{path}: cannot read the semantic mapping ({exc.strerror or exc})") from None
            where = str(path)
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise SemanticsError(f"{where}: not JSON ({exc})") from None
    items = value if isinstance(value, list) else [value]
    return [check_mapping(m, f"{where}[{i}]" if isinstance(value, list) else where) for i, m in enumerate(items)]


def declared(meta: Mapping) -> list[dict]:
    """The mappings a run's sources declared (run.json ``semantics``)."""
    value = meta.get("semantics") or []
    return load_mappings(value, "run.json semantics") if value else []


def override_of(meta: Mapping) -> list[dict]:
    """The user's override stored with the run (run.json ``semantics_override``)."""
    value = meta.get("semantics_override") or []
    return load_mappings(value, "run.json semantics_override") if value else []


def with_declared(existing: Any, mappings: Iterable[Mapping]) -> list[dict]:
    """run.json ``semantics`` with ``mappings`` added after what it holds (a source already there is kept
    where it is, not repeated)."""
    out = list(existing) if isinstance(existing, list) else []
    seen = {json.dumps(m, sort_keys=True) for m in out}
    for m in mappings:
        key = json.dumps(m, sort_keys=True)
        if key not in seen:
            out.append(dict(m))
            seen.add(key)
    return out


# ---- compiling the rules to SQL ---------------------------------------------------------------------------

def _lit(value: Any) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _field(key: str, alias: str) -> str:
    if key.startswith("attrs."):
        path = "$." + json.dumps(key[6:]) if not key[6:].isidentifier() else "$." + key[6:]
        return (f"(CASE WHEN json_valid({alias}.attrs) THEN json_extract_string({alias}.attrs, {_lit(path)}) END)")
    if key == "resource_kind":
        return "r.kind"
    return f'{alias}."{key}"'


def _cond(when: Mapping, alias: str) -> str:
    parts = []
    for key, pat in when.items():
        expr = _field(key, alias)
        text = f"CAST({expr} AS VARCHAR)"
        alts = []
        for p in (pat if isinstance(pat, list) else [pat]):
            alts.append(f"{expr} IS NULL" if p is None else f"{text} GLOB {_lit(p)}")
        parts.append("(" + " OR ".join(alts) + ")")
    return " AND ".join(parts) if parts else "TRUE"


def _value(rule_value: Any, alias: str, kind: str) -> str:
    if kind == "group":
        refs = rule_value if isinstance(rule_value, list) else [rule_value]
        return "coalesce(" + ", ".join(f"CAST({_field(r, alias)} AS VARCHAR)" for r in refs) + ")"
    if kind == "slots":
        if rule_value is None:
            return "CAST(NULL AS BIGINT)"
        if isinstance(rule_value, int):
            return str(int(rule_value))
        refs = rule_value if isinstance(rule_value, list) else [rule_value]
        one = ("(CASE WHEN TRY_CAST({f} AS DOUBLE) >= 1 AND TRY_CAST({f} AS DOUBLE) = floor(TRY_CAST({f} AS DOUBLE)) "
               "THEN CAST(TRY_CAST({f} AS DOUBLE) AS BIGINT) END)")
        return "coalesce(" + ", ".join(one.format(f=_field(r, alias)) for r in refs) + ")"
    if kind == "executes":
        return "TRUE" if rule_value else "FALSE"
    return _lit(rule_value)


def condition_sql(when: Mapping, alias: str = "s") -> str:
    """The SQL condition of a rule's ``when`` over the relation ``alias`` (``resource_kind`` reads ``r.kind``)."""
    return _cond(when, alias)


def _case(mappings: Sequence[Mapping], table: str, key: str, alias: str, default: str) -> str:
    whens = []
    for m in mappings:
        for rule in m.get(table, []):
            if key in rule:
                whens.append(f"WHEN {_cond(rule.get('when', {}), alias)} THEN {_value(rule[key], alias, key)}")
    return f"CASE {' '.join(whens)} ELSE {default} END" if whens else default


def ordered(override: Sequence[Mapping] = (), declared_: Sequence[Mapping] = ()) -> list[Mapping]:
    """The mappings in the order their rules are tried: override, declared, generic."""
    return [*override, *declared_, GENERIC]


def state_phases(mappings: Sequence[Mapping], states: Iterable[str | None]) -> dict:
    """Each of ``states`` (``transitions.to_state`` values) -> its phase (:data:`PHASES`): the first
    ``transitions`` rule of ``mappings`` (in the order :func:`ordered` gives) whose ``to_state`` glob matches;
    ``other`` when none does. Decided by :func:`phase_sql` itself, so that it agrees with every query."""
    import duckdb
    import pyarrow as pa

    states = list(states)
    if not states:
        return {}
    con = duckdb.connect()
    try:
        con.register("t", pa.table({"i": pa.array(range(len(states)), pa.int64()),
                                    "to_state": pa.array(states, pa.string())}))
        phases = [r[0] for r in con.sql(f"SELECT {phase_sql(mappings, 't')} FROM t ORDER BY i").fetchall()]
    finally:
        con.close()
    return dict(zip(states, phases))


def phase_sql(mappings: Sequence[Mapping], alias: str = "t") -> str:
    """The SQL expression of a transition's phase (:func:`state_phases`) over the relation ``alias``."""
    return _case(mappings, "transitions", "phase", alias, "'other'")


def activity_sql(mappings: Sequence[Mapping], spans: str = "spans", resources: str = "resources",
                 run_key: str | None = None) -> str:
    """SELECT of the ``activity`` view: every span with ``resource_kind``, ``category``, ``role``, ``group``.
    ``spans`` and ``resources`` name the relations to read; ``run_key`` a column both have that also joins them
    (``run_id`` when they hold several runs, whose resource ids may repeat)."""
    cat = _case(mappings, "spans", "category", "s", "'other'")
    role = _case(mappings, "spans", "role", "s", "'other'")
    grp = _case(mappings, "spans", "group", "s", "s.name")
    key = f', "{run_key}"' if run_key else ""
    also = f' AND r."{run_key}" = s."{run_key}"' if run_key else ""
    return (f'SELECT s.*, r.kind AS resource_kind, {cat} AS category, {role} AS role, {grp} AS "group" '
            f"FROM {spans} s LEFT JOIN (SELECT resource_id, kind{key} FROM {resources}) r "
            f"ON r.resource_id = s.resource_id{also}")


def executors_sql(mappings: Sequence[Mapping], resources: str = "resources") -> str:
    """SELECT of the ``executors`` view: every resource (of the relation ``resources``) with ``executes`` and
    ``slots``."""
    ex = _case(mappings, "resources", "executes", "r", "FALSE")
    slots = _case(mappings, "resources", "slots", "r", "CAST(NULL AS BIGINT)")
    return f"SELECT r.*, {ex} AS executes, {slots} AS slots FROM {resources} r"
