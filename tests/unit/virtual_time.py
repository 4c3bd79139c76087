"""Run asyncio code in virtual time on a ``FakeClock``.

``VirtualTimeLoop`` is a selector event loop whose ``time()`` is the FakeClock. When no
callback is ready, instead of sleeping until the next timer it advances the clock to it
(the idea behind kopf's ``looptime``), so ``asyncio.sleep(0.5)`` takes no wall time and
tests assert exact virtual times. A loop with nothing ready, no timer and no I/O would
wait forever; it raises instead, so a test that would hang fails at once.

``wait_all_tasks_blocked`` (after trio's) returns once every other task is blocked on a
timer or I/O, without advancing the clock: the loop wakes its waiters at the moment it
would otherwise jump ahead. Tests use it instead of a fixed count of ``sleep(0)``, which
one more ``await`` in the code under test would outrun.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any, Awaitable, Callable

from controlplane.clock import FakeClock


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, clock: FakeClock, wake_idle_waiters: Callable[[], bool]) -> None:
        super().__init__()
        self._clock = clock
        self._wake_idle_waiters = wake_idle_waiters

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)  # real I/O (the loop's self-pipe) is still honoured
        if ready or timeout == 0:
            return ready
        if self._wake_idle_waiters():  # the loop is idle: wake them, time stays put
            return []
        if timeout is None:
            raise RuntimeError("deadlock: nothing is ready and no timer is scheduled")
        self._clock.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: FakeClock) -> None:
        self._idle_waiters: list[asyncio.Future] = []
        super().__init__(selector=_JumpingSelector(clock, self._wake_idle_waiters))
        self._virtual_clock = clock

    def time(self) -> float:
        return self._virtual_clock.monotonic()

    def idle_future(self) -> asyncio.Future:
        """A future the loop resolves the next time nothing else is ready to run."""
        future = self.create_future()
        self._idle_waiters.append(future)
        return future

    def _wake_idle_waiters(self) -> bool:
        waiters, self._idle_waiters = self._idle_waiters, []
        live = [f for f in waiters if not f.done()]
        for future in live:
            future.set_result(None)
        return bool(live)


async def wait_all_tasks_blocked() -> None:
    """Return once every other task waits on a timer or I/O; the clock does not move."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualTimeLoop):
        raise TypeError("wait_all_tasks_blocked needs run_virtual's VirtualTimeLoop")
    await loop.idle_future()


def loop_clock() -> FakeClock:
    """The clock of the running ``VirtualTimeLoop``: shells built inside a test read the
    same time the loop's timers use."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualTimeLoop):
        raise TypeError("loop_clock needs run_virtual's VirtualTimeLoop")
    return loop._virtual_clock


def run_virtual(clock: FakeClock, main: Callable[[], Awaitable[Any]]) -> Any:
    """``asyncio.run(main())`` on a loop whose time is ``clock``."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(clock)) as runner:
        return runner.run(main())
