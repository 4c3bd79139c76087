"""Building a deploy config's applications, off the controller, under a deadline.

Each application is imported and built in a fresh Ray worker of its own (``max_calls=1``:
a re-deploy imports the user's edited code; one application's hanging or crashing import
never hides another's result), all in parallel. A build that has not finished within
``controller_options.build_timeout_s`` (an import that blocks on the network, a lock,
``input()``) is cancelled, its worker killed, and the deploy rejected naming that
application: nothing changes, and the controller, which only awaits the builds, keeps
answering ``status`` throughout.

Every failure is a ``BuildError`` of one line naming the application and the field, the
traceback behind it as its ``detail``: the user's code (``build``), the application's
``runtime_env`` (Ray checks and uploads it when the build is sent, and sets it up before
the build runs: a path that does not exist, a wrong type, a package that does not
install), and a deployment's own ``ray_actor_options.runtime_env`` (checked here, where
the shards will create replicas with it, by Ray's own ``RuntimeEnv`` parser).
"""

from __future__ import annotations

import asyncio
import traceback

import ray
from ray.exceptions import RayTaskError, RuntimeEnvSetupError
from ray.runtime_env import RuntimeEnv

from controlplane.errors import BuildError, BuildErrors, exception_line, first_line
from controlplane.specs import DeploymentSpec
from controlplane.usercode.build import build_with_warnings

_remote_build = ray.remote(num_cpus=0, max_calls=1)(build_with_warnings)


async def build_all(apps: list[dict],
                    timeout_s: float) -> tuple[list[DeploymentSpec], list[str]]:
    """The specs of every application, in config order, and the builds' warnings (options
    set in code that fleetplane does not act on); raises the BuildError of the application
    that failed, or BuildErrors naming each of several."""
    results = await asyncio.gather(*(_build(app, timeout_s) for app in apps),
                                   return_exceptions=True)
    errors = [e for app, r in zip(apps, results) if (e := _failure(app, r)) is not None]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise BuildErrors(errors)
    specs = [spec for app_specs, _ in results for spec in app_specs]
    return specs, [warning for _, app_warnings in results for warning in app_warnings]


async def _build(app: dict, timeout_s: float) -> tuple[list[DeploymentSpec], list[str]]:
    if app.get("runtime_env"):
        try:  # Ray checks the runtime_env here, and uploads a local working_dir
            ref = _remote_build.options(runtime_env=app["runtime_env"]).remote(app)
        except Exception as e:
            raise BuildError(app["name"], f"runtime_env: {first_line(e)}",
                             traceback.format_exc()) from None
    else:
        ref = _remote_build.remote(app)
    try:
        return await asyncio.wait_for(ref, timeout_s)
    except asyncio.TimeoutError:
        ray.cancel(ref, force=True)  # kills the worker stuck in the user's import
        raise BuildError(app["name"], (
            f"importing and building did not finish within {timeout_s:g}s "
            f"(controller_options.build_timeout_s); look for an import or builder that "
            f"blocks (a network call, a lock, input()), or raise the timeout")) from None


def _failure(app: dict, result: object) -> BuildError | None:
    if isinstance(result, BaseException):
        return _build_error(app, result)
    return _replica_env_error(app["name"], result[0])


def _build_error(app: dict, error: BaseException) -> BuildError:
    cause = error.cause if isinstance(error, RayTaskError) else error
    if isinstance(cause, BuildError):
        return cause
    if isinstance(cause, RuntimeEnvSetupError):  # its text is Ray's traceback: last line
        lines = [line for line in str(cause).splitlines() if line.strip()]
        return BuildError(app["name"], f"runtime_env could not be set up: "
                          f"{lines[-1].strip() if lines else 'no reason given'}", str(cause))
    return BuildError(app["name"], f"importing and building failed: {exception_line(cause)}",
                      str(cause))


def _replica_env_error(app: str, specs: list[DeploymentSpec]) -> BuildError | None:
    """A deployment's own runtime_env (laid over the application's, as the replica gets
    it) that Ray would refuse when a shard creates the replica."""
    for spec in specs:
        own = spec.ray_actor_options.get("runtime_env")
        if not own:
            continue
        try:
            RuntimeEnv(**{**spec.runtime_env, **own})
        except Exception as e:  # Ray's parser: TypeError, ValueError...
            return BuildError(app, f"deployment '{spec.id.name}': "
                              f"ray_actor_options.runtime_env: {first_line(e)}",
                              traceback.format_exc())
    return None
