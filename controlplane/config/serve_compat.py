"""Ray Serve 2.60 deploy-config fields that fleetplane accepts but does not act on.

An existing Serve config must load unchanged, so every field of Serve's deploy schema
(``ray/serve/schema.py``: ``ServeDeploySchema``, ``ServeApplicationSchema``,
``DeploymentSchema``, ``HTTPOptionsSchema``, the nested ``AutoscalingConfig`` and
``ControllerOptions``) is a field here too, with the type Serve gives it, so a wrong type
is still an error naming the field. What fleetplane does not implement is declared with
``not_acted_on``: it defaults to None ("not set"), and ``ignored_fields`` names each one a
config sets, so it is never ignored silently. ``schema`` mixes these classes into its
models.
Serve's own shape of one field fleetplane acts on lives here too: ``num_replicas: auto``.

This module imports nothing of ``schema`` (``schema`` imports it); its number types come
from ``bounds``, as the schema's do. Serve's checks across these fields
(``max_replicas_per_node`` with ``placement_group_bundles``...) are not repeated:
fleetplane acts on neither field.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError,
                      ValidationInfo, WrapValidator, field_validator)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from controlplane.config.bounds import (
    DAY_S, REPLICAS, Bound, FiniteFloat, NonNegativeFloat, PositiveFloat, Replicas, check_depth,
    check_number, count, number)

_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True)
_NOT_ACTED_ON = "fleetplane_not_acted_on"  # marks a field in its json_schema_extra
_INERT = "inert_value"  # a value that asks for what fleetplane does anyway
_NOTE = "accepted for compatibility with Ray Serve but not acted on by fleetplane"

# num_replicas "auto": Serve's AutoscalingConfig.default(), under any autoscaling_config set.
AUTO_AUTOSCALING = {"min_replicas": 1, "max_replicas": 100, "target_ongoing_requests": 2.0}


def _invalid(detail: str) -> PydanticCustomError:
    # Rendered by config like its own errors: "field.path: detail (got: input)".
    return PydanticCustomError("serve_compat_invalid", "{detail}", {"detail": detail})


def _json_form(value: Any) -> Any:
    # As in config._as_json: the value as a JSON round trip leaves it, so
    # parse_deploy_config(config_to_dict(c)) == c holds for these fields too.
    check_depth(value)
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise _invalid(f"must be JSON-serialisable: {exc}") from exc


# Numbers as the bounds module takes them (finite, never a bool), in Serve's ranges.
_Float = FiniteFloat
_NonNeg = NonNegativeFloat
_Pos = PositiveFloat
_Port = number(Bound(1, 65535, integer=True))
_Percent = number(Bound(0, 100, "percent"))
_WholePercent = count(0, 100, "percent")
_Fraction = number(Bound(0, 1))
_PositiveFraction = number(Bound(0, 1, above=True))
_PerNode = count(1, 100, "replicas")
_WholeSeconds = count(0, DAY_S, "seconds")
_Json = Annotated[dict[str, Any], AfterValidator(_json_form)]
_JsonList = Annotated[list[Any], AfterValidator(_json_form)]


def _count_or_auto(value: Any, handler: Any) -> Any:
    try:  # one error, not one per member of the union
        return handler(value)
    except ValidationError:
        if isinstance(value, (int, float)):  # a bool or a count out of range: say which
            check_number(REPLICAS, value)
        raise _invalid(f"must be 'auto' or {REPLICAS.describe()}") from None


# A deployment's num_replicas as Serve takes it: a count, or "auto" (autoscale).
ReplicasOrAuto = Annotated[Replicas | Literal["auto"] | None,
                           WrapValidator(_count_or_auto)]


def resolve_auto(data: Any) -> Any:
    """Serve's ``num_replicas: auto`` with an ``autoscaling_config`` beside it, in a
    ``deployments[]`` entry: that config over Serve's "auto" defaults, resolved before
    validation so the entry round-trips as a plain autoscaling_config. "auto" alone stays,
    for ``usercode.build`` to lay over the code's autoscaling_config (Serve's order)."""
    if not isinstance(data, dict) or data.get("num_replicas") != "auto":
        return data
    given = data.get("autoscaling_config")
    if isinstance(given, BaseModel):
        given = given.model_dump(exclude_unset=True)
    if not isinstance(given, dict):
        return data
    return {**data, "num_replicas": None, "autoscaling_config": {**AUTO_AUTOSCALING, **given}}


def not_acted_on(description: str, *, inert: Any = None, **constraints: Any) -> Any:
    """A Serve field fleetplane accepts and ignores: None by default, named by
    ``ignored_fields`` when set to anything but None or ``inert``."""
    extra: dict[str, Any] = {_NOT_ACTED_ON: True}
    if inert is not None:
        extra[_INERT] = inert
    return Field(None, description=f"{description} ({_NOTE}.)", json_schema_extra=extra,
                 **constraints)


def is_not_acted_on(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(_NOT_ACTED_ON))


def ignored_fields(config: BaseModel) -> list[str]:
    """One line per field the config sets that fleetplane does not act on, as
    ``field.path: accepted for compatibility ...``, in the models' field order. A value
    that asks for what fleetplane does anyway (``proxy_location: EveryNode``) is not one."""
    return [f"{path}: {_NOTE}" for path in _set_fields(config, "")]


def _set_fields(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _set_fields(item, f"{path}[{index}]")
    if not isinstance(value, BaseModel):
        return
    for name, field in type(value).model_fields.items():
        here, child = f"{path}.{name}" if path else name, getattr(value, name)
        if not is_not_acted_on(field):
            yield from _set_fields(child, here)
        elif child is not None and child != (field.json_schema_extra or {}).get(_INERT):
            yield here


def unset_fields(value: Any) -> dict:
    """A pydantic ``exclude`` for every field not acted on that is None, at any depth: a
    dump without them is the same as before fleetplane had them (checkpoints, the
    http_options a running instance compares), and parses back to an equal config."""
    if isinstance(value, (list, tuple)):
        return {i: spec for i, item in enumerate(value) if (spec := unset_fields(item))}
    if not isinstance(value, BaseModel):
        return {}
    spec: dict = {}
    for name, field in type(value).model_fields.items():
        child = getattr(value, name)
        if is_not_acted_on(field):
            if child is None:
                spec[name] = True
        elif sub := unset_fields(child):
            spec[name] = sub
    return spec


def acted_on_dump(model: BaseModel) -> dict[str, Any]:
    """``model_dump`` without the fields fleetplane does not act on."""
    return model.model_dump(exclude={name for name, field in type(model).model_fields.items()
                                     if is_not_acted_on(field)})


def accepted_fields(model: type[BaseModel]) -> str:
    """The fields of ``model`` for an "unknown field" error: fleetplane's own first."""
    own = [n for n, f in model.model_fields.items() if not is_not_acted_on(f)]
    compat = [n for n, f in model.model_fields.items() if is_not_acted_on(f)]
    text = f"accepted fields: {', '.join(own)}"
    return text + (f"; also accepted from Ray Serve configs, not acted on: {', '.join(compat)}"
                   if compat else "")


