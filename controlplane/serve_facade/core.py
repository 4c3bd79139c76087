"""What ``SERVE_CONTROLLER_ACTOR`` (``serve_controller.ServeFacade``, in namespace
``serve``) answers: the Serve controller as Serve's tools see it, from fleetplane's
controller.

What each caller uses (Ray 2.60's code, read in ``ray/serve/_private/client.py``,
``ray/dashboard/modules/serve/serve_head.py`` and ``ray/serve/api.py``):

- Ray's dashboard (``serve deploy/status/shutdown``, ``serve config``, KubeRay):
  ``check_alive``, ``get_serve_instance_details``, ``get_http_config``, ``get_root_url``,
  ``apply_config``, ``graceful_shutdown``; fleetplane's own REST listener the same.
- Drivers: ``get_ingress_deployment_name`` (``serve.get_app_handle``),
  ``get_serve_instance_details`` (``serve.status()``), ``delete_apps`` and
  ``get_serve_statuses`` (``serve.delete``), ``listen_for_change`` (a handle's replicas:
  ``targets``), and the metrics a handle pushes (accepted, not used).
- ``serve.run`` / ``serve.start`` from a driver: ``deploy_applications`` refuses with what
  to do instead; since this actor holds Serve's controller name, neither can start a
  real Serve controller beside fleetplane.

``serve shutdown`` (``graceful_shutdown``) stops the applications; the fleetplane
instance keeps running, ready for the next ``serve deploy``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
from ray.serve.config import HTTPOptions as ServeHTTPOptions
from ray.serve.exceptions import RayServeException
from ray.serve.schema import APIType

from controlplane.serve_facade import details
from controlplane.serve_facade.apply import (
    app_names,
    as_dict,
    ignored_options,
    merged_config,
    without_apps,
)
from controlplane.serve_facade.targets import HandleTargets
from controlplane.settings import Settings

logger = logging.getLogger(__name__)

SERVE_RUN_REFUSED = (
    "fleetplane runs the applications of this Ray cluster, so serve.run()/serve.start() "
    "from a driver does not deploy here. Put the application in a deploy config and apply "
    "it with Ray's `serve deploy CONFIG -a {address}` or `fleetplane deploy CONFIG`; a "
    "driver reaches a deployed application with serve.get_app_handle(NAME).")


class FacadeCore:
    def __init__(self, settings: dict) -> None:
        self._settings = Settings.from_dict(settings)
        self._controller = ray.get_actor(self._settings.controller_name,
                                         namespace=self._settings.namespace)
        self._targets = HandleTargets(settings)
        self._deployed_at: dict[str, float] = {}
        self._address = ""
        self._rest: Any = None
        self._stopped = asyncio.Event()
        context = ray.get_runtime_context()
        self._me = {"node_id": context.get_node_id(), "actor_id": context.get_actor_id(),
                    "actor_name": "SERVE_CONTROLLER_ACTOR"}

    async def start(self, host: str, port: int) -> str:
        """Where Serve's REST API is answered: the cluster's dashboard if it has one,
        else our own listener on host:port (``port`` 0: none). Idempotent."""
        if self._address:
            return self._address
        from controlplane.serve_facade.rest import dashboard_url, serve_rest

        self._address = await asyncio.to_thread(dashboard_url) or ""
        if not self._address and port:
            self._rest, self._address = await serve_rest(self, host, port)
        return self._address

    async def wait_until_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        if self._rest is not None:
            await self._rest.cleanup()
        self._stopped.set()

    # -- reading --------------------------------------------------------------------

    async def _state(self, summary: bool = False) -> tuple[dict | None, dict]:
        """The running config and status (``summary``: counts, no replica rows: O(1) per
        deployment, for what needs statuses only)."""
        config, status = await asyncio.gather(
            self._controller.running_config.remote(),
            self._controller.status.remote(summary=summary))
        now = time.time()
        for name in status.get("applications", {}):
            self._deployed_at.setdefault(name, now)
        return config, status

    async def get_serve_instance_details(self, source: APIType | None = None) -> dict:
        config, status = await self._state()
        return details.instance_details(status, config, deployed_at=self._deployed_at,
                                        controller=self._me, source=source)

    async def get_http_config(self) -> ServeHTTPOptions:
        http = (await self._controller.running_config.remote() or {}).get("http_options", {})
        return ServeHTTPOptions(**{k: http[k] for k in ("host", "port", "root_path")
                                   if k in http})

    async def get_root_url(self) -> str:
        http = await self.get_http_config()
        return f"http://{http.host}:{http.port}{http.root_path}"

    async def get_serve_status(self, name: str = "default") -> bytes:
        return (await self.get_serve_statuses([name]))[0]

    async def get_serve_statuses(self, names: list[str]) -> list[bytes]:
        _, status = await self._state(summary=True)  # serve.delete polls it each second
        apps = status.get("applications", {})
        return [details.status_overview(n, apps.get(n)) for n in names]

    async def list_serve_statuses(self) -> list[bytes]:
        _, status = await self._state(summary=True)
        return [details.status_overview(n, a) for n, a in status["applications"].items()]

    async def get_ingress_deployment_name(self, app_name: str) -> str | None:
        return await self._controller.ingress_of.remote(app_name)

    async def list_deployment_ids(self) -> list[Any]:
        from ray.serve._private.common import DeploymentID

        return [DeploymentID(name=d, app_name=a) for a, d in await self._deployments()]

    async def _deployments(self) -> set[tuple[str, str]]:
        status = await self._controller.status.remote(summary=True)
        return {(app, dep) for app, a in status["applications"].items()
                for dep in a["deployments"]}

    # -- changing -------------------------------------------------------------------

    async def apply_config(self, config: Any, deployment_time: float = 0.0) -> None:
        """``serve deploy`` / a RayService: the applications as the whole desired set;
        a config fleetplane refuses changes nothing and raises with its reason."""
        serve_config = as_dict(config)
        running = await self._controller.running_config.remote()
        for option in ignored_options(running, serve_config):
            logger.warning("serve deploy: %s differs from the running instance's and is "
                           "ignored (as Serve ignores it while running)", option)
        await self._deploy(merged_config(running, serve_config), deployment_time, stamp=True)

    async def delete_apps(self, names: list[str]) -> None:
        running = await self._controller.running_config.remote()
        await self._deploy(without_apps(running, names))

    async def graceful_shutdown(self, wait: bool = True) -> None:
        """``serve shutdown``: every application stops; fleetplane keeps running."""
        running = await self._controller.running_config.remote()
        await self._deploy(without_apps(running, app_names(running)))

    async def _deploy(self, config: dict, deployment_time: float = 0.0,
                      stamp: bool = False) -> None:
        try:
            await self._controller.deploy.remote(config)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, Exception) else e
            raise RayServeException(f"fleetplane refused the config: {cause}") from None
        # as Serve's apply_config: every application of an applied config is stamped
        at = (deployment_time or time.time()) if stamp else None
        self._deployed_at = {n: at or self._deployed_at.get(n, time.time())
                             for n in app_names(config)}
        # handles follow at once; a deleted application's deployments may still be listed
        # (DELETING) for a while, so they are left out by name
        apps = set(app_names(config))
        self._targets.follow({d for d in await self._deployments() if d[0] in apps})

    def deploy_applications(self) -> None:
        raise RayServeException(SERVE_RUN_REFUSED.format(address=self._address or "ADDRESS"))

    # -- driver handles -------------------------------------------------------------

    async def listen_for_change(self, keys_to_snapshot_ids: dict) -> Any:
        return await self._targets.listen(keys_to_snapshot_ids, await self._deployments())
