"""The engine registry: `[engine] kind` names an `Engine` subclass (evalgate/engines/base.py).

Built-in kinds are listed (evalgate/registry.py) as "module:Class" strings, so choosing one imports only its module; the
engine's heavy imports (vLLM, httpx) happen later still, when it is built. Third parties add kinds
through the `evalgate.engines` entry-point group, as lm-eval's `register_model` and llm's plugins do:

    [project.entry-points."evalgate.engines"]
    my-engine = "my_package.engine:MyEngine"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..registry import ENGINES
from .base import COMMON_KEYS, INVARIANCE_PLATFORMS, Engine, EngineConfig, arrange_batch_invariance

if TYPE_CHECKING:
    from ..configuration.suite import Suite

BUILTIN_ENGINES = ENGINES.builtin  # the name table lives on the ground floor (evalgate/registry.py)


def engine_class(kind: str) -> type[Engine]:
    """The class registered for `kind` (an unknown kind: ConfigError naming the known ones)."""
    return ENGINES.load(kind)


def start_engine(suite: Suite) -> Engine:
    """Build the suite's engine (in the engine process: this is where vLLM loads the model)."""
    return engine_class(suite.engine_kind)(suite)


__all__ = ["BUILTIN_ENGINES", "COMMON_KEYS", "INVARIANCE_PLATFORMS", "Engine", "EngineConfig",
           "arrange_batch_invariance", "engine_class", "start_engine"]
