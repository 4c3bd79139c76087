"""The replica actor: a thin shell over ``UserCallable`` plus request accounting, the
periodic metric report to the owning shard, push health (one ``ReplicaHealth``:
self-checks at half the health period, carried on the metric report, heartbeats as
fallback) and the shard's death watch (``wait_until_stopped``).

Lifecycle calls (``initialize``, ``check_health``, ``reconfigure``, ``prepare_for_shutdown``)
never wait on a request slot: requests take ``max_ongoing_requests`` slots of a semaphore,
control calls take none (ARCHITECTURE.md, principle 3: a health check must not use what
it protects). ``wait_until_stopped`` stays pending until ``prepare_for_shutdown`` starts;
the shard keeps one such call per replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import os
from typing import Any, AsyncIterator

import ray
import ray.cloudpickle as cloudpickle

from controlplane.clock import SystemClock
from controlplane.errors import BackpressureError
from controlplane.routing.asgi import MODEL_ID_HEADER, header_value
from controlplane.routing.handles import DeploymentHandle, HandleRuntime
from controlplane.routing.serve_api import install_serve_api
from controlplane.settings import Settings
from controlplane.wire import (DeploymentRef, HTTPRequestData, MetricReport, PushedHealth,
                               ReplicaDescription, ReplicaInit, RequestError, RequestMeta)
from replicas.context import ReplicaContext, set_replica_context, set_start_reporter
from replicas.serve_context import (ModelIds, ServeIdentity, install_replica_context,
                                    serve_in_use, set_request_context)
from replicas.direct_ingress import DirectIngress, DirectIngressApp
from replicas.asgi_websocket import WebSocketSession, websocket_scope
from replicas.http_adapter import asgi_scope, is_streaming, response_parts, unary_response
from replicas.node_reporter import report_sender
from replicas.report_sender import AutoscalingStatsSender
from replicas.replica_health import ReplicaHealth
from replicas.request_errors import RequestErrors
from replicas.self_health import HealthCheckFailed
from replicas.user_callable import UserCallable

logger = logging.getLogger(__name__)

_STREAM_ABANDON_S = 60.0  # a started stream the proxy never pulls releases its slot then


class Replica:
    def __init__(self, init: ReplicaInit) -> None:
        self._init = init
        self._rank = init.rank
        self._user_config = init.user_config  # as last applied: init, then reconfigure
        self._user: UserCallable | None = None
        self._slots = asyncio.Semaphore(init.max_ongoing_requests)
        self._ongoing = 0
        self._queued = 0
        self._idle = asyncio.Event()  # set while no request is queued or executing
        self._idle.set()
        self._reporter: asyncio.Task | None = None
        self._clock = SystemClock()
        self._health: ReplicaHealth | None = None  # once initialize constructed the user's code
        self._ingress: DirectIngress | None = None  # haproxy mode: its own HTTP listener
        self._stopped = asyncio.Event()  # set when the shard asked this replica to stop
        self._streams: dict[int, tuple[Any, contextlib.AsyncExitStack]] = {}
        self._stream_ids = itertools.count()
        self._sockets: dict[int, tuple[WebSocketSession, contextlib.AsyncExitStack]] = {}
        self._relayed: set[int] = set()  # sockets whose ws_events stream runs
        self._errors = RequestErrors(self._report_error)  # what the user's code raised
        self._set_context()

    def _set_context(self) -> None:
        """fleetplane's context and Ray Serve's (``serve.get_replica_context()``)."""
        i = self._init
        set_replica_context(ReplicaContext(i.app_name, i.deployment, i.replica_id, self._rank,
                                           i.world_size))
        install_replica_context(ServeIdentity(
            i.app_name, i.deployment, i.replica_id, self._rank, i.world_size,
            i.max_ongoing_requests, self._user_config),
            self._user.servable if self._user is not None else None)

    def _serve_rank(self) -> Any:
        """The rank a ``reconfigure(user_config, rank)`` gets: Serve's ``ReplicaRank``
        when the user's code uses Serve, else the plain number."""
        if not serve_in_use():
            return self._rank
        from ray.serve.schema import ReplicaRank

        return ReplicaRank(rank=self._rank, node_rank=0, local_rank=self._rank)

    def _report_error(self, error: RequestError) -> None:
        i = self._init
        shard = ray.get_actor(i.shard_name, namespace=i.namespace)
        shard.report_request_error.remote((i.app_name, i.deployment), i.replica_id, error)

    def _on_model_ids(self, ids: tuple[str, ...]) -> None:
        """Serve's multiplexer loaded or evicted a model: the shard routes by it."""
        i = self._init
        shard = ray.get_actor(i.shard_name, namespace=i.namespace)
        shard.report_model_ids.remote((i.app_name, i.deployment), i.replica_id, ids)

    async def initialize(self) -> dict:
        """Construct the user's code, apply user_config, run a fresh health check (never a
        cached one), then start self-health and the metric reports."""
        # Handles (constructor arguments, serve.get_app_handle) route from this loop.
        HandleRuntime.set_home(asyncio.get_running_loop(),
                               Settings(namespace=self._init.namespace))
        install_serve_api()
        target, args, kwargs = cloudpickle.loads(self._init.serialized_def)
        self._user = UserCallable(target, args, kwargs, resolve_arg=self._resolve_arg)
        self._set_context()  # Serve's too, now that the user's modules are imported
        ModelIds(self._on_model_ids).install()
        i = self._init
        shard = ray.get_actor(i.shard_name, namespace=i.namespace)
        set_start_reporter(lambda text: shard.report_start_progress.remote(
            (i.app_name, i.deployment), i.replica_id, text))
        try:
            await self._start_user_code(shard)
        finally:
            set_start_reporter(None)
        self._reporter = asyncio.get_running_loop().create_task(self._report_forever(shard))
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "actor_id": ctx.get_actor_id(), "pid": os.getpid(),
                "http_address": await self._start_ingress()}

    async def _start_user_code(self, shard: Any) -> None:
        """Construct, configure, and pass a fresh health check (the user's constructor may
        say what it is doing meanwhile: ``context.report_start_progress``)."""
        await self._user.construct()
        self._set_context()  # now with the servable object
        await self._user.reconfigure(self._init.user_config, self._serve_rank())
        self._health = self._make_health(shard)
        await self._health.start()  # a failing fresh check fails initialization

    async def _start_ingress(self) -> str | None:
        """Haproxy mode: listen for HTTP on an ephemeral port; the address goes to the
        shard, which publishes it to the nodes' HAProxies."""
        config = self._init.direct_ingress
        if config is None:
            return None
        app = DirectIngressApp(config, self._serve_direct, self._queue_len,
                               self._init.max_ongoing_requests,
                               healthy=lambda: self._health is not None and self._health.healthy,
                               websocket=self._websocket_direct if self._user.asgi_app else None)
        self._ingress = DirectIngress(app, config.host)
        return await self._ingress.start()

    async def _serve_direct(self, data: HTTPRequestData, send: Any) -> None:
        """One direct-ingress request: the user's code in a slot, the response sent as it
        is produced. What the user's code raises before the head is ``DeploymentRaised``
        (``RequestErrors``: logged here, told to the shard): the front door answers it, a
        500 naming its request id."""
        async with self._slot():
            try:
                self._request_context(data)
                result = await self._user.call_http(data)
                parts = response_parts(result)
                head = await parts.__anext__()
            except BackpressureError:  # a downstream handle's: answered with its hint
                raise
            except Exception as e:
                raise self._errors.raised(e) from e
            await send({"type": "http.response.start", **head})
            async for chunk in parts:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    async def _websocket_direct(self, scope: dict, receive: Any, send: Any) -> None:
        """A direct-ingress WebSocket: the ingress app on the client's own connection,
        in one slot for the socket's life."""
        async with self._slot():
            set_request_context(self._init.app_name, route=scope.get("root_path") or "/")
            await self._user.asgi_app(scope, receive, send)

    def _make_health(self, shard: Any) -> ReplicaHealth:
        i = self._init
        key = (i.app_name, i.deployment)

        async def send_heartbeat(payload: PushedHealth) -> None:
            await shard.report_health.remote(key, i.replica_id, payload)

        return ReplicaHealth(
            self._user.check_health, clock=self._clock, send_heartbeat=send_heartbeat,
            replica_id=i.replica_id, shard_name=i.shard_name,
            period_s=i.health_check_period_s, timeout_s=i.health_check_timeout_s,
            unhealthy_threshold=i.unhealthy_threshold,
            report_interval_s=i.metrics_report_interval_s)

    def _resolve_arg(self, value: Any) -> Any:
        """A bound deployment passed to the constructor becomes a handle to it."""
        if isinstance(value, DeploymentRef):
            return DeploymentHandle(value.app, value.name)
        return value

    # ---- health: delegations to ReplicaHealth ------------------------------------------
    async def check_health(self) -> None:
        """A pull probe: the cached result while the self-health task runs."""
        if self._health is None:
            raise HealthCheckFailed("replica is not initialized yet")
        await self._health.check_for_probe()

    async def update_health_timings(self, period_s: float, timeout_s: float) -> None:
        """A redeploy changed health_check_period_s / _timeout_s in place."""
        if self._health is not None:
            self._health.set_timings(period_s, timeout_s)

    async def wait_until_stopped(self) -> None:
        """Returns once the shard asked this replica to stop. The shard keeps one of these
        pending per replica as its death watch: Ray fails the call when the actor dies, so
        death is seen at once without any periodic call."""
        await self._stopped.wait()

    async def reconfigure(self, user_config: Any) -> None:
        await self._user.reconfigure(user_config, self._serve_rank())
        self._user_config = user_config
        self._set_context()

    async def describe(self) -> ReplicaDescription:
        """For a recovering shard: identity, rank, versions, placement, and a fresh
        self-check (a failing user check is reported, not raised)."""
        ctx = ray.get_runtime_context()
        healthy, message = True, ""
        if self._health is not None:
            try:
                await self._health.check_fresh()
            except Exception as e:  # HealthCheckFailed, or the user's check raising
                healthy, message = False, f"{type(e).__name__}: {e}"
        i = self._init
        return ReplicaDescription(
            replica_id=i.replica_id, rank=self._rank, code_version=i.code_version,
            user_config=self._user_config, actor_id=ctx.get_actor_id(),
            node_id=ctx.get_node_id(), initialized=self._health is not None,
            stopping=self._stopped.is_set(), healthy=healthy, message=message,
            http_address=self._ingress.address if self._ingress is not None else None)

    async def update_rank(self, rank: int) -> None:
        """A new rank (ranks stay compact): in the contexts, and to a ``reconfigure`` that
        takes ``rank`` (Serve calls it on every rank change)."""
        self._rank = rank
        self._set_context()
        if self._user is not None:
            await self._user.reconfigure(None, self._serve_rank())

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """Hold one of max_ongoing_requests slots; counts queued and ongoing requests."""
        self._idle.clear()
        self._queued += 1
        try:
            await self._slots.acquire()
        finally:
            self._queued -= 1
        self._ongoing += 1
        try:
            yield
        finally:
            self._ongoing -= 1
            self._slots.release()
            if not (self._ongoing or self._queued):
                self._idle.set()

    async def handle_request(self, method: str, args: tuple, kwargs: dict,
                             meta: RequestMeta | None = None) -> Any:
        """A handle call: returns what the user's method returned."""
        async with self._slot():
            set_request_context(self._init.app_name, model_id=meta.model_id if meta else "")
            return await self._user.call(method, args, kwargs)

    async def handle_request_stream(self, method: str, args: tuple, kwargs: dict,
                                    meta: RequestMeta | None = None) -> AsyncIterator[Any]:
        """A handle call with ``stream=True`` (a Ray streaming generator): the items of
        the generator the user's method returned, as produced, in one slot."""
        async with self._slot():
            set_request_context(self._init.app_name, model_id=meta.model_id if meta else "")
            result = await self._user.call(method, args, kwargs)
            if inspect.isasyncgen(result):
                async for item in result:
                    yield item
            elif inspect.isgenerator(result):  # each next() in a thread: user code may block
                done = object()
                while (item := await asyncio.to_thread(next, result, done)) is not done:
                    yield item
            else:
                raise TypeError(f"handle.options(stream=True) needs a generator method; "
                                f"'{method}' returned {type(result).__name__}")

    def _request_context(self, data: HTTPRequestData) -> None:
        set_request_context(self._init.app_name, route=data.route_prefix,
                            model_id=header_value(data.headers, MODEL_ID_HEADER))

    async def handle_http(self, request: HTTPRequestData) -> tuple:
        """An HTTP request in one round trip: ("full", head, body), or, when the user's code
        returned a generator or streaming response, ("stream", stream_id) and the proxy
        pulls the chunks with ``stream_http``. The request keeps its slot until its
        stream ends (or is abandoned: ``_STREAM_ABANDON_S``)."""
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(self._slot())
        try:
            self._request_context(request)
            try:
                result = await self._user.call_http(request)
                full = None if is_streaming(result) else await unary_response(result)
            except BackpressureError:  # a downstream handle's: the proxy keeps its hint
                raise
            except Exception as e:
                raise self._errors.raised(e) from e
            if full is not None:
                return ("full", *full)
            stream_id = next(self._stream_ids)
            self._streams[stream_id] = (result, stack)
            asyncio.get_running_loop().call_later(_STREAM_ABANDON_S, self._abandon, stream_id)
            stack = None
            return ("stream", stream_id)
        finally:
            if stack is not None:
                await stack.aclose()

    async def stream_http(self, stream_id: int) -> AsyncIterator[Any]:
        """A Ray streaming generator: the response head, then body chunks as produced."""
        result, stack = self._streams.pop(stream_id)
        try:
            async for part in response_parts(result):
                yield part
        finally:
            await stack.aclose()

    def _abandon(self, stream_id: int) -> None:
        """The proxy never came for this stream (it died): free the slot."""
        entry = self._streams.pop(stream_id, None)
        if entry is not None:
            asyncio.get_running_loop().create_task(entry[1].aclose())

    async def ws_open(self, request: HTTPRequestData, subprotocols: list[str]) -> int:
        """A WebSocket to the ``@serve.ingress`` app; it holds one slot until it ends.
        The proxy then relays with ``ws_events`` (the app's messages) and ``ws_push``."""
        if self._user.asgi_app is None:
            raise TypeError("WebSockets need an @serve.ingress (ASGI) deployment")
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(self._slot())
        self._request_context(request)  # the session's task inherits it
        scope = websocket_scope(asgi_scope(request), subprotocols)
        ws_id = next(self._stream_ids)
        self._sockets[ws_id] = (WebSocketSession(self._user.asgi_app, scope), stack)
        asyncio.get_running_loop().call_later(_STREAM_ABANDON_S, self._abandon_socket, ws_id)
        return ws_id

    async def ws_push(self, ws_id: int, message: dict) -> None:
        entry = self._sockets.get(ws_id)
        if entry is not None:
            entry[0].push(message)

    async def ws_events(self, ws_id: int) -> AsyncIterator[dict]:
        """A Ray streaming generator of the app's messages, until the app returns."""
        session, stack = self._sockets[ws_id]
        self._relayed.add(ws_id)
        try:
            async for message in session.events():
                yield message
        finally:
            self._sockets.pop(ws_id, None)
            self._relayed.discard(ws_id)
            session.close()
            await stack.aclose()

    def _abandon_socket(self, ws_id: int) -> None:
        """The proxy never came to relay this socket (it died): end it, free the slot."""
        if ws_id in self._relayed or ws_id not in self._sockets:
            return
        session, stack = self._sockets.pop(ws_id)
        session.close()
        asyncio.get_running_loop().create_task(stack.aclose())

    def get_queue_len(self) -> int | tuple[int, float]:
        """For routers' probes: never waits for a slot (ARCHITECTURE.md, principle 3).
        With the engine's KV-cache use where the user's object reports one
        (``UserCallable.kv_cache_usage``, for the kv_load policies)."""
        kv = self._user.kv_cache_usage() if self._user is not None else None
        return self._queue_len() if kv is None else (self._queue_len(), kv)

    def _queue_len(self) -> int:
        return self._ongoing + self._queued

    async def prepare_for_shutdown(self, timeout_s: float) -> None:
        """Drain within one timeout_s budget, in phases:
        1. keep serving for ``drain_min_s``: routers learn by long-poll that this replica
           is stopping, and requests they already sent here still arrive;
        2. wait for in-flight requests to finish;
        3. run the user's clean-up hook (``__del__``), then stop reporting."""
        deadline = self._clock.monotonic() + timeout_s
        self._stopped.set()
        if self._health is not None:
            self._health.stop()
        if self._ingress is not None:
            # Phase 1 (haproxy mode): HAProxy was told to stop sending work here (drain,
            # then maint, in every worker); stay reachable for the deregistration window.
            # Phase 2: close the listener (a stale worker's late connection is refused and
            # retried elsewhere), then count in-flight requests at once.
            window = self._init.direct_ingress.deregistration_window_s
            await asyncio.sleep(min(window, timeout_s))
            self._ingress.close()
        else:
            await asyncio.sleep(min(self._init.drain_min_s, timeout_s))
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - self._clock.monotonic()))
        except asyncio.TimeoutError:
            logger.warning("graceful shutdown: %d request(s) still running after %.1fs",
                           self._ongoing + self._queued, timeout_s)
        try:
            if self._user is not None:
                await self._user.shutdown()
        except Exception:
            logger.exception("the deployment's __del__ raised during shutdown")
        if self._reporter is not None:
            self._reporter.cancel()

    def _report(self) -> MetricReport:
        return MetricReport(replica_id=self._init.replica_id,
                            ongoing_requests=self._ongoing, queued_requests=self._queued,
                            health=self._health.for_report())

    async def _report_forever(self, shard: Any) -> None:
        sender = report_sender(self._init, shard, self._clock)
        stats = AutoscalingStatsSender(self._init, shard, self._clock)
        while True:
            try:  # at most one report in flight: await it before the next
                report = self._report()
                self._health.report_sent()
                await sender.send(report)
                stats.maybe_send(self._user.autoscaling_stats())
            except Exception as e:  # the shard may be restarting; keep reporting
                logger.warning("metric report to %s failed: %r", self._init.shard_name, e)
            await asyncio.sleep(self._init.metrics_report_interval_s)
