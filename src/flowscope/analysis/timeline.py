"""Whether a run's task times were measured or derived, and what each executing resource is doing at every moment.

A span's times are measured unless its ``attrs`` say otherwise: ``time_source`` absent or ``"measured"``
means observed; any other value (e.g. ``"derived-asap"``: placed as soon as possible from durations and
dependencies) means a rule placed the span, so its start, its end's position and the waits between spans
are not observations. Analyses that read waits or concurrency (the measured critical path, utilisation
over the spans' extent) check this first.

The timed work of a run's executing resources, which the resource-state timeline, utilisation, the breakdown and
the critical path all read, is the same for all of them (:func:`work_unit_kind`): the spans of the ``activity``
view when the run has tasks or busy spans on resources that execute; else its timed I/O operations (a Darshan
log's DXT segments).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa

from flowscope.model.semantics import IDLE

if TYPE_CHECKING:
    from flowscope.store.run import Run

T = TypeVar("T")

TIME_SOURCE = "time_source"
MEASURED = "measured"
DERIVED = "derived"


def span_time_sources(attrs: pd.Series) -> set[str]:
    """The distinct ``time_source`` values of spans' ``attrs`` (JSON text), ``"measured"`` for spans that
    do not say."""
    text = attrs.dropna().astype(str)
    tagged = text[text.str.contains('"time_source"', regex=False)]
    out = {MEASURED} if len(tagged) < len(attrs) else set()
    for value in tagged.unique():
        try:
            v = json.loads(value).get(TIME_SOURCE, MEASURED)
        except (ValueError, AttributeError):
            v = MEASURED
        out.add(str(v))
    return out


def task_timeline(spans: pd.DataFrame | pa.Table) -> str | None:
    """``"measured"`` when every task span's times were observed, ``"derived"`` when any was placed by a
    rule, None when there are no task spans. ``spans`` are task spans, or ``activity`` rows of which those
    with the role ``task`` are taken."""
    df = spans.to_pandas() if isinstance(spans, pa.Table) else spans
    if "role" in df.columns:
        df = df[df["role"] == "task"]
    if not len(df):
        return None
    if "attrs" not in df.columns:
        return MEASURED
    return MEASURED if span_time_sources(df["attrs"]) <= {MEASURED} else DERIVED


# ---- what a run's timed work is ---------------------------------------------------------------------------

#: the kinds of units of work a run offers, in order of preference (:func:`work_unit_kind`)
TASK_UNIT = "task"
SPAN_UNIT = "span"
IO_UNIT = "io operation"

#: the spans (``activity`` rows ``a`` joined to ``executors`` ``e``) that are busy time of a resource that executes
#: work (a resource the run never declared counts as executing)
BUSY_SPAN_SQL = "coalesce(e.executes, TRUE) AND a.category <> 'idle' AND a.end_ns > a.start_ns"

#: the I/O records that time one operation on a resource that executes work: not an aggregate (a row totalling
#: many operations, whose times are a window, docs/data-model.md), with a duration; per resource, the outermost
#: ones (an operation of a lower layer within one of a layer above, e.g. the POSIX writes of an MPI-IO write,
#: is part of it), with the resource's ``slots`` and ``prev_end``, the latest end of the resource's records that
#: start before it (ties: longer first)
TIMED_IO_SQL = """
    WITH t AS (
        SELECT i.resource_id, i.op, i.path, i."offset", i.nbytes, i.start_ns, i.end_ns, i.attrs, e.slots
        FROM io i LEFT JOIN executors e ON e.resource_id = i.resource_id
        WHERE i.resource_id IS NOT NULL AND coalesce(e.executes, TRUE) AND i.end_ns > i.start_ns
          AND NOT coalesce(TRY_CAST(json_extract_string(i.attrs, '$.aggregate') AS BOOLEAN), false)),
    o AS (
        SELECT *, max(end_ns) OVER (PARTITION BY resource_id ORDER BY start_ns, end_ns DESC, op, path, "offset", attrs
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
        FROM t)
    SELECT * FROM o WHERE prev_end IS NULL OR end_ns > prev_end"""


def memoised(run: Run, name: str, compute: Callable[[], T]) -> T:
    """``compute()``, kept per state of ``run`` (``Run.memo``) when the run keeps values, else computed: the
    analyses ask the same small questions of a run many times in one report or push."""
    memo = getattr(run, "memo", None)
    return memo(name, compute) if memo else compute()


def work_unit_kind(run: Run) -> str | None:
    """What ``run``'s units of work are, the first of these it has: its tasks (:data:`TASK_UNIT`: spans of role
    ``task``), the busy spans of its executing resources (:data:`SPAN_UNIT`, :data:`BUSY_SPAN_SQL`: an MPI or a call
    trace), the timed I/O operations of its executing resources (:data:`IO_UNIT`, :data:`TIMED_IO_SQL`: a Darshan
    log with DXT); None without any."""
    return memoised(run, "work_unit_kind", lambda: _work_unit_kind(run))


def _work_unit_kind(run: Run) -> str | None:
    row = run.sql(f"""SELECT EXISTS (SELECT 1 FROM activity WHERE role = 'task') AS tasks,
                             EXISTS (SELECT 1 FROM activity a LEFT JOIN executors e ON e.resource_id = a.resource_id
                                     WHERE {BUSY_SPAN_SQL}) AS spans""").iloc[0]
    if bool(row["tasks"]):
        return TASK_UNIT
    if bool(row["spans"]):
        return SPAN_UNIT
    if bool(run.sql(f"SELECT EXISTS ({TIMED_IO_SQL}) AS x")["x"].iloc[0]):
        return IO_UNIT
    return None


def _timed_io_rows(run: Run) -> pd.DataFrame:
    """The outermost timed I/O operations of each executing resource as timeline rows (category ``io``, role
    ``call``, group: the operation). On a resource that runs one thing at a time, an operation that starts before
    the one running there ends starts where that one ends: the resource's busy time is the union of its
    operations."""
    io = run.sql(f"""SELECT resource_id, CAST(NULL AS BIGINT) AS span_id, CAST(NULL AS BIGINT) AS parent_id,
                            start_ns, end_ns, 'io' AS category, 'call' AS role, op AS "group", slots, prev_end
                     FROM ({TIMED_IO_SQL}) ORDER BY resource_id, start_ns, end_ns""")
    one = io["slots"].notna() & (io["slots"] == 1) & io["prev_end"].notna()
    io.loc[one, "start_ns"] = np.maximum(io.loc[one, "start_ns"].to_numpy(np.int64),
                                         io.loc[one, "prev_end"].to_numpy(np.int64))
    return io.drop(columns="prev_end")


def _timed_work(run: Run) -> pd.DataFrame:
    """The rows the resource-state timeline is built from: per executing resource, its spans with their category,
    role, group and the resource's slots; a run whose units of work are I/O operations, those
    (:func:`_timed_io_rows`)."""
    if work_unit_kind(run) == IO_UNIT:
        return _timed_io_rows(run)
    return run.sql(TIMED_SPANS_SQL)


#: the spans the resource-state timeline is built from (``activity`` ``a`` joined to ``executors`` ``e``): those of
#: resources that execute work, with a duration, and the resource's slots
TIMED_SPANS_SQL = """
    SELECT a.resource_id, a.span_id, a.parent_id, a.start_ns, a.end_ns, a.category, a.role, a."group", e.slots
    FROM activity a LEFT JOIN executors e ON e.resource_id = a.resource_id
    WHERE coalesce(e.executes, TRUE) AND a.end_ns > a.start_ns"""


# ---- the resource-state timeline -------------------------------------------------------------------------

STATE_COLUMNS = ["resource_id", "slot", "start_ns", "end_ns", "state", "group", "role"]
BUSY_CATEGORIES = ("compute", "communication", "io", "wait", "runtime", "other")


def _sequential_states(s: np.ndarray, e: np.ndarray, cat: np.ndarray, grp: np.ndarray, role: np.ndarray,
                       t0: int, t1: int) -> tuple[np.ndarray, ...]:
    """Columns (start, end, state, group, role) covering [t0, t1] for spans sorted by start that do not
    overlap: the spans, and idle in the gaps before, between and after them."""
    gap_s = np.concatenate([[t0], e])
    gap_e = np.concatenate([s, [t1]])
    keep = gap_e > gap_s
    n_gap = int(keep.sum())
    none = np.full(n_gap, None, dtype=object)
    starts = np.concatenate([s, gap_s[keep]])
    order = np.argsort(starts, kind="stable")
    return (starts[order], np.concatenate([e, gap_e[keep]])[order],
            np.concatenate([cat, np.full(n_gap, IDLE, dtype=object)])[order],
            np.concatenate([grp, none])[order], np.concatenate([role, none])[order])


def _lane_states(s: np.ndarray, e: np.ndarray, cat: np.ndarray, grp: np.ndarray, role: np.ndarray,
                 t0: int, t1: int) -> tuple[np.ndarray, ...]:
    """Columns (start, end, state, group, role) covering [t0, t1] for spans on one slot: at every moment the
    span that started last among those running (the innermost of nested spans) gives the state; no span:
    idle."""
    order = np.lexsort((-e, s))
    s, e, cat, grp, role = s[order], e[order], cat[order], grp[order], role[order]
    if len(s) and (s[1:] >= np.maximum.accumulate(e)[:-1]).all():  # no two spans overlap: no stack needed
        return _sequential_states(s, e, cat, grp, role, t0, t1)
    out: list[tuple] = []
    stack: list[int] = []
    cur = t0

    def emit(a: int, b: int, top: int | None) -> None:
        if b > a:
            out.append((a, b, IDLE, None, None) if top is None else (a, b, cat[top], grp[top], role[top]))

    for i in range(len(s)):
        si = int(s[i])
        while stack and e[stack[-1]] <= si:
            top = stack.pop()
            end = int(e[top])
            if end > cur:
                emit(cur, end, top)
                cur = end
        emit(cur, si, stack[-1] if stack else None)
        cur = max(cur, si)
        stack.append(i)
    while stack:
        top = stack.pop()
        end = int(e[top])
        if end > cur:
            emit(cur, end, top)
            cur = end
    emit(cur, t1, None)
    cols = list(zip(*out)) if out else [[], [], [], [], []]
    return (np.asarray(cols[0], np.int64), np.asarray(cols[1], np.int64), np.asarray(cols[2], object),
            np.asarray(cols[3], object), np.asarray(cols[4], object))


def _lanes(span_id: np.ndarray, parent: np.ndarray, s: np.ndarray, e: np.ndarray, role: np.ndarray,
           nested_by_time: bool) -> np.ndarray:
    """The slot each span of one resource runs in, so that the spans of a slot nest: a span whose parent is on
    the resource runs in its parent's slot; with ``nested_by_time`` (a resource with one slot) a span that lies
    within a span still open runs in that one's slot, unless it is a task (a task within a task's interval
    ran beside it, e.g. in a schedule derived from durations); any other span takes the lowest free slot, past the
    resource's slots when more run at once than it has (a single thread's spans that overlap without nesting,
    e.g. by a clock adjustment, keep their time instead of hiding part of it)."""
    n = len(s)
    lane = np.full(n, -1, dtype=np.int64)
    pos = {int(k): i for i, k in enumerate(span_id) if k is not None and not pd.isna(k)}
    order = np.lexsort((-e, s))
    open_: list[list[int]] = []  # per slot: the spans open there, innermost last
    for i in order:
        si, ei = s[i], e[i]
        for st in open_:
            while st and e[st[-1]] <= si:
                st.pop()
        p = parent[i]
        k = -1
        if p is not None and not pd.isna(p) and int(p) in pos and lane[pos[int(p)]] >= 0:
            k = int(lane[pos[int(p)]])
        elif nested_by_time and role[i] != "task":
            k = next((j for j, st in enumerate(open_) if st and e[st[-1]] >= ei), -1)
        if k < 0:
            k = next((j for j, st in enumerate(open_) if not st), -1)
        if k < 0:
            k = len(open_)
            open_.append([])
        lane[i] = k
        open_[k].append(i)
    return lane


def resource_states(run: Run) -> pd.DataFrame:
    """For every executing resource that has activity (the ``executors`` view; a resource the run never
    declared counts as executing, its slots unknown), which state each of its slots is in at every moment of the
    run's span (the extent of the executing resources' timed work): the category of the innermost span running
    there, or ``idle`` (gaps included). A run whose units of work are timed I/O operations (:func:`work_unit_kind`)
    has them as its activity, in state ``io``. Columns :data:`STATE_COLUMNS`; the rows of one (resource, slot) do
    not overlap and cover the span exactly."""
    return memoised(run, "resource_states", lambda: _resource_states(run)).copy()


def _resource_states(run: Run) -> pd.DataFrame:
    acts = _timed_work(run)
    if not len(acts):
        return work_states(acts)
    return work_states(acts, int(acts["start_ns"].min()), int(acts["end_ns"].max()))


def work_states(acts: pd.DataFrame, t0: int | None = None, t1: int | None = None) -> pd.DataFrame:
    """The state timeline (:data:`STATE_COLUMNS`) of the timed work ``acts`` (rows of :data:`TIMED_SPANS_SQL`, any
    number of resources): per resource and slot, the innermost span's category at every moment of [t0, t1], idle
    where none runs. Without ``t0`` and ``t1``, each slot's timeline covers its own spans, from the first start to
    the last end (the idle before and after is then left to the caller, who knows the run's extent)."""
    if not len(acts):
        return pd.DataFrame({c: pd.Series(dtype="int64" if c in ("slot", "start_ns", "end_ns") else object)
                             for c in STATE_COLUMNS})
    parts: list[tuple] = []
    for rid, g in acts.groupby("resource_id", sort=True):
        s = g["start_ns"].to_numpy(np.int64)
        e = g["end_ns"].to_numpy(np.int64)
        cat = g["category"].to_numpy(object)
        grp = g["group"].to_numpy(object)
        role = g["role"].to_numpy(object)
        slots = g["slots"].iloc[0]
        order = np.lexsort((-e, s))
        if (s[order][1:] >= np.maximum.accumulate(e[order])[:-1]).all():  # no two spans overlap: one slot
            lane = np.zeros(len(g), dtype=np.int64)
        else:
            lane = _lanes(g["span_id"].to_numpy(object), g["parent_id"].to_numpy(object), s, e, role,
                          nested_by_time=pd.notna(slots) and int(slots) == 1)
        for k in np.unique(lane):
            m = lane == k
            lo = int(s[m].min()) if t0 is None else t0
            hi = int(e[m].max()) if t1 is None else t1
            cols = _lane_states(s[m], e[m], cat[m], grp[m], role[m], lo, hi)
            parts.append((rid, int(k), cols))
    n = [len(c[0]) for _, _, c in parts]
    return pd.DataFrame({
        "resource_id": np.repeat(np.array([r for r, _, _ in parts], dtype=object), n),
        "slot": np.repeat(np.array([k for _, k, _ in parts], dtype=np.int64), n),
        **{name: np.concatenate([c[i] for _, _, c in parts]).astype(np.int64 if i < 2 else object)
           for i, name in enumerate(("start_ns", "end_ns", "state", "group", "role"))}})


#: the columns of :func:`work_state_totals`
TOTAL_COLUMNS = ["resource_id", "slot", "state", "ns", "rows", "t0", "t1"]


def work_state_totals(acts: pa.Table) -> pd.DataFrame:
    """Per resource, slot and state of :func:`work_states` ``(acts)`` (each slot over its own extent): the time
    (``ns``) and rows of that state, with the slot's extent (``t0``, ``t1``). ``acts``: rows of
    :data:`TIMED_SPANS_SQL`, as Arrow. The resources whose spans never overlap (one slot, the spans and the gaps
    between them: most resources) are summed without laying their timeline out; the others go through
    :func:`work_states`."""
    if not acts.num_rows:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("resource_id", "state") else "int64")
                             for c in TOTAL_COLUMNS})
    enc = acts["resource_id"].dictionary_encode().combine_chunks()
    names = np.asarray(enc.dictionary.to_pylist(), dtype=object)
    res = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    s = acts["start_ns"].to_numpy().astype(np.int64)
    e = acts["end_ns"].to_numpy().astype(np.int64)
    order = np.lexsort((-e, s, res))
    r, s, e = res[order], s[order], e[order]
    first = np.r_[True, r[1:] != r[:-1]]
    reach = pd.Series(e).groupby(r).cummax().to_numpy()  # the latest end so far on the resource
    overlaps = np.unique(r[1:][~first[1:] & (s[1:] < reach[:-1])])
    parts = []
    if len(overlaps):
        mask = np.isin(res, overlaps)
        sub = acts.filter(pa.array(mask)).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        st = work_states(sub)
        st["ns"] = st["end_ns"] - st["start_ns"]
        lanes = st.groupby(["resource_id", "slot"], sort=False).agg(t0=("start_ns", "min"), t1=("end_ns", "max"))
        parts.append(st.groupby(["resource_id", "slot", "state"], sort=False).agg(ns=("ns", "sum"), rows=("ns", "size"))
                     .reset_index().join(lanes, on=["resource_id", "slot"]))
    keep = ~np.isin(r, overlaps)
    if keep.any():
        cat = acts["category"].take(pa.array(order)).filter(pa.array(keep)).dictionary_encode().combine_chunks()
        states = np.asarray([*cat.dictionary.to_pylist(), IDLE], dtype=object)
        c = cat.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        rk, sk, ek, fk = r[keep], s[keep], e[keep], first[keep]
        nstate, nres = len(states), len(names)
        busy_key = rk * nstate + c
        exact = np.zeros(nres * nstate, np.int64)  # sums in int64: float weights would round
        np.add.at(exact, busy_key, ek - sk)
        rows = np.bincount(busy_key, minlength=nres * nstate)
        gap = np.where(fk, 0, sk - np.r_[0, ek[:-1]])
        g = gap > 0
        idle_key = rk[g] * nstate + (nstate - 1)
        np.add.at(exact, idle_key, gap[g])
        rows += np.bincount(idle_key, minlength=nres * nstate)
        t0 = np.full(nres, np.iinfo(np.int64).max)
        t1 = np.full(nres, np.iinfo(np.int64).min)
        np.minimum.at(t0, rk, sk)
        np.maximum.at(t1, rk, ek)
        hit = np.flatnonzero(rows)
        who = hit // nstate
        parts.append(pd.DataFrame({"resource_id": names[who], "slot": np.zeros(len(hit), np.int64),
                                   "state": states[hit % nstate], "ns": exact[hit], "rows": rows[hit],
                                   "t0": t0[who], "t1": t1[who]}))
    return pd.concat(parts, ignore_index=True)[TOTAL_COLUMNS]


