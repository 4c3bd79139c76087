"""The import layering of the packages, read from the source (no import runs).

- the kernel (``wire``, ``errors``, ``clock``, ``settings``, ``priority``) imports nothing
  of ours beyond the kernel;
- ``controlplane.routing`` (the process-local data plane) uses only the kernel and itself;
- ``replicas`` reaches the control plane only through the kernel and the routing package;
- ``controlplane`` never imports ``replicas`` or ``fleetplane`` (the CLI, which composes
  both), so no two packages depend on each other;
- no module imports itself through others: the first-party import graph has no cycle.

Imports inside functions and under ``TYPE_CHECKING`` count the same as those at the top
of a module; ``from package import module`` is an import of that module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("controlplane", "replicas", "fleetplane")
KERNEL = ("controlplane.wire", "controlplane.errors", "controlplane.clock",
          "controlplane.settings", "controlplane.priority")
ROUTING = "controlplane.routing"


def _modules(package: str) -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, name: str = "") -> set[str]:
    """First-party modules a file imports: ``from a import b`` counts as ``a.b`` when that
    is a module, else as ``a``; relative imports are resolved against ``name``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, name, path.name == "__init__.py")
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                names.add(sub if sub in ALL else module)
    return {n for n in names if n.split(".")[0] in FIRST_PARTY}


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (its strongly connected components of more than one
    module, or a module importing itself), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


ALL = {name: path for pkg in FIRST_PARTY for name, path in _modules(pkg).items()}
GRAPH = {name: _imports(path, name) for name, path in ALL.items()}


def _violations(importers: tuple[str, ...], allowed: tuple[str, ...],
                watched: tuple[str, ...] = FIRST_PARTY) -> list[str]:
    """``importer -> imported`` for imports of ``watched`` modules outside ``allowed``."""
    return sorted(f"{name} -> {dep}" for name in ALL if _within(name, importers)
                  for dep in GRAPH[name]
                  if _within(dep, watched) and not _within(dep, allowed))


def test_the_packages_are_found() -> None:
    assert {"controlplane.wire", "controlplane.routing.router", "replicas.replica",
            "fleetplane.cli"} <= set(ALL)


def test_the_kernel_imports_only_the_kernel() -> None:
    assert _violations(KERNEL, KERNEL) == []


def test_routing_uses_only_the_kernel_and_itself() -> None:
    assert _violations((ROUTING,), (*KERNEL, ROUTING)) == []


def test_replicas_reach_the_control_plane_only_through_wire_routing_and_kernel() -> None:
    assert _violations(("replicas",), (*KERNEL, ROUTING), watched=("controlplane",)) == []


@pytest.mark.parametrize("other", ["replicas", "fleetplane"])
def test_the_control_plane_never_imports(other: str) -> None:
    assert _violations(("controlplane",), (), watched=(other,)) == []


def test_the_rules_catch_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from replicas.replica import Replica\n")
    assert _imports(bad) == {"replicas.replica"}


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_the_cycle_rule_sees_every_import_form(tmp_path: Path) -> None:
    typed = tmp_path / "typed.py"
    typed.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from controlplane.deployment import state\n")
    local = tmp_path / "local.py"
    local.write_text("def f():\n    import controlplane.shard\n")
    assert _imports(typed) == {"controlplane.deployment.state"}
    assert _imports(local) == {"controlplane.shard"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}, "b": set()}) == [["a"]]
