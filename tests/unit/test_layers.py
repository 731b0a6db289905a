"""The layers only look down (docs/design.md "Layout"): what configures, judges and stores a run never
imports what executes it, and nothing in the library imports the CLI. Every import counts: at module level,
inside functions, and under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "evalgate"

# package -> the packages it must never import
FORBIDDEN = {
    "configuration": ("execution", "judgement", "store", "reports", "bisect", "cli"),
    "judgement": ("execution", "reports", "bisect", "cli"),
    "store": ("execution", "judgement", "reports", "bisect", "cli"),
    "probes": ("execution", "judgement", "store", "reports", "bisect", "cli"),
    "records": ("execution", "judgement", "store", "reports", "bisect", "cli", "configuration"),
    "owners": ("execution", "judgement", "store", "reports", "bisect", "cli", "configuration"),
    "execution": ("judgement", "reports", "bisect", "cli"),
}
LIBRARY_WIDE = ("cli",)  # no module outside evalgate/cli imports the CLI


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


def test_the_resolver_sees_relative_and_function_level_imports():
    names = imported(PACKAGE / "store" / "runs.py")
    assert {"evalgate.owners.current_owner", "evalgate.store.listing", "evalgate.fingerprint"} <= names
    # a function-level import (store/listing.py reads the owner's liveness only when it must)
    assert "evalgate.owners.owner_alive" in imported(PACKAGE / "store" / "listing.py")


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_layers_only_look_down(path):
    own = layer_of(module_name(path))
    banned = set(FORBIDDEN.get(own, ())) | (set() if own in ("cli", "__main__") else set(LIBRARY_WIDE))
    wrong = sorted(m for m in imported(path) if layer_of(m) in banned and layer_of(m) != own)
    assert not wrong, f"{path.relative_to(PACKAGE.parent)} ({own}) imports {wrong}"
