"""The deployment ``release_tests.soak`` drives: a short request and a long stream.

``GET /soak/short``: a few milliseconds of async work, then ``ok``.
``GET /soak/stream?chunks=N&every_s=S``: N numbered lines ``i/N``, one every S seconds,
then ``end``; a client that read fewer lines, or no ``end``, had its stream cut short.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request

MAX_CHUNKS = 10_000


class Soak:
    def __init__(self, work_s: float = 0.002) -> None:
        self._work_s = work_s

    async def __call__(self, request: Request):
        if request.url.path.rstrip("/").endswith("/stream"):
            chunks = min(MAX_CHUNKS, max(1, int(request.query_params.get("chunks", "10"))))
            every_s = max(0.0, float(request.query_params.get("every_s", "0.25")))
            return self._stream(chunks, every_s)
        await asyncio.sleep(self._work_s)
        return "ok"

    async def _stream(self, chunks: int, every_s: float):
        for i in range(1, chunks + 1):
            await asyncio.sleep(every_s)
            yield f"{i}/{chunks}\n"
        yield "end\n"
