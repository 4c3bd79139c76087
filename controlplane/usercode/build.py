"""Turns an application's ``import_path`` into deployment specs.

Accepted targets (so existing Ray Serve apps run unchanged):
- a Ray Serve application, ``serve.deployment(...)(Cls).bind(...)``: every deployment in
  its bound graph, with the options set in code (``user_configured_option_names``);
- a Ray Serve ``Deployment`` that is not bound: one deployment, no constructor args;
- a plain class: one deployment named after the class; the app's ``args`` are its
  constructor keyword arguments;
- a plain function: an application builder when the config gives it ``args`` or its
  signature says it is one (``_is_builder``), called with the args, returning a Serve
  application or a class; otherwise the deployment itself (called per request). As in
  Serve, a builder takes one parameter, and one annotated with a pydantic model gets the
  args validated into that model (``_call_builder``).

Options Serve takes that fleetplane does not implement (``max_replicas_per_node``,
``logging_config``...) are valid Serve code, so the app still runs: each one set in code
is reported by ``build_with_warnings``, naming application, deployment and option.

Option precedence, lowest first: built-in defaults, options set in code, the deploy
config's ``deployments[]`` entry. The options set in code, with the entry laid over them,
go through the deploy schema (``config.schema.check_deployment_options``) like the file's
own, so a bad ``autoscaling_config`` in ``serve.deployment(...)`` fails the deploy before
anything is committed, naming the application, the deployment and the field; the schema
also fills in the autoscaling defaults. This module runs inside a Ray task (``max_calls=1``,
so a re-deploy imports the user's code afresh); errors are ``BuildError``, one line naming
the application and the field (``import_path``, ``args``, ``user_config``...), with the
user's traceback, where there is one, as its ``detail``.

What would fail in every replica is refused here, before anything is committed
(``code_fit``): constructor arguments the class does not take, and a ``user_config`` with no
``reconfigure()`` to receive it.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import traceback
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

import ray.cloudpickle as cloudpickle
from pydantic import BaseModel, ValidationError

from controlplane.deployment.autoscaling import AutoscalingPolicy, initial_target
from controlplane.config.request_router import RequestRouterConfig
from controlplane.config.schema import AutoscalingConfig, DeploymentConfig, check_deployment_options
from controlplane.usercode.code_fit import (check_constructor, check_llm_scaling,
                                            check_user_config, start_deadline)
from controlplane.config.serve_compat import AUTO_AUTOSCALING
from controlplane.errors import BuildError, ConfigError, exception_line
from controlplane.usercode.import_path import import_target
from controlplane.specs import DEPLOYMENT_DEFAULTS, DeploymentId, DeploymentSpec, stable_hash
from controlplane.wire import DeploymentRef

logger = logging.getLogger(__name__)

_SERVE_OPTION_NAMES = tuple(k for k in DEPLOYMENT_DEFAULTS if k != "ray_actor_options")
# Serve options set in code that fleetplane reads (the rest are reported, not dropped).
_READ_OPTION_NAMES = frozenset({*DEPLOYMENT_DEFAULTS, "name"})
_NOTE = "accepted for compatibility with Ray Serve but not acted on by fleetplane"
# ray_actor_options set in code that go through the config's bounds (num_cpus: 1e308 is
# valid Serve code); runtime_env stays Ray's to check (code may pass module objects).
_CHECKED_ACTOR_OPTIONS = frozenset({"num_cpus", "num_gpus", "memory", "resources"})


@dataclass
class _Found:
    name: str
    target: Any
    args: tuple
    kwargs: dict
    code_options: dict
    ignored: list[str] = field(default_factory=list)  # options set in code, not acted on
    args_from: str = "args"  # where the constructor arguments come from (code_fit)


def build_application(app_config: Mapping[str, Any]) -> list[DeploymentSpec]:
    """Import and build one application; raises BuildError (see the module's doc).
    Options set in code that fleetplane does not act on are logged as warnings."""
    return build_with_warnings(app_config)[0]


def build_with_warnings(app_config: Mapping[str, Any]) -> tuple[list[DeploymentSpec], list[str]]:
    """``build_application``, and its warnings too, for the deploy to show the user: one
    per option set in code that fleetplane does not act on (each also logged)."""
    app = app_config["name"]
    target = import_target(app, app_config["import_path"])
    try:
        found = _discover(app, target, app_config.get("args") or {})
    except BuildError:
        raise
    except Exception as e:  # Serve's graph could not be read: say so, traceback behind
        raise BuildError(app, f"import_path '{app_config['import_path']}': building the "
                         f"application raised {exception_line(e)}",
                         traceback.format_exc()) from None
    overrides = {d["name"]: d for d in app_config.get("deployments") or []}
    unknown = sorted(set(overrides) - {f.name for f in found})
    if unknown:
        known = ", ".join(f.name for f in found)
        raise BuildError(app, f"deployments[] names {unknown} but the application has only "
                         f"[{known}]; fix the names in the config")
    specs = [_spec(app_config, f, overrides.get(f.name, {}), ingress=(i == 0))
             for i, f in enumerate(found)]
    warnings = [f"application '{app}', deployment '{f.name}': {option} set in code is {_NOTE}"
                for f in found for option in f.ignored]
    for warning in warnings:
        logger.warning("%s", warning)
    return specs, warnings


def _discover(app: str, target: Any, args: Mapping[str, Any]) -> list[_Found]:
    """Ingress first, then every other deployment of the bound graph (each once)."""
    from ray.serve.deployment import Application, Deployment

    unbound = isinstance(target, Deployment)
    if unbound:
        target = target.bind()
    args_from = "args"
    if _is_builder(target, args):
        target = _call_builder(app, target, args)
        if not isinstance(target, Application) and not inspect.isclass(target):
            raise BuildError(app, "the application builder must return a Serve application "
                             f"or a class, got {type(target).__name__}")
        args, args_from = {}, "builder"
    if isinstance(target, Application) and args:  # Serve refuses them too
        raise BuildError(app, "args are set, but import_path names a built Serve application, "
                         "which takes none; remove args, or point import_path at a builder")
    if isinstance(target, Application):
        found: dict[str, _Found] = {}
        _walk_serve_app(app, target, found, "unbound" if unbound else "bind")
        return list(found.values())
    if inspect.isclass(target) or inspect.isfunction(target):
        return [_Found(target.__name__, target, (), dict(args), {}, args_from=args_from)]
    raise BuildError(app, f"import_path names a {type(target).__name__}; expected a class, a "
                     "function, or a Ray Serve application (serve.deployment(...).bind())")


def _is_builder(target: Any, args: Mapping[str, Any]) -> bool:
    """Is this plain function an application builder, or a function deployment?

    Serve calls every function import_path as a builder (with ``args``, or ``{}``), since
    it has no plain function deployments. fleetplane keeps its own: a function with no
    ``args`` is the deployment, unless its signature says it builds one, as Serve's
    documented builders do: ``-> Application``, or its one parameter typed with a pydantic
    model. So a Serve builder deployed without args is built, not served per request; a
    function deployment taking one pydantic model belongs under ``@serve.deployment``.
    """
    if not inspect.isfunction(target):
        return False
    if args:
        return True
    hints = _annotations(target)
    returned = hints.get("return")
    if returned is _application_type() or (
            isinstance(returned, str) and returned.rpartition(".")[2] == "Application"):
        return True
    params = list(inspect.signature(target).parameters)
    return len(params) == 1 and _model_type(hints.get(params[0])) is not None


def _call_builder(app: str, builder: Any, args: Mapping[str, Any]) -> Any:
    """Serve's ``call_user_app_builder_with_args_if_necessary``: one parameter, given the
    args validated into its pydantic model when it is annotated with one, else a dict."""
    params = list(inspect.signature(builder).parameters)
    if len(params) != 1:
        raise BuildError(app, f"application builder {builder.__qualname__}() must take "
                         f"exactly one parameter, the application's args; it takes "
                         f"{len(params)}")
    model = _model_type(_annotations(builder).get(params[0]))
    if model is None:
        return _run_builder(app, builder, dict(args))
    try:
        typed = model.model_validate(dict(args))
    except ValidationError as exc:
        problems = "".join(
            f"\n  - {'.'.join(str(p) for p in ('args', *err['loc']))}: {err['msg']}"
            for err in exc.errors())
        raise BuildError(app, f"args do not fit {model.__name__}, the type of "
                         f"{builder.__qualname__}()'s parameter '{params[0]}':{problems}\n"
                         f"fix args in the config") from None
    return _run_builder(app, builder, typed)


def _run_builder(app: str, builder: Any, args: Any) -> Any:
    try:
        return builder(args)
    except Exception as e:  # the user's builder: one line, their traceback behind it
        raise BuildError(app, f"import_path '{builder.__module__}:{builder.__qualname__}': "
                         f"the application builder raised {exception_line(e)}",
                         traceback.format_exc()) from None


def _annotations(function: Any) -> dict[str, Any]:
    """The function's annotations, resolved where they can be (a module with ``from
    __future__ import annotations`` has strings): Serve reads only unresolved ones, and
    would hand such a builder a dict where it expects its model."""
    try:
        return typing.get_type_hints(function)
    except Exception:  # an unresolvable name (imported under TYPE_CHECKING...): as written
        return dict(getattr(function, "__annotations__", {}))


def _model_type(annotation: Any) -> type[BaseModel] | None:
    is_model = inspect.isclass(annotation) and issubclass(annotation, BaseModel)
    return annotation if is_model else None


def _application_type() -> type:
    from ray.serve.deployment import Application

    return Application


def _walk_serve_app(app: str, node: Any, found: dict[str, _Found],
                    args_from: str = "bind") -> DeploymentRef:
    from ray.serve.deployment import Application

    dep = node._bound_deployment
    if dep.name not in found:
        found[dep.name] = _Found(dep.name, dep.func_or_class, (), {}, {})  # reserve order
        swap = lambda v: _walk_serve_app(app, v, found) if isinstance(v, Application) else v
        options, ignored = _serve_code_options(dep)
        found[dep.name] = _Found(
            dep.name, dep.func_or_class,
            tuple(swap(a) for a in dep.init_args),
            {k: swap(v) for k, v in dep.init_kwargs.items()},
            options, ignored, args_from=args_from)
    return DeploymentRef(app, dep.name)


def _serve_code_options(dep: Any) -> tuple[dict, list[str]]:
    """The options set in code that fleetplane reads, and the names of those it does not
    act on (reported by the build; Serve's autoscaling knobs as
    ``autoscaling_config.<knob>``): they are valid Serve code, so the app still runs."""
    cfg = dep._deployment_config
    options = {name: getattr(cfg, name) for name in _SERVE_OPTION_NAMES
               if name in cfg.user_configured_option_names}
    for name in ("autoscaling_config", "backpressure_config", "request_router_config"):
        if options.get(name) is not None:
            options[name] = options[name].model_dump(exclude_unset=True)
    router_class = (options.get("request_router_config") or {}).get("request_router_class")
    if router_class is not None and not isinstance(router_class, str):  # a class object
        options["request_router_config"]["request_router_class"] = \
            f"{router_class.__module__}:{router_class.__qualname__}"
    ignored = _unread_code_options(dep)
    scaling = options.get("autoscaling_config")
    if scaling is not None:
        # Serve refuses a count with autoscaling_config, so both set means "auto" (which
        # leaves num_replicas at 1): the count is not the user's.
        options.pop("num_replicas", None)
        ignored += [f"autoscaling_config.{k}" for k in sorted(scaling)
                    if k not in AutoscalingConfig.model_fields]
        options["autoscaling_config"] = {k: v for k, v in scaling.items()
                                         if k in AutoscalingConfig.model_fields}
    options["ray_actor_options"] = dict(dep.ray_actor_options or {})
    return options, ignored


def _unread_code_options(dep: Any) -> list[str]:
    """Options set in ``serve.deployment(...)``/``.options(...)`` that fleetplane does not
    read; one set to None asks for the default, which is what fleetplane does."""
    unread = []
    for name in sorted(dep._deployment_config.user_configured_option_names):
        if name in _READ_OPTION_NAMES or name.startswith("_"):  # _init_args: bind's
            continue
        value = getattr(dep._deployment_config, name, getattr(dep._replica_config, name, ...))
        if value is not None:
            unread.append(name)
    return unread


def _merged_options(app: str, found: _Found, override: Mapping[str, Any]) -> dict:
    """Code's options with the config's laid over them, checked by the schema.

    The config's sizing (num_replicas or autoscaling_config) replaces the code's other
    one. Of ``ray_actor_options`` only the amounts reserved (``_CHECKED_ACTOR_OPTIONS``)
    are checked, against the config's bounds: code may set any option Ray takes, more than
    the config's model knows, and Ray checks the rest when it creates the actor.
    """
    chosen = {k: v for k, v in found.code_options.items() if v is not None}
    config_set = _config_options(override, chosen.get("autoscaling_config"))
    if "autoscaling_config" in config_set:
        chosen.pop("num_replicas", None)
    elif "num_replicas" in config_set:
        chosen.pop("autoscaling_config", None)
    chosen.update(config_set)
    actor_options = chosen.pop("ray_actor_options", None)
    if actor_options:
        chosen["ray_actor_options"] = {k: v for k, v in actor_options.items()
                                       if k in _CHECKED_ACTOR_OPTIONS and v is not None}
    source = f"application '{app}', deployment '{found.name}'"
    try:
        checked = check_deployment_options(chosen, source)
    except ConfigError as e:
        problems = "".join(f"\n  - {error}" for error in e.errors)
        raise BuildError(app, f"deployment '{found.name}': invalid options (set in code, "
                         f"with the config's deployments[] entry laid over them):{problems}"
                         ) from None
    if actor_options is not None:
        checked["ray_actor_options"] = actor_options
    return checked


def _config_options(override: Mapping[str, Any], code_scaling: dict | None) -> dict:
    """What the config's ``deployments[]`` entry sets that fleetplane acts on (its
    Serve-only fields are the config parser's to report). Serve's ``num_replicas: auto``
    alone (with an autoscaling_config beside it, the parser resolved it) autoscales with
    Serve's "auto" defaults under the code's autoscaling_config, as Serve lays them."""
    options = DeploymentConfig.model_validate(override).overrides() if override else {}
    if options.get("num_replicas") == "auto":
        del options["num_replicas"]
        options["autoscaling_config"] = {**AUTO_AUTOSCALING, **(code_scaling or {})}
    return options


def _spec(app_config: Mapping[str, Any], found: _Found, override: Mapping[str, Any],
          ingress: bool) -> DeploymentSpec:
    options = {**DEPLOYMENT_DEFAULTS, **_merged_options(app_config["name"], found, override)}
    check_user_config(app_config["name"], found.name, found.target, options["user_config"])
    check_constructor(app_config["name"], found.name, found.target, found.args, found.kwargs,
                      found.args_from)
    check_llm_scaling(app_config["name"], found.name, found.target,
                      options["autoscaling_config"])
    if options["autoscaling_config"] is not None:  # the schema rejects setting both
        options["num_replicas"] = initial_target(
            AutoscalingPolicy.from_config(options["autoscaling_config"]))
    backpressure = dict(DEPLOYMENT_DEFAULTS["backpressure_config"])
    backpressure.update(options["backpressure_config"] or {})
    runtime_env = dict(app_config.get("runtime_env") or {})
    serialized = cloudpickle.dumps((found.target, found.args, found.kwargs))
    actor_options = {k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v)
                     for k, v in dict(options["ray_actor_options"] or {}).items()
                     if v is not None and v != {}}
    version = stable_hash([app_config["import_path"], found.name, _code_identity(found),
                           actor_options, runtime_env])
    return DeploymentSpec(
        id=DeploymentId(app_config["name"], found.name), ingress=ingress,
        code_version=version, serialized_def=serialized,
        num_replicas=int(options["num_replicas"]),
        max_ongoing_requests=int(options["max_ongoing_requests"]),
        max_queued_requests=int(options["max_queued_requests"]),
        user_config=options["user_config"], autoscaling_config=options["autoscaling_config"],
        health_check_period_s=float(options["health_check_period_s"]),
        health_check_timeout_s=float(options["health_check_timeout_s"]),
        graceful_shutdown_timeout_s=float(options["graceful_shutdown_timeout_s"]),
        replica_start_timeout_s=start_deadline(app_config["name"], found,
                                               options["replica_start_timeout_s"]),
        backpressure_config=backpressure, ray_actor_options=actor_options,
        route_prefix=app_config.get("route_prefix") if ingress else None,
        runtime_env=runtime_env,
        request_router=RequestRouterConfig.model_validate(
            options["request_router_config"] or {}).policy())


def _code_identity(found: _Found) -> list:
    """What identifies the code, the same in every process. Not the pickle bytes: a class
    under @serve.deployment is pickled by value, with ids that differ per process."""
    target = found.target
    name = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', '?')}"
    return [name, _source_digest(target), _args_digest(found.args, found.kwargs)]


def _args_digest(args: tuple, kwargs: dict) -> str:
    as_data = lambda v: ["deployment", v.app, v.name] if isinstance(v, DeploymentRef) else v
    try:
        return stable_hash([[as_data(a) for a in args],
                            {k: as_data(v) for k, v in sorted(kwargs.items())}], strict=True)
    except (TypeError, ValueError):  # not JSON: objects pickled by value hash stably enough
        return hashlib.blake2b(cloudpickle.dumps((args, kwargs)), digest_size=8).hexdigest()


def _source_digest(target: Any) -> str:
    """Digest of the file defining the user's code, so an edited file is a new version."""
    try:
        path = inspect.getsourcefile(target)
        with open(path, "rb") as f:
            return hashlib.blake2b(f.read(), digest_size=8).hexdigest()
    except (TypeError, OSError):
        return "no-source"
