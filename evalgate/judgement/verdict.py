"""Verdicts (**contract**, docs/design.md "Verdicts"): one per request, decided once (`judge_requests`)
along its two paths: within the run, then against the baseline. The run's exit code follows from them
(report.py).

- batch_variance: the passes of this run disagree. Always a failure.
- silent_regression: differs from the baseline while every identity component is equal. A failure.
- explained_change: differs from the baseline and some component changed (listed). Not a failure unless
  strict. `suite` explains a request only when that request's own text or sampling changed, `prompt` only
  when, the request unchanged, the prompt ids the engine was given changed (prompts.py: a template's date,
  a renderer upgrade).
- new / missing: the key is only in this run / only in the baseline. Not failures unless strict.
- stable: every pass identical (ids and logprob bits) and equal to the baseline.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from ..codec import omitted, stored_as
from ..configuration.policy import BITS_ONLY, GatePolicy
from ..configuration.schedule import HOT, UNKNOWN, Pass, passes_of
from ..store import RunRecord
from .adapters import request_change
from .compare import Comparisons, Divergence, disagreement_of, pass_pairs
from .factors import comparison_label
from .prompts import PromptChange, prompt_change

VERDICTS = ("stable", "batch_variance", "silent_regression", "explained_change", "new", "missing")
FAILURES = ("batch_variance", "silent_regression")
STRICT_FAILURES = FAILURES + ("explained_change", "new", "missing")



@dataclass(frozen=True)
class FactorRow:
    """One comparison of the run (`factor_summary`): what changed between two passes, and which requests differ."""

    factor: str | None
    comparison: str
    reference_pass: int
    pass_: int = stored_as("pass")
    differing: int = 0
    compared: int | None = None  # requests that ran in both passes (None: a report from before it was counted)
    requests: int | None = None
    keys: list[str] = field(default_factory=list)  # the first 20 that differ


@dataclass(frozen=True)
class CacheHits:
    """A hot pass: how many requests the engine served from its prefix cache (`unknown`: it did not say)."""

    pass_: int = stored_as("pass")
    hit: int = 0
    missed: int = 0
    unknown: int = 0


@dataclass(frozen=True)
class RequestVerdict:
    key: str
    verdict: str
    location: str | None = None
    divergence: Divergence | None = None
    # For batch_variance: which passes disagree. For baseline differences: None.
    passes: dict | None = None
    components: list[str] = field(default_factory=list)  # what explains an explained_change
    factor: str | None = None  # batch_variance: the factor of the first differing comparison (factors.py)
    # The kinds of every difference found (token, length, logprob): `logprob` alone is bits-only drift
    kinds: frozenset = frozenset()
    max_delta: float | None = None  # the largest |Δ logprob| over the differing outputs' same-token positions
    flip: str | None = None  # a token flip's class under the policy: near_tie | confident (policy.py)
    # a difference from another hardware class's baseline: drift | near_tie | confident (judgement/hardware.py)
    across: str | None = None
    prompt: PromptChange | None = None  # where the rendered prompt moved, when `prompt` explains the change
    # the LoRA adapter the request ran under (None: the base model; left out, so older reports are unchanged)
    adapter: str | None = omitted()

    @property
    def bits_only(self) -> bool:
        return self.kinds == {BITS_ONLY}

    def json_extra(self) -> dict:
        """For readers of the JSON: whether only logprob bits differ (None for new and missing requests)."""
        return {"bits_only": self.bits_only if self.kinds else None}

    @classmethod
    def from_older(cls, data: dict) -> dict:
        """`kinds` since reports were stored; before, only whether the difference was in logprob bits alone."""
        return data if "kinds" in data else {**data, "kinds": [BITS_ONLY] if data.get("bits_only") else []}

    @property
    def difference_class(self) -> str | None:
        """What kind of difference this is, for people: drift (bits only), near_tie or confident; across
        hardware the cross-hardware class, within a run the flip's class."""
        if self.across:
            return self.across
        if self.verdict not in (*FAILURES, "explained_change"):
            return None
        return "drift" if self.bits_only else self.flip


@dataclass(frozen=True)
class Decided:
    """Every request's verdict, decided once (`judge_requests`), with the keys that differ per pass (pass
    index -> keys), what the run's comparisons section counts."""

    verdicts: list[RequestVerdict]
    varying: dict[int, list[str]]


