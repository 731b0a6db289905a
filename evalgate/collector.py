"""Python's cyclic garbage collector, paused for bulk work on acyclic data.

Writing a pass and loading and judging two runs build tens of thousands of short-lived, acyclic objects
(rows, blobs, verdicts). Their number alone triggers collections, each of which walks every object alive,
the engine's outputs included: as much time as the work (5,000-request runs, measured: load + judge 0.18 s
with collections and 0.08 s without; encoding a pass 0.46 s and 0.33 s)."""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def collector_paused():
    """The collector paused for the block, and restored as it was (a nested pause leaves it paused)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
