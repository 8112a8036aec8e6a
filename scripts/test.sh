#!/usr/bin/env bash
# Install everything the test suite needs into .venv and run the whole suite.
# Used by README (second set-up command) and by .ci/run. Exits non-zero on any failure,
# including pytest's exit 5 (no tests collected).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests drive: chromium renders the HTML report in a real browser; pajeng (pj_dump)
# and otf2-tools (otf2-print) are the references the Paje and OTF2 importers are checked against; redis-server
# carries batches from producers to collectors in tests/test_redis_transport.py.
APT_PACKAGES=(chromium pajeng otf2-tools redis-server)
if ((${#APT_PACKAGES[@]})); then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# Modules run in FLOWSCOPE_TEST_WORKERS processes (default 3), each module whole in one process (its module-scoped
# cluster, collector and browser are shared by its tests); FLOWSCOPE_TEST_WORKERS=0 runs everything in this process.
workers=${FLOWSCOPE_TEST_WORKERS:-3}
if [ "$workers" -gt 0 ]; then
  exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest "$@"
