"""``release_tests.chaos --kinds ...,head``: chaos on a cluster whose head node is one of
the things killed.

With ``head`` among the kinds, chaos runs fleetplane on ``fleetplane start-local-cluster
--nodes 3 --redis`` (head 127.0.0.2, workers .3 and .4, the head's GCS on a real Redis)
instead of an embedded Ray, with a listener on every node, and sends its load to a worker
node's listener: the head's own listener dies with the head, which no client of a worker
node sees (``release_tests.head_loss`` counts both). A ``head`` kill is
``start-local-cluster --restart-head``: SIGKILL to the head's Ray processes, ``DOWN_S``
seconds down, started again on the same Redis. The harness then joins the cluster again
(its connection went through a raylet on this machine, which may have been the head's).
Its recovery time counts from the kill, the time down included.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml

from release_tests import local_cluster

URL = "http://127.0.0.3:8011/chaos"  # a worker node's listener
DOWN_S = 10.0
RUN_ARGS = ("--address", local_cluster.ADDRESS, "--serve-api-port", "0")


def cluster_config(config: Path) -> Path:
    """``config`` with a listener on every node's own address."""
    data = yaml.safe_load(config.read_text())
    data["http_options"]["host"] = "node_ip"
    path = Path(tempfile.mkdtemp(prefix="chaos_head_")) / config.name
    path.write_text(json.dumps(data))
    return path


def kill_head() -> None:
    """The head down ``DOWN_S`` and back on the same Redis; then this process joins the
    cluster again."""
    import ray

    done = local_cluster.restart_head(DOWN_S)
    if done.returncode != 0:
        raise RuntimeError(f"the head did not come back:\n{done.stdout}{done.stderr}")
    ray.shutdown()
    ray.init(address=local_cluster.ADDRESS, namespace="fleetplane", log_to_driver=False)
