"""A listener's socket and its uvicorn server, for every HTTP listener of ours: a proxy, a
direct-ingress replica, the haproxy mode's ``/metrics`` behind HAProxy.

The proxies of a node share one port (SO_REUSEPORT: the kernel spreads new connections
over the live ones); the node's first one checks the port is free, so another instance's
proxies are never joined silently (``listen_socket``). ``Served`` is uvicorn serving in the
running loop, from when it accepts until ``stop``.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (its user binds it a moment later; a lost race fails loudly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listen_socket(host: str, port: int, *, exclusive: bool) -> socket.socket:
    """A socket bound to host:port that the node's other listeners can share
    (SO_REUSEPORT). ``exclusive``: first check that nobody holds the port, not even
    another instance's proxies (which would share it silently)."""
    if exclusive:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _bind(probe, host, port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        _bind(sock, host, port)
    except BaseException:
        sock.close()
        raise
    return sock


def _bind(sock: socket.socket, host: str, port: int) -> None:
    try:
        sock.bind((host, port))
    except OSError as e:
        raise RuntimeError(f"cannot listen on {host}:{port}: {e.strerror}; free the port or "
                           f"set http_options.port") from None


class Served:
    """uvicorn serving on a bound socket, in the running loop."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task) -> None:
        self._server, self._task = server, task

    @classmethod
    async def start(cls, config: uvicorn.Config, sock: socket.socket, what: str) -> Served:
        """Serving once this returns; a server that cannot start raises, naming ``what``."""
        server = uvicorn.Server(config)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:  # uvicorn has no started event to await
            if task.done():
                raise RuntimeError(f"{what} stopped: {task.exception()!r}")
            await asyncio.sleep(0.01)
        return cls(server, task)

    def stop(self) -> None:
        """Stop accepting; requests in flight finish (uvicorn's graceful shutdown)."""
        self._server.should_exit = True


async def serve_unix(app: Any, path: Path, what: str) -> Served:
    """uvicorn serving ``app`` on a unix socket at ``path`` (a stale one from a previous
    actor replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return await Served.start(uvicorn.Config(app, log_level="warning", lifespan="off",
                                             access_log=False), sock, what)
