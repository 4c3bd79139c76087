"""The import layering of the packages, read from the source (no import runs).

- the kernel (``wire``, ``errors``, ``clock``, ``settings``, ``priority``) imports nothing
  of ours beyond the kernel;
- ``controlplane.routing`` (the process-local data plane) uses only the kernel and itself;
- ``replicas`` reaches the control plane only through the kernel and the routing package;
- ``controlplane`` never imports ``replicas`` or ``fleetplane`` (the CLI, which composes
  both), so no two packages depend on each other.

Imports inside functions count the same as those at the top of a module.
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


def _imports(path: Path) -> set[str]:
    """First-party modules a file imports (``from a import b`` counts as ``a``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {n for n in names if n.split(".")[0] in FIRST_PARTY}


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


ALL = {name: path for pkg in FIRST_PARTY for name, path in _modules(pkg).items()}


def _violations(importers: tuple[str, ...], allowed: tuple[str, ...],
                watched: tuple[str, ...] = FIRST_PARTY) -> list[str]:
    """``importer -> imported`` for imports of ``watched`` modules outside ``allowed``."""
    return sorted(f"{name} -> {dep}" for name, path in ALL.items() if _within(name, importers)
                  for dep in _imports(path)
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
