"""A deployment wrapped with ``@serve.ingress(app)``: Ray Serve's ASGI ingress, served the
way Serve serves it.

Serve's wrapper class (``ASGIAppReplicaWrapper``) holds the user's FastAPI (or any ASGI)
app: the app given to ``serve.ingress``, one a factory function returns, or, late bound,
what the class's ``__serve_build_asgi_app__`` returns after construction. ``start`` does
what Serve's replica does after the (async) constructor: bind a late app, let FastAPI turn
a downstream handle's backpressure into its own status (not a 500), and run the app's
lifespan startup. ``AsgiResponse`` runs one HTTP request through the app and yields what
the replica sends on: the response head, then body chunks as the app sends them.

The app sees the request as Serve's proxy hands it over: ``path`` is the full path and
``root_path`` the application's route_prefix, so FastAPI routes, ``/docs`` and the
OpenAPI schema live under the prefix.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, AsyncIterator

from controlplane.errors import BackpressureError

logger = logging.getLogger(__name__)
_END = object()
BUILD_ASGI_APP = "__serve_build_asgi_app__"


def is_asgi_ingress(instance: Any) -> bool:
    """An ``@serve.ingress`` class (by name: a plain class need not import Serve)."""
    return any(c.__name__ == "ASGIAppReplicaWrapper" and c.__module__.startswith("ray.serve")
               for c in type(instance).__mro__)


async def start(instance: Any) -> Any:
    """Finish an ingress instance as Serve does after its constructor; returns the app."""
    build = getattr(instance, BUILD_ASGI_APP, None)
    if not hasattr(instance, "_asgi_app") and build is None:
        raise TypeError(f"the ASGI app was not given to @serve.ingress and the class does "
                        f"not define {BUILD_ASGI_APP}")
    if build is not None:
        app = build()
        if inspect.isawaitable(app):
            app = await app
        if app is None:
            raise TypeError(f"{BUILD_ASGI_APP} must return an ASGI app, it returned None")
        instance._set_asgi_app(app)
    app = instance.app
    if hasattr(app, "add_exception_handler"):
        app.add_exception_handler(BackpressureError, _backpressure_response)
    await instance._run_asgi_lifespan_startup()
    return app


def _backpressure_response(_request: Any, error: BackpressureError) -> Any:
    """A downstream deployment shed the request: its status and Retry-After, as Serve's
    exception handler answers it."""
    from starlette.responses import PlainTextResponse

    return PlainTextResponse(str(error), status_code=error.status_code, headers=error.headers())


class AsgiResponse:
    """One HTTP request through the user's ASGI app, started at once as its own task.

    ``prefetch`` waits for the response head and the first body message, so the replica
    can answer a complete response in one round trip and stream only what really streams.
    The user's exception before the head raises from ``prefetch``; after the head, from
    iteration. ``close`` cancels an unfinished app (the client went away, the stream was
    dropped).
    """

    def __init__(self, app: Any, scope: dict, body: bytes) -> None:
        self._messages: asyncio.Queue = asyncio.Queue()
        self._body: bytes | None = body
        self._done = asyncio.Event()  # the response ended: receive() says disconnect
        self._buffer: list[Any] = []
        self.finished = False
        self._task = asyncio.get_running_loop().create_task(self._run(app, scope))

    async def _run(self, app: Any, scope: dict) -> None:
        try:
            await app(scope, self._receive, self._messages.put)
        except Exception as e:  # the user's: surfaces in the reader's task, and the log
            logger.error("the ASGI app raised", exc_info=True)
            await self._messages.put(e)
        finally:
            await self._messages.put(_END)

    async def _receive(self) -> dict:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._done.wait()
        return {"type": "http.disconnect"}

    async def _next(self) -> Any:
        message = await self._messages.get()
        if isinstance(message, Exception):
            raise message
        return message

    async def prefetch(self) -> None:
        """Read up to the head and the first body message (or the app's end)."""
        while (message := await self._next()) is not _END:
            if message["type"] == "http.response.start":
                self._buffer.append({"status": message["status"],
                                     "headers": [tuple(h) for h in message.get("headers", [])]})
            elif message["type"] == "http.response.body":
                self._buffer.append(bytes(message.get("body", b"")))
                if not message.get("more_body", False):
                    self._finish()
                return
        if not self._buffer:
            raise RuntimeError("the ASGI app returned without sending a response")
        self._finish()

    def _finish(self) -> None:
        self.finished = True
        self._done.set()

    async def parts(self) -> AsyncIterator[Any]:
        """The head, then body chunks; ``prefetch`` first."""
        try:
            for part in self._buffer:
                yield part
            while not self.finished and (message := await self._next()) is not _END:
                if message["type"] == "http.response.body":
                    yield bytes(message.get("body", b""))
                    if not message.get("more_body", False):
                        break
        finally:
            self.close()

    def close(self) -> None:
        """An unfinished response is abandoned: cancel the app. A finished one's task
        runs on to its end (Starlette's background tasks run after the response)."""
        if not self.finished and not self._task.done():
            self._task.cancel()
        self._finish()
