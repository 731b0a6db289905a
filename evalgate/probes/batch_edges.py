"""`batch_edges` (factor batch_size): batch sizes around a CUDA-graph capture size.

s-1, s and s+1 for the largest capture size s the suite can fill (s-1 left out where it is pass 0's
size); the first is compared with pass 0, each next one with the one below it. Capture sizes come from the
engine's config; an engine without CUDA graphs (CPU, eager) uses vLLM's default list.
"""

from __future__ import annotations

from ..engines.defaults import capture_sizes
from .base import AddPass, PlanContext, Probe


class BatchEdges(Probe):
    name = "batch_edges"
    factor = "batch_size"

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        sizes = [s for s in capture_sizes(context.capture_sizes) if 2 <= s <= context.requests - 1]
        if not sizes:
            return f"the suite has {context.requests} request(s): a batch edge s-1, s, s+1 needs at least 3"
        edge = max(sizes)
        reference = 0  # the first edge against pass 0, then each size against the one below it
        for size in (edge - 1, edge, edge + 1):
            if size != context.passes[0].concurrency:
                reference = add(size, reference=reference)
        return None

    def label(self, reference, other) -> str:
        return f"batch size {reference.concurrency}→{other.concurrency} (batch edge)"


PROBE = BatchEdges  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
