"""`cancel` (factor cancel): each request among `CANCELLED` neighbours whose clients leave while it decodes,
against the request alone (pass 0). The cancel path frees a running request's blocks and reshapes the
batch mid-step; GRIEF found silent output corruption there (vllm#39146).

Each request runs inside a replay (evalgate/execution/replay.py): the neighbours arrive with it at step 0
and are aborted by request id at steps spread over its decode, one after another. That needs exact
placement: the in-process `vllm` kind (and the fake test engine). The replay's counts (sent, cancelled)
are recorded with the pass; a pass in which no neighbour was cancelled is reported as not run. A
difference may also come from sharing the batch at all: the `needle` and `batch_edges` probes, or the
schedule's batch sizes, tell that apart.
"""

from __future__ import annotations

from typing import Any, Iterator

from ...configuration.prompts import SCORING_TYPES
from ...configuration.trace import Event, Trace
from .base import AddPass, PlanContext, Probe, Wave, WaveContext

CANCELLED = 4  # neighbours per request
NEIGHBOUR_TOKENS = 64  # prompt tokens per neighbour


class Cancel(Probe):
    name = "cancel"
    factor = "cancel"
    words = "neighbours cancelled mid-decode"
    remedy = "an engine fix (vLLM's abort path): report it with the repro pack; none in the settings"

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        if context.placement != "step":
            return "needs exact placement: the in-process `vllm` kind aborts neighbours between engine steps"
        if not context.generating:
            return "no generation requests (lm-eval scoring requests have no decode to cancel into)"
        add(CANCELLED + 1)
        return None

    def waves(self, pass_, keys: list[str], context: WaveContext) -> Iterator[Wave]:
        for key in keys:
            prompt = context.prompts[key]
            if prompt.request_type in SCORING_TYPES:
                yield Wave.of([prompt])  # a prefill already: nothing decodes while a neighbour leaves
                continue
            n = int(context.engine.suite.sampling_for(prompt)["max_tokens"])
            yield Wave([prompt], [True], trace=cancel_trace(n, context.engine.max_model_len))

    def label(self, reference, other) -> str:
        return f"cancel: alone→among {CANCELLED} neighbours aborted mid-decode (cancel)"

    def proof(self, engine, before: Any, outputs) -> tuple[dict[str, Any], str | None]:
        return {}, None  # the replay's own counts are recorded as the pass's `load` (sent, cancelled)


def cancel_trace(max_tokens: int, max_model_len: int) -> Trace:
    """`CANCELLED` neighbours arriving with the request and leaving one after another while it decodes."""
    tokens = max(1, min(NEIGHBOUR_TOKENS, max_model_len - max_tokens - 10))
    events = [Event(0, "gated", 0.0, gated=True)]
    for i in range(CANCELLED):
        leave = 1 + (i * max(1, max_tokens - 1)) // CANCELLED  # from the request's first decode step on
        events.append(Event(i + 1, f"cancelled-{i}", 0.0, tokens=tokens, max_tokens=max_tokens + 8, cancel_steps=leave))
    return Trace(tuple(events), "step", "cancel probe")


PROBE = Cancel  # the registry finds a built-in probe by its module name (evalgate/execution/probes/__init__.py)
