"""The engine subprocess of an LLM replica: its command line, start, readiness, stop.

Owns one engine process (``vllm serve`` in production, the simulator in tests) bound to
loopback on a free port, started under ``llm_engine_guard.py`` so that it dies with its
owner even when Ray kills the owner with SIGKILL. Keeps the last lines of the engine's
output for error messages and forwards every line to this module's logger (which, inside a
Ray actor, lands in the replica's worker log).

The command is a list of strings; ``{model}``, ``{host}``, ``{port}``,
``{tensor_parallel_size}``, ``{max_num_seqs}`` and ``{python}`` (this interpreter) are
filled in, any other brace (a JSON argument, say) is left alone.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from typing import Callable, Mapping, Sequence

from controlplane.clock import Clock
from controlplane.routing.listen import free_port  # noqa: F401 (the engine's port)
from replicas.llm_http import Fetcher

logger = logging.getLogger(__name__)

DEFAULT_COMMAND = ("vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}",
                   "--tensor-parallel-size", "{tensor_parallel_size}",
                   "--max-num-seqs", "{max_num_seqs}")
PLACEHOLDERS = ("model", "host", "port", "tensor_parallel_size", "max_num_seqs", "python")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llm_engine_guard.py")
TAIL_LINES = 40
PROGRESS_EVERY_S = 10.0  # a loading engine's latest line, told at most this often


class EngineStartError(Exception):
    """The engine exited or never answered /v1/models (terminal for this replica start)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def render_command(template: Sequence[str], values: Mapping[str, object],
                   extra_args: Sequence[str] = ()) -> list[str]:
    """Fill the placeholders of ``template``; ``extra_args`` are appended as given."""
    if isinstance(template, str) or not template:
        raise ValueError("command must be a non-empty list of strings, e.g. "
                         f"{list(DEFAULT_COMMAND)}")
    filled = [_PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), str(part))
              for part in template]
    return filled + [str(a) for a in extra_args]


class EngineProcess:
    def __init__(self, argv: Sequence[str], host: str, port: int,
                 env: Mapping[str, str] | None = None, stop_grace_s: float = 10.0) -> None:
        self.argv = list(argv)
        self.url = f"http://{host}:{port}"
        self._env = {**os.environ, **(env or {})}
        self._stop_grace_s = stop_grace_s
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        """The guard's pid (the engine runs under it, in a session of its own)."""
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        guard = [sys.executable, _GUARD, "--grace-s", str(self._stop_grace_s), "--", *self.argv]
        self._proc = subprocess.Popen(guard, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=self._env,
                                      start_new_session=True)
        threading.Thread(target=self._drain_output, name=f"engine-output-{self._proc.pid}",
                         daemon=True).start()

    def _drain_output(self) -> None:
        """Keep reading, so a chatty engine never blocks on a full pipe."""
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            self._tail.append(line)
            logger.info("engine: %s", line)

    def exit_code(self) -> int | None:
        """None while the engine runs."""
        return None if self._proc is None else self._proc.poll()

    def tail(self) -> str:
        return "\n".join(self._tail)

    def wait_ready(self, fetcher: Fetcher, clock: Clock, timeout_s: float,
                   sleep: Callable[[float], None], poll_s: float = 0.25,
                   progress: Callable[[str], None] | None = None) -> None:
        """Until /v1/models answers; raises EngineStartError if it exits or time runs out.
        ``progress`` hears the engine's latest output line when it changed, at most once
        per ``PROGRESS_EVERY_S`` (what a loading engine is doing, for status)."""
        deadline = clock.monotonic() + timeout_s
        told, told_at = "", -PROGRESS_EVERY_S
        while True:
            line = self._tail[-1] if self._tail else ""
            if progress is not None and line != told and \
                    clock.monotonic() - told_at >= PROGRESS_EVERY_S:
                told, told_at = line, clock.monotonic()
                progress(line)
            code = self.exit_code()
            if code is not None:
                raise EngineStartError(self._failure(f"the engine exited with status {code}"))
            if fetcher.get(self.url + "/v1/models", timeout_s=5.0).ok:
                return
            if clock.monotonic() >= deadline:
                self.stop()
                raise EngineStartError(self._failure(
                    f"/v1/models did not answer within {timeout_s:g}s"))
            sleep(poll_s)

    def _failure(self, what: str) -> str:
        return (f"{what}; command: {' '.join(self.argv)}\n"
                f"last engine output:\n{self.tail() or '(none)'}")

    def stop(self) -> None:
        """SIGTERM to the guard, which stops the engine's group; idempotent."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=self._stop_grace_s + 5.0)
        except subprocess.TimeoutExpired:  # the guard itself hangs: take everything down
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        if proc.stdin:
            proc.stdin.close()
