"""LLM replicas under the control plane: ``VLLMServer`` on the simulator, on a real local Ray.

The replica runs the simulator through the same configurable command that runs
``vllm serve`` on GB10 nodes, without the GB10 resource (``num_cpus: 0`` as every test app).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import app, call, dep_status, deploy, settled, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SIM_COMMAND = ["{python}", "-m", "tests.llm_sim", "--host", "{host}", "--port", "{port}",
               "--model", "{model}", "--slots", "{max_num_seqs}", "--step-rate-hz", "200"]
DEP = "VLLMServer"


def llm_app(name: str, *extra_args: str) -> dict:
    args = {"model": "sim-model", "max_num_seqs": 2, "command": SIM_COMMAND,
            "extra_args": list(extra_args),
            "health_interval_s": 0.3, "answer_timeout_s": 2.0, "startup_timeout_s": 60,
            "env": {"PYTHONPATH": str(REPO)}}
    return app(name, "replicas.vllm_replica:VLLMServer", args=args, deployments=[
        {"name": DEP, "num_replicas": 1, "max_ongoing_requests": 8,
         "health_check_period_s": 0.5}])


def sim(url: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def only_replica(status: dict, name: str) -> dict:
    (replica,) = dep_status(status, name, DEP)["replicas"]
    return replica


def wait_checks(replica: dict, more_than: int, timeout_s: float = 30.0) -> dict:
    """Until the replica's health check has run more than ``more_than`` times."""
    deadline = time.monotonic() + timeout_s
    while (stats := call(replica, method="statistics"))["checks"] <= more_than:
        if time.monotonic() > deadline:
            raise AssertionError(f"health check did not run; last statistics {stats}")
        time.sleep(0.1)
    return stats


def test_llm_deployment_serves_and_a_full_engine_is_not_replaced(fleet):
    deploy(fleet, llm_app("llm"))
    replica = only_replica(wait_for(fleet, settled("llm", 1, DEP), what="LLM replica"), "llm")
    answer = call(replica, {"prompt": "hello", "max_tokens": 3})
    assert answer["choices"][0]["text"] == " tok tok tok"
    url = call(replica, method="statistics")["url"]

    sim(url, "/sim/load", {"n": 3, "max_tokens": 10_000_000})  # every slot, one waiting
    before = call(replica, method="statistics")["checks"]
    stats = wait_checks(replica, before + 10)  # ten checks while full, > 3 health periods
    assert stats["verdict"] == "busy" and not stats["restart_decided"]
    status = fleet.status()
    assert only_replica(status, "llm")["replica_id"] == replica["replica_id"]
    assert only_replica(status, "llm")["healthy"] is True
    counters = sim(url, "/sim/stats")
    assert counters["running"] == 2 and counters["completions_while_full"] == 0


def test_stuck_engine_gets_its_replica_replaced_and_the_engine_stopped(fleet):
    deploy(fleet, llm_app("llmstuck"))
    old = only_replica(wait_for(fleet, settled("llmstuck", 1, DEP)), "llmstuck")
    url = call(old, method="statistics")["url"]
    engine_pid = sim(url, "/sim/stats")["pid"]
    sim(url, "/sim/load", {"n": 2, "max_tokens": 10_000_000})
    sim(url, "/sim/fault", {"mode": "stuck"})

    status = wait_for(fleet, lambda s: settled("llmstuck", 1, DEP)(s) and only_replica(
        s, "llmstuck")["replica_id"] != old["replica_id"], what="replacement of the stuck one")
    new = only_replica(status, "llmstuck")
    assert call(new, {"prompt": "again", "max_tokens": 1})["choices"][0]["text"] == " tok"
    deadline = time.monotonic() + 20  # the old engine went with its replica (its guard)
    while _alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(engine_pid)


def test_engine_without_metrics_is_judged_by_answers_and_replaced_when_it_dies(fleet):
    deploy(fleet, llm_app("llmblind", "--fault", "no-metrics"))
    old = only_replica(wait_for(fleet, settled("llmblind", 1, DEP)), "llmblind")
    stats = wait_checks(old, 2)
    assert stats["verdict"] == "no-metrics" and not stats["restart_decided"]
    assert stats["last_check"]["report"]["sent_test_request"] is True
    sim(stats["url"], "/sim/fault", {"mode": "dead"})  # the engine process exits

    status = wait_for(fleet, lambda s: settled("llmblind", 1, DEP)(s) and only_replica(
        s, "llmblind")["replica_id"] != old["replica_id"], what="replacement of the dead one")
    new = only_replica(status, "llmblind")
    assert call(new, {"prompt": "x", "max_tokens": 1})["choices"][0]["text"] == " tok"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_loading_engine_says_so_in_status_under_its_derived_start_deadline(fleet):
    """The engine takes 4 s to load: meanwhile status shows the replica's own word on its
    start, and the deadline the engine's startup_timeout_s (60) set: 60 + 60 s."""
    deploy(fleet, llm_app("llmslow", "--startup-delay-s", "4"))
    said = wait_for(fleet, lambda s: "loading the model" in (only_replica(
        s, "llmslow")["message"] if dep_status(s, "llmslow", DEP)["replicas"] else ""),
        timeout_s=30, what="the loading replica's word in status")
    row = only_replica(said, "llmslow")
    assert row["state"] == "STARTING" and "gives up after 120s and retries" in row["message"]
    status = wait_for(fleet, settled("llmslow", 1, DEP), what="the slow replica RUNNING")
    assert only_replica(status, "llmslow")["message"] == ""


def test_vllm_from_its_own_environment_runs_through_the_default_command_shape(fleet,
                                                                              tmp_path):
    """LLM.md's separate-environment form: ``command`` names another environment's
    ``bin/vllm`` (not on the replica's PATH), with vLLM's own ``serve`` arguments; here that
    ``vllm`` is a script running the simulator behind vLLM's command line."""
    import sys

    vllm = tmp_path / "vllm-env" / "bin" / "vllm"
    vllm.parent.mkdir(parents=True)
    vllm.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.llm_sim.vllm_cli \"$@\"\n")
    vllm.chmod(0o755)
    from replicas.llm_engine import DEFAULT_COMMAND

    command = [str(vllm), *DEFAULT_COMMAND[1:]]  # vllm serve {model} --host ... as shipped
    application = llm_app("llmvenv")
    application["args"]["command"] = command
    deploy(fleet, application)
    replica = only_replica(wait_for(fleet, settled("llmvenv", 1, DEP), what="vLLM from its "
                                    "own environment"), "llmvenv")
    answer = call(replica, {"prompt": "hello", "max_tokens": 2})
    assert answer["choices"][0]["text"] == " tok tok"
    assert wait_checks(replica, 0)["verdict"] in ("idle", "busy")  # its /metrics are read
