"""Where each node's HAProxy keeps its files, and the pruning of those nobody runs.

A node's HAProxy manager keeps its configuration, sockets, pid file and log under
``$TMPDIR/fleetplane-$UID/<namespace>/haproxy-<node id>`` (a restarted manager finds and
adopts its running HAProxy there). Every Ray session has new node ids, so without pruning
these directories pile up (90 under one namespace on a test machine). A manager starting
removes those whose HAProxy no longer runs and that nothing wrote for ``KEEP_S`` (their log
stays a day for a look after a failure); a live HAProxy's directory, or one in use by
another node on the same machine, is never touched.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from controlplane.ingress.haproxy.config import Paths
from controlplane.ingress.haproxy.process import HAProxyProcess

logger = logging.getLogger(__name__)
KEEP_S = 24 * 3600.0  # a stopped HAProxy's directory (its log) is kept this long
PREFIX = "haproxy-"


def base_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"fleetplane-{os.getuid()}"


def runtime_dir(namespace: str, node_id: str, base: Path | None = None) -> Path:
    return (base or base_dir()) / namespace / f"{PREFIX}{node_id[:12]}"


def _running(directory: Path) -> bool:
    """Its HAProxy's master still runs, by its pid file (none: not running; a directory
    whose HAProxy is starting is spared by its age, in ``prune``)."""
    pid = HAProxyProcess(Paths(directory), executable="-").pid
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone's process: not ours to judge
    return True


def _last_written(directory: Path) -> float:
    times = [directory.stat().st_mtime]
    for entry in directory.iterdir():
        try:
            times.append(entry.stat().st_mtime)
        except OSError:
            continue
    return max(times)


def prune(keep: Path, base: Path | None = None, keep_s: float = KEEP_S,
          now: Callable[[], float] = time.time) -> list[Path]:
    """Remove the HAProxy directories under ``base`` (every namespace) other than ``keep``
    whose HAProxy does not run and that nothing wrote for ``keep_s``, and the namespace
    directories left empty; returns those removed. Never raises: pruning is housekeeping."""
    base = base or base_dir()
    removed: list[Path] = []
    try:
        namespaces = [d for d in base.iterdir() if d.is_dir()]
    except OSError:
        return removed
    for namespace in namespaces:
        for directory in namespace.glob(f"{PREFIX}*"):
            try:
                if directory == keep or not directory.is_dir() or _running(directory) \
                        or now() - _last_written(directory) < keep_s:
                    continue
                shutil.rmtree(directory)
                removed.append(directory)
            except OSError as e:  # another node's manager pruning too, or in use
                logger.debug("not pruned %s: %r", directory, e)
        try:
            namespace.rmdir()  # only if empty
        except OSError:
            pass
    if removed:
        logger.info("removed %d stopped HAProxies' directories (unused for %g h)",
                    len(removed), keep_s / 3600)
    return removed
