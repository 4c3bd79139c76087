"""Prefix affinity's pure parts: the prompt's prefix, the ring every router agrees on, and
the bounded-load choice. No Ray, no clock."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from controlplane.routing.policies import Affinity, RoutingPolicy
from controlplane.routing.prefix_affinity import (BLOCK_CHARS, MAX_PROMPT_CHARS, START_CHARS,
                                                   START_PART_CHARS, HashRing, block_keys,
                                                   capacity, choose, read_prompt)

REPLICAS = [f"llm#Model#{i}" for i in range(8)]


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_the_prompt_of_a_completion_and_its_start():
    prompt = read_prompt(body(model="m", prompt="abc" * 1000), max_chars=2000)
    assert prompt.text == ("abc" * 1000)[:2000]
    assert prompt.start == prompt.text[:START_CHARS] and prompt.start_chars == START_CHARS
    assert read_prompt(body(prompt=["first", "second"])).text == "first"


def test_a_chats_start_runs_to_its_first_user_message_and_stays_turn_after_turn():
    system = {"role": "system", "content": "be brief " * 100}
    first = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    turn_1 = read_prompt(body(messages=[system, first]))
    turn_2 = read_prompt(body(messages=[system, first, {"role": "assistant", "content": "yo"},
                                        {"role": "user", "content": "more"}]))
    assert turn_1.text.startswith("system: be brief") and turn_1.text.endswith("user: hi\n")
    assert turn_1.start == turn_2.start  # one conversation, one ring key
    assert turn_1.start == f"system: {system['content']}\n"[:START_PART_CHARS] + "user: hi\n"
    assert turn_2.start_chars == turn_1.start_chars == len(turn_1.text)
    other = read_prompt(body(messages=[system, {"role": "user", "content": "other"}]))
    assert other.start != turn_1.start  # two conversations with one system prompt


@pytest.mark.parametrize("raw", [b"not json", b"\xff\xfe", b"[1, 2]", body(prompt=""),
                                 body(messages=[]), body(input="no prompt"), None,
                                 body(messages=["not a message"])])
def test_a_body_without_a_prompt_has_none(raw):
    assert read_prompt(raw) is None


def test_a_long_prompt_is_read_only_to_its_budget():
    many = body(messages=[{"role": "user", "content": "x" * 100}] * 10_000)
    assert len(read_prompt(many, max_chars=300).text) == 300
    huge = read_prompt(body(prompt="y" * 5_000_000))
    assert len(huge.text) == MAX_PROMPT_CHARS
    assert len(block_keys(huge.text)) == MAX_PROMPT_CHARS // BLOCK_CHARS


def test_block_keys_are_chained_full_blocks():
    a = block_keys("a" * 256 + "b" * 256 + "c" * 100)
    b = block_keys("a" * 256 + "x" * 256)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]  # the partial block is not one
    assert block_keys("z" * 256 + "b" * 256)[1] != a[1]  # a block's key depends on those before


def test_every_router_maps_a_prefix_to_the_same_replica():
    one, other = HashRing(REPLICAS), HashRing(list(reversed(REPLICAS)))
    for i in range(200):
        assert list(one.walk(f"prompt {i}")) == list(other.walk(f"prompt {i}"))
    assert sorted(one.walk("any")) == sorted(REPLICAS)  # every replica, once


def test_a_replica_leaving_moves_only_the_prefixes_it_held():
    before, after = HashRing(REPLICAS), HashRing(REPLICAS[:-1])
    keys = [f"system prompt {i}" for i in range(2000)]
    first_before = {k: next(before.walk(k)) for k in keys}
    moved = [k for k in keys if next(after.walk(k)) != first_before[k]]
    assert moved and all(first_before[k] == REPLICAS[-1] for k in moved)


def test_prefixes_spread_over_the_replicas():
    ring = HashRing(REPLICAS)
    owners = Counter(next(ring.walk(f"session {i}")) for i in range(8000))
    assert set(owners) == set(REPLICAS)
    assert max(owners.values()) / min(owners.values()) < 1.6


def test_the_prefix_stays_with_its_replica_while_its_load_is_within_the_bound():
    ring = HashRing(REPLICAS)
    home = next(ring.walk("shared system prompt"))
    loads = dict.fromkeys(REPLICAS, 1)
    assert choose(ring, "shared system prompt", loads.get, sum(loads.values())) == home


def test_a_hot_prefix_spills_to_the_next_replica_on_its_walk_the_same_for_every_router():
    ring = HashRing(REPLICAS)
    walk = list(ring.walk("hot"))
    loads = dict.fromkeys(REPLICAS, 0)
    loads[walk[0]] = capacity(4, len(REPLICAS))  # at its bound: 4 requests in all
    total = 4
    assert choose(ring, "hot", loads.get, total) == walk[1]
    assert choose(HashRing(list(reversed(REPLICAS))), "hot", loads.get, total) == walk[1]


def test_full_or_gone_replicas_are_passed_over_and_none_left_means_none():
    ring = HashRing(REPLICAS)
    walk = list(ring.walk("k"))
    gone = {walk[0], walk[1]}
    assert choose(ring, "k", lambda r: None if r in gone else 0, 0) == walk[2]
    assert choose(ring, "k", lambda r: None, 0) is None
    assert choose(HashRing([]), "k", lambda r: 0, 0) is None


def test_the_bound_follows_the_papers_formula():
    assert capacity(0, 8) == 1  # an idle fleet: one each before spilling
    assert capacity(79, 8, 1.25) == 13  # ceil(1.25 x 80 / 8) = 12.5 -> 13


# -- in the router ---------------------------------------------------------------------------


def placed_in_order(seed: int, keys: list[str | None], max_ongoing: int = 8) -> list[str]:
    """Where a router puts requests sent one after another and left running."""
    from tests.unit.router_fakes import Harness, settle

    h = Harness()  # the paper's factor, 1.25 (the product's default is 2)
    h.make(replicas=4, max_ongoing=max_ongoing, seed=seed,
           policy=RoutingPolicy("prefix", balance_factor=1.25))

    async def main() -> list[str]:
        for i, key in enumerate(keys):
            affinity = None if key is None else Affinity(key)
            asyncio.get_running_loop().create_task(h.router.assign(i, affinity=affinity))
            await settle()
        return [h.transport.where(i) for i in range(len(keys))]

    return h.run(main)


def test_a_router_sends_a_prefix_along_its_ring_walk_as_the_load_bound_allows():
    walk = list(HashRing([f"r{i}" for i in range(4)]).walk("system prompt"))
    # the bound: the floor, 2, while ceil(1.25 x (m + 1) / 4) is under it (m <= 5 running),
    # then 3 from m = 6
    assert placed_in_order(0, ["system prompt"] * 8) == (walk[:1] * 2 + walk[1:2] * 2
                                                         + walk[2:3] * 2 + walk[:1] + walk[1:2])
    assert capacity(0, 8, floor=2) == 2 and capacity(79, 8, 1.25, floor=2) == 13


def test_routers_with_other_random_seeds_agree_and_keyless_requests_still_balance():
    keys = ["a", "b", "a", "c", "b", "a"]
    assert placed_in_order(1, keys) == placed_in_order(2, keys)
    keyless = placed_in_order(3, [None] * 8)
    assert Counter(keyless) == Counter({f"r{i}": 2 for i in range(4)})  # p2c, all slots free


def test_the_replica_an_affinity_key_chose_has_its_load_refreshed():
    from tests.unit.router_fakes import Harness, settle

    h = Harness()
    h.make(replicas=4, max_ongoing=8)
    home = next(HashRing([f"r{i}" for i in range(4)]).walk("k"))

    async def main() -> None:
        asyncio.get_running_loop().create_task(h.router.assign("req", affinity=Affinity("k")))
        await settle()

    h.run(main)
    assert h.transport.where("req") == home and h.transport.probed == [home]
