"""Ray Serve 2.60's side of ``release_tests.scale``: the real ``DeploymentStateManager`` at
N replicas, in one process, with no Ray cluster.

Built the way Serve's own unit tests build it (``mock_deployment_state_manager`` in
ray/serve/tests/unit/test_deployment_state.py): Serve's ``ActorReplicaWrapper`` is
patched with a fake, ``time.time`` with a timer the harness moves, ``ray.get_runtime_context``
with a stub, and the KV store and cluster node cache are small fakes. Serve ships those
fakes in ``ray/serve/_private/test_utils.py``, but that module imports httpx, which is
not one of our dependencies, so the few we need are written out here, after
``MockReplicaActorWrapper``, ``MockKVStore`` and ``MockClusterNodeInfoCache`` there.

What is real: ``DeploymentStateManager.update()`` and everything it calls (replica state
container, rank manager, the default deployment scheduler, long-poll broadcasts into a
recorder). What is fake: replicas start at once (``check_ready`` answers SUCCEEDED on
the first poll, or once ``start_delay_s`` of fake time has passed), stop at once and
are always healthy; the scheduler's actor class is a stub (Serve's test mock uses a
``unittest.mock.Mock`` per replica, which would bill Mock's cost to Serve).

Serve calls the wrapper's ``check_health`` from ``update()``; the fake answers healthy at
once, where the real wrapper polls an ObjectRef (so Serve's real tick is no cheaper).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator
from unittest.mock import patch

from ray.serve._private.autoscaling_state import AutoscalingStateManager
from ray.serve._private.common import DeploymentID, ReplicaState
from ray.serve._private.config import DeploymentConfig, ReplicaConfig
from ray.serve._private.deployment_info import DeploymentInfo
from ray.serve._private.deployment_scheduler import ReplicaSchedulingRequest
from ray.serve._private.deployment_state import DeploymentStateManager, ReplicaStartupStatus

from release_tests.scale import Limits, PhaseResult, percentile

TICK_S = 0.1  # Serve's CONTROL_LOOP_INTERVAL_S: the fake clock moves this per update
DEPLOYMENT = DeploymentID(name="main", app_name="bench")


class FakeTime:
    """``time.time`` for Serve's code: moved only by the harness."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


class _ActorClassStub:
    """What the scheduler calls ``.options(...).remote(...)`` on: no actor is made."""

    def options(self, **_: Any) -> _ActorClassStub:
        return self

    def remote(self, *_: Any) -> None:
        return None


_ACTOR_CLASS = _ActorClassStub()
# Properties of Serve's ActorReplicaWrapper that the fake has nothing to say about.
_NONE_PROPERTIES = ("pid", "worker_id", "availability_zone", "node_ip", "node_instance_id",
                    "grpc_port", "placement_group_bundles", "reconfigure_start_time",
                    "last_health_check_latency_ms", "route_patterns", "gang_context",
                    "docs_path", "http_port")


class FakeReplicaWrapper:
    """Stands in for Serve's ``ActorReplicaWrapper`` (after Serve's own
    ``MockReplicaActorWrapper``): starts when asked, ready at once or after the
    class's ``start_delay_s``, stops at once, always healthy."""

    timer: FakeTime = FakeTime()  # set per run by ``serve_environment``
    start_delay_s = 0.0

    def __init__(self, replica_id: Any, version: Any) -> None:
        self._replica_id = replica_id
        self._actor_name = replica_id.to_full_id_str()
        self.version = version
        self._rank: Any = None
        self._ready_at: float | None = None
        self.stopped = False
        self.is_cross_language = False
        self.has_in_flight_health_or_routing_probe = False
        self.actor_handle = None
        self.log_file_path = "serve/replica.log"
        self.actor_id = f"actor-{replica_id.unique_id}"
        self.initialization_latency_s = 0.0
        self.last_health_check_failed = False
        self.unrecoverable = False
        self._internal_grpc_port = self._http_port = None
        self._ingress = False

    replica_id = property(lambda self: self._replica_id)
    deployment_name = property(lambda self: self._replica_id.deployment_id.name)
    rank = property(lambda self: self._rank)
    node_id = property(lambda self: "node-a" if self._ready_at is not None else None)
    max_ongoing_requests = property(
        lambda self: self.version.deployment_config.max_ongoing_requests)
    graceful_shutdown_timeout_s = property(
        lambda self: self.version.deployment_config.graceful_shutdown_timeout_s)
    health_check_period_s = property(
        lambda self: self.version.deployment_config.health_check_period_s)
    health_check_timeout_s = property(
        lambda self: self.version.deployment_config.health_check_timeout_s)
    actor_resources = property(lambda self: {"CPU": 1.0})
    available_resources = property(lambda self: {})

    def start(self, deployment_info: DeploymentInfo, assign_rank_callback: Any,
              **options: Any) -> ReplicaSchedulingRequest:
        self._rank = assign_rank_callback(self._replica_id.unique_id, node_id=-1)
        self._ready_at = self.timer.time() + self.start_delay_s
        return ReplicaSchedulingRequest(
            replica_id=self._replica_id, actor_def=_ACTOR_CLASS, actor_resources={},
            actor_options={"name": self._actor_name}, actor_init_args=(),
            placement_group_bundles=deployment_info.replica_config.placement_group_bundles,
            on_scheduled=lambda *_, **__: None,
            gang_placement_group=options.get("gang_placement_group"),
            gang_pg_index=options.get("gang_pg_index"),
            target_node_id=options.get("target_node_id"))

    def check_ready(self) -> tuple[ReplicaStartupStatus, str | None]:
        if self._ready_at is not None and self.timer.time() >= self._ready_at:
            return ReplicaStartupStatus.SUCCEEDED, None
        return ReplicaStartupStatus.PENDING_INITIALIZATION, None

    def reconfigure(self, version: Any, rank: Any = None) -> bool:
        updating = self.version.requires_actor_reconfigure(version)
        self.version, self._rank = version, rank
        return updating

    def recover(self, ingress: bool = False) -> bool:
        return False  # nothing survives from an earlier controller here

    def graceful_stop(self) -> float:
        self.stopped = True
        return self.graceful_shutdown_timeout_s

    def check_stopped(self) -> bool:
        return self.stopped

    def force_stop(self, log_shutdown_message: bool = False) -> None:
        self.stopped = True

    def check_health(self) -> bool:
        return True

    def get_routing_stats(self) -> dict:
        return {}

    def get_outbound_deployments(self) -> None:
        return None

    def resource_requirements(self) -> tuple[str, str]:
        return str({"CPU": 1.0}), str({"CPU": 1.0})

    def set_docs_path(self, docs_path: str) -> None:
        pass

    @staticmethod
    def remove_gang_placement_group(pg_name: str) -> None:
        pass


