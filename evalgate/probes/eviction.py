"""`eviction` (factor eviction): each request recomputed after KV-cache pressure evicted its cached
prefix, against the request cold (pass 0). Block reuse after eviction is where a stale or half-written
block shows (sglang#22819: KV corruption at a prefix length equal to the block size).

In an engine of its own whose KV cache holds `CAPACITY` requests of max_model_len: the request runs once
(a companion: it caches its blocks under its own salt), then long fillers under their own salts, one at
a time, take every block, then the request runs again under the same salt and is recorded. Its recorded
cached-token count proves the eviction (0: nothing of it was left). Only a request of at least one KV block
has anything cached to evict: a pass in which none has, or some request still hit the cache, is reported
as not run. Like `preemption`, it runs after the run's engine is closed, on the
in-process `vllm` kind only.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..configuration.prompts import SCORING_TYPES, Prompt
from ..configuration.remedy import Remedy
from ..engines.defaults import kv_block_size
from .base import COMPANION_PREFIX, AddPass, PlanContext, Probe, Wave, WaveContext
from .needle import needle_unit

CAPACITY = 2  # requests of max_model_len the probe engine's KV cache holds
FILLERS = CAPACITY + 1  # fillers of max_model_len, one at a time: more than the cache holds


class Eviction(Probe):
    name = "eviction"
    factor = "eviction"
    words = "KV-cache eviction"
    remedy = Remedy("an engine fix (block reuse after eviction): report it with the repro pack; more KV-cache memory "
                    "hides it")

    def engine_args(self, context: PlanContext) -> dict:
        blocks = CAPACITY * -(-context.max_model_len // kv_block_size(context.kv_block_size)) + 1
        return {"num_gpu_blocks_override": blocks, "enable_prefix_caching": True}

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        if context.prefix_caching is False:
            return "the engine has prefix caching off: there is no cached prefix to evict"
        add(1)
        return None

    def waves(self, pass_, keys: list[str], context: WaveContext) -> Iterator[Wave]:
        length = max(1, context.engine.max_model_len - 2)
        unit = needle_unit(context.engine)
        for n, key in enumerate(keys):
            prompt = context.prompts[key]
            if prompt.request_type not in SCORING_TYPES:
                yield Wave([prompt], [False])  # caches its blocks under its own salt
            for i in range(FILLERS):  # one at a time: enough blocks for each, so none is preempted
                ids = (unit * (length // len(unit) + 2))[(n + i) % len(unit):][:length]
                yield Wave([Prompt(f"{COMPANION_PREFIX}evict-{n}-{i}", "", max_tokens=1, line=0, prompt_ids=tuple(ids))],
                           [False])
            yield Wave.of([prompt])

    def label(self, reference, other) -> str:
        return f"eviction: cold→recomputed after its cached prefix was evicted ({other.engine_args})"

    def proof(self, engine, before: Any, outputs) -> tuple[dict[str, Any], str | None]:
        block = kv_block_size(engine.kv_block_size)
        counts = [c.cached_tokens for c in outputs if len(c.prompt_ids) >= block]  # a shorter one caches nothing
        hit = sum(1 for n in counts if n)
        figures = {"evicted": sum(1 for n in counts if n == 0), "still_cached": hit,
                   "shorter_than_a_block": len(outputs) - len(counts)}
        if not counts:
            return figures, (f"no request is as long as one KV-cache block ({block} tokens): nothing of them is cached, "
                             "so nothing can be evicted")
        if any(n is None for n in counts):
            return figures, "the engine does not report cached tokens, so the eviction is unproven"
        if hit:
            return figures, f"{hit} of {len(counts)} requests were still served from the cache: the eviction is unproven"
        return figures, None


PROBE = Eviction  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
