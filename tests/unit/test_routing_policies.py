"""The routing policies in a router (``request_router_config``): round robin, KV-aware
power of two choices, prefix affinity with this router's index, session affinity; the key
each request carries. Virtual time, a fake transport; no Ray."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from pydantic import BaseModel

from controlplane.routing.policies import Affinity, RoutingPolicy, kv_score
from controlplane.routing.prefix_affinity import BLOCK_CHARS, HashRing
from controlplane.routing.prefix_index import PrefixIndex
from tests.unit.router_fakes import Harness, settle

IDS = [f"r{i}" for i in range(4)]


def placed(h: Harness, requests: list[tuple[str, Affinity | None]]) -> list[str]:
    """Send each request (left running) one after another; where each went."""
    async def main() -> list[str]:
        for name, affinity in requests:
            asyncio.get_running_loop().create_task(h.router.assign(name, affinity=affinity))
            await settle()
        return [h.transport.where(name) for name, _ in requests]

    return h.run(main)


def test_round_robin_takes_each_replica_in_turn_and_passes_over_a_full_one():
    h = Harness()
    h.make(replicas=4, max_ongoing=2, policy=RoutingPolicy("round_robin"))
    assert placed(h, [(f"q{i}", None) for i in range(8)]) == IDS + IDS
    h2 = Harness()
    h2.make(replicas=3, max_ongoing=1, policy=RoutingPolicy("round_robin"))
    h2.transport.others["r1"] = 1  # full, as a probe will say... once probed

    async def main() -> list[str]:
        h2.router._cache.probe_answered("r1", 1, h2.clock.monotonic())
        for i in range(2):
            asyncio.get_running_loop().create_task(h2.router.assign(f"q{i}"))
            await settle()
        return [h2.transport.where(f"q{i}") for i in range(2)]

    assert h2.run(main) == ["r0", "r2"]


def test_kv_load_passes_over_an_engine_near_preemption():
    h = Harness()
    h.make(replicas=2, max_ongoing=8, policy=RoutingPolicy("kv_load"))
    h.transport.kv.update({"r0": 0.95, "r1": 0.1})

    async def main() -> list[str]:
        for i in range(2):  # the first two teach the router both replicas' KV use
            asyncio.get_running_loop().create_task(h.router.assign(f"warm{i}"))
            await settle()
        for name in ("warm0", "warm1"):
            h.transport.finish(name)
        await settle()
        for i in range(4):
            asyncio.get_running_loop().create_task(h.router.assign(f"q{i}"))
            await settle()
        return [h.transport.where(f"q{i}") for i in range(4)]

    # r0's 0.95 x 8 = 7.6 outweighs up to 7 more requests on r1
    assert h.run(main) == ["r1"] * 4
    p2c = Harness()
    p2c.make(replicas=2, max_ongoing=8)  # the same without KV: both replicas take requests
    assert set(placed(p2c, [(f"q{i}", None) for i in range(4)])) == {"r0", "r1"}


def test_under_pressure_kv_use_is_not_weighed():
    """A stale use breaking ties would send every router's ties to one engine."""
    assert kv_score(2, 0.5, 8) == kv_score(2, 0.1, 8) == 2 < kv_score(3, 0.0, 8)
    assert kv_score(0, 0.95, 8) > kv_score(7, 0.1, 8)


