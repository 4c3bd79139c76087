"""The 3-node cluster with GCS fault tolerance that the head-loss drills run on
(``release_tests.head_loss``, ``release_tests.chaos --kinds head,...``), through
``fleetplane start-local-cluster``: head 127.0.0.2, workers .3 and .4, the head's GCS on a
real Redis; recorded in ``FLEETPLANE_STATE_DIR`` (set it first). ``release_tests.llm_routing``
starts a 2-node one without Redis (two HAProxies)."""

from __future__ import annotations

import os
import subprocess
import sys

from release_tests.results import ROOT

ADDRESS = "127.0.0.2:6379"


def fleetplane(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``fleetplane ARGS`` from the repo root, its output captured."""
    return subprocess.run([sys.executable, "-m", "fleetplane.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


def start(nodes: int = 3, redis: bool = True) -> None:
    """Its head turns Ray's token authentication on: every process that joins says so
    (this one's environment, which the drills' children inherit)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    started = fleetplane("start-local-cluster", "--nodes", str(nodes),
                         *(["--redis"] if redis else []))
    if started.returncode != 0:
        raise SystemExit(f"start-local-cluster failed:\n{started.stdout}{started.stderr}")


def stop() -> None:
    fleetplane("start-local-cluster", "--stop")


def restart_head(down_s: float) -> subprocess.CompletedProcess:
    """The head's Ray processes SIGKILLed, ``down_s`` down, started again on the Redis."""
    return fleetplane("start-local-cluster", "--restart-head", "--down-s", f"{down_s:g}",
                      timeout_s=down_s + 200)
