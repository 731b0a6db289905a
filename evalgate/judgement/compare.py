"""Exact comparison of token-level records: token ids first (the truth), then every logprob bit."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

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


class Compared(NamedTuple):
    """Two outputs compared on their arrays: where the other first departs (`position`, `kind`; None: the
    same ids and logprob bits) and the largest |Δ logprob| over the positions where both chose the same token."""

    position: int | None
    kind: str | None
    max_delta: float


def compare_outputs(pairs: list[tuple[Completion, Completion]]) -> list[Compared]:
    """Each (reference, other) pair compared, all pairs at once on their arrays (no Python object per
    token): the first differing id, else the shorter length, else the first logprob whose float64 bits
    differ; and the largest |Δ logprob| of the sampled tokens where both chose the same token (Python's
    `max` over them, in position order: a NaN first ranks first, a NaN later is passed over)."""
    import numpy as np

    if not pairs:
        return []
    sizes = [(a.output_ids.size, b.output_ids.size, a.logprobs.size, b.logprobs.size) for a, b in pairs]
    common = [min(na, nb) for na, nb, _, _ in sizes]
    common_lps = [min(la, lb) for _, _, la, lb in sizes]
    both = [min(n, m) for n, m in zip(common, common_lps)]  # positions with an id and a logprob on both sides
    ref_ids = _joined([a.output_ids for a, _ in pairs], common, np.int64)
    oth_ids = _joined([b.output_ids for _, b in pairs], common, np.int64)
    ref_lps = _joined([a.logprobs for a, _ in pairs], common_lps, np.float64)
    oth_lps = _joined([b.logprobs for _, b in pairs], common_lps, np.float64)
    same_ids = ref_ids == oth_ids
    first_token = _first_in_segments(~same_ids, common)
    first_bit = _first_in_segments(ref_lps.view(np.uint64) != oth_lps.view(np.uint64), common_lps)
    # |Δ| where both chose the same token, over the positions both sides have ids and logprobs for
    with np.errstate(invalid="ignore"):  # -inf - -inf
        deltas = np.abs(ref_lps - oth_lps)
    if both != common_lps:
        deltas = deltas[_within(common_lps, both)]
    if both != common:
        same_ids = same_ids[_within(common, both)]
    max_delta = _python_max_in_segments(deltas, same_ids, both)
    found = []
    for (a, b), (na, nb, la, lb), n, m, token, bit, delta in zip(pairs, sizes, common, common_lps, first_token.tolist(),
                                                                 first_bit.tolist(), max_delta.tolist()):
        if a.digest == b.digest:
            found.append(Compared(None, None, delta))
        elif token < n:
            found.append(Compared(token, "token", delta))
        elif na != nb:
            found.append(Compared(n, "length", delta))
        elif bit < m:
            found.append(Compared(bit, "logprob", delta))
        elif la != lb:
            found.append(Compared(m, "logprob", delta))
        else:  # same ids and logprob bits (digests of older encodings may differ)
            found.append(Compared(None, None, delta))
    return found


def _joined(arrays: list, lengths: list[int], dtype):
    """The first `lengths[i]` of each array, joined, as `dtype`."""
    import numpy as np

    parts = [array if array.size == n else array[:n] for array, n in zip(arrays, lengths)]
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def _starts(sizes: list[int]):
    import numpy as np

    sizes_array = np.asarray(sizes, dtype=np.int64)
    return np.cumsum(sizes_array) - sizes_array, sizes_array


def _first_in_segments(flags, sizes: list[int]):
    """Per segment of `flags` (consecutive, of `sizes`), the index within it of its first True; its size if none."""
    import numpy as np

    starts, sizes_array = _starts(sizes)
    hits = np.flatnonzero(flags)
    at = np.searchsorted(hits, starts)  # the first hit at or after each segment's start
    first = np.append(hits, flags.size)[at] - starts
    return np.minimum(first, sizes_array)


def _within(sizes: list[int], limits: list[int]):
    """A mask over segments of `sizes`: the first `limits[i]` of segment i."""
    import numpy as np

    starts, sizes_array = _starts(sizes)
    local = np.arange(int(sizes_array.sum())) - np.repeat(starts, sizes_array)
    return local < np.repeat(np.asarray(limits, dtype=np.int64), sizes_array)


def _python_max_in_segments(values, chosen, sizes: list[int]):
    """Per segment (of `sizes`), Python's `max` over the chosen values in order, 0.0 with none chosen:
    NaN when the first chosen is NaN, else the largest of the others (a later NaN is passed over)."""
    import numpy as np

    starts, sizes_array = _starts(sizes)
    first = _first_in_segments(chosen, sizes)
    result = np.zeros(len(sizes))
    filled = first < sizes_array
    if filled.any():
        masked = np.where(chosen, values, -np.inf)
        result[filled] = np.fmax.reduceat(masked, starts[filled])  # NaN only where all chosen are NaN
        result[filled] = np.where(np.isnan(values[(starts + first)[filled]]), np.nan, result[filled])
    return result


class Comparisons:
    """Pairs of outputs compared together (`compare_outputs`), then read one at a time. Keyed by the two
    digests: what is compared (ids and logprob bits) is exactly what a digest covers."""

    def __init__(self):
        self._found: dict[tuple[str, str], Compared] = {}

    def prepare(self, pairs: list[tuple[Completion, Completion]]) -> None:
        """Compare these pairs at once (those not compared yet)."""
        wanted = {}
        for a, b in pairs:
            if (a.digest, b.digest) not in self._found:
                wanted.setdefault((a.digest, b.digest), (a, b))
        if wanted:
            self._found.update(zip(wanted, compare_outputs(list(wanted.values()))))

    def compared(self, reference: Completion, other: Completion) -> Compared:
        key = (reference.digest, other.digest)
        if key not in self._found:
            self.prepare([(reference, other)])
        return self._found[key]

    def divergence(self, reference: Completion, other: Completion) -> Divergence | None:
        """Where `other` first departs from `reference` (`first_divergence`)."""
        found = self.compared(reference, other)
        return None if found.position is None else _divergence(found.position, found.kind, reference, other)

    def max_delta(self, reference: Completion, other: Completion) -> float:
        return self.compared(reference, other).max_delta


def first_divergence(reference: Completion, other: Completion) -> Divergence | None:
    """Where `other` first departs from `reference`: the first differing id, else the shorter length, else
    the first logprob whose float64 bits differ. None: the same ids and bits. Many pairs: `Comparisons`."""
    if reference.digest == other.digest:
        return None
    return Comparisons().divergence(reference, other)


def max_logprob_delta(reference: Completion, other: Completion) -> float:
    """The largest |Δ logprob| of the sampled tokens over the positions where both chose the same token
    (bits-only drift: how far the numerics moved); 0.0 where there is none."""
    return Comparisons().max_delta(reference, other)


def _at(c: Completion, i: int) -> tuple[int | None, str | None, float | None]:
    token_id = c.id_at(i)
    if token_id is None:
        return None, None, None
    return token_id, c.token_text(i), c.logprob_at(i)


def _divergence(i: int, kind: str, reference: Completion, other: Completion) -> Divergence:
    ref_id, ref_text, ref_lp = _at(reference, i)
    oth_id, oth_text, oth_lp = _at(other, i)
    return Divergence(i, kind, ref_id, ref_text, oth_id, oth_text, reference.margin(i), ref_lp, oth_lp)


@dataclass(frozen=True)
class PassDifference:
    """A pass whose output differs from its reference pass's: attributed to the pass's `factor`."""

    reference: Pass
    other: Pass
    compared: Compared
    outputs: tuple[Completion, Completion] = field(repr=False, compare=False)  # (reference, other)

    @property
    def factor(self) -> str | None:
        return self.other.factor

    @property
    def kind(self) -> str:
        return self.compared.kind

    @cached_property
    def divergence(self) -> Divergence:
        """Built when read (its texts and margin are read from the outputs): a judgement shows the first."""
        return _divergence(self.compared.position, self.compared.kind, *self.outputs)


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


def pass_pairs(completions: list[Completion], passes: list[Pass] | None = None) -> list[tuple[Pass, Pass, Completion, Completion]]:
    """Each pass of one request with its reference pass (schedule.py), both present: (reference pass, pass,
    reference output, output). Without a recorded plan, every pass is paired with the first, unattributed."""
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
        if reference is not None and other is not None:
            found.append((plan.get(p.reference) or Pass(p.reference, reference.concurrency, 0, None), p, reference, other))
    return found


def differing_pairs(pairs: list[tuple[Pass, Pass, Completion, Completion]],
                    comparisons: Comparisons | None = None) -> list[PassDifference]:
    """The `pass_pairs` that differ. `comparisons`: where the judge compared many requests' pairs at once."""
    if comparisons is None:
        comparisons = Comparisons()
        comparisons.prepare([(reference, other) for _, _, reference, other in pairs])
    found = []
    for ref_pass, p, reference, other in pairs:
        compared = comparisons.compared(reference, other)
        if compared.position is not None:
            found.append(PassDifference(ref_pass, p, compared, (reference, other)))
    return found


def within_run(completions: list[Completion], passes: list[Pass] | None = None,
               factors: tuple[str, ...] | None = None) -> PassDisagreement | None:
    """The request's batch variance, if any: the first pass (in pass order) that differs from its reference.
    `factors`: consider only comparisons of these factors (the batch bisector: who shared the batch)."""
    return disagreement_of(pass_pairs(completions, passes), factors=factors)


def disagreement_of(pairs: list[tuple[Pass, Pass, Completion, Completion]], comparisons: Comparisons | None = None,
                 factors: tuple[str, ...] | None = None) -> PassDisagreement | None:
    """`within_run` of a request's `pass_pairs`, compared in `comparisons` (None: here)."""
    differences = [d for d in differing_pairs(pairs, comparisons) if factors is None or d.factor in factors]
    if not differences:
        return None
    first = differences[0]
    return PassDisagreement(first.reference.index, first.reference.concurrency, first.other.index,
                            first.other.concurrency, len(differences), first.divergence, first.factor,
                            tuple(differences))
