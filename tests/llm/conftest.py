"""Simulator processes on 127.0.0.1 for the LLM health tests (no Ray).

``Sim`` starts ``python -m tests.llm_sim`` (or the proxy) on a free port, waits until it
answers, and drives it through its /sim endpoints. The module-scoped ``sim`` is shared by a
test module and reset before each test (``fresh_sim``), so each module pays one start.

Simulators started here take engine steps only when a test asks (``--step-rate-hz 0`` and
``Sim.step``), and the checker's interval passes on a ``FakeClock``: ``Interval`` is the
checker's injected sleep. No test sleeps for engine steps; ``wait_until`` polls another
process's condition (it answers, it exited) under a deadline. Only the CLI tests, which run
the checker in another process, use simulators that step on their own clock
(``LIVE_STEP_RATE_HZ``, see test_cli.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

import pytest

from controlplane.clock import FakeClock
from replicas.llm_engine import free_port

REPO = Path(__file__).resolve().parents[2]
MANUAL_STEPS = ("--step-rate-hz", "0")  # steps only when a test asks for them
INTERVAL_S = 40.0           # the production interval: it passes on a fake clock, so it is free
STEPS_PER_INTERVAL = 320    # seed 001's GB10 makes about 8 steps a second
STEPS_PER_S = STEPS_PER_INTERVAL / INTERVAL_S
LIVE_STEP_RATE_HZ = 200     # simulators stepping on their own (real) clock: test_cli.py only


def sim_request(url: str, body: dict | None = None, timeout_s: float = 5.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def step_sim(url: str, n: int) -> int:
    """Ask the simulator at ``url`` for ``n`` engine steps now; the steps it took."""
    return sim_request(f"{url}/sim/step?n={n}", {})["stepped"]


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    """Poll a condition of another process until it holds; fail naming it at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.02)


class Sim:
    def __init__(self, *args: str, module: str = "tests.llm_sim") -> None:
        """Starts the process; ``wait_ready`` waits until it answers."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(self.port),
                                      *args], cwd=REPO, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)

    def wait_ready(self, timeout_s: float = 30.0) -> "Sim":
        def answers() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited: {self.proc.stderr.read().decode()}")
            try:
                sim_request(self.url + "/v1/models", timeout_s=1.0)
                return True
            except OSError:
                return False

        wait_until(answers, f"{' '.join(self.proc.args[2:])} to answer /v1/models", timeout_s)
        return self

    def stats(self) -> dict:
        return sim_request(self.url + "/sim/stats")

    def fault(self, mode: str) -> dict:
        return sim_request(self.url + "/sim/fault", {"mode": mode})

    def load(self, n: int, max_tokens: int = 1_000_000, prefill_steps: int = 0) -> dict:
        return sim_request(self.url + "/sim/load", {"n": n, "max_tokens": max_tokens,
                                                 "prefill_steps": prefill_steps})

    def step(self, n: int) -> int:
        return step_sim(self.url, n)

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


class Interval:
    """The checker's injected sleep: the fake clock moves, then the simulator is asked for
    ``steps`` engine steps; ``stepped`` records how many it took in each interval."""

    def __init__(self, url: str, clock: FakeClock, steps: int = STEPS_PER_INTERVAL) -> None:
        self.url, self.clock, self.steps = url, clock, steps
        self.stepped: list[int] = []

    def __call__(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.stepped.append(step_sim(self.url, self.steps))


def pid_alive(pid: int) -> bool:
    """False once the process has exited, reaped or not: an orphan stays a zombie until
    init reaps it, which a container's init may do only a second or more later."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # "PID (COMM) STATE ...", Linux only
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # reaped just now, or no /proc to ask


@pytest.fixture(scope="module")
def sim():
    s = Sim("--model", "sim-model", "--slots", "2", *MANUAL_STEPS).wait_ready()
    yield s
    s.stop()


@pytest.fixture
def fresh_sim(sim: Sim) -> Sim:
    sim.reset()
    return sim


@pytest.fixture
def make_sims():
    """Start simulators (or proxies) inside a test, all at once, and return them ready, in
    order; each argument is one's argument list. Simulators step only when asked unless their
    arguments give a ``--step-rate-hz`` (the last one counts). All stopped after the test."""
    started: list[Sim] = []

    def make(*arg_lists: tuple[str, ...], module: str = "tests.llm_sim") -> list[Sim]:
        manual = MANUAL_STEPS if module == "tests.llm_sim" else ()
        sims = [Sim(*manual, *args, module=module) for args in arg_lists]
        started.extend(sims)
        return [s.wait_ready() for s in sims]

    yield make
    for s in started:  # all at once: each takes a moment to shut down
        if s.proc.poll() is None:
            s.proc.terminate()
    for s in started:
        s.stop()


@pytest.fixture
def make_sim(make_sims):
    """One simulator (or proxy), as ``make_sims`` starts them."""
    return lambda *args, module="tests.llm_sim": make_sims(args, module=module)[0]
