"""How a router reaches replicas: the ``ReplicaTransport`` protocol and its Ray
implementation, the one place where Ray's errors become ours.

A transport carries both kinds of request a router places: a handle call (``send``) and
an HTTP exchange (``send_http``: one round trip for a plain response; the replica yields
the response head first, then body chunks, for a streamed one; ``Replica.handle_http``).
Error translation, the same for both:

- the replica's actor is gone (Ray's ActorDiedError / ActorUnavailableError for *this*
  call) -> ``ReplicaUnavailableError`` before a response started, ``StreamAborted`` after;
- the user's code raised -> the user's exception (unwrapped) for a handle call; for HTTP
  ``DeploymentRaised`` (the front door answers a 500 that names a request id, never the
  exception's text by default), or a downstream handle's rejection answered with its own
  status and Retry-After;
- the caller went away (cancelled) -> the replica's work is cancelled too.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Protocol

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from controlplane.errors import (BackpressureError, DeploymentRaised, ReplicaUnavailableError,
                                 first_line)
from controlplane.routing.actor_lookup import ActorLookup, LookupTimeout
from controlplane.routing.asgi import rejection_headers, respond
from controlplane.wire import HTTPRequestData, ReplicaInfo

_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)


class StreamAborted(Exception):
    """A response failed after its head was sent; the proxy aborts the connection."""

    def __init__(self, replica_id: str, reason: str) -> None:
        super().__init__(replica_id, reason)
        self.replica_id, self.reason = replica_id, reason


class ReplicaTransport(Protocol):
    """How a router reaches replicas; the proxy and handles implement it over Ray.

    ``send`` raises ``ReplicaUnavailableError`` when the replica's actor is gone; any
    other exception is the user's and passes through the router unchanged.
    ``probe_queue_len`` answers the replica's ongoing + queued requests
    (``Replica.get_queue_len``), with its engine's KV-cache use (0-1) as a second number
    where the replica reports one, within ``deadline_s``, and must never wait for a request
    slot (a health or load check never uses what it protects: ARCHITECTURE.md,
    principle 3). ``send_http`` answers one HTTP request on ``send`` (an
    ASGI send) and returns the status sent, or raises ``DeploymentRaised`` having sent
    nothing.
    """

    async def send(self, replica: ReplicaInfo, request: Any) -> Any: ...

    async def probe_queue_len(self, replica: ReplicaInfo,
                              deadline_s: float) -> int | tuple[int, float]: ...

    async def send_http(self, replica: ReplicaInfo, data: HTTPRequestData, send: Any) -> int: ...


class RayTransport:
    """ReplicaTransport over Ray actor calls; actor handles looked up off the event loop
    and kept by name (``actor_lookup``: a GCS that does not answer never stops a loop)."""

    def __init__(self, namespace: str) -> None:
        self._lookup = ActorLookup(namespace)

    async def handle(self, replica: ReplicaInfo) -> Any:
        try:
            return await self._lookup.get(replica.actor_name)
        except ValueError:
            raise ReplicaUnavailableError(replica.replica_id, "actor not found") from None
        except LookupTimeout as e:
            raise ReplicaUnavailableError(replica.replica_id, str(e)) from None

    def warm(self, replica: ReplicaInfo) -> None:
        """The replica joined the set: its handle is looked up now, not at its first
        request (which may come while the GCS does not answer)."""
        self._lookup.warm([replica.actor_name])

    def forget(self, replica: ReplicaInfo) -> None:
        """The replica left the set: drop its handle. Its name may come back on another
        actor (a restarted shard issues ids again from the live replicas it finds), and a
        cached handle would reach the dead one; the cache also stays bounded by the set."""
        self._lookup.forget(replica.actor_name)

    def _gone(self, replica: ReplicaInfo, error: BaseException) -> ReplicaUnavailableError:
        self._lookup.forget(replica.actor_name)
        return ReplicaUnavailableError(replica.replica_id, first_line(error))

    async def send(self, replica: ReplicaInfo, request: tuple) -> Any:
        """``request``: (method, args, kwargs[, RequestMeta])."""
        try:
            return await (await self.handle(replica)).handle_request.remote(*request)
        except _GONE as e:
            raise self._gone(replica, e) from None
        except RayTaskError as e:  # the user's exception, unwrapped from Ray
            raise _unwrapped(e) from None

    async def stream(self, replica: ReplicaInfo, request: tuple) -> AsyncIterator[Any]:
        """A streamed handle call: the items as the replica's generator yields them."""
        gen = (await self.handle(replica)).handle_request_stream.options(
            num_returns="streaming").remote(*request)
        try:
            async for ref in gen:
                yield await ref
        except asyncio.CancelledError:
            ray.cancel(gen)
            raise
        except _GONE as e:
            raise self._gone(replica, e) from None
        except RayTaskError as e:
            raise _unwrapped(e) from None

    async def probe_queue_len(self, replica: ReplicaInfo,
                              deadline_s: float) -> int | tuple[int, float]:
        try:
            handle = await self.handle(replica)
            return await asyncio.wait_for(handle.get_queue_len.remote(), deadline_s)
        except _GONE as e:
            raise self._gone(replica, e) from None

    async def send_http(self, replica: ReplicaInfo, data: HTTPRequestData, send: Any) -> int:
        """One round trip for a plain response; a second call streams a generator's."""
        handle = await self.handle(replica)
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
            raise self._gone(replica, e) from None
        except RayTaskError as e:
            return await _user_error(send, e)
        await send({"type": "http.response.start", "status": head["status"],
                    "headers": head["headers"]})
        await self._stream_body(replica, gen, send)
        return head["status"]

    async def _stream_body(self, replica: ReplicaInfo, gen: Any, send: Any) -> None:
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
                self._lookup.forget(replica.actor_name)
            raise StreamAborted(replica.replica_id, first_line(e)) from None
        await send({"type": "http.response.body", "body": b""})


