"""The deployment ``release_tests.drain_events`` drives: short requests, a long stream
that keeps a reloaded HAProxy's old worker alive, and a switch that makes one replica
fail its health checks (so the shard replaces it)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request


class DrainModel:
    def __init__(self, version: str = "v1", work_s: float = 0.005) -> None:
        self._version, self._work_s = version, work_s
        self._sick = False

    def check_health(self) -> None:
        if self._sick:
            raise RuntimeError("told to fail its health checks (release_tests.drain_events)")

    async def __call__(self, request: Request):
        tail = request.url.path.rsplit("/", 1)[-1]
        if tail == "sick":
            self._sick = True
            return "sick"
        if tail == "stream":
            return self._stream(float(request.query_params.get("s", "5")))
        await asyncio.sleep(self._work_s)
        return self._version

    async def _stream(self, seconds: float):
        ticks = max(1, int(seconds / 0.2))
        for i in range(ticks):
            await asyncio.sleep(0.2)
            yield f"tick{i}\n"
