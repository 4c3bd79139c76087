"""The controller's side of the facade: make it under Serve's controller name, start its
REST API, start it again after Ray restarts it (``Supervisor``), end it with the instance.

A facade that cannot start never stops fleetplane from serving: ``status`` says why
(``serve_api_error``: a real Ray Serve already holds the name, the port is taken).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from controlplane.control_placement import control_options
from controlplane.errors import first_line
from controlplane.serve_facade.targets import SERVE_NAMESPACE, by_value, end_all_bridges
from controlplane.settings import Settings
from controlplane.supervision import Supervisor

SERVE_CONTROLLER_NAME = "SERVE_CONTROLLER_ACTOR"  # ray.serve._private.constants
logger = logging.getLogger(__name__)


class ServeApiHost:
    def __init__(self, settings: Settings, supervisor: Supervisor) -> None:
        self._settings, self._supervisor = settings, supervisor
        self._facade: Any = None
        self._task: asyncio.Task | None = None
        self.address: str | None = None
        self.error = ""

    def ensure(self) -> None:
        """Start the facade in the background (once; a restarted controller adopts the
        facade that runs)."""
        if self._task is None and self._settings.serve_api_port >= 0:
            self._task = asyncio.get_running_loop().create_task(self._start())

    async def address_within(self, timeout_s: float) -> str | None:
        if self._task is not None:
            await asyncio.wait([self._task], timeout=timeout_s)
        return self.address

    def describe(self) -> dict:
        return {"serve_api_address": self.address,
                **({"serve_api_error": self.error} if self.error else {})}

    async def _start(self) -> None:
        from controlplane.serve_facade.serve_controller import ServeFacade

        try:
            facade = ray.remote(by_value(ServeFacade)).options(
                name=SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE, lifetime="detached",
                get_if_exists=True, num_cpus=0, max_restarts=-1, max_concurrency=10_000,
                **control_options(self._settings.control_plane_on),
            ).remote(self._settings.to_dict())
            self.error = await _not_ours(facade, self._settings.namespace)
            if not self.error:
                self._facade = facade  # only ours is ever started, stopped or killed
                await self._serve()
        except Exception as e:  # never fails the instance: status says why
            self.error = _explain(e)
        if self.error:
            logger.error("Serve's API is not answered: %s", self.error)
            return
        self._supervisor.watch("serve_api", self._facade, self._serve)

    async def _serve(self) -> None:
        s = self._settings
        self.address = await self._facade.start.remote(s.serve_api_host, s.serve_api_port)
        self.error = ""

    async def shutdown(self) -> None:
        """The facade and every bridge end: Serve's name is free again."""
        self._supervisor.unwatch("serve_api")
        if self._task is not None:
            self._task.cancel()
        if self._facade is not None:
            try:
                await asyncio.wait_for(self._facade.stop.remote(), 5.0)
            except Exception:  # dead or stuck: killed below either way
                pass
            ray.kill(self._facade, no_restart=True)
        await asyncio.to_thread(end_all_bridges)
        self._facade, self._task, self.address = None, None, None


async def _not_ours(facade: Any, namespace: str) -> str:
    """Why the actor under Serve's controller name is not this instance's facade, or ""."""
    try:
        owner = await facade.fleetplane_owner.remote()
    except AttributeError:  # a real Serve controller has no such method
        return ("a real Ray Serve controller already runs on this cluster (it holds "
                f"'{SERVE_CONTROLLER_NAME}'); stop it with `serve shutdown` and restart "
                "fleetplane to answer Serve's tools")
    if owner != namespace:
        return (f"another fleetplane instance (namespace '{owner}') answers Serve's tools "
                "on this cluster; one instance per cluster can")
    return ""


def _explain(error: Exception) -> str:
    text = first_line(error)
    if "address already in use" in text.lower() or "errno 98" in text.lower():
        return (f"{text}; another process holds the Serve API's port: pass "
                "`fleetplane run --serve-api-port PORT` (0 turns it off)")
    return text
