"""`chunked_prefill` (factor chunked_prefill): each request alone in an engine of its own that prefills
in chunks of a quarter of the longest prompt (at least 16 tokens), against pass 0.

It runs after the run's engine is closed (one engine in memory at a time); only the in-process `vllm`
kind starts such an engine, and one that does not start is reported as not run with vLLM's reason.
"""

from __future__ import annotations

from ..configuration.remedy import Remedy
from .base import AddPass, PlanContext, Probe


class ChunkedPrefill(Probe):
    name = "chunked_prefill"
    factor = "chunked_prefill"
    words = "chunked prefill"
    remedy = Remedy("engine.enable_chunked_prefill = false, or a max_num_batched_tokens above the longest prompt",
                    {"enable_chunked_prefill": False})

    def engine_args(self, context: PlanContext) -> dict:
        # vLLM wants max_num_seqs <= max_num_batched_tokens; each request runs alone in this probe anyway
        return {"enable_chunked_prefill": True, "max_num_batched_tokens": max(16, context.longest_prompt // 4),
                "max_num_seqs": 16}

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        add(1)
        return None

    def label(self, reference, other) -> str:
        return f"chunked prefill: unchunked→chunked ({other.engine_args})"


PROBE = ChunkedPrefill  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
