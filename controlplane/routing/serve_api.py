"""Ray Serve's handle functions answered by fleetplane: ``serve.get_app_handle`` and
``serve.get_deployment_handle``, the same in a replica and in a driver script.

``get_app_handle`` / ``get_deployment_handle`` are fleetplane's own API (also exported as
``fleetplane.get_app_handle`` ...). ``install_serve_api`` makes Ray Serve's functions of
the same names answer with them where a fleetplane instance runs on the cluster, and fall
back to Serve's own where none does (so a process that also talks to a real Serve keeps
working). Replicas install it at start; a driver script installs it with
``import fleetplane``, which patches ``ray.serve`` at once if it is imported, else the
moment it is.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from controlplane.settings import Settings

# Nothing here imports Ray at module level: ``import fleetplane`` (the CLI's package too)
# must not, since the CLI sets Ray's auth mode from an instance record before Ray loads.

_PATCHED = "__fleetplane_patched__"


def _controller() -> Any | None:
    """fleetplane's controller actor on the connected cluster, or None."""
    import ray

    if not ray.is_initialized():
        return None
    settings = Settings()
    try:
        return ray.get_actor(settings.controller_name, namespace=settings.namespace)
    except ValueError:
        return None


def get_app_handle(name: str) -> Any:
    """A handle to an application's ingress deployment (``serve.get_app_handle``)."""
    import ray

    from controlplane.routing.handles import DeploymentHandle

    controller = _controller()
    if controller is None:
        raise RuntimeError("no fleetplane instance runs on this Ray cluster: start one with "
                           "`fleetplane run CONFIG`, and connect with ray.init(address=...)")
    deployment = ray.get(controller.ingress_of.remote(name))
    if deployment is None:
        raise ValueError(f"application '{name}' does not exist; `fleetplane status` lists "
                         "the applications")
    return DeploymentHandle(name, deployment)


def get_deployment_handle(deployment_name: str, app_name: str | None = None,
                          *_: Any, **__: Any) -> Any:
    """A handle to one deployment (``serve.get_deployment_handle``); the application
    defaults to the caller's own inside a replica, else to 'default' (as in Serve)."""
    if app_name is None:
        from ray.serve.context import _get_internal_replica_context

        context = _get_internal_replica_context()
        app_name = context.app_name if context is not None else "default"
    from controlplane.routing.handles import DeploymentHandle

    return DeploymentHandle(app_name, deployment_name)


def _either(ours: Callable, serves: Callable) -> Callable:
    @functools.wraps(serves)
    def call(*args: Any, **kwargs: Any) -> Any:
        return (ours if _controller() is not None else serves)(*args, **kwargs)

    setattr(call, _PATCHED, True)
    return call


def _patch(serve_module: Any) -> None:
    import ray.serve.api as api

    for name, ours in (("get_app_handle", get_app_handle),
                       ("get_deployment_handle", get_deployment_handle)):
        current = getattr(api, name)
        if getattr(current, _PATCHED, False):
            continue
        patched = _either(ours, current)
        setattr(api, name, patched)
        setattr(serve_module, name, patched)


class _PatchOnImport:
    """A meta-path finder that patches ``ray.serve`` right after it is imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "ray.serve":
            return None
        import importlib.util

        sys.meta_path.remove(self)  # once; and find the real spec without us
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install_serve_api() -> None:
    """Patch Ray Serve's handle functions now, or when ``ray.serve`` is imported."""
    module = sys.modules.get("ray.serve")
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
