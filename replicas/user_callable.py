"""The wrapper around the user's code: construct it, call it, check it, reconfigure it.

Separate from the replica actor (as in Ray Serve) so it can be tested without Ray.
Sync user methods run in a worker thread so the replica's event loop, and with it the
health and control calls, never blocks behind user code.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable


async def call_maybe_async(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


class UserCallable:
    """A constructed user class, or a plain function standing in for one."""

    def __init__(self, target: Any, init_args: tuple, init_kwargs: dict,
                 resolve_arg: Callable[[Any], Any] = lambda v: v) -> None:
        self._target = target
        self._args = tuple(resolve_arg(a) for a in init_args)
        self._kwargs = {k: resolve_arg(v) for k, v in init_kwargs.items()}
        self._instance: Any = None

    @property
    def is_function(self) -> bool:
        return not inspect.isclass(self._target)

    async def construct(self) -> None:
        if self.is_function:
            return
        self._instance = await asyncio.to_thread(self._target, *self._args, **self._kwargs)

    def _method(self, name: str) -> Callable | None:
        if self.is_function:
            return self._target if name == "__call__" else None
        return getattr(self._instance, name, None)

    async def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        fn = self._method(method)
        if fn is None:
            raise AttributeError(f"the deployment has no method '{method}'")
        return await call_maybe_async(fn, *args, **kwargs)

    async def check_health(self) -> None:
        """Runs the user's check_health if defined; raising means unhealthy."""
        fn = self._method("check_health")
        if fn is not None:
            await call_maybe_async(fn)

    async def reconfigure(self, user_config: Any) -> None:
        fn = self._method("reconfigure")
        if fn is None:
            if user_config is not None:
                raise TypeError("user_config is set but the deployment class has no "
                                "reconfigure(user_config) method; add one or drop user_config")
            return
        await call_maybe_async(fn, user_config)

    async def shutdown(self) -> None:
        """Ray Serve's clean-up hook: a user class's ``__del__``, called once on a
        graceful stop (before the actor is killed, which would skip it)."""
        if self._instance is not None and "__del__" in dir(type(self._instance)):
            await call_maybe_async(self._instance.__del__)
