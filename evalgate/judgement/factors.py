"""The factors a pass can change, one at a time (**contract**: the `factor` of a `batch_variance` verdict).

Each pass of a run differs from its reference pass in exactly one factor (evalgate/configuration/schedule.py), so a
difference between the two is attributed to that factor. For each factor: how people read it, and the
settings that remove it (named in reports, measured by `evalgate cost`).
"""

from __future__ import annotations

FACTORS = ("batch_size", "neighbours", "order", "prefix_cache", "chunking", "preemption", "prefill_decode", "repeat")

WORDS = {
    "batch_size": "batch size",
    "neighbours": "neighbours",
    "order": "order",
    "prefix_cache": "prefix cache",
    "chunking": "chunked prefill",
    "preemption": "preemption",
    "prefill_decode": "prefill vs decode",
    "repeat": "repeat (same condition)",
}

# What removes each factor's effect, for people; `evalgate cost` measures the engine settings among them.
REMEDIES = {
    "batch_size": "batch invariance (batch_invariant = true on CUDA/ROCm/XPU) or engine.max_num_seqs = 1",
    "neighbours": "batch invariance (batch_invariant = true on CUDA/ROCm/XPU) or engine.max_num_seqs = 1",
    "order": "batch invariance (batch_invariant = true on CUDA/ROCm/XPU) or engine.max_num_seqs = 1",
    "prefix_cache": "a per-request cache_salt in production, or engine.enable_prefix_caching = false",
    "chunking": "engine.enable_chunked_prefill = false, or a max_num_batched_tokens above the longest prompt",
    "preemption": "more KV-cache memory (gpu_memory_utilization / VLLM_CPU_KVCACHE_SPACE) or a lower max_num_seqs",
    "prefill_decode": "batch invariance (batch_invariant = true): its kernels make prefill and decode agree",
    "repeat": "nothing in the schedule explains it: the engine is nondeterministic (check seed and kernels)",
}

# The factors that the batch bisector (`evalgate bisect batch`) can take apart: who shared the batch.
BATCH_FACTORS = ("batch_size", "neighbours", "order")


def words(factor: str | None) -> str:
    return WORDS.get(factor or "", "unattributed (recorded before conditions)")
