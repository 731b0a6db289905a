"""Swap vLLM's batch-dependent CPU computations for fixed-geometry ones, once per process, and write down what
was measured and what is not covered (the status evalgate's engine reads back, `status.py`)."""

from __future__ import annotations

import functools

from evalgate.kernels.activation import inline_activations, left_batch_dependent, make_row_wise
from evalgate.kernels.attention import AttentionCheck, AttentionConfig, check_attention, cut_at_positions, one_thread
from evalgate.kernels.linear import Geometry, calibrate, linear_path, tiled
from evalgate.kernels.status import STATUS


@functools.cache
def install() -> None:
    _tile_linear_layers()
    _attention_cut_on_one_thread()
    _check_attention()
    _list_uncovered()


def _tile_linear_layers() -> None:
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    geometries: dict[tuple, Geometry] = {}   # (path, dtype, K, N) -> measured here

    def dispatch(layer, remove_weight: bool) -> None:
        weight = layer.weight
        original(layer, remove_weight)
        if weight.ndim != 2 or weight.is_meta or not hasattr(layer, "cpu_linear"):
            return
        n, k = weight.shape
        fn = layer.cpu_linear
        key = (linear_path(fn), weight.dtype, k, n)
        if key not in geometries:
            geometries[key] = calibrate(lambda probe: linear_for(original, probe), k, n, weight.dtype)
            STATUS.linear_measured(key, geometries[key])
        geometry = geometries[key]
        if geometry.path != key[0]:  # the probe took another path than the layer: nothing measured, one row a call
            geometry = Geometry(key[0], 1, 1)
        layer.cpu_linear = tiled(fn, geometry)

    utils.dispatch_cpu_unquantized_gemm = dispatch


def linear_for(dispatch, weight):
    """(path, fn(x, weight) -> y): what vLLM's CPU dispatch picks for a layer holding `weight`."""
    import torch

    probe = torch.nn.Module()
    probe.weight = torch.nn.Parameter(weight, requires_grad=False)
    probe.bias = None
    dispatch(probe, False)
    return linear_path(probe.cpu_linear), lambda x, w: probe.cpu_linear(x, w, None)


def _attention_cut_on_one_thread() -> None:
    """vLLM's CPU attention schedules a call's work (`build`) and runs it (`forward`) on one thread, its queries
    cut at the positions the check chose (evalgate/kernels/attention.py): a crowd, a chunk or a cache hit then
    cannot move a request's tiles. Schedule and run must agree: the kernel refuses a schedule made for another
    thread count."""
    import dataclasses

    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends import cpu_attn

    builder, impl = cpu_attn.CPUAttentionMetadataBuilder, cpu_attn.CPUAttentionBackendImpl
    build, forward = builder.build, impl.forward

    def build_cut_on_one_thread(self, *args, **kwargs):
        with one_thread():
            metadata = build(self, *args, **kwargs)
            window = getattr(self, WINDOW, 0)
            if not window or metadata.causal is not True or metadata.dynamic_causal is not None:
                return metadata
            requests = len(metadata.seq_lens)
            starts, seq_lens, table = cut_at_positions(metadata.query_start_loc[:requests + 1], metadata.seq_lens,
                                                       metadata.block_table[:requests], window)
            scheduled = ops.cpu_attn_get_scheduler_metadata(
                num_reqs=len(seq_lens), num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                head_dim=self.head_dim, seq_lens=seq_lens, dtype=self.dtype, query_start_loc=starts, causal=True,
                sliding_window_size=self.window_size, isa=self.isa, enable_kv_split=False,
                kv_cache_dtype=self.kv_cache_dtype)
            return dataclasses.replace(metadata, query_start_loc=starts, seq_lens=seq_lens, block_table=table,
                                       scheduler_metadata=scheduled)

    def forward_on_one_thread(*args, **kwargs):
        with one_thread():
            return forward(*args, **kwargs)

    builder.build, impl.forward = build_cut_on_one_thread, forward_on_one_thread


WINDOW = "evalgate_attention_window"  # set on each metadata builder by its check: query positions per piece


def _check_attention() -> None:
    from vllm.v1.attention.backends import cpu_attn

    builder = cpu_attn.CPUAttentionMetadataBuilder
    original = builder.__init__
    checked: dict[AttentionConfig, AttentionCheck] = {}

    def init(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        if self.is_cross_attention or self.is_encoder_only_attention:
            STATUS.add_uncovered("encoder or cross attention")
            return
        config = AttentionConfig(self.num_heads, self.num_kv_heads, self.head_dim, str(self.dtype).removeprefix("torch."), self.block_size,
                                 self.isa, self.window_size, str(self.kv_cache_dtype))
        if config not in checked:
            checked[config] = check_attention(config, longest=self.vllm_config.model_config.max_model_len)
            STATUS.attention_checked(config.label(), checked[config])
        setattr(self, WINDOW, checked[config].window)

    builder.__init__ = init


def _list_uncovered() -> None:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    original = CPUModelRunner.load_model

    def load_model(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        for module in self.model.modules():
            make_row_wise(module)
        for op in uncovered_ops(self.model, lora=self.lora_config is not None):
            STATUS.add_uncovered(op)
        if _name(self.vllm_config.compilation_config.mode) != "NONE":
            # torch.compile traces the tiles into a graph inductor may fuse and reorder: checked eager only
            STATUS.add_uncovered("a compiled model (set enforce_eager = true: the mode is measured eager)")
        STATUS.model_loaded_now()

    CPUModelRunner.load_model = load_model


def uncovered_ops(model, lora: bool = False) -> list[str]:
    """What in `model` the mode does not make batch invariant: anything computed by a kernel it neither tiles
    nor checks. Named by vLLM's class, so a report can say which op keeps the mode from being in force."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    found: set[str] = set()
    families: dict[str, set[str]] = {}  # one entry per family, naming each of its classes the model has
    for module in model.modules():
        kind = type(module).__name__
        if isinstance(module, LinearBase) and not isinstance(module.quant_method, UnquantizedLinearMethod):
            families.setdefault("quantized linear layers", set()).add(type(module.quant_method).__name__)
        elif "MoE" in kind:
            families.setdefault("mixture-of-experts layers", set()).add(kind)
        elif "Mamba" in kind or "ShortConv" in kind or "LinearAttention" in kind:
            families.setdefault("state-space or linear-attention layers", set()).add(kind)
        elif "MLA" in kind:
            families.setdefault("multi-head latent attention", set()).add(kind)
        elif left_batch_dependent(module):
            families.setdefault("activations computed over the batch's whole tensor", set()).add(kind)
        if getattr(module, "soft_cap", None) and kind == "LogitsProcessor":
            found.add("a final logit soft cap (tanh over the batch's whole logits)")
        impl = getattr(module, "impl", None)
        if impl is not None and type(impl).__name__ == "CPUAttentionBackendImpl":
            if impl.alibi_slopes is not None or impl.sinks is not None or impl.logits_soft_cap:
                found.add("attention with ALiBi, sinks or a logit soft cap (the check runs without them)")
        elif impl is not None and "Attention" in type(impl).__name__:
            found.add(f"attention backend {type(impl).__name__}")
    found.update(f"an activation vLLM's {file} calls inline (the mode computes only activation layers row by row)"
                 for file in inline_activations(model))
    if lora:
        found.add("LoRA adapters (vLLM's CPU punica ops)")
    return sorted(found | {f"{family} ({', '.join(sorted(kinds))})" for family, kinds in families.items()})


def _name(value) -> str:
    return str(getattr(value, "name", value))
