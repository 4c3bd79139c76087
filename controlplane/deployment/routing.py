"""What routers learn of one deployment, and what the data plane reports back: its serving
replicas (with the multiplexed models each holds), its limits and, for
``cluster_informed``, the routers' total demand, published only when they changed; the
requests the user's code raised on (``RequestErrors``, for status).

Owned by ``DeploymentState``; the shard publishes ``update(...)`` each tick: O(1) when
nothing changed, a ``RoutingDelta`` of the serving replicas that moved (O(changes)) when
only membership did, the whole ``RoutingUpdate`` (O(replicas), rare) the first time and
when limits or a replica's models changed. The routers' demand and the start times it is
forecast from live on the ``DemandBoard`` this object owns.
"""

from __future__ import annotations

from controlplane.config.schema import COLD_START_HOLD_S
from controlplane.deployment.demand_board import DemandBoard
from controlplane.deployment.replica_set import Moved, ReplicaRecord, ReplicaSet
from controlplane.specs import DeploymentSpec
from controlplane.wire import (ClusterDemand, ReplicaInfo, RequestError, RouterDemand,
                               RoutingDelta, RoutingUpdate)


class DeploymentRouting:
    def __init__(self) -> None:
        self._key: tuple | None = None  # the limits (and models) last published whole
        self._published: dict[str, ReplicaInfo] | None = None  # what routers hold now
        self._model_ids: dict[str, tuple[str, ...]] = {}  # multiplexed models, by replica
        self._models_version = 0
        self._demand: ClusterDemand | None = None  # the last cluster total published
        self.demand = DemandBoard()  # cluster_informed: the routers' reports, start times
        self.errors = RequestErrors()

    def replica_moved(self, moved: Moved) -> None:
        if moved.started:
            self.demand.note_start(moved.now - moved.record.started_at)

    def record_router_demand(self, router_id: str, demand: RouterDemand, now: float) -> None:
        self.demand.record(router_id, demand, now)

    def model_ids(self, replica_id: str) -> tuple[str, ...]:
        """The multiplexed models a replica reported holding (status shows them)."""
        return self._model_ids.get(replica_id, ())

    def record_model_ids(self, replicas: ReplicaSet, replica_id: str,
                         ids: tuple[str, ...]) -> None:
        """A replica's multiplexed models changed (a load or an eviction, rare): routers
        learn at the next tick."""
        if replica_id in replicas and self._model_ids.get(replica_id, ()) != ids:
            self._model_ids[replica_id] = tuple(ids)
            self._models_version += 1

    def update(self, spec: DeploymentSpec, replicas: ReplicaSet,
               now: float) -> RoutingUpdate | RoutingDelta | None:
        """What routers need, if it changed since the last call: the whole update the
        first time and when limits or models changed (O(replicas), rare), else a delta of
        the serving replicas that joined, changed or left (O(changes)), with a new cluster
        total when due (``cluster_informed`` only), else None."""
        hold = cold_hold_s(spec)
        informed = (spec.backpressure_config.get("retry_after_policy") == "cluster_informed"
                    or hold is not None)
        demand = self.demand.to_publish(now, replicas) if informed else None
        if demand is not None:
            self._demand = demand
        limits = (spec.max_ongoing_requests, spec.max_queued_requests,
                  tuple(sorted(spec.backpressure_config.items())), self._models_version,
                  _policy(spec), hold)
        changes = replicas.take_serving_changes()
        if limits != self._key or self._published is None:
            self._key = limits
            return self._full(spec, replicas)
        added, removed = [], []
        for replica_id, record in changes.items():
            if record is None:
                if self._published.pop(replica_id, None) is not None:
                    removed.append(replica_id)
                    self._model_ids.pop(replica_id, None)
            elif self._published.get(replica_id) != (info := self._info(record)):
                self._published[replica_id] = info
                added.append(info)
        if not added and not removed and demand is None:
            return None
        return RoutingDelta(tuple(added), tuple(removed), demand)

    def _info(self, r: ReplicaRecord) -> ReplicaInfo:
        return ReplicaInfo(r.replica_id, r.actor_name, r.node_id, r.http_address,
                           self._model_ids.get(r.replica_id, ()))

    def _full(self, spec: DeploymentSpec, replicas: ReplicaSet) -> RoutingUpdate:
        serving = [replicas.get(i) for i in sorted(replicas.running_ids())]
        if self._model_ids:  # forget replicas that left
            self._model_ids = {i: m for i, m in self._model_ids.items() if i in replicas}
        infos = tuple(self._info(r) for r in serving)
        self._published = {info.replica_id: info for info in infos}
        backpressure = spec.backpressure_config
        return RoutingUpdate(
            replicas=infos,
            max_ongoing_requests=spec.max_ongoing_requests,
            max_queued_requests=spec.max_queued_requests,
            status_code=int(backpressure.get("status_code", 503)),
            retry_after_s=backpressure.get("retry_after_s"),
            retry_after_policy=backpressure.get("retry_after_policy") or "static",
            demand=self._demand, request_router=_policy(spec), cold_hold_s=cold_hold_s(spec))


def cold_hold_s(spec: DeploymentSpec) -> float | None:
    """How long a request may wait for the first replica of a deployment that scales to
    zero (``autoscaling_config.cold_start_hold_s``); None for one that never does."""
    scaling = spec.autoscaling_config
    if not scaling or scaling.get("min_replicas", 1) != 0:
        return None
    hold = scaling.get("cold_start_hold_s")
    return float(COLD_START_HOLD_S if hold is None else hold)


def _policy(spec: DeploymentSpec) -> tuple:
    # getattr: a spec checkpointed before request_router existed has none (p2c)
    return tuple(sorted(dict(getattr(spec, "request_router", None) or {}).items()))


class RequestErrors:
    """What the user's code raised on requests, as replicas report it: a total, and the
    newest error with the replica and request id that find its traceback in the logs."""

    def __init__(self) -> None:
        self.total = 0
        self._last: tuple[str, RequestError] | None = None  # (replica id, error)

    def record(self, replica_id: str, error: RequestError) -> None:
        self.total += max(1, error.count)
        if self._last is None or error.at_s >= self._last[1].at_s:
            self._last = (replica_id, error)

    def view(self) -> dict | None:
        """Status's ``request_errors``; None when nothing was raised."""
        if self._last is None:
            return None
        replica_id, error = self._last
        return {"total": self.total, "last": {"replica_id": replica_id,
                                              "request_id": error.request_id,
                                              "error": error.error, "at_s": error.at_s}}
