"""One WebSocket through an ``@serve.ingress`` app, relayed by the proxy over Ray calls.

The proxy accepts nothing itself: it forwards each client message (``websocket.connect``
first, ``websocket.receive``..., ``websocket.disconnect`` last) with ``push``, in order,
and relays what the app sends (``websocket.accept``, ``websocket.send``,
``websocket.close``) from ``events``, a stream that ends when the app returns. An app
that raises closes the socket with 1011 (internal error), as uvicorn would.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

logger = logging.getLogger(__name__)

INTERNAL_ERROR = 1011


def websocket_scope(http_scope: dict, subprotocols: list[str]) -> dict:
    """The app's scope: the HTTP scope's path, headers and root_path, as a WebSocket."""
    scope = {k: v for k, v in http_scope.items() if k not in ("method", "http_version")}
    return {**scope, "type": "websocket", "scheme": "ws", "subprotocols": subprotocols,
            "http_version": "1.1"}


class WebSocketSession:
    def __init__(self, app: Any, scope: dict) -> None:
        self._inbound: asyncio.Queue = asyncio.Queue()
        self._outbound: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run(app, scope))

    async def _run(self, app: Any, scope: dict) -> None:
        try:
            await app(scope, self._inbound.get, self._outbound.put)
        except Exception:
            logger.exception("the WebSocket handler raised")
            await self._outbound.put({"type": "websocket.close", "code": INTERNAL_ERROR})
        finally:
            await self._outbound.put(None)

    def push(self, message: dict) -> None:
        self._inbound.put_nowait(message)

    async def events(self) -> AsyncIterator[dict]:
        while (message := await self._outbound.get()) is not None:
            yield message

    def close(self) -> None:
        if not self._task.done():
            self._task.cancel()
