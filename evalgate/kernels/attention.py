"""vLLM's CPU attention kernel, run so that a query's bits depend on its position and its keys alone, and asked,
once per configuration, whether they do.

vLLM's CPU attention (`cpu_attention_with_kv_cache`) reads keys and values from the paged cache block by block,
in tiles. A request's queries are tiled from the first query it is given, and the key tile's size follows the
query tile's size (and the CPU's L2 size). Its scheduler also shares a call's work out over the threads by the
call's total and cuts a request's queries where a thread's share ends. So a query's sums depend on who shares
the call (more than one thread), and on where its request's queries start: a chunked prefill, a prefix-cache
hit and a decode start them elsewhere than a whole prefill (measured on an AMD EPYC: a 1,200-token sequence,
every configuration tried). The mode runs the kernel on one thread (`one_thread`) and gives it each request's
queries in pieces cut at fixed positions (`cut_at_positions`), so every query's tiles are the same wherever its
request started and whoever shares the call. It also turns vLLM's split-KV decode off (the split count follows
the batch and the thread count).

The check asks the kernel, on one thread and cut as the mode runs it: one sequence, keys spread over the cache as
vLLM spreads them, attended whole, from several chunk starts, as one decode query and beside another request.
Every arrangement must give each query the whole prefill's bits at `LENGTH` and, for a window to be used, again
at each of `CHUNK_LENGTHS`; a long request must get its bits alone beside another at `LONG`. The answers are
evidence for the configuration they name, not a proof.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

from evalgate.kernels.linear import bits

CHECK_SEED = 20261207
LENGTH, NEIGHBOUR = 300, 77     # query positions of the sequence checked, and of the request beside it
LONG = 2048                     # a long request among others (capped at the engine's longest sequence)
CHUNK_LENGTHS = (600, 1200, 2048)


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


@dataclass(frozen=True)
class AttentionCheck:
    varies: str | None      # the first arrangement that gave a query other bits; None: none did
    chunks_hold_to: int     # the longest sequence checked whose chunks all kept the whole prefill's bits (0: none)
    window: int = 0         # query positions per piece the kernel is given (`cut_at_positions`); 0: not cut


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The process's OpenMP team at one thread for the block. vLLM's CPU worker makes `torch.set_num_threads` a
    no-op once it has bound its threads, so this sets PyTorch's own count, and puts it back."""
    import torch

    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)
    try:
        yield
    finally:
        torch._C.set_num_threads(threads)


