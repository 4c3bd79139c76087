"""The draining nodes a deployment's replicas must leave, and when each must go.

Owns each draining node's deadline (on the shard's clock) and the earliest moment a
replica on one must start its drain. A replica on a draining node is replaced elsewhere
first (``reconcile`` starts its successor), then drained: it must begin to stop early
enough that its drain (up to the graceful shutdown timeout and, in haproxy mode, the
deregistration window) ends before the node's deadline, with a margin.

Invariants: O(1) when no node drains; a change of the draining set costs one walk of the
replicas (``set``), never one per tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controlplane.deployment.replica_set import ReplicaRecord
from controlplane.specs import DeploymentSpec

# A replica on a draining node starts its drain this long before the drain could no
# longer finish by the node's deadline.
DRAIN_MARGIN_S = 2.0


class NodeDrains:
    def __init__(self) -> None:
        self._deadlines: dict[str, float] = {}  # draining node -> its deadline
        self.due = float("inf")  # when the next leaving replica must go

    def __bool__(self) -> bool:
        return bool(self._deadlines)

    def set(self, drains: Mapping[str, float], records: Iterable[ReplicaRecord]) -> bool:
        """The draining nodes and their deadlines; True when a replica of ``records`` runs
        on a node whose deadline changed (the deployment re-plans)."""
        changed = {n for n in drains.keys() | self._deadlines.keys()
                   if drains.get(n) != self._deadlines.get(n)}
        self._deadlines = dict(drains)
        return any(r.node_id in changed for r in records)

    def leaving(self, node_id: str | None, spec: DeploymentSpec, now: float) -> tuple[bool, bool]:
        """(on a draining node, past the moment it must go) for a replica on ``node_id``,
        as a full plan looks at each replica; ``due`` becomes the earliest moment one that
        may still stay must go (``begin`` starts a plan's look)."""
        go_at = self.must_go_at(node_id, spec)
        if go_at is None:
            return False, False
        if now < go_at:
            self.due = min(self.due, go_at)
            return True, False
        return True, True

    def begin(self) -> None:
        """A plan looks at the replicas afresh: no replica must go until it says so."""
        self.due = float("inf")

    def must_go_at(self, node_id: str | None, spec: DeploymentSpec) -> float | None:
        """When a replica on ``node_id`` must start its drain; None off draining nodes."""
        deadline = self._deadlines.get(node_id) if node_id is not None else None
        if deadline is None:
            return None
        window = spec.direct_ingress.deregistration_window_s \
            if spec.direct_ingress is not None else 0.0
        return deadline - spec.graceful_shutdown_timeout_s - window - DRAIN_MARGIN_S
