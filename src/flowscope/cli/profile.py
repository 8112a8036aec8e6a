"""``flowscope profile``: a run's call tree (inclusive / exclusive time and calls per call path) as an
indented tree, merged across resources or per resource."""

from __future__ import annotations

import argparse
import math

from flowscope.cli.output import LOOKUP_STORE_HELP, console, fmt_ns, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="the call tree of a run: time and calls per call path",
                       description="Print the calling-context tree of a run's nested spans (OTF2 regions, Chrome "
                                   "slices, traced Python functions, any spans that nest): per call path the "
                                   "inclusive and exclusive time and the calls, merged across resources with the "
                                   "min / mean / max over resources and the imbalance (max - mean) / max, or one "
                                   "tree per resource. The same rows are the view call_tree of flowscope sql.")
    p.add_argument("run", help="run directory, run id in the store, or 'latest'")
    p.add_argument("--store", help=LOOKUP_STORE_HELP)
    p.add_argument("--by", choices=("merged", "resource"), default="merged",
                   help="one tree merged across resources (default), or one tree per resource")
    p.add_argument("--top", type=int, default=40,
                   help="call paths shown per tree: those with the most inclusive time, with their callers "
                        "(default 40; 0 for all)")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help="only spans of this kind (repeatable; default: every span)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


def _top(rows: list[dict], n: int) -> list[dict]:
    """The ``n`` rows with the most inclusive time and their ancestors, in depth-first order (children by
    inclusive time, most first)."""
    by_id = {r["path_id"]: r for r in rows}
    keep = set(by_id)
    if n > 0:
        keep = set()
        for r in sorted(rows, key=lambda r: (-r["inclusive_ns"], r["path_id"]))[:n]:
            p = r["path_id"]
            while p is not None and p not in keep:
                keep.add(p)
                p = by_id[p]["parent_path_id"]
    children: dict = {}
    for r in rows:
        if r["path_id"] in keep:
            children.setdefault(r["parent_path_id"], []).append(r)
    out: list[dict] = []
    stack = sorted(children.get(None, []), key=lambda r: (r["inclusive_ns"], -r["path_id"]))
    while stack:
        r = stack.pop()
        out.append(r)
        stack.extend(sorted(children.get(r["path_id"], []), key=lambda r: (r["inclusive_ns"], -r["path_id"])))
    return out


def _print_tree(rows: list[dict], merged: bool) -> None:
    """Numbers in right-aligned columns, then the call path indented by depth (long names never wrap)."""
    heads = ["inclusive", "exclusive", "calls"] + (["min", "mean", "max", "imbalance"] if merged else [])
    cells = []
    for x in rows:
        c = [fmt_ns(x["inclusive_ns"]), fmt_ns(x["exclusive_ns"]), str(x["calls"])]
        if merged:
            c += [fmt_ns(x["inclusive_min_ns"]), fmt_ns(x["inclusive_mean_ns"]), fmt_ns(x["inclusive_max_ns"]),
                  f"{100 * x['inclusive_imbalance']:.1f} %"]
        cells.append(c)
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    print("  ".join(h.rjust(w) for h, w in zip(heads, widths)) + "  call path")
    for x, c in zip(rows, cells):
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)) + "  " + "  " * x["depth"] + x["name"])


def _json_row(r: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}


def run(args: argparse.Namespace) -> int:
    from flowscope.analysis.call_tree import run_call_tree
    from flowscope.store.catalog import resolve_run
    from flowscope.store.run import open_run

    r = open_run(resolve_run(args.run, args.store))
    tree = run_call_tree(r, args.kind)
    rows = tree.table().to_pylist()
    merged = args.by == "merged"
    groups: dict = {}
    for row in rows:
        if (row["resource_id"] is None) == merged:
            groups.setdefault(row["resource_id"], []).append(row)
    shown = {res: _top(g, args.top) for res, g in groups.items()}
    if args.json:
        print_json({"run_id": r.meta.get("run_id"), "by": args.by, "resources": len(tree.resources),
                    "nesting": tree.nesting, "call_paths": len(tree),
                    "paths": [_json_row(x) for res in sorted(shown, key=str) for x in shown[res]]})
        return 0
    if not rows:
        kinds = f" of kind {', '.join(args.kind)}" if args.kind else ""
        console.print(f"run {r.meta.get('run_id')}: no spans{kinds}, so no call tree (spans that nest on a "
                      f"resource come from OTF2 and Chrome traces, @flowscope.trace, or Client.span)")
        return 0
    flat = sorted(res for res, how in tree.nesting.items() if how == "flat")
    derived = sorted(res for res, how in tree.nesting.items() if how == "derived")
    print(f"run {r.meta.get('run_id')}: {len(tree)} call paths on {len(tree.resources)} resource(s); nesting by "
          + ", ".join(f"{how} on {sum(v == how for v in tree.nesting.values())}"
                      for how in sorted(set(tree.nesting.values()))))
    if flat:
        print(f"  spans overlap without nesting on {len(flat)} resource(s) (e.g. {flat[0]}): profiled flat, "
              f"each span a root")
    if derived:
        print(f"  span times were placed by a rule, not observed, on {len(derived)} resource(s) "
              f"(e.g. {derived[0]}): profiled flat, each span a root")
    for res in sorted(shown, key=str):
        sel = shown[res]
        title = (f"merged across {len(tree.resources)} resource(s)" if merged else str(res)) + \
            (f", top {len(sel)} of {len(groups[res])} call paths" if len(sel) < len(groups[res]) else "")
        print(f"\n{title}")
        _print_tree(sel, merged)
    if merged:
        print("\nmin / mean / max: inclusive time over all resources (0 where a resource never reached the path); "
              "imbalance = (max - mean) / max")
    return 0