def judge_requests(current: RunRecord, baseline: RunRecord | None, policy: GatePolicy, changed: list[str],
                   in_scope=lambda key: True) -> Decided:
    """One verdict per request: within the run first (its passes must agree: `variance_verdict`), then against
    the baseline (`baseline_verdict`). `changed`: the identity components that differ from the baseline's;
    `in_scope(key)`: whether a baseline key belongs to this run at all (False for other shards' keys, which
    are then not `missing`)."""
    passes = passes_of(current.run.schedule)
    pairs = matching_passes(passes_of(baseline.run.schedule), passes) if baseline else []
    # Digests first: a request whose outputs all have one digest, the baseline's included, is stable
    # without a token being read. Only the others are compared on their tokens (read together).
    uniform = {key for key in current.requests if _stable_by_digest(
        current.digests.get(key, ()),
        None if baseline is None else baseline.digests.get(key, ()) if key in baseline.requests else ())}
    differing = [key for key in current.requests if key not in uniform]
    # The others are compared all at once on their arrays: each pass with its reference pass, then the
    # requests whose passes agree with the baseline's passes of the same conditions.
    current.prefetch(differing)
    comparisons = Comparisons()
    plans = {key: pass_pairs(current.outputs.get(key, []), passes) for key in differing}
    comparisons.prepare([(ref, other) for plan in plans.values() for _, _, ref, other in plan])
    disagreements = {key: disagreement_of(plan, comparisons) for key, plan in plans.items()}
    if baseline is not None:
        agreeing = [key for key in differing if disagreements[key] is None and key in baseline.requests]
        baseline.prefetch(agreeing)
        comparisons.prepare([pair for key in agreeing for pair in _baseline_pairs(current, baseline, key, pairs)])
    verdicts: list[RequestVerdict] = []
    varying: dict[int, list[str]] = {}
    for key, request in current.requests.items():
        disagreement = disagreements.get(key)
        if key in uniform or (disagreement is None and baseline is None):
            verdicts.append(RequestVerdict(key, "stable", request.location))
        elif disagreement is not None:
            for d in disagreement.differences:
                varying.setdefault(d.other.index, []).append(key)
            verdicts.append(variance_verdict(key, request.location, disagreement, current.outputs.get(key, []),
                                             comparisons, policy))
        else:
            verdicts.append(baseline_verdict(key, request, current, baseline, pairs, comparisons, policy, changed))
    if baseline is not None:
        verdicts += [RequestVerdict(key, "missing", base_request.location, components=["suite"])
                     for key, base_request in baseline.requests.items() if key not in current.requests and in_scope(key)]
    adapters = {**(baseline.fingerprint.request_adapters if baseline else {}), **current.fingerprint.request_adapters}
    if adapters:
        verdicts = [replace(v, adapter=adapters.get(v.key)) for v in verdicts]
    return Decided(verdicts, varying)


def variance_verdict(key: str, location: str | None, disagreement, completions: list, comparisons: Comparisons,
                     policy: GatePolicy) -> RequestVerdict:
    """A request whose passes disagree: batch variance, with the comparison that first showed it."""
    by_pass = {c.pass_index: c for c in completions}
    delta = max(comparisons.max_delta(by_pass[d.reference.index], by_pass[d.other.index])
                for d in disagreement.differences)
    flip = next((policy.flip_class(d.kind, d.divergence.margin) for d in disagreement.differences
                 if d.kind == "token"), None)
    return RequestVerdict(
        key, "batch_variance", location, disagreement.divergence, factor=disagreement.factor,
        kinds=frozenset(d.kind for d in disagreement.differences), max_delta=delta, flip=flip,
        passes={"reference_pass": disagreement.reference_pass, "reference_concurrency": disagreement.reference_concurrency,
                "other_pass": disagreement.other_pass, "other_concurrency": disagreement.other_concurrency,
                "differing_passes": disagreement.differing_passes, "total_passes": len(completions),
                "factors": disagreement.factors})


def baseline_verdict(key: str, request, current: RunRecord, baseline: RunRecord, pairs: list[PassPair],
                     comparisons: Comparisons, policy: GatePolicy, changed: list[str]) -> RequestVerdict:
    """A request whose passes agree, against the baseline's passes of the same conditions: stable, new,
    an explained change (`changed` components, its own `suite` or its rendered `prompt`) or a silent regression."""
    location = request.location
    base_request = baseline.requests.get(key)
    if base_request is None or not baseline.outputs.get(key):
        return RequestVerdict(key, "new", location, components=["suite"])
    found = []
    for pair, (base, cur) in zip(pairs, _baseline_pairs(current, baseline, key, pairs, present=False)):
        # like with like: the baseline's pass of a condition vs this run's pass of it
        divergence = comparisons.divergence(base, cur) if base is not None and cur is not None else None
        if divergence is not None:
            found.append((pair, divergence, comparisons.max_delta(base, cur)))
    if not found:
        return RequestVerdict(key, "stable", location)
    pair, divergence, _ = found[0]
    explaining = list(changed)
    moved = None
    if base_request.request_hash != request.request_hash:
        # its own text or sampling changed, or its adapter did: its prompt moving follows from that
        explaining += request_change(baseline.fingerprint, current.fingerprint, key)
    else:
        moved = prompt_change(base_request, request)  # the same request: did what the engine saw move?
        if moved is not None:
            explaining.append("prompt")
    return RequestVerdict(
        key, "explained_change" if explaining else "silent_regression", location, divergence, components=explaining,
        prompt=moved, passes={"baseline_pass": pair.baseline_pass, "pass": pair.current_pass, "condition": pair.condition},
        kinds=frozenset(d.kind for _, d, _ in found), max_delta=max(delta for _, _, delta in found),
        flip=next((policy.flip_class(d.kind, d.margin) for _, d, _ in found if d.kind == "token"), None))




