"""Simulator processes on 127.0.0.1 for the LLM health tests (no Ray).

``Sim`` starts ``python -m tests.llm_sim`` (or the proxy) on a free port, waits until it
answers, and drives it through its /sim endpoints. The module-scoped ``sim`` is shared by a
test module and reset before each test (``fresh_sim``), so each module pays one start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from replicas.llm_engine import free_port

REPO = Path(__file__).resolve().parents[2]
SIM_STEP_RATE_HZ = 200
CHECK_INTERVAL_S = 0.3  # many engine steps at SIM_STEP_RATE_HZ; short enough for fast tests


def sim_request(url: str, body: dict | None = None, timeout_s: float = 5.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


class Sim:
    def __init__(self, *args: str, module: str = "tests.llm_sim") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(self.port),
                                      *args], cwd=REPO, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited: {self.proc.stderr.read().decode()}")
            try:
                sim_request(self.url + "/v1/models", timeout_s=1.0)
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("simulator did not answer /v1/models")

    def stats(self) -> dict:
        return sim_request(self.url + "/sim/stats")

    def fault(self, mode: str) -> dict:
        return sim_request(self.url + "/sim/fault", {"mode": mode})

    def load(self, n: int, max_tokens: int = 1_000_000, prefill_steps: int = 0) -> dict:
        return sim_request(self.url + "/sim/load", {"n": n, "max_tokens": max_tokens,
                                                 "prefill_steps": prefill_steps})

    def reset(self) -> dict:
        return sim_request(self.url + "/sim/reset", {})

    def wait_exit(self, timeout_s: float = 10.0) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def sim():
    s = Sim("--model", "sim-model", "--slots", "2", "--step-rate-hz", str(SIM_STEP_RATE_HZ))
    yield s
    s.stop()


@pytest.fixture
def fresh_sim(sim: Sim) -> Sim:
    sim.reset()
    return sim


@pytest.fixture
def make_sim():
    """Start extra simulators (or proxies) inside a test; all stopped after it."""
    started: list[Sim] = []

    def make(*args: str, module: str = "tests.llm_sim") -> Sim:
        started.append(Sim(*args, module=module))
        return started[-1]

    yield make
    for s in started:
        s.stop()
