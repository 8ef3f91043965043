"""The house plan (docs/architecture.md): every import in agentenv runs down a floor.

Every import statement counts, also those inside functions or under TYPE_CHECKING: a
lazy import still ties two packages together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agentenv

ROOT = Path(agentenv.__file__).parent

# Lowest first. A unit is a top-level package or module of agentenv, or a room of runtime/.
FLOORS: list[tuple[str, set[str]]] = [
    ("ground", {"config", "errors", "observe", "wire", "crashpoints"}),
    ("host resources", {"vmm", "guest", "storage", "net"}),
    ("state store", {"state"}),
    ("images, volumes and credentials", {"images", "volumes", "credentials"}),
    ("runtime: one machine, memory accounting", {"runtime.machine", "runtime.memory"}),
    ("runtime: sandboxes", {"runtime.sandboxes"}),
    ("runtime: snapshots", {"runtime.snapshots"}),
    ("runtime: node", {"runtime.node"}),
    ("data plane", {"proxy"}),
    ("operator console", {"console"}),
    ("API", {"api"}),
    ("control plane", {"control"}),
    ("entry points", {"cli", "cluster", "server"}),
]
FLOOR_OF = {unit: level for level, (_, units) in enumerate(FLOORS) for unit in units}
# Copied into the guest as packages of their own: each may import nothing else of agentenv.
ISLANDS = ["guest.agent", "guest.interpreter"]


def unit_of(module: str) -> str:
    """`agentenv.runtime.sandboxes.manager` -> `runtime.sandboxes`; `agentenv.api.x` -> `api`."""
    parts = module.split(".")[1:] or [""]
    depth = 2 if parts[:1] == ["runtime"] and len(parts) > 1 else 1
    return ".".join(parts[:depth])


def module_of(path: Path) -> str:
    parts = ("agentenv", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.parent.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports_in(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module) of every agentenv import in one module's source."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                # `from .. import node` imports the module runtime.node, not runtime.
                name = f"{target}.{alias.name}"
                found.append((node.lineno, name if is_module(name) else target))
    return [(line, target) for line, target in found if target.startswith("agentenv.")]


def imports_of(path: Path) -> list[tuple[int, str]]:
    return imports_in(path.read_text(), module_of(path), path.name == "__init__.py")


def sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_unit_has_a_floor() -> None:
    units = {unit_of(module_of(p)) for p in sources()} - {"", "runtime"}
    assert units - set(FLOOR_OF) == set(), "place the new package on a floor"


def test_imports_run_down_the_floors() -> None:
    wrong = []
    for path in sources():
        here = unit_of(module_of(path))
        if here not in FLOOR_OF:
            continue
        for line, target in imports_of(path):
            there = unit_of(target)
            if there == here or target == "agentenv":
                continue
            if FLOOR_OF.get(there, len(FLOORS)) >= FLOOR_OF[here]:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line} {here} -> {there}")
    assert wrong == []


@pytest.mark.parametrize("island", ISLANDS)
def test_a_guest_package_imports_only_itself(island: str) -> None:
    package = ROOT.joinpath(*island.split("."))
    outside = [
        f"{path.relative_to(ROOT.parent)}:{line} {target}"
        for path in sorted(package.rglob("*.py"))
        for line, target in imports_of(path)
        if not target.startswith(f"agentenv.{island}")
    ]
    assert outside == []


def test_the_check_sees_an_upward_import() -> None:
    """Relative imports resolve, inside functions too: a room reaching up to the API is seen."""
    source = "def f():\n    from ...api import app\n    from .. import node\n"
    found = imports_in(source, "agentenv.runtime.sandboxes.probe", is_package=False)
    assert [(line, unit_of(t)) for line, t in found] == [(2, "api"), (3, "runtime.node")]
