"""What fleetplane knows of Ray's GCS, the head node's control service: where it keeps its
state, and what to say while it does not answer. No Ray import at module level (the CLI
uses this before Ray is imported).

Where the GCS keeps its tables decides what the head node's loss costs (README: What
survives what). Ray's head writes it, once, as a usage tag in its own key-value store
(``usage_stats`` / ``extra_usage_tag_gcs_storage``: ``redis`` when started with
``RAY_REDIS_ADDRESS``, ``rocksdb`` with ``RAY_gcs_storage=rocksdb``, else ``memory``);
``read_storage`` reads it, ``unknown`` when it is not there. ``fleetplane run`` records it
beside the cluster's address, so that ``status`` can say what a silent GCS means.
"""

from __future__ import annotations

import socket

STORAGE_KEY, STORAGE_NAMESPACE = "extra_usage_tag_gcs_storage", "usage_stats"
FAULT_TOLERANT = ("redis", "rocksdb")
RECONNECT_TIMEOUT = "RAY_gcs_rpc_server_reconnect_timeout_s (60 s by default)"


_known: dict[str, str] = {}  # this process's cluster's, once read


def read_storage() -> str:
    """``redis``, ``rocksdb``, ``memory`` or ``unknown``; needs Ray connected. One GCS
    call until a value is known, then none (``known_storage``)."""
    from ray.experimental import internal_kv

    if "storage" not in _known:
        try:
            value = internal_kv._internal_kv_get(STORAGE_KEY, namespace=STORAGE_NAMESPACE)
        except Exception:  # not connected, or the GCS not answering: nothing known
            return "unknown"
        if value:
            _known["storage"] = value.decode()
    return known_storage()


def known_storage() -> str:
    """What ``read_storage`` found in this process, without asking the GCS (a call that
    must answer while the GCS is down)."""
    return _known.get("storage", "unknown")


def unreachable(address: str, timeout_s: float) -> str | None:
    """Why the GCS at ``host:port`` takes no connection (None when it does; an address
    that is not host:port, e.g. ``ray://``, is left to Ray)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def storage_line(storage: str) -> str:
    """One line on what the head node's loss would cost, for ``run`` to print at start."""
    if storage in FAULT_TOLERANT:
        return (f"GCS fault tolerance: on (the GCS keeps its state in {storage}): the head "
                "node's loss is survived")
    if storage == "memory":
        return ("GCS fault tolerance: off (the GCS keeps its state in memory): the head "
                "node's loss ends the cluster; run its GCS on Redis where it can be lost "
                "(README: What survives what)")
    return "GCS fault tolerance: not known (Ray did not record where the GCS keeps its state)"


def down_message(address: str, why: str, storage: str) -> str:
    """What a GCS that does not answer means, by where it keeps its state; the caller
    adds what it does about it."""
    head = f"the GCS at {address} does not answer ({why}): the head node is down or restarting"
    if storage in FAULT_TOLERANT:
        return (f"{head}. Its state is kept in {storage} (GCS fault tolerance): the worker "
                "nodes keep serving with the replicas they run, and the control plane "
                "comes back with the head")
    if storage == "memory":
        return (f"{head}. Its state was in memory (no GCS fault tolerance): a head that was "
                f"lost is not coming back; after {RECONNECT_TIMEOUT} Ray ends the worker "
                "nodes and every process joined to the cluster (a `fleetplane run` too), and "
                "a new head is a new, empty cluster where `fleetplane run` starts again")
    return (f"no Ray cluster answers at {address} ({why}); is `fleetplane run` still running? "
            "If it is, the head node is down: with GCS fault tolerance it comes back and "
            "fleetplane with it. Pass --address to choose another cluster")
