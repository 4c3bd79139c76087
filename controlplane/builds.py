"""Building a deploy config's applications, off the controller, under a deadline.

Each distinct ``runtime_env`` gets one fresh Ray worker (``max_calls=1``: a re-deploy
imports the user's edited code) that imports and builds all of its applications. A build
that has not finished within ``controller_options.build_timeout_s`` (an import that
blocks on the network, a lock, ``input()``) is cancelled, its worker killed, and the
deploy rejected naming the applications: nothing changes, and the controller, which only
awaits the build, keeps answering ``status`` throughout.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import ray
from ray.exceptions import RayTaskError

from controlplane.errors import BuildError
from controlplane.specs import DeploymentSpec
from controlplane.user_code import build_applications

_remote_build = ray.remote(num_cpus=0, max_calls=1)(build_applications)


async def build_all(apps: list[dict], timeout_s: float) -> list[DeploymentSpec]:
    """The specs of every application, in config order; raises one BuildError naming
    every application that failed (with each one's cause)."""
    groups: dict[str, list[dict]] = {}
    for app in apps:
        groups.setdefault(json.dumps(app.get("runtime_env") or {}, sort_keys=True),
                          []).append(app)
    batches = list(groups.values())
    replies = await asyncio.gather(*(_build_batch(batch, timeout_s) for batch in batches),
                                   return_exceptions=True)
    results: dict[str, Any] = {}
    for batch, reply in zip(batches, replies):
        for app, result in zip(batch, reply if isinstance(reply, list) else
                               [reply] * len(batch)):
            results[app["name"]] = result
    ordered = [results[app["name"]] for app in apps]
    errors = [_build_error(app, r) for app, r in zip(apps, ordered)
              if isinstance(r, BaseException)]
    if errors:
        raise BuildError(", ".join(e.app for e in errors),
                         "\n".join(f"[{e.app}] {e.message}" for e in errors))
    return [spec for app_specs in ordered for spec in app_specs]


async def _build_batch(batch: list[dict], timeout_s: float) -> list:
    task = _remote_build.options(runtime_env=batch[0]["runtime_env"]) \
        if batch[0].get("runtime_env") else _remote_build
    ref = task.remote(batch)
    try:
        return await asyncio.wait_for(ref, timeout_s)
    except asyncio.TimeoutError:
        ray.cancel(ref, force=True)  # kills the worker stuck in the user's import
        raise BuildError(", ".join(app["name"] for app in batch), (
            f"importing and building did not finish within {timeout_s:g}s "
            f"(controller_options.build_timeout_s); nothing was changed. Look for an import "
            f"or builder that blocks (a network call, a lock, input()), or raise the "
            f"timeout")) from None


def _build_error(app: dict, error: BaseException) -> BuildError:
    cause = error.cause if isinstance(error, RayTaskError) else error
    if isinstance(cause, BuildError):
        if ", " in cause.app:  # a timed-out batch: name this application alone
            return BuildError(app["name"], cause.message)
        return cause
    return BuildError(app["name"], f"{type(cause).__name__}: {cause}")
