"""vLLM's engine defaults, for an engine that does not say its own (a CPU or eager engine has no CUDA graphs;
a server does not report its block size): one place for the probes and the fuzz mutations that plan by them."""

from __future__ import annotations

KV_BLOCK_SIZE = 16  # tokens per KV-cache block
CAPTURE_SIZES = (1, 2, 4, *range(8, 513, 8))  # CUDA-graph capture sizes: 1, 2, 4, then every 8 up to 512
MAX_LOGPROBS = 20  # the most logprobs (and prompt logprobs) a request may ask for; engine.max_logprobs = -1 lifts it


def kv_block_size(reported: int | None) -> int:
    """The engine's KV-cache block size, or vLLM's default where it does not say."""
    return reported or KV_BLOCK_SIZE


def capture_sizes(reported: tuple[int, ...] | None) -> tuple[int, ...]:
    """The engine's CUDA-graph capture sizes, or vLLM's defaults where it has none."""
    return tuple(reported or CAPTURE_SIZES)


def vllm_logprobs_cap(engine_args: dict) -> int | None:
    """The most logprobs a request may ask of a vLLM engine started with these arguments (None: no cap)."""
    cap = engine_args.get("max_logprobs", MAX_LOGPROBS)
    return cap if isinstance(cap, int) and cap >= 0 else None
