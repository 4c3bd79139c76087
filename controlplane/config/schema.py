"""The user-facing deploy config: its pydantic models, and loading it from YAML.

Owns the shape of the YAML a user writes (modelled on Ray Serve's deploy config) and
the one place it is validated. Everything past ``parse_deploy_config`` may trust it.

Invariants:
- Every model is frozen and rejects unknown keys, so a typo is an error, not a silent default.
- Every float is finite and every free-form dict (``user_config``, ``runtime_env``, ``args``)
  is normalised to its JSON form, so ``parse_deploy_config(config_to_dict(c)) == c``.
- Every number is a number (never a bool) within a range named in ``bounds``, which
  also bounds route prefixes, user_config's size and nesting; a runtime_env's known fields
  have Ray's types (``runtime_env``).
- In ``DeploymentConfig`` every option defaults to None, meaning "not set here"; the
  code's value or the built-in default applies. ``overrides()`` is what this file sets.
- Options set in code (``serve.deployment(...)``) go through the same models
  (``check_deployment_options``, called by ``usercode.build`` with the config's laid over
  them), so the schema is the one place their defaults and checks live; in particular
  ``AutoscalingConfig`` is what ``deployment.autoscaling.AutoscalingPolicy`` is built from.
- A bad config raises one ``ConfigError`` listing every problem, each as
  ``field.path: message``, so the user fixes them in one pass.
- Every field of Ray Serve 2.60's deploy schema is accepted with Serve's type, so an
  existing Serve config loads; those fleetplane does not act on (``serve_compat``)
  are named by ``ignored_fields`` and logged by ``parse_deploy_config``, never dropped
  without a word. Unknown keys are still errors (Serve itself drops them silently).
"""

from __future__ import annotations

import json
import logging
import os
import reprlib
from typing import Annotated, Any, get_args, get_origin

