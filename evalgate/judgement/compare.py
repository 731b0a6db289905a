"""Exact comparison of token-level records: token ids first (the truth), then every logprob bit."""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass

from ..configuration.schedule import Pass
from ..records import Completion


@dataclass(frozen=True)
class Divergence:
    """Where `other` first departs from `reference`.

    kind: `token` (different ids), `length` (one output is a prefix of the other) or `logprob` (same ids,
    different logprob bits). margin: the reference's top-1 minus top-2 logprob at that position; tiny
    means numerics flipped a near-tie, large means the model really changed.
    """

    position: int
    kind: str
    reference_id: int | None
    reference_text: str | None
    other_id: int | None
    other_text: str | None
    margin: float | None
    reference_logprob: float | None = None
    other_logprob: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def first_divergence(reference: Completion, other: Completion) -> Divergence | None:
    if reference.digest == other.digest:
        return None
    ref_ids, oth_ids = reference.output_ids, other.output_ids

    def at(c: Completion, i: int) -> tuple[int | None, str | None, float | None]:
        if i >= len(c.output_ids):
            return None, None, None
        text = c.token_texts[i] if i < len(c.token_texts) else None
        lp = c.logprobs[i] if i < len(c.logprobs) else None
        return c.output_ids[i], text, lp

    for i, (a, b) in enumerate(zip(ref_ids, oth_ids)):
        if a != b:
            return _divergence(i, "token", reference, other, at)
    if len(ref_ids) != len(oth_ids):
        return _divergence(min(len(ref_ids), len(oth_ids)), "length", reference, other, at)
    for i, (a, b) in enumerate(zip(reference.logprobs, other.logprobs)):
        if _bits(a) != _bits(b):
            return _divergence(i, "logprob", reference, other, at)
    if len(reference.logprobs) != len(other.logprobs):
        return _divergence(min(len(reference.logprobs), len(other.logprobs)), "logprob", reference, other, at)
    return None  # same ids and logprob bits (digests of older encodings may differ)


def max_logprob_delta(reference: Completion, other: Completion) -> float:
    """The largest |Δ logprob| of the sampled tokens over the positions where both chose the same token
    (bits-only drift: how far the numerics moved)."""
    return max((abs(a - b) for a, b, x, y in zip(reference.logprobs, other.logprobs, reference.output_ids,
                                                    other.output_ids) if x == y), default=0.0)


def _divergence(i, kind, reference, other, at) -> Divergence:
    ref_id, ref_text, ref_lp = at(reference, i)
    oth_id, oth_text, oth_lp = at(other, i)
    return Divergence(i, kind, ref_id, ref_text, oth_id, oth_text, reference.margin(i), ref_lp, oth_lp)


@dataclass(frozen=True)
class PassDifference:
    """A pass whose output differs from its reference pass's: attributed to the pass's `factor`."""

    reference: Pass
    other: Pass
    divergence: Divergence

    @property
    def factor(self) -> str | None:
        return self.other.factor


@dataclass(frozen=True)
class PassDisagreement:
    """A request whose passes within one run disagree (batch variance): the first differing comparison,
    and every factor under which the request varies."""

    reference_pass: int
    reference_concurrency: int
    other_pass: int
    other_concurrency: int
    differing_passes: int
    divergence: Divergence
    factor: str | None = None
    differences: tuple[PassDifference, ...] = ()

    @property
    def factors(self) -> list[str | None]:
        return list(dict.fromkeys(d.factor for d in self.differences))


def pass_differences(completions: list[Completion], passes: list[Pass] | None = None) -> list[PassDifference]:
    """Compare every pass of one request with its reference pass (schedule.py). Without a recorded plan,
    every pass is compared with the first, unattributed."""
    if not completions:
        return []
    by_index = {c.pass_index: c for c in completions}
    if not passes:
        first = completions[0].pass_index
        passes = [Pass(c.pass_index, c.concurrency, 0, None, reference=None if c.pass_index == first else first)
                  for c in completions]
    plan = {p.index: p for p in passes}
    found = []
    for p in passes:
        reference, other = by_index.get(p.reference) if p.reference is not None else None, by_index.get(p.index)
        if reference is None or other is None:
            continue
        divergence = first_divergence(reference, other)
        if divergence is not None:
            ref_pass = plan.get(p.reference) or Pass(p.reference, reference.concurrency, 0, None)
            found.append(PassDifference(ref_pass, p, divergence))
    return found


def within_run(completions: list[Completion], passes: list[Pass] | None = None,
               factors: tuple[str, ...] | None = None) -> PassDisagreement | None:
    """The request's batch variance, if any: the first pass (in pass order) that differs from its reference.
    `factors`: consider only comparisons of these factors (the batch bisector: who shared the batch)."""
    differences = [d for d in pass_differences(completions, passes) if factors is None or d.factor in factors]
    if not differences:
        return None
    first = differences[0]
    return PassDisagreement(first.reference.index, first.reference.concurrency, first.other.index,
                            first.other.concurrency, len(differences), first.divergence, first.factor,
                            tuple(differences))
