"""The HTTP front door of a listener, written once for both: a proxy (every application's
route; admitted by the deployment's router) and a direct-ingress replica in haproxy mode
(its own route; admitted by its own slots). Per request: route -> limits -> admit -> answer.

- route: the listener's own endpoints (``/-/healthz``...) by exact path, then the longest
  matching route prefix (``route_table``, at a segment boundary), else a 404;
- limits: the body is read whole within ``HTTPLimits`` (``http_limits``: 413) before
  admission, so a slow body holds a connection, never a slot; its time limit, like the
  head's, is the connection's (``http_connection``: 408);
- admit and answer: the ``Backend``. What it raises before a response head went out is
  answered here, by type: ``BackpressureError`` with its status and
  the computed Retry-After (``admission``: the same policy at a router and at a replica);
  ``ReplicaUnavailableError``/``RouterClosedError`` with theirs; ``DeploymentRaised`` (the
  user's code raised) as a 500 whose body names its request id (the replica logged the
  traceback under it), the exception's text only with ``show_error_messages``. ``StreamAborted`` (after the
  head) aborts the connection, so a truncated response never passes as complete;
- a client that disconnects cancels its admitted work, freeing its slots (uvicorn does
  not cancel an app by itself).

Per request this costs a dict lookup, the table's match, the body read, and one task
watching for the disconnect; a request id is made only for a 500.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter
from typing import Any, Awaitable, Callable, Mapping, Protocol

from controlplane.errors import (BackpressureError, DeploymentRaised, ReplicaUnavailableError,
                                 RouterClosedError)
from controlplane.routing.asgi import rejection_headers, respond
from controlplane.routing.http_limits import BodyTooLarge, read_body, refuse_body
from controlplane.routing.route_table import RouteTable
from controlplane.routing.transport import StreamAborted
from controlplane.wire import HTTPLimits, HTTPRequestData

logger = logging.getLogger(__name__)

Endpoint = Callable[[Any], Awaitable[None]]  # answers on an ASGI send
_UNAVAILABLE = (ReplicaUnavailableError, RouterClosedError)


class Backend(Protocol):
    """Admits a routed request and answers it (a proxy's ``RouterSet``; a replica's slots).

    ``serve_http`` returns the status it sent (0 where it does not know it) or raises,
    before sending anything, one of the errors the module's docstring lists.
    ``serve_websocket`` accepts or closes the socket itself."""

    async def serve_http(self, key: str, data: HTTPRequestData, send: Any) -> int: ...

    async def serve_websocket(self, key: str, data: HTTPRequestData, scope: dict,
                              receive: Any, send: Any) -> None: ...


class Observer(Protocol):
    """Per-request figures (the proxy's ``ProxyMetrics``)."""

    def observe(self, deployment: str, route: str, status: int, seconds: float) -> None: ...

    def reject(self, deployment: str, status: int, retry_after_s: int | None) -> None: ...


class NoObserver:
    """A listener without per-request figures (a direct-ingress replica)."""

    def observe(self, deployment: str, route: str, status: int, seconds: float) -> None:
        pass

    def reject(self, deployment: str, status: int, retry_after_s: int | None) -> None:
        pass


class ClientGone(Exception):
    """The client disconnected before its response was complete."""


class FrontDoor:
    """The ASGI application of a listener. ``table`` is replaced whole on a route update;
    ``note_body(size)`` (the proxy's heap trimmer) hears each body's size once it is let go."""

    def __init__(self, backend: Backend, limits: HTTPLimits, *,
                 show_error_messages: bool = False, routes: RouteTable | None = None,
                 endpoints: Mapping[str, Endpoint] | None = None,
                 observer: Observer | None = None,
                 note_body: Callable[[int], None] | None = None) -> None:
        self.backend, self.limits = backend, limits
        self.table = routes if routes is not None else RouteTable()
        self._endpoints = dict(endpoints or {})
        self._observer = observer if observer is not None else NoObserver()
        self._note_body = note_body
        self._show_messages = show_error_messages

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            endpoint = self._endpoints.get(scope["path"])
            if endpoint is None:
                await self._forward(scope, receive, send)
            else:
                await endpoint(send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)

    async def _websocket(self, scope: dict, receive: Any, send: Any) -> None:
        match = self.table.match(scope["path"])
        if match is None:
            await send({"type": "websocket.close", "code": 1008})  # policy: no such route
            return
        prefix, key = match
        await self.backend.serve_websocket(key, request_data(scope, b"", prefix), scope,
                                           receive, send)

    async def _forward(self, scope: dict, receive: Any, send: Any) -> None:
        started = perf_counter()
        match = self.table.match(scope["path"])
        if match is None:
            await respond(send, 404, f"no route for {scope['path']}".encode())
            self._observer.observe("", "", 404, perf_counter() - started)
            return
        prefix, key = match
        try:
            body = await read_body(receive, scope["headers"], self.limits.max_request_body_bytes)
        except BodyTooLarge as e:
            await refuse_body(send, e)
            self._observer.observe(key, prefix, e.status, perf_counter() - started)
            self._noted(e.limit_bytes if e.declared_bytes is None else 0)
            return
        if body is None:  # the client left mid-body: nobody to answer
            return
        try:
            status = await self._admit_and_answer(receive, send, key,
                                                  request_data(scope, body, prefix))
        except StreamAborted as e:
            logger.warning("response from replica %s aborted mid-stream: %s", e.replica_id,
                           e.reason)
            self._observer.observe(key, prefix, 502, perf_counter() - started)
            raise  # uvicorn drops the connection: the client sees the failure
        finally:
            self._noted(len(body))
        self._observer.observe(key, prefix, status, perf_counter() - started)

    async def _admit_and_answer(self, receive: Any, send: Any, key: str,
                                data: HTTPRequestData) -> int:
        """The status answered; 499 when the client left first (its work cancelled)."""
        try:
            return await until_disconnect(self.backend.serve_http(key, data, send), receive)
        except ClientGone:
            return 499
        except BackpressureError as e:
            await respond(send, e.status_code, str(e), rejection_headers(e.headers()))
            self._observer.reject(key, e.status_code, e.retry_after_s)
            return e.status_code
        except _UNAVAILABLE as e:
            await respond(send, e.status_code, str(e))
            return e.status_code
        except DeploymentRaised as e:
            return await answer_raised(send, e, self._show_messages)

    def _noted(self, size_bytes: int) -> None:
        if self._note_body is not None:
            self._note_body(size_bytes)


async def answer_raised(send: Any, error: DeploymentRaised, show_message: bool) -> int:
    """A 500 that names the error's request id: the replica's log has the traceback under
    it, this listener's one line. The exception's text is the client's only with
    ``show_message`` (for development)."""
    request_id = error.request_id
    logger.warning("request %s answered 500: %s", request_id, error)
    body = f"Internal Server Error (request id {request_id})"
    if show_message:
        body = f"{body}: {error}"
    await respond(send, 500, body, [(b"x-request-id", request_id.encode())])
    return 500


def request_data(scope: dict, body: bytes, prefix: str) -> HTTPRequestData:
    return HTTPRequestData(
        method=scope.get("method", "GET"), path=scope["path"],
        query_string=scope.get("query_string", b""), headers=list(scope["headers"]),
        body=body, route_prefix=prefix,
        client=tuple(scope["client"]) if scope.get("client") else None)


async def until_disconnect(work: Awaitable[Any], receive: Any) -> Any:
    """Await ``work`` in this task; if the client disconnects first, cancel it (freeing
    its router and replica slots) and raise ClientGone.

    One watcher task, not a task for the work beside it and a wait on both (about 5 us a
    request instead of 20): a watcher that saw the client leave cancels this task and
    ends, and that cancellation is taken back here. A watcher woken by the response's end
    never runs: this task cancels it before it next yields."""
    current = asyncio.current_task()
    watcher = asyncio.get_running_loop().create_task(_wait_disconnect(receive, current))
    try:
        return await work
    except asyncio.CancelledError:
        if not watcher.done() or watcher.cancelled() or watcher.exception() is not None:
            raise  # cancelled for another reason (the server stops): not ours to take back
        current.uncancel()
        raise ClientGone() from None
    finally:
        watcher.cancel()


async def _wait_disconnect(receive: Any, task: asyncio.Task) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    task.cancel()
