"""evalgate's CPU batch-invariant mode for vLLM: a vLLM plugin (entry point `vllm.general_plugins`), so every
vLLM process loads it -- an offline engine's, a server's, the engine core's. It does nothing unless asked for
(EVALGATE_CPU_BATCH_INVARIANT=1, which evalgate sets for `batch_invariant = true` on a CPU engine, or
VLLM_BATCH_INVARIANT=1 on a CPU, where vLLM's own mode has no kernels).
"""

from __future__ import annotations

import os

SWITCH = "EVALGATE_CPU_BATCH_INVARIANT"


def requested(environ=os.environ) -> bool:
    return environ.get(SWITCH) == "1"


def register() -> None:
    """vLLM calls this in every process it starts (vllm.plugins.load_general_plugins)."""
    if os.environ.get("VLLM_BATCH_INVARIANT") == "1" and _on_cpu():
        # vLLM's own mode is Triton kernels: on a CPU it would fail at start. This mode takes its place.
        os.environ["VLLM_BATCH_INVARIANT"] = "0"
        os.environ[SWITCH] = "1"
    if requested():
        from evalgate.kernels.install import install

        # vLLM splits a long decode's keys over threads, as many splits as the batch leaves threads free: the
        # sum's order follows the batch (measured: 2 threads, decode vs prefill bits differ). One split, always.
        os.environ["VLLM_CPU_ATTN_SPLIT_KV"] = "0"
        install()


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
