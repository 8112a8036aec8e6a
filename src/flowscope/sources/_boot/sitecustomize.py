"""Put on PYTHONPATH by ``flowscope run``: in every Python process the command starts, observe Dask's local
schedulers once dask is imported and note what explains a run with no tasks (``sources/process_facts.py``),
and, with ``--trace``, trace the functions $FLOWSCOPE_TRACE names. Runs the sitecustomize it shadows first,
if there is one. Loads nothing beyond the standard library and a little of flowscope until dask is imported."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
for _d in sys.path:
    _f = os.path.join(_d or ".", "sitecustomize.py")
    if os.path.abspath(_d or ".") != _here and os.path.isfile(_f):
        with open(_f, encoding="utf-8") as _src:
            exec(compile(_src.read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})  # noqa: S102
        break



def _flowscope_missing() -> None:
    """This Python cannot import flowscope: say so at exit, in the facts folder, so the run can tell why it is
    empty (the standard library only)."""
    import atexit
    import json
    import time

    def write() -> None:
        directory = os.environ.get("FLOWSCOPE_FACTS_DIR")
        if not directory:
            return
        try:
            with open(os.path.join(directory, f"{os.getpid()}.json"), "w", encoding="utf-8") as f:
                json.dump({"pid": os.getpid(), "flowscope_importable": False, "python": sys.executable,
                           "argv": sys.argv[:8], "ts_ns": time.time_ns()}, f)
        except OSError:
            pass

    atexit.register(write)


if os.environ.get("FLOWSCOPE_RUN"):
    try:
        from flowscope.sources import process_facts
    except ImportError:
        print(f"flowscope: {sys.executable} cannot import flowscope; this process is not observed",
              file=sys.stderr)
        _flowscope_missing()
    else:
        try:
            process_facts.install()
        except Exception as _exc:  # never keep the user's program from starting
            print(f"flowscope: Dask's local schedulers are not observed: {_exc!r}", file=sys.stderr)

if os.environ.get("FLOWSCOPE_TRACE"):
    try:
        from flowscope.sources.python_tracing import install_from_env

        install_from_env()
    except Exception as _exc:  # never keep the user's program from starting
        print(f"flowscope: --trace not applied: {_exc!r}", file=sys.stderr)
