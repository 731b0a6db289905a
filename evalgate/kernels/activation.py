"""Activations whose row results do not depend on the batch: each row computed by one thread, in one vector path.

vLLM's CPU activations are PyTorch's own (`forward_native`: `F.silu(x[..., :d]) * x[..., d:]`). PyTorch computes
an elementwise op over the call's whole tensor, cut into one slice per thread at `numel / threads`; each slice
runs a vector loop, and the last elements of a slice, fewer than two vectors, a scalar one. The vector and the
scalar exp, erf and tanh round differently, so when a thread's slice ends inside a row that row's bits depend on
where the cut fell: on M, the rows in the call (measured: a random tiny Llama, intermediate size 352, 2 threads,
8 of 40 requests differed between batch 1 and 8 with the linear layers tiled). vLLM's C++ CPU kernels for the
same activations (`torch.ops._C.silu_and_mul`, ...) give each row to one thread and compute it in 8-wide vectors
from its own start, so a row's bits are a function of the row alone. The mode computes every activation it knows
with them, its width padded to a multiple of 8 where it is not one; an activation it does not know is named as
not covered (install.py `uncovered_ops`).
"""

from __future__ import annotations

from typing import Callable

VECTOR = 8   # the C++ kernels' vector width (vLLM csrc/cpu/activation.cpp: `d % VEC_ELEM_NUM == 0`)
EXACT = ("ReLU", "ReLUSquaredActivation", "FatreluAndMul", "Identity")   # IEEE-exact ops: any order, same bits
# An activation a model file calls itself, not through a layer: nothing for the mode to swap
INLINE_CALLS = ("F.silu(", "F.gelu(", "functional.silu(", "functional.gelu(", "torch.tanh(", "torch.sigmoid(")


def row_wise_kernel(module) -> tuple[str, bool] | None:
    """(vLLM's C++ CPU op, gated) computing `module`'s activation a row at a time; None for one it has none for.
    A plain activation with only a gated kernel runs gated against ones (x * 1.0 is exact)."""
    kind = type(module).__name__
    approximate = getattr(module, "approximate", "none")
    gelu = "gelu_tanh_and_mul" if approximate == "tanh" else "gelu_and_mul"
    return {"SiluAndMul": ("silu_and_mul", True), "GeluAndMul": (gelu, True),
            "GELU": (gelu, False), "GELUTanh": ("gelu_tanh_and_mul", False), "SiLU": ("silu_and_mul", False),
            "NewGELU": ("gelu_new", False), "FastGELU": ("gelu_fast", False),
            "QuickGELU": ("gelu_quick", False)}.get(kind)


def row_wise(op_name: str, gated: bool) -> Callable:
    """x [..., W] -> the activation of each row (gated: act(x[..., :W/2]) * x[..., W/2:]), by vLLM's C++ op
    `op_name`, each row computed alone whatever the call's rows."""
    import torch

    op = getattr(torch.ops._C, op_name)
    gated_op = op_name.endswith("_and_mul")

    def activation(x):
        rows = x.reshape(-1, x.shape[-1])
        d = rows.shape[1] // 2 if gated else rows.shape[1]
        width = -(-d // VECTOR) * VECTOR
        if width == d and gated == gated_op:
            given = rows.contiguous()
        else:  # padded to the vector width (elementwise: the padding touches no other element), or gated by ones
            given = rows.new_zeros((rows.shape[0], 2 * width if gated_op else width))
            given[:, :d] = rows[:, :d]
            if gated_op:
                given[:, width:width + d] = rows[:, d:] if gated else 1
        out = rows.new_empty((rows.shape[0], width))
        op(out, given)
        return (out if width == d else out[:, :d]).reshape(*x.shape[:-1], d)

    return activation


def left_batch_dependent(module) -> bool:
    """An activation layer (vLLM's, or PyTorch's: what `get_act_fn` returns) the mode cannot compute row by row."""
    return (type(module).__module__ in ("vllm.model_executor.layers.activation", "torch.nn.modules.activation")
            and type(module).__name__ not in EXACT and row_wise_kernel(module) is None)


def make_row_wise(module) -> bool:
    """Compute `module` row by row (its `forward` replaced); False when no kernel of vLLM's does its activation."""
    kernel = row_wise_kernel(module)
    if kernel is None:
        return False
    module.forward = row_wise(*kernel)
    return True


def inline_activations(model) -> list[str]:
    """The vLLM model files among `model`'s layers' that call an activation inline (read, not imported)."""
    import importlib.util
    from pathlib import Path

    files = []
    for name in sorted({type(module).__module__ for module in model.modules()}):
        spec = importlib.util.find_spec(name) if name.startswith("vllm.model_executor.models.") else None
        if spec and spec.origin and any(call in Path(spec.origin).read_text(encoding="utf-8") for call in INLINE_CALLS):
            files.append(name.rsplit(".", 1)[-1] + ".py")
    return files
