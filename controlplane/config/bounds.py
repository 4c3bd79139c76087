"""The limits of the deploy config: every bound on a number, the shape of a route prefix,
the size and depth of a free-form JSON value, named once here and said in each error.

``schema`` and ``serve_compat`` build their fields from these types, and options set in
code go through the same models (``schema.check_deployment_options``), so a
``serve.deployment(...)`` argument meets the same checks as a line of YAML.

Invariants:
- A number field takes an int or a float, never a bool (YAML's ``true`` is not 1) nor a
  string; an integer field takes a float only when it is whole (``3.0``). NaN and
  infinity are out of every range.
- A range error names the range and its unit; ``schema`` renders it as
  ``field.path: out of range; use a value from 0.1 to 86400 seconds (got: 1e-09)``.
- Nothing here imports ``schema`` or ``serve_compat`` (both import this).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

# ---- the bounds, in one table ----------------------------------------------------------

DAY_S = 86_400  # the longest period, timeout or delay: past a day it is a typo, not a plan
MIN_HEALTH_CHECK_S = 0.1  # a faster check costs a replica more than the requests it serves
# Per deployment: a deployment lives on one shard, measured to 32K replicas (MEASURED.md,
# "The control plane at scale"); the bound leaves room above that and refuses a slip of
# the keyboard.
MAX_REPLICAS = 100_000
MAX_ONGOING_REQUESTS = 1_000_000  # per replica
MAX_QUEUED_REQUESTS = 1_000_000  # per router; -1 still means unlimited
MAX_CPUS = 1024  # per replica
MAX_GPUS = 1024  # per replica
# Ray keeps resource amounts as int64 in units of 1/10000 (ray._raylet.RESOURCE_UNIT_SCALING):
# 2**48 bytes (256 TiB) times 10**4 stays below 2**63; 2**50 would not.
MAX_MEMORY_BYTES = 2**48
MAX_CUSTOM_RESOURCE = 1_000_000_000  # per replica, of any custom resource
MIN_RESOURCE = 0.0001  # Ray refuses a nonzero amount below its unit (ray_option_utils)
MAX_SHARDS = 64  # controller_options.num_shards
MAX_BUILD_TIMEOUT_S = 3600  # controller_options.build_timeout_s: an import that takes an hour hangs
MAX_USER_CONFIG_BYTES = 1 << 20  # user_config as JSON: it travels in every reconfigure()
MAX_JSON_DEPTH = 64  # nesting of user_config, args, runtime_env: deeper is refused, not recursed

_RANGE = "fleetplane_out_of_range"
_NOT_A_NUMBER = "fleetplane_not_a_number"
_TOO_LARGE = "fleetplane_too_large"


def _error(kind: str, detail: str) -> PydanticCustomError:
    # The detail goes through ctx, not the template, so braces are not format placeholders.
    return PydanticCustomError(kind, "{detail}", {"detail": detail})


def _show(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


@dataclass(frozen=True)
class Bound:
    """The values a number field takes: ``low``..``high`` (None: no bound on that side),
    ``low`` itself refused when ``above``; with ``zero_or``, 0 too (a resource amount)."""

    low: float | None = None
    high: float | None = None
    unit: str = ""
    integer: bool = False
    above: bool = False
    zero_or: bool = False

    def allows(self, value: float) -> bool:
        try:  # an int too large for a float is out of every range
            finite = math.isfinite(value)
        except OverflowError:
            return False
        if not finite:
            return False
        if self.zero_or and value == 0:
            return True
        low_ok = self.low is None or (value > self.low if self.above else value >= self.low)
        return low_ok and (self.high is None or value <= self.high)

    def describe(self) -> str:
        """The range in words, e.g. 'a value from 0.1 to 86400 seconds'."""
        unit = f" {self.unit}" if self.unit else ""
        zero = "0 or " if self.zero_or else ""
        if self.low is None and self.high is None:
            return f"a finite number{unit}"
        if self.high is None:
            side = "above" if self.above else "of at least"
            return f"{zero}a value {side} {_show(self.low)}{unit}"
        if self.low is None:
            return f"{zero}a value of at most {_show(self.high)}{unit}"
        if self.above:
            return f"{zero}a value above {_show(self.low)} and up to {_show(self.high)}{unit}"
        return f"{zero}a value from {_show(self.low)} to {_show(self.high)}{unit}"


def check_number(bound: Bound, value: Any) -> int | float:
    """``value`` as the number ``bound`` takes, or a pydantic error saying what to use."""
    if isinstance(value, bool):
        raise _error(_NOT_A_NUMBER, f"must be a number, not true or false; use "
                                    f"{bound.describe()}")
    if isinstance(value, float) and bound.integer and math.isfinite(value):
        if not value.is_integer():
            raise _error(_NOT_A_NUMBER, f"must be a whole number; use {bound.describe()}")
        value = int(value)
    if isinstance(value, str) and _looks_numeric(value):
        raise _error(_NOT_A_NUMBER, f"must be a number, not text; {_unquote_hint(value)}")
    if not isinstance(value, (int, float)):
        raise _error(_NOT_A_NUMBER, f"must be a number; use {bound.describe()}")
    if not bound.allows(value):
        raise _error(_RANGE, f"out of range; use {bound.describe()}")
    return int(value) if bound.integer else float(value)


def _looks_numeric(text: str) -> bool:
    try:
        return math.isfinite(float(text))  # not 'nan' or 'inf': no unquoting makes those fit
    except ValueError:
        return False


def _unquote_hint(text: str) -> str:
    # An unquoted 1e-09 is a number (``yaml_file`` reads exponents as YAML 1.2 does).
    return f"write {text.strip()} without quotes"


def number(bound: Bound) -> Any:
    """The annotated type of a field that takes the numbers of ``bound``."""
    return Annotated[int if bound.integer else float, BeforeValidator(partial(check_number, bound))]


def seconds(low: float, high: float = DAY_S, *, above: bool = False) -> Any:
    return number(Bound(low, high, "seconds", above=above))


def count(low: int, high: int, unit: str) -> Any:
    return number(Bound(low, high, unit, integer=True))


def amount(high: float, unit: str = "") -> Any:
    """A resource amount: 0, or Ray's smallest unit up to ``high``."""
    return number(Bound(MIN_RESOURCE, high, unit, zero_or=True))


