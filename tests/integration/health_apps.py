"""User code for the push-health fault matrix (imported by replicas from the repo root).

``Breakable`` starts healthy (initialization runs a fresh check, which must pass) and the
test breaks the health check of one replica at a time with a request:
``set_health(mode)``, where mode is

- ``ok``: passes;
- ``raise``: raises;
- ``slow``: takes ``slow_s`` (longer than the timeout), then passes;
- ``hang``: never returns and ignores cancellation;
- ``flap``: fails every other check.
"""

from __future__ import annotations

import asyncio
import os


class Breakable:
    def __init__(self) -> None:
        self.mode = "ok"
        self.slow_s = 2.0
        self.checks = 0  # user checks run (periodic, fresh and initialization)

    async def check_health(self) -> None:
        self.checks += 1
        if self.mode == "raise":
            raise RuntimeError("model weights corrupted")
        if self.mode == "slow":
            await asyncio.sleep(self.slow_s)
        elif self.mode == "hang":
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    continue  # a wedged check: cancellation does not stop it
        elif self.mode == "flap" and self.checks % 2:
            raise RuntimeError("flapping")

    def set_health(self, mode: str, slow_s: float = 2.0) -> str:
        self.mode, self.slow_s = mode, slow_s
        return mode

    def health_checks(self) -> int:
        return self.checks

    def __call__(self) -> dict:
        return {"pid": os.getpid(), "mode": self.mode}
