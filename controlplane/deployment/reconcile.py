"""Reconcile plans: pure functions from a deployment snapshot to actions.

Level-based and idempotent (controller-runtime style): the plan looks only at the current
snapshot, never at what happened before, so running it twice on the same snapshot yields
the same actions and a plan interrupted half-way is finished by the next one. STARTING
replicas count toward the target ("expectations"), so a slow start is not counted twice.

Rolling replacement: new-version replicas are started up to ``target + surge`` active
replicas, and old-version replicas retire only as new ones become RUNNING, so serving
capacity never drops below the target while a new version comes up (and an old version
keeps serving if the new one fails to construct).

Node drain (a spot interruption, a pod deletion): replicas on a draining node are
``leaving``. Their replacements start at once, on other nodes (Ray places nothing new on
a draining node), without waiting for a surge budget; a leaving replica retires only as
replacements become RUNNING, so capacity never drops below the target while the node
still serves, or when it ``must_go`` (its node's deadline is near): then it is stopped
with the normal drain whatever else is running.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.deployment.lifecycle import ACTIVE_STATES, SERVING_STATES, ReplicaState


@dataclass(frozen=True)
class ReplicaView:
    replica_id: str
    state: ReplicaState
    version: str
    config_version: str
    rank: int | None
    leaving: bool = False  # on a draining node
    must_go: bool = False  # ...whose deadline leaves just the time to drain


@dataclass(frozen=True)
class DeploymentSnapshot:
    target_replicas: int
    target_version: str
    target_config_version: str
    replicas: tuple[ReplicaView, ...]
    deleting: bool = False
    starts_blocked: bool = False  # start backoff running, or DEPLOY_FAILED
    surge: int = 1
    max_starting: int = 0  # starts in flight at most (0: no bound)


@dataclass(frozen=True)
class StartReplica:
    pass


START = StartReplica()  # fieldless and frozen: one instance serves every planned start


@dataclass(frozen=True)
class StopReplica:
    replica_id: str
    reason: str


@dataclass(frozen=True)
class ReconfigureReplica:
    replica_id: str


Action = StartReplica | StopReplica | ReconfigureReplica


def plan(s: DeploymentSnapshot) -> list[Action]:
    active = [r for r in s.replicas if r.state in ACTIVE_STATES]
    if s.deleting:
        return [StopReplica(r.replica_id, "application deleted") for r in active]
    leaving = [r for r in active if r.leaving]
    staying = [r for r in active if not r.leaving]
    new = [r for r in staying if r.version == s.target_version]
    old = [r for r in staying if r.version != s.target_version]
    old_serving = [r for r in old if r.state in SERVING_STATES]
    actions: list[Action] = [StopReplica(r.replica_id, "outdated version")
                             for r in old if r.state == ReplicaState.STARTING]
    actions += _scale_new(s, new, old_serving)
    actions += _retire_leaving(s, new + old_serving, leaving)
    actions += _retire_old(s, new, old_serving)
    stopping = {a.replica_id for a in actions if isinstance(a, StopReplica)}
    due = [r for r in new if r.state == ReplicaState.RUNNING and r.replica_id not in stopping
           and r.config_version != s.target_config_version]
    updating = sum(1 for r in new if r.state == ReplicaState.UPDATING)
    # A config change rolls like a version: at most ``surge`` replicas reconfigure at once.
    actions += [ReconfigureReplica(r.replica_id) for r in due[:max(s.surge - updating, 0)]]
    return actions


def _scale_new(s: DeploymentSnapshot, new: list[ReplicaView],
               old_serving: list[ReplicaView]) -> list[Action]:
    missing = s.target_replicas - len(new)
    if missing < 0:
        return [StopReplica(r.replica_id, "scaled down") for r in _stop_order(new)[:-missing]]
    if missing == 0 or s.starts_blocked:
        return []
    if old_serving:  # rolling update: bounded surge above the target
        room = s.target_replicas + s.surge - len(new) - len(old_serving)
        missing = min(missing, max(room, 0))
    starting = sum(1 for r in s.replicas if r.state == ReplicaState.STARTING)
    return [START] * starts_allowed(missing, starting, s.max_starting)


def starts_allowed(missing: int, starting: int, max_starting: int) -> int:
    """Starts to ask for now: the missing ones, within the bound on starts in flight (the
    rest follow as those finish: a scale-up is paced by Ray, not all asked at once)."""
    return missing if max_starting <= 0 else max(0, min(missing, max_starting - starting))


def _retire_leaving(s: DeploymentSnapshot, staying: list[ReplicaView],
                    leaving: list[ReplicaView]) -> list[Action]:
    """Replicas on a draining node: gone now when not serving yet or out of time, else
    one per replacement that serves (staying serving above the target)."""
    now = [r for r in leaving if r.must_go or r.state not in SERVING_STATES]
    rest = [r for r in leaving if r not in now]
    serving = sum(1 for r in staying if r.state in SERVING_STATES)
    excess = serving + len(rest) - s.target_replicas
    retire = len(rest) if s.target_replicas == 0 else min(len(rest), max(excess, 0))
    return [StopReplica(r.replica_id, "its node is draining")
            for r in now + _stop_order(rest)[:retire]]


def _retire_old(s: DeploymentSnapshot, new: list[ReplicaView],
                old_serving: list[ReplicaView]) -> list[Action]:
    new_running = sum(1 for r in new if r.state in SERVING_STATES)
    excess = new_running + len(old_serving) - s.target_replicas
    retire = len(old_serving) if s.target_replicas == 0 else min(len(old_serving), max(excess, 0))
    return [StopReplica(r.replica_id, "replaced by new version")
            for r in _stop_order(old_serving)[:retire]]


def _stop_order(replicas: list[ReplicaView]) -> list[ReplicaView]:
    """Who goes first on scale-down: starting ones (no capacity yet), then highest rank,
    which keeps the remaining ranks compact without moves."""
    def key(r: ReplicaView) -> tuple:
        return (r.state != ReplicaState.STARTING, -(r.rank if r.rank is not None else -1))
    return sorted(replicas, key=key)


def deployment_status(s: DeploymentSnapshot, deploy_failed: bool, unhealthy: bool) -> str:
    """HEALTHY | UPDATING | UNHEALTHY | DEPLOY_FAILED | DELETING."""
    if s.deleting:
        return "DELETING"
    if deploy_failed:
        return "DEPLOY_FAILED"
    active = [r for r in s.replicas if r.state in ACTIVE_STATES]
    settled = (len(active) == s.target_replicas and all(
        r.state == ReplicaState.RUNNING and r.version == s.target_version
        and r.config_version == s.target_config_version for r in active))
    if settled:
        return "HEALTHY"
    return "UNHEALTHY" if unhealthy else "UPDATING"


@dataclass(frozen=True)
class StatusCounts:
    """What ``deployment_status`` reads of the replicas, as counts: a shell that keeps
    them up to date answers the status word without walking its replicas."""

    target_replicas: int
    active: int  # STARTING + RUNNING + UPDATING
    running: int  # RUNNING
    running_off_version: int  # RUNNING replicas not on the target code version
    running_off_config: int  # RUNNING replicas not on the target user_config version
    deleting: bool = False

    @classmethod
    def of(cls, s: DeploymentSnapshot) -> StatusCounts:
        """The counts of a snapshot (O(replicas): for tests and the full listing)."""
        running = [r for r in s.replicas if r.state == ReplicaState.RUNNING]
        return cls(s.target_replicas, sum(1 for r in s.replicas if r.state in ACTIVE_STATES),
                   len(running), sum(1 for r in running if r.version != s.target_version),
                   sum(1 for r in running if r.config_version != s.target_config_version),
                   s.deleting)


def status_from_counts(c: StatusCounts, deploy_failed: bool, unhealthy: bool) -> str:
    """``deployment_status`` from counts, in O(1); the two agree on every snapshot
    (tested on random ones): settled is every active replica RUNNING on the target."""
    if c.deleting:
        return "DELETING"
    if deploy_failed:
        return "DEPLOY_FAILED"
    settled = (c.active == c.target_replicas == c.running
               and c.running_off_version == 0 and c.running_off_config == 0)
    if settled:
        return "HEALTHY"
    return "UNHEALTHY" if unhealthy else "UPDATING"
