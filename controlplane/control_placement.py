"""Where the control actors run: the controller, its shards and Serve's facade
(``fleetplane run --control-plane-on``; proxies and node reporters run one per node).

- ``head`` (default): on the head node (Ray gives it the resource
  ``node:__internal_head__``; each control actor asks for a thousandth of it). The head is
  the node a fleet keeps: spot interruptions, Kubernetes evictions and the autoscaler's
  scale-down take worker nodes, and a control actor moved by them is a restart and a
  recovery each time. The head's own loss stops them with it; with GCS fault tolerance
  Ray restarts them when the head is back, and they resume from their checkpoint and
  re-adopt every live replica by name. Ray Serve keeps its controller on the head too.
- ``workers``: off the head while a worker can take them (the replicas' rule,
  ``replica_client.placement``): a head restart leaves them running, so the control plane
  is back as soon as the GCS answers; the price is a move with every worker that drains.
- ``any``: Ray's choice (in practice the node of the process that started them).

``release_tests.head_loss --control-plane-on head|workers`` measures the two in the same
drill (MEASURED.md: The head node dies and comes back).
"""

from __future__ import annotations

HEAD_RESOURCE = "node:__internal_head__"
CHOICES = ("head", "workers", "any")


def control_options(where: str) -> dict:
    """The Ray placement options of a control actor; needs Ray connected for ``workers``
    (the head's id, read once from the GCS)."""
    if where == "head":
        return {"resources": {HEAD_RESOURCE: 0.001}}
    if where == "workers":
        from controlplane.replica_client import HeadNode, placement

        return placement({}, HeadNode()())
    if where == "any":
        return {}
    raise ValueError(f"control_plane_on: {where!r} is none of {', '.join(CHOICES)}")
