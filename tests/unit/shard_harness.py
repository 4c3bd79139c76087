"""The shard harness of the deployment-state tests: ShardCore wired to fakes, stepped by
hand on the virtual-time loop (no Ray, no wall time).

``run`` runs a scenario on a ``VirtualTimeLoop``; a ``Shard`` built inside it reads the
loop's FakeClock, so timers and the shard agree on the time. ``step`` ticks, then waits
until every owned task (start, stop, probe, reconfigure) is blocked again: however many
``await``s a task chain takes, never a counted number of yields. Time moves only by
``advance``. The shard's own reconcile loop is parked (an interval far past any test), so
only the ticks a test asks for happen."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from controlplane.clock import FakeClock
from controlplane.settings import ReplicaSettings, Settings, ShardSettings
from controlplane.shard import ShardCore
from controlplane.specs import DeploymentId, DeploymentSpec
from tests.unit.fakes import FakeReplicaClient
from tests.unit.virtual_time import loop_clock, run_virtual, wait_all_tasks_blocked

DEP = DeploymentId("app", "model")
LOOP_PARKED_S = 1e9  # the shard's own loop ticks once, then waits past any test
TRACEBACK = 'Traceback (most recent call last):\n  File "model.py", line 3\nValueError: boom'
SERVING = ("RUNNING", "UPDATING")


def make_spec(num_replicas: int = 3, code_version: str = "v1", user_config=None,
              **changes) -> DeploymentSpec:
    spec = DeploymentSpec(
        id=DEP, ingress=True, code_version=code_version, serialized_def=b"",
        num_replicas=num_replicas, max_ongoing_requests=5, max_queued_requests=-1,
        user_config=user_config, autoscaling_config=None, health_check_period_s=10.0,
        health_check_timeout_s=30.0, graceful_shutdown_timeout_s=20.0,
        backpressure_config={"status_code": 503, "retry_after_s": None},
        ray_actor_options={"num_cpus": 1})
    return replace(spec, **changes)


class Shard:
    """ShardCore wired to fakes, with helpers to step the loop and read status."""

    def __init__(self, ingress=None, replica: ReplicaSettings | None = None,
                 **shard_settings) -> None:
        self.settings = Settings(shard=ShardSettings(tick_interval_s=LOOP_PARKED_S,
                                                     **shard_settings),
                                 replica=replica or ReplicaSettings())
        self.client = FakeReplicaClient()
        self.clock = loop_clock()
        self.core = ShardCore(0, self.settings, self.client, self.clock, ingress)

    async def step(self, ticks: int = 1) -> None:
        for _ in range(ticks):
            self.core.tick()
            await wait_all_tasks_blocked()

    async def deploy(self, spec: DeploymentSpec, ticks: int = 3) -> None:
        self.core.apply([spec], [])
        await self.step(ticks)

    async def delete(self, ticks: int = 3) -> None:
        self.core.apply([], [DEP])
        await self.step(ticks)

    async def advance(self, seconds: float, ticks: int = 2) -> None:
        self.clock.advance(seconds)
        await self.step(ticks)

    def status(self) -> dict | None:
        return self.core.status()["deployments"].get(str(DEP))

    def replicas(self) -> list[dict]:
        return self.status()["replicas"]

    def states(self) -> Counter:
        return Counter(r["state"] for r in self.replicas())

    def serving_ranks(self) -> dict[str, int]:
        return {r["replica_id"]: r["rank"] for r in self.replicas() if r["state"] in SERVING}

    def id_of_rank(self, rank: int) -> str:
        return next(rid for rid, r in self.serving_ranks().items() if r == rank)


def run(scenario) -> None:
    run_virtual(FakeClock(), scenario)


async def deployed(n: int = 3, **spec_changes) -> Shard:
    shard = Shard()
    await shard.deploy(make_spec(n, **spec_changes))
    assert shard.status()["status"] == "HEALTHY"
    return shard


