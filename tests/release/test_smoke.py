"""Every release test runs, in a smoke mode: the same code as the measurement, on a tiny
bounded load, ending with its results file (command, commit, date, machine). Nothing is
timed here: a smoke run proves the harness still works, so no release test rots unseen
(two had: one raised a TypeError, one could not write its results in a fresh clone).

Each runs as its users run it, ``python -m release_tests.NAME --smoke``, in its own
process, with ``FLEETPLANE_RESULTS_DIR`` and ``FLEETPLANE_STATE_DIR`` pointing at a folder
of its own. Much of a smoke run is waiting (a Ray starting, a replica draining), so they
run in ``LANES``, side by side (with three lanes: 178 s, where one after another took 332 s on this
2-core machine; five lanes took longer), each lane's runs one after another. A lane holds
what must not overlap: the runs that start Ray Serve (one Serve at a time), and runs that
serve on the same port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "release_tests"
NOT_RELEASE_TESTS = {"serve_baseline"}  # a server http_bench starts, not a measurement
TIMEOUT_S = 240
LANES = [
    # Ray Serve, one at a time (8001-8003, 8101-8102), and fleetplane (8002, 8040, 8020, 8102)
    # and LLM routing on simulated engines (8050)
    ["http_bench", "serve_compat_diff", "retry_after_http", "overload_idle", "llm_routing"],
    # the kills (8011); the abuse (a free port); no Ray
    ["chaos", "http_abuse", "scale", "scale_compare", "retry_after_eval", "llm_day",
     "llm_autoscale", "llm_autoscale_frontier"],
    # 3-node clusters on 127.0.0.2-4 (the head-loss one with Redis), one after the other
    ["node_churn", "head_loss"],
    # haproxy drains (8012), the soak (8031), the demo (8000, twice), simulated replicas, the report
    ["drain_events", "soak", "startup", "serve_tools", "health_push", "report"],
]


def release_tests() -> list[str]:
    return sorted(p.stem for p in RELEASE.glob("*.py")
                  if '__name__ == "__main__"' in p.read_text() and p.stem not in NOT_RELEASE_TESTS)


def test_every_release_test_has_a_smoke_mode():
    assert [name for name in release_tests()
            if '"--smoke"' not in (RELEASE / f"{name}.py").read_text()] == []


def test_every_release_test_is_in_one_lane():
    laned = [name for lane in LANES for name in lane]
    assert sorted(laned) == release_tests() and len(set(laned)) == len(laned)


def smoke_run(name: str, folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLEETPLANE_RESULTS_DIR": str(folder),
           "FLEETPLANE_STATE_DIR": str(folder / "state")}
    return subprocess.run([sys.executable, "-m", f"release_tests.{name}", "--smoke"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> dict[str, Future]:
    """Every lane started at once; each run's (process, folder) as a future, by name."""
    runs = {name: Future() for lane in LANES for name in lane}

    def lane(names: list[str]) -> None:
        for name in names:
            folder = tmp_path_factory.mktemp(name)
            try:
                runs[name].set_result((smoke_run(name, folder), folder))
            except BaseException as e:  # a timeout: this run failed, the lane goes on
                runs[name].set_exception(e)

    with ThreadPoolExecutor(len(LANES)) as pool:
        for names in LANES:
            pool.submit(lane, names)
        yield runs
        for future in runs.values():  # nothing left running when the module ends
            future.exception()


@pytest.mark.parametrize("name", release_tests())
def test_the_smoke_run_ends_with_its_results(name, smoke_runs):
    proc, folder = smoke_runs[name].result()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    own = folder / "smoke" / "measured" / f"{name}.json"
    assert own.exists(), f"{name} wrote no results file: {proc.stdout[-2000:]}"
    result = json.loads(own.read_text())
    assert result["command"].startswith(f"python -m release_tests.{name} --smoke")
    assert result["commit"] and result["date"] and result["machine"]["cores"] >= 1
    assert result["summary"]
