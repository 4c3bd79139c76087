"""QueueLenCache: our exact in-flight counts plus others' load from probes, with a TTL."""

from __future__ import annotations

import random

from controlplane.routing.queue_len_cache import QueueLenCache

T0 = 1000.0


def others(cache: QueueLenCache, replica_id: str) -> int:
    """Others' load as placement sees it (an unknown share counts 0; an unreachable
    replica is not placeable and its share is forgotten)."""
    load = cache.load_if_placeable(replica_id, max_ongoing=10**6)
    return 0 if load is None else load - cache.in_flight(replica_id)


def cache_with(*ids: str, ttl_s: float = 2.0) -> QueueLenCache:
    cache = QueueLenCache(ttl_s)
    cache.set_members(ids)
    return cache


def test_load_is_ours_plus_others_and_full_means_not_placeable() -> None:
    cache = cache_with("a")
    cache.reserve("a")
    assert cache.load_if_placeable("a", max_ongoing=2) == 1  # others unknown: counted 0
    cache.probe_started("a")
    cache.probe_answered("a", queue_len=2, now=T0)  # 2 reported, 1 of them ours
    assert others(cache, "a") == 1
    assert cache.load_if_placeable("a", max_ongoing=2) is None
    cache.release("a")  # our completion frees the slot at once, no probe needed
    assert cache.load_if_placeable("a", max_ongoing=2) == 1


def test_our_requests_moving_during_a_probe_are_never_counted_as_others() -> None:
    cache = cache_with("a")
    cache.reserve("a"), cache.reserve("a")
    cache.probe_started("a")  # replica counts our 2
    cache.release("a")  # one of ours ends before the answer arrives
    cache.probe_answered("a", queue_len=2, now=T0)
    assert others(cache, "a") == 0
    cache.probe_started("a")
    cache.reserve("a")  # one of ours starts after the replica counted
    cache.probe_answered("a", queue_len=1, now=T0)
    assert others(cache, "a") == 0


def test_probe_is_due_when_missing_or_older_than_ttl_and_not_while_running() -> None:
    cache = cache_with("a")
    assert cache.needs_probe("a", T0)
    cache.probe_started("a")
    assert not cache.needs_probe("a", T0)
    cache.probe_answered("a", 0, T0)
    assert not cache.needs_probe("a", T0 + 1.99)
    assert cache.needs_probe("a", T0 + 2.0)
    cache.probe_started("a")
    cache.probe_failed("a", T0 + 2.0, unreachable=False)
    assert others(cache, "a") == 0 and cache.load_if_placeable("a", 1) == 0  # forgotten
    assert not cache.needs_probe("a", T0 + 3.0) and cache.needs_probe("a", T0 + 4.0)


def test_unreachable_until_a_probe_answers() -> None:
    cache = cache_with("a")
    cache.mark_unreachable("a")
    assert not cache.accepts_requests("a") and cache.needs_probe("a", T0)
    cache.probe_started("a")
    cache.probe_failed("a", T0, unreachable=True)
    assert not cache.accepts_requests("a")
    cache.probe_started("a")
    cache.probe_answered("a", 0, T0 + 2)
    assert cache.accepts_requests("a")


def test_departed_replica_is_kept_only_while_our_requests_run() -> None:
    cache = cache_with("a", "b")
    cache.reserve("b")
    cache.set_members(["a"])
    assert not cache.accepts_requests("b") and cache.in_flight_by_replica() == {"b": 1}
    assert not cache.needs_probe("b", T0)
    cache.release("b")
    assert cache.in_flight_by_replica() == {} and cache.in_flight_total == 0


def test_occupancy_sums_stay_exact_through_random_churn() -> None:
    rng = random.Random(5)
    cache = cache_with("a", "b", "c")
    ours: dict[str, int] = {}
    for step in range(2000):
        members = cache.member_ids()
        op = rng.random()
        if op < 0.3 and members:
            rid = rng.choice(members)
            cache.reserve(rid)
            ours[rid] = ours.get(rid, 0) + 1
        elif op < 0.55 and ours:
            rid = rng.choice(sorted(ours))
            cache.release(rid)
            ours[rid] -= 1
            if not ours[rid]:
                del ours[rid]
        elif op < 0.8 and members:
            rid = rng.choice(members)
            cache.probe_started(rid)
            cache.probe_answered(rid, rng.randrange(6), T0 + step)
        elif op < 0.9 and members:
            cache.mark_unreachable(rng.choice(members))
        else:
            cache.set_members(rng.sample("abcde", rng.randrange(1, 5)))
        members = cache.member_ids()
        load = sum(cache.in_flight(r) + others(cache, r) for r in members)
        expected = min(1.0, load / (len(members) * 4))
        assert abs(cache.occupancy(4) - expected) < 1e-9, step
        assert cache.in_flight_total == sum(ours.values())
    assert QueueLenCache(1.0).occupancy(4) == 1.0  # no replicas: nothing drains