def cut_at_positions(query_start_loc, seq_lens, block_table, window: int):
    """Each request's queries cut into pieces at every multiple of `window` positions, each piece one request to
    the kernel (keys up to its last query, the request's block table): (query_start_loc, seq_lens, block_table).
    The queries keep their order, so the output does too. A piece of at most `window` queries is one query tile,
    whose key tiles then have one size for the configuration and start at position 0: a query's sums no longer
    depend on where its request's queries started (a chunk, a cache hit, a decode) nor on who shares the call.
    Keys past a query are masked to exact zeros, so a piece that ends later adds nothing to its sums."""
    import torch

    counts = (query_start_loc[1:] - query_start_loc[:-1]).long()
    ends = seq_lens.long()
    firsts = ends - counts                                   # each request's first query position
    first_piece = firsts // window
    pieces = torch.where(counts > 0, (ends + window - 1) // window - first_piece, torch.zeros_like(ends))
    request = torch.repeat_interleave(torch.arange(len(ends)), pieces)
    index = torch.arange(len(request)) - torch.repeat_interleave(torch.cumsum(pieces, 0) - pieces, pieces)
    piece_ends = torch.minimum((first_piece[request] + index + 1) * window, ends[request])
    starts = torch.zeros(len(request) + 1, dtype=torch.int32)
    starts[1:] = (query_start_loc[:-1].long()[request] + piece_ends - firsts[request]).int()
    return starts, piece_ends.int(), block_table[request]


WINDOWS = (8, 4, 2, 1)  # query positions per piece, widest (fastest) first; 1 is a decode's own shape


def check_attention(config: AttentionConfig, longest: int = LONG) -> AttentionCheck:
    """Ask the kernel, on one thread as the mode runs it; `longest`: the engine's longest sequence. The widest
    window whose every arrangement holds at every length checked is the one the mode uses; where none does, the
    queries are not cut and the check says how far that holds."""
    if config.kv_cache_dtype not in ("auto", config.dtype.removeprefix("torch.")):
        return AttentionCheck(f"a quantized KV cache ({config.kv_cache_dtype}) is not checked", 0)
    lengths = [LENGTH, *(n for n in CHUNK_LENGTHS if n <= longest)]
    long = min(LONG, longest)
    with one_thread():
        if config.sliding_window <= 0:  # a sliding window's keys start where a piece starts: never cut
            for window in WINDOWS:
                check = _check(config, long, lengths, window)
                if check.varies is None and check.chunks_hold_to == lengths[-1]:
                    return check
        return _check(config, long, lengths, 0)


def _check(config: AttentionConfig, long: int, lengths: list[int], window: int) -> AttentionCheck:
    varies = _Sequences(config, LENGTH, NEIGHBOUR, window).first_difference(crowd_only=False)
    if varies is None and long > LENGTH:
        varies = _Sequences(config, long, long // 2, window).first_difference(crowd_only=True)
    if varies is not None:
        return AttentionCheck(varies, 0, window)
    held = LENGTH
    for length in lengths[1:]:
        if not _Sequences(config, length, NEIGHBOUR, window).chunks_hold():
            break
        held = length
    return AttentionCheck(None, held, window)


class _Sequences:
    """Two sequences in one paged cache, "a" (the one checked, `length` positions) and "b" beside it."""

    def __init__(self, config: AttentionConfig, length: int, neighbour: int, window: int) -> None:
        import torch
        from vllm import _custom_ops as ops

        self.config, self.window = config, window
        self.dtype = getattr(torch, config.dtype.removeprefix("torch."))
        if config.isa == "amx":
            torch.cpu._init_amx()   # the process's permission to use AMX tiles (vLLM's worker asks for it too)
        generator = torch.Generator().manual_seed(CHECK_SEED)
        size = config.block_size
        self.lengths = {"a": length, "b": neighbour}
        self.blocks = {name: math.ceil(n / size) for name, n in self.lengths.items()}
        cache = torch.zeros(self.blocks["a"] + self.blocks["b"], config.num_kv_heads, size, 2 * config.head_dim,
                            dtype=self.dtype)
        view = cache.view(cache.shape[0], config.num_kv_heads, size * 2, config.head_dim)
        self.key_cache, self.value_cache = view.chunk(2, dim=2)
        # the neighbour's blocks first, so that the checked sequence does not start at block 0
        self.tables = {"b": torch.arange(self.blocks["b"], dtype=torch.int32),
                       "a": torch.arange(self.blocks["b"], self.blocks["b"] + self.blocks["a"], dtype=torch.int32)}
        self.queries = {}
        for name, n in self.lengths.items():
            self.queries[name] = torch.randn(n, config.num_heads, config.head_dim, generator=generator).to(self.dtype)
            keys = (torch.randn(n, config.num_kv_heads, config.head_dim, generator=generator) * 2).to(self.dtype)
            values = torch.randn(n, config.num_kv_heads, config.head_dim, generator=generator).to(self.dtype)
            positions = torch.arange(n)
            slots = self.tables[name][positions // size].long() * size + positions % size
            ops.cpu_attn_reshape_and_cache(keys, values, self.key_cache, self.value_cache, slots, config.isa)

    def attend(self, segments: list[tuple[str, int]]):
        """Each (sequence, first query position) attends over its whole sequence in one call: "a"'s rows' bits."""
        import torch
        from vllm import _custom_ops as ops

        config = self.config
        query = torch.cat([self.queries[name][start:] for name, start in segments])
        counts = [self.lengths[name] - start for name, start in segments]
        starts = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
        seq_lens = torch.tensor([self.lengths[name] for name, _ in segments], dtype=torch.int32)
        table = torch.zeros(len(segments), max(self.blocks.values()), dtype=torch.int32)
        for row, (name, _) in enumerate(segments):
            table[row, :self.blocks[name]] = self.tables[name]
        index = [name for name, _ in segments].index("a")
        first, last = int(starts[index]), int(starts[index + 1])
        if self.window:
            starts, seq_lens, table = cut_at_positions(starts, seq_lens, table, self.window)
        metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(seq_lens), num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim, seq_lens=seq_lens, dtype=self.dtype, query_start_loc=starts, causal=True,
            sliding_window_size=config.sliding_window, isa=config.isa, enable_kv_split=False,
            kv_cache_dtype=config.kv_cache_dtype)
        output = torch.empty_like(query)
        ops.cpu_attention_with_kv_cache(
            query=query, key_cache=self.key_cache, value_cache=self.value_cache, output=output,
            query_start_loc=starts, seq_lens=seq_lens, scale=1 / math.sqrt(config.head_dim), causal=True,
            alibi_slopes=None, sliding_window=config.sliding_window, block_table=table, softcap=0.0,
            scheduler_metadata=metadata, s_aux=None, kv_cache_dtype=config.kv_cache_dtype)
        return bits(output[first:last])

    def chunk_starts(self) -> dict[str, int]:
        size, length = self.config.block_size, self.lengths["a"]
        return {f"a chunk (or a cache hit) from position {start}": start
                for start in (1, size - 1, size, 2 * size + 5, length - 2)} | {"one decode query": length - 1}

    def chunks_hold(self) -> bool:
        import torch

        whole = self.attend([("a", 0)])
        return all(torch.equal(self.attend([("a", start)]), whole[start:]) for start in self.chunk_starts().values())

    def first_difference(self, crowd_only: bool) -> str | None:
        """The first arrangement that gives "a"'s queries other bits: than the whole prefill, or (`crowd_only`)
        than the same arrangement alone."""
        import torch

        label, length, near = self.config.label(), self.lengths["a"], self.lengths["b"]
        crowds = {"beside another request's prefill": [("b", 0), ("a", 0)],
                  "a decode beside another decode": [("b", near - 1), ("a", length - 1)],
                  "a chunk beside another request's chunk": [("b", 3), ("a", length // 2)]}
        whole = self.attend([("a", 0)])
        arrangements = {} if crowd_only else {what: [("a", start)] for what, start in self.chunk_starts().items()}
        for what, segments in (arrangements | crowds).items():
            start = dict(segments)["a"]
            expected = self.attend([("a", start)]) if crowd_only else whole[start:]
            if not torch.equal(self.attend(segments), expected):
                alone = "than alone" if crowd_only else "than the whole prefill"
                return f"{label}: {what} gives a {length}-token sequence's queries other bits {alone}"
        return None
