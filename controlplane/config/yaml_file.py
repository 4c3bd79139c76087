"""Reading a deploy config file: YAML, refused before it can hurt.

Owns ``read_yaml_file``: the file's data, or a ``ConfigError`` with one line naming the
problem and where it is. Refused, each before it is expanded or built:

- a file over ``MAX_CONFIG_BYTES`` (1 MiB: a deploy config is a few KiB);
- a duplicate key in a mapping (YAML's "last one wins" silently drops the first), named
  with both lines;
- nesting deeper than ``MAX_DEPTH`` (a 5,000-deep file raised RecursionError before);
- anchors and aliases that expand past ``MAX_EXPANDED_NODES`` nodes (an alias bomb: its
  composed graph is small, but whatever walks the data expands it; the expanded size is
  counted as nodes are composed, from the sizes of the anchored nodes).
"""

from __future__ import annotations

import re

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from controlplane.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 100
MAX_EXPANDED_NODES = 1_000_000
_FILE = "<file>"


class _Refused(yaml.YAMLError):
    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message, self.mark = message, mark

    def __str__(self) -> str:
        where = f" at line {self.mark.line + 1}" if self.mark is not None else ""
        return f"{self.message}{where}"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that counts depth and expanded size while composing, and refuses
    duplicate keys while constructing."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it expands to

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is not None and id(node) not in self._sizes:
            self._sizes[id(node)] = size = 1 + sum(self._sizes.get(id(c), 1)
                                                   for c in _children(node))
            if size > MAX_EXPANDED_NODES:
                raise _Refused(f"anchors and aliases expand to more than {MAX_EXPANDED_NODES:,} "
                               "values (an alias bomb?)", node.start_mark)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in first:
                raise _Refused(f"duplicate key {key!r} (first at line {first[key]})",
                               key_node.start_mark)
            first[key] = line
        return super().construct_mapping(node, deep)


# YAML 1.1 (PyYAML) reads "1e-09", "5e3" or "1.5e3" as text: its floats need a dot and a
# signed exponent. YAML 1.2 and JSON read them as numbers, as a user writing a config
# expects; so does this loader.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return node.value
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def read_yaml_file(source: str) -> Any:
    """The data in the YAML file ``source``; ConfigError (one line) when it cannot be."""
    try:
        with open(source, "rb") as stream:  # bytes: let YAML detect the encoding
            data = stream.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(source, [f"{_FILE}: no such file: {source}"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"{_FILE}: cannot read {source}: {exc.strerror or exc}"]) from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(source, [f"{_FILE}: {source} is over {MAX_CONFIG_BYTES // 1024} KiB; "
                                   "a deploy config this large is refused unread"])
    try:
        return yaml.load(data, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except _Refused as exc:
        raise ConfigError(source, [f"{_FILE}: {exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"{_FILE}: {yaml_problem(exc)}"]) from exc
    except (RecursionError, MemoryError) as exc:
        raise ConfigError(source, [f"{_FILE}: the YAML is too deep or too large to read "
                                   f"({type(exc).__name__})"]) from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return f"invalid YAML: {exc}"
    what = "; ".join(p for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
    # Marks count from 0; editors count from 1.
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {what or exc}"
