"""The engine registry: `[engine] kind` names an `Engine` subclass (evalgate/engines/base.py).

Built-in kinds are listed as "module:Class" strings, so choosing one imports only its module; the
engine's heavy imports (vLLM, httpx) happen later still, when it is built. Third parties add kinds
through the `evalgate.engines` entry-point group, as lm-eval's `register_model` and llm's plugins do:

    [project.entry-points."evalgate.engines"]
    my-engine = "my_package.engine:MyEngine"
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING

from .base import COMMON_KEYS, INVARIANCE_PLATFORMS, Engine, EngineConfig, arrange_batch_invariance

if TYPE_CHECKING:
    from ..configuration.suite import Suite

BUILTIN_ENGINES = {
    "vllm": "evalgate.engines.vllm_offline:VllmOfflineEngine",
    "openai": "evalgate.engines.openai_api:OpenAIEngine",
    "vllm-server": "evalgate.engines.vllm_server:VllmServerEngine",
    # A test engine (docs/design.md, "The fake engine"): deterministic outputs without a model runtime.
    "fake": "evalgate.engines.fake:FakeEngine",
}
ENTRY_POINT_GROUP = "evalgate.engines"


def engine_kinds() -> dict[str, str]:
    """Every known kind -> "module:Class": the built-in ones, then those of installed plugins."""
    kinds = dict(BUILTIN_ENGINES)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        kinds.setdefault(entry.name, entry.value)
    return kinds


def engine_class(kind: str) -> type[Engine] | None:
    """The class registered for `kind`, or None when no kind of that name is known."""
    # a built-in kind needs no scan of every installed distribution's entry points
    target = BUILTIN_ENGINES.get(kind) or engine_kinds().get(kind)
    if target is None:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def open_engine(suite: Suite) -> Engine:
    cls = engine_class(suite.engine_kind)
    if cls is None:
        raise ValueError(f"unknown engine kind {suite.engine_kind!r}")
    return cls(suite)


__all__ = ["BUILTIN_ENGINES", "COMMON_KEYS", "INVARIANCE_PLATFORMS", "Engine", "EngineConfig",
           "arrange_batch_invariance", "engine_class", "engine_kinds", "open_engine"]
