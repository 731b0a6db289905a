"""Linear layers whose row results do not depend on the batch: every call is cut into tiles of a fixed row count.

A CPU GEMM picks its blocking (and so the order it sums K in) from the call's shape, so a row's bits can change
with M, the number of rows in the call (measured: oneDNN fp32 M=1 vs M>=2, F.linear fp32 M=1 | 2-15 | >=16,
bf16 lm_head M<=32 vs >=33; benchmarks/cpu_linear_invariance.py). A tile of R rows is one shape, so a row
computed in it gets the same bits wherever it sits and whoever its neighbours are -- that is checked, not
assumed, once per (path, dtype, K, N) when the layer is loaded (`calibrate`). The last, partial tile is computed
at its own size when every size from `tail_floor` to R gives the tile's bits (checked too), and is padded up to
`tail_floor` otherwise, so a decode batch smaller than R costs nothing where the kernel keeps one class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

TILE_ROWS = 32          # R: rows per call (docs/conditions.md "CPU batch invariance" has the measured costs)
CALIBRATION_SEED = 20261206


@dataclass(frozen=True)
class Geometry:
    """How one (path, dtype, K, N) is computed: tiles of `rows`, a tail never shorter than `tail_floor`."""

    path: str
    rows: int
    tail_floor: int


def linear_path(fn: Callable) -> str:
    """Which of vLLM's CPU GEMM paths `layer.cpu_linear` is (utils.dispatch_cpu_unquantized_gemm's choices)."""
    names = set(getattr(getattr(fn, "__code__", None), "co_names", ()))
    for marker, path in (("onednn_mm", "onednn_mm"), ("weight_packed_linear_cpu", "sgl_weight_packed"),
                         ("zentorch_linear_unary", "zentorch")):
        if marker in names:
            return path
    return "torch_linear"


def bits(t):
    """A tensor's bit patterns, compared exactly (-0.0 and NaNs included)."""
    import torch

    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def probe_weight(n: int, k: int, dtype, generator):
    """A weight whose columns come in equal pairs, so that `probe_rows` can cancel: see `probe_rows`."""
    import torch

    weight = torch.randn(n, k, generator=generator)
    weight[:, k // 2:k // 2 * 2] = weight[:, :k // 2]
    return weight.to(dtype)


def probe_rows(count: int, k: int, dtype, generator):
    """Rows that make a GEMM's summation order visible in its result. Random rows are not enough: in bf16 two
    summation orders round to the same output almost always (oneDNN and the sgl kernel were seen to agree on
    thousands of random outputs and to disagree on a real activation). Here each row puts +L and -L (L up to
    2^14) on a few columns the weight repeats: the exact result is the sum of the small entries, but every
    partial sum that holds L rounds the small ones it meets, so any two orders give other bits."""
    import torch

    rows = torch.randn(count, k, generator=generator)
    half = k // 2
    for row in rows:
        columns = torch.randperm(half, generator=generator)[:4]
        large = 2.0 ** torch.randint(10, 15, (4,), generator=generator)
        row[columns] = large
        row[columns + half] = -large
    return rows.to(dtype)


def calibrate(linear_for: Callable, k: int, n: int, dtype, rows: int = TILE_ROWS) -> Geometry:
    """The largest tile (rows, rows/2, ... 1) in which a row's bits depend neither on its position nor on its
    neighbours here, and the shortest tail that still gives the tile's bits. `linear_for(weight)` gives
    (path, fn(x, weight) -> y): vLLM's choice for a weight of this shape and dtype, here over `probe_weight`.
    A one-row tile needs no check."""
    import torch

    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    weight = probe_weight(n, k, dtype, generator)
    path, fn = linear_for(weight)
    while rows > 1:
        tile = probe_rows(rows, k, dtype, generator)
        reference = bits(fn(tile, weight))
        if all(_placed_row_agrees(fn, weight, tile[0], reference[0], position, probe_rows(rows, k, dtype, generator))
               for position in sorted({1, rows // 2, rows - 1})):
            floor = rows
            for size in range(rows - 1, 0, -1):
                if not torch.equal(bits(fn(tile[:size], weight)), reference[:size]):
                    break
                floor = size
            return Geometry(path, rows, floor)
        rows //= 2
    return Geometry(path, 1, 1)


def _placed_row_agrees(fn, weight, row, reference, position, others) -> bool:
    import torch

    others[position] = row
    return torch.equal(bits(fn(others, weight)[position]), reference)


def tiled(fn: Callable, geometry: Geometry) -> Callable:
    """`fn` (x, weight, bias) -> y computed in `geometry`'s tiles, over the rows of x's leading dimensions."""
    import torch

    rows, floor = geometry.rows, geometry.tail_floor

    def linear(x, weight, bias=None):
        if x.dim() != 2:  # [..., K]: the rows are every leading index
            y = linear(x.reshape(-1, x.shape[-1]), weight, bias)
            return y.reshape(*x.shape[:-1], y.shape[-1])
        m = x.shape[0]
        if m == 0 or m == rows or floor <= m < rows:
            return fn(x, weight, bias)
        full = m - m % rows
        pieces = [fn(x[start:start + rows], weight, bias) for start in range(0, full, rows)]
        tail = m - full
        if tail >= floor:
            pieces.append(fn(x[full:], weight, bias))
        elif tail:
            padded = x.new_zeros((floor, x.shape[1]))
            padded[:tail] = x[full:]
            pieces.append(fn(padded, weight, bias)[:tail])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    return linear
