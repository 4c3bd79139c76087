"""The shard process's garbage collector while a big plan is carried out.

Python's full collection walks every tracked object, and it runs whenever the objects
that survived younger collections reach a quarter of those already old: while a scale-up
or a rolling update creates records, tasks and handles for thousands of replicas, the
walks come again and again over an ever bigger heap (measured before this module: 20% of
a start's CPU at 32K replicas, CPU per start growing 1.26x from 1K to 32K, and 60-260 ms
pauses in a rollout at 16-32K).

``PlanFreeze`` moves what is alive into Python's permanent generation after each slice
of a plan (``gc.freeze()``: O(1), no walk), so the collections the plan's own allocations
trigger walk only what is new since; when the shard is no longer slicing (or at the
latest ``MAX_FROZEN_S`` after the first freeze) it gives them back (``gc.unfreeze()``:
O(1)) and the next full collection walks them once. Nothing is collected while frozen
that only a full collection could free (garbage in reference cycles among frozen
objects): it waits, bounded by the cap, for the thaw.

Only the shard actor's process uses it (``ControllerShard``, and the release tests that
measure that process); unit tests get ``NoFreeze``.
"""

from __future__ import annotations

import gc
from typing import Protocol

MAX_FROZEN_S = 60.0  # a shard that never stops slicing still thaws this often


class Collector(Protocol):
    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...


class PlanFreeze:
    """Freeze after each slice, thaw when the slices stop (or at the cap)."""

    def __init__(self, collector: Collector = gc, max_frozen_s: float = MAX_FROZEN_S) -> None:
        self._gc = collector
        self._max_frozen_s = max_frozen_s
        self._frozen_since: float | None = None

    @property
    def frozen(self) -> bool:
        return self._frozen_since is not None

    def after_slice(self, now: float) -> None:
        self._gc.freeze()
        if self._frozen_since is None:
            self._frozen_since = now

    def at_tick(self, slicing: bool, now: float) -> None:
        """After each tick: ``slicing`` when a slice is still to come."""
        since = self._frozen_since
        if since is not None and (not slicing or now - since >= self._max_frozen_s):
            self._gc.unfreeze()
            self._frozen_since = None


class NoFreeze(PlanFreeze):
    """The collector as Python runs it (unit tests: the test process is not frozen)."""

    def after_slice(self, now: float) -> None:
        pass
