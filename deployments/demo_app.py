"""The demo's user code: a plain class, a Ray Serve app and a FastAPI app under Serve's
ingress, as a user would write them."""

import time

from fastapi import FastAPI
from ray import serve
from starlette.requests import Request


class Greeter:
    """A plain class: no Serve imports needed. user_config arrives via reconfigure()."""

    def __init__(self, model_name: str = "greeter-v1") -> None:
        self.model_name = model_name
        self.greeting = "hello"
        self.loaded_at = time.time()

    def reconfigure(self, user_config: dict) -> None:
        self.greeting = user_config.get("greeting", self.greeting)

    def check_health(self) -> None:
        if not self.greeting:
            raise RuntimeError("no greeting configured")

    def __call__(self, request: Request) -> dict:
        name = request.query_params.get("name", "world")
        return {"model": self.model_name, "text": f"{self.greeting}, {name}!"}


@serve.deployment(num_replicas=1, max_ongoing_requests=8)
class Echo:
    """An existing Ray Serve deployment, served unchanged."""

    async def __call__(self, request: Request) -> str:
        return (await request.body()).decode() or request.query_params.get("text", "")


echo_app = Echo.bind()


api = FastAPI()


@serve.deployment(num_replicas=1)
@serve.ingress(api)
class Api:
    """A FastAPI app under Ray Serve's ingress, served unchanged (docs at /api/docs)."""

    @api.get("/hello/{name}")
    def hello(self, name: str) -> dict:
        return {"hello": name, "replica": serve.get_replica_context().replica_tag}

    def add(self, a: int, b: int) -> int:  # for handles: api.add.remote(1, 2)
        return a + b

    def count(self, n: int):  # for handles: .options(method_name="count", stream=True)
        yield from range(n)


api_app = Api.bind()
