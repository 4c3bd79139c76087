"""Building a deploy config's applications, off the controller, under a deadline.

Each application is imported and built in a fresh Ray worker of its own (``max_calls=1``:
a re-deploy imports the user's edited code; one application's hanging or crashing import
never hides another's result), all in parallel. A build that has not finished within
``controller_options.build_timeout_s`` (an import that blocks on the network, a lock,
``input()``) is cancelled, its worker killed, and the deploy rejected naming that
application: nothing changes, and the controller, which only awaits the builds, keeps
answering ``status`` throughout.
"""

from __future__ import annotations

import asyncio

import ray
from ray.exceptions import RayTaskError

from controlplane.errors import BuildError
from controlplane.specs import DeploymentSpec
from controlplane.user_code import build_with_warnings

_remote_build = ray.remote(num_cpus=0, max_calls=1)(build_with_warnings)


async def build_all(apps: list[dict],
                    timeout_s: float) -> tuple[list[DeploymentSpec], list[str]]:
    """The specs of every application, in config order, and the builds' warnings (options
    set in code that fleetplane does not act on); raises one BuildError naming every
    application that failed (with each one's cause)."""
    results = await asyncio.gather(*(_build(app, timeout_s) for app in apps),
                                   return_exceptions=True)
    errors = [_build_error(app, r) for app, r in zip(apps, results)
              if isinstance(r, BaseException)]
    if errors:
        raise BuildError(", ".join(e.app for e in errors),
                         "\n".join(f"[{e.app}] {e.message}" for e in errors))
    specs = [spec for app_specs, _ in results for spec in app_specs]
    return specs, [warning for _, app_warnings in results for warning in app_warnings]


async def _build(app: dict, timeout_s: float) -> tuple[list[DeploymentSpec], list[str]]:
    task = _remote_build.options(runtime_env=app["runtime_env"]) \
        if app.get("runtime_env") else _remote_build
    ref = task.remote(app)
    try:
        return await asyncio.wait_for(ref, timeout_s)
    except asyncio.TimeoutError:
        ray.cancel(ref, force=True)  # kills the worker stuck in the user's import
        raise BuildError(app["name"], (
            f"importing and building did not finish within {timeout_s:g}s "
            f"(controller_options.build_timeout_s); nothing was changed. Look for an import "
            f"or builder that blocks (a network call, a lock, input()), or raise the "
            f"timeout")) from None


def _build_error(app: dict, error: BaseException) -> BuildError:
    cause = error.cause if isinstance(error, RayTaskError) else error
    if isinstance(cause, BuildError):
        return cause
    return BuildError(app["name"], f"{type(cause).__name__}: {cause}")
