"""The shard's only door to replica actors: create, initialize, probe, reconfigure, stop.

``ReplicaClient`` is the seam: ``RayReplicaClient`` is the real one; the unit tests'
``FakeReplicaClient`` and the release tests' simulated fleet implement the same protocol
(``tests/unit/test_replica_client_protocol.py`` checks that they do). Errors
are translated into two types that decide behaviour: ``ReplicaDied`` (the actor is gone:
authoritative, replace now) and ``ReplicaCallFailed`` (the call failed or timed out:
counts as one failed observation).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import time
from typing import Any, Protocol

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from controlplane.errors import first_line
from controlplane.specs import DeploymentSpec
from controlplane.wire import REPLICA_ACTOR_CLASS, ReplicaDescription, ReplicaInit

logger = logging.getLogger(__name__)


class ReplicaDied(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)


class ReplicaCallFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)


class CallTimedOut(ReplicaCallFailed):
    """The call did not return within its deadline (the replica may still be working)."""


_ACTOR_PREFIX = "fleetplane_replica::"


def replica_actor_name(replica_id: str) -> str:
    return f"{_ACTOR_PREFIX}{replica_id}"


class ReplicaClient(Protocol):
    """What a shard may do to a replica. ``create`` returns a handle at once (the actor
    starts in the background) or raises: ``ValueError`` when the actor name is taken,
    anything else when the scheduler refused it. The async calls raise ``ReplicaDied``
    or ``ReplicaCallFailed``; ``stop`` and ``kill`` never raise. ``find`` lists the live
    replica actors of a deployment by name (replica id -> handle), for re-adoption.
    ``start_phase`` says where a starting replica is (one of ``START_PHASES``; "" when
    unknown), for status."""

    def create(self, init: ReplicaInit, spec: DeploymentSpec) -> Any: ...

    def find(self, app: str, deployment: str) -> dict[str, Any]: ...

    def start_phase(self, handle: Any) -> str: ...

    async def describe(self, handle: Any, timeout_s: float) -> ReplicaDescription: ...

    async def initialize(self, handle: Any, timeout_s: float) -> dict: ...

    async def check_health(self, handle: Any, timeout_s: float) -> None: ...

    async def update_health_timings(self, handle: Any, period_s: float,
                                    timeout_s: float) -> None: ...

    async def wait_until_stopped(self, handle: Any) -> None: ...

    async def reconfigure(self, handle: Any, user_config: Any, timeout_s: float) -> None: ...

    async def update_rank(self, handle: Any, rank: int) -> None: ...

    async def stop(self, handle: Any, grace_s: float, extra_s: float) -> None: ...

    def kill(self, handle: Any) -> None: ...


async def call_replica(ref: Any, timeout_s: float | None) -> Any:
    """Await one Ray call to a replica, its errors translated into ours."""
    try:
        return await asyncio.wait_for(ref, timeout_s)
    except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
        raise ReplicaDied(first_line(e)) from None
    except asyncio.TimeoutError:
        raise CallTimedOut(f"timed out after {timeout_s}s") from None
    except RayTaskError as e:  # the user's code raised: keep their traceback
        raise ReplicaCallFailed(str(e)) from None


def load_plugin(path: str = REPLICA_ACTOR_CLASS) -> Any:
    """What ``module:name`` names: the replica actor class, the node reporters' starter
    (the control plane never imports ``replicas/``: it uses them by name, as plugins)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# Ray's actor states while a replica starts, in words for status.
START_PHASES = {"PENDING_CREATION": "waiting for Ray to place it",
                "DEPENDENCIES_UNREADY": "setting up its runtime_env",
                "ALIVE": "constructor and first health check running"}


class HeadNode:
    """The head node's id (Ray gives the head the resource ``node:__internal_head__``),
    read from the GCS at most once per ``ttl_s``: a head that comes back has a new id."""

    def __init__(self, ttl_s: float = 10.0) -> None:
        self._ttl_s, self._read_at, self._id = ttl_s, -math.inf, None

    def __call__(self) -> str | None:
        now = time.monotonic()
        if now - self._read_at >= self._ttl_s:
            self._read_at = now
            try:
                self._id = next((n["NodeID"] for n in ray.nodes() if n["Alive"]
                                 and "node:__internal_head__" in n["Resources"]), None)
            except Exception:  # the GCS unreachable: keep the last reading
                pass
        return self._id


# Where a replica goes unless the user placed it: the placement options of Ray's it uses
_PLACEMENT = ("scheduling_strategy", "label_selector", "fallback_strategy")


