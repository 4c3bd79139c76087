"""The wrapper around the user's code: construct it, call it, check it, reconfigure it.

Separate from the replica actor (as in Ray Serve) so it can be tested without Ray.
Sync user methods run in a worker thread so the replica's event loop, and with it the
health and control calls, never blocks behind user code.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Callable

from controlplane.wire import HTTPRequestData
from replicas import asgi_ingress
from replicas.asgi_ingress import AsgiResponse
from replicas.http_adapter import asgi_scope, to_starlette

logger = logging.getLogger(__name__)


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
        self.asgi_app: Any = None  # an @serve.ingress class's app, once constructed
        self._call_takes_request: bool | None = None

    @property
    def is_function(self) -> bool:
        return not inspect.isclass(self._target)

    async def construct(self) -> None:
        """Construct the user's class. A sync constructor runs in a thread; an ``async
        def __init__`` (Serve allows it; ``@serve.ingress`` classes have one) is awaited
        on the replica's loop, as Serve does. An ingress then binds and starts its app."""
        if self.is_function:
            return
        if inspect.iscoroutinefunction(self._target.__init__):
            instance = self._target.__new__(self._target)
            await instance.__init__(*self._args, **self._kwargs)
        else:
            instance = await asyncio.to_thread(self._target, *self._args, **self._kwargs)
        self._instance = instance
        if asgi_ingress.is_asgi_ingress(instance):
            self.asgi_app = await asgi_ingress.start(instance)

    @property
    def servable(self) -> Any:
        """What Serve's replica context calls ``servable_object``."""
        return self._target if self.is_function else self._instance

    def _method(self, name: str) -> Callable | None:
        if self.is_function:
            return self._target if name == "__call__" else None
        return getattr(self._instance, name, None)

    async def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        fn = self._method(method)
        if fn is None:
            raise AttributeError(f"the deployment has no method '{method}'")
        return await call_maybe_async(fn, *args, **kwargs)

    async def call_http(self, data: HTTPRequestData) -> Any:
        """An HTTP request: through the ingress app (an ``AsgiResponse``, prefetched), or
        to ``__call__`` with a Starlette request (without one if it takes no argument,
        as Serve calls it)."""
        if self.asgi_app is not None:
            response = AsgiResponse(self.asgi_app, asgi_scope(data), data.body)
            try:
                await response.prefetch()
            except BaseException:
                response.close()
                raise
            return response
        fn = self._method("__call__")
        if fn is None:
            raise AttributeError("the deployment has no __call__ method to take HTTP requests")
        if self._call_takes_request is None:  # inspect once, not per request
            self._call_takes_request = _takes_argument(fn)
        args = (to_starlette(data),) if self._call_takes_request else ()
        return await call_maybe_async(fn, *args)

    async def check_health(self) -> None:
        """Runs the user's check_health if defined; raising means unhealthy."""
        fn = self._method("check_health")
        if fn is not None:
            await call_maybe_async(fn)

    def _stats_hook(self, name: str) -> Any:
        """What the user's plain (not async) stats hook ``name`` returns now; None without
        one, or when it raised (a broken hook costs its signal, never the caller). Such a
        hook must only read what it already has: it runs on the replica's loop."""
        fn = self._method(name)
        if fn is None or inspect.iscoroutinefunction(fn):
            return None
        try:
            return fn()
        except Exception:
            logger.debug("%s raised", name, exc_info=True)
            return None

    def kv_cache_usage(self) -> float | None:
        """The engine's KV-cache use (0-1) from the user's ``record_routing_stats()``
        (Serve's hook name; its ``kv_cache_usage`` entry), for the routers' probes (the
        kv_load policies); None without one. A probe never waits."""
        stats = self._stats_hook("record_routing_stats")
        value = stats.get("kv_cache_usage") if isinstance(stats, dict) else None
        return float(value) if isinstance(value, (int, float)) else None

    def autoscaling_stats(self) -> dict[str, float] | None:
        """The user's ``record_autoscaling_stats()`` (Serve's custom-metrics hook): a dict
        of numbers, or None without one or when it is malformed."""
        stats = self._stats_hook("record_autoscaling_stats")
        if not isinstance(stats, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                for k, v in stats.items()):
            return None
        return {k: float(v) for k, v in stats.items()}

    async def reconfigure(self, user_config: Any, rank: Any = None) -> None:
        """Serve's rule: ``reconfigure(user_config)``, with ``rank=`` as well when the
        method has a ``rank`` parameter (then it runs even without a user_config)."""
        fn = self._method("reconfigure")
        if fn is None:
            if user_config is not None:
                raise TypeError("user_config is set but the deployment class has no "
                                "reconfigure(user_config) method; add one or drop user_config")
            return
        wants_rank = "rank" in inspect.signature(fn).parameters
        if user_config is None and not wants_rank:
            return
        await call_maybe_async(fn, user_config, **({"rank": rank} if wants_rank else {}))

    async def shutdown(self) -> None:
        """Ray Serve's clean-up hook: a user class's ``__del__``, called once on a
        graceful stop (before the actor is killed, which would skip it)."""
        if self._instance is not None and "__del__" in dir(type(self._instance)):
            await call_maybe_async(self._instance.__del__)


def _takes_argument(fn: Callable) -> bool:
    """Whether a callable takes at least one positional argument (the request)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume it does
        return True
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.VAR_POSITIONAL)
    return any(p.kind in kinds for p in params)