def conversation(turns: int, start: str = "system: shared\nuser: hello\n") -> Affinity:
    text = start + "".join(f"turn {t} " * 40 for t in range(turns))
    from controlplane.routing.prefix_affinity import block_keys
    return Affinity(start, block_keys(text), len(start) // BLOCK_CHARS, continued=turns > 0)


def test_a_conversation_the_bound_spilled_follows_its_blocks_in_this_router():
    h = Harness()
    h.make(replicas=4, max_ongoing=8, policy=RoutingPolicy("prefix"))
    walk = list(HashRing(IDS).walk("system: shared\nuser: hello\n"))

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        # two requests already on the start's replica: the bound (2, its floor, while
        # m <= 5) spills turn 1 to the next on the walk
        for name, affinity in (("other", Affinity("system: shared\nuser: hello\n")),
                               ("other2", Affinity("system: shared\nuser: hello\n")),
                               ("turn1", conversation(3))):
            loop.create_task(h.router.assign(name, affinity=affinity))
            await settle()
        for name in ("other", "other2", "turn1"):
            h.transport.finish(name)
        await settle()
        loop.create_task(h.router.assign("turn2", affinity=conversation(6)))
        await settle()
        return [h.transport.where(name) for name in ("other", "other2", "turn1", "turn2")]

    # the ring alone would send turn 2 to walk[0] (idle again); the index knows better
    assert h.run(main) == [walk[0], walk[0], walk[1], walk[1]]


def test_a_fresh_router_places_a_conversation_on_its_starts_replica():
    h = Harness()
    h.make(replicas=4, max_ongoing=8, policy=RoutingPolicy("prefix"))
    home = next(HashRing(IDS).walk("system: shared\nuser: hello\n"))
    assert placed(h, [("turn2", conversation(6))]) == [home]


def test_prefix_requests_over_the_bound_go_by_load_and_keep_the_fleet_even():
    h = Harness()
    h.make(replicas=4, max_ongoing=64, policy=RoutingPolicy("prefix"))
    where = placed(h, [(f"q{i}", Affinity("one hot system prompt")) for i in range(40)])
    counts = Counter(where)
    assert max(counts.values()) <= 2.0 * (40 / 4) + 1  # the bounded load (factor 2)


def test_the_session_policy_reads_its_header_and_nothing_else():
    policy = RoutingPolicy("session", session_header="X-Chat")
    assert policy.of_http([(b"x-chat", b"abc")], b"{}") == Affinity("abc")
    assert policy.of_http([(b"x-other", b"abc")], b'{"prompt": "p"}') is None
    assert RoutingPolicy("p2c").of_http([(b"x-session-id", b"abc")], b'{"prompt": "p"}') is None


def test_a_prompt_policy_keys_http_bodies_and_handle_calls_alike():
    policy = RoutingPolicy("prefix")
    request = {"model": "m", "prompt": "p" * 600}
    from_http = policy.of_http([], json.dumps(request).encode())
    assert from_http == policy.of_call((request,), {}) == policy.of_call((), {"request": request})
    assert len(from_http.blocks) == 2 and from_http.start == "p" * 600

    class ChatRequest(BaseModel):  # as Serve LLM's request models dump
        messages: list[dict]

    chat = ChatRequest(messages=[{"role": "user", "content": "hi"}])
    assert policy.of_call((chat,), {}).start == "user: hi\n"
    assert policy.of_call(("a string",), {}) is None and policy.of_call((), {}) is None
    assert policy.of_http([], b"not json") is None


def test_an_unknown_policy_is_refused_naming_the_field_and_the_choices():
    with pytest.raises(ValueError, match="request_router_class.*one of p2c, round_robin"):
        RoutingPolicy("fastest")
    assert RoutingPolicy.from_wire({}) == RoutingPolicy()


# -- the index ---------------------------------------------------------------------------


def test_the_index_finds_the_longest_run_and_forgets_least_recently_used_blocks():
    index = PrefixIndex(blocks_per_replica=5)
    index.insert("a", (1, 2, 3))
    index.insert("b", (1, 2, 3, 4, 5))  # b read the same prompt further: it holds all now
    assert index.match((1, 2, 3, 4, 9)) == ("b", 4)
    assert index.match((7,)) == (None, 0)
    index.insert("b", (6,))  # b's sixth block: its oldest (1) goes, as its engine evicts
    assert index.match((1, 2)) == (None, 0) and index.match((2, 3)) == ("b", 2)
    index.keep_only(["a"])
    assert len(index) == 0


def test_the_index_keeps_every_replicas_blocks_bounded():
    index = PrefixIndex(blocks_per_replica=100)
    for i in range(10_000):
        index.insert(f"r{i % 4}", tuple(range(i * 10, i * 10 + 10)))
    assert len(index) == 400


# -- a process's routers: the key each request carries -------------------------------------


def test_a_process_keys_handle_calls_and_http_bodies_by_the_deployments_policy():
    from controlplane.routing.prefix_affinity import read_prompt
    from controlplane.routing.router_set import RouterSet
    from controlplane.wire import HTTPRequestData, RoutingUpdate
    from tests.unit.router_fakes import FakeTransport, replica

    class Recording(FakeTransport):  # answers at once; remembers where each went
        async def send(self, replica, request):
            self.sent.append(replica.replica_id)

        async def send_http(self, replica, data, send):
            self.sent.append(replica.replica_id)
            return 200

    h = Harness()
    h.transport = Recording(h.clock)
    routers = RouterSet("ns", h.clock, transport=h.transport)
    routers.update("app/model", RoutingUpdate(tuple(replica(i) for i in range(4)), 8,
                                              request_router=(("name", "prefix"),)))
    request = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    home = next(HashRing(IDS).walk(read_prompt(request).start))
    body = json.dumps(request).encode()
    http = HTTPRequestData("POST", "/x", b"", [], body, "/")

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        loop.create_task(routers.call("app/model", "__call__", (request,), {}))
        loop.create_task(routers.serve_http("app/model", http, lambda message: None))
        await settle()
        return h.transport.sent

    assert h.run(main) == [home, home]


def cold_start(seed: int, home_load: int) -> tuple[str, str]:
    """Where a conversation's cold first turn goes with ``home_load`` requests already on
    its ring replica (others' load, as a probe told this router), and the ring replica."""
    from controlplane.routing.prefix_affinity import block_keys

    affinity = Affinity("a cold start", block_keys("nobody sent this " * 40), 0)
    home = next(HashRing(IDS).walk("a cold start"))
    h = Harness()
    h.make(replicas=4, max_ongoing=8, seed=seed, policy=RoutingPolicy("prefix"))

    async def main() -> str:
        h.router._cache.probe_answered(home, home_load, h.clock.monotonic())
        asyncio.get_running_loop().create_task(h.router.assign("q", affinity=affinity))
        await settle()
        return h.transport.where("q")

    return h.run(main), home


def test_a_cold_conversation_start_goes_to_its_ring_replica_when_no_busier_than_p2cs_pick():
    for seed in range(8):
        where, home = cold_start(seed, home_load=0)
        assert where == home  # a tie (idle): where every router sends the conversation
        where, home = cold_start(seed, home_load=1)
        assert where != home  # p2c's pick, an idle replica: never a busier one


def test_a_chat_with_messages_after_its_start_is_a_later_turn():
    policy = RoutingPolicy("prefix")
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = first + [{"role": "assistant", "content": "hello"},
                     {"role": "user", "content": "and?"}]
    assert not policy.of_http([], json.dumps({"messages": first}).encode()).continued
    assert policy.of_http([], json.dumps({"messages": later}).encode()).continued
    assert not policy.of_http([], json.dumps({"prompt": "x" * 5000}).encode()).continued


def test_a_prompt_this_router_sent_before_goes_to_its_ring_replica():
    from controlplane.routing.prefix_affinity import block_keys

    text = "a prompt sent once before " * 40
    affinity = Affinity("start of it", block_keys(text), 0)
    home = next(HashRing(IDS).walk("start of it"))
    h = Harness()
    h.make(replicas=4, max_ongoing=8, seed=5, policy=RoutingPolicy("prefix"))

    async def main() -> str:
        h.router._cache.probe_answered(home, 1, h.clock.monotonic())  # one request there
        h.router._members.index.insert("elsewhere", affinity.blocks[:1])  # warm
        asyncio.get_running_loop().create_task(h.router.assign("q", affinity=affinity))
        await settle()
        return h.transport.where("q")

    assert h.run(main) == home  # within the bound: its prefix's replica, load aside


@pytest.mark.parametrize("policies, goes_home", [
    (("prefix", "prefix"), True),  # a new limit, the same policy: the index holds
    (("kv_load", "prefix_kv"), False),  # another policy ran: the prompt is cold again
])
def test_a_policy_change_empties_the_index_and_a_new_limit_keeps_it(policies, goes_home):
    """Under a policy that keys no prompt the engines' caches move on and the index does
    not: back on a prompt policy, its old entries would send each prompt to its ring
    replica, load aside (release_tests.llm_routing ran prefix, kv_load then prefix_kv on
    one round's prompts: prefix_kv read every random prompt as warm)."""
    from dataclasses import replace

    from controlplane.routing.prefix_affinity import block_keys

    affinity = Affinity("start of it", block_keys("a prompt sent once before " * 40), 0)
    home = next(HashRing(IDS).walk("start of it"))
    h = Harness()
    h.make(replicas=4, max_ongoing=8, seed=5, policy=RoutingPolicy("prefix"))
    h.router._members.index.insert("elsewhere", affinity.blocks[:1])  # sent under prefix
    config = h.router._config
    for name in policies:
        h.router.update_config(replace(config, max_ongoing_requests=6,
                                       policy=RoutingPolicy(name)))

    async def main() -> str:
        h.router._cache.probe_answered(home, 1, h.clock.monotonic())  # busier than the rest
        asyncio.get_running_loop().create_task(h.router.assign("q", affinity=affinity))
        await settle()
        return h.transport.where("q")

    assert (h.run(main) == home) is goes_home  # cold: the less loaded of p2c's pair


def test_a_replica_the_ring_walk_passed_over_has_its_load_refreshed():
    """As power of two choices refreshes both of its pair: a replica passed over as past
    the bound too, or its load, compared against next time, stays as old as its last
    choice."""
    h = Harness()  # the paper's factor: the floor, 2 requests, is the bound here
    h.make(replicas=4, max_ongoing=8, seed=3, policy=RoutingPolicy("prefix",
                                                                   balance_factor=1.25))
    walk = list(HashRing(IDS).walk("hot"))

    async def main() -> None:
        for name in ("a", "b", "c"):
            asyncio.get_running_loop().create_task(h.router.assign(name, affinity=Affinity("hot")))
            await settle()

    h.run(main)
    assert [h.transport.where(n) for n in "abc"] == [walk[0], walk[0], walk[1]]
    assert h.transport.probed == [walk[0], walk[1]]  # the home, then the one it spilled to
