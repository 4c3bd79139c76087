"""How an LLM replica forwards user traffic to its engine's OpenAI API (aiohttp).

Owns one aiohttp session per event loop (created on first use, because the replica builds
the user's object in a worker thread where no loop runs) and the error type that carries the
engine's status back to a handle caller. Two doors: ``post``/``get`` for handle calls (a
dict in, the engine's JSON out), and ``forward_http`` for an HTTP request from the proxy (a
Starlette ``Request`` in, a ``Response`` out, with the engine's status, and streamed when the
engine streams server-sent events). This is the data path; the health check never goes
through it (``llm_health.py`` uses its own short-timeout requests, only on an idle server).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp


class EngineRequestError(Exception):
    """The engine answered a request with an error status (``status`` tells which)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body

    def __str__(self) -> str:
        return f"the engine answered HTTP {self.status}: {self.body[:500]}"


class EngineClient:
    def __init__(self, url: str, model: str, timeout_s: float) -> None:
        self.url = url
        self.model = model  # filled into requests that name none
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(timeout=self._timeout, trust_env=False)
            self._loop = loop
        return self._session

    async def post(self, path: str, body: dict) -> Any:
        body = {"model": self.model, **body}
        async with self._session_now().post(self.url + path, json=body) as response:
            return await _json_or_raise(response)

    async def get(self, path: str) -> Any:
        async with self._session_now().get(self.url + path) as response:
            return await _json_or_raise(response)

    async def forward_http(self, request: Any) -> Any:
        """Forward ``/v1/...`` below the route prefix to the engine, body and status as is."""
        from starlette.responses import Response, StreamingResponse

        path = engine_path(request.scope)
        if not path.startswith("/v1/"):
            return Response(b'{"error": "only the OpenAI API (/v1/...) is served here"}',
                            status_code=404, media_type="application/json")
        query = request.scope.get("query_string", b"").decode()
        response = await self._session_now().request(
            request.method, self.url + path + (f"?{query}" if query else ""),
            data=await request.body(),
            headers={"Content-Type": request.headers.get("content-type", "application/json")})
        if response.content_type == "text/event-stream":
            return StreamingResponse(_chunks(response), status_code=response.status,
                                     media_type="text/event-stream")
        body = await response.read()
        response.release()
        return Response(body, status_code=response.status, media_type=response.content_type)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


def engine_path(scope: dict) -> str:
    """The request's path below its route prefix (``/llm/v1/models`` -> ``/v1/models``)."""
    path, prefix = scope.get("path", "/"), scope.get("root_path", "")
    if prefix and path.startswith(prefix):
        path = path[len(prefix):] or "/"
    return path


async def _chunks(response: aiohttp.ClientResponse):
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    finally:
        response.release()


async def _json_or_raise(response: aiohttp.ClientResponse) -> Any:
    text = await response.text()
    if response.status >= 400:
        raise EngineRequestError(response.status, text)
    return json.loads(text)
