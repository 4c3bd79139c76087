"""What a driver's Serve handle long-polls for: each deployment's running replicas and
config (``DEPLOYMENT_TARGETS``, ``DEPLOYMENT_CONFIG``), answered with Serve's own
``LongPollHost`` so the protocol is Serve's to the byte. The one "replica" listed is the
deployment's bridge (``bridge``), made on the first poll for it and ended when the
deployment leaves the instance.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
from ray.serve._private.common import (
    DeploymentID,
    DeploymentTargetInfo,
    ReplicaID,
    RunningReplicaInfo,
)
from ray.serve._private.config import DeploymentConfig
from ray.serve._private.long_poll import LongPollHost, LongPollNamespace

from controlplane.serve_facade.bridge import (
    BRIDGE_MAX_ONGOING,
    BRIDGE_PREFIX,
    HandleBridge,
    bridge_name,
)

SERVE_NAMESPACE = "serve"
logger = logging.getLogger(__name__)
_KINDS = (LongPollNamespace.DEPLOYMENT_TARGETS, LongPollNamespace.DEPLOYMENT_CONFIG)


def by_value(actor_class: type) -> type:
    """``actor_class``, shipped by value: a driver that gets its handle loads the class
    without importing fleetplane (``serve_controller``'s docstring)."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[actor_class.__module__])
    return actor_class


class HandleTargets:
    def __init__(self, settings: dict) -> None:
        self._settings = settings
        self._host = LongPollHost()
        self._published: dict[DeploymentID, bool] = {}  # what handles were told: exists?

    async def listen(self, keys: dict, deployments: set[tuple[str, str]]) -> Any:
        """Serve's ``listen_for_change``: the keys asked for are published first (a
        deployment of the instance gets its bridge; an unknown one is unavailable), and
        what handles were told follows deploys made by other means (``fleetplane deploy``)."""
        self.follow(deployments)
        for key in keys:
            if isinstance(key, tuple) and key[0] in _KINDS and key[1] not in self._published:
                self._publish(key[1], (key[1].app_name, key[1].name) in deployments)
        return await self._host.listen_for_change(keys)

    def follow(self, deployments: set[tuple[str, str]]) -> None:
        """After a config change, what handles were told follows: a deployment that left
        is unavailable and its bridge ends; one a handle waited for is there now."""
        for dep_id, told in list(self._published.items()):
            exists = (dep_id.app_name, dep_id.name) in deployments
            if exists != told:
                self._publish(dep_id, exists)
                if not exists:
                    _end_bridge(dep_id)

    def _publish(self, dep_id: DeploymentID, exists: bool) -> None:
        replicas = [self._bridge_info(dep_id)] if exists else []
        self._host.notify_changed({
            (LongPollNamespace.DEPLOYMENT_TARGETS, dep_id): DeploymentTargetInfo(
                is_available=exists, running_replicas=replicas),
            (LongPollNamespace.DEPLOYMENT_CONFIG, dep_id): DeploymentConfig(
                max_ongoing_requests=BRIDGE_MAX_ONGOING),
        })
        self._published[dep_id] = exists

    def _bridge_info(self, dep_id: DeploymentID) -> RunningReplicaInfo:
        name = bridge_name(dep_id.app_name, dep_id.name)
        ray.remote(by_value(HandleBridge)).options(
            name=name, namespace=SERVE_NAMESPACE, lifetime="detached", get_if_exists=True,
            num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=10_000,
        ).remote(self._settings, dep_id.app_name, dep_id.name)
        return RunningReplicaInfo(
            replica_id=ReplicaID(unique_id="fleetplane-bridge", deployment_id=dep_id),
            node_id=None, node_ip=None, availability_zone=None, actor_name=name,
            max_ongoing_requests=BRIDGE_MAX_ONGOING)


def _end_bridge(dep_id: DeploymentID) -> None:
    try:
        ray.kill(ray.get_actor(bridge_name(dep_id.app_name, dep_id.name),
                               namespace=SERVE_NAMESPACE), no_restart=True)
    except ValueError:  # never made
        pass


def end_all_bridges() -> None:
    """Every bridge on the cluster (the instance stops)."""
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == SERVE_NAMESPACE and actor["name"].startswith(BRIDGE_PREFIX):
            try:
                ray.kill(ray.get_actor(actor["name"], namespace=SERVE_NAMESPACE),
                         no_restart=True)
            except ValueError:
                pass


async def end_all_bridges_async() -> None:
    await asyncio.to_thread(end_all_bridges)
