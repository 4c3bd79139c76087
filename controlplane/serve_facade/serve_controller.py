"""The actor under Serve's controller name: a thin class whose every method hands over to
``core.FacadeCore``.

Thin on purpose: a driver that calls ``ray.get_actor("SERVE_CONTROLLER_ACTOR", "serve")``
(every Serve tool does) loads the actor's class to know its methods' signatures. A driver
environment may have Ray Serve and not fleetplane, so this class is shipped by value
(``host.by_value``) and needs nothing but the standard library to load: every fleetplane
import happens inside a method, in the actor's own process. Keep it that way: a module-level
import of fleetplane here would break drivers without fleetplane installed
(``tests/integration/test_serve_tools.py`` runs one).

Each method is one Serve's tools call (``core`` says who calls what).
"""

from __future__ import annotations

from typing import Any


class ServeFacade:
    def __init__(self, settings: dict) -> None:
        from controlplane.serve_facade.core import FacadeCore

        self._core = FacadeCore(settings)
        self._namespace = settings["namespace"]

    def check_alive(self) -> None:
        return None

    def fleetplane_owner(self) -> str:
        """The namespace of the fleetplane instance this facade answers for."""
        return self._namespace

    async def start(self, host: str, port: int) -> str:
        return await self._core.start(host, port)

    async def wait_until_stopped(self) -> None:
        await self._core.wait_until_stopped()

    async def stop(self) -> None:
        await self._core.stop()

    async def get_serve_instance_details(self, source: Any = None) -> dict:
        return await self._core.get_serve_instance_details(source)

    async def get_http_config(self) -> Any:
        return await self._core.get_http_config()

    async def get_root_url(self) -> str:
        return await self._core.get_root_url()

    async def get_serve_status(self, name: str = "default") -> bytes:
        return await self._core.get_serve_status(name)

    async def get_serve_statuses(self, names: list) -> list:
        return await self._core.get_serve_statuses(names)

    async def list_serve_statuses(self) -> list:
        return await self._core.list_serve_statuses()

    async def get_ingress_deployment_name(self, app_name: str) -> Any:
        return await self._core.get_ingress_deployment_name(app_name)

    async def list_deployment_ids(self) -> list:
        return await self._core.list_deployment_ids()

    async def apply_config(self, config: Any, deployment_time: float = 0.0) -> None:
        await self._core.apply_config(config, deployment_time)

    async def delete_apps(self, names: list) -> None:
        await self._core.delete_apps(names)

    async def graceful_shutdown(self, wait: bool = True) -> None:
        await self._core.graceful_shutdown()

    def deploy_applications(self, *args: Any, **kwargs: Any) -> None:
        self._core.deploy_applications()

    async def listen_for_change(self, keys_to_snapshot_ids: dict) -> Any:
        return await self._core.listen_for_change(keys_to_snapshot_ids)

    def record_autoscaling_metrics_from_handle(self, *args: Any, **kwargs: Any) -> None:
        """A handle's queue metrics: fleetplane's autoscaler reads its own routers'."""

    def record_request_routing_info(self, *args: Any, **kwargs: Any) -> None:
        """Routing stats from a Serve replica: fleetplane's replicas report their own."""

    def reconfigure_global_logging_config(self, *args: Any, **kwargs: Any) -> None:
        """Serve's logging config: fleetplane's replicas log by their deploy config."""

    def notify_long_poll_client_disabled(self, *args: Any, **kwargs: Any) -> None:
        """A handle's long-poll stopped (its event loop ended): nothing to undo."""

    def get_proxies(self) -> dict:
        return {}
