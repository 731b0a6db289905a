"""Is vLLM's CPU attention kernel batch invariant here? Asked of the kernel itself, once per configuration.

vLLM's CPU attention (`cpu_attention_with_kv_cache`) reads keys and values from the paged cache block by block.
Whether a query's result depends on how its sequence was cut into chunks (chunked prefill, a prefix-cache hit,
prefill vs decode) or on the other requests in the call depends on the kernel's ISA path and on the CPU: on one
AVX2 EPYC a tiny model's outputs changed with chunking, on the AMX Xeon nothing did once the linear layers were
fixed. The mode turns vLLM's split-KV decode off (the split count follows the batch and the thread count) and
then measures the rest: the same sequence, with keys spread over the cache as vLLM spreads them, is attended
whole, from several chunk starts, as one decode query, and beside another request; every arrangement must give
each query the bits of the whole prefill. The answer is evidence for the configuration it names, not a proof.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evalgate.kernels.linear import bits

CHECK_SEED = 20261207
LENGTH, NEIGHBOUR = 300, 77     # query positions of the sequence checked, and of the request beside it


@dataclass(frozen=True)
class AttentionConfig:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int
    isa: str
    sliding_window: int
    kv_cache_dtype: str

    def label(self) -> str:
        return (f"cpu_attention_with_kv_cache isa={self.isa} {self.dtype} heads={self.num_heads}/{self.num_kv_heads}"
                f" head_dim={self.head_dim} block={self.block_size}"
                + (f" window={self.sliding_window}" if self.sliding_window > 0 else ""))


def attention_varies(config: AttentionConfig, split_kv: bool = False) -> str | None:
    """None where every arrangement gives each query the whole prefill's bits; else the first one that did not."""
    import torch
    from vllm import _custom_ops as ops

    if config.kv_cache_dtype not in ("auto", config.dtype.removeprefix("torch.")):
        return f"a quantized KV cache ({config.kv_cache_dtype}) is not checked"
    dtype = getattr(torch, config.dtype.removeprefix("torch."))
    if config.isa == "amx":
        torch.cpu._init_amx()   # the process's permission to use AMX tiles (vLLM's worker asks for it too)
    generator = torch.Generator().manual_seed(CHECK_SEED)
    size = config.block_size
    blocks = {"a": math.ceil(LENGTH / size), "b": math.ceil(NEIGHBOUR / size)}
    cache = torch.zeros(blocks["a"] + blocks["b"], config.num_kv_heads, size, 2 * config.head_dim, dtype=dtype)
    view = cache.view(cache.shape[0], config.num_kv_heads, size * 2, config.head_dim)
    key_cache, value_cache = view.chunk(2, dim=2)
    # the neighbour's blocks first, so that the checked sequence does not start at block 0
    tables = {"b": torch.arange(blocks["b"], dtype=torch.int32),
              "a": torch.arange(blocks["b"], blocks["b"] + blocks["a"], dtype=torch.int32)}
    lengths = {"a": LENGTH, "b": NEIGHBOUR}
    queries = {}
    for name, length in lengths.items():
        queries[name] = torch.randn(length, config.num_heads, config.head_dim, generator=generator).to(dtype)
        keys = (torch.randn(length, config.num_kv_heads, config.head_dim, generator=generator) * 2).to(dtype)
        values = torch.randn(length, config.num_kv_heads, config.head_dim, generator=generator).to(dtype)
        positions = torch.arange(length)
        slots = (tables[name][positions // size].long() * size + positions % size)
        ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slots, config.isa)

    def attend(segments):
        """Each (sequence, first query position) attends over its whole sequence; the checked one's rows."""
        query = torch.cat([queries[name][start:] for name, start in segments])
        counts = [lengths[name] - start for name, start in segments]
        starts = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
        seq_lens = torch.tensor([lengths[name] for name, _ in segments], dtype=torch.int32)
        width = max(blocks.values())
        table = torch.zeros(len(segments), width, dtype=torch.int32)
        for row, (name, _) in enumerate(segments):
            table[row, :blocks[name]] = tables[name]
        metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(segments), num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim, seq_lens=seq_lens, dtype=dtype, query_start_loc=starts, causal=True,
            sliding_window_size=config.sliding_window, isa=config.isa, enable_kv_split=split_kv,
            kv_cache_dtype=config.kv_cache_dtype)
        output = torch.empty_like(query)
        ops.cpu_attention_with_kv_cache(
            query=query, key_cache=key_cache, value_cache=value_cache, output=output, query_start_loc=starts,
            seq_lens=seq_lens, scale=1 / math.sqrt(config.head_dim), causal=True, alibi_slopes=None,
            sliding_window=config.sliding_window, block_table=table, softcap=0.0, scheduler_metadata=metadata,
            s_aux=None, kv_cache_dtype=config.kv_cache_dtype)
        index = [name for name, _ in segments].index("a")
        return output[starts[index]:starts[index + 1]]

    whole = bits(attend([("a", 0)]))
    arrangements = {f"a chunk (or a cache hit) from position {start}": [("a", start)]
                    for start in (1, size - 1, size, 2 * size + 5, LENGTH - 2)}
    arrangements |= {"one decode query": [("a", LENGTH - 1)],
                     "beside another request's prefill": [("b", 0), ("a", 0)],
                     "a decode beside another decode": [("b", NEIGHBOUR - 1), ("a", LENGTH - 1)],
                     "a chunk beside another request's chunk": [("b", 3), ("a", LENGTH // 2)]}
    for what, segments in arrangements.items():
        start = dict(segments)["a"]
        if not torch.equal(bits(attend(segments)), whole[start:]):
            return f"{config.label()}: {what} gives a query other bits than the whole prefill"
    return None
