"""A deployment's ``request_router_config``: Serve 2.60's field, acted on.

``request_router_class`` names the routing policy (``controlplane.routing.policies``):
fleetplane's config names (``p2c``, ``round_robin``, ``prefix``, ``kv_load``,
``prefix_kv``, ``session``), or the Serve class paths a Serve config already carries:
Serve's default router is ``p2c``, Serve LLM's ``PrefixCacheAffinityRouter`` is
``prefix``. Any other class is a config error naming the field and the choices: a custom
router class runs no code here.

``request_router_kwargs``: ``balance_factor`` (the bounded load, >= 1, default 2) and
``session_header`` (the ``session`` policy's header, default ``x-session-id``) are
fleetplane's; ``PrefixCacheAffinityRouter``'s own knobs are accepted and not acted on
(named at load, as every such field is). Serve's stats periods, backoffs and timeouts are
accepted and not acted on too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from controlplane.config.bounds import Bound, number
from controlplane.config.serve_compat import not_acted_on
from controlplane.routing.policies import DEFAULT_SESSION_HEADER, POLICIES
from controlplane.routing.prefix_affinity import DEFAULT_BALANCE_FACTOR

_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True)
SERVE_DEFAULT_ROUTER = "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"
# Serve's class paths, in each spelling Serve accepts ("pkg.mod:Class" or "pkg.mod.Class").
SERVE_CLASSES = {
    SERVE_DEFAULT_ROUTER: "p2c",
    "ray.serve._private.request_router.pow_2_router:PowerOfTwoChoicesRequestRouter": "p2c",
    "ray.serve.request_router:PowerOfTwoChoicesRequestRouter": "p2c",
    "ray.serve.llm.request_router:PrefixCacheAffinityRouter": "prefix",
    "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
    "PrefixCacheAffinityRouter": "prefix",
}


def policy_name(value: str) -> str:
    """The fleetplane policy a ``request_router_class`` names; ValueError otherwise."""
    if value in POLICIES:
        return value
    module, sep, name = value.partition(":")
    if not sep:
        module, _, name = value.rpartition(".")
    policy = SERVE_CLASSES.get(f"{module}:{name}")
    if policy is None:
        raise ValueError(value)
    return policy


class RouterKwargs(BaseModel):
    model_config = _MODEL_CONFIG

    balance_factor: float = Field(
        DEFAULT_BALANCE_FACTOR, ge=1, le=10, allow_inf_nan=False,
        description="Bounded load: a replica takes an affine request while its load is "
        "under this x (mean + 1); past it the request spills to the next replica on the "
        "ring, then goes by load.")
    session_header: str = Field(DEFAULT_SESSION_HEADER, min_length=1, max_length=128,
                                pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$",
                                description="The header whose value keeps a session on "
                                "one replica (policy session).")
    imbalanced_threshold: float | None = not_acted_on(
        "PrefixCacheAffinityRouter: queue-length gap that switches to power of two choices "
        "(fleetplane uses the bounded load instead).")
    match_rate_threshold: float | None = not_acted_on(
        "PrefixCacheAffinityRouter: least prefix match rate for affinity.")
    do_eviction: bool | None = not_acted_on("PrefixCacheAffinityRouter: prefix tree eviction.")
    eviction_threshold_chars: int | None = not_acted_on(
        "PrefixCacheAffinityRouter: prefix tree size that starts an eviction.")
    eviction_target_chars: int | None = not_acted_on(
        "PrefixCacheAffinityRouter: prefix tree size an eviction ends at.")
    eviction_interval_secs: float | None = not_acted_on(
        "PrefixCacheAffinityRouter: seconds between eviction checks.")


_Seconds = number(Bound(0, 3600, above=True))


class RequestRouterConfig(BaseModel):
    model_config = _MODEL_CONFIG

    request_router_class: str = Field(
        "p2c", description=f"The routing policy: one of {', '.join(POLICIES)}, or Serve's "
        "PowerOfTwoChoicesRequestRouter / Serve LLM's PrefixCacheAffinityRouter path.")
    request_router_kwargs: RouterKwargs = Field(default_factory=RouterKwargs)
    request_routing_stats_period_s: _Seconds | None = not_acted_on(
        "Seconds between a replica's routing stats (fleetplane reads them with each "
        "queue-length probe).")
    request_routing_stats_timeout_s: _Seconds | None = not_acted_on(
        "Deadline of a replica's routing stats.")
    initial_backoff_s: _Seconds | None = not_acted_on("First backoff of a queued request.")
    backoff_multiplier: float | None = not_acted_on("Backoff growth of a queued request.")
    max_backoff_s: _Seconds | None = not_acted_on("Longest backoff of a queued request.")

    @field_validator("request_router_class")
    @classmethod
    def _known(cls, value: str) -> str:
        try:
            return policy_name(value)
        except ValueError:
            raise PydanticCustomError(
                "serve_compat_invalid", "{detail}",
                {"detail": f"unknown request router {value!r}: one of {', '.join(POLICIES)}, "
                 f"or {SERVE_DEFAULT_ROUTER} (p2c) or "
                 "ray.serve.llm.request_router:PrefixCacheAffinityRouter (prefix); "
                 "fleetplane runs no custom router class"}) from None

    def policy(self) -> dict[str, Any]:
        """The policy as a router takes it (``RoutingPolicy`` fields)."""
        kwargs = self.request_router_kwargs
        return {"name": self.request_router_class, "balance_factor": kwargs.balance_factor,
                "session_header": kwargs.session_header}