for _name in _NONE_PROPERTIES:
    setattr(FakeReplicaWrapper, _name, property(lambda self: None))


class _KVStore:
    """Serve's checkpoint store, in a dict (after ``test_utils.MockKVStore``)."""

    def __init__(self) -> None:
        self.store: dict[str, Any] = {}

    def put(self, key: str, val: Any) -> bool:
        self.store[key] = val
        return True

    def get(self, key: str) -> Any:
        return self.store.get(key)

    def delete(self, key: str) -> bool:
        return self.store.pop(key, None) is not None


class _NodeCache:
    """One alive node with room for every replica (after ``MockClusterNodeInfoCache``)."""

    def __init__(self) -> None:
        self.node = "node-a"

    def get_alive_node_ids(self) -> set[str]:
        return {self.node}

    def get_active_node_ids(self) -> set[str]:
        return {self.node}

    def get_draining_nodes(self) -> dict:
        return {}

    def get_node_az(self, node_id: str) -> None:
        return None

    def get_available_resources_per_node(self) -> dict:
        return {self.node: {"CPU": 1e9}}

    def get_total_resources_per_node(self) -> dict:
        return {self.node: {"CPU": 1e9}}

    def get_node_labels(self, node_id: str) -> dict:
        return {}


class _LongPollRecorder:
    """Keeps only the last broadcast (a Mock would keep every N-replica list alive)."""

    def __init__(self) -> None:
        self.broadcasts = 0

    def notify_changed(self, updates: Any) -> None:
        self.broadcasts += 1

    def remove_keys(self, keys: Any) -> None:
        pass


@contextlib.contextmanager
def serve_environment(start_delay_s: float) -> Iterator[tuple[DeploymentStateManager, FakeTime]]:
    """A ``DeploymentStateManager`` on fakes, with Serve's module-level seams patched for
    the duration (as Serve's unit-test fixture does)."""
    timer = FakeTime()
    FakeReplicaWrapper.timer, FakeReplicaWrapper.start_delay_s = timer, start_delay_s
    with patch("ray.serve._private.deployment_state.ActorReplicaWrapper",
               new=FakeReplicaWrapper), \
            patch("time.time", new=timer.time), patch("ray.get_runtime_context"):
        manager = DeploymentStateManager(
            _KVStore(), _LongPollRecorder(), [], [], _NodeCache(), AutoscalingStateManager(),
            head_node_id_override="fake-head-node")
        yield manager, timer


def _info(n: int, code_version: str) -> DeploymentInfo:
    return DeploymentInfo(
        deployment_config=DeploymentConfig(num_replicas=n),
        replica_config=ReplicaConfig.create(lambda x: x), start_time_ms=0,
        deployer_job_id="", version=code_version)


