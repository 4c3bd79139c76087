"""Deployment handles: user code calling another deployment (model composition).

``handle.remote(*args)`` / ``handle.method.remote(*args)`` return a ``DeploymentResponse``
that async code awaits and sync code reads with ``.result()``, as in Ray Serve. Calls go
through the same ``Router`` as HTTP (power of two choices, backpressure: a full queue
raises ``BackpressureError`` carrying ``retry_after_s``). One ``HandleRuntime`` per process
follows routes and replica sets by long-poll; it lives on the replica's event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from controlplane.clock import SystemClock
from controlplane.routing.router_set import RouterSet
from controlplane.routing.subscriber import RoutingSubscriber
from controlplane.settings import Settings
from controlplane.wire import RoutingUpdate

_FIRST_UPDATE_TIMEOUT_S = 60.0


class HandleRuntime:
    """The process's routers for handles, fed by one routing subscription."""

    _instance: "HandleRuntime | None" = None

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.routers = RouterSet(settings.namespace, SystemClock(), settings=settings.router)
        self._known: dict[str, asyncio.Event] = {}
        self._subscriber = RoutingSubscriber(settings, self._on_update)
        self._subscriber.start()

    @classmethod
    def install(cls, settings: Settings) -> "HandleRuntime":
        """Create the process's runtime on the running loop (once)."""
        if cls._instance is None:
            cls._instance = cls(settings, asyncio.get_running_loop())
        return cls._instance

    @classmethod
    def current(cls) -> "HandleRuntime":
        if cls._instance is None:
            raise RuntimeError("deployment handles work inside fleetplane replicas only")
        return cls._instance

    def _on_update(self, key: str, update: RoutingUpdate | None) -> None:
        self.routers.update(key, update)
        self._known.setdefault(key, asyncio.Event()).set()

    async def call(self, key: str, method: str, args: tuple, kwargs: dict) -> Any:
        known = self._known.setdefault(key, asyncio.Event())
        await asyncio.wait_for(known.wait(), _FIRST_UPDATE_TIMEOUT_S)
        return await self.routers.call(key, method, args, kwargs)


class DeploymentResponse:
    """The pending result of a handle call."""

    def __init__(self, future: asyncio.Future | concurrent.futures.Future) -> None:
        self._future = future

    def __await__(self):
        if isinstance(self._future, concurrent.futures.Future):
            return asyncio.wrap_future(self._future).__await__()
        return self._future.__await__()

    def result(self, timeout_s: float | None = None) -> Any:
        """Block for the result (from sync user code, which runs off the event loop)."""
        if isinstance(self._future, concurrent.futures.Future):
            return self._future.result(timeout_s)
        raise RuntimeError("use `await response` on the event loop, not .result()")


class _Method:
    def __init__(self, handle: "DeploymentHandle", method: str) -> None:
        self._handle, self._method = handle, method

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse:
        return self._handle._call(self._method, args, kwargs)


class DeploymentHandle:
    def __init__(self, app: str, deployment: str, method: str = "__call__") -> None:
        self.app_name, self.deployment_name, self._method = app, deployment, method

    @property
    def key(self) -> str:
        return f"{self.app_name}/{self.deployment_name}"

    def options(self, method_name: str | None = None, **_: Any) -> "DeploymentHandle":
        return DeploymentHandle(self.app_name, self.deployment_name, method_name or self._method)

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse:
        return self._call(self._method, args, kwargs)

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def _call(self, method: str, args: tuple, kwargs: dict) -> DeploymentResponse:
        runtime = HandleRuntime.current()
        coro = runtime.call(self.key, method, args, kwargs)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is runtime.loop:
            return DeploymentResponse(running.create_task(coro))
        return DeploymentResponse(asyncio.run_coroutine_threadsafe(coro, runtime.loop))

    def __reduce__(self):  # handles can be passed on to other deployments
        return DeploymentHandle, (self.app_name, self.deployment_name, self._method)
