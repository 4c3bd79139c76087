"""``VLLMServer`` without Ray: its engine subprocess is the simulator, through the same
configurable command a real deployment uses for ``vllm serve``.

The simulator steps only when told, and the server's clock is a ``FakeClock``: a test plays
the health task's interval itself (``pass_interval``: the clock moves one interval, the engine
is asked for that interval's steps) and calls ``check_now``, as the background task would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

from controlplane.clock import FakeClock
from replicas.llm_engine import EngineStartError
from replicas.vllm_replica import EngineRequestError, EngineUnhealthy, VLLMServer
from tests.llm.conftest import (INTERVAL_S, MANUAL_STEPS, REPO, STEPS_PER_INTERVAL, STEPS_PER_S,
                                pid_alive, sim_request, step_sim, wait_until)

SIM_COMMAND = ["{python}", "-m", "tests.llm_sim", "--host", "{host}", "--port", "{port}",
               "--model", "{model}", "--slots", "{max_num_seqs}", *MANUAL_STEPS]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_s=0.0)


@pytest.fixture
def loop():
    """One event loop for a test's traffic, as a replica serves its user object on one loop
    for its life: the engine client's HTTP session belongs to the loop that opened it."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture
def server(clock, loop):
    os.chdir(REPO)  # the simulator is imported from the repo root, as in a Ray worker
    # The fake clock never reaches the start's deadline: a start that hangs (the simulator
    # answers or exits within a second) is ended by pytest's timeout instead.
    s = VLLMServer("sim-model", max_num_seqs=2, command=SIM_COMMAND,
                   health_interval_s=INTERVAL_S, answer_timeout_s=2.0,
                   startup_timeout_s=30, clock=clock)
    yield s
    loop.run(stop(s))


async def stop(server: VLLMServer) -> None:
    """A replica's stop, on the server's loop: ``shutdown()``, then what it left to run
    there (closing the HTTP session to the engine) runs to its end."""
    server.shutdown()
    await asyncio.gather(*asyncio.all_tasks() - {asyncio.current_task()}, return_exceptions=True)


def check_health(server: VLLMServer) -> None:
    """``check_health`` on a loop of its own: the background check it starts ends with that
    loop, so the test alone takes the check's steps (``check_now``)."""
    asyncio.run(server.check_health())


def pass_interval(server: VLLMServer, clock: FakeClock) -> int:
    """One health interval: the clock moves, the engine is asked for its steps (the number
    it took comes back)."""
    clock.advance(INTERVAL_S)
    return step_sim(server.statistics()["url"], STEPS_PER_INTERVAL)


def checks(server: VLLMServer, clock: FakeClock, n: int) -> tuple[list[dict], list[int]]:
    """n steps of the health check, one interval apart (what the background task does), and
    the engine steps taken in each interval."""
    results, stepped = [server.check_now()], []
    for _ in range(n - 1):
        stepped.append(pass_interval(server, clock))
        results.append(server.check_now())
    return results, stepped


