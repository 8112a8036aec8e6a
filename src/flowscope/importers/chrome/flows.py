"""Flow events as transfers: ``s``/``t``/``f`` flows and flow v2's ``bind_id``/``flow_in``/``flow_out`` matched,
each end bound to its slice as the trace-event format says, written as transfers and as dependencies of the
end's slice on the start's."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from flowscope.importers.chrome.columns import _args_json, _marked_attrs, _us_to_ns

#: ``dependencies.graph_id`` of the edges from a flow's start slice to its end slice
FLOW_GRAPH = "flows"


class _Flows:
    """The flow half of :class:`~flowscope.importers.chrome.reader._Reader` (its state is the reader's)."""

    def _bind_flows(self, flows: dict[str, list], thread: np.ndarray, start: np.ndarray, end: np.ndarray,
                    parent: np.ndarray, is_async: np.ndarray) -> set[int]:
        """The slice each flow's start and end binds to, as the trace-event format says: a start to the
        innermost slice enclosing it on its thread; an end to the next slice that begins on its thread at or
        after it, or with ``"bp": "e"`` (and in flow v2) to the slice enclosing it. Sets ``src_slice`` /
        ``dst_slice`` (-1: none) in ``flows``; returns the slices bound."""
        sl = np.flatnonzero(~is_async)
        order = sl[np.lexsort((-end[sl], start[sl], thread[sl]))]
        th_s, st_s = thread[order], start[order]

        def enclosing(th: int, t: int) -> int:
            k = int(np.searchsorted(th_s, th, side="right"))
            lo = int(np.searchsorted(th_s, th, side="left"))
            k = lo + int(np.searchsorted(st_s[lo:k], t, side="right")) - 1
            if k < lo:
                return -1
            i = int(order[k])
            while i >= 0 and end[i] < t:
                i = int(parent[i])
            return i

        def following(th: int, t: int) -> int:
            lo = int(np.searchsorted(th_s, th, side="left"))
            hi = int(np.searchsorted(th_s, th, side="right"))
            k = lo + int(np.searchsorted(st_s[lo:hi], t, side="left"))
            return int(order[k]) if k < hi else -1

        t0 = _us_to_ns(flows["t0"]) if flows["t0"] else np.zeros(0, dtype=np.int64)
        t1 = _us_to_ns(flows["t1"]) if flows["t1"] else np.zeros(0, dtype=np.int64)
        flows["src_slice"] = [enclosing(a, int(t)) for a, t in zip(flows["src"], t0)]
        flows["dst_slice"] = [following(b, int(t)) if nxt else enclosing(b, int(t))
                              for b, t, nxt in zip(flows["dst"], t1, flows["bind_next"])]
        return {i for i in flows["src_slice"] + flows["dst_slice"] if i >= 0}

    # ---- flows -----------------------------------------------------------------------------
    def _flows(self) -> dict[str, list]:
        """Flow starts matched with their steps and ends (and flow v2's bound slices), as transfer rows by
        thread code and µs; ``bind_next`` says which ends bind to the next slice rather than the enclosing."""
        rows: dict[str, list] = {k: [] for k in ("src", "dst", "t0", "t1", "kind", "attrs", "nbytes", "keys",
                                                 "bind_next")}
        unmatched = 0
        open_f: dict[tuple, list] = {}
        bps: dict[tuple, Any] = {}

        def step_or_finish(key, ph, ts, th) -> bool:
            b = open_f.get(key)
            if b is None:
                return False
            if ph == "t":
                b[5].append({"ts_us": ts, "resource_id": self.resource_id(self.threads.values[th])})
            else:
                del open_f[key]
                self._transfer_row(rows, b[1], th, b[0], ts, b[2], b[3], b[4], b[5], key[1])
                rows["bind_next"].append(bps.get((key, ts)) != "e")
            return True

        flows = sorted(self.flows, key=lambda r: (r[2], r[7]))
        i = 0
        while i < len(flows):
            j = i + 1
            while j < len(flows) and flows[j][2] == flows[i][2]:
                j += 1
            # events of one timestamp, in whatever order the file has them: steps and finishes of flows
            # begun earlier first, then the starts, then steps and finishes of the flows that start here
            later = []
            for key, ph, ts, th, _name, _cat, _args, _order, _bp in flows[i:j]:
                if ph == "f":
                    bps[(key, ts)] = _bp
                if ph != "s" and not (key in open_f and open_f[key][0] < ts and step_or_finish(key, ph, ts, th)):
                    later.append((key, ph, ts, th))
            for key, ph, ts, th, name, cat, args, _order, _bp in flows[i:j]:
                if ph == "s":
                    open_f[key] = [ts, th, name, cat, args, []]
            for key, ph, ts, th in later:
                if not step_or_finish(key, ph, ts, th):
                    unmatched += 1
            i = j
        unmatched += len(open_f)
        # flow v2: slices bound by id, flow_out on the source, flow_in on the destination
        if self.sl_bind:
            outs: dict[tuple, tuple] = {}
            for th, name, key, fin, fout, ts in sorted(self.sl_bind, key=lambda r: r[5]):
                if fin and key in outs:
                    name0, th0, t0 = outs.pop(key)
                    self._transfer_row(rows, th0, th, t0, ts, self.names.values[name0], key[0], None, [], key[1])
                    rows["bind_next"].append(False)
                if fout:
                    outs[key] = (name, th, ts)
            unmatched += len(outs)
        if unmatched:
            self.sink.warn(f"{unmatched} flow events have no matching start or finish: ignored")
        return rows

    def _transfers(self, rows: dict[str, list]) -> None:
        """The matched flows as transfers (with the task keys of the slices they bind, ``src_call`` /
        ``dst_call`` in attrs) and as dependencies of the end's slice on the start's."""
        calls = rows.get("src_call") or [None] * len(rows["src"])
        dcalls = rows.get("dst_call") or [None] * len(rows["src"])
        if any(c is not None for c in calls + dcalls):
            attrs = []
            for a, sc, dc in zip(rows["attrs"], calls, dcalls):
                d = json.loads(a) if a else {}
                if sc is not None:
                    d["src_call"] = sc
                if dc is not None:
                    d["dst_call"] = dc
                attrs.append(_args_json(d))
            rows["attrs"] = attrs
            linked = [(dc, sc) for sc, dc in zip(calls, dcalls) if sc is not None and dc is not None and sc != dc]
            if linked:
                self.sink.add("dependencies", {"graph_id": [FLOW_GRAPH] * len(linked),
                                               "task_key": [d for d, _ in linked],
                                               "depends_on": [s_ for _, s_ in linked]})
        if rows["src"]:
            self.sink.add("transfers", {
                "kind": rows["kind"], "src_resource_id": self._rids(np.asarray(rows["src"])),
                "dst_resource_id": self._rids(np.asarray(rows["dst"])), "nbytes": rows["nbytes"],
                "start_ns": _us_to_ns(rows["t0"]) + self.origin_ns, "end_ns": _us_to_ns(rows["t1"]) + self.origin_ns,
                "keys": rows["keys"], "attrs": rows["attrs"]})

    def _transfer_row(self, rows: dict, src: int, dst: int, t0: float, t1: float, name: str, cat: Any,
                      args: Any, steps: list, ident: str) -> None:
        fs = args.get("flowscope") if isinstance(args, dict) else None
        rows["src"].append(src)
        rows["dst"].append(dst)
        rows["t0"].append(t0)
        rows["t1"].append(t1)
        if isinstance(fs, dict):
            rows["kind"].append(fs.get("kind") or "flow")
            rows["nbytes"].append(fs.get("nbytes"))
            rows["keys"].append(fs.get("keys"))
            rows["attrs"].append(_marked_attrs(args, fs))
            return
        a: dict[str, Any] = {"name": name, "flow_id": ident}
        if cat is not None:
            a["cat"] = cat
        if steps:
            a["steps"] = steps
        if args:
            a["args"] = args
        rows["kind"].append("flow")
        rows["nbytes"].append(None)
        rows["keys"].append(None)
        rows["attrs"].append(_args_json(a))
