"""Ends a node's HAProxy when the node is gone.

HAProxy runs in its own session on purpose: it keeps serving while Ray restarts the
node's ingress actor, which then adopts it. What must not outlive the node is the
HAProxy itself (a node that dies and one that joins on the same address would find the
port held). ``python -m controlplane.ingress.haproxy.guard RAYLET_PID MASTER_PID`` is started
beside each HAProxy master: it polls both once a second, sends the master SIGTERM (hard
stop) when the raylet is gone, and exits when the master does. One small process per
node, no Ray import.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

_POLL_S = 1.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is gone too
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def watch(raylet: int, master: int, poll_s: float = _POLL_S) -> bool:
    """Until one of them ends; True when the raylet went first and the master was told."""
    while alive(master):
        if not alive(raylet):
            os.kill(master, signal.SIGTERM)
            return True
        time.sleep(poll_s)
    return False


def raylet_pid() -> int | None:
    """The raylet among this process's ancestors (Ray's workers are its descendants)."""
    import psutil

    for parent in psutil.Process().parents():
        if parent.name() == "raylet":
            return parent.pid
    return None


def start_guard(master: int) -> None:
    raylet = raylet_pid()
    if raylet is None:  # not under a raylet (a test): nothing to guard against
        return
    subprocess.Popen([sys.executable, "-m", "controlplane.ingress.haproxy.guard", str(raylet),
                      str(master)], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
