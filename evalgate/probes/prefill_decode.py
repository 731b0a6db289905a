"""`prefill_decode` (factor prefill_decode): each request's pass-0 output ids re-scored by one prefill,
prompt ids plus output ids as token ids (never re-encoded text), compared bit for bit with the decode's
logprobs.
"""

from __future__ import annotations

from typing import Iterator

from ..configuration.prompts import SCORING_TYPES, Prompt
from ..configuration.remedy import Remedy
from .base import AddPass, PlanContext, Probe, Wave, WaveContext


class PrefillDecode(Probe):
    name = "prefill_decode"
    factor = "prefill_decode"
    words = "prefill vs decode"
    remedy = Remedy("batch invariance (batch_invariant = true): its kernels make prefill and decode agree")

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        if not context.generating:
            return "the suite has no generation requests (lm-eval scoring requests are prefills already)"
        add(1)
        return None

    def waves(self, pass_, keys: list[str], context: WaveContext) -> Iterator[Wave]:
        for key in keys:
            p, done = context.prompts[key], context.reference.get(key)
            if p.request_type in SCORING_TYPES or done is None or not done.output_ids.size:
                continue  # already a prefill, or nothing was generated
            yield Wave.of([rescoring(p, context.prompt_ids[key], done.output_ids.tolist())])

    def label(self, reference, other) -> str:
        return "prefill vs decode: the output re-scored by one prefill"


def rescoring(prompt: Prompt, prompt_ids: list[int], output_ids: list[int]) -> Prompt:
    """A scoring request for `output_ids` after `prompt_ids`: one prefill of the ids, never re-encoded text."""
    return Prompt(prompt.key, prompt.text, max_tokens=None, line=prompt.line, request_type="loglikelihood",
                  segments=((tuple(prompt_ids), tuple(output_ids)),), continuation="", location=prompt.location)


PROBE = PrefillDecode  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