def _slot_table(run: Run) -> pd.DataFrame:
    """The slots of each resource in the timeline (:func:`_timed_work`)."""
    if work_unit_kind(run) == IO_UNIT:
        return run.sql(f"SELECT DISTINCT resource_id, slots FROM ({TIMED_IO_SQL})")
    return run.sql("""SELECT DISTINCT a.resource_id, e.slots FROM activity a LEFT JOIN executors e
                      ON a.resource_id = e.resource_id WHERE coalesce(e.executes, TRUE) AND a.end_ns > a.start_ns""")


#: utilisation a little above 1 is read as 1: task spans of one thread may overlap by microseconds (where
#: each span's end is taken); beyond this it means the capacity recorded does not cover what ran
UTILISATION_SLACK = 0.01


def capacity_window(run: Run, states: pd.DataFrame) -> tuple[int | None, str]:
    """The time over which the executing resources' capacity is counted, and what it is: the extent of their timed
    work (``states``: "task spans", or "I/O operations" in a run whose only timed work is I/O operations) when the
    task times were measured; the run's recorded duration ("run", None when it records none) when they were
    derived: their extent is then a schedule's, not the run's."""
    def source() -> str:
        if task_timeline(run.sql("SELECT role, attrs FROM activity WHERE role = 'task'")) == DERIVED:
            return "run"
        return "I/O operations" if work_unit_kind(run) == IO_UNIT else "task spans"

    what = memoised(run, "capacity_source", source)  # the run's utilisation asks per resource and for its own
    if what == "run":
        start, end = run.meta.get("start_ns"), run.meta.get("end_ns")
        return (end - start if start is not None and end is not None else None), what
    return (int(states["end_ns"].max()) - int(states["start_ns"].min()) if len(states) else 0), what


