"""``fleetplane llm-health`` as a user runs it: a process, JSON on stdout, an exit code."""

from __future__ import annotations

import json
import subprocess
import sys

from fleetplane.cli import main
from replicas.llm_engine import free_port
from tests.llm.conftest import CHECK_INTERVAL_S, REPO


def llm_health(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "fleetplane.cli", "llm-health",
                           "--interval-s", str(CHECK_INTERVAL_S), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout


def test_json_per_url_and_exit_1_when_one_is_dead(make_sim):
    idle, busy, prefill, blind = (make_sim("--slots", "2"), make_sim("--slots", "2"),
                                  make_sim("--slots", "2"), make_sim("--fault", "no-metrics"))
    proxy = make_sim("--backend", idle.url, "--backend", busy.url, module="tests.llm_sim.proxy")
    busy.load(2)
    prefill.load(2, prefill_steps=100_000)  # reading long prompts: steps, no output token
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
    sim = make_sim("--slots", "2")
    sim.load(2)
    code, out = llm_health(sim.url)
    assert code == 0 and " busy healthy" in out
    sim.fault("stuck")
    code, out = llm_health(sim.url)
    assert code == 1 and " stuck UNHEALTHY" in out
    assert sim.stats()["completions"] == 0


def test_in_process_main_returns_the_same_exit_code(make_sim, capsys):
    sim = make_sim("--slots", "2")
    assert main(["llm-health", "--interval-s", str(CHECK_INTERVAL_S), sim.url]) == 0
    assert " idle healthy" in capsys.readouterr().out