# ---- Serve's nested models, for their field types -------------------------------------

class LoggingConfig(BaseModel):
    """Serve's ``LoggingConfig``; ``log_level`` as a name, as Serve normalises it."""

    model_config = _MODEL_CONFIG

    encoding: Literal["TEXT", "JSON"] = "TEXT"
    log_level: int | str = "INFO"
    logs_dir: str | None = None
    enable_access_log: bool = True
    additional_log_standard_attrs: list[str] = Field(default_factory=list)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: int | str) -> str:
        if isinstance(value, int) and value in logging._levelToName:
            return logging._levelToName[value]
        if isinstance(value, str) and value in logging._nameToLevel:
            return value
        raise _invalid(f"must be a logging level: one of {', '.join(logging._nameToLevel)}, "
                       "or its number")


class GrpcOptions(BaseModel):
    """Serve's ``gRPCOptionsSchema``: fleetplane runs no gRPC proxy."""

    model_config = _MODEL_CONFIG

    port: _Port = 9000
    grpc_servicer_functions: list[str] = Field(default_factory=list)
    request_timeout_s: _Float | None = None
    enable_reflection: bool = True


class TracingConfig(BaseModel):
    """Serve's ``TracingConfig``."""

    model_config = _MODEL_CONFIG

    enabled: bool = False
    exporter_import_path: str = ""
    sampling_ratio: _Fraction = 0.01


# ---- the fields each of config's models takes from Serve -------------------------------

class ServeDeployFields(BaseModel):
    """``ServeDeploySchema``'s fields beyond fleetplane's."""

    proxy_location: Literal["Disabled", "HeadOnly", "EveryNode", "NoServer"] | None = \
        not_acted_on("Where Serve runs proxies; fleetplane runs them on every node.",
                     inert="EveryNode")
    grpc_options: GrpcOptions | None = not_acted_on("Serve's gRPC proxy options.")
    logging_config: LoggingConfig | None = not_acted_on("Logging of Serve's components.")
    tracing_config: TracingConfig | None = not_acted_on("Tracing of Serve's components.")
    target_capacity: _Percent | None = not_acted_on(
        "Percentage of every deployment's replicas to run.", inert=100)


