"""Why a run has no critical path, in the model's words, and what would give it one: said by ``flowscope show``
(``critical_path.reason``) and by the report's critical-path section instead of nothing."""

from __future__ import annotations

#: what gives a run each of its critical paths; ends every reason
SUPPLIED_BY = ("A path needs units of work: spans on resources that execute work (threads, ranks, workers, "
               "GPU streams) or timed I/O operations on them, with their dependencies for the structural path "
               "(Dask's graph, StarPU's tasks.rec beside its Paje trace, WfCommons parents); or messages: "
               "transfers that link a send call to a receive call (MPI messages in OTF2, Chrome / Perfetto flows); "
               "or data states with their mutations (flowscope.data_states, a WfCommons instance's files).")

#: how a Darshan log gets timed operations
DXT_HINT = "for a Darshan log, run the job with DXT enabled: DXT_ENABLE_IO_TRACE=1"


def _n(run, sql: str) -> int:
    return int(run.sql(sql).iloc[0, 0])


def missing_path_reason(run) -> str:
    """Why ``run`` has no critical path (no units of work, no messages between calls, no data states), naming
    what its tables hold instead and what would supply a path. Meant for a run whose paths came out empty."""
    counts = run.counts()
    said: list[str] = []
    if counts.get("spans"):
        busy = _n(run, """SELECT count(*) FROM activity a LEFT JOIN executors e ON e.resource_id = a.resource_id
                          WHERE coalesce(e.executes, TRUE) AND a.category <> 'idle' AND a.end_ns > a.start_ns""")
        if not busy:
            where = run.sql("""SELECT coalesce(a.resource_kind, '?') AS kind, count(*) AS n,
                                      count(*) FILTER (WHERE a.end_ns > a.start_ns) AS timed
                               FROM activity a LEFT JOIN executors e ON e.resource_id = a.resource_id
                               WHERE NOT coalesce(e.executes, TRUE) OR a.category = 'idle' OR a.end_ns <= a.start_ns
                               GROUP BY 1 ORDER BY n DESC""")
            kinds = ", ".join(f"{int(r.n):,} on {r.kind} resources" for r in where.head(3).itertuples())
            said.append(f"its {counts['spans']:,} spans ({kinds}) are none of them busy time of a resource that "
                        f"executes work: they lie on resources that do not execute (e.g. the asynchronous slices of a "
                        f"Chrome trace, drawn on its process), are idle, or take no time (a mapping that makes their "
                        f"resources execute, flowscope semantics RUN --set, would make them units of work)")
    if counts.get("io"):
        timed = _n(run, """SELECT count(*) FROM io WHERE end_ns > start_ns AND NOT coalesce(
                               TRY_CAST(json_extract_string(attrs, '$.aggregate') AS BOOLEAN), false)""")
        if not timed:
            said.append(f"its {counts['io']:,} I/O records are totals (counters per file and rank) or instants, not "
                        f"operations with a start and an end, so no resource's I/O can be followed in time "
                        f"({DXT_HINT})")
        else:
            said.append(f"its {timed:,} timed I/O operations lie on no resource that executes work")
    if counts.get("transfers"):
        said.append(f"its {counts['transfers']:,} transfers (e.g. Paje links) link no send call to a receive "
                    f"call, so there are no messages to follow")
    if counts.get("data_states") and not counts.get("mutations"):
        said.append(f"its {counts['data_states']:,} data states have no mutations between them")
    if not said:
        held = [f"{counts[t]:,} {t} rows" for t in ("resources", "metrics", "logs") if counts.get(t)]
        said.append("it holds no timed work: no spans, no timed I/O operations, no transfers, no data states"
                    + (f" (only {', '.join(held)})" if held else ""))
    return "No critical path: " + "; ".join(said) + ". " + SUPPLIED_BY
