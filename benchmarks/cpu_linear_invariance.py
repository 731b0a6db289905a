"""Which of vLLM's CPU linear paths give a row other bits in a batch of another size, and what fixed row tiles
cost (issue: batch-invariant vLLM on CPU; measure before designing).

    python benchmarks/cpu_linear_invariance.py [--threads 1]

For each path vLLM's `dispatch_cpu_unquantized_gemm` may pick on this CPU (oneDNN `onednn_mm`, the sgl
`weight_packed_linear` on AMX, `F.linear`), each dtype (float32, bfloat16) and SmolLM2-135M's projection
shapes (K x N):
- **rows vs M**: a fixed set of 256 rows computed at M = 256 and again at every M in `MS` (the first M rows):
  the M at which a row's bits differ from M = 256 (grouped: M values giving the same bits share a class);
- **tile R**: every row computed inside an R-row tile at each position among random other rows, and alone in a
  zero-padded tile: whether its bits ever depend on the position or the neighbours;
- **cost**: one call over M rows against ceil(M / R) calls of R rows (padded), median of repeats;
- **the mode**: the geometry evalgate's CPU kernels measure for this path at load (`evalgate.kernels.linear
  .calibrate`: tile rows, tail floor) and what computing M rows in it costs against one call (the per-op
  overhead of the mode, at the M of a decode batch and of a prefill).
Prints one table per path; the CPU model and torch's capability head the output.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

SHAPES = [(576, 960), (576, 1536), (1536, 576), (576, 49152)]  # qkv, gate/up, down, lm_head
MS = (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64, 128, 255)
TILES = (8, 16, 32)
COST_MS = (1, 8, 64, 256)


def paths(weight, dtype):
    """(name, f(x) -> y) for every linear path vLLM's CPU dispatch may take for this weight here."""
    import torch
    import torch.nn.functional as F

    found = [("F.linear", lambda x: F.linear(x, weight))]
    try:
        from vllm import _custom_ops as ops
        from vllm.model_executor.layers.utils import check_cpu_sgl_kernel
    except ImportError:
        return found
    if ops._supports_onednn:
        try:
            handler = ops.create_onednn_mm(weight.t(), 32)
            found.append(("onednn_mm", lambda x, h=handler: ops.onednn_mm(h, x, None)))
        except RuntimeError as e:
            found.append((f"onednn_mm (unavailable: {str(e)[:40]})", None))
    n, k = weight.shape
    if check_cpu_sgl_kernel(n, k, dtype):
        packed = torch.ops._C.convert_weight_packed(weight)
        found.append(("sgl weight_packed_linear", lambda x, p=packed: ops.weight_packed_linear_cpu(x, p, n, None)))
    return found


def mode_linear(weight, dtype, name):
    """(geometry, linear(x, weight)) as evalgate's CPU kernels compute this path, or (None, None) where the
    path is not the one vLLM's dispatch picks for this weight (the mode tiles only vLLM's choice)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    from evalgate.kernels.install import linear_for
    from evalgate.kernels.linear import calibrate
    from evalgate.kernels.linear import tiled as mode_tiled

    n, k = weight.shape
    path, fn = linear_for(dispatch_cpu_unquantized_gemm, weight)
    if not name.startswith({"onednn_mm": "onednn_mm", "sgl_weight_packed": "sgl", "torch_linear": "F.linear"}
                           .get(path, path)):
        return None, None
    geometry = calibrate(lambda w: linear_for(dispatch_cpu_unquantized_gemm, w), k, n, dtype)
    return geometry, mode_tiled(lambda x, w, bias=None: fn(x, w), geometry)


def tiled(f, rows, tile):
    import torch

    out = []
    for start in range(0, rows.shape[0], tile):
        chunk = rows[start:start + tile]
        pad = tile - chunk.shape[0]
        if pad:
            chunk = torch.cat([chunk, chunk.new_zeros(pad, chunk.shape[1])])
        out.append(f(chunk)[:tile - pad])
    return torch.cat(out)


def bits(t):
    """The tensor's bit patterns, compared exactly (-0.0 and NaNs included)."""
    import torch

    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def classes_over_m(f, x) -> str:
    """Groups of M whose rows agree bit for bit with each other (by the first row, the common one)."""
    import torch

    reference = {m: bits(f(x[:m])[0]) for m in (*MS, x.shape[0])}
    groups: list[list[int]] = []
    for m, row in reference.items():
        for g in groups:
            if torch.equal(reference[g[0]], row):
                g.append(m)
                break
        else:
            groups.append([m])
    return " | ".join(f"{g[0]}" + (f"..{g[-1]}" if len(g) > 1 else "") + f" ({len(g)})" for g in groups)


def tile_invariant(f, x, tile) -> bool:
    import torch

    torch.manual_seed(1)
    for position in range(tile):
        for _ in range(2):
            others = torch.randn(tile, x.shape[1], dtype=x.dtype)
            others[position] = x[0]
            if not torch.equal(bits(f(others)[position]), bits(tiled(f, x[:1], tile)[0])):
                return False
    return True


def median_seconds(fn, repeats=5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    print(f"CPU: {cpu}; torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{args.threads} thread(s)")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for k, n in SHAPES:
            torch.manual_seed(0)
            weight = (torch.randn(n, k) / math.sqrt(k)).to(dtype)
            x = torch.randn(256, k).to(dtype)
            for name, f in paths(weight, dtype):
                if f is None:
                    print(f"{dtype_name} K={k} N={n} {name}")
                    continue
                line = f"{dtype_name} K={k} N={n} {name}: rows vs M: {classes_over_m(f, x)}"
                line += "; tile invariant: " + ", ".join(f"R={r} {'yes' if tile_invariant(f, x, r) else 'NO'}"
                                                         for r in TILES)
                cost, mode = [], []
                geometry, linear = mode_linear(weight, dtype, name)
                for m in COST_MS:
                    one = median_seconds(lambda m=m: f(x[:m]))
                    tile16 = median_seconds(lambda m=m: tiled(f, x[:m], 16))
                    cost.append(f"M={m} {tile16 / one:.2f}x")
                    if linear is not None:
                        mode.append(f"M={m} {median_seconds(lambda m=m: linear(x[:m], weight)) / one:.2f}x")
                print(line + "; R=16 cost: " + ", ".join(cost), flush=True)
                if linear is not None:
                    print(f"    the mode: {geometry.rows}-row tiles, tail floor {geometry.tail_floor}; cost: "
                          + ", ".join(mode), flush=True)


if __name__ == "__main__":
    main()
