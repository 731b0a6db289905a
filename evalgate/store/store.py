"""The store: runs, fingerprints, token-level outputs, verdicts, baseline pointers, lm-eval metrics, cost
results and bisect trials (docs/storage.md). `Store` joins one class per concern; `open_store` opens
(and migrates) a database once per URL per process.
"""

from __future__ import annotations

from ..errors import ConfigError
from .baselines import BaselineStore
from .bisect import BisectStore
from .cost import CostStore
from .db import sqlite_path
from .runs import RunStore
from .scores import ScoreStore


class Store(RunStore, BaselineStore, ScoreStore, CostStore, BisectStore):
    """One database: every concern's reads and writes."""


_open_stores: dict[str, Store] = {}


def open_store(url: str, *, create: bool = True) -> Store:
    """Open (and migrate) a store, once per URL per process; with create=False a missing SQLite file is
    an error, not a new database."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        _open_stores.pop(url, None)  # deleted or moved since: start afresh
        if not create:
            raise ConfigError(f"no evalgate database at {path}",
                              fix="pass --db or --suite naming an existing database (see `evalgate baseline create`)")
    if url not in _open_stores:
        _open_stores[url] = Store(url)
    return _open_stores[url]




def existing_store(url: str) -> Store | None:
    """The store if its database exists (opening it refuses foreign or newer databases before any engine
    starts); None for a SQLite file not created yet, which a run creates once its input is valid."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return None
    return open_store(url)
