"""``fleetplane llm-health`` as a user runs it: a process, JSON on stdout, an exit code.

Real time on purpose: the CLI is another process that waits its interval with ``time.sleep``,
and nothing reaches across the process boundary to inject its clock or to step a simulator
between its reads. So the simulators here step on their own clock (``LIVE``:
LIVE_STEP_RATE_HZ), and the interval is the shortest that still holds many steps
(CLI_INTERVAL_S): a busy verdict needs one step in one interval, and a stuck one two intervals
without a step, which only the ``stuck`` fault gives (a server that missed one interval is
read again, not called stuck). The in-process test needs no interval at all.
"""

from __future__ import annotations

import json
import subprocess
import sys

from fleetplane.cli import main
from replicas.llm_engine import free_port
from tests.llm.conftest import LIVE_STEP_RATE_HZ, REPO

LIVE = ("--step-rate-hz", str(LIVE_STEP_RATE_HZ))
CLI_INTERVAL_S = 0.1  # about 20 steps at LIVE_STEP_RATE_HZ


def llm_health(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "fleetplane.cli", "llm-health",
                           "--interval-s", str(CLI_INTERVAL_S), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout


def test_json_per_url_and_exit_1_when_one_is_dead(make_sim, make_sims):
    idle, busy, prefill, blind = make_sims(("--slots", "2", *LIVE), ("--slots", "2", *LIVE),
                                           ("--slots", "2", *LIVE),
                                           ("--fault", "no-metrics", *LIVE))
    proxy = make_sim("--backend", idle.url, "--backend", busy.url, module="tests.llm_sim.proxy")
    busy.load(2)
    prefill.load(2, prefill_steps=100_000)  # minutes reading long prompts: steps, no token
    dead_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, out = llm_health("--json", idle.url, busy.url + "/v1", prefill.url, blind.url,
                           dead_url, "--proxy", proxy.url)
    reports = json.loads(out)
    assert code == 1
    assert [(r["url"], r["kind"], r["verdict"], r["healthy"], r["sent_test_request"])
            for r in reports] == [
        (idle.url, "backend", "idle", True, True),
        (busy.url, "backend", "busy", True, False),
        (prefill.url, "backend", "busy", True, False),
        (blind.url, "backend", "no-metrics", True, True),
        (dead_url, "backend", "dead", False, False),
        (proxy.url, "proxy", "no-metrics", True, False)]
    assert all({"url", "verdict", "healthy", "sent_test_request", "restarted"} <= r.keys()
               for r in reports)
    assert reports[2]["generation_tokens_per_s"] == 0.0
    assert busy.stats()["completions"] == prefill.stats()["completions"] == 0


def test_exit_0_when_all_are_healthy_and_1_when_one_is_stuck(make_sim):
    sim = make_sim("--slots", "2", *LIVE)
    sim.load(2)
    code, out = llm_health(sim.url)
    assert code == 0 and " busy healthy" in out
    sim.fault("stuck")
    code, out = llm_health(sim.url)
    assert code == 1 and " stuck UNHEALTHY" in out
    assert sim.stats()["completions"] == 0


def test_in_process_main_returns_the_same_exit_code(make_sim, capsys):
    sim = make_sim("--slots", "2")  # steps when told: idle, one read and a tiny answer
    # An idle server waits no interval; a short one only keeps a failure from taking long.
    assert main(["llm-health", "--interval-s", str(CLI_INTERVAL_S), sim.url]) == 0
    assert " idle healthy" in capsys.readouterr().out
