"""Error types that decide behaviour across the control plane (ARCHITECTURE.md, principle 9).

Each passes all its fields to ``super().__init__`` so it pickles across actors.
"""

from __future__ import annotations

import traceback as _traceback
import uuid
from enum import Enum


def first_line(error: BaseException) -> str:
    """An error in one line for logs and messages (Ray's carry whole tracebacks)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def exception_line(error: BaseException) -> str:
    """``Type: message``, as a traceback's last line says it (the message's first line;
    a SyntaxError's names its file and line)."""
    text = str(error).strip()
    name = type(error).__name__
    return f"{name}: {text.splitlines()[0]}" if text else name


class DeployRejected(Exception):
    """The config is valid but cannot be applied to this instance (terminal)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class IllegalTransition(Exception):
    """An event that a state machine's current state does not accept: a bug in the caller,
    raised instead of ignored and never retried (h11's rule for transition tables).
    ``machine`` names the table (``replica``, ``stall-guard``); ``state`` and ``event`` are
    members of its enums."""

    def __init__(self, machine: str, state: Enum, event: Enum) -> None:
        super().__init__(machine, state, event)
        self.machine = machine
        self.state = state
        self.event = event

    def __str__(self) -> str:
        return f"illegal {self.machine} transition: {self.state.value} on {self.event.value}"


class ConfigError(Exception):
    """A deploy config that cannot be used. Terminal: fix the file, do not retry."""

    def __init__(self, source: str, errors: list[str]) -> None:
        # All fields go to super() so the error pickles across Ray actors.
        super().__init__(source, errors)
        self.source = source
        self.errors = list(errors)

    def __str__(self) -> str:
        lines = [f"invalid deploy config {self.source}: {len(self.errors)} error(s)"]
        lines += [f"  - {error}" for error in self.errors]
        return "\n".join(lines)


class BuildError(Exception):
    """The application's code could not be imported or built (terminal: fix the code).

    ``message`` is one line per problem, naming the field (``import_path``, ``args``,
    ``user_config``, ``runtime_env``...); ``detail`` is the traceback behind it, if any
    (the CLI shows it with ``--verbose``), and never part of ``str()``.
    """

    def __init__(self, app: str, message: str, detail: str = "") -> None:
        super().__init__(app, message, detail)
        self.app = app
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return f"application '{self.app}': {self.message}"

    def by_application(self) -> list[BuildError]:
        """One error per application that failed (here: this one)."""
        return [self]


class BuildErrors(BuildError):
    """Several applications failed to build: one ``BuildError`` each, in config order."""

    def __init__(self, errors: list[BuildError]) -> None:
        Exception.__init__(self, errors)  # args == (errors,): pickles as itself
        self.errors = list(errors)
        self.app = ", ".join(e.app for e in errors)
        self.message = "\n".join(str(e) for e in errors)
        self.detail = "\n".join(f"[{e.app}]\n{e.detail}" for e in errors if e.detail)

    def __str__(self) -> str:
        return self.message

    def by_application(self) -> list[BuildError]:
        return list(self.errors)


class NoInstance(Exception):
    """No running Ray cluster or fleetplane controller could be found."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class ControllerGone(NoInstance):
    """Ray runs, but no actor holds the controller's name: the instance was shut down
    (a controller Ray is restarting keeps its name)."""


class BackpressureError(Exception):
    """Overloaded: the router's queue is full. Answer ``status_code`` with ``headers()``.

    ``retry_after_s`` is RFC 9110 delay-seconds (integer, already rounded up), or None
    when no value is known (then send no Retry-After header).
    """

    def __init__(self, status_code: int, retry_after_s: int | None, message: str) -> None:
        super().__init__(status_code, retry_after_s, message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.message = message

    def __str__(self) -> str:
        return self.message

    def headers(self) -> dict[str, str]:
        """Response headers for an HTTP rejection (RFC 9110 section 10.2.3)."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class ReplicaUnavailableError(Exception):
    """The replica's actor was gone (died, or unreachable) while it held the request.

    Not retried for a method that may have effects: the request may have partly run, and a
    second run of a non-idempotent request is worse than a clear error. A proxy asks a
    GET, HEAD or OPTIONS again of another replica, once (``RouterSet.serve_http``), as
    HAProxy does in haproxy mode. 502 because the gateway got no
    valid response from the server it forwarded to (RFC 9110 section 15.6.3); 503 stays
    reserved for backpressure, which is safe to retry.
    """

    status_code = 502

    def __init__(self, replica_id: str, reason: str, deployment: str = "") -> None:
        super().__init__(replica_id, reason, deployment)
        self.replica_id = replica_id
        self.reason = reason
        self.deployment = deployment

    def __str__(self) -> str:
        where = f" of deployment {self.deployment}" if self.deployment else ""
        return (f"replica {self.replica_id}{where} became unavailable while handling the "
                f"request ({self.reason}); the request was not retried because it may have "
                f"partly run")


class RouterClosedError(Exception):
    """The router was closed (deployment deleted, or the process is shutting down)."""

    status_code = 503

    def __init__(self, deployment: str, reason: str) -> None:
        super().__init__(deployment, reason)
        self.deployment = deployment
        self.reason = reason

    def __str__(self) -> str:
        return f"deployment {self.deployment} no longer takes requests: {self.reason}"


class ControllerUnavailable(NoInstance):
    """The controller did not answer: Ray is restarting it (transient: try again)."""


class DeploymentRaised(Exception):
    """The user's code raised while answering an HTTP request, before the response head
    went out. The front door answers a bare 500 naming ``request_id``; the replica where it
    was raised logs ``traceback`` under that id and reports the error to its shard
    (status shows the last one): an exception's text can carry secrets, so it reaches the
    client only where ``http_options.show_error_messages`` says so (Ray Serve answers a
    bare "Internal Server Error"). ``text`` is ``Type: message``."""

    status_code = 500

    def __init__(self, text: str, traceback: str, request_id: str = "") -> None:
        request_id = request_id or uuid.uuid4().hex
        super().__init__(text, traceback, request_id)
        self.text = text
        self.traceback = traceback
        self.request_id = request_id

    def __str__(self) -> str:
        return f"the deployment raised {self.text}"

    @classmethod
    def from_exception(cls, error: BaseException) -> DeploymentRaised:
        """The user's exception, caught where it was raised (in the replica)."""
        return cls(f"{type(error).__name__}: {error}",
                   "".join(_traceback.format_exception(error)))
