"""The store (docs/storage.md): one module per concern, joined in evalgate/store/store.py.

Its names are imported on first use (PEP 562): `evalgate.store.listing`, what `runs list` and `baseline
list` read, needs SQLAlchemy Core only, and importing it must not import the ORM models with it."""

from __future__ import annotations

from importlib import import_module

_WHERE = {"BASELINE_RESCORING": "loaded", "OWN_RESCORING": "loaded", "RunRecord": "loaded", "Run": "models",
          "OutputWriter": "runs",
          "display_status": "listing", "Store": "store", "existing_store": "store", "open_store": "store"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_WHERE[name]}", __name__), name)
