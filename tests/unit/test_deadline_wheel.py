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
                # in order or not: an out-of-order one takes the general path
                in_order = rng.random() < 0.5
                (wheel.schedule_in_order if in_order else wheel.schedule)(key, at)
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


def test_deadlines_in_order_live_in_the_line_and_never_touch_the_wheel():
    """A steady push's deadline (arrival + window) moves its key to the line's end: no
    bucket, no heap; due ones come back oldest first, merged with the wheel's."""
    wheel = DeadlineQueue()
    wheel.schedule("w", 20.5)
    for i in range(10_000):
        wheel.schedule_in_order(f"r{i}", 15.0 + i * 1e-3)
    for i in range(0, 10_000, 2):  # half push again later: they move to the end
        wheel.schedule_in_order(f"r{i}", 30.0 + i * 1e-3)
    assert wheel.buckets == 1 and len(wheel) == 10_001
    due = wheel.pop_due(25.0)
    assert due == [f"r{i}" for i in range(1, 5_500, 2)] + ["w"] + \
        [f"r{i}" for i in range(5_501, 10_000, 2)]
    wheel.schedule_in_order("r0", 29.0)  # earlier than the line's tail: the wheel takes it
    assert wheel.buckets == 1 and wheel.pop_due(29.0) == ["r0"]
    wheel.cancel("r2")
    assert wheel.pop_due(1e9) == [f"r{i}" for i in range(4, 10_000, 2)]
