"""Ray Serve's own context inside a fleetplane replica, so Serve's helpers work unchanged.

``serve.get_replica_context()``, ``@serve.batch``, ``@serve.multiplexed`` and
``serve.get_multiplexed_model_id()`` read two places in ``ray.serve.context``: the
process's replica context (a module global) and the request context (a contextvar). This
module fills both from what fleetplane knows, with Serve's own types, so the user's code
sees exactly what it would under Serve:

- ``install_replica_context``: at construction and on every rank change (replica id,
  app, deployment, rank, world size, max_ongoing_requests, user_config);
- ``request_context``: per request, in the request's own task (Ray runs each actor call
  in a task, so the contextvar never leaks between requests): route, request id, app,
  and the multiplexed model id from the ``serve_multiplexed_model_id`` header or the
  handle's ``options(multiplexed_model_id=...)``.

Both are set only in a process whose user code imported ``ray.serve`` (``serve_in_use``):
a plain class never pays for importing Serve, per replica or per request.

Serve's multiplexer also tells Serve's controller which models a replica holds; that call
is pointed at ``ModelIds``, whose set the replica reports to its shard for routing.
"""

from __future__ import annotations

import logging
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeIdentity:
    """What Serve's ReplicaContext says about this replica."""

    app_name: str
    deployment: str
    replica_id: str
    rank: int
    world_size: int
    max_ongoing_requests: int
    user_config: Any = None


def serve_in_use() -> bool:
    """Whether this process's user code imported Ray Serve (nothing to fill otherwise)."""
    return "ray.serve" in sys.modules


def install_replica_context(identity: ServeIdentity, servable: Any) -> None:
    """Set Serve's process-wide replica context (``serve.get_replica_context()``)."""
    if not serve_in_use():
        return
    from ray.serve._private.common import DeploymentID, ReplicaID
    from ray.serve._private.config import DeploymentConfig
    from ray.serve.context import _set_internal_replica_context
    from ray.serve.schema import ReplicaRank

    config = DeploymentConfig(max_ongoing_requests=identity.max_ongoing_requests,
                              user_config=identity.user_config)
    _set_internal_replica_context(
        replica_id=ReplicaID(identity.replica_id,
                             DeploymentID(name=identity.deployment, app_name=identity.app_name)),
        servable_object=servable, _deployment_config=config,
        rank=ReplicaRank(rank=identity.rank, node_rank=0, local_rank=identity.rank),
        world_size=identity.world_size)


def set_request_context(app_name: str, route: str = "", model_id: str = "",
                        request_id: str = "") -> None:
    """Serve's per-request context, in the calling task only."""
    if not serve_in_use():
        return
    from ray.serve.context import _RequestContext, _serve_request_context

    _serve_request_context.set(_RequestContext(
        route=route, request_id=request_id or uuid.uuid4().hex, app_name=app_name,
        multiplexed_model_id=model_id, is_http_request=bool(route)))


class ModelIds:
    """The multiplexed model ids this replica holds, as Serve's multiplexer reports them.

    Serve's ``_ModelMultiplexWrapper`` calls ``_get_global_client()
    .record_request_routing_info(info)`` after a load or an eviction; ``install`` points
    that name, in ``ray.serve.multiplex`` only, at this object, so no Serve controller is
    looked for. ``on_change`` gets the new set (the replica tells its shard).
    """

    def __init__(self, on_change: Callable[[tuple[str, ...]], None]) -> None:
        self._on_change = on_change
        self.current: tuple[str, ...] = ()

    def install(self) -> None:
        if not serve_in_use():
            return
        import ray.serve.multiplex as multiplex

        multiplex._get_global_client = lambda *_, **__: self

    def record_request_routing_info(self, info: Any) -> None:
        ids = tuple(sorted(info.multiplexed_model_ids or ()))
        if ids != self.current:
            self.current = ids
            self._on_change(ids)