def _baseline_pairs(current: RunRecord, baseline: RunRecord, key: str, pairs: list[PassPair], *,
                    present: bool = True) -> list[tuple]:
    """(baseline output, this run's output) of a request for each pair of passes of one condition; with
    `present=False`, one per pair, None where a side has no such pass."""
    base_outputs = {c.pass_index: c for c in baseline.outputs.get(key, [])}
    outputs = {c.pass_index: c for c in current.outputs.get(key, [])}
    found = [(base_outputs.get(pair.baseline_pass), outputs.get(pair.current_pass)) for pair in pairs]
    return [(base, cur) for base, cur in found if not present or (base is not None and cur is not None)]


def _stable_by_digest(mine, theirs) -> bool:
    """Whether every output of a request has one and the same digest, in this run (`mine`: its digest
    rows) and in the baseline (`theirs`; None: there is no baseline): then no comparison can differ."""
    digests = {row[1] for row in mine}
    return len(digests) == 1 and (theirs is None or {row[1] for row in theirs} == digests)


@dataclass(frozen=True)
class PassPair:
    """A baseline pass and this run's pass of the same condition."""

    baseline_pass: int
    current_pass: int
    condition: str
    same_condition: bool = True


def matching_passes(baseline: list[Pass], current: list[Pass]) -> list[PassPair]:
    """Each condition this run shares with the baseline, once (the first pass of it on either side). With
    none in common (different schedules), the two reference passes, marked as different conditions."""
    pairs, seen = [], set()
    first_of = {}
    for p in baseline:
        first_of.setdefault(p.condition, p)
    for p in current:
        base = first_of.get(p.condition)
        if base is not None and p.condition not in seen and p.cache != UNKNOWN:
            seen.add(p.condition)
            pairs.append(PassPair(base.index, p.index, p.condition_label))
    if not pairs:
        base_index = baseline[0].index if baseline else 0
        cur_index = current[0].index if current else 0
        label = (f"baseline {baseline[0].condition_label} vs {current[0].condition_label}"
                 if baseline and current else "first pass vs first pass")
        pairs.append(PassPair(base_index, cur_index, label, same_condition=False))
    return pairs


def passes_ran(record: RunRecord) -> Counter:
    """The passes each request ran in, counted by their set (mostly one set: every request ran in every pass)."""
    return Counter(frozenset(row[0] for row in rows) for rows in record.digests.values())


def factor_summary(passes: list[Pass], varying: dict[int, list[str]], ran: Counter, requests: int) -> list[FactorRow]:
    """One entry per comparison the run made: its factor, what changed, how many requests ran in both
    passes (`compared`, from `passes_ran`) and how many of those differ (`varying`: pass index -> keys)."""
    by_index = {p.index: p for p in passes}
    summary = []
    for p in passes:
        if p.reference is None or p.reference not in by_index:
            continue
        keys = varying.get(p.index, [])
        summary.append(FactorRow(
            p.factor, comparison_label(by_index[p.reference], p), p.reference, p.index, differing=len(keys),
            compared=sum(n for ran_in, n in ran.items() if p.index in ran_in and p.reference in ran_in),
            requests=requests, keys=keys[:20]))
    return summary


def cache_hits(record: RunRecord, passes: list[Pass]) -> list[CacheHits]:
    """For each hot pass: how many requests the engine served from the prefix cache (its count of cached
    prompt tokens), so `hot` is proven, not assumed. `unknown`: the engine did not say."""
    out = []
    for p in passes:
        if p.cache != HOT:
            continue
        counts = [row[2] for rows in record.digests.values() for row in rows if row[0] == p.index]
        out.append(CacheHits(p.index, hit=sum(1 for n in counts if n), missed=sum(1 for n in counts if n == 0),
                             unknown=sum(1 for n in counts if n is None)))
    return out
