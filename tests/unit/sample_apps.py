"""Small user apps that the unit tests build, one per kind ``user_code`` accepts.

Imported by ``import_path`` strings such as ``tests.unit.sample_apps:Model``. Building a
Serve application (``serve.deployment(...).bind()``) needs no Ray, so importing this
module starts nothing. The classes stay plain module attributes (``serve.deployment`` is
called, not used as a decorator) so they pickle by reference, as a user's importable
class does; ``DecoratedEcho`` is the exception on purpose.
"""

from __future__ import annotations

from typing import Any

from ray import serve


class Model:
    """A plain class: constructor args, reconfigure and check_health."""

    def __init__(self, greeting: str = "hello", size: int = 1) -> None:
        self.greeting = greeting
        self.size = size
        self.user_config: Any = None

    def reconfigure(self, user_config: Any) -> None:
        self.user_config = user_config

    def check_health(self) -> None:
        if not self.greeting:
            raise RuntimeError("no greeting")

    def __call__(self, name: str = "world") -> str:
        return f"{self.greeting}, {name}!"


def echo(text: str = "") -> str:
    """A plain function: with no args it is the deployment, called per request."""
    return text


def build_model_app(args: dict) -> Any:
    """An application builder: called with the app's ``args``, returns a Serve app."""
    return serve.deployment(Model).bind(greeting=args["greeting"], size=args.get("size", 1))


def build_plain_class(args: dict) -> type:
    """A builder may also return a plain class."""
    return Model


def build_nothing(args: dict) -> int:
    """A broken builder: returns neither a Serve application nor a class."""
    return 42


# A Ray Serve application with options set in code.
serve_app = serve.deployment(num_replicas=3, user_config={"a": 1}, max_ongoing_requests=7)(
    Model).bind(greeting="hi")

# Options that size by load, set in code.
autoscaled_app = serve.deployment(
    autoscaling_config={"min_replicas": 2, "max_replicas": 5, "initial_replicas": 3})(Model).bind()

# Autoscaling set in code that Serve accepts: more replicas than fleetplane's bound (it
# refuses them), and a Serve-only knob fleetplane does not implement (ignored, with a
# warning).
too_many_app = serve.deployment(
    autoscaling_config={"min_replicas": 1, "max_replicas": 10**9})(Model).bind()
serve_only_knob_app = serve.deployment(
    autoscaling_config={"max_replicas": 3, "smoothing_factor": 0.5})(Model).bind()

# A Serve Deployment that is not bound.
unbound_deployment = serve.deployment(max_ongoing_requests=4)(Model)


class Adder:
    def __init__(self, increment: int) -> None:
        self.increment = increment

    def __call__(self, x: int) -> int:
        return x + self.increment


class Router:
    """The ingress of a composed app: gets a bound deployment as its constructor arg."""

    def __init__(self, adder: Any, label: str = "router") -> None:
        self.adder = adder
        self.label = label


# A composed Serve app: the ingress is bound with another bound deployment.
composed_app = serve.deployment(Router).bind(serve.deployment(Adder).bind(increment=2),
                                             label="composed")


@serve.deployment(max_ongoing_requests=8)
class DecoratedEcho:
    """The usual way Serve apps are written: the module attribute is the Deployment."""

    async def __call__(self, text: str = "") -> str:
        return text


decorated_app = DecoratedEcho.bind()

NOT_CALLABLE = {"just": "data"}
