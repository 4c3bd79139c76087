"""Serve application builders and deployments in the shapes Ray Serve's docs show, for
``test_serve_config_shapes`` (imported in-process; nothing here starts Ray).

``from __future__ import annotations`` on purpose: the builders' annotations are strings,
which fleetplane resolves (Serve itself would not see the pydantic model).
"""

from __future__ import annotations

from pydantic import BaseModel
from ray import serve
from ray.serve import Application

from tests.unit.sample_apps import Model


class GreetArgs(BaseModel):
    greeting: str
    times: int = 1


class DefaultArgs(BaseModel):
    greeting: str = "hello"


def typed_builder(args: GreetArgs) -> Application:
    """Serve's typed builder: the args arrive validated into ``GreetArgs``."""
    assert isinstance(args, GreetArgs)
    return serve.deployment(Model).bind(greeting=args.greeting, size=args.times)


def defaults_builder(args: DefaultArgs):
    """A typed builder without a return annotation, whose args all have defaults."""
    return serve.deployment(Model).bind(greeting=args.greeting)


def dict_builder(args: dict) -> Application:
    """Serve's untyped builder: a dict, ``{}`` when the config gives no args."""
    return serve.deployment(Model).bind(greeting=args.get("greeting", "plain"))


def unresolvable_builder(args: NoSuchArgs) -> serve.Application:  # noqa: F821
    """Annotations that cannot be resolved: read as written, so still a builder."""
    return serve.deployment(Model).bind(greeting=str(type(args).__name__))


def two_parameter_builder(args: dict, extra: int) -> Application:
    return serve.deployment(Model).bind()


# Options set in code that fleetplane does not implement; one set to None is the default.
unimplemented_options_app = serve.deployment(
    max_replicas_per_node=2, graceful_shutdown_wait_loop_s=1.0,
    logging_config={"log_level": "DEBUG"}, placement_group_bundles=None,
    max_ongoing_requests=3)(Model).bind()

# num_replicas="auto" in code: Serve's default autoscaling.
auto_app = serve.deployment(num_replicas="auto")(Model).bind()


def _prefix_router_class():
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import \
        PrefixCacheAffinityRouter
    return PrefixCacheAffinityRouter


# Serve LLM's prefix-aware router set in code, as a class object (Serve's docs' shape).
prefix_routed = serve.deployment(
    Model, request_router_config={"request_router_class": _prefix_router_class()}).bind()
