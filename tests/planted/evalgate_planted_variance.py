"""A planted batch effect in real vLLM, for tests that need batch variance whatever the CPU varies in.

A vLLM general plugin (entry point group `vllm.general_plugins`, declared by the dist-info beside this file, so
every vLLM process loads it: the offline engine's and a server's engine core). With
EVALGATE_TEST_PLANT_BATCH_VARIANCE=1 in the environment and this folder on PYTHONPATH, it raises token 0's logit
by 1e-3 in every step where more than one row is sampled: a request that shares a step with another gets other
logprob bits (rarely another token); a request alone, never. Without the variable it does nothing.
"""

from __future__ import annotations

import os

NUDGE = 1e-3


def register() -> None:
    if os.environ.get("EVALGATE_TEST_PLANT_BATCH_VARIANCE") != "1":
        return
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    forward = LogitsProcessor.forward

    def planted(self, *args, **kwargs):
        logits = forward(self, *args, **kwargs)
        if logits is not None and logits.dim() == 2 and logits.shape[0] > 1:
            logits = logits.clone()
            logits[:, 0] += NUDGE
        return logits

    if getattr(forward, "__name__", "") != "planted":  # loaded once per process, whoever calls first
        LogitsProcessor.forward = planted
