"""The shape of the control plane, read from the source (no import runs): small objects
composed by concept, not one object every capability lands in.

- a stateful class holds at most ``MAX_FIELDS`` fields, and a deployment's conductor
  (``DeploymentState``) at most ``MAX_CONDUCTOR_FIELDS``: a concern that needs more is an
  owner of its own. Records and messages (``NamedTuple``, frozen dataclasses, pydantic
  models, enums, exceptions) are data, not state holders, and are not counted;
- no mixins: a first-party base class reads only what it defines itself (a mixin reads
  its host's fields with nothing checking the contract), and no class takes behaviour from
  two first-party bases; pydantic models composing field groups aside;
- ``controlplane/`` has at most ``MAX_TOP_MODULES`` top-level modules: the rest live in
  the packages that name their concern.

A field is an instance attribute the class assigns anywhere (``self.x = ...``, annotated or
augmented, in any method), or a non-frozen dataclass's declared field.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROL_PLANE = ROOT / "controlplane"
MAX_FIELDS = 15
MAX_CONDUCTOR_FIELDS = 12
MAX_TOP_MODULES = 20
_RECORD_BASES = ("NamedTuple", "BaseModel", "Enum", "Exception", "Error", "Protocol",
                 "LookupError", "ValueError", "RuntimeError")


def _classes() -> list[tuple[Path, ast.ClassDef]]:
    return [(path, node) for path in sorted(CONTROL_PLANE.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ClassDef)]


def _is_record(cls: ast.ClassDef, records: set[str]) -> bool:
    bases = [ast.unparse(b) for b in cls.bases]
    if any(b.endswith(_RECORD_BASES) or b in records for b in bases):
        return True
    return any("dataclass" in ast.unparse(d) and "frozen=True" in ast.unparse(d)
               for d in cls.decorator_list)


def _records(classes: list[tuple[Path, ast.ClassDef]]) -> set[str]:
    """Names of record classes, with the first-party classes derived from them."""
    records: set[str] = set()
    while True:
        more = {c.name for _, c in classes if _is_record(c, records)} - records
        if not more:
            return records
        records |= more


def fields(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            names |= {e.attr for e in ast.walk(target) if isinstance(e, ast.Attribute)
                      and isinstance(e.value, ast.Name) and e.value.id == "self"}
    if any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
        names |= {s.target.id for s in cls.body
                  if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return names


CLASSES = _classes()
RECORDS = _records(CLASSES)


def test_the_rules_read_fields_as_a_reader_would() -> None:
    cls = ast.parse("class C:\n    def __init__(self):\n        self.a, self.b = 1, 2\n"
                    "        self.c: int = 3\n    def f(self):\n        self.d += 1\n"
                    "        other.e = 1\n").body[0]
    assert fields(cls) == {"a", "b", "c", "d"}
    assert "DeploymentState" in {c.name for _, c in CLASSES} and "ReplicaRecord" in RECORDS


def test_no_stateful_class_holds_more_than_its_share_of_fields() -> None:
    over = []
    for path, cls in CLASSES:
        if cls.name in RECORDS:
            continue
        limit = MAX_CONDUCTOR_FIELDS if cls.name == "DeploymentState" else MAX_FIELDS
        if len(fields(cls)) > limit:
            over.append(f"{path.relative_to(ROOT)}:{cls.name} {len(fields(cls))} > {limit}")
    assert over == []


def _defined(cls: ast.ClassDef) -> set[str]:
    """What a class defines for itself: its methods, class attributes and fields."""
    names = fields(cls)
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target)
                      if isinstance(n, ast.Name)}
    return names


def _reads(cls: ast.ClassDef) -> set[str]:
    return {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _borrowed(cls: ast.ClassDef, by_name: dict[str, ast.ClassDef]) -> set[str]:
    """What ``cls`` reads from ``self`` that neither it nor its first-party bases define."""
    defined, todo = set(), [cls]
    while todo:
        current = todo.pop()
        defined |= _defined(current)
        todo += [by_name[ast.unparse(b)] for b in current.bases if ast.unparse(b) in by_name]
    return _reads(cls) - defined


def test_no_mixins() -> None:
    by_name = {c.name: c for _, c in CLASSES}
    bases = {ast.unparse(b) for _, c in CLASSES if c.name not in RECORDS for b in c.bases}
    borrowing = {name: sorted(_borrowed(by_name[name], by_name)) for name in sorted(bases)
                 if name in by_name and name not in RECORDS}
    assert {name: reads for name, reads in borrowing.items() if reads} == {}
    mixed = [f"{path.relative_to(ROOT)}:{cls.name}" for path, cls in CLASSES
             if cls.name not in RECORDS
             and sum(ast.unparse(b) in by_name for b in cls.bases) > 1]
    assert mixed == []


def test_the_mixin_rule_sees_a_mixin() -> None:
    module = ast.parse("class Mixin:\n    def started(self):\n        self.count += 1\n"
                       "        return self.replicas.get(1)\n"
                       "class Host(Mixin):\n    def __init__(self):\n        self.replicas = {}\n")
    mixin, host = module.body
    assert _borrowed(mixin, {"Mixin": mixin, "Host": host}) == {"replicas"}


def test_the_control_plane_keeps_few_top_level_modules() -> None:
    top = sorted(p.name for p in CONTROL_PLANE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, top
