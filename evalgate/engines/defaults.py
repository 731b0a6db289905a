"""vLLM's engine defaults, for an engine that does not say its own (a CPU or eager engine has no CUDA graphs;
a server does not report its block size): one place for the probes and the fuzz mutations that plan by them."""

from __future__ import annotations

KV_BLOCK_SIZE = 16  # tokens per KV-cache block
CAPTURE_SIZES = (1, 2, 4, *range(8, 513, 8))  # CUDA-graph capture sizes: 1, 2, 4, then every 8 up to 512


def kv_block_size(reported: int | None) -> int:
    """The engine's KV-cache block size, or vLLM's default where it does not say."""
    return reported or KV_BLOCK_SIZE


def capture_sizes(reported: tuple[int, ...] | None) -> tuple[int, ...]:
    """The engine's CUDA-graph capture sizes, or vLLM's defaults where it has none."""
    return tuple(reported or CAPTURE_SIZES)