class ServeHTTPFields(BaseModel):
    """``HTTPOptionsSchema``'s fields beyond fleetplane's, and ``middlewares`` (of
    ``serve.config.HTTPOptions``; Serve's deploy schema drops it without a word)."""

    root_path: str | None = not_acted_on("ASGI root path the applications are mounted at.")
    request_timeout_s: _Float | None = not_acted_on("Timeout of an HTTP request.")
    ssl_keyfile: str | None = not_acted_on("SSL key file for HTTPS.")
    ssl_certfile: str | None = not_acted_on("SSL certificate file for HTTPS.",
                                            validate_default=True)
    ssl_keyfile_password: str | None = not_acted_on("Password of the SSL key file.")
    ssl_ca_certs: str | None = not_acted_on("CA certificates to verify clients with.")
    middlewares: _JsonList | None = not_acted_on("ASGI middlewares of the proxy.")

    @field_validator("ssl_certfile")
    @classmethod
    def _ssl_files_together(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Serve's check (validate_ssl_config), here on either file missing.
        if bool(value) != bool(info.data.get("ssl_keyfile")):
            raise _invalid("set both ssl_keyfile and ssl_certfile, or neither")
        return value


class ServeControllerFields(BaseModel):
    """Serve's ``ControllerOptions``: the controller's ``runtime_env``, ``env_vars`` only."""

    runtime_env: dict[str, dict[str, str]] | None = not_acted_on(
        "runtime_env of the controller actor; only env_vars.")

    @field_validator("runtime_env", mode="before")
    @classmethod
    def _only_env_vars(cls, value: Any) -> Any:
        # Before the type check, so a 'pip' list is named as the wrong key, not a wrong type.
        if isinstance(value, dict) and set(value) - {"env_vars"}:
            raise _invalid("only env_vars is supported in the controller's runtime_env; a "
                           "replica's runtime_env belongs in its application or deployment")
        return value


class ServeApplicationFields(BaseModel):
    """``ServeApplicationSchema``'s fields beyond fleetplane's (``host`` and ``port``
    are left out: Serve's deploy schema refuses them in an application too)."""

    autoscaling_policy: _Json | None = not_acted_on("Application-level autoscaling policy.")
    logging_config: LoggingConfig | None = not_acted_on("Logging of the application.")
    external_scaler_enabled: bool | None = not_acted_on(
        "An external autoscaler sizes the deployments.", inert=False)


class ServeDeploymentFields(BaseModel):
    """``DeploymentSchema``'s fields beyond fleetplane's (its ``num_replicas: auto`` is
    acted on, in ``schema.DeploymentConfig``)."""

    graceful_shutdown_wait_loop_s: _NonNeg | None = not_acted_on(
        "Seconds between a stopping replica's checks for ongoing requests.")
    placement_group_bundles: list[dict[str, _NonNeg]] | None = not_acted_on(
        "Placement group bundles of each replica.")
    placement_group_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None \
        = not_acted_on("Strategy of the replica placement group.")
    placement_group_bundle_label_selector: list[dict[str, str]] | None = not_acted_on(
        "Label selectors of the placement group bundles.")
    max_replicas_per_node: _PerNode | None = not_acted_on(
        "Most replicas of this deployment on one node.")
    logging_config: LoggingConfig | None = not_acted_on("Logging of the replicas.")
    gang_scheduling_config: _Json | None = not_acted_on("Gang scheduling of replicas.")
    deployment_actors: list[_Json] | None = not_acted_on("Deployment-scoped actors.")
    rolling_update_percentage: _PositiveFraction | None = not_acted_on(
        "Fraction of replicas updated at a time.")
    max_surge_percent: _WholePercent | None = not_acted_on(
        "Extra replicas during a rolling update, in percent.")


class ServeAutoscalingFields(BaseModel):
    """Serve's ``AutoscalingConfig`` tuning knobs beyond fleetplane's policy."""

    metrics_interval_s: _Pos | None = not_acted_on("How often load is reported (deprecated).")
    smoothing_factor: _Pos | None = not_acted_on("Gain of each decision (deprecated).")
    upscale_smoothing_factor: _Pos | None = not_acted_on("Upscaling gain (deprecated).")
    downscale_smoothing_factor: _Pos | None = not_acted_on("Downscaling gain (deprecated).")
    upscaling_factor: _Pos | None = not_acted_on("Gain of each upscaling decision.")
    downscaling_factor: _Pos | None = not_acted_on("Gain of each downscaling decision.")
    aggregation_function: Literal["mean", "max", "min"] | None = not_acted_on(
        "How load is aggregated over the look-back window.", inert="mean")
    policy: _Json | None = not_acted_on("A custom autoscaling policy.")

    @field_validator("aggregation_function", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value  # as Serve reads it