# The types config's models use.
HealthCheckSeconds = seconds(MIN_HEALTH_CHECK_S)
DelaySeconds = seconds(0)  # 0 allowed: act at once
PeriodSeconds = seconds(0, above=True)  # 0 would divide by zero or never end
REPLICAS = Bound(0, MAX_REPLICAS, "replicas", integer=True)
Replicas = number(REPLICAS)
AtLeastOneReplica = count(1, MAX_REPLICAS, "replicas")
OngoingRequests = count(1, MAX_ONGOING_REQUESTS, "requests")
QueuedRequests = count(-1, MAX_QUEUED_REQUESTS, "requests (-1: unlimited)")
TargetOngoingRequests = number(Bound(0, MAX_ONGOING_REQUESTS, "requests", above=True))
Cpus = amount(MAX_CPUS, "CPUs")
Gpus = amount(MAX_GPUS, "GPUs")
MemoryBytes = count(0, MAX_MEMORY_BYTES, "bytes")
CustomResource = amount(MAX_CUSTOM_RESOURCE)
Shards = count(1, MAX_SHARDS, "shards")
BuildTimeoutSeconds = seconds(1, MAX_BUILD_TIMEOUT_S)
StartSeconds = seconds(1)  # a replica's start deadline: up to a day
Fraction = number(Bound(0, 1, "", above=True))  # (0, 1]
# Any finite number, no bool: for fields of Ray Serve's schema fleetplane does not act on.
FiniteFloat = number(Bound())
NonNegativeFloat = number(Bound(0))
PositiveFloat = number(Bound(0, above=True))


# ---- route prefixes ------------------------------------------------------------------------

# '?' and '#' end a path; '%' and '\\' escape (so '%2e%2e' could hide '..'); Serve refuses
# '{' and '}' (wildcards, ray.serve._private.utils.validate_route_prefix).
_NOT_IN_PATH = frozenset("?#%\\{}")


def route_prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` is not a clean URL path ('/' or '/a/b'), or None when it is one."""
    if prefix == "/":
        return None
    if not prefix.startswith("/") or prefix.endswith("/"):
        return "route_prefix must start with '/' and not end with '/' (or be exactly '/')"
    bad = sorted({c for c in prefix if c in _NOT_IN_PATH or c.isspace() or not c.isprintable()})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        return (f"route_prefix must be a plain URL path: no query ('?'), fragment ('#'), "
                f"escape ('%', '\\'), wildcard ('{{', '}}'), whitespace or control "
                f"characters (found {shown})")
    segments = prefix[1:].split("/")
    if "" in segments:
        return "route_prefix must not contain '//' (an empty path segment)"
    if "." in segments or ".." in segments:
        return "route_prefix must not contain '.' or '..' segments; write the path they stand for"
    return None


# ---- free-form JSON values ---------------------------------------------------------------

def check_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse ``value`` when lists and dicts nest deeper than ``limit``; walks without
    recursion, so a 100,000-deep value is refused, not a RecursionError."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list, tuple)):
            continue
        if depth > limit:
            raise _error(_TOO_LARGE, f"nested more than {limit} levels deep; flatten it")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)


def check_user_config_size(value: Any) -> Any:
    """Refuse a user_config (already JSON-ready) larger than ``MAX_USER_CONFIG_BYTES``."""
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > MAX_USER_CONFIG_BYTES:
        raise _error(_TOO_LARGE, f"is {_bytes(size)} as JSON, over the limit of "
                                 f"{_bytes(MAX_USER_CONFIG_BYTES)}; pass large data by "
                                 f"reference (a path or URL) instead")
    return value


def _bytes(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size / 1024:.1f} KiB"
