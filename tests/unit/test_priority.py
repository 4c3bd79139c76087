"""Control-plane processes leave Ray's worker niceness for the raylet's (priority.py)."""

from __future__ import annotations

import logging
import os
import resource

from controlplane.priority import (CONTROL_NICENESS, FIX, WORKER_NICENESS_ENV,
                                   embedded_worker_niceness, may_take_control_priority,
                                   take_control_priority)


class Threads:
    """A process's threads and their niceness, as the kernel would keep them."""

    def __init__(self, nice: int, tids: list[int], allowed: bool = True,
                 gone: tuple[int, ...] = ()) -> None:
        self.nice = {tid: nice for tid in tids}
        self.allowed, self.gone, self.calls = allowed, gone, []

    def tids(self) -> list[int]:
        return list(self.nice)

    def get(self, which: int, who: int) -> int:
        assert (which, who) == (os.PRIO_PROCESS, 0)
        return next(iter(self.nice.values()))

    def set(self, which: int, who: int, value: int) -> None:
        self.calls.append(who)
        if who in self.gone:
            raise ProcessLookupError(3, "No such process")
        if not self.allowed and value < self.nice[who]:
            raise PermissionError(13, "Permission denied")
        self.nice[who] = value

    def take(self) -> int:
        return take_control_priority("shard 0", threads=self.tids, getpriority=self.get,
                                     setpriority=self.set)


def test_every_thread_of_a_ray_worker_moves_to_the_raylets_niceness():
    # Ray's gRPC and I/O threads exist before __init__; each has its own niceness.
    threads = Threads(15, [100, 101, 102, 103])
    assert threads.take() == CONTROL_NICENESS
    assert threads.nice == {100: 0, 101: 0, 102: 0, 103: 0}


def test_a_thread_that_ended_meanwhile_is_skipped():
    threads = Threads(15, [100, 101, 102], gone=(101,))
    assert threads.take() == CONTROL_NICENESS
    assert threads.nice[100] == 0 and threads.nice[102] == 0


def test_a_process_already_at_or_above_the_control_priority_is_left_alone():
    for nice in (0, -5):
        threads = Threads(nice, [100])
        assert threads.take() == nice and threads.calls == []


def test_without_permission_it_stays_and_says_how_to_allow_it(caplog):
    threads = Threads(15, [100, 101], allowed=False)
    with caplog.at_level(logging.WARNING, logger="controlplane.priority"):
        assert threads.take() == 15
    assert threads.nice == {100: 15, 101: 15}
    [record] = caplog.records
    assert "shard 0 runs at niceness 15" in record.getMessage()
    assert FIX in record.getMessage() and "CAP_SYS_NICE" in FIX


def test_no_priorities_at_all_is_not_an_error():
    def get(which: int, who: int) -> int:
        raise OSError(38, "Function not implemented")
    assert take_control_priority("proxy", getpriority=get) == CONTROL_NICENESS


NO_CAPS = "Name:\tpython\nCapEff:\t0000000000000000\n"
SYS_NICE = "Name:\tpython\nCapEff:\t0000000000800000\n"  # bit 23


def test_who_may_take_the_control_priority():
    def may(euid: int, limit: int, status: str) -> bool:
        return may_take_control_priority(lambda: euid, lambda: limit, lambda: status)
    assert may(0, 0, NO_CAPS)  # root
    assert may(1000, 20, NO_CAPS)  # RLIMIT_NICE 20 reaches niceness 0
    assert may(1000, resource.RLIM_INFINITY, NO_CAPS)
    assert may(1000, 0, SYS_NICE)
    assert not may(1000, 19, NO_CAPS)  # reaches niceness 1 only
    assert not may(1000, 0, "")  # no /proc: no capability known


def test_an_embedded_ray_starts_its_workers_at_control_niceness_only_where_needed():
    environ: dict[str, str] = {}
    note = embedded_worker_niceness(environ, may=lambda: False)
    assert environ == {WORKER_NICENESS_ENV: str(CONTROL_NICENESS)}
    assert f"{WORKER_NICENESS_ENV}={CONTROL_NICENESS}" in note
    allowed: dict[str, str] = {}
    assert embedded_worker_niceness(allowed, may=lambda: True) is None and allowed == {}
    chosen = {WORKER_NICENESS_ENV: "5"}  # the user's choice stands
    assert embedded_worker_niceness(chosen, may=lambda: False) is None
    assert chosen == {WORKER_NICENESS_ENV: "5"}
