"""Engine registry: the suite's `engine.kind` picks the implementation; heavy imports stay inside it."""

from __future__ import annotations

from typing import Protocol

from ..records import Completion
from ..suite import Prompt, Suite


class Engine(Protocol):
    kind: str
    launch_env: dict[str, str]  # allow-listed environment the engine started with (fingerprint `env`)
    tokenizer: object  # the Hugging Face tokenizer the engine uses (lm-eval requests are tokenized with it)

    def identity(self) -> dict: ...
    def tokenize(self, prompt: Prompt) -> list[int]: ...
    def generate(self, prompts: list[Prompt]) -> list[Completion]: ...
    def close(self) -> None: ...
    # Optional: `reset_cache()` forgets cached prompt prefixes (the offline engine has it; bisect trials
    # call it before each wave, evalgate/runner.py), so an output never depends on what ran before it.

    @property
    def max_model_len(self) -> int: ...


def open_engine(suite: Suite) -> Engine:
    if suite.engine_kind == "vllm":
        from .vllm_offline import VllmOfflineEngine

        return VllmOfflineEngine(suite)
    if suite.engine_kind == "openai":
        from .openai_api import OpenAIEngine

        return OpenAIEngine(suite)
    if suite.engine_kind == "vllm-server":
        from .vllm_server import VllmServerEngine

        return VllmServerEngine(suite)
    raise ValueError(f"unknown engine kind {suite.engine_kind!r}")
