"""tests/parallel.py: under pytest -n, `timing` tests are skipped with the reason, not run
beside other tests (`make test` runs them alone afterwards)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

SUITE = '''
import pytest

@pytest.mark.timing
def test_measures():
    pass

def test_plain():
    pass
'''


def _pytest(tmp_path, *args: str) -> str:
    (tmp_path / "test_two.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    timing: wall-clock\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.parallel", "-p", "no:cacheprovider",
                           "-rs", "-q", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_under_xdist_a_timing_test_is_skipped_saying_why(tmp_path):
    out = _pytest(tmp_path, "-n", "2")
    assert "1 passed, 1 skipped" in out and "a timing test measures wall-clock time and runs alone" in out


def test_without_xdist_it_runs(tmp_path):
    assert "2 passed" in _pytest(tmp_path)