def test_serves_completions_chat_models_and_http(server, loop):
    text = loop.run(server({"prompt": "hi", "max_tokens": 3}))["choices"][0]["text"]
    assert text == " tok tok tok"
    chat = loop.run(server({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
    assert chat["choices"][0]["message"]["content"] == " tok tok"
    assert loop.run(server.models())["data"][0]["id"] == "sim-model"
    with pytest.raises(EngineRequestError) as e:
        loop.run(server({"model": "other", "prompt": "x"}))
    assert e.value.status == 404


def test_http_requests_are_forwarded_below_the_route_prefix(server, loop):
    from starlette.requests import Request

    body = json.dumps({"model": "sim-model", "prompt": "x", "max_tokens": 2}).encode()

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    def request(method: str, path: str) -> Request:
        return Request({"type": "http", "method": method, "path": path, "root_path": "/llm",
                        "query_string": b"", "headers": [(b"content-type", b"application/json")]},
                       receive)

    response = loop.run(server(request("POST", "/llm/v1/completions")))
    assert response.status_code == 200
    assert json.loads(response.body)["usage"]["completion_tokens"] == 2
    assert loop.run(server(request("GET", "/llm/metrics"))).status_code == 404


def test_a_streamed_completion_is_forwarded_as_server_sent_events(server, loop):
    from starlette.requests import Request

    body = json.dumps({"model": "sim-model", "prompt": "x", "max_tokens": 3,
                       "stream": True}).encode()

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def streamed() -> tuple[int, str, str]:
        response = await server(Request(
            {"type": "http", "method": "POST", "path": "/llm/v1/completions",
             "root_path": "/llm", "query_string": b"",
             "headers": [(b"content-type", b"application/json")]}, receive))
        chunks = [c async for c in response.body_iterator]
        return response.status_code, response.media_type, b"".join(chunks).decode()

    status, media_type, text = loop.run(streamed())
    assert (status, media_type) == (200, "text/event-stream")
    events = [line[len("data: "):] for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == " tok" * 3


def test_busy_full_engine_passes_every_check_without_a_test_request(server, clock):
    url = server.statistics()["url"]
    sim_request(url + "/sim/load", {"n": 3, "max_tokens": 1_000_000})
    results, stepped = checks(server, clock, 5)
    assert [r["verdict"] for r in results] == [None] + ["busy"] * 4  # a baseline first
    assert stepped == [STEPS_PER_INTERVAL] * 4
    assert {r["report"]["steps_per_s"] for r in results[1:]} == {STEPS_PER_S}
    assert [r["decision"] for r in results] == ["keep"] * 5
    check_health(server)  # does not raise
    stats = sim_request(url + "/sim/stats")
    assert stats["completions_while_full"] == 0 and stats["completions"] == 0


def test_stuck_engine_fails_its_checks_from_then_on(server, clock):
    url = server.statistics()["url"]
    sim_request(url + "/sim/load", {"n": 2, "max_tokens": 1_000_000})
    sim_request(url + "/sim/fault", {"mode": "stuck"})  # before the first read
    results, stepped = checks(server, clock, 3)  # a baseline, then two intervals
    assert stepped == [0, 0]  # asked to step in both intervals, it took none
    assert [r["decision"] for r in results] == ["keep", "keep", "restart"]
    assert clock.monotonic() == 2 * INTERVAL_S
    with pytest.raises(EngineUnhealthy, match="stuck"):
        check_health(server)
    sim_request(url + "/sim/fault", {"mode": "none"})  # recovers: the decision stands
    assert pass_interval(server, clock) == STEPS_PER_INTERVAL
    assert server.check_now()["decision"] == "waiting"
    with pytest.raises(EngineUnhealthy):
        check_health(server)
    assert sim_request(url + "/sim/stats")["completions"] == 0


def test_engine_that_exits_is_dead(server):
    sim_request(server.statistics()["url"] + "/sim/fault", {"mode": "dead"})
    wait_until(lambda: server.statistics()["engine_exit_code"] is not None,
               "the engine to exit after the dead fault")
    with pytest.raises(EngineUnhealthy, match="exited with status 17"):
        check_health(server)


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
import signal, sys
from replicas.vllm_replica import VLLMServer
s = VLLMServer("m", command=sys.argv[1:], health_interval_s=1)
print(s.statistics()["url"], flush=True)
signal.pause()  # until killed
"""


def test_engine_dies_with_an_owner_killed_by_sigkill():
    owner = subprocess.Popen([sys.executable, "-c", OWNER, *SIM_COMMAND], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        url = owner.stdout.readline().strip()
        engine_pid = sim_request(url + "/sim/stats")["pid"]
        os.kill(owner.pid, signal.SIGKILL)  # what ray.kill does to a replica actor
        owner.wait()
        wait_until(lambda: not pid_alive(engine_pid),
                   f"engine pid {engine_pid} to die with its SIGKILLed owner")
    finally:
        owner.kill()
        owner.stdout.close()


def test_engine_dies_with_its_guard_killed_by_sigkill(server):
    """What Ray does to a dead worker's direct children; the kernel takes the engine down."""
    engine_pid = sim_request(server.statistics()["url"] + "/sim/stats")["pid"]
    os.kill(server.statistics()["guard_pid"], signal.SIGKILL)
    wait_until(lambda: not pid_alive(engine_pid),
               f"engine pid {engine_pid} to die with its SIGKILLed guard")
    with pytest.raises(EngineUnhealthy, match="dead"):
        check_health(server)


def test_shutdown_stops_the_engine(server):
    engine_pid = sim_request(server.statistics()["url"] + "/sim/stats")["pid"]
    server.shutdown()
    server.shutdown()  # idempotent
    assert not pid_alive(engine_pid)
