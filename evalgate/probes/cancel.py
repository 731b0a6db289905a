"""`cancel` (factor cancel): each request among `CANCELLED` neighbours whose clients leave while it decodes.
The cancel path frees a running request's blocks and reshapes the batch mid-step; GRIEF found silent
output corruption there (vllm#39146).

Two passes, so that each comparison changes one thing (docs/conditions.md, "Probes"):
- the **control** (factor `neighbours`, against pass 0, the request alone): the neighbours arrive with the
  request at step 0 and *finish* at steps spread over its decode, one after another (their `max_tokens`
  ends each on its step);
- the **treatment** (factor `cancel`, against the control): the same neighbours at the same steps, each
  *aborted* by request id on the step where it finished in the control. The batch has the same shape at
  every step in both, so the abort path is the only difference; on a CPU where any batch above 1 changes
  bits, that difference shows in the control, never in the treatment.

Both run inside a step-placed replay (evalgate/execution/replay.py): the in-process `vllm` kind (and the
fake test engine). The replay's counts (sent, completed, cancelled) are recorded with each pass.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..configuration.prompts import SCORING_TYPES
from ..configuration.remedy import Remedy
from ..configuration.trace import Cancel as TraceCancel
from ..configuration.trace import Event, Trace
from .base import AddPass, PlanContext, Probe, Wave, WaveContext

CANCELLED = 4  # neighbours per request
CONTROL = "control"
NEIGHBOUR_TOKENS = 64  # prompt tokens per neighbour


class Cancel(Probe):
    name = "cancel"
    factor = "cancel"
    words = "neighbours cancelled mid-decode"
    remedy = Remedy("an engine fix (vLLM's abort path): report it with the repro pack; none in the settings")

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        if context.placement != "step":
            return "needs exact placement: the in-process `vllm` kind aborts neighbours between engine steps"
        if not context.generating:
            return "no generation requests (lm-eval scoring requests have no decode to cancel into)"
        control = add(CANCELLED + 1, factor="neighbours", variant=CONTROL)
        add(CANCELLED + 1, reference=control)
        return None

    def waves(self, pass_, keys: list[str], context: WaveContext) -> Iterator[Wave]:
        for key in keys:
            prompt = context.prompts[key]
            if prompt.request_type in SCORING_TYPES:
                yield Wave.of([prompt])  # a prefill already: nothing decodes while a neighbour leaves
                continue
            n = int(context.engine.suite.sampling_for(prompt)["max_tokens"])
            trace = cancel_trace(n, context.engine.max_model_len, aborted=pass_.variant != CONTROL)
            yield Wave([prompt], [True], trace=trace)

    def label(self, reference, other) -> str:
        if other.variant == CONTROL:
            return f"neighbours: alone→among {CANCELLED} neighbours that finish mid-decode (cancel probe's control)"
        return f"cancel: {CANCELLED} neighbours finishing mid-decode→aborted on the same steps (cancel)"

    def proof(self, engine, before: Any, outputs) -> tuple[dict[str, Any], str | None]:
        return {}, None  # the replay's own counts are recorded as the pass's `load` (sent, cancelled)


def cancel_trace(max_tokens: int, max_model_len: int, *, aborted: bool = True) -> Trace:
    """`CANCELLED` neighbours arriving with the request and leaving one after another while it decodes:
    aborted after `leave` steps, or (the control) finished by `max_tokens = leave` on the same step, so the
    batch has the same shape at every step either way (a request makes one token a step)."""
    tokens = max(1, min(NEIGHBOUR_TOKENS, max_model_len - max_tokens - 10))
    events = []
    for i in range(CANCELLED):
        leave = 1 + (i * max(1, max_tokens - 1)) // CANCELLED  # from the request's first decode step on
        events.append(Event(i + 1, f"cancelled-{i}", 0.0, tokens=tokens, max_tokens=max_tokens + 8,
                            cancel=TraceCancel("steps", leave))
                      if aborted else Event(i + 1, f"cancelled-{i}", 0.0, tokens=tokens, max_tokens=leave))
    # the request arrives after its neighbours, on the same step (a marker's line is its place in the step)
    events.append(Event(CANCELLED + 1, "gated", 0.0, gated=True))
    # (the same event ids: a neighbour's prompt is seeded by its id, so both passes share the same neighbours)
    return Trace(tuple(events), "step", "cancel probe" if aborted else "cancel probe's control")


PROBE = Cancel  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
