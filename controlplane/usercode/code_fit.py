"""Does the user's code fit what the config hands it? Checked at build time, before anything
is committed, so what would fail in every replica is one line naming the application, the
deployment and the field instead (``BuildError``):

- constructor arguments the class does not take, or required ones not given
  (``inspect.signature(cls).bind``), named by where they come from (``ARGS_FROM``);
- a ``user_config`` with no ``reconfigure(self, config)`` to receive it;
- a start deadline (``replica_start_timeout_s``) shorter than the engine start the class
  is told to wait for (``startup_timeout_s``, ``VLLMServer``'s), which would cut every cold
  start of a large model short (``start_deadline``).

A class whose signature cannot be read (a C type) is left to the replica.
"""

from __future__ import annotations

import inspect
from typing import Any

from controlplane.errors import BuildError

ENGINE_START_ARG = "startup_timeout_s"  # VLLMServer's: how long its engine may take to load
# After the engine answers, the replica still runs its first health check and its own
# setup: seconds a derived deadline leaves for them.
AFTER_ENGINE_S = 60.0

# Where constructor arguments come from: what the error calls them, and the fix it offers.
ARGS_FROM = {
    "args": ("args", "fix args in the config"),
    "bind": ("the arguments bound in code (.bind(...))", "fix the .bind(...) call"),
    "builder": ("no arguments (a class an application builder returns gets none)",
                "have the builder return serve.deployment(Cls).bind(...) instead"),
    "unbound": ("no arguments (import_path names a Serve deployment that is not bound)",
                "point import_path at serve.deployment(Cls).bind(...)"),
}


def check_user_config(app: str, deployment: str, target: Any, user_config: Any) -> None:
    """A ``user_config`` needs a ``reconfigure(self, config)`` to go to."""
    if user_config is None or callable(getattr(target, "reconfigure", None)):
        return
    kind = "class" if isinstance(target, type) else "function deployment"
    raise BuildError(app, f"deployment '{deployment}' sets user_config but its {kind} "
                     f"has no reconfigure(self, config) method to receive it; add one or "
                     f"remove user_config")


def check_constructor(app: str, deployment: str, target: Any, args: tuple, kwargs: dict,
                      args_from: str) -> None:
    """The class's constructor takes ``args``/``kwargs`` (``args_from``: an ``ARGS_FROM``
    key); a function deployment takes none, so it is not checked."""
    if not inspect.isclass(target):
        return
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to read: the replica will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        what, fix = ARGS_FROM[args_from]
        raise BuildError(app, f"{what} do not fit {target.__qualname__}{_bare(signature)}, "
                         f"the constructor of deployment '{deployment}': {e}; {fix}") from None


def _bare(signature: inspect.Signature) -> inspect.Signature:
    """Names and defaults only: annotations make the line long and add nothing here."""
    empty = inspect.Parameter.empty
    return signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=inspect.Signature.empty)


def check_llm_scaling(app: str, deployment: str, target: Any, scaling: Any) -> None:
    """``autoscaling_config.llm`` scales on what the replicas report of their engine
    (``record_autoscaling_stats()``, as ``VLLMServer`` has): a class without it would
    never report, and never scale."""
    if not scaling or not scaling.get("llm"):
        return
    if not callable(getattr(target, "record_autoscaling_stats", None)):
        raise BuildError(app, f"deployment '{deployment}' sets autoscaling_config.llm, but "
                         "its code has no record_autoscaling_stats() reporting its engine "
                         "(running, waiting, slots), so it would never scale; use "
                         "replicas.vllm_replica:VLLMServer, add the method, or remove llm")


def start_deadline(app: str, found: Any, configured: float | None) -> float | None:
    """A deployment's start deadline: ``configured`` (``replica_start_timeout_s``), which
    must not be shorter than its engine's ``startup_timeout_s``; unset, that engine start
    plus ``AFTER_ENGINE_S`` for a class that takes one, else None (the shard's default)."""
    engine_s = _engine_start_s(found.target, found.kwargs)
    if configured is None:
        return None if engine_s is None else engine_s + AFTER_ENGINE_S
    if engine_s is not None and configured < engine_s:
        raise BuildError(app, f"deployment '{found.name}': replica_start_timeout_s "
                         f"({configured:g}) is shorter than its engine's {ENGINE_START_ARG} "
                         f"({engine_s:g}): every start would be cut at {configured:g}s; raise "
                         f"replica_start_timeout_s to {engine_s + AFTER_ENGINE_S:g} or more, or "
                         f"lower {ENGINE_START_ARG}")
    return configured


def _engine_start_s(target: Any, kwargs: dict) -> float | None:
    if not isinstance(target, type):
        return None
    value = kwargs.get(ENGINE_START_ARG)
    if value is None:
        try:
            param = inspect.signature(target).parameters.get(ENGINE_START_ARG)
        except (TypeError, ValueError):  # a C type: no signature to read
            return None
        value = None if param is None or param.default is param.empty else param.default
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None
