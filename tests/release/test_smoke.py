"""Every release test runs, in a smoke mode: the same code as the measurement, on a tiny
bounded load, ending with its results file (command, commit, date, machine). Nothing is
timed here: a smoke run proves the harness still works, so no release test rots unseen
(two had: one raised a TypeError, one could not write its results in a fresh clone).

Each runs as its users run it, ``python -m release_tests.NAME --smoke``, in its own
process, with ``FLEETPLANE_RESULTS_DIR`` pointing at a temporary folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "release_tests"
NOT_RELEASE_TESTS = {"serve_baseline"}  # a server http_bench starts, not a measurement


def release_tests() -> list[str]:
    return sorted(p.stem for p in RELEASE.glob("*.py")
                  if '__name__ == "__main__"' in p.read_text() and p.stem not in NOT_RELEASE_TESTS)


def test_every_release_test_has_a_smoke_mode():
    assert [name for name in release_tests()
            if '"--smoke"' not in (RELEASE / f"{name}.py").read_text()] == []


@pytest.mark.parametrize("name", release_tests())
def test_the_smoke_run_ends_with_its_results(name, tmp_path):
    env = {**os.environ, "FLEETPLANE_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", f"release_tests.{name}", "--smoke"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    own = tmp_path / "smoke" / "measured" / f"{name}.json"
    assert own.exists(), f"{name} wrote no results file: {proc.stdout[-2000:]}"
    result = json.loads(own.read_text())
    assert result["command"].startswith(f"python -m release_tests.{name} --smoke")
    assert result["commit"] and result["date"] and result["machine"]["cores"] >= 1
    assert result["summary"]
