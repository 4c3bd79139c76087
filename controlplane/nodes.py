"""The cluster's nodes as the controller sees them: alive, draining (and until when).

``read_nodes`` asks Ray's GCS for every node and for the draining ones with their
deadlines (a spot interruption notice, a Kubernetes pod deletion, or SIGTERM to a node's
``ray start --block`` mark a node draining; Ray Serve's controller reads them the same
way). ``changes`` is the pure diff between two readings; ``NodeWatch`` polls once per
``interval_s`` and hands each non-empty diff to the controller, so a steady cluster costs
one GCS round trip per interval and nothing else.

Deadlines are wall-clock seconds (GCS gives milliseconds since the epoch; 0 means "no
deadline", kept as ``math.inf``): each shard turns them into its own monotonic clock.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    alive: bool
    resources: Mapping[str, float] = field(default_factory=dict)
    draining_until: float | None = None  # wall-clock s; inf: draining with no deadline

    @property
    def draining(self) -> bool:
        return self.draining_until is not None

    def as_json(self) -> dict:
        until = self.draining_until
        return {"node_id": self.node_id, "address": self.address, "alive": self.alive,
                "draining": self.draining,
                "drain_deadline_s": None if until is None or until == math.inf else until,
                "resources": dict(self.resources)}


@dataclass(frozen=True)
class NodeChanges:
    joined: tuple[str, ...] = ()  # alive now, not before
    left: tuple[str, ...] = ()  # alive before, dead or gone now
    drains: Mapping[str, float] | None = None  # the whole draining set, when it changed

    def __bool__(self) -> bool:
        return bool(self.joined or self.left or self.drains is not None)


def changes(before: Mapping[str, NodeInfo], after: Mapping[str, NodeInfo]) -> NodeChanges:
    alive_before = {n for n, i in before.items() if i.alive}
    alive_after = {n for n, i in after.items() if i.alive}
    drains_before = _drains(before)
    drains_after = _drains(after)
    return NodeChanges(joined=tuple(sorted(alive_after - alive_before)),
                       left=tuple(sorted(alive_before - alive_after)),
                       drains=drains_after if drains_after != drains_before else None)


def _drains(nodes: Mapping[str, NodeInfo]) -> dict[str, float]:
    return {n: i.draining_until for n, i in nodes.items()
            if i.alive and i.draining_until is not None}


def read_nodes() -> dict[str, NodeInfo]:
    """One reading of the cluster from GCS (two calls; blocking: run it in a thread)."""
    import ray

    gcs = ray._private.worker.global_worker.gcs_client
    try:
        draining = gcs.get_draining_nodes(timeout=5)
    except Exception as e:  # keep the nodes; the drains are read again next time
        logger.warning("could not read draining nodes from GCS: %r", e)
        draining = {}
    nodes = {}
    for n in ray.nodes():
        node_id = n["NodeID"]
        deadline_ms = draining.get(node_id)
        nodes[node_id] = NodeInfo(
            node_id=node_id, address=n.get("NodeManagerAddress", ""), alive=bool(n["Alive"]),
            resources={k: v for k, v in (n.get("Resources") or {}).items()
                       if not k.startswith("node:")},
            draining_until=None if deadline_ms is None else
            (deadline_ms / 1000.0 if deadline_ms else math.inf))
    return nodes


def node_rows(nodes: Mapping[str, NodeInfo], listeners: list[dict],
              applications: Mapping[str, dict]) -> list[dict]:
    """``status.nodes``: each node with its listener (address, ready) and the replicas on
    it, from one status walk (O(replicas) per status call, never per tick)."""
    by_node = {entry["node_id"]: entry for entry in listeners}
    replicas: dict[str, list[str]] = {}
    for app in applications.values():
        for dep in app["deployments"].values():
            for r in dep["replicas"]:
                replicas.setdefault(r.get("node_id") or "", []).append(r["replica_id"])
    rows = []
    for node_id, info in sorted(nodes.items(), key=lambda item: (not item[1].alive, item[0])):
        listener = by_node.get(node_id)
        proxy = None if listener is None else {
            "address": listener.get("address"), "ready": bool(listener.get("ready")),
            **({"error": listener["error"]} if "error" in listener else {})}
        rows.append({**info.as_json(), "proxy": proxy,
                     "replicas": sorted(replicas.get(node_id, []))})
    return rows


OnChange = Callable[[NodeChanges, Mapping[str, NodeInfo]], Awaitable[None]]


class NodeWatch:
    """Polls ``read`` every ``interval_s``; each diff goes to ``on_change`` (awaited, so
    diffs never overlap). A diff whose handling raised is offered again next time: the
    previous reading is kept until one is handled."""

    def __init__(self, on_change: OnChange, interval_s: float = 1.0,
                 read: Callable[[], dict[str, NodeInfo]] = read_nodes) -> None:
        self._on_change = on_change
        self._interval_s = interval_s
        self._read = read
        self.nodes: dict[str, NodeInfo] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="node watch")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def poll_once(self) -> NodeChanges:
        nodes = await asyncio.to_thread(self._read)
        diff = changes(self.nodes, nodes)
        if diff:
            await self._on_change(diff, nodes)
        self.nodes = nodes
        return diff

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # GCS hiccup or a handler's failure: retried next interval
                logger.exception("node watch: this reading was not handled; retrying")
            await asyncio.sleep(self._interval_s)
