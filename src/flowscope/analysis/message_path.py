"""The critical path through messages, and the wait states messages cause (Scalasca's late sender and late
receiver).

Input: the run's ``spans`` and ``transfers``. A transfer names the call it was sent in and the call it was
received in by their ``task_key`` (attrs ``src_call`` / ``dst_call``), and says whether the sending call
blocks until the receiver takes the message into account (``src_blocking``); the OTF2 importer writes these
for MPI messages, any source can. Each call is a span on some resource (a rank's thread, a process).

Wait states, as Scalasca defines them for point-to-point messages:

* **late sender**: the receiving call was entered before the sending call; it waits from its own enter to
  the send's enter (at most until it returns). ``wait = min(send enter, receive exit) - receive enter``.
* **late receiver**: a blocking send whose receive was entered later, while the send was still running
  (a send that returned earlier, e.g. buffered, did not wait); it waits from its enter to the receive's
  enter. ``wait = receive enter - send enter``.

The critical path walks back from the resource that finished last: on a resource, back from the current
time to the latest wait it suffered that ended before that time; the time after the waiting call is the
resource's own work (``compute``), the rest of the waiting call after the wait ended is the message
(``transfer``); then the path continues on the resource it waited for, from the moment the wait ended (the
send's enter for a late sender, the receive's enter for a late receiver). With no earlier wait, the
resource's own work back to its first span closes the path. Wait time is never on the path: it is what the
path explains.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from flowscope.analysis.critical_path.steps import CriticalPath, _step, _steps_frame
from flowscope.analysis.critical_path.tables import _frame

__all__ = ["LATE_RECEIVER", "LATE_SENDER", "MessagePath", "message_calls", "message_path", "wait_states"]

LATE_SENDER = "late-sender"
LATE_RECEIVER = "late-receiver"
WAIT_COLUMNS = ["kind", "resource_id", "call", "call_name", "peer_resource_id", "peer_call", "start_ns", "end_ns",
                "wait_ns", "call_end_ns", "nbytes"]


def _attr(text, key):
    if not isinstance(text, str) or key not in text:
        return None
    try:
        return json.loads(text).get(key)
    except (ValueError, AttributeError):
        return None


def message_calls(spans: pd.DataFrame | pa.Table, transfers: pd.DataFrame | pa.Table) -> pd.DataFrame:
    """One row per transfer whose two calls are known spans: src/dst resource (the calls' resources), the
    calls' keys and names, send enter/exit, receive enter/exit, ``src_blocking``, ``nbytes``, and the
    transfer's own start/end (when the message left and arrived)."""
    cols = ["src_resource_id", "dst_resource_id", "src_call", "dst_call", "src_name", "dst_name", "send_enter",
            "send_exit", "recv_enter", "recv_exit", "src_blocking", "nbytes", "start_ns", "end_ns"]
    tr = _frame(transfers, "transfers", ["start_ns", "end_ns"])
    if not len(tr) or "attrs" not in tr.columns:
        return pd.DataFrame(columns=cols)
    sp = _frame(spans, "spans", ["resource_id", "name", "start_ns", "end_ns", "task_key"])
    sp = sp[sp["task_key"].notna()].drop_duplicates("task_key", keep="last").set_index("task_key")
    attrs = tr["attrs"]
    m = pd.DataFrame({"src_call": attrs.map(lambda a: _attr(a, "src_call")),
                      "dst_call": attrs.map(lambda a: _attr(a, "dst_call")),
                      "src_blocking": attrs.map(lambda a: bool(_attr(a, "src_blocking"))),
                      "nbytes": tr["nbytes"] if "nbytes" in tr.columns else None,
                      "start_ns": tr["start_ns"].astype("int64"), "end_ns": tr["end_ns"].astype("int64")})
    m = m[m["src_call"].isin(sp.index) & m["dst_call"].isin(sp.index)]
    if not len(m):
        return pd.DataFrame(columns=cols)
    s, r = sp.loc[m["src_call"]], sp.loc[m["dst_call"]]
    out = pd.DataFrame({
        "src_resource_id": s["resource_id"].to_numpy(), "dst_resource_id": r["resource_id"].to_numpy(),
        "src_call": m["src_call"].to_numpy(), "dst_call": m["dst_call"].to_numpy(),
        "src_name": s["name"].to_numpy(), "dst_name": r["name"].to_numpy(),
        "send_enter": s["start_ns"].to_numpy(np.int64), "send_exit": s["end_ns"].to_numpy(np.int64),
        "recv_enter": r["start_ns"].to_numpy(np.int64), "recv_exit": r["end_ns"].to_numpy(np.int64),
        "src_blocking": m["src_blocking"].to_numpy(bool), "nbytes": m["nbytes"].to_numpy(),
        "start_ns": m["start_ns"].to_numpy(np.int64), "end_ns": m["end_ns"].to_numpy(np.int64)})
    return out.reset_index(drop=True)


def wait_states(calls: pd.DataFrame) -> pd.DataFrame:
    """The late-sender and late-receiver waits of :func:`message_calls`' messages: kind, the waiting
    resource and call (key, name), the peer resource and call, the wait's start/end, ``wait_ns``, the waiting
    call's end and the message's bytes; in time order."""
    if not len(calls):
        return pd.DataFrame(columns=WAIT_COLUMNS)
    c = calls
    ls_end = np.minimum(c["send_enter"], c["recv_exit"])
    ls = c[ls_end > c["recv_enter"]]
    late_s = pd.DataFrame({"kind": LATE_SENDER, "resource_id": ls["dst_resource_id"], "call": ls["dst_call"],
                           "call_name": ls["dst_name"], "peer_resource_id": ls["src_resource_id"],
                           "peer_call": ls["src_call"], "start_ns": ls["recv_enter"],
                           "end_ns": ls_end[ls.index], "call_end_ns": ls["recv_exit"], "nbytes": ls["nbytes"]})
    lr = c[c["src_blocking"] & (c["recv_enter"] > c["send_enter"]) & (c["send_exit"] > c["recv_enter"])]
    late_r = pd.DataFrame({"kind": LATE_RECEIVER, "resource_id": lr["src_resource_id"], "call": lr["src_call"],
                           "call_name": lr["src_name"], "peer_resource_id": lr["dst_resource_id"],
                           "peer_call": lr["dst_call"], "start_ns": lr["send_enter"], "end_ns": lr["recv_enter"],
                           "call_end_ns": lr["send_exit"], "nbytes": lr["nbytes"]})
    w = pd.concat([x for x in (late_s, late_r) if len(x)], ignore_index=True) if len(ls) or len(lr) else \
        pd.DataFrame(columns=WAIT_COLUMNS)
    if not len(w):
        return pd.DataFrame(columns=WAIT_COLUMNS)
    w["wait_ns"] = (w["end_ns"] - w["start_ns"]).astype("int64")
    for col in ("start_ns", "end_ns", "call_end_ns"):
        w[col] = w[col].astype("int64")
    return w[WAIT_COLUMNS].sort_values(["start_ns", "resource_id"], kind="stable").reset_index(drop=True)


@dataclass
class MessagePath:
    """The critical path through messages (``path``: steps ``RUN``, a resource's own time, one per innermost
    call running, component compute, label and application the call's name; and ``MESSAGE``, component
    transfer; ``ids`` the resources it passes, in order) and every wait state."""

    path: CriticalPath
    waits: pd.DataFrame
    messages: int

    def wait_totals(self) -> dict[str, int]:
        """Nanoseconds of waiting per kind (late-sender, late-receiver), zeros included."""
        by = self.waits.groupby("kind")["wait_ns"].sum() if len(self.waits) else {}
        return {k: int(by.get(k, 0)) for k in (LATE_SENDER, LATE_RECEIVER)}

    def waits_by_resource(self) -> pd.DataFrame:
        """Per waiting resource and kind: count and total wait, largest first."""
        if not len(self.waits):
            return pd.DataFrame(columns=["resource_id", "kind", "count", "wait_ns"])
        g = self.waits.groupby(["resource_id", "kind"])["wait_ns"].agg(["count", "sum"]).reset_index()
        g = g.rename(columns={"sum": "wait_ns"})
        g["wait_ns"] = g["wait_ns"].astype("int64")
        return g.sort_values("wait_ns", ascending=False, kind="stable").reset_index(drop=True)

    def to_dict(self) -> dict:
        """JSON-ready summary: length, resources passed, wait totals and counts."""
        return {"length_ns": int(self.path.length_ns), "resources": list(self.path.ids), "messages": self.messages,
                "wait_ns": self.wait_totals(), "wait_states": len(self.waits), "steps": len(self.path.steps)}


def _extents(spans: pd.DataFrame, resources: set) -> dict:
    s = spans[spans["resource_id"].isin(resources)]
    g = s.groupby("resource_id").agg(t0=("start_ns", "min"), t1=("end_ns", "max"))
    return {r: (int(a), int(b)) for r, a, b in zip(g.index, g["t0"], g["t1"])}


class _Innermost:
    """Per resource, which span is innermost at each moment: contiguous (start, end, name) pieces built by
    one sweep over its nested spans (outer spans first at equal starts)."""

    def __init__(self, spans: pd.DataFrame):
        self._spans = spans
        self._pieces: dict[str, tuple[np.ndarray, np.ndarray, list]] = {}

    def _build(self, resource: str) -> tuple[np.ndarray, np.ndarray, list]:
        s = self._spans[self._spans["resource_id"] == resource]
        order = np.lexsort((-s["end_ns"].to_numpy(np.int64), s["start_ns"].to_numpy(np.int64)))
        starts = s["start_ns"].to_numpy(np.int64)[order]
        ends = s["end_ns"].to_numpy(np.int64)[order]
        names = s["name"].to_numpy(object)[order]
        out: list[tuple[int, int, str]] = []
        stack: list[tuple[int, str]] = []
        cur = None
        for st, en, nm in zip(starts.tolist(), ends.tolist(), names.tolist()):
            while stack and stack[-1][0] <= st:
                e, n = stack.pop()
                if cur < e:
                    out.append((cur, e, n))
                    cur = e
            if stack and cur < st:
                out.append((cur, st, stack[-1][1]))
            cur = st if cur is None else max(cur, st)
            stack.append((max(en, st), nm))
        while stack:
            e, n = stack.pop()
            if cur < e:
                out.append((cur, e, n))
                cur = e
        return (np.array([a for a, _, _ in out], dtype=np.int64), np.array([b for _, b, _ in out], dtype=np.int64),
                [n for _, _, n in out])

    def steps(self, resource: str, a: int, b: int) -> list[dict]:
        """``RUN`` steps covering [a, b] on ``resource``, one per innermost span (label and application: its
        name), plus unlabelled ones where no span runs."""
        if resource not in self._pieces:
            self._pieces[resource] = self._build(resource)
        st, en, names = self._pieces[resource]
        i = int(np.searchsorted(en, a, side="right"))
        rows: list[dict] = []
        t = a
        while t < b:
            if i < len(st) and st[i] <= t:
                e = min(int(en[i]), b)
                rows.append(_step(resource, names[i], "RUN", t, e, "compute", resource, names[i]))
                t = e
                i += 1
            else:
                e = min(int(st[i]), b) if i < len(st) else b
                rows.append(_step(resource, None, "RUN", t, e, "compute", resource, None))
                t = e
        return rows


def message_path(spans: pd.DataFrame | pa.Table, transfers: pd.DataFrame | pa.Table) -> MessagePath | None:
    """The critical path through the run's messages and its wait states (module docstring); None when no
    transfer links two known calls."""
    spans = _frame(spans, "spans", ["resource_id", "name", "start_ns", "end_ns", "task_key"])
    calls = message_calls(spans, transfers)
    if not len(calls):
        return None
    waits = wait_states(calls)
    resources = set(calls["src_resource_id"]) | set(calls["dst_resource_id"])
    ext = _extents(spans, resources)
    by_res = {r: g.sort_values("end_ns", kind="stable") for r, g in waits.groupby("resource_id")} if len(waits) \
        else {}
    inner = _Innermost(spans[spans["resource_id"].isin(resources)])
    x = max(ext, key=lambda r: (ext[r][1], r))
    cursor = ext[x][1]
    end = cursor
    rows: list[dict] = []
    visited = [x]
    while True:
        w = by_res.get(x)
        cand = w[w["end_ns"] < cursor] if w is not None else None
        if cand is None or not len(cand):
            start = min(ext[x][0], cursor)
            if cursor > start:
                rows.extend(reversed(inner.steps(x, start, cursor)))
            cursor = start
            break
        c = cand.iloc[-1]
        done = min(int(c["call_end_ns"]), cursor)
        if cursor > done:
            rows.extend(reversed(inner.steps(x, done, cursor)))
        resume = int(c["end_ns"])
        rows.append(_step(str(c["call"]), f"{c['peer_resource_id']} -> {x}" if c["kind"] == LATE_SENDER
                          else f"{x} -> {c['peer_resource_id']}", "MESSAGE", resume, done, "transfer", x,
                          str(c["call_name"])))
        x, cursor = str(c["peer_resource_id"]), resume
        visited.append(x)
    rows.reverse()
    visited.reverse()
    return MessagePath(CriticalPath(_steps_frame(rows), end - cursor, visited), waits, len(calls))
