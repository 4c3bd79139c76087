"""Run asyncio code in virtual time on a ``FakeClock``.

``VirtualTimeLoop`` is a selector event loop whose ``time()`` is the FakeClock. When no
callback is ready, instead of sleeping until the next timer it advances the clock to it
(the idea behind kopf's ``looptime``), so ``asyncio.sleep(0.5)`` takes no wall time and
tests assert exact virtual times. A loop with nothing ready, no timer and no I/O would
wait forever; it raises instead, so a test that would hang fails at once.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any, Awaitable, Callable

from controlplane.clock import FakeClock


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)  # real I/O (the loop's self-pipe) is still honoured
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("deadlock: nothing is ready and no timer is scheduled")
        self._clock.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(selector=_JumpingSelector(clock))
        self._virtual_clock = clock

    def time(self) -> float:
        return self._virtual_clock.monotonic()


def run_virtual(clock: FakeClock, main: Callable[[], Awaitable[Any]]) -> Any:
    """``asyncio.run(main())`` on a loop whose time is ``clock``."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(clock)) as runner:
        return runner.run(main())
