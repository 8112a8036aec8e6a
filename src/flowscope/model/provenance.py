"""Run identifiers and the provenance every run carries: hardware, software and job environment."""

from __future__ import annotations

import datetime as _dt
import functools
import math
import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from flowscope.model.schemas import INT64_MAX

KEY_PACKAGES = ("flowscope", "dask", "distributed", "pyarrow", "duckdb", "numpy", "pandas", "scipy",
                "starlette", "uvicorn", "psutil", "mpi4py", "torch")

# job schedulers and MPI launchers whose variables say where and how a run was launched
JOB_ENV_PREFIXES = ("SLURM_", "PBS_", "LSB_", "FLUX_", "COBALT_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_RANK",
                    "MPI_LOCALRANKID", "DASK_", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def new_run_id(now: float | None = None) -> str:
    """A sortable, unique run id: UTC time of creation plus 6 random hex digits."""
    stamp = _dt.datetime.fromtimestamp(now if now is not None else time.time(), _dt.timezone.utc)
    return f"{stamp:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is safe as a directory name, else raise ValueError."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id) or run_id in (".", ".."):
        raise ValueError(f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    return run_id


def now_ns() -> int:
    return time.time_ns()


# ---- run metadata (run.json): what an open or a close request may say, and what a stored run.json must hold ----

STATUS_MAX = 200
#: the fields of run.json the collector sets: at open (collector, format_version, status "running", end_ns null)
#: and at close (end_ns, status); an open request may not set them
COLLECTOR_FIELDS = ("collector", "end_ns", "format_version", "status")
#: the only fields a close request may carry
CLOSE_FIELDS = ("end_ns", "status")
#: the fields every run.json has (docs/data-model.md)
RUN_FIELDS = ("run_id", "name", "command", "start_ns", "end_ns", "status", "provenance", "collector", "format_version")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.80}"


def _ns_problem(value: Any, lo: int) -> str | None:
    """Why ``value`` is not an int ns since the UTC epoch within lo..2**63-1 (None if it is one)."""
    if type(value) is not int or not lo <= value <= INT64_MAX:  # bool is an int subclass: refused too
        bounds = "within 0..2**63-1" if lo == 0 else "an int64" if lo == -INT64_MAX else f"within {lo}..2**63-1"
        return f"expected an integer of ns since the UTC epoch ({bounds}), got {_describe(value)}"
    return None


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity inside a JSON value (JSON has neither), else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, Mapping):
        return next((p for k, v in value.items() if (p := _non_finite(v, f"{path}.{k}")) is not None), None)
    if isinstance(value, (list, tuple)):
        return next((p for i, v in enumerate(value) if (p := _non_finite(v, f"{path}[{i}]")) is not None), None)
    return None


