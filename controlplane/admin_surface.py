"""What an embedded fleetplane instance exposes, said once by ``fleetplane run``.

Ray binds its own servers (GCS, raylet, object manager, workers) on every interface of
the machine whatever address it advertises; what guards them is Ray's token
authentication, which Ray 2.60 turns on for a new local cluster (``ray.init``) and for
``ray start --head`` unless ``RAY_AUTH_MODE`` says otherwise. Anyone who holds the token
(``~/.ray/auth_token`` by default, or ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH``) can
run code on the cluster. fleetplane's own HTTP listener binds ``http_options.host``,
127.0.0.1 by default. The README's "What to protect" section has the whole list.
"""

from __future__ import annotations

import os
from pathlib import Path


def token_location(env: dict[str, str]) -> str:
    """Where Ray reads the token from, in Ray's order."""
    if env.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN variable"
    return env.get("RAY_AUTH_TOKEN_PATH") or str(Path("~/.ray/auth_token"))


def read_token(env: dict[str, str] | None = None) -> str:
    """The token itself, from where Ray reads it (``token_location``'s order); "" when
    there is none. For HTTP clients of Ray's guard that do not import Ray (the probes)."""
    env = dict(os.environ) if env is None else env
    if env.get("RAY_AUTH_TOKEN"):
        return env["RAY_AUTH_TOKEN"]
    path = Path(env.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()
    return path.read_text().strip() if path.is_file() else ""


def auth_line(token_auth_on: bool, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """(one line for the operator, whether the cluster is guarded)."""
    env = dict(os.environ) if env is None else env
    if token_auth_on:
        return (f"Ray token authentication on (token: {token_location(env)}; whoever holds "
                "it can run code on this cluster)", True)
    return ("WARNING: Ray token authentication is off "
            f"(RAY_AUTH_MODE={env.get('RAY_AUTH_MODE', 'unset')}): Ray's ports listen on "
            "every interface of this machine and run code for anyone who reaches them; "
            "unset RAY_AUTH_MODE (Ray's default is token) or firewall them", False)


def cluster_token_auth_on() -> bool:
    """This process's Ray (after ``ray.init``) requires a token."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError:  # another Ray: judge by the variable Ray reads
        return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    return get_authentication_mode() == AuthenticationMode.TOKEN
