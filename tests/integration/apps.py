"""User code deployed by the integration tests (imported by replicas from the repo root)."""

from __future__ import annotations

import os

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
