"""`prefix_cache` (factor prefix_cache): each request after a warmer that is its own prompt cut to half
its length, under the same cache salt, so the request is served partly from the cache and prefills only
its tail (the case that varies on CPU). The recorded cached-token counts prove the hit.
"""

from __future__ import annotations

from typing import Iterator

from ..configuration.prompts import SCORING_TYPES, Prompt
from ..configuration.schedule import HOT
from .base import AddPass, PlanContext, Probe, Wave, WaveContext


class PrefixCache(Probe):
    name = "prefix_cache"
    factor = "prefix_cache"

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        if context.prefix_caching is False:
            return "the engine has prefix caching off"
        add(1, cache=HOT)
        return None

    def waves(self, pass_, keys: list[str], context: WaveContext) -> Iterator[Wave]:
        for key in keys:
            ids = context.prompt_ids[key]
            # the warmer has the request's key, hence its cache salt: the request then hits its blocks
            warmer = Prompt(key, "", max_tokens=1, line=0, prompt_ids=tuple(ids[: max(1, len(ids) // 2)]))
            if context.prompts[key].request_type not in SCORING_TYPES:
                yield Wave([warmer], [False])
            yield Wave.of([context.prompts[key]])

    def label(self, reference, other) -> str:
        return "prefix cache cold→half the prompt cached (prefix_cache probe)"


PROBE = PrefixCache  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
