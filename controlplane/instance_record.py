"""Which Ray cluster the commands attach to. No Ray import here, on purpose.

With several Ray clusters on one machine, Ray's "auto" means the one started last, which
may not be fleetplane's. ``fleetplane run`` records the address of the cluster it started
or joined, and Ray's auth mode there (Ray 2.60 turns token authentication on for a new
local cluster, and a process that joins by address must say so in ``RAY_AUTH_MODE``
before Ray is imported, which reads it once). ``deploy``, ``status`` and ``shutdown`` use
the record while that ``run`` is alive (``resolve_target``), and refuse an address nobody
answers on within seconds instead of Ray's 60 s wait.

The record lives in ``$FLEETPLANE_STATE_DIR/instance.json``, by default
``$TMPDIR/fleetplane-$UID/instance.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from controlplane.errors import NoInstance
from controlplane.gcs import down_message, unreachable

_REACH_TIMEOUT_S = 3.0


def state_dir() -> Path:
    return Path(os.environ.get("FLEETPLANE_STATE_DIR") or os.path.join(
        tempfile.gettempdir(), f"fleetplane-{os.getuid()}"))


def _record_path() -> Path:
    return state_dir() / "instance.json"


def write_record(address: str, auth_mode: str | None, gcs_storage: str = "unknown") -> None:
    """``gcs_storage``: where that cluster's GCS keeps its state (``gcs.read_storage``)."""
    path = _record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"address": address, "pid": os.getpid(),
                                "auth_mode": auth_mode, "gcs_storage": gcs_storage}))


def forget_record() -> None:
    """Called by ``run`` when it stops: the record is removed if it is still its own."""
    path = _record_path()
    try:
        if json.loads(path.read_text())["pid"] == os.getpid():
            path.unlink()
    except (OSError, ValueError, KeyError):
        pass


def recorded_instance() -> dict | None:
    """What a live ``fleetplane run`` recorded; None without one."""
    try:
        record = json.loads(_record_path().read_text())
        os.kill(record["pid"], 0)  # raises when that run is gone
        return record if isinstance(record.get("address"), str) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def resolve_target(address: str | None) -> str:
    """The cluster to join: ``address``, else the live ``run``'s (its auth mode applied to
    this process's environment), else Ray's own choice ("auto"). Call before Ray is
    imported."""
    record = None if address else recorded_instance()
    target = address or (record or {}).get("address") or "auto"
    if record and record.get("auth_mode") and "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = record["auth_mode"]
    if target != "auto":
        check_reachable(target)
    return target


def check_reachable(address: str, timeout_s: float = _REACH_TIMEOUT_S) -> None:
    """NoInstance, saying what a silent GCS means for this cluster (what the live ``run``
    recorded of it), unless ``address`` takes a connection within ``timeout_s``."""
    why = unreachable(address, timeout_s)
    if why is not None:
        record = recorded_instance() or {}
        storage = record.get("gcs_storage", "unknown") if record.get("address") == address \
            else "unknown"
        text = down_message(address, why, storage)
        raise NoInstance(text if storage == "unknown" else f"{text}; ask again once it is back")
