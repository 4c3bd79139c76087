"""The one in-process Ray of a test session, and the order of its two kinds.

Integration tests run on a single-node Ray (``tests/integration/conftest.py``); the
multi-node tests, collected last (``testpaths``), run on a small local cluster
(``tests/multinode/conftest.py``). A process holds one Ray at a time: before the cluster
starts, ``release`` shuts the single-node Ray and its instance down (each fixture
registers how, with ``on_release``); the fixture's own teardown then has nothing left.
"""

from __future__ import annotations

from typing import Callable

_releases: list[Callable[[], None]] = []


def on_release(stop: Callable[[], None]) -> Callable[[], None]:
    """Register ``stop``; returns a once-only version of it for the fixture's teardown."""
    done: list[bool] = []

    def once() -> None:
        if not done:
            done.append(True)
            stop()
    _releases.append(once)
    return once


def release() -> None:
    while _releases:
        _releases.pop()()
