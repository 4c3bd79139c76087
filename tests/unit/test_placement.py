"""placement: power of two choices as a pure function of (replica ids, loads, rng, hint)."""

from __future__ import annotations

import random

import pytest

from controlplane.routing.placement import choose_replica, sample_candidates

IDS = [f"r{i}" for i in range(50)]


@pytest.mark.parametrize("seed", range(20))
def test_picks_the_less_loaded_of_the_first_pair(seed: int) -> None:
    rng = random.Random(seed)
    loads = {r: rng.randrange(4) for r in IDS}
    placement = choose_replica(IDS, loads.get, random.Random(seed))
    first, second = placement.candidates
    expected = second if loads[second] < loads[first] else first
    assert placement.replica_id == expected


def test_never_picks_a_replica_without_room_and_tries_more_pairs() -> None:
    room = {"r7": 3}  # only r7 may take a request
    found = 0
    for seed in range(200):
        placement = choose_replica(IDS, room.get, random.Random(seed))
        assert placement.replica_id in (None, "r7")
        assert len(placement.candidates) <= 6 and len(set(placement.candidates)) == \
            len(placement.candidates)
        found += placement.replica_id == "r7"
        if placement.replica_id is None:
            assert "r7" not in placement.candidates
    assert 10 <= found <= 40  # ~6/50 of the time: sampled, not scanned


def test_a_small_fleet_is_scanned_completely() -> None:
    ids = IDS[:6]
    for seed in range(50):
        assert choose_replica(ids, {"r4": 0}.get, random.Random(seed)).replica_id == "r4"


def test_hint_is_always_in_the_first_pair() -> None:
    loads = {r: 1 for r in IDS}
    for seed in range(50):
        placement = choose_replica(IDS, loads.get, random.Random(seed), hint="r9")
        assert placement.candidates[0] == "r9"
        assert placement.replica_id == "r9"  # a tie goes to the freed slot
    loads["r9"] = 3
    placement = choose_replica(IDS, loads.get, random.Random(1), hint="r9")
    assert placement.replica_id == placement.candidates[1]  # still the less loaded


def test_a_departed_hint_is_skipped() -> None:
    loads = {"r0": 0, "r1": 0}
    placement = choose_replica(["r0", "r1"], loads.get, random.Random(0), hint="gone")
    assert placement.replica_id in ("r0", "r1")
    assert placement.candidates[0] == "gone"


def test_sampling_an_empty_fleet() -> None:
    assert sample_candidates([], None, random.Random(0)) == ()
    assert choose_replica([], {}.get, random.Random(0)).replica_id is None
