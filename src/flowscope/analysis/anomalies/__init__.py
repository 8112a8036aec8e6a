"""Streaming anomaly detection over function calls (the Chimbuko capability): per-function models
that merge exactly, HBOS and SSTD detectors, offline and distributed detection, post-pruning, the
anomalies table with its prescriptive provenance, and reduced runs."""

from flowscope.analysis.anomalies.calls import Calls, CallTreeError, calls_from_spans
from flowscope.analysis.anomalies.config import ALGOS, AnomalyConfig
from flowscope.analysis.anomalies.detect import Detection, detect, detect_run, post_prune
from flowscope.analysis.anomalies.model import FunctionModel, Scorer, scorer
from flowscope.analysis.anomalies.reduce import reduce_run
from flowscope.analysis.anomalies.stream import Detector, ParameterServer

__all__ = ["ALGOS", "AnomalyConfig", "CallTreeError", "Calls", "Detection", "Detector", "FunctionModel",
           "ParameterServer", "Scorer", "calls_from_spans", "detect", "detect_run", "post_prune", "reduce_run",
           "scorer"]