def utilisation_by_resource(run: Run, states: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per executing resource: its slots, the time its capacity is counted over (``window_ns``,
    :func:`capacity_window`), the slot-time spent in each category (``compute_ns``, ..., ``idle_ns``: unused slots
    and gaps included), ``busy_ns`` (not idle), ``utilisation`` = busy / (slots x window) in [0, 1], and
    ``over_capacity``: busy time beyond what the slots hold over the window (more than
    :data:`UTILISATION_SLACK` over), where ``utilisation`` is None as it is when the slots are unknown."""
    st = resource_states(run) if states is None else states
    cols = ["resource_id", "slots", "window_ns", *(f"{c}_ns" for c in BUSY_CATEGORIES), "idle_ns", "busy_ns",
            "utilisation", "over_capacity"]
    if not len(st):
        return pd.DataFrame(columns=cols)
    window, _ = capacity_window(run, st)
    if window is None:  # derived task times and no recorded duration: the schedule's extent, as the states have it
        window = int(st["end_ns"].max() - st["start_ns"].min())
    d = st.assign(d=st["end_ns"] - st["start_ns"])
    by = d.pivot_table(index="resource_id", columns="state", values="d", aggfunc="sum", fill_value=0)
    return utilisation_table(by, _slot_table(run).set_index("resource_id")["slots"], window)


def utilisation_table(by: pd.DataFrame, slots: pd.Series, window: int) -> pd.DataFrame:
    """:func:`utilisation_by_resource` from its parts: ``by``, slot-time (ns) per resource (index) and state
    (columns: categories and ``idle``); ``slots`` per resource id; the ``window`` the capacity is counted over."""
    cols = ["resource_id", "slots", "window_ns", *(f"{c}_ns" for c in BUSY_CATEGORIES), "idle_ns", "busy_ns",
            "utilisation", "over_capacity"]
    if not len(by):
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame(index=by.index)
    out["slots"] = pd.Series([int(slots[r]) if r in slots.index and pd.notna(slots[r]) else None for r in by.index],
                             index=by.index, dtype=object)
    out["window_ns"] = window
    for c in BUSY_CATEGORIES:
        out[f"{c}_ns"] = by[c].astype("int64") if c in by.columns else 0
    out["busy_ns"] = out[[f"{c}_ns" for c in BUSY_CATEGORIES]].sum(axis=1).astype("int64")
    lanes_idle = by[IDLE].astype("int64") if IDLE in by.columns else 0
    # no idle time left where more ran at once than the slots hold (a derived schedule, a capacity not recorded)
    out["idle_ns"] = [max(int(s * window - b), 0) if s is not None else int(i)
                      for s, b, i in zip(out["slots"], out["busy_ns"], np.broadcast_to(lanes_idle, len(out)))]
    fits = [s is None or not window > 0 or b <= s * window * (1 + UTILISATION_SLACK)
            for s, b in zip(out["slots"], out["busy_ns"])]
    out["over_capacity"] = [not f for f in fits]
    out["utilisation"] = [min(1.0, b / (s * window)) if s and window > 0 and f else None
                          for s, b, f in zip(out["slots"], out["busy_ns"], fits)]
    out.index.name = "resource_id"
    return out.reset_index()[cols]


def _integral(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """At each time ``t``: the total length of the intervals [start, end) that lies before it."""
    s = np.sort(starts)
    e = np.sort(ends)
    cs = np.concatenate([[0], np.cumsum(s, dtype=np.float64)])
    ce = np.concatenate([[0], np.cumsum(e, dtype=np.float64)])
    ns = np.searchsorted(s, t, side="left")
    ne = np.searchsorted(e, t, side="left")
    return (ns * t.astype(np.float64) - cs[ns]) - (ne * t.astype(np.float64) - ce[ne])


def utilisation_over_time(run: Run, bins: int = 100, states: pd.DataFrame | None = None) -> pd.DataFrame:
    """The run's span cut in ``bins`` equal intervals; per interval its ``start_ns``/``end_ns``, the slots
    busy on average in each category (``compute``, ...) and ``utilisation`` = busy slots / all slots (None
    when a resource's slots are unknown)."""
    st = resource_states(run) if states is None else states
    if not len(st) or bins < 1:
        return pd.DataFrame(columns=["start_ns", "end_ns", *BUSY_CATEGORIES, "busy", "utilisation"])
    t0, t1 = int(st["start_ns"].min()), int(st["end_ns"].max())
    edges = np.linspace(0, t1 - t0, bins + 1)  # relative to t0: ns since the epoch lose precision as floats
    width = np.diff(edges)
    out = pd.DataFrame({"start_ns": t0 + edges[:-1].astype(np.int64), "end_ns": t0 + edges[1:].astype(np.int64)})
    busy = np.zeros(bins)
    for c in BUSY_CATEGORIES:
        m = st["state"] == c
        if m.any():
            f = _integral((st.loc[m, "start_ns"] - t0).to_numpy(np.float64), (st.loc[m, "end_ns"] - t0).to_numpy(np.float64),
                          edges)
            v = np.diff(f) / np.where(width > 0, width, 1)
        else:
            v = np.zeros(bins)
        out[c] = v
        busy += v
    out["busy"] = busy
    slots = _slot_table(run)["slots"]
    total = None if slots.isna().any() else int(slots.sum())
    out["utilisation"] = busy / total if total else None
    return out
