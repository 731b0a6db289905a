"""`preemption` (factor preemption): the highest concurrency in an engine of its own whose KV cache holds
just enough blocks for one request of max_model_len, against the given-order pass at that concurrency.

vLLM's own preemption counter proves it happened: a pass without any preemption is reported as not run.
Like `chunked_prefill`, it runs after the run's engine is closed, on the in-process `vllm` kind only.
"""

from __future__ import annotations

from typing import Any

from ..configuration.remedy import Remedy
from ..configuration.schedule import HOT
from ..engines.defaults import kv_block_size
from .base import AddPass, PlanContext, Probe


class Preemption(Probe):
    name = "preemption"
    factor = "preemption"
    words = "preemption"
    remedy = Remedy("more KV-cache memory (gpu_memory_utilization / VLLM_CPU_KVCACHE_SPACE) or a lower max_num_seqs")

    def engine_args(self, context: PlanContext) -> dict:
        # one request of max_model_len (vLLM wants a block more); stats on: the preemption counter
        blocks = -(-context.max_model_len // kv_block_size(context.kv_block_size)) + 1
        return {"num_gpu_blocks_override": blocks, "disable_log_stats": False}

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        top = max(context.schedule.concurrency)
        given = next(p for p in context.passes if p.concurrency == top and p.order_seed is None and p.cache != HOT)
        add(top, reference=given.index)
        return None

    def label(self, reference, other) -> str:
        return f"preemption: at batch size {other.concurrency} with a KV cache that forces it ({other.engine_args})"

    def before(self, engine) -> Any:
        return engine.preemptions()

    def proof(self, engine, before: Any, outputs) -> tuple[dict[str, Any], str | None]:
        after = engine.preemptions()
        preemptions = None if after is None or before is None else after - before
        if preemptions:
            return {"preemptions": preemptions}, None
        return {"preemptions": preemptions}, ("vLLM reported no preemption in this pass" if preemptions == 0 else
                                              "the engine does not report preemptions, so preemption is unproven")


PROBE = Preemption  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
