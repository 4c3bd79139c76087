"""How many replicas of a deployment the cluster could ever place (pure).

A replica needs all of its resources on one node: ``num_cpus``, ``num_gpus``, ``memory``
and custom ``resources`` from ``ray_actor_options``. A node fits
``min(total[r] // need[r])`` of them, ignoring what else runs there, so this is an
upper bound: a deployment that asks for more than it can be given is told so at deploy
time (a warning: nodes may join later) and in status, instead of waiting in silence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

_NAMED = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


def demand(ray_actor_options: Mapping[str, Any]) -> dict[str, float]:
    """One replica's resource needs, by Ray resource name (zero needs left out)."""
    need = {_NAMED[k]: float(v) for k, v in ray_actor_options.items()
            if k in _NAMED and v}
    need.update({k: float(v) for k, v in (ray_actor_options.get("resources") or {}).items()
                 if v})
    return need


def placeable(need: Mapping[str, float], nodes: Iterable[Mapping[str, float]]) -> float:
    """The most replicas the nodes' total resources hold (``inf`` with no needs)."""
    if not need:
        return math.inf
    return sum(min(math.floor(node.get(r, 0.0) / amount + 1e-9) for r, amount in need.items())
               for node in nodes)


def shortfall(target: int, ray_actor_options: Mapping[str, Any],
              nodes: Iterable[Mapping[str, float]]) -> str:
    """"" when ``target`` replicas can be placed, else what is missing, in words."""
    nodes = list(nodes)
    need = demand(ray_actor_options)
    most = placeable(need, nodes)
    if target <= most:
        return ""
    needs = ", ".join(f"{r}: {a:g}" for r, a in sorted(need.items()))
    if most == 0:
        missing = [r for r in need if not any(n.get(r, 0.0) >= need[r] for n in nodes)]
        why = f"no node has {', '.join(missing)}" if missing else "no node has all of them"
        return (f"none of {target} replicas can be placed: each needs {{{needs}}} on one "
                f"node and {why} ({len(nodes)} alive node(s))")
    return (f"at most {most} of {target} replicas can be placed: each needs {{{needs}}} on "
            f"one node and the {len(nodes)} alive node(s) hold {most}")


def node_resources(ray_nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, float]]:
    """The total resources of each alive node, from ``ray.nodes()``."""
    return [dict(n.get("Resources") or {}) for n in ray_nodes if n.get("Alive")]
