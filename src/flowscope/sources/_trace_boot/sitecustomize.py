"""Put on PYTHONPATH by ``flowscope run --trace``: trace the functions $FLOWSCOPE_TRACE names in every Python
process the command starts. Runs the sitecustomize it shadows first, if there is one."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
for _d in sys.path:
    _f = os.path.join(_d or ".", "sitecustomize.py")
    if os.path.abspath(_d or ".") != _here and os.path.isfile(_f):
        with open(_f, encoding="utf-8") as _src:
            exec(compile(_src.read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})  # noqa: S102
        break

try:
    from flowscope.sources.python_tracing import install_from_env

    install_from_env()
except Exception as _exc:  # never keep the user's program from starting
    print(f"flowscope: --trace not applied: {_exc!r}", file=sys.stderr)
