"""The shape of a ``runtime_env``: the type of each field Ray knows, checked at the edge.

Ray checks a runtime_env only when it starts a worker with it (the build task, or a
replica), where a wrong type surfaces late and as Ray's traceback. Here each field Ray
documents (``ray.runtime_env.RuntimeEnv``) gets its type, so ``env_vars: [A=1]`` is a
config error naming ``runtime_env.env_vars``. Keys Ray does not know are kept (runtime_env
plugins take their own), and the value is kept as written: the check never rewrites it.

What is not checked here: whether a local ``working_dir`` or ``py_modules`` path exists. The
config is parsed by the CLI and again by the controller, each in its own directory, while
Ray resolves a local path where the build runs; a missing one fails that build, naming
the application, and nothing is changed.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, ValidationError, WrapValidator, with_config
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict


def _one_of(expected: str) -> WrapValidator:
    """One error for a union of shapes, not one per member."""

    def check(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("fleetplane_invalid", "{detail}",
                                      {"detail": f"must be {expected}"}) from None

    return WrapValidator(check)


_Requirements = Annotated[
    list[str] | str | dict[str, Any],
    _one_of("a list of requirements, the path of a requirements file, or a mapping with "
            "'packages'")]
_Conda = Annotated[str | dict[str, Any],
                   _one_of("the name of a conda environment, the path of an environment "
                           "file, or an environment as a mapping")]


@with_config(ConfigDict(extra="allow"))
class RuntimeEnvShape(TypedDict, total=False):
    """The fields of Ray 2.60's ``RuntimeEnv`` with the types Ray takes from a config."""

    working_dir: str  # a local directory or a remote URI (s3://, gs://, https://...zip)
    py_modules: list[str]
    py_executable: str
    excludes: list[str]
    pip: _Requirements
    uv: _Requirements
    conda: _Conda
    env_vars: dict[str, str]
    container: dict[str, Any]
    image_uri: str
    java_jars: list[str]
    config: dict[str, Any]
    worker_process_setup_hook: str


def _keep_as_written(value: Any, handler: Any) -> Any:
    handler(value)  # raises, naming the field, when a known field has the wrong type
    return value


# A runtime_env field's type: a mapping whose known fields have Ray's types.
RuntimeEnvField = Annotated[RuntimeEnvShape, WrapValidator(_keep_as_written)]
