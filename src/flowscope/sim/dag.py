"""Random layered DAGs of a given size, as data-state graphs (states and mutations) for benchmarks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flowscope.model.schemas import DATA_STATES, MUTATIONS


def layered_dag(n_vertices: int, n_edges: int, *, layers: int | None = None, seed: int = 0,
                start_ns: int = 1_700_000_000_000_000_000, max_step_ns: int = 1_000_000_000
                ) -> tuple[pa.Table, pa.Table]:
    """``n_vertices`` states in ``layers`` layers (default ~sqrt(n)) and ``n_edges`` mutations, each from a
    state in an earlier layer to one in a later layer, so the graph is acyclic and every destination is
    younger than its source. Times increase with the layer (random within a layer). Duplicate edges may
    occur. Returned as canonical ``data_states`` and ``mutations`` tables."""
    if n_vertices < 2:
        raise ValueError(f"n_vertices must be at least 2, got {n_vertices}")
    if n_edges < 0:
        raise ValueError(f"n_edges must be >= 0, got {n_edges}")
    rng = np.random.default_rng(seed)
    layers = int(layers or max(2, round(np.sqrt(n_vertices))))
    layers = min(max(layers, 2), n_vertices)
    # each layer gets at least one vertex; the rest spread at random
    layer = np.sort(np.concatenate([np.arange(layers), rng.integers(0, layers, n_vertices - layers)]))
    first = np.searchsorted(layer, np.arange(layers + 1))  # vertex range of each layer
    layer_t0 = start_ns + np.cumsum(max_step_ns + rng.integers(0, max_step_ns, layers))  # gap > in-layer spread
    ts = layer_t0[layer] + rng.integers(0, max_step_ns, n_vertices)
    # an edge: a source in any layer but the last, a destination in a strictly later layer
    src = rng.integers(0, first[layers - 1], n_edges)
    src_layer = layer[src]
    lo = first[src_layer + 1]
    dst = lo + (rng.random(n_edges) * (n_vertices - lo)).astype(np.int64)
    ids = pa.array(np.char.add("s", np.arange(n_vertices).astype(str)))
    kinds = np.array(["TRANSFER", "CONVERT", "MERGE", "SPLIT", "APPEND"])
    states = pa.table({
        "state_id": ids, "label": pa.nulls(n_vertices, pa.string()),
        "size_bytes": pa.array(rng.integers(0, 1 << 20, n_vertices)), "ts_ns": pa.array(ts.astype(np.int64)),
        "origin": pa.array(np.char.add("app", (layer % 7).astype(str))),
        "location": pa.array(np.char.add("node", (np.arange(n_vertices) % 16).astype(str))),
        "attrs": pa.nulls(n_vertices, pa.string()),
    }, schema=DATA_STATES)
    muts = pa.table({
        "mutation_id": pa.array(np.char.add("m", np.arange(n_edges).astype(str))),
        "src_state_id": ids.take(pa.array(src)), "dst_state_id": ids.take(pa.array(dst)),
        "kind": pa.array(kinds[rng.integers(0, len(kinds), n_edges)]),
        "application": pa.nulls(n_edges, pa.string()), "attrs": pa.nulls(n_edges, pa.string()),
    }, schema=MUTATIONS)
    return states, muts
