"""The replica a driver's Serve handle sees: one small actor per deployment that a Serve
``DeploymentHandle`` (made by an unchanged ``serve.get_app_handle``) was pointed at.

Serve's handle routes to what the Serve controller lists as the deployment's running
replicas, by actor name in the ``serve`` namespace, and calls them with Serve's replica
protocol (``handle_request_with_rejection``: an accept message, then the result or the
stream). fleetplane's replicas live in fleetplane's namespace and speak fleetplane's, so
the facade lists this bridge as the deployment's one replica, and the bridge forwards
each call through fleetplane's own router (p2c or the deployment's policy, backpressure,
retries). The cost is one extra actor hop per driver call; a driver that does
``import fleetplane`` routes directly instead (README, "Switching from Ray Serve").

One bridge per deployment because Serve's request metadata names the application, not
the deployment. Bridges are made on a handle's first long-poll and ended with the
deployment or the instance (``facade``).
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any, AsyncIterator

BRIDGE_PREFIX = "FLEETPLANE_HANDLE_BRIDGE::"
# A bridge never refuses a call itself: fleetplane's router behind it applies each
# replica's max_ongoing_requests and backpressure. Serve's handle counts this many in
# flight before it waits, so the bound is only a guard against a runaway driver.
BRIDGE_MAX_ONGOING = 100_000


def bridge_name(app: str, deployment: str) -> str:
    return f"{BRIDGE_PREFIX}{app}#{deployment}"


class HandleBridge:
    def __init__(self, settings: dict, app: str, deployment: str) -> None:
        from controlplane.settings import Settings

        self._settings = Settings.from_dict(settings)
        self._key = f"{app}/{deployment}"
        self._ongoing = 0
        self._runtime: Any = None

    def _handles(self) -> Any:
        if self._runtime is None:
            from controlplane.routing.handles import HandleRuntime

            HandleRuntime.set_home(asyncio.get_running_loop(), self._settings)
            self._runtime = HandleRuntime.current()
        return self._runtime

    def get_num_ongoing_requests(self) -> int:
        return self._ongoing

    async def handle_request_with_rejection(self, pickled_metadata: bytes, *args: Any,
                                            **kwargs: Any) -> AsyncIterator[Any]:
        from ray.serve._private.common import ReplicaQueueLengthInfo

        metadata = pickle.loads(pickled_metadata)
        self._ongoing += 1
        try:
            yield pickle.dumps(ReplicaQueueLengthInfo(True, self._ongoing))
            async for item in self._forward(metadata, args, kwargs):
                yield item
        finally:
            self._ongoing -= 1

    async def handle_request(self, pickled_metadata: bytes, *args: Any, **kwargs: Any) -> Any:
        metadata = pickle.loads(pickled_metadata)
        return await self._handles().call(self._key, metadata.call_method, args, kwargs,
                                          _meta(metadata))

    async def handle_request_streaming(self, pickled_metadata: bytes, *args: Any,
                                       **kwargs: Any) -> AsyncIterator[Any]:
        async for item in self._forward(pickle.loads(pickled_metadata), args, kwargs):
            yield item

    async def _forward(self, metadata: Any, args: tuple, kwargs: dict) -> AsyncIterator[Any]:
        runtime, method, meta = self._handles(), metadata.call_method, _meta(metadata)
        if metadata.is_streaming:
            async for item in runtime.stream(self._key, method, args, kwargs, meta):
                yield item
        else:
            yield await runtime.call(self._key, method, args, kwargs, meta)

    async def check_health(self) -> None:
        return None


def _meta(metadata: Any) -> Any:
    """Serve's request metadata as fleetplane's: the multiplexed model id travels."""
    from controlplane.wire import RequestMeta

    return RequestMeta(model_id=getattr(metadata, "multiplexed_model_id", "") or "")
