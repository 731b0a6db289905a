"""Exact comparison of token-level records: token ids first (the truth), then every logprob bit."""

from __future__ import annotations

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


def first_divergence(reference: Completion, other: Completion) -> Divergence | None:
    """Where `other` first departs from `reference`, found on the arrays: the first differing id, else the
    shorter length, else the first logprob whose float64 bits differ. None: the same ids and bits."""
    import numpy as np

    if reference.digest == other.digest:
        return None
    ref_ids, oth_ids = reference.output_ids, other.output_ids
    common = min(ref_ids.size, oth_ids.size)
    tokens = np.flatnonzero(ref_ids[:common] != oth_ids[:common])
    if tokens.size:
        return _divergence(int(tokens[0]), "token", reference, other)
    if ref_ids.size != oth_ids.size:
        return _divergence(common, "length", reference, other)
    ref_lps, oth_lps = reference.logprobs, other.logprobs
    common = min(ref_lps.size, oth_lps.size)
    bits = np.flatnonzero(ref_lps[:common].astype(np.float64).view(np.uint64)
                          != oth_lps[:common].astype(np.float64).view(np.uint64))
    if bits.size:
        return _divergence(int(bits[0]), "logprob", reference, other)
    if ref_lps.size != oth_lps.size:
        return _divergence(common, "logprob", reference, other)
    return None  # same ids and logprob bits (digests of older encodings may differ)


def max_logprob_delta(reference: Completion, other: Completion) -> float:
    """The largest |Δ logprob| of the sampled tokens over the positions where both chose the same token
    (bits-only drift: how far the numerics moved)."""
    import numpy as np

    n = min(reference.output_ids.size, other.output_ids.size, reference.logprobs.size, other.logprobs.size)
    same = reference.output_ids[:n] == other.output_ids[:n]
    if not same.any():
        return 0.0
    ref, oth = reference.logprobs[:n][same].astype(np.float64), other.logprobs[:n][same].astype(np.float64)
    with np.errstate(invalid="ignore"):  # -inf - -inf
        deltas = np.abs(ref - oth).tolist()
    return max(deltas)  # Python's max, as before: a NaN ranks where it always did


def _at(c: Completion, i: int) -> tuple[int | None, str | None, float | None]:
    if i >= c.output_ids.size:
        return None, None, None
    text = c.token_texts[i] if i < len(c.token_texts) else None
    lp = float(c.logprobs[i]) if i < c.logprobs.size else None
    return int(c.output_ids[i]), text, lp


def _divergence(i: int, kind: str, reference: Completion, other: Completion) -> Divergence:
    ref_id, ref_text, ref_lp = _at(reference, i)
    oth_id, oth_text, oth_lp = _at(other, i)
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
