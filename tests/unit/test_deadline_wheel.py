"""The timer wheel of health visits against a plain reference, and the work it does."""

from __future__ import annotations

import random

from controlplane.health.deadline_wheel import BUCKET_S, DeadlineQueue


class Reference:
    """What the queue must answer: one deadline per key, due ones oldest first."""

    def __init__(self) -> None:
        self.due_at: dict[str, float] = {}

    def schedule(self, key: str, at: float) -> None:
        self.due_at[key] = at

    def cancel(self, key: str) -> None:
        self.due_at.pop(key, None)

    def pop_due(self, now: float) -> list[str]:
        due = sorted((at, key) for key, at in self.due_at.items() if at <= now)
        for _, key in due:
            del self.due_at[key]
        return [key for _, key in due]


def test_the_wheel_answers_as_the_reference_on_random_schedules():
    rng = random.Random(7)
    for _ in range(30):
        wheel, ref, now = DeadlineQueue(), Reference(), 1000.0
        for _ in range(400):
            key = f"r{rng.randrange(40)}"
            roll = rng.random()
            if roll < 0.55:  # near deadlines, on bucket edges, in the past, far out
                at = rng.choice([now + rng.uniform(-1, 3), now + rng.randrange(8) * BUCKET_S,
                                 now + rng.uniform(0, 500), now])
                wheel.schedule(key, at)
                ref.schedule(key, at)
            elif roll < 0.65:
                wheel.cancel(key)
                ref.cancel(key)
            else:
                now += rng.choice([0.0, BUCKET_S / 3, 0.1, rng.uniform(0, 2), 60.0])
                assert wheel.pop_due(now) == ref.pop_due(now)
            assert len(wheel) == len(ref.due_at)
        assert wheel.pop_due(now + 1e6) == ref.pop_due(now + 1e6)


def test_a_deadline_exactly_at_now_is_due_and_one_just_after_is_not():
    wheel = DeadlineQueue()
    wheel.schedule("a", 10.0)
    wheel.schedule("b", 10.0 + 1e-9)
    assert wheel.pop_due(10.0) == ["a"]
    assert wheel.pop_due(10.0 + 1e-9) == ["b"]


def test_moving_a_deadline_costs_no_bucket_when_it_stays_in_one():
    """A replica pushed again in the same slice of time: no new bucket, no heap push."""
    wheel = DeadlineQueue()
    for i in range(10_000):
        wheel.schedule(f"r{i}", 15.0 + i * 1e-6)  # 10K deadlines within 10 ms
    for i in range(10_000):
        wheel.schedule(f"r{i}", 25.0 + i * 1e-6)
    assert wheel.buckets <= 4  # the 2 x 10 ms spans touch at most 4 buckets
    assert wheel.pop_due(20.0) == []
    assert len(wheel.pop_due(26.0)) == 10_000
