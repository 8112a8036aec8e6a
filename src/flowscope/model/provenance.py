"""Run identifiers and the provenance every run carries: hardware, software and job environment."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from importlib import metadata

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


def _versions() -> dict[str, str]:
    out = {}
    for name in KEY_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


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
        "packages": _versions(),
        "environment": {k: v for k, v in os.environ.items() if k.startswith(JOB_ENV_PREFIXES)},
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "user": os.environ.get("USER") or os.environ.get("LOGNAME"),
    }
