"""The layers only look down (docs/design.md "Layout"): what configures, judges and stores a run never
imports what executes it, and nothing in the library imports the CLI. Every import counts: at module level,
inside functions, and under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "evalgate"

# The floors, ground first: a module imports its own floor and the floors below, never one above. A package
# or top-level module not listed here fails `test_every_package_has_a_floor`.
FLOORS = (
    ("errors", "hashing", "registry", "owners", "collector", "processes", "hub_cache", "atomic", "timings", "codec", "fingerprint",
     "records", "kernels"),
    ("configuration",),
    ("engines", "lmeval", "models"),
    ("probes",),
    ("store",),
    ("execution",),
    ("judgement",),
    ("reports",),
    ("gate", "baselines", "survey", "cost", "scaffold", "fetch"),
    ("bisect", "pytest_plugin"),
    ("cli", "__main__"),
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}
MODULES = {p: None for p in sorted(PACKAGE.rglob("*.py"))}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every evalgate module `path` imports, relative imports resolved."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names}
    return {name for name in found if name == "evalgate" or name.startswith("evalgate.")}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def as_module(name: str, known: set[str]) -> str | None:
    """The evalgate module an imported name is in (`evalgate.store.listing.when` -> `evalgate.store.listing`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def test_the_resolver_sees_relative_and_function_level_imports():
    names = imported(PACKAGE / "store" / "runs.py")
    assert {"evalgate.owners.current_owner", "evalgate.store.loaded", "evalgate.fingerprint"} <= names
    # a function-level import (store/listing.py reads the owner's liveness only when it must)
    assert "evalgate.owners.owner_alive" in imported(PACKAGE / "store" / "listing.py")


def test_every_package_has_a_floor():
    found = {layer_of(module_name(p)) for p in MODULES} - {None, "__init__", "__version__"}
    assert found <= set(FLOOR), f"give {sorted(found - set(FLOOR))} a floor in FLOORS"


@pytest.mark.parametrize("path", sorted(MODULES), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_layers_only_look_down(path):
    own = layer_of(module_name(path))
    wrong = sorted(m for m in imported(path) if layer_of(m) in FLOOR and FLOOR[layer_of(m)] > FLOOR.get(own, -1))
    assert not wrong, f"{path.relative_to(PACKAGE.parent)} ({own}) imports {wrong}"


def test_no_import_circles():
    """No circle among the modules, counting every import (module level, in functions, TYPE_CHECKING)."""
    known = {module_name(p) for p in MODULES}
    graph = {module_name(p): {m for m in (as_module(n, known) for n in imported(p)) if m and m != module_name(p)}
             for p in MODULES}
    # a package's __init__ re-exports its modules: an edge into a package is an edge into what it names
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles[:5])


@pytest.mark.parametrize("layer", ["configuration", "store", "judgement"])
def test_what_configures_stores_and_judges_a_run_never_imports_what_executes_it(layer):
    """The module docstring's rule, which the floors alone allow (execution/ is below judgement/): a judgement
    reads stored runs, never the runner (Timings lives on the ground floor for that)."""
    wrong = {str(p.relative_to(PACKAGE.parent)): sorted(m for m in imported(p) if layer_of(m) == "execution")
             for p in MODULES if layer_of(module_name(p)) == layer}
    assert not {path: names for path, names in wrong.items() if names}
