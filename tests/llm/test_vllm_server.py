"""``VLLMServer`` without Ray: its engine subprocess is the simulator, through the same
configurable command a real deployment uses for ``vllm serve``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from replicas.llm_engine import EngineStartError
from replicas.vllm_replica import EngineRequestError, EngineUnhealthy, VLLMServer
from tests.llm.conftest import CHECK_INTERVAL_S, REPO, SIM_STEP_RATE_HZ, pid_alive, sim_request

SIM_COMMAND = ["{python}", "-m", "tests.llm_sim", "--host", "{host}", "--port", "{port}",
               "--model", "{model}", "--slots", "{max_num_seqs}",
               "--step-rate-hz", str(SIM_STEP_RATE_HZ)]


@pytest.fixture
def server():
    os.chdir(REPO)  # the simulator is imported from the repo root, as in a Ray worker
    s = VLLMServer("sim-model", max_num_seqs=2, command=SIM_COMMAND,
                   health_interval_s=CHECK_INTERVAL_S, answer_timeout_s=2.0,
                   startup_timeout_s=30)
    yield s
    s.shutdown()


def run(coro, server: VLLMServer | None = None):
    async def main():
        try:
            return await coro
        finally:
            if server is not None:
                await server.close_connections()
    return asyncio.run(main())


def checks(server: VLLMServer, n: int) -> list[dict]:
    """n steps of the health check, one interval apart (what the background task does)."""
    out = []
    for i in range(n):
        if i:
            time.sleep(CHECK_INTERVAL_S)
        out.append(server.check_now())
    return out


def test_serves_completions_chat_models_and_http(server):
    text = run(server({"prompt": "hi", "max_tokens": 3}), server)["choices"][0]["text"]
    assert text == " tok tok tok"
    chat = run(server({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
               server)
    assert chat["choices"][0]["message"]["content"] == " tok tok"
    assert run(server.models(), server)["data"][0]["id"] == "sim-model"
    with pytest.raises(EngineRequestError) as e:
        run(server({"model": "other", "prompt": "x"}), server)
    assert e.value.status == 404


def test_http_requests_are_forwarded_below_the_route_prefix(server):
    from starlette.requests import Request

    body = json.dumps({"model": "sim-model", "prompt": "x", "max_tokens": 2}).encode()

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    def request(method: str, path: str) -> Request:
        return Request({"type": "http", "method": method, "path": path, "root_path": "/llm",
                        "query_string": b"", "headers": [(b"content-type", b"application/json")]},
                       receive)

    response = run(server(request("POST", "/llm/v1/completions")), server)
    assert response.status_code == 200
    assert json.loads(response.body)["usage"]["completion_tokens"] == 2
    assert run(server(request("GET", "/llm/metrics")), server).status_code == 404


def test_busy_full_engine_passes_every_check_without_a_test_request(server):
    url = server.statistics()["url"]
    sim_request(url + "/sim/load", {"n": 3, "max_tokens": 1_000_000})
    results = checks(server, 5)
    assert [r["verdict"] for r in results[1:]] == ["busy"] * 4
    run(server.check_health())  # does not raise
    stats = sim_request(url + "/sim/stats")
    assert stats["completions_while_full"] == 0 and stats["completions"] == 0


def test_stuck_engine_fails_its_checks_from_then_on(server):
    url = server.statistics()["url"]
    sim_request(url + "/sim/load", {"n": 2, "max_tokens": 1_000_000})
    sim_request(url + "/sim/fault", {"mode": "stuck"})  # before the first read
    results = checks(server, 3)  # a baseline, then two intervals without a step
    assert [r["decision"] for r in results] == ["keep", "keep", "restart"]
    with pytest.raises(EngineUnhealthy, match="stuck"):
        run(server.check_health())
    sim_request(url + "/sim/fault", {"mode": "none"})  # recovers: the decision stands
    time.sleep(CHECK_INTERVAL_S)
    assert server.check_now()["decision"] == "waiting"
    with pytest.raises(EngineUnhealthy):
        run(server.check_health())
    assert sim_request(url + "/sim/stats")["completions"] == 0


def test_engine_that_exits_is_dead(server):
    sim_request(server.statistics()["url"] + "/sim/fault", {"mode": "dead"})
    deadline = time.monotonic() + 10
    while server.statistics()["engine_exit_code"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(EngineUnhealthy, match="exited with status 17"):
        run(server.check_health())


def test_start_failure_names_the_command_and_its_last_output():
    fail = [sys.executable, "-c", "import sys; print('loading {model}'); "
            "sys.exit('CUDA error: out of memory')"]
    with pytest.raises(EngineStartError) as e:
        VLLMServer("m", command=fail, startup_timeout_s=30)
    assert "exited with status 1" in str(e.value)
    assert "loading m" in str(e.value) and "CUDA error: out of memory" in str(e.value)


def test_start_timeout_stops_the_engine():
    os.chdir(REPO)
    slow = SIM_COMMAND + ["--startup-delay-s", "30"]
    with pytest.raises(EngineStartError, match="did not answer within 0.5s"):
        VLLMServer("m", command=slow, startup_timeout_s=0.5)


OWNER = """
import os, sys, time
from replicas.vllm_replica import VLLMServer
s = VLLMServer("m", command=sys.argv[1:], health_interval_s=1)
print(s.statistics()["url"], flush=True)
time.sleep(600)
"""


def test_engine_dies_with_an_owner_killed_by_sigkill():
    owner = subprocess.Popen([sys.executable, "-c", OWNER, *SIM_COMMAND], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        url = owner.stdout.readline().strip()
        engine_pid = sim_request(url + "/sim/stats")["pid"]
        os.kill(owner.pid, signal.SIGKILL)  # what ray.kill does to a replica actor
        owner.wait()
        deadline = time.monotonic() + 15
        while pid_alive(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(engine_pid)
    finally:
        owner.kill()
        owner.stdout.close()


def test_engine_dies_with_its_guard_killed_by_sigkill(server):
    """What Ray does to a dead worker's direct children; the kernel takes the engine down."""
    engine_pid = sim_request(server.statistics()["url"] + "/sim/stats")["pid"]
    os.kill(server.statistics()["guard_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 15
    while pid_alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(engine_pid)
    with pytest.raises(EngineUnhealthy, match="dead"):
        run(server.check_health())


def test_shutdown_stops_the_engine(server):
    engine_pid = sim_request(server.statistics()["url"] + "/sim/stats")["pid"]
    server.shutdown()
    server.shutdown()  # idempotent
    assert not pid_alive(engine_pid)