@dataclass
class ServeBench:
    manager: DeploymentStateManager
    timer: FakeTime
    samples: list  # (phase, i, update ms, update CPU ms)

    def _replicas(self) -> Any:
        return self.manager._deployment_states[DEPLOYMENT]._replicas

    def _count(self, state: ReplicaState) -> int:
        replicas = self._replicas()
        if hasattr(replicas, "count_state"):  # O(1) in 2.60
            return replicas.count_state(state)
        return replicas.count(states=[state])

    def update(self, phase: str, i: int) -> tuple[float, float]:
        """One ``update()``, timed; then the fake clock moves one control-loop interval."""
        c0, t0 = time.process_time(), time.perf_counter()
        self.manager.update()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        self.samples.append((phase, i, wall * 1e3, cpu * 1e3))
        self.timer.now += TICK_S
        return wall, cpu

    def converge(self, phase: str, done: Any, limits: Limits) -> PhaseResult:
        """Update until ``done()``: the time and CPU of the ``update()`` calls."""
        wall = cpu = 0.0
        started, updates = time.monotonic(), 0
        while not limits.reached(updates, started):
            w, c = self.update(phase, updates)
            wall, cpu, updates = wall + w, cpu + c, updates + 1
            if done():
                return PhaseResult(wall, cpu, updates, True)
        return PhaseResult(wall, cpu, updates, False)

    def settled(self, n: int, version: str | None = None) -> bool:
        """n RUNNING and nothing else (of ``version``: a walk, only once the counts match)."""
        replicas = self._replicas()
        return (self._count(ReplicaState.RUNNING) == n and replicas.count() == n and
                (version is None or all(r.version.code_version == version
                                        for r in replicas.get([ReplicaState.RUNNING]))))


def run_serve(n: int, steady_updates: int, start_delay_s: float, limits: Limits,
              log: Any) -> tuple[dict, list]:
    """Scale-up 0 -> n, steady updates, rolling replacement of all n, scale-down to n/32."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    with serve_environment(start_delay_s) as (manager, timer):
        bench, up = _scale_up(manager, timer, n, limits)
        collect = collected(up, n)
        log(f"[serve {n}] scale-up {up.text(n)}; {collect['cpu_us_per_start']:.0f} us per "
            f"start with a full collection after it ({collect['scaleup_collect_ms']:.0f} ms)")
        steady = [bench.update("steady", i) for i in range(steady_updates)]
        manager.deploy(DEPLOYMENT, _info(n, "v2"))
        replace = bench.converge("replace", lambda: bench.settled(n, "v2"), limits)
        log(f"[serve {n}] replacement {replace.text(n)}")
        small = max(1, n // 32)
        manager.deploy(DEPLOYMENT, _info(small, "v2"))
        down = bench.converge("scaledown", lambda: bench.settled(small), limits)
        log(f"[serve {n}] scale-down {down.text(n - small)}")
    wall_ms, cpu_ms = [w * 1e3 for w, _ in steady], [c * 1e3 for _, c in steady]
    result = {"tick_p50_ms": percentile(wall_ms, 50), "tick_p99_ms": percentile(wall_ms, 99),
              "tick_cpu_p50_ms": percentile(cpu_ms, 50), "tick_cpu_p99_ms": percentile(cpu_ms, 99),
              # all of Serve's controller work in one 0.1 s period is its update(), its
              # health checks of the replicas whose period came round included
              "period_cpu_ms": percentile(cpu_ms, 50),
              "period_cpu_p99_ms": percentile(cpu_ms, 99),
              "rollout_period_cpu_ms": replace.cpu_s / max(1, replace.ticks) * 1e3
              if replace.converged else None,
              **up.as_dict("scaleup", n), **collect, **replace.as_dict("replace", n),
              "rollout_tick_ms": percentile(
                  [ms for p, _, ms, _ in bench.samples if p == "replace"], 50),
              "rollout_tick_cpu_ms": percentile(
                  [cpu for p, _, _, cpu in bench.samples if p == "replace"], 50),
              **down.as_dict("scaledown", n - small)}
    return result, bench.samples


def _scale_up(manager: Any, timer: Any, n: int, limits: Limits) -> tuple[ServeBench,
                                                                          PhaseResult]:
    bench = ServeBench(manager, timer, [])
    manager.deploy(DEPLOYMENT, _info(n, "v1"))
    return bench, bench.converge("scaleup", lambda: bench._count(ReplicaState.RUNNING) == n,
                                 limits)


def run_serve_scaleup(n: int, start_delay_s: float, limits: Limits) -> dict:
    """0 -> n alone, in a fresh process (``release_tests.scale --scaleup-runs``)."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    with serve_environment(start_delay_s) as (manager, timer):
        _, up = _scale_up(manager, timer, n, limits)
        collect = collected(up, n)
    return {**up.as_dict("scaleup", n), **collect}


def collected(up: PhaseResult, n: int) -> dict:
    """The scale-up's CPU per start with a full collection after it counted, as for
    fleetplane (whose shard defers its collection while it starts replicas)."""
    c0 = time.process_time()
    gc.collect()
    spent = time.process_time() - c0
    return {"cpu_us_per_start": (up.cpu_s + spent) / n * 1e6 if up.converged else None,
            "scaleup_collect_ms": spent * 1e3}
