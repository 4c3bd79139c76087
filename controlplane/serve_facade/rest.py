"""Serve's REST API on a port of fleetplane's, where the cluster has no Ray dashboard to
answer it (``fleetplane run``'s embedded Ray starts none: it costs about 1 GB and 25 s on
a small machine). The same paths, verbs, schemas and status codes as Ray 2.60's
``serve_head.py``; the same guard as Ray's dashboard: Ray's token middleware, so a
cluster with token authentication (Ray 2.60's default) answers 401 without a token and
403 with a wrong one. Without token authentication the listener binds loopback only
(``check_guarded``): never an open admin port.

Where the cluster has a dashboard (``ray start --head``, KubeRay), the dashboard answers
the same API through the facade and this listener is not started.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError


def dashboard_url() -> str | None:
    """``http://HOST:PORT`` of this cluster's Ray dashboard, if one runs."""
    from ray._private.services import get_webui_url_from_internal_kv

    url = get_webui_url_from_internal_kv()
    if not url:
        return None
    return url if url.startswith("http") else f"http://{url}"


def check_guarded(host: str, token_auth_on: bool) -> None:
    """An admin API is never open to the network: without Ray's token it binds loopback."""
    if token_auth_on:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"serve_api host {host!r} is not loopback and Ray token "
                         "authentication is off: the Serve REST API would be open to "
                         "anyone; bind 127.0.0.1 or turn token auth on (RAY_AUTH_MODE=token)")


def make_app(facade: Any) -> web.Application:
    from ray._private.authentication.http_token_authentication import (
        get_token_auth_middleware,
    )

    app = web.Application(middlewares=[get_token_auth_middleware(aiohttp)])
    app.router.add_get("/api/ray/version", _version)
    app.router.add_get("/api/serve/applications/", _handler(_get, facade))
    app.router.add_put("/api/serve/applications/", _handler(_put, facade))
    app.router.add_delete("/api/serve/applications/", _handler(_delete, facade))
    return app


async def serve_rest(facade: Any, host: str, port: int) -> tuple[web.AppRunner, str]:
    from controlplane.admin_surface import cluster_token_auth_on

    check_guarded(host, cluster_token_auth_on())
    runner = web.AppRunner(make_app(facade), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, f"http://{host}:{port}"


def _handler(call: Any, facade: Any) -> Any:
    async def handle(request: web.Request) -> web.Response:
        from ray.exceptions import RayError, RayTaskError

        try:
            return await call(facade, request)
        except RayError as e:  # fleetplane's controller restarting: Ray's dashboard's 503
            if isinstance(e, RayTaskError):
                raise
            return web.Response(status=503, text="fleetplane's controller is not answering "
                                f"(Ray restarts it within seconds): retry. {type(e).__name__}")
    return handle


async def _version(_: web.Request) -> web.Response:
    import ray
    from ray.dashboard.modules.version import CURRENT_VERSION, VersionResponse

    body = VersionResponse(version=CURRENT_VERSION, ray_version=ray.__version__,
                           ray_commit=ray.__commit__, session_name="fleetplane")
    return web.json_response(dataclasses.asdict(body))


async def _get(facade: Any, request: web.Request) -> web.Response:
    from ray.serve.schema import APIType

    api_type = request.query.get("api_type")
    source = None
    if api_type:
        valid = APIType.get_valid_user_values()
        if api_type.lower() not in valid:
            return web.Response(status=400, text=f"Invalid 'api_type' value: '{api_type}'. "
                                f"Must be one of: {', '.join(valid)}")
        source = APIType(api_type.lower())
    return web.Response(text=json.dumps(await facade.get_serve_instance_details(source)),
                        content_type="application/json")


async def _put(facade: Any, request: web.Request) -> web.Response:
    from ray.serve.exceptions import RayServeException
    from ray.serve.schema import ServeDeploySchema

    try:
        config = ServeDeploySchema.model_validate(await request.json())
    except ValidationError as e:
        return web.Response(status=400, text=repr(e))
    except json.JSONDecodeError as e:
        return web.Response(status=400, text=f"the body is not JSON: {e}")
    try:
        await facade.apply_config(config)
    except RayServeException as e:
        return web.Response(status=400, text=str(e))
    return web.Response()


async def _delete(facade: Any, _: web.Request) -> web.Response:
    await facade.graceful_shutdown()
    return web.Response()
