"""A planted batch effect in real vLLM, for tests that need batch variance whatever the CPU varies in.

A vLLM general plugin (entry point group `vllm.general_plugins`, declared by the dist-info beside this file, so
every vLLM process loads it: the offline engine's and a server's engine core). With
EVALGATE_TEST_PLANT_BATCH_VARIANCE=1 in the environment and this folder on PYTHONPATH, it raises token 0's logit
by 1e-3 in every step where more than one row is sampled: a request that shares a step with another gets other
logprob bits (rarely another token); a request alone, never. Without the variable it does nothing.

With EVALGATE_TEST_PLANT_LINEAR_VARIANCE=1 it plants the effect one level down, in the GEMM kernels vLLM's CPU
linear layers call (oneDNN's `onednn_mm`, the sgl `weight_packed_linear_cpu`, `F.linear`): a call of fewer than
`SMALL_M` rows returns each output one ulp up, as a kernel with its own path for small M would (oneDNN fp32 has
one for M=1 on AVX-512, the sgl bf16 kernel for M<=4). A decode alone gets other bits than one in a batch, on
every CPU; a mode that computes rows in fixed tiles must remove it.
"""

from __future__ import annotations

import os

NUDGE = 1e-3


SMALL_M = 4


def register() -> None:
    if os.environ.get("EVALGATE_TEST_PLANT_LINEAR_VARIANCE") == "1":
        plant_linear_variance()
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


def plant_linear_variance() -> None:
    import torch
    from vllm import _custom_ops as ops

    def one_ulp_up_below_small_m(kernel, rows_of):
        if getattr(kernel, "planted", False):  # loaded once per process, whoever calls first
            return kernel

        def planted(*args, **kwargs):
            y = kernel(*args, **kwargs)
            return torch.nextafter(y, torch.full_like(y, float("inf"))) if rows_of(*args) < SMALL_M else y

        planted.planted = True
        return planted

    ops.onednn_mm = one_ulp_up_below_small_m(ops.onednn_mm, lambda handler, x, *rest: x.shape[0])
    ops.weight_packed_linear_cpu = one_ulp_up_below_small_m(ops.weight_packed_linear_cpu, lambda x, *rest: x.shape[0])
    torch.nn.functional.linear = one_ulp_up_below_small_m(torch.nn.functional.linear, lambda x, *rest: x.shape[0])
