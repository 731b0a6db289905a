"""`evalgate fetch`: download the suite's Hub models and datasets into the cache and write evalgate.lock."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..configuration.suite_file import find_suite
from ..fetch import fetch as fetch_suite
from .common import console, handled
from .gate import SuiteArg


@handled
def fetch(suite: Optional[Path] = SuiteArg,
          progress: bool = typer.Option(True, help="Show download progress bars"),
          locked: bool = typer.Option(False, "--locked", help="Download exactly the commits evalgate.lock pins and "
                                      "keep the lock (CI); fails when the lock does not cover the suite")):
    """Download the Hub models and datasets the suite names, at their revisions, and pin them in evalgate.lock.

    Every other command then runs offline from the cache and the lock: a branch that moves on the Hub
    changes nothing until you fetch again. Commit evalgate.lock. Gated repos need HF_TOKEN."""
    fetched = fetch_suite(find_suite(suite), progress=progress, locked=locked)
    if not fetched.roles:
        console.print(f"the suite names no Hub repo: nothing to fetch; wrote {fetched.path}")
        return
    for role, pin in fetched.roles:  # the field that named it: engine.model, engine.tokenizer, adapters.NAME, a task
        console.print(f"{role}: {pin.repo} @ {pin.revision}: commit {pin.commit} ({len(pin.files)} files)",
                      markup=False)
    for line in fetched.moved:
        console.print(f"[yellow]moved since the last fetch:[/yellow] {line}")
    console.print(f"kept {fetched.path} (--locked)" if locked else f"wrote {fetched.path}")
