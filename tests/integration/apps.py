"""User code deployed by the integration tests (imported by replicas from the repo root)."""

from __future__ import annotations

import os
import time

from ray import serve


class Model:
    def __init__(self, tag: str = "v1") -> None:
        self.tag = tag
        self.greeting = "hello"
        self.reconfigures = 0

    def reconfigure(self, user_config: dict) -> None:
        self.greeting = user_config.get("greeting", "hello")
        self.reconfigures += 1

    def __call__(self, name: str = "world") -> dict:
        return {"tag": self.tag, "text": f"{self.greeting}, {name}", "pid": os.getpid(),
                "reconfigures": self.reconfigures}


class BrokenModel:
    def __init__(self) -> None:
        raise RuntimeError("weights file not found: /models/broken.bin")


@serve.deployment(max_ongoing_requests=3)
class ServeModel:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    async def __call__(self, text: str) -> str:
        return f"{self.prefix}{text}"


serve_app = ServeModel.bind("serve:")


def noop(*args, **kwargs) -> str:
    return "ok"


# ---- HTTP apps ----------------------------------------------------------------------

import asyncio  # noqa: E402

from starlette.requests import Request  # noqa: E402
from starlette.responses import PlainTextResponse  # noqa: E402


class HttpModel:
    """Answers in the shape the path asks for."""

    async def __call__(self, request: Request):
        kind = request.query_params.get("kind", "text")
        if kind == "json":
            return {"path": request.url.path, "query": dict(request.query_params)}
        if kind == "bytes":
            return b"\x00\x01raw"
        if kind == "response":
            return PlainTextResponse("teapot", status_code=418)
        if kind == "stream":
            def chunks():
                for i in range(5):
                    yield f"chunk{i}\n"
            return chunks()
        if kind == "slowstream":  # holds its connection open for a while
            seconds = float(request.query_params.get("s", "5"))

            async def slow():
                for i in range(int(seconds * 10)):
                    yield f"tick{i}\n"
                    await asyncio.sleep(0.1)
            return slow()
        if kind == "sleep":  # holds the request, no byte of the answer sent yet
            await asyncio.sleep(float(request.query_params.get("s", "1")))
            return "slept"
        if kind == "error":
            raise ValueError("bad input from the user's code")
        if kind == "size":  # the request body's length, as received
            return str(len(await request.body()))
        return f"hello from {request.url.path}"


class Sleeper:
    async def __call__(self, request: Request) -> str:
        await asyncio.sleep(float(request.query_params.get("s", "0.5")))
        return "done"


@serve.deployment
class Doubler:
    def __call__(self, x: int) -> int:
        return 2 * x

    def triple(self, x: int) -> int:
        return 3 * x


@serve.deployment
class Composer:
    def __init__(self, doubler) -> None:
        self.doubler = doubler

    async def __call__(self, request: Request) -> dict:
        x = int(request.query_params["x"])
        return {"double": await self.doubler.remote(x), "triple": await self.doubler.triple.remote(x)}


composed_app = Composer.bind(Doubler.bind())


class PickyModel(Model):
    """``reconfigure()`` raises for ``{"fail": true}``; ``hang_s`` stalls the constructor;
    ``sick_after_s``: health checks fail that long after it started."""

    def __init__(self, hang_s: float = 0.0, sick_after_s: float | None = None) -> None:
        time.sleep(hang_s)
        super().__init__()
        self.sick_at = None if sick_after_s is None else time.monotonic() + sick_after_s

    def check_health(self) -> None:
        if self.sick_at is not None and time.monotonic() > self.sick_at:
            raise RuntimeError("GPU memory corrupted (simulated)")

    def reconfigure(self, user_config: dict) -> None:
        if user_config.get("fail"):
            raise ValueError(f"cannot apply {user_config}: threshold out of range")
        super().reconfigure(user_config)


class Affine:
    """Answers its replica's pid (which replica a request reached), and reports a KV-cache
    use for the kv_load policies when given one."""

    def __init__(self, kv: float | None = None) -> None:
        self.kv = kv

    async def __call__(self, request: Request) -> dict:
        await request.body()
        return {"pid": os.getpid()}

    def record_routing_stats(self) -> dict:
        return {} if self.kv is None else {"kv_cache_usage": self.kv}
