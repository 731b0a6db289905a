"""Exact comparison of token-level records: token ids first (the truth), then every logprob bit."""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass

from .records import Completion


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


def _divergence(i, kind, reference, other, at) -> Divergence:
    ref_id, ref_text, ref_lp = at(reference, i)
    oth_id, oth_text, oth_lp = at(other, i)
    return Divergence(i, kind, ref_id, ref_text, oth_id, oth_text, reference.margin(i), ref_lp, oth_lp)


@dataclass(frozen=True)
class PassDisagreement:
    """A request whose passes within one run disagree (batch variance)."""

    reference_pass: int
    reference_concurrency: int
    other_pass: int
    other_concurrency: int
    differing_passes: int
    divergence: Divergence


def within_run(completions: list[Completion]) -> PassDisagreement | None:
    """Compare every pass of one request with its first pass; report the first disagreeing pass."""
    if not completions:
        return None
    reference = completions[0]
    first: PassDisagreement | None = None
    differing = 0
    for other in completions[1:]:
        div = first_divergence(reference, other)
        if div is None:
            continue
        differing += 1
        if first is None:
            first = PassDisagreement(reference.pass_index, reference.concurrency, other.pass_index,
                                     other.concurrency, 0, div)
    if first is None:
        return None
    return PassDisagreement(first.reference_pass, first.reference_concurrency, first.other_pass,
                            first.other_concurrency, differing, first.divergence)