def _field_problems(doc: Mapping, lo: int) -> dict[str, str]:
    """What is wrong with each of the known fields of a run.json-like mapping, by field."""
    out: dict[str, str] = {}
    if "run_id" in doc and doc["run_id"] is not None:
        try:
            check_run_id(doc["run_id"])
        except ValueError as exc:
            out["run_id"] = str(exc)
    for key in ("name", "command"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            out[key] = f"expected a string or null, got {_describe(doc[key])}"
    for key in ("start_ns", "end_ns"):
        if doc.get(key) is not None and (why := _ns_problem(doc[key], lo)):
            out[key] = why
    if doc.get("status") is not None and not (isinstance(doc["status"], str) and 0 < len(doc["status"]) <= STATUS_MAX):
        out["status"] = f"expected a non-empty string of at most {STATUS_MAX} characters, got {_describe(doc['status'])}"
    for key in ("provenance", "collector"):
        if doc.get(key) is not None and not isinstance(doc[key], Mapping):
            out[key] = f"expected an object, got {_describe(doc[key])}"
    if doc.get("format_version") is not None and type(doc["format_version"]) is not int:
        out["format_version"] = f"expected an integer, got {_describe(doc['format_version'])}"
    for key, value in doc.items():
        if key not in out and (where := _non_finite(value, key)) is not None:
            out[key] = f"{where} is not a finite number (JSON has no NaN or infinity)"
    return out


def check_open_request(meta: Mapping) -> dict:
    """Return ``meta`` (the body of a run open: run_id, name, command, start_ns, provenance and any extra field)
    as a dict if run.json can hold it, else raise ValueError naming the field (``run.json start_ns: ...``)."""
    if not isinstance(meta, Mapping):
        raise ValueError(f"run.json: the run's metadata must be an object, got {type(meta).__name__}")
    owned = sorted(k for k in COLLECTOR_FIELDS if k in meta)
    if owned:
        raise ValueError(f"run.json {owned[0]}: set by the collector (a run opens with status 'running'; its end_ns "
                         f"and status are given when it is closed), not by the open request")
    problems = _field_problems(meta, lo=0)
    if problems:
        key = next(iter(problems))
        raise ValueError(f"run.json {key}: {problems[key]}")
    return dict(meta)


def check_close_request(body: Mapping, *, earliest: int = 0) -> tuple[int | None, str]:
    """The (end_ns, status) of a run close request, or ValueError naming what does not fit: only
    ``end_ns`` (int ns within earliest..2**63-1, default now) and ``status`` (a string, default 'finished')
    are accepted."""
    if not isinstance(body, Mapping):
        raise ValueError(f"close: the body must be an object, got {type(body).__name__}")
    unknown = sorted(str(k) for k in body if k not in CLOSE_FIELDS)
    if unknown:
        raise ValueError(f"close: unknown field(s) {', '.join(unknown)}; a close takes only "
                         f"{' and '.join(CLOSE_FIELDS)}")
    problems = _field_problems(body, lo=earliest)
    for key in CLOSE_FIELDS:
        if key in problems:
            raise ValueError(f"close {key}: {problems[key]}")
    if "status" in body and body["status"] is None:
        raise ValueError("close status: expected a non-empty string, got None")
    return body.get("end_ns"), body.get("status", "finished")


def run_json_problems(doc: Any) -> dict[str, str]:
    """What is wrong with a stored run.json, by field ('' for the document as a whole); empty if nothing.

    Looser than the open request: any int64 time passes (an imported trace may start before 1970)."""
    if not isinstance(doc, Mapping):
        return {"": f"not a JSON object but a JSON {type(doc).__name__}"}
    problems = _field_problems(doc, lo=-INT64_MAX)
    if not isinstance(doc.get("run_id"), str):
        problems.setdefault("run_id", f"expected the run id, got {_describe(doc.get('run_id'))}")
    return problems


def cpu_model() -> str | None:
    """The CPU model name (from /proc/cpuinfo on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpus() -> list[dict]:
    """GPUs from NVML when it is available, else from nvidia-smi; empty when there are none."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                            "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total)})
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    if shutil.which("nvidia-smi"):
        try:
            res = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5)
            out = []
            for line in res.stdout.strip().splitlines():
                idx, name, mem = (p.strip() for p in line.split(","))
                out.append({"index": int(idx), "name": name, "memory_bytes": int(float(mem)) * 2**20})
            return out
        except Exception:
            pass
    return []


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str]:
    """Versions of KEY_PACKAGES (read once per process: each is a search of the installed packages' metadata)."""
    out = {}
    for name in KEY_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def run_facts(meta: Mapping) -> list[list[str]]:
    """What a person reads first about a run, from its run.json: ``[label, text]`` for its command, host, CPU, cores,
    memory, GPUs, platform, Python and the versions of Dask and flowscope that recorded it (those it holds)."""
    prov = meta.get("provenance") if isinstance(meta.get("provenance"), Mapping) else {}
    pkgs = prov.get("packages") if isinstance(prov.get("packages"), Mapping) else {}
    cores = None
    if prov.get("cpu_logical") or prov.get("cpu_physical"):
        cores = f"{prov.get('cpu_logical') or '?'} logical, {prov.get('cpu_physical') or '?'} physical"
    memory = prov.get("memory_bytes")
    gpus = prov.get("gpus") if isinstance(prov.get("gpus"), list) else []
    facts = [
        ("command", meta.get("command")),
        ("host", prov.get("hostname")),
        ("CPU", prov.get("cpu_model")),
        ("cores", cores),
        ("memory", f"{memory / 2**30:.1f} GiB" if isinstance(memory, (int, float)) and memory > 0 else None),
        ("GPUs", ", ".join(str(g.get("name", "?")) for g in gpus if isinstance(g, Mapping)) or None),
        ("platform", prov.get("platform")),
        ("Python", prov.get("python")),
        ("dask / distributed", " / ".join(str(pkgs[p]) for p in ("dask", "distributed") if p in pkgs) or None),
        ("flowscope", pkgs.get("flowscope")),
    ]
    return [[label, str(text)] for label, text in facts if text not in (None, "")]


def collect_provenance() -> dict:
    """Hardware, software and job environment of the calling process's machine."""
    import psutil

    vm = psutil.virtual_memory()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_logical": os.cpu_count(),
        "cpu_physical": psutil.cpu_count(logical=False),
        "memory_bytes": int(vm.total),
        "gpus": _gpus(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "packages": dict(_versions()),
        "environment": {k: v for k, v in os.environ.items() if k.startswith(JOB_ENV_PREFIXES)},
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "user": os.environ.get("USER") or os.environ.get("LOGNAME"),
    }


# ---- what was run: the client script, so that runs of the same code can be grouped -------------------------

def file_digest(path: str | os.PathLike) -> dict | None:
    """``{"path", "sha256", "bytes"}`` of the file at ``path`` (absolute path), or None if it cannot be read."""
    import hashlib

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return {"path": os.path.abspath(path), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def script_of_command(argv: list[str]) -> dict | None:
    """The script a command runs, with its hash (:func:`file_digest`): for ``python [options] FILE ...`` the
    FILE, for ``python -m MODULE`` the module's source file, else the program itself when it is a file (a shell
    script); None when there is none to hash."""
    if not argv:
        return None
    prog = os.path.basename(argv[0])
    if re.match(r"^python[0-9.]*$", prog):
        args = iter(argv[1:])
        for a in args:
            if a == "-m":
                module = next(args, None)
                if module is None:
                    return None
                try:
                    import importlib.util

                    spec = importlib.util.find_spec(module)
                except (ImportError, ValueError):
                    spec = None
                found = file_digest(spec.origin) if spec is not None and spec.origin else None
                return {**found, "module": module} if found else {"module": module}
            if a == "-c":
                return None
            if a.startswith("-"):
                continue
            return file_digest(a)
        return None
    path = shutil.which(argv[0]) or argv[0]
    return file_digest(path) if os.path.isfile(path) else None


def main_script() -> dict | None:
    """The calling program's main script with its hash (:func:`file_digest`), None in an interactive session."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return file_digest(path) if path else None


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: what json.dumps cannot write becomes its str, and so do NaN and the
    infinities (JSON has none; Dask's configuration holds ``inf``), as "NaN", "Infinity", "-Infinity"."""
    import json

    return json.loads(json.dumps(value, default=str), parse_constant=str)
