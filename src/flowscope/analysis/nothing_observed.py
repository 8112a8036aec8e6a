"""Why a run holds no work, and what to do about it.

A run "observed nothing" when it has no spans (other than the one ``flowscope run`` records for the command
itself), no transfers, no data states and no I/O records of work (bytes moved, or a file a task opened). The reasons come from the run's own records: the
``observation`` rows of the ``logs`` table (one per observed Python process that imported Dask, forked, or
connected a distributed Client, and one per ``observe()`` block; see ``sources/process_facts.py``), the
scheduler resources, and the command span.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

OBSERVATION = "observation"  # logs.category of an observed process's facts


@dataclass(frozen=True)
class Reason:
    """One reason a run holds no work: a short code, what happened, and what to do."""

    code: str        # no-flowscope | unobserved-cluster | forked | no-dask | no-graph | nothing
    why: str
    what_to_do: str

    def text(self) -> str:
        return f"{self.why} {self.what_to_do}"


def observed_work(run) -> bool:
    """Whether ``run`` holds any work: a span other than the observed command's own, a transfer, a data state,
    or an I/O record that moved bytes or belongs to a task (a file opened by no task -- an import, a lock file
    -- is not work)."""
    counts = run.counts() if hasattr(run, "counts") else {}
    if any(counts.get(t) for t in ("transfers", "data_states")):
        return True
    if not counts or counts.get("io"):
        n = run.sql("SELECT count(*) AS n FROM io WHERE op IN ('read', 'write') OR task_key IS NOT NULL")
        if int(n["n"].iloc[0]):
            return True
    if counts and not counts.get("spans"):
        return False
    n = run.sql("""SELECT count(*) AS n FROM spans
                   WHERE NOT (kind = 'step' AND coalesce(json_extract_string(attrs, '$.role'), '') = 'command')""")
    return int(n["n"].iloc[0]) > 0


def why_nothing_observed(run) -> list[Reason]:
    """The reasons ``run`` holds no work, most specific first; empty when it holds some."""
    if observed_work(run):
        return []
    facts = [json.loads(a) for a in run.sql(
        f"SELECT attrs FROM logs WHERE category = '{OBSERVATION}' AND attrs IS NOT NULL ORDER BY ts_ns")["attrs"]]
    schedulers = set(run.sql("SELECT address FROM resources WHERE kind = 'scheduler' AND address IS NOT NULL")
                     ["address"])
    command = int(run.sql("""SELECT count(*) AS n FROM spans WHERE kind = 'step'
                             AND json_extract_string(attrs, '$.role') = 'command'""")["n"].iloc[0]) > 0
    block = any(f.get("via") == "observe()" for f in facts)
    reasons: list[Reason] = []

    blind = sorted({f.get("python") or "?" for f in facts if f.get("flowscope_importable") is False})
    if blind:
        reasons.append(Reason(
            "no-flowscope",
            f"The command ran Python that cannot import flowscope ({', '.join(blind)}), so flowscope saw nothing "
            "those processes did.",
            "Install flowscope into that environment, or run the command with the Python flowscope is "
            "installed in."))
    unobserved = sorted({c for f in facts for c in f.get("clients") or () if c not in schedulers})
    if unobserved:
        where = "before observe() was entered without it" if block else \
            "outside `flowscope run` (it was running before the command started)"
        reasons.append(Reason(
            "unobserved-cluster",
            f"The work went to the Dask cluster at {', '.join(unobserved)}, which flowscope was not attached to: "
            f"the cluster was created {where}, so its scheduler and workers have no flowscope plugins.",
            "Pass the client: `with flowscope.observe(client):`; or start that cluster's scheduler and workers "
            "with `--preload flowscope.dask` and FLOWSCOPE_ADDRESS / FLOWSCOPE_RUN set (docs/dask.md)."))
    forks = sum(int(f.get("forks") or 0) for f in facts)
    if forks:
        reasons.append(Reason(
            "forked",
            f"The program forked {forks} process{'es' if forks > 1 else ''} without exec (os.fork, or "
            "multiprocessing's 'fork' start method, the default on Linux before Python 3.14); what runs in a "
            "forked process is invisible to flowscope.",
            "Start worker processes with the 'spawn' start method (multiprocessing.get_context('spawn'), "
            "ProcessPoolExecutor(mp_context=...)), or run the work as Dask tasks."))
    graphs = sum(int(f.get("local_graphs") or 0) for f in facts)
    clusters = sorted({f["observed_cluster"] for f in facts if f.get("observed_cluster")})
    if not unobserved and not graphs and not blind:
        if clusters:
            reasons.append(Reason(
                "no-graph",
                f"Nothing ran on the Dask cluster at {', '.join(clusters)} while it was observed: no task "
                "reached its scheduler inside the observe() block.",
                "Compute through that client inside the block (`client.compute(...)`, or `x.compute()` with it "
                "as the default scheduler); work on a local scheduler (`scheduler='threads'`) is recorded by "
                "`flowscope.observe()` without a client."))
        elif block:
            reasons.append(Reason(
                "no-graph",
                "No Dask scheduler was used inside the observe() block: nothing was computed on Dask's local "
                "schedulers, and observe() without a client records only those.",
                "Compute inside the block (`x.compute()`, `dask.compute(...)`); for a distributed cluster pass "
                "its client, `flowscope.observe(client)`."))
        elif any(f.get("dask_imported") for f in facts):
            reasons.append(Reason(
                "no-graph",
                "No Dask scheduler was used: the command imported dask but computed nothing with it.",
                "Check that the command reaches its `compute()` calls (an early exit, a missing input?)."))
        elif command:
            reasons.append(Reason(
                "no-dask",
                "No Dask scheduler was used: no Python process of the command imported dask. flowscope run "
                "reaches Python processes through PYTHONPATH, which `python -I` and `python -E` ignore.",
                "To record other Python code, name its functions (`flowscope run --trace 'module:function'`, "
                "@flowscope.trace); any program can record steps and spans with flowscope.Client (docs/api.md)."))
    if not reasons:
        reasons.append(Reason(
            "nothing",
            "No tasks, spans, transfers, I/O records or data states were recorded in this run.",
            "Observe a Dask computation with `flowscope run -- COMMAND` or `with flowscope.observe():`, or record "
            "with flowscope.Client (docs/api.md)."))
    return reasons
