"""The routers of one process (a proxy, or a replica holding handles) and the Ray
transport they call replicas through.

``RouterSet`` keeps one ``Router`` per deployment, fed by ``RoutingSubscriber`` pushes.
HTTP requests hold their router slot for the whole streamed response: the replica yields
the response head first, then body chunks (``Replica.handle_http``).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from controlplane.clock import Clock
from controlplane.router import Router
from controlplane.router_types import (BackpressureError, ReplicaInfo, ReplicaUnavailableError,
                                       RouterClosedError, RouterSettings, RoutingConfig)

_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)


class RayTransport:
    """ReplicaTransport over Ray actor calls; actor handles cached by name."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self._handles: dict[str, Any] = {}

    def handle(self, replica: ReplicaInfo) -> Any:
        handle = self._handles.get(replica.actor_name)
        if handle is None:
            try:
                handle = ray.get_actor(replica.actor_name, namespace=self._namespace)
            except ValueError:
                raise ReplicaUnavailableError(replica.replica_id, "actor not found") from None
            self._handles[replica.actor_name] = handle
        return handle

    def forget(self, replica: ReplicaInfo) -> None:
        self._handles.pop(replica.actor_name, None)

    async def send(self, replica: ReplicaInfo, request: tuple[str, tuple, dict]) -> Any:
        method, args, kwargs = request
        try:
            return await self.handle(replica).handle_request.remote(method, args, kwargs)
        except _GONE as e:
            self.forget(replica)
            raise ReplicaUnavailableError(replica.replica_id, _first_line(e)) from None

    async def probe_queue_len(self, replica: ReplicaInfo, deadline_s: float) -> int:
        try:
            return await asyncio.wait_for(self.handle(replica).get_queue_len.remote(),
                                          deadline_s)
        except _GONE as e:
            self.forget(replica)
            raise ReplicaUnavailableError(replica.replica_id, _first_line(e)) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def user_error_text(error: RayTaskError) -> str:
    """The user's exception as text (RayTaskError's str carries their traceback)."""
    cause = error.cause
    return f"{type(cause).__name__}: {cause}" if cause is not None else _first_line(error)


class StreamAborted(Exception):
    """A response failed after its head was sent; the proxy aborts the connection."""

    def __init__(self, replica_id: str, reason: str) -> None:
        super().__init__(replica_id, reason)
        self.replica_id, self.reason = replica_id, reason


class RouterSet:
    def __init__(self, namespace: str, clock: Clock, rng: random.Random | None = None,
                 settings: RouterSettings = RouterSettings()) -> None:
        self.transport = RayTransport(namespace)
        self._settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._routers: dict[str, Router] = {}

    def update(self, key: str, payload: dict | None) -> None:
        router = self._routers.get(key)
        if payload is None:
            if router is not None:
                router.close("the deployment was deleted")
                del self._routers[key]
            return
        if router is None:
            config = RoutingConfig.from_routing_update(key, payload)
            router = self._routers[key] = Router(config, self.transport, self._clock, self._rng,
                                                 self._settings)
        router.apply_routing_update(payload)

    def _placeable(self, key: str) -> Router | None:
        """The deployment's router, or None while it has no running replica: waiting
        would hang the caller for as long as none run (starting, failed to deploy, all
        dead), so HTTP and handle callers alike are answered at once."""
        router = self._routers.get(key)
        return router if router is not None and router.num_replicas > 0 else None

    async def call(self, key: str, method: str, args: tuple, kwargs: dict) -> Any:
        """A handle call: the user's result, or their exception (unwrapped from Ray)."""
        router = self._placeable(key)
        if router is None:
            raise RouterClosedError(key, "it has no running replicas")
        try:
            return await router.assign((method, args, kwargs))
        except RayTaskError as e:
            raise (e.cause if isinstance(e.cause, Exception) else e) from None

    async def serve_http(self, key: str, data: Any,
                         send: Any) -> tuple[int, BackpressureError | None]:
        """Answer one HTTP request through the deployment's router. Returns the status
        sent and, for a backpressure rejection, the rejection (for metrics). Raises
        StreamAborted when the replica failed after the response head went out."""
        router = self._placeable(key)
        if router is None:  # with the same hint a rejection gives
            await respond(send, 503, f"deployment {key} has no running replicas",
                         [(b"retry-after", b"1")])
            return 503, None
        try:
            async with router.slot() as replica:
                return await self._stream(replica, data, send), None
        except BackpressureError as e:
            headers = [(k.lower().encode(), v.encode()) for k, v in e.headers().items()]
            await respond(send, e.status_code, str(e), headers)
            return e.status_code, e
        except (ReplicaUnavailableError, RouterClosedError) as e:
            await respond(send, e.status_code, str(e))  # only raised before the head
            return e.status_code, None

    async def _stream(self, replica: ReplicaInfo, data: Any, send: Any) -> int:
        """One round trip for a plain response; a second call streams a generator's."""
        handle = self.transport.handle(replica)
        ref = gen = None
        try:
            ref = handle.handle_http.remote(data)
            reply = await ref
            if reply[0] == "full":
                _, head, body = reply
                await send({"type": "http.response.start", "status": head["status"],
                            "headers": head["headers"]})
                await send({"type": "http.response.body", "body": body})
                return head["status"]
            gen = handle.stream_http.options(num_returns="streaming").remote(reply[1])
            head = await (await gen.__anext__())
        except asyncio.CancelledError:  # the client went away: stop the replica's work
            ray.cancel(gen if gen is not None else ref)
            raise
        except _GONE as e:
            self.transport.forget(replica)
            raise ReplicaUnavailableError(replica.replica_id, _first_line(e)) from None
        except RayTaskError as e:
            return await _user_error(send, e)
        await send({"type": "http.response.start", "status": head["status"],
                    "headers": head["headers"]})
        try:
            async for ref in gen:
                await send({"type": "http.response.body", "body": await ref, "more_body": True})
        except asyncio.CancelledError:
            ray.cancel(gen)
            raise
        except (RayTaskError, *_GONE) as e:
            # The head is out, so the status cannot change. Ending the body normally would
            # pass a truncated response off as complete: abort the connection instead.
            if isinstance(e, _GONE):
                self.transport.forget(replica)
            raise StreamAborted(replica.replica_id, _first_line(e)) from None
        await send({"type": "http.response.body", "body": b""})
        return head["status"]


async def _user_error(send: Any, error: RayTaskError) -> int:
    """The user's exception as a response: a downstream handle's backpressure keeps its
    status and Retry-After; anything else is a 500 with the exception's message."""
    if isinstance(error.cause, BackpressureError):
        cause = error.cause
        headers = [(k.lower().encode(), v.encode()) for k, v in cause.headers().items()]
        await respond(send, cause.status_code, str(cause), headers)
        return cause.status_code
    await respond(send, 500, f"the deployment raised {user_error_text(error)}")
    return 500


async def respond(send: Any, status: int, body: bytes | str,
                  headers: list[tuple[bytes, bytes]] = (),
                  content_type: bytes = b"text/plain; charset=utf-8") -> None:
    """A complete, non-streamed ASGI response."""
    body = body.encode() if isinstance(body, str) else body
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
