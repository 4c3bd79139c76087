"""Runs an engine command and makes sure it never outlives its owner.

``python llm_engine_guard.py --grace-s S -- CMD...`` (started by ``llm_engine.EngineProcess``
with its stdin on a pipe). The engine gets a session of its own, so the guard can stop the
whole process group (vLLM's API server and its engine-core and worker processes) at once.
The guard stops that group when:
- its stdin reaches end-of-file: the owner is gone. A replica actor killed with SIGKILL runs
  no ``atexit`` or ``__del__``, but the kernel closes the actor's end of the pipe all the same;
- it receives SIGTERM or SIGINT (the owner's orderly stop);
- the engine exits by itself (then only its leftover children are killed).
Stopping is SIGTERM to the group, then SIGKILL after ``--grace-s``. The guard exits with the
engine's exit status.

When the guard itself is killed it can do nothing, and Ray does kill it: a Ray worker that
exits SIGKILLs its direct children (``RAY_kill_child_processes_on_worker_exit``, on by
default), and the guard is one. So the engine also fate-shares with the guard through the
kernel: ``PR_SET_PDEATHSIG`` sends it SIGTERM when the guard dies, and vLLM's own SIGTERM
handling stops its engine-core and worker processes. Stdlib only: it runs by path.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading


def _stop_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent_pid: int) -> None:
    """In the engine, before exec: SIGTERM when the guard dies (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the guard died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _wait_eof(stop: threading.Event) -> None:
    """Reads the raw fd (not sys.stdin, whose buffer lock would wedge interpreter exit)."""
    while os.read(0, 4096):
        pass
    stop.set()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm_engine_guard")
    p.add_argument("--grace-s", type=float, default=10.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no engine command after --")
    try:
        guard_pid = os.getpid()
        engine = subprocess.Popen(command, start_new_session=True, stdin=subprocess.DEVNULL,
                                  preexec_fn=lambda: _die_with(guard_pid))
    except OSError as e:
        print(f"cannot start engine command {command[0]!r}: {e}", file=sys.stderr, flush=True)
        return 127
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=_wait_eof, args=(stop,), daemon=True).start()
    threading.Thread(target=lambda: (engine.wait(), stop.set()), daemon=True).start()
    stop.wait()
    if engine.poll() is None:
        _stop_group(engine.pid, signal.SIGTERM)
        try:
            engine.wait(timeout=args.grace_s)
        except subprocess.TimeoutExpired:
            pass
    _stop_group(engine.pid, signal.SIGKILL)  # the engine's children, whatever became of it
    engine.wait()
    return engine.returncode if engine.returncode >= 0 else 128 - engine.returncode


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # daemon threads may still block in read(): skip interpreter teardown