from pydantic import (AfterValidator, BaseModel, Field, ValidationError,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

from controlplane.config.bounds import (
    AtLeastOneReplica, Cpus, CustomResource, DelaySeconds, Gpus,
    HealthCheckSeconds, MemoryBytes, OngoingRequests, PeriodSeconds, QueuedRequests, Replicas,
    Fraction, StartSeconds, TargetOngoingRequests, check_depth, check_user_config_size, route_prefix_problem)
from controlplane.config.options import MODEL_CONFIG as _MODEL_CONFIG
from controlplane.config.options import (BackpressureConfig, ControllerOptions,  # noqa: F401
                                         HTTPOptions)  # re-exported: users import them here
from controlplane.config.request_router import RequestRouterConfig
from controlplane.config.runtime_env import RuntimeEnvField
from controlplane.config.serve_compat import (
    ReplicasOrAuto, ServeApplicationFields, ServeAutoscalingFields,
    ServeDeployFields, ServeDeploymentFields, accepted_fields, acted_on_dump,
    ignored_fields, resolve_auto, unset_fields)
from controlplane.config.yaml_file import read_yaml_file
from controlplane.errors import ConfigError
from controlplane.specs import DEPLOYMENT_DEFAULTS

logger = logging.getLogger(__name__)

_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"

# Error types of our own validators. INVALID echoes the input like pydantic's own errors;
# CONFLICT is a check across fields or list items whose message already quotes the values.
_INVALID = "fleetplane_invalid"
_CONFLICT = "fleetplane_conflict"
_ROOT = "<root>"
_FILE = "<file>"
_MAX_INPUT_REPR = 60


def _invalid(detail: str) -> PydanticCustomError:
    # The detail goes through ctx, not the template, so braces in user input are not
    # taken for format placeholders.
    return PydanticCustomError(_INVALID, "{detail}", {"detail": detail})


def _conflict(details: list[str], *, field: str | None = None) -> PydanticCustomError:
    # One validator can raise only one error, so ctx carries each problem for
    # parse_deploy_config to list on its own line. A field validator's loc already names
    # its field; a model validator passes the field to blame.
    ctx: dict[str, Any] = {"detail": "; ".join(details), "details": details}
    if field is not None:
        ctx["field"] = field
    return PydanticCustomError(_CONFLICT, "{detail}", ctx)


def _as_json(value: Any) -> Any:
    """Return ``value`` as it will be after a JSON round trip, or reject it.

    Normalising (tuples to lists, non-string keys to strings) keeps the checkpoint round
    trip exact; allow_nan=False rejects NaN and infinity, which JSON cannot carry.
    """
    check_depth(value)  # before json.dumps, which would recurse into it
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _invalid(f"must be JSON-serialisable: {exc}") from exc
    return json.loads(text)


# Number fields take the bounds module's types: finite (pydantic's JSON dump writes inf
# and NaN as null), never a bool, each within its named range.
JsonDict = Annotated[dict[str, Any], AfterValidator(_as_json)]
RuntimeEnvDict = Annotated[RuntimeEnvField, AfterValidator(_as_json)]
Name = Annotated[str, Field(pattern=_NAME_PATTERN)]


# Scale from zero: how long a request may wait for the first replica. Long enough that a
# replica that starts in seconds answers the held request; short enough that a client
# with a 60 s timeout (common for load balancers) gets a 503 and a Retry-After in time.
COLD_START_HOLD_S = 30.0


class LLMScalingConfig(BaseModel):
    """``autoscaling_config.llm``: scale an LLM deployment on its engines' signals
    (``controlplane/deployment/llm_scaling.py``) instead of ongoing requests."""

    model_config = _MODEL_CONFIG

    target_fill: Fraction = Field(
        0.75, description="The most of its engine's slots (max_num_seqs) a replica is "
        "planned to fill, (running + waiting) / slots: the count before the time a request "
        "holds a slot is measured, a floor on it after.")
    kv_cache_high: Fraction = Field(
        0.9, description="KV-cache use that, with requests waiting, asks for a replica.")
    ttft_target_s: PeriodSeconds | None = Field(
        10.0, description="The time to first token the fleet is sized for: replicas "
        "enough that at most 1 request in 1,000 would wait longer for a slot (Erlang C on "
        "the demand and the measured time a request holds a slot); an engine's TTFT p90 "
        "above it asks for one more. None: sized by target_fill alone.")
    surge: float = Field(
        0.0, ge=0.0, le=10.0, description="Headroom for bursts that outrun a replica's "
        "start: sized for the demand's level x (1 + surge); 1.0 holds a doubling.")
    waiting_high: PeriodSeconds | None = Field(
        None, description="Requests waiting for an engine slot (all engines) that ask for "
        "a replica beyond the demand's count; None: off.")


class AutoscalingConfig(BaseModel):
    model_config = _MODEL_CONFIG

    min_replicas: Replicas = Field(1, description="Fewest replicas; 0 scales to zero when idle.")
    max_replicas: AtLeastOneReplica = Field(1, description="Most replicas.")
    initial_replicas: Replicas | None = Field(
        None, description="Replicas at first deploy; None: min.")
    target_ongoing_requests: TargetOngoingRequests = Field(
        2.0, description="Ongoing requests per replica.")
    upscale_delay_s: DelaySeconds = Field(
        30.0, description="Seconds load must stay high to scale out.")
    downscale_delay_s: DelaySeconds = Field(
        600.0, description="Seconds load must stay low to scale in.")
    look_back_period_s: PeriodSeconds = Field(
        30.0, description="Seconds over which load is averaged.")
    downscale_to_zero_delay_s: DelaySeconds | None = Field(
        None, description="Seconds idle before the last replica goes (min_replicas 0); "
        "None: downscale_delay_s (Serve's rule).")
    llm: LLMScalingConfig | None = Field(
        None, description="fleetplane's own: scale on the engines' waiting requests, "
        "KV-cache use and TTFT (VLLMServer) instead of ongoing requests.")
    cold_start_hold_s: DelaySeconds = Field(
        COLD_START_HOLD_S, description="fleetplane's own, with min_replicas 0: seconds a "
        "request waits for the first replica before a 503 with Retry-After (the measured "
        "start time); one that would wait longer is told at once.")

    @model_validator(mode="after")
    def _check_replica_bounds(self) -> AutoscalingConfig:
        low, high, initial = self.min_replicas, self.max_replicas, self.initial_replicas
        # Blame max_replicas: the usual slip is raising min_replicas past the default max of 1.
        if low > high:
            raise _conflict(
                [f"max_replicas ({high}) is below min_replicas ({low}); "
                 f"raise max_replicas to at least {low} or lower min_replicas"],
                field="max_replicas",
            )
        if initial is not None and not low <= initial <= high:
            raise _conflict(
                [f"initial_replicas ({initial}) must lie within min_replicas ({low}) and "
                 f"max_replicas ({high}); change initial_replicas or leave it unset"],
                field="initial_replicas",
            )
        return self


class FileAutoscalingConfig(ServeAutoscalingFields, AutoscalingConfig):
    """``autoscaling_config`` as a ``deployments[]`` entry may write it: Serve's tuning
    knobs too (not acted on). Options set in code and the specs use ``AutoscalingConfig``."""

    model_config = _MODEL_CONFIG


class RayActorOptions(BaseModel):
    model_config = _MODEL_CONFIG

    num_cpus: Cpus | None = Field(None, description="CPUs reserved per replica.")
    num_gpus: Gpus | None = Field(None, description="GPUs reserved per replica.")
    memory: MemoryBytes | None = Field(None, description="Memory reserved per replica, in bytes.")
    resources: dict[str, CustomResource] = Field(
        default_factory=dict, description="Custom Ray resources.")
    runtime_env: RuntimeEnvDict = Field(
        default_factory=dict, description="Ray runtime_env of each replica.")
    accelerator_type: str | None = Field(None, description="Ray accelerator type, e.g. 'H100'.")
    label_selector: dict[str, str] | None = Field(
        None, description="Node labels a replica must run on (passed to Ray).")
    fallback_strategy: list[JsonDict] | None = Field(
        None, description="Scheduling options Ray falls back on, in order (passed to Ray).")


class DeploymentOptions(BaseModel):
    """A deployment's options, wherever they are set: a ``deployments[]`` entry of the
    file (``DeploymentConfig``), or code with the file's entry laid over it."""

    model_config = _MODEL_CONFIG

    num_replicas: Replicas | None = Field(None, description="Fixed replica count.")
    max_ongoing_requests: OngoingRequests | None = Field(
        None, description="Requests a replica runs at once.")
    max_queued_requests: QueuedRequests | None = Field(
        None, description="Requests queued before shedding; -1 means unlimited."
    )
    user_config: Any = Field(None, description="JSON value handed to the replica's reconfigure().")
    autoscaling_config: AutoscalingConfig | None = Field(
        None, description="Scale on load instead of a fixed num_replicas."
    )
    health_check_period_s: HealthCheckSeconds | None = Field(
        None, description="Seconds between health checks.")
    health_check_timeout_s: HealthCheckSeconds | None = Field(
        None, description="Seconds before a health check counts as failed."
    )
    graceful_shutdown_timeout_s: DelaySeconds | None = Field(
        None, description="Seconds a stopping replica may spend draining."
    )
    replica_start_timeout_s: StartSeconds | None = Field(
        None, description="Seconds a replica may take to start (placement, constructor, first "
        "health check) before it is killed and retried; fleetplane's own (Serve has none). "
        "Default: 300, or an LLM engine's startup_timeout_s + 60.")
    backpressure_config: BackpressureConfig | None = Field(None, description="How shed requests end.")
    request_router_config: RequestRouterConfig | None = Field(
        None, description="How requests are placed on replicas (controlplane/routing/policies.py).")
    ray_actor_options: RayActorOptions | None = Field(None, description="Ray options of each replica.")

    @field_validator("user_config")
    @classmethod
    def _user_config_is_json(cls, value: Any) -> Any:
        return check_user_config_size(_as_json(value))

    @model_validator(mode="after")
    def _start_outlasts_a_health_period(self) -> DeploymentOptions:
        start, period = self.replica_start_timeout_s, self.health_check_period_s
        period = DEPLOYMENT_DEFAULTS["health_check_period_s"] if period is None else period
        if start is not None and start <= period:
            raise _conflict(
                [f"replica_start_timeout_s ({start:g}) must be longer than health_check_period_s "
                 f"({period:g}): a start includes the first health check; raise "
                 "replica_start_timeout_s or lower health_check_period_s"],
                field="replica_start_timeout_s")
        return self

    @model_validator(mode="after")
    def _one_way_to_size(self) -> DeploymentOptions:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise _conflict(
                ["set either num_replicas or autoscaling_config, not both; remove num_replicas "
                 "to autoscale, or autoscaling_config for a fixed count"],
                field="num_replicas",
            )
        return self

    def overrides(self) -> dict[str, Any]:
        """The options this config sets, to lay over the code's values.

        None values are left out even when written explicitly: None means "not set here",
        and after a ``config_to_dict`` round trip every field counts as set. Only options
        fleetplane acts on: a ``deployments[]`` entry's Serve-only fields are left out.
        """
        result: dict[str, Any] = {}
        for field in self.model_fields_set & set(DeploymentOptions.model_fields):
            value = getattr(self, field)
            if value is not None:
                result[field] = acted_on_dump(value) if isinstance(value, BaseModel) else value
        return result


class DeploymentConfig(ServeDeploymentFields, DeploymentOptions):
    """One ``deployments[]`` entry: the options this file sets for the named deployment,
    and the fields of Serve's ``DeploymentSchema`` fleetplane does not act on."""

    model_config = _MODEL_CONFIG

    name: Name = Field(..., description="Deployment name, as in the application's code.")
    num_replicas: ReplicasOrAuto = Field(None, description="Fixed replica count, or 'auto'.")
    autoscaling_config: FileAutoscalingConfig | None = Field(
        None, description="Scale on load instead of a fixed num_replicas.")

    @model_validator(mode="before")
    @classmethod
    def _auto_with_autoscaling(cls, data: Any) -> Any:
        return resolve_auto(data)  # Serve's "num_replicas: auto" beside an autoscaling_config


def _check_import_path(value: str) -> str:
    module, sep, attr = value.partition(":")
    if not sep:  # "pkg.module.attr": the last dotted part is the attribute.
        module, _, attr = value.rpartition(".")
    if not (_is_dotted_identifier(module) and _is_dotted_identifier(attr)):
        raise _invalid("import_path must look like 'pkg.module:attr' or 'pkg.module.attr'")
    return value


def _is_dotted_identifier(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _check_route_prefix(value: str | None) -> str | None:
    problem = None if value is None else route_prefix_problem(value)
    if problem:
        raise _invalid(problem)
    return value


class ApplicationConfig(ServeApplicationFields):
    model_config = _MODEL_CONFIG

    name: Name = Field("default", description="Application name.")
    route_prefix: Annotated[str | None, AfterValidator(_check_route_prefix)] = Field(
        "/", description="HTTP path prefix this application serves; None serves no HTTP."
    )
    import_path: Annotated[str, AfterValidator(_check_import_path)] = Field(
        ..., description="Where the application lives: 'pkg.module:attr' or 'pkg.module.attr'."
    )
    runtime_env: RuntimeEnvDict = Field(
        default_factory=dict, description="Ray runtime_env of the app.")
    args: JsonDict = Field(default_factory=dict, description="Keyword arguments for an app builder.")
    deployments: list[DeploymentConfig] = Field(
        default_factory=list, description="Per-deployment overrides of the code's options."
    )

    @field_validator("deployments")
    @classmethod
    def _unique_deployment_names(cls, value: list[DeploymentConfig]) -> list[DeploymentConfig]:
        named = [(d.name, f"deployments[{i}]") for i, d in enumerate(value)]
        problems = [
            f"duplicate deployment name '{name}' at {a} and {b}; names must be unique in an application"
            for name, a, b in _duplicates(named)
        ]
        if problems:
            raise _conflict(problems)
        return value


class DeployConfig(ServeDeployFields):
    model_config = _MODEL_CONFIG

    applications: list[ApplicationConfig] = Field(
        default_factory=list, description="Applications to run; the whole desired state."
    )
    http_options: HTTPOptions = Field(default_factory=HTTPOptions, description="HTTP proxy options.")
    controller_options: ControllerOptions = Field(
        default_factory=ControllerOptions, description="Controller options."
    )

    @field_validator("applications")
    @classmethod
    def _unique_apps(cls, value: list[ApplicationConfig]) -> list[ApplicationConfig]:
        named = [(app.name, f"applications[{i}]") for i, app in enumerate(value)]
        routed = [
            (app.route_prefix, f"'{app.name}' (applications[{i}])")
            for i, app in enumerate(value)
            if app.route_prefix is not None
        ]
        problems = [
            f"duplicate application name '{name}' at {a} and {b}; names must be unique"
            for name, a, b in _duplicates(named)
        ] + [
            f"duplicate route_prefix '{prefix}' in applications {a} and {b}; give each its own"
            for prefix, a, b in _duplicates(routed)
        ]
        if problems:
            raise _conflict(problems)
        return value


def _duplicates(items: list[tuple[Any, str]]) -> list[tuple[Any, str, str]]:
    """(key, where first seen, where repeated) for each repeat of a key."""
    first_seen: dict[Any, str] = {}
    repeats = []
    for key, where in items:
        if key in first_seen:
            repeats.append((key, first_seen[key], where))
        else:
            first_seen[key] = where
    return repeats


def parse_deploy_config(data: object, source: str = "<config>", *,
                        log_ignored: bool = True) -> DeployConfig:
    """Validate already-parsed data (a dict); raise ConfigError listing every problem.
    Log each field set that fleetplane does not act on (``ignored_fields``), unless
    ``log_ignored`` is False: for a caller that shows them to the user itself."""
    if not isinstance(data, dict):
        kind = type(data).__name__
        problem = f"expected a mapping with 'applications' (got {kind}: {_short_repr(data)})"
        raise ConfigError(source, [f"{_ROOT}: {problem}"])
    try:
        cfg = DeployConfig.model_validate(data)
    except ValidationError as exc:
        errors = [line for err in exc.errors() for line in _describe(err)]
        raise ConfigError(source, errors) from exc
    if log_ignored:
        for warning in ignored_fields(cfg):
            logger.warning("%s: %s", source, warning)
    return cfg


def check_deployment_options(options: dict[str, Any], source: str) -> dict[str, Any]:
    """Options merged from code and config, through the schema: the ones set, normalised,
    nested models whole (``autoscaling_config`` with its defaults filled in). Raise
    ConfigError listing every problem as ``field.path: message``."""
    try:
        return DeploymentOptions.model_validate(options).overrides()
    except ValidationError as exc:
        errors = [line for err in exc.errors() for line in _describe(err, DeploymentOptions)]
        raise ConfigError(source, errors) from exc


def load_deploy_config(path: str | os.PathLike, *, log_ignored: bool = True) -> DeployConfig:
    """Read and validate a YAML deploy config file (``log_ignored``: as parse_deploy_config)."""
    source = os.fsdecode(path)
    data = read_yaml_file(source)
    if data is None:
        raise ConfigError(source, [f"{_ROOT}: config is empty; expected a mapping with 'applications'"])
    return parse_deploy_config(data, source, log_ignored=log_ignored)


def config_to_dict(cfg: DeployConfig) -> dict[str, Any]:
    """Plain JSON-ready data for checkpoints and actor calls; parses back to an equal config.
    Serve-only fields left unset are left out (``unset_fields``)."""
    return cfg.model_dump(mode="json", exclude_unset=False, exclude=unset_fields(cfg) or None)


def _describe(err: Any, root: type[BaseModel] = DeployConfig) -> list[str]:
    """One pydantic error as 'field.path: message (got: input)' lines; ``loc`` starts at
    ``root``."""
    loc, kind, ctx = tuple(err["loc"]), err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        return [f"{_format_path(loc)}: unknown field; {accepted_fields(_model_at(loc[:-1], root))}"]
    if kind == _CONFLICT:
        path = _format_path(loc + ((ctx["field"],) if "field" in ctx else ()))
        return [f"{path}: {detail}" for detail in ctx["details"]]
    message = err["msg"]
    if kind != "missing":  # a missing field's input is its parent, not worth echoing
        message += f" (got: {_short_repr(err.get('input'))})"
    return [f"{_format_path(loc)}: {message}"]


def _format_path(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif path and not str(part).startswith("["):
            path += f".{part}"
        else:  # first segment, or pydantic's "[key]" marker for a bad dict key
            path += str(part)
    return path or _ROOT


def _model_at(loc: tuple[str | int, ...], root: type[BaseModel]) -> type[BaseModel]:
    """The model that owns the fields at ``loc``, walking field annotations from ``root``."""
    model = root
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is not None:
            model = _model_in(field.annotation) or model
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    # get_origin guards issubclass: list[X] passes isinstance(_, type) but is not a class.
    if get_origin(annotation) is None and isinstance(annotation, type):
        return annotation if issubclass(annotation, BaseModel) else None
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:  # nested too deep for repr: reprlib shows its first levels
        text = reprlib.repr(value)
    return text if len(text) <= _MAX_INPUT_REPR else text[: _MAX_INPUT_REPR - 3] + "..."
