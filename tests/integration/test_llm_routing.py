"""Routing policies end to end through the proxies: a conversation stays on one replica
turn after turn, from either proxy; a session header does the same; a policy changes live,
with no replica restarted; a replica's KV-cache use reaches routers with its queue length.
The HAProxy side is tested against the real binary in tests/unit/test_haproxy_balance.py
and end to end by ``release_tests.llm_routing --smoke`` (tests/release)."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import ray
import requests

from tests.integration.conftest import app, deploy, dep_status, port_of, settled, wait_for

pytestmark = pytest.mark.integration

REPLICAS = 4


def affine(policy: str, **kwargs) -> dict:
    router = {"request_router_class": policy, **kwargs}
    return app("affine", "tests.integration.apps:Affine", args={"kv": 0.25},
               deployments=[{"name": "Affine", "num_replicas": REPLICAS,
                             "max_ongoing_requests": 4, "request_router_config": router}])


def chat(session: int, turns: int) -> bytes:
    messages = [{"role": "system", "content": "You are terse. " * 20},
                {"role": "user", "content": f"conversation {session} begins"}]
    for t in range(1, turns):
        messages += [{"role": "assistant", "content": f"answer {t}"},
                     {"role": "user", "content": f"question {t}"}]
    return json.dumps({"model": "m", "messages": messages}).encode()


def pid_of(client, body: bytes, headers: dict | None = None) -> int:
    response = requests.post(f"http://127.0.0.1:{port_of(client)}/affine", data=body,
                             headers={"connection": "close", **(headers or {})}, timeout=30)
    response.raise_for_status()
    return response.json()["pid"]


def running(policy: str):
    def check(status: dict) -> bool:
        return (settled("affine", REPLICAS, "Affine")(status)
                and dep_status(status, "affine", "Affine")["routing_policy"] == policy)
    return check


def proxies_know_every_replica(client) -> None:
    """Status shows a replica RUNNING when its shard has it; each proxy (two on the node)
    hears it on its next push, and until then hashes over a different ring."""
    lines = [f'fleetplane_router_replicas{{deployment="affine/Affine",proxy="{p}"}} '
             f'{float(REPLICAS)}' for p in ("0", "1")]
    deadline = time.monotonic() + 30
    while True:
        pid_of(client, b"warm")  # a router is made by its deployment's first request
        metrics = requests.get(f"http://127.0.0.1:{port_of(client)}/metrics", timeout=30).text
        if all(line in metrics for line in lines):
            return
        assert time.monotonic() < deadline, f"a proxy never heard {REPLICAS} replicas"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def routed(fleet):
    deploy(fleet, affine("prefix"))
    wait_for(fleet, running("prefix"), what="4 replicas with the prefix policy")
    proxies_know_every_replica(fleet)
    return fleet


def test_a_conversation_stays_on_one_replica_turn_after_turn(routed):
    # new connections each time: the node's two proxies both place them
    for session in range(6):
        assert len({pid_of(routed, chat(session, turns)) for turns in (1, 2, 3, 4)}) == 1
    spread = Counter(pid_of(routed, chat(session, 1)) for session in range(24))
    assert len(spread) >= 3  # conversations spread over the replicas


def test_a_body_without_a_prompt_is_placed_by_load(routed):
    pids = {pid_of(routed, b"not json") for _ in range(12)}
    assert len(pids) >= 2


def test_the_policy_changes_live_without_restarting_a_replica(routed):
    before = {r["replica_id"] for r in dep_status(routed.status(), "affine", "Affine")["replicas"]}
    deploy(routed, affine("session", request_router_kwargs={"session_header": "X-Chat"}))
    wait_for(routed, running("session"), what="the session policy")
    # status shows the policy when the shard has it; each proxy hears it on its next push
    first = {"X-Chat": "alice"}
    deadline = time.monotonic() + 30
    while len({pid_of(routed, b"{}", first) for _ in range(8)}) > 1:
        assert time.monotonic() < deadline, "the proxies never placed a session by its header"
    for name in ("alice", "bob", "carol"):
        assert len({pid_of(routed, b"{}", {"X-Chat": name}) for _ in range(8)}) == 1
    after = {r["replica_id"] for r in dep_status(routed.status(), "affine", "Affine")["replicas"]}
    assert after == before


def test_a_replicas_kv_cache_use_rides_on_its_queue_length(routed):
    replica = dep_status(routed.status(), "affine", "Affine")["replicas"][0]
    actor = ray.get_actor(replica["actor_name"], namespace="fleetplane")
    assert ray.get(actor.get_queue_len.remote(), timeout=30) == (0, 0.25)
