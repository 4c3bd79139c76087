"""The demo's user code: a plain class and a Ray Serve app, as a user would write them."""

from __future__ import annotations

import time

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
