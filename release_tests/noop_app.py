"""The no-op deployment both proxies are measured with."""

from ray import serve
from starlette.requests import Request


class Noop:
    async def __call__(self, request: Request) -> str:
        return "ok"


@serve.deployment(max_ongoing_requests=32, ray_actor_options={"num_cpus": 0})
class ServeNoop:
    async def __call__(self, request: Request) -> str:
        return "ok"


serve_app = ServeNoop.bind()


class HalfSecond:
    """A 0.5 s handler: the issue's overload case (max_ongoing_requests=2)."""

    async def __call__(self, request: Request) -> str:
        import asyncio
        await asyncio.sleep(0.5)
        return "ok"


@serve.deployment(max_ongoing_requests=2, ray_actor_options={"num_cpus": 0})
class ServeHalfSecond(HalfSecond):
    pass


serve_half_second_app = ServeHalfSecond.bind()


@serve.deployment(max_ongoing_requests=2, max_queued_requests=4,
                  ray_actor_options={"num_cpus": 0})
class ServeHalfSecondQueued(HalfSecond):
    """Issue 14's setup on Ray Serve 2.60: 2 slots, a queue of 4, then 503."""


serve_half_second_queued_app = ServeHalfSecondQueued.bind()
