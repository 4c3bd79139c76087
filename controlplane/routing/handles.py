"""Deployment handles: user code and driver scripts calling a deployment, as in Ray Serve.

``handle.remote(*args)`` / ``handle.method.remote(*args)`` return a ``DeploymentResponse``
that async code awaits and sync code reads with ``.result()``; a response passed as an
argument to another call is resolved first (chaining, as Serve does);
``handle.options(method_name=..., multiplexed_model_id=..., stream=True)`` picks the
method, the multiplexed model (routed to a replica holding it) and a streamed result
(``DeploymentResponseGenerator``: ``async for`` or ``for``). Calls go through the same
``Router`` as HTTP (power of two choices, backpressure: a full queue raises
``BackpressureError`` carrying ``retry_after_s``).

One ``HandleRuntime`` per process follows routes and replica sets by long-poll. It is made
on first use, never before (a replica that holds no handle subscribes to nothing): on the
replica's event loop inside a replica (``set_home``), on a background thread's loop in a
driver script connected to the cluster.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import replace
from typing import Any, AsyncIterator, Iterator

from controlplane.clock import SystemClock
from controlplane.routing.router_set import RouterSet
from controlplane.routing.subscriber import RoutingSubscriber
from controlplane.settings import Settings
from controlplane.wire import RequestMeta, RoutingUpdate

_FIRST_UPDATE_TIMEOUT_S = 60.0


class HandleRuntime:
    """The process's routers for handles, fed by one routing subscription."""

    _instance: "HandleRuntime | None" = None
    _home: tuple[asyncio.AbstractEventLoop, Settings] | None = None  # in a replica
    _driver: tuple[asyncio.AbstractEventLoop, Settings] | None = None  # in a driver
    _lock = threading.Lock()

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop,
                 in_driver: bool = False) -> None:
        self.loop = loop
        self.routers = RouterSet(settings.namespace, SystemClock(), settings=settings.router)
        self._known: dict[str, asyncio.Event] = {}
        self._in_driver = in_driver
        self._subscriber = RoutingSubscriber(settings, self._on_update,
                                             get_actor=self._get_actor,
                                             demands=self.routers.demands)
        self._subscriber.start()

    def _get_actor(self, name: str, namespace: str) -> Any:
        """``ray.get_actor``, except that a driver that disconnected (``ray.shutdown()``)
        ends its runtime here: Ray would otherwise start or join a cluster by itself."""
        import ray

        if self._in_driver and not ray.is_initialized():
            self._end()
            raise asyncio.CancelledError()  # the subscriber's loop ends with it
        return ray.get_actor(name, namespace=namespace)

    def _end(self) -> None:
        """The driver disconnected: stop following, and let a reconnected driver make a
        fresh runtime."""
        with HandleRuntime._lock:
            if HandleRuntime._instance is self:
                HandleRuntime._instance = HandleRuntime._driver = None
        self._subscriber.stop()
        self.loop.call_soon(self.loop.stop)

    @classmethod
    def set_home(cls, loop: asyncio.AbstractEventLoop, settings: Settings) -> None:
        """Inside a replica: the runtime, when first needed, lives on this loop."""
        cls._home = (loop, settings)

    @classmethod
    def current(cls) -> "HandleRuntime":
        """The process's runtime, made on first use, from any thread. It is only ever made
        on its own loop's thread (no lock held while waiting for that loop)."""
        if cls._instance is not None:
            return cls._instance
        loop, settings = cls._home if cls._home is not None else cls._driver_loop()
        in_driver = cls._home is None
        if _running_loop() is loop:
            return cls._get_or_make(loop, settings, in_driver)

        async def make() -> HandleRuntime:
            return cls._get_or_make(loop, settings, in_driver)
        return asyncio.run_coroutine_threadsafe(make(), loop).result()

    @classmethod
    def _get_or_make(cls, loop: asyncio.AbstractEventLoop, settings: Settings,
                     in_driver: bool) -> "HandleRuntime":
        if cls._instance is None:
            cls._instance = cls(settings, loop, in_driver)
        return cls._instance

    @classmethod
    def _driver_loop(cls) -> tuple[asyncio.AbstractEventLoop, Settings]:
        """A driver script's: a loop on a background thread, started once."""
        import ray

        with cls._lock:
            if cls._driver is None:
                if not ray.is_initialized():
                    raise RuntimeError("deployment handles need a connection to the "
                                       "cluster: call ray.init(address=...) first")
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="fleetplane-handles",
                                 daemon=True).start()
                cls._driver = (loop, Settings())
            return cls._driver

    def _on_update(self, key: str, update: RoutingUpdate | None) -> None:
        self.routers.update(key, update)
        self._known.setdefault(key, asyncio.Event()).set()

    async def _ready(self, key: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Wait for the deployment's first replica set; resolve chained responses."""
        known = self._known.setdefault(key, asyncio.Event())
        await asyncio.wait_for(known.wait(), _FIRST_UPDATE_TIMEOUT_S)
        args = tuple([await _resolved(a) for a in args])
        kwargs = {k: await _resolved(v) for k, v in kwargs.items()}
        return args, kwargs

    async def call(self, key: str, method: str, args: tuple, kwargs: dict,
                   meta: RequestMeta | None = None) -> Any:
        args, kwargs = await self._ready(key, args, kwargs)
        return await self.routers.call(key, method, args, kwargs, meta)

    async def stream(self, key: str, method: str, args: tuple, kwargs: dict,
                     meta: RequestMeta | None = None) -> AsyncIterator[Any]:
        args, kwargs = await self._ready(key, args, kwargs)
        async for item in self.routers.stream(key, method, args, kwargs, meta):
            yield item


async def _resolved(value: Any) -> Any:
    return await value if isinstance(value, DeploymentResponse) else value


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread
        return None


def _on_loop(runtime: HandleRuntime) -> bool:
    return _running_loop() is runtime.loop


class DeploymentResponse:
    """The pending result of a handle call."""

    def __init__(self, future: asyncio.Future | concurrent.futures.Future) -> None:
        self._future = future

    def __await__(self):
        if isinstance(self._future, concurrent.futures.Future):
            return asyncio.wrap_future(self._future).__await__()
        return self._future.__await__()

    def result(self, timeout_s: float | None = None) -> Any:
        """Block for the result (from sync code: a driver, or user code off the loop)."""
        if isinstance(self._future, concurrent.futures.Future):
            return self._future.result(timeout_s)
        raise RuntimeError("use `await response` on the event loop, not .result()")


class DeploymentResponseGenerator:
    """The items of a ``stream=True`` call: ``async for`` on the runtime's loop (or any
    loop), ``for`` from sync code."""

    def __init__(self, runtime: HandleRuntime, stream: AsyncIterator[Any]) -> None:
        self._runtime, self._stream = runtime, stream

    def __aiter__(self) -> AsyncIterator[Any]:
        if _on_loop(self._runtime):
            return self._stream.__aiter__()
        return self._relayed()

    async def _relayed(self) -> AsyncIterator[Any]:
        loop = self._runtime.loop
        while True:
            future = asyncio.run_coroutine_threadsafe(_next_or_end(self._stream), loop)
            done, item = await asyncio.wrap_future(future)
            if done:
                return
            yield item

    def __iter__(self) -> Iterator[Any]:
        if _on_loop(self._runtime):
            raise RuntimeError("use `async for` on the event loop, not `for`")
        while True:
            future = asyncio.run_coroutine_threadsafe(_next_or_end(self._stream),
                                                      self._runtime.loop)
            done, item = future.result()
            if done:
                return
            yield item


async def _next_or_end(stream: AsyncIterator[Any]) -> tuple[bool, Any]:
    try:
        return False, await stream.__anext__()
    except StopAsyncIteration:
        return True, None


class _Method:
    def __init__(self, handle: "DeploymentHandle", method: str) -> None:
        self._handle, self._method = handle, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle.options(method_name=self._method).remote(*args, **kwargs)


class DeploymentHandle:
    def __init__(self, app: str, deployment: str, method: str = "__call__",
                 meta: RequestMeta = RequestMeta(), stream: bool = False) -> None:
        self.app_name, self.deployment_name, self._method = app, deployment, method
        self._meta, self._stream = meta, stream

    @property
    def key(self) -> str:
        return f"{self.app_name}/{self.deployment_name}"

    def options(self, method_name: str | None = None, multiplexed_model_id: str | None = None,
                stream: bool | None = None, **_: Any) -> "DeploymentHandle":
        """Serve's options that change a call; the rest (e.g. ``use_new_handle_api``)
        are accepted and have no effect here."""
        meta = self._meta if multiplexed_model_id is None else \
            replace(self._meta, model_id=multiplexed_model_id)
        return DeploymentHandle(self.app_name, self.deployment_name,
                                method_name or self._method, meta,
                                self._stream if stream is None else stream)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        runtime = HandleRuntime.current()
        if self._stream:
            stream = runtime.stream(self.key, self._method, args, kwargs, self._meta)
            return DeploymentResponseGenerator(runtime, stream)
        coro = runtime.call(self.key, self._method, args, kwargs, self._meta)
        if _on_loop(runtime):
            return DeploymentResponse(runtime.loop.create_task(coro))
        return DeploymentResponse(asyncio.run_coroutine_threadsafe(coro, runtime.loop))

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def __reduce__(self):  # handles can be passed on to other deployments
        return DeploymentHandle, (self.app_name, self.deployment_name, self._method,
                                  self._meta, self._stream)