async def relay_websocket(handle: Any, data: HTTPRequestData, subprotocols: list[str],
                          receive: Any, send: Any) -> None:
    """One WebSocket between the client (``receive``/``send`` of the proxy's ASGI server)
    and a replica's ``@serve.ingress`` app: every client message goes on with
    ``ws_push``, in order; every app message comes back from the ``ws_events`` stream.
    Returns when the app has closed or returned (the client's end reaches the app as
    ``websocket.disconnect``)."""
    ws_id = await handle.ws_open.remote(data, subprotocols)
    events = handle.ws_events.options(num_returns="streaming").remote(ws_id)

    async def upstream() -> None:
        while True:
            message = await receive()
            await handle.ws_push.remote(ws_id, message)
            if message["type"] == "websocket.disconnect":
                return

    pushing = asyncio.ensure_future(upstream())
    try:
        async for ref in events:
            await send(await ref)
    finally:
        pushing.cancel()
        ray.cancel(events)


def _unwrapped(error: RayTaskError) -> BaseException:
    """The user's exception, unwrapped from Ray's."""
    return error.cause if isinstance(error.cause, Exception) else error


def user_error_text(error: RayTaskError) -> str:
    """The user's exception as ``Type: message`` (RayTaskError's str carries their
    traceback)."""
    cause = error.cause
    return f"{type(cause).__name__}: {cause}" if cause is not None else first_line(error)


async def _user_error(send: Any, error: RayTaskError) -> int:
    """A downstream handle's backpressure keeps its status and Retry-After (it is not this
    deployment's admission); anything else is ``DeploymentRaised``: the replica's own (its
    request id names the traceback in the replica's log), or one made here from what Ray
    carried (a replica of an older version)."""
    if isinstance(error.cause, BackpressureError):
        cause = error.cause
        await respond(send, cause.status_code, str(cause), rejection_headers(cause.headers()))
        return cause.status_code
    if isinstance(error.cause, DeploymentRaised):  # the replica's: its request id, logged there
        raise error.cause from None
    raise DeploymentRaised(user_error_text(error), str(error)) from None
