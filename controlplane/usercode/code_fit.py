"""Does the user's code fit what the config hands it? Checked at build time, before anything
is committed, so what would fail in every replica is one line naming the application, the
deployment and the field instead (``BuildError``):

- constructor arguments the class does not take, or required ones not given
  (``inspect.signature(cls).bind``), named by where they come from (``ARGS_FROM``);
- a ``user_config`` with no ``reconfigure(self, config)`` to receive it.

A class whose signature cannot be read (a C type) is left to the replica.
"""

from __future__ import annotations

import inspect
from typing import Any

from controlplane.errors import BuildError

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
