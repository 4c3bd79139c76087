"""Named actors looked up without blocking an event loop.

``ray.get_actor`` is a GCS call, and a blocking one: while the head node's GCS does not
answer (issue 32) it waits, and on a proxy's or a replica's event loop one such wait
stops every request that process serves. Seen here before this module (py-spy, the
head's Ray processes killed): a worker node's proxy sat in ``ray.get_actor`` on its event
loop, for a replica whose handle it had not cached, with every request it held.

``ActorLookup`` runs lookups on a small thread pool of its own (a lookup that waits there
holds up no other work), one per name at a time (a thousand requests for one uncached
replica share one lookup), keeps what it found (``cache``), and lets a caller wait at
most ``wait_s``: past it, ``LookupTimeout``, and the lookup goes on for the next caller.
``warm`` starts lookups ahead of the first request (a router does, for each replica that
joins its set), so that a GCS outage finds the handles in hand. A lookup of a name that
is not there raises ``ValueError``, as ``ray.get_actor`` does.

``threaded=False`` runs the lookup inline on the loop (tests, with a fake directory and a
virtual clock).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

LOOKUP_WAIT_S = 2.0  # a caller's longest wait for a lookup the GCS answers at once
_POOL: list[ThreadPoolExecutor] = []  # one per process, made on first use


class LookupTimeout(TimeoutError):
    """The GCS did not answer the lookup within the caller's wait."""


def _pool() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=4, thread_name_prefix="actor-lookup"))
    return _POOL[0]


async def off_loop(call: Callable[[], Any], what: str, wait_s: float = LOOKUP_WAIT_S) -> Any:
    """``call()`` (a blocking GCS call) on the lookup pool, waited for at most ``wait_s``:
    past it ``LookupTimeout`` naming ``what``, and the call goes on unwatched."""
    future = asyncio.get_running_loop().run_in_executor(_pool(), call)
    try:
        return await asyncio.wait_for(asyncio.shield(future), wait_s)
    except asyncio.TimeoutError:
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
        raise LookupTimeout(f"the GCS did not answer {what} within {wait_s:g}s") from None


class ActorLookup:
    def __init__(self, namespace: str, get_actor: Callable[..., Any] | None = None, *,
                 wait_s: float = LOOKUP_WAIT_S, cache: bool = True,
                 threaded: bool = True) -> None:
        if get_actor is None:
            import ray

            get_actor = ray.get_actor
        self._namespace, self._get_actor = namespace, get_actor
        self._wait_s, self._cache_on, self._threaded = wait_s, cache, threaded
        self._cache: dict[str, Any] = {}
        self._pending: dict[str, asyncio.Future] = {}
        self._generation: dict[str, int] = {}  # bumped by forget: a lookup then is stale

    def cached(self, name: str) -> Any | None:
        return self._cache.get(name)

    def forget(self, name: str) -> None:
        """The name may come back on another actor: drop what was found (and what a
        lookup in flight will find)."""
        self._cache.pop(name, None)
        self._generation[name] = self._generation.get(name, 0) + 1

    def warm(self, names: list[str]) -> None:
        """Start lookups of the names not in hand; nobody waits for them."""
        if self._threaded and self._cache_on:
            for name in names:
                if name not in self._cache:
                    self._start(name)

    async def get(self, name: str) -> Any:
        """The actor's handle: ``ValueError`` when there is none, ``LookupTimeout`` when
        the GCS did not answer within ``wait_s``."""
        handle = self._cache.get(name)
        if handle is not None:
            return handle
        if not self._threaded:
            handle = self._get_actor(name, namespace=self._namespace)
            if self._cache_on:
                self._cache[name] = handle
            return handle
        try:
            return await asyncio.wait_for(asyncio.shield(self._start(name)), self._wait_s)
        except asyncio.TimeoutError:
            raise LookupTimeout(f"the GCS did not answer a lookup of actor {name!r} within "
                                f"{self._wait_s:g}s") from None

    def _start(self, name: str) -> asyncio.Future:
        future = self._pending.get(name)
        if future is None:
            future = asyncio.get_running_loop().run_in_executor(
                _pool(), lambda: self._get_actor(name, namespace=self._namespace))
            self._pending[name] = future
            generation = self._generation.get(name, 0)
            future.add_done_callback(lambda f: self._done(name, generation, f))
        return future

    def _done(self, name: str, generation: int, future: asyncio.Future) -> None:
        self._pending.pop(name, None)
        if future.cancelled() or future.exception() is not None:
            return  # retrieved: a failed warm-up is no error to report
        if self._cache_on and self._generation.get(name, 0) == generation:
            self._cache[name] = future.result()
