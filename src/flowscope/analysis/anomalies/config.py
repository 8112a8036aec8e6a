"""The detector's parameters, with Chimbuko's defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

ALGOS = ("hbos", "sstd")
METRICS = ("exclusive", "inclusive")


@dataclass(frozen=True)
class AnomalyConfig:
    """What the detectors score and how (defaults: CODARcode/PerformanceAnalysis)."""

    algo: str = "hbos"             # hbos | sstd
    threshold: float = 0.99        # hbos: flag from min + threshold * (max - min) of the bin scores
    max_bins: int = 200            # hbos: at most this many histogram bins per function
    alpha: float = 78.88e-32       # hbos: added to bin probabilities before -log2
    sigma: float = 6.0             # sstd: flag outside mean +- sigma * std
    metric: str = "exclusive"      # exclusive | inclusive time
    window: int = 5                # calls kept before and after each anomaly on the same resource
    min_count: int = 2             # a function is judged only once it has this many calls in the model
    step_ns: int = 1_000_000_000   # length of a step (the global model's sync period, 1 s)
    kinds: tuple[str, ...] = field(default=("task", "call", "state"))  # span kinds that are function calls

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {', '.join(ALGOS)}, not {self.algo!r}")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, not {self.metric!r}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], not {self.threshold!r}")
        if not 1 <= self.max_bins <= 4096:
            raise ValueError(f"max_bins must be in 1..4096, not {self.max_bins!r}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, not {self.sigma!r}")
        if self.window < 0:
            raise ValueError(f"window must be >= 0, not {self.window!r}")
        if self.step_ns <= 0:
            raise ValueError(f"step_ns must be > 0, not {self.step_ns!r}")

    def replace(self, **changes) -> AnomalyConfig:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["kinds"] = list(self.kinds)
        return d
