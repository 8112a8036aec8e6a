"""The benchmarking phase: hit-rate curves of a corpus of runs, hit-rate surfaces over (window size, DAG
size) per cluster size, the 4th-order polynomial surface fitted to each and its cut at 95 %: the
window-size model, saved as JSON with the corpus it came from.

Following Pallipuram et al., the surface of one cluster size (number of resources N) is the least-squares
polynomial of total degree 4 in (window size, tasks) -- MATLAB's ``poly44``, 15 terms -- fitted to every
(window, tasks, hit rate) point of the corpus's runs on N resources. One deliberate difference: the
window axis is ``log2(window)``, because the candidate sizes are a geometric series (the paper's were
linear, 1,000-50,000 samples); both axes are scaled to [0, 1] over the corpus's range before fitting.
With fewer distinct points than terms, or a single DAG size, the fit is the minimum-norm least-squares
solution (its ``rank`` is recorded).

The cut: for a DAG of T tasks, the model's window is the largest candidate-range size w such that the
fitted hit rate stays >= ``cut`` (0.95) for every size from the smallest candidate up to w. Where even the
smallest falls below, the surface still ranks the sizes, and the model's window is the one with the highest
fitted hit rate (:meth:`Surface.best`). A model *fits* a run with N resources and T tasks when it has a surface
for exactly N resources and T lies within its corpus's task range widened by :data:`TASK_SLACK` either
way; otherwise :func:`window_for` says why, and the prediction uses :func:`default_window`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from flowscope.analysis.forecast.windows import ALPHA

FORMAT = "flowscope-forecast-window-model"
VERSION = 1
DEGREE = 4
CUT = 0.95
#: a model's task range is widened by this factor either way when deciding whether it fits a run
TASK_SLACK = 1.25
#: the window (samples) used when no model fits a run, unless the run is too short for 8 such frames
DEFAULT_WINDOW = 1000
#: the fewest frames a default window leaves in the run, and the smallest default window
DEFAULT_MIN_FRAMES = 8
DEFAULT_MIN_WINDOW = 10
_GRID = 400  # window sizes tried along the cut


def default_window(n_samples: int) -> int:
    """The documented fallback: :data:`DEFAULT_WINDOW` samples, shortened to ``n_samples //``
    :data:`DEFAULT_MIN_FRAMES` when the run is too short for that many frames, never below
    :data:`DEFAULT_MIN_WINDOW`."""
    return int(max(DEFAULT_MIN_WINDOW, min(DEFAULT_WINDOW, n_samples // DEFAULT_MIN_FRAMES)))


def _terms(degree: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(degree + 1) for j in range(degree + 1 - i)]


@dataclass
class Surface:
    """The fitted hit-rate surface of one cluster size: hit rate = sum c_k x^i_k y^j_k with
    x = (log2 w - x0) / xs and y = (tasks - y0) / ys."""

    resources: int
    coefficients: list[float]
    terms: list[tuple[int, int]]
    x_range: tuple[float, float]  # log2 of the smallest and largest window of the corpus
    tasks_range: tuple[int, int]
    rank: int
    points: int

    def _xy(self, w: np.ndarray, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x0, x1 = self.x_range
        y0, y1 = self.tasks_range
        x = (np.log2(np.asarray(w, np.float64)) - x0) / ((x1 - x0) or 1.0)
        y = (np.asarray(tasks, np.float64) - y0) / ((y1 - y0) or 1.0)
        return x, y

    def __call__(self, w: np.ndarray | float, tasks: np.ndarray | float) -> np.ndarray:
        """The fitted hit rate at window size(s) ``w`` and DAG size(s) ``tasks``."""
        x, y = self._xy(np.asarray(w), np.asarray(tasks))
        return sum(c * x ** i * y ** j for c, (i, j) in zip(self.coefficients, self.terms, strict=True))

    def _grid(self) -> np.ndarray:
        return np.unique(np.round(2.0 ** np.linspace(*self.x_range, _GRID)).astype(np.int64))

    def cut(self, tasks: float, cut: float = CUT) -> int | None:
        """The largest window whose fitted hit rate, and that of every smaller candidate size, is >= ``cut``
        for a DAG of ``tasks`` tasks; None when the smallest size is already below."""
        grid = self._grid()
        ok = self(grid, np.full(len(grid), float(tasks))) >= cut
        if not ok[0]:
            return None
        bad = np.flatnonzero(~ok)
        return int(grid[-1] if not len(bad) else grid[bad[0] - 1])

    def best(self, tasks: float) -> int:
        """The window of the corpus's range with the highest fitted hit rate for a DAG of ``tasks`` tasks (the
        smallest such window on a tie)."""
        grid = self._grid()
        return int(grid[int(np.argmax(self(grid, np.full(len(grid), float(tasks)))))])

    def as_dict(self) -> dict:
        return {"resources": self.resources, "coefficients": self.coefficients, "terms": [list(t) for t in self.terms],
                "x_range": list(self.x_range), "tasks_range": list(self.tasks_range), "rank": self.rank,
                "points": self.points}

    @classmethod
    def from_dict(cls, d: dict) -> Surface:
        return cls(resources=int(d["resources"]), coefficients=[float(c) for c in d["coefficients"]],
                   terms=[(int(i), int(j)) for i, j in d["terms"]], x_range=(float(d["x_range"][0]), float(d["x_range"][1])),
                   tasks_range=(int(d["tasks_range"][0]), int(d["tasks_range"][1])), rank=int(d["rank"]),
                   points=int(d["points"]))


def fit_surface(points: pd.DataFrame, resources: int, degree: int = DEGREE) -> Surface:
    """The least-squares polynomial surface of total degree ``degree`` through ``points`` (columns
    ``window``, ``tasks``, ``hit_rate``; rows with a NaN hit rate are left out)."""
    p = points.dropna(subset=["hit_rate"])
    if not len(p):
        raise ValueError(f"no hit rate to fit for {resources} resources (every window size left fewer than 2 windows)")
    lw = np.log2(p["window"].to_numpy(np.float64))
    tasks = p["tasks"].to_numpy(np.int64)
    s = Surface(resources=int(resources), coefficients=[], terms=_terms(degree),
                x_range=(float(lw.min()), float(lw.max())), tasks_range=(int(tasks.min()), int(tasks.max())),
                rank=0, points=len(p))
    x, y = s._xy(p["window"].to_numpy(np.float64), tasks)
    a = np.stack([x ** i * y ** j for i, j in s.terms], axis=1)
    coef, _, rank, _ = np.linalg.lstsq(a, p["hit_rate"].to_numpy(np.float64), rcond=None)
    s.coefficients = [float(c) for c in coef]
    s.rank = int(rank)
    return s


@dataclass
class CorpusEntry:
    """One benchmarked run: where it came from, its size and its hit-rate curve."""

    source: str  # the trace file or run directory given
    run_id: str
    resources: int
    tasks: int
    samples: int
    period_ns: float
    capped_by: str | None
    curve: pd.DataFrame  # window, pairs, hits, hit_rate

    def as_dict(self) -> dict:
        c = self.curve
        return {"source": self.source, "run_id": self.run_id, "resources": self.resources, "tasks": self.tasks,
                "samples": self.samples, "period_ns": self.period_ns, "capped_by": self.capped_by,
                "windows": [int(v) for v in c["window"]], "pairs": [int(v) for v in c["pairs"]],
                "hits": [int(v) for v in c["hits"]],
                "hit_rates": [None if pd.isna(v) else float(v) for v in c["hit_rate"]]}

    @classmethod
    def from_dict(cls, d: dict) -> CorpusEntry:
        curve = pd.DataFrame({"window": d["windows"], "pairs": d["pairs"], "hits": d["hits"],
                              "hit_rate": [np.nan if v is None else v for v in d["hit_rates"]]})
        return cls(source=d["source"], run_id=d["run_id"], resources=int(d["resources"]), tasks=int(d["tasks"]),
                   samples=int(d["samples"]), period_ns=float(d["period_ns"]), capped_by=d.get("capped_by"),
                   curve=curve)


@dataclass
class WindowModel:
    """Window sizes for prediction, per cluster size, from a benchmarked corpus."""

    event: str
    alpha: float = ALPHA
    cut: float = CUT
    degree: int = DEGREE
    corpus: list[CorpusEntry] = field(default_factory=list)
    surfaces: dict[int, Surface] = field(default_factory=dict)

    def window_for(self, resources: int, tasks: int) -> tuple[int | None, str]:
        """(window size, why) for a run of ``tasks`` tasks on ``resources`` resources; None when the model
        does not fit the run (the reason says why)."""
        s = self.surfaces.get(int(resources))
        if s is None:
            known = ", ".join(str(r) for r in sorted(self.surfaces)) or "none"
            return None, f"the model has no surface for {resources} resources (it has: {known})"
        lo, hi = s.tasks_range
        if not lo / TASK_SLACK <= tasks <= hi * TASK_SLACK:
            return None, (f"the run's {tasks} tasks lie outside the model's range for {resources} resources "
                          f"({lo}-{hi} tasks, widened x{TASK_SLACK})")
        w = s.cut(tasks, self.cut)
        if w is None:  # the surface still ranks the windows: its best one, not a default that ignores the model
            best = s.best(tasks)
            fitted = float(s(best, tasks))
            where = (f"stays below {self.cut:.0%} hit rate at every window size" if fitted < self.cut else
                     f"is below {self.cut:.0%} hit rate at its smallest window size, so it has no cut,")
            # a polynomial surface can overshoot 100 %: the rate it stands for cannot
            return best, (f"the model's surface for {resources} resources {where} for {tasks} tasks: its best "
                          f"window, {best} samples (fitted hit rate {min(1.0, max(0.0, fitted)):.0%})")
        return w, f"window-size model: {resources} resources, {tasks} tasks -> {w} samples"

    def cuts(self) -> pd.DataFrame:
        """The model as a table (the paper's Fig. 9): per cluster size and each DAG size of its corpus, the
        window size at the cut."""
        rows = []
        for r, s in sorted(self.surfaces.items()):
            for t in sorted({e.tasks for e in self.corpus if e.resources == r}):
                rows.append((r, t, s.cut(t, self.cut)))
        return pd.DataFrame(rows, columns=["resources", "tasks", "window"]).astype({"window": "Int64"})

    def as_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "event": self.event, "alpha": self.alpha, "cut": self.cut,
                "degree": self.degree, "corpus": [e.as_dict() for e in self.corpus],
                "surfaces": [s.as_dict() for _, s in sorted(self.surfaces.items())],
                "cuts": [{"resources": int(r), "tasks": int(t), "window": None if pd.isna(w) else int(w)}
                         for r, t, w in self.cuts().itertuples(index=False)]}

    @classmethod
    def from_dict(cls, d: dict) -> WindowModel:
        if d.get("format") != FORMAT:
            raise ValueError(f"not a flowscope window-size model (format {d.get('format')!r}, expected {FORMAT!r})")
        if int(d.get("version", 0)) > VERSION:
            raise ValueError(f"window-size model version {d.get('version')} is newer than this flowscope reads ({VERSION})")
        return cls(event=d["event"], alpha=float(d["alpha"]), cut=float(d["cut"]), degree=int(d["degree"]),
                   corpus=[CorpusEntry.from_dict(e) for e in d["corpus"]],
                   surfaces={int(s["resources"]): Surface.from_dict(s) for s in d["surfaces"]})

    def save(self, path: str | Path) -> Path:
        """Write the model as JSON to ``path``."""
        p = Path(path)
        p.write_text(json.dumps(self.as_dict(), indent=1))
        return p


def load_model(path: str | Path) -> WindowModel:
    """The model saved at ``path``; ValueError naming the file when it is not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    try:
        return WindowModel.from_dict(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{p}: {exc}") from None


#: window-size model files (os.pathsep between them; one model per event) the collector's and the dashboard's
#: forecast route use: set by ``flowscope serve`` / ``flowscope ui --forecast-model``, inherited by the collector
#: ``flowscope run`` and ``observe()`` start
MODELS_ENV = "FLOWSCOPE_FORECAST_MODEL"


def load_models(paths: Sequence[str | Path]) -> dict[str, WindowModel]:
    """The models saved at ``paths``, by the event each was built for; ValueError naming the file that is not a
    model, or the two files that model the same event."""
    out: dict[str, WindowModel] = {}
    where: dict[str, Path] = {}
    for path in paths:
        model = load_model(path)
        if model.event in out:
            raise ValueError(f"two window-size models for event {model.event!r}: {where[model.event]} and {path}")
        out[model.event], where[model.event] = model, Path(path)
    return out


def models_from_env() -> dict[str, WindowModel]:
    """The models named by $FLOWSCOPE_FORECAST_MODEL (none when unset), as :func:`load_models` reads them."""
    value = os.environ.get(MODELS_ENV, "")
    return load_models([p for p in value.split(os.pathsep) if p])


def build_model(corpus: Sequence[CorpusEntry], event: str, alpha: float = ALPHA, cut: float = CUT,
                degree: int = DEGREE) -> WindowModel:
    """The window-size model of ``corpus``: one surface per cluster size."""
    model = WindowModel(event=event, alpha=alpha, cut=cut, degree=degree, corpus=list(corpus))
    by_n: dict[int, list[pd.DataFrame]] = {}
    for e in corpus:
        by_n.setdefault(e.resources, []).append(e.curve.assign(tasks=e.tasks))
    for n, parts in by_n.items():
        pts = pd.concat(parts, ignore_index=True)
        if pts["hit_rate"].notna().any():
            model.surfaces[n] = fit_surface(pts, n, degree)
    return model