def placement(options: dict, head_node_id: str | None) -> dict:
    """One deployment's replicas on as many nodes as can take them (SPREAD, as Serve does:
    a node that dies or drains takes few of them with it), and off the head node while
    another node can take them (the fallback: the head, when it alone can): the head's
    loss takes its GCS down for a while, and what runs there with it; a replica there
    would die with it and no replacement could start before the GCS is back. The user's
    own placement (any of ``_PLACEMENT``) is kept as given."""
    given = {k: v for k, v in options.items() if not (k in _PLACEMENT and v is None)}
    if any(k in given for k in _PLACEMENT):
        return given
    away = {}
    if head_node_id:
        away = {"label_selector": {"ray.io/node-id": f"!{head_node_id}"},
                "fallback_strategy": [{"label_selector": {}}]}
    return {**given, "scheduling_strategy": "SPREAD", **away}


class RayReplicaClient:
    def __init__(self, namespace: str, actor_class: str = REPLICA_ACTOR_CLASS) -> None:
        self._namespace = namespace
        self._actor_cls = ray.remote(load_plugin(actor_class))
        self._head = HeadNode()

    def create(self, init: ReplicaInit, spec: DeploymentSpec) -> Any:
        options = dict(spec.ray_actor_options)
        runtime_env = {**dict(spec.runtime_env), **dict(options.pop("runtime_env", {}) or {})}
        if runtime_env:
            options["runtime_env"] = runtime_env
        options = placement(options, self._head())
        return self._actor_cls.options(
            name=replica_actor_name(init.replica_id), namespace=self._namespace,
            lifetime="detached", max_restarts=0, max_concurrency=10_000,
            **options).remote(init)

    def start_phase(self, handle: Any) -> str:
        """The actor's state in GCS (one small call; the state API needs the dashboard)."""
        from ray._private import state

        try:
            return START_PHASES.get(state.actors(handle._actor_id.hex())["State"], "")
        except Exception:  # unknown: status falls back to the plain wording
            return ""

    def find(self, app: str, deployment: str) -> dict[str, Any]:
        """Live replica actors of one deployment in this namespace, by replica id."""
        prefix = replica_actor_name(f"{app}#{deployment}#")
        found = {}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"]
            if entry["namespace"] != self._namespace or not name.startswith(prefix):
                continue
            try:
                found[name[len(_ACTOR_PREFIX):]] = ray.get_actor(name, namespace=self._namespace)
            except ValueError:  # it died between the listing and the lookup
                pass
        return found

    async def describe(self, handle: Any, timeout_s: float) -> ReplicaDescription:
        return await call_replica(handle.describe.remote(), timeout_s)

    async def initialize(self, handle: Any, timeout_s: float) -> dict:
        return await call_replica(handle.initialize.remote(), timeout_s)

    async def check_health(self, handle: Any, timeout_s: float) -> None:
        await call_replica(handle.check_health.remote(), timeout_s)

    async def update_health_timings(self, handle: Any, period_s: float,
                                    timeout_s: float) -> None:
        await call_replica(handle.update_health_timings.remote(period_s, timeout_s), 30.0)

    async def wait_until_stopped(self, handle: Any) -> None:
        """The death watch: pending until the replica is asked to stop; ``ReplicaDied`` as
        soon as the actor dies (Ray fails pending calls of a dead actor)."""
        await call_replica(handle.wait_until_stopped.remote(), None)

    async def reconfigure(self, handle: Any, user_config: Any, timeout_s: float) -> None:
        await call_replica(handle.reconfigure.remote(user_config), timeout_s)

    async def update_rank(self, handle: Any, rank: int) -> None:
        await call_replica(handle.update_rank.remote(rank), 30.0)

    async def stop(self, handle: Any, grace_s: float, extra_s: float) -> None:
        """Let in-flight requests finish (up to grace_s), then kill the actor."""
        try:
            await call_replica(handle.prepare_for_shutdown.remote(grace_s), grace_s + extra_s)
        except (ReplicaDied, ReplicaCallFailed) as e:  # killing it anyway
            logger.info("replica did not drain cleanly (%s); killing it", e)
        self.kill(handle)

    def kill(self, handle: Any) -> None:
        """Kill the actor; a dead one is a no-op for Ray. Whatever else fails is logged:
        a replica that cannot be killed may leak a process."""
        try:
            ray.kill(handle, no_restart=True)
        except Exception as e:
            logger.warning("could not kill replica actor %r: %r", handle, e)
