"""Chrome / Perfetto trace-event JSON (chrome://tracing, ui.perfetto.dev, viztracer, PyTorch profiler).

Reads the object form (``{"traceEvents": [...], "displayTimeUnit": ..., ...}``) and the bare-array
form (also cut short without its closing bracket, which Chrome accepts), plain or gzip. Events are
decoded one at a time from a sliding text window, so the file's text is never held whole; what is
kept is a compact column store of the events themselves, matched and emitted at the end.

Mapping (docs/formats/chrome-perfetto.md): pids and tids -> process and thread resources (named by
``M`` metadata); ``X`` and ``B``/``E`` -> spans (kind ``call``) nested per thread, with
``parent_id`` and ``depth``; async ``b``/``e`` and ``S``/``T``/``F`` -> spans (kind ``async``) on
the process; flows ``s``/``t``/``f`` and ``bind_id``/``flow_in``/``flow_out`` -> transfers;
``C`` counters -> metrics (one per series key); ``i``/``I``/``R``/``n`` -> logs. ``ts``/``dur`` are
microseconds whatever ``displayTimeUnit`` says (that only changes how viewers label the axis).

The modules: ``events`` decodes the file one event at a time; ``reader`` routes each event into compact
column stores (``columns``) and at the end writes resources, logs and metrics; ``spans`` turns the slices
into nested span rows; ``flows`` matches flow events and binds them to slices as transfers and dependencies.
This module is the format's face (:mod:`flowscope.importers`): ``NAME``, ``SEMANTICS``, ``sniff``, ``read``.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

from flowscope.importers.chrome.events import _Events, _open
from flowscope.importers.chrome.reader import _Reader
from flowscope.importers.sink import ImportSink

NAME = "chrome"

#: what Chrome / Perfetto trace events mean (model/semantics.py): Kineto's GPU kernels are tasks (NCCL
#: kernels communicate), its memcpy/memset move data, CUDA runtime and driver calls are the runtime's
#: (synchronisations wait); any other complete event is a call that computes. A trace thread (a CPU
#: thread, a GPU stream) executes.
SEMANTICS = {
    "source": "chrome",
    "spans": [
        {"when": {"attrs.cat": "kernel", "name": ["nccl*", "*Nccl*", "*nccl*"]}, "category": "communication",
         "role": "task"},
        {"when": {"attrs.cat": "kernel"}, "category": "compute", "role": "task"},
        {"when": {"attrs.cat": ["gpu_memcpy", "gpu_memset", "Memcpy", "Memset"]}, "category": "communication",
         "role": "task"},
        {"when": {"attrs.cat": ["cuda_runtime", "cuda_driver"], "name": ["*Synchronize*", "*Wait*"]},
         "category": "wait", "role": "call"},
        {"when": {"attrs.cat": ["cuda_runtime", "cuda_driver"]}, "category": "runtime", "role": "call"},
        {"when": {"attrs.cat": ["disk*", "io", "IO", "file*"]}, "category": "io", "role": "call"},
    ],
    "resources": [
        {"when": {"kind": "thread"}, "executes": True, "slots": 1},
        {"when": {"kind": "process"}, "executes": False},
    ],
}

_SNIFF_OBJECT = re.compile(rb'^\s*\{.*"traceEvents"\s*:', re.S)
_SNIFF_ARRAY = re.compile(rb'^\s*\[\s*\{')


def sniff(path: Path, head: bytes) -> bool:
    """A JSON object with a ``traceEvents`` key, or a JSON array whose first object has ``ph``."""
    head = head.lstrip(b"\xef\xbb\xbf")
    if _SNIFF_OBJECT.match(head[:65536]):
        return True
    if _SNIFF_ARRAY.match(head):
        first = head[:4096]
        return b'"ph"' in first and (b'"ts"' in first or b'"name"' in first)
    return False


def read(path: Path, sink: ImportSink) -> None:
    """Import one Chrome trace-event JSON file (object or array form, plain or gzip) into ``sink``."""
    path = Path(path)
    stream, raw, note = _open(path)
    r = None
    # millions of short-lived acyclic dicts would each time trigger the cycle collector, which then
    # scans everything alive: it took three quarters of the parse time
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        ev = _Events(path, stream, note)
        r = _Reader(path, sink)
        n = 0
        origin_checked = False
        for e in ev:
            if not origin_checked:
                origin_checked = True
                r.set_origin(ev.meta)
            r.event(e, ev)
            n += 1
            if n % 65536 == 0:
                sink.advance(raw.tell())
        r.finish(ev)
    finally:
        if gc_was_enabled:
            gc.enable()
        if r is not None:
            r.xs.close()
        stream.close()
        raw.close()
