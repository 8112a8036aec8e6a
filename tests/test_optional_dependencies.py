"""A test that needs an optional dependency (otf2, PyDarshan, Playwright) skips, saying why, for a user who has
not installed it, and fails under CI (FLOWSCOPE_REQUIRE_SHARED_DATA=1), where scripts/test.sh installs them all.

pytest runs in a child process on the real tests with those modules shadowed as if they were not installed,
once as a user and once as CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

#: tests that need an optional dependency: the module where it is imported at collection, or the test itself
TARGETS = ["tests/test_otf2.py", "tests/test_darshan.py",
           "tests/test_hpc_corrupt.py::test_darshan_seeded_byte_flips_never_crash",
           "tests/test_hpc_corrupt.py::test_otf2_seeded_byte_flips_never_crash",
           "tests/test_hpc_corrupt.py::test_otf2_undefined_enum_value_in_definitions_is_a_trace_error",
           "tests/test_report.py::test_an_empty_run_renders_with_no_data_everywhere"]
SHADOWED = ["otf2", "darshan", "playwright"]


def _shadowed(tmp_path: Path, modules: list[str]) -> Path:
    """A folder that, first on PYTHONPATH, makes each of ``modules`` fail to import as it does where it is not
    installed (ModuleNotFoundError)."""
    d = tmp_path / "shadow"
    for name in modules:
        (d / name).mkdir(parents=True)
        message = f"No module named {name!r} (shadowed by the test)"
        (d / name / "__init__.py").write_text(f"raise ModuleNotFoundError({message!r}, name={name!r})\n")
    return d


def _pytest(shadow: Path, ci: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("FLOWSCOPE_REQUIRE_SHARED_DATA", "PYTHONPATH")}
    env.update(PYTHONPATH=str(shadow), COLUMNS="10000")  # summary lines in full
    if ci:
        env["FLOWSCOPE_REQUIRE_SHARED_DATA"] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs",
                          "--continue-on-collection-errors", *TARGETS],
                         check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return out.stdout + out.stderr


def test_a_missing_optional_dependency_skips_for_a_user_and_fails_in_ci(tmp_path):
    shadow = _shadowed(tmp_path, SHADOWED)
    user = _pytest(shadow, ci=False)
    # a user is told which module is missing and what it is for, test by test (or module by module)
    skipped = re.findall(r"^SKIPPED \[\d+\] (tests/[\w.]+):\d+: (\S+) cannot be imported \(", user, re.MULTILINE)
    assert {m.split(".")[0] for _, m in skipped} == set(SHADOWED), user[-3000:]
    assert re.search(r"^6 skipped in ", user, re.MULTILINE), user[-3000:]

    ci = _pytest(shadow, ci=True)
    assert "skipped" not in ci, ci[-3000:]
    failed = re.findall(r"^(?:FAILED|ERROR) (tests/\S+) - .*cannot be imported.*FLOWSCOPE_REQUIRE_SHARED_DATA=1 "
                        r"requires it", ci, re.MULTILINE)
    assert sorted(failed) == sorted(TARGETS), ci[-3000:]


def test_no_test_imports_an_optional_dependency_past_the_helper():
    """``pytest.importorskip`` and a private CI check would skip silently in CI: conftest.require_module instead."""
    offenders = [f"{p.name}:{i}" for p in sorted(TESTS.glob("*.py")) if p.name != Path(__file__).name
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if "importorskip(" in line or 'environ.get("CI")' in line]
    assert not offenders, offenders
