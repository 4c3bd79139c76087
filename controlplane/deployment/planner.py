"""When a deployment plans, how, and how much of a plan one slice carries out.

Owns the planning state: whether something changed since the last plan (``dirty``: a
new spec, a replica transition, a new autoscaling target, an expired start backoff, a
replica that must leave a draining node), whether the last plan came from counts, whether
a slice left planned transitions for the next one (``more_now``), and whether every
active replica ran the target code at the last plan (``on_target``: the rollout settles
on it).

A plan comes from counts where that answers exactly (``count_plan``: scale-up,
scale-down, rolling update, steady state: O(1), or O(k log N) for k retirements), else
from the pure ``reconcile.plan`` over a snapshot of every replica (a deletion, a draining
node, a config rollout). At most ``transitions_per_slice`` actions of a plan from counts
are carried out per slice: the rest waits for the next slice, re-planned from counts
then. A full plan is carried out whole, since re-planning it costs another snapshot.
"""

from __future__ import annotations

from controlplane.deployment.count_plan import CountTargets, plan_from_counts
from controlplane.deployment.drains import NodeDrains
from controlplane.deployment.lifecycle import ACTIVE_STATES
from controlplane.deployment.reconcile import Action, DeploymentSnapshot, ReplicaView, plan
from controlplane.deployment.replica_book import ReplicaBook
from controlplane.deployment.rollout import Rollout
from controlplane.settings import ShardSettings
from controlplane.specs import DeploymentSpec


class Planner:
    def __init__(self, book: ReplicaBook, rollout: Rollout, drains: NodeDrains,
                 settings: ShardSettings) -> None:
        self._book, self._rollout, self._drains = book, rollout, drains
        self._slice = settings.transitions_per_slice  # 0: no bound
        self._max_starting = settings.max_starting_replicas
        self._surge_fraction = settings.rolling_surge_fraction
        self.dirty = True
        self.more_now = False  # a slice left planned transitions for the next one
        self.on_target = True  # at the last plan: every active replica runs the target
        self._counted = False  # the last plan came from counts (cheap to redo)

    def mark_dirty(self) -> None:
        self.dirty = True

    def next_slice(self, now: float, target: int, deleting: bool,
                   spec: DeploymentSpec) -> list[Action]:
        """Plan, and return this slice's actions (all of a full plan)."""
        self.dirty = False
        actions = self._plan(now, target, deleting, spec)
        limit = self._slice
        self.more_now = bool(limit) and len(actions) > limit and self._counted
        if self.more_now:
            actions = actions[:limit]
            self.dirty = True  # re-planned from counts by the next slice
        return actions

    def _plan(self, now: float, target: int, deleting: bool,
              spec: DeploymentSpec) -> list[Action]:
        counted = None if deleting or self._drains else self.from_counts(now, target, cap=True)
        self._counted = counted is not None
        if counted is not None:
            actions, self.on_target = counted
            self._drains.begin()
            return actions
        snapshot = self.snapshot(now, target, deleting, spec)
        self.on_target = all(r.version == snapshot.target_version for r in snapshot.replicas
                             if r.state in ACTIVE_STATES)
        return plan(snapshot)

    def from_counts(self, now: float, target: int,
                    cap: bool = False) -> tuple[list[Action], bool] | None:
        """``plan_from_counts``'s answer; ``cap``: one action more than a slice carries
        out, so it knows more are due."""
        rollout = self._rollout
        return plan_from_counts(self._book.replicas, self._book.config_versions, CountTargets(
            replicas=target, version=rollout.serving.code_version,
            config_version=rollout.serving_config[1], surge=self.surge(target),
            max_starting=self._max_starting, starts_blocked=rollout.starts_blocked(now)),
            cap=limit + 1 if cap and (limit := self._slice) else 0)

    def surge(self, target: int) -> int:
        return max(1, int(self._surge_fraction * target))

    def snapshot(self, now: float, target: int, deleting: bool,
                 spec: DeploymentSpec) -> DeploymentSnapshot:
        """Every replica as the full plan sees it (O(replicas))."""
        drains, configs = self._drains, self._book.config_versions
        drains.begin()
        views = []
        for r in self._book.replicas.records():
            leaving, must_go = drains.leaving(r.node_id, spec, now) if drains else (False, False)
            views.append(ReplicaView(r.replica_id, r.state, r.version,
                                     configs.get(r.replica_id, ""), r.rank, leaving, must_go))
        rollout = self._rollout
        return DeploymentSnapshot(
            target_replicas=target, target_version=rollout.serving.code_version,
            target_config_version=rollout.serving_config[1], replicas=tuple(views),
            deleting=deleting, surge=self.surge(target),
            starts_blocked=rollout.starts_blocked(now), max_starting=self._max_starting)
