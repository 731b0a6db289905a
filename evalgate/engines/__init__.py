"""The engine registry: `[engine] kind` names an `Engine` subclass (evalgate/engines/base.py).

Built-in kinds are listed as "module:Class" strings, so choosing one imports only its module; the
engine's heavy imports (vLLM, httpx) happen later still, when it is built. Third parties add kinds
through the `evalgate.engines` entry-point group, as lm-eval's `register_model` and llm's plugins do:

    [project.entry-points."evalgate.engines"]
    my-engine = "my_package.engine:MyEngine"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..registry import Registry
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
ENGINES = Registry(ENTRY_POINT_GROUP, BUILTIN_ENGINES)


def engine_kinds() -> dict[str, str]:
    """Every known kind -> "module:Class": the built-in ones, then those of installed plugins."""
    return ENGINES.targets()


def engine_class(kind: str) -> type[Engine] | None:
    """The class registered for `kind`, or None when no kind of that name is known."""
    return ENGINES.load(kind)


def start_engine(suite: Suite) -> Engine:
    """Build the suite's engine (in the engine process: this is where vLLM loads the model)."""
    cls = engine_class(suite.engine_kind)
    if cls is None:
        raise ValueError(f"unknown engine kind {suite.engine_kind!r}")
    return cls(suite)


__all__ = ["BUILTIN_ENGINES", "COMMON_KEYS", "INVARIANCE_PLATFORMS", "Engine", "EngineConfig",
           "arrange_batch_invariance", "engine_class", "engine_kinds", "start_engine"]
