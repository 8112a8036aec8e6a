"""A stencil mini-app in the spirit of Astaroth and LULESH, for application diagnostics: explicit 2-D diffusion of a
density on a periodic ``n`` x ``n`` mesh, split into bands of rows that ``threads`` threads update (numpy releases
the GIL), publishing its science every step -- mass, energy, the density's extrema and where they are, the number
of NaN cells -- into a namespace (``flowscope.namespace`` / ``Client.namespace``).

The scheme is stable for ``r = D dt / dx**2 <= 1/4``; the stable run takes r = 0.2 and conserves its mass while its
energy (the sum of squares) decays. ``unstable=True`` takes r = 0.5: the mesh's highest-frequency mode then
triples at every step, so the energy grows ninefold a step until the mesh overflows to infinities and NaN, and the
solver stops with :class:`SolverCrashed` -- the crash an instability detector (analysis/instability.py) has to
see coming, as in the SOMA dissertation's Figs. 15-16.

    python -m flowscope.workflows.stencil [--unstable] [--n 256] [--steps 2000] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["SolverCrashed", "diagnostics", "run_stencil"]

STABLE_R, UNSTABLE_R = 0.2, 0.5


class SolverCrashed(RuntimeError):
    """The mesh holds NaN: the solver cannot go on. ``step`` is the step that produced them."""

    def __init__(self, step: int, nan_count: int):
        super().__init__(f"step {step}: {nan_count} NaN cells in the mesh; the solver stops")
        self.step, self.nan_count = step, nan_count


def diagnostics(u: np.ndarray) -> dict:
    """One step's science: mass, energy, the extrema with their locations (NaN cells left out), NaN count."""
    finite = np.isfinite(u)
    nans = int(np.isnan(u).sum())
    if finite.any():
        masked = np.where(finite, u, np.nan)
        lo, hi = int(np.nanargmin(masked)), int(np.nanargmax(masked))
        extrema = {"min": {"value": float(u.flat[lo]), "location": np.array(np.unravel_index(lo, u.shape))},
                   "max": {"value": float(u.flat[hi]), "location": np.array(np.unravel_index(hi, u.shape))}}
    else:
        extrema = {"min": {"value": float("nan")}, "max": {"value": float("nan")}}
    with np.errstate(over="ignore", invalid="ignore"):
        return {"mass": float(u.sum()), "energy": float(np.square(u).sum()), "density": extrema, "nan_count": nans}


def _band_update(u: np.ndarray, out: np.ndarray, r: float, lo: int, hi: int) -> None:
    """Rows [lo, hi) of one explicit step, periodic in both directions."""
    rows = u[lo:hi]
    up = u[lo - 1:hi - 1] if lo > 0 else np.concatenate([u[-1:], u[:hi - 1]])
    down = u[lo + 1:hi + 1] if hi < len(u) else np.concatenate([u[lo + 1:], u[:1]])
    with np.errstate(over="ignore", invalid="ignore"):
        lap = up + down + np.roll(rows, 1, axis=1) + np.roll(rows, -1, axis=1) - 4.0 * rows
        np.add(rows, r * lap, out=out[lo:hi])


def run_stencil(n: int = 256, steps: int = 2000, *, threads: int = 2, unstable: bool = False, namespace: Any = None,
                on_step: Callable[[int, dict], Any] | None = None, seed: int = 0) -> dict:
    """Run the mini-app; after each step, publish its diagnostics into ``namespace`` (``step`` and
    ``diagnostics/...``, one commit) and call ``on_step(step, diagnostics)``. Raises :class:`SolverCrashed` (after
    publishing that step) when the mesh holds NaN. Returns ``{"steps", "r", "diagnostics"}`` of the last step and
    ``verdict``: what ``on_step`` last returned that was not None."""
    if n < 8 or steps < 1 or threads < 1:
        raise ValueError(f"n >= 8, steps >= 1 and threads >= 1 needed, got n={n}, steps={steps}, threads={threads}")
    r = UNSTABLE_R if unstable else STABLE_R
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 2 * np.pi, n, endpoint=False)
    u = 1.0 + 0.5 * np.outer(np.sin(x), np.cos(x)) + 1e-3 * rng.standard_normal((n, n))
    nxt = np.empty_like(u)
    bands = np.linspace(0, n, min(threads, n) + 1).astype(int)
    verdict = None
    d: dict = {}
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="stencil") as pool:
        for step in range(1, steps + 1):
            list(pool.map(lambda b: _band_update(u, nxt, r, bands[b], bands[b + 1]), range(len(bands) - 1)))
            u, nxt = nxt, u
            d = diagnostics(u)
            if namespace is not None:
                namespace.set("step", step)
                namespace.set("diagnostics", d)
                namespace.commit()
            if on_step is not None:
                got = on_step(step, d)
                verdict = got if got is not None else verdict
            if d["nan_count"]:
                raise SolverCrashed(step, d["nan_count"])
    return {"steps": steps, "r": r, "diagnostics": d, "verdict": verdict}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--unstable", action="store_true", help="a time step beyond the stability limit: it will crash")
    p.add_argument("--publish-every", type=int, default=1)
    args = p.parse_args(argv)
    import flowscope
    from flowscope.analysis.instability import InstabilityDetector

    detector = InstabilityDetector()

    def watch(step: int, d: dict) -> dict | None:
        v = detector.update(step, d["energy"])
        if v is not None:
            print(f"instability detected at step {step}: energy grew {v['growth']:.3g}x over the last "
                  f"{detector.window} steps ({v['rate']:.3g}x a step)", file=sys.stderr, flush=True)
        return v

    with flowscope.namespace("application", publish_every=args.publish_every, blocking=False) as ns:
        try:
            out = run_stencil(args.n, args.steps, threads=args.threads, unstable=args.unstable, namespace=ns,
                              on_step=watch)
        except SolverCrashed as exc:
            print(f"crashed: {exc}", file=sys.stderr)
            return 1
    print(f"{out['steps']} steps, mass {out['diagnostics']['mass']:.6g}, energy {out['diagnostics']['energy']:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
