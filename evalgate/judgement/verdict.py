"""Verdicts (**contract**, docs/design.md "Verdicts"): one per request, and the run's exit code from them.

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
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from ..configuration.policy import BITS_ONLY, GatePolicy
from ..configuration.schedule import HOT, UNKNOWN, Pass, passes_of
from ..configuration.template_date import recorded_template_date
from ..errors import ExitCode
from ..fingerprint import delta as fingerprint_delta
from ..fingerprint import describe_changes
from ..store import RunRecord
from .compare import Comparisons, Divergence, disagreement_of, pass_pairs
from .factors import comparison_label
from .prompts import PromptChange, prompt_change, prompts_compared

if TYPE_CHECKING:
    from .hardware import AcrossHardware

VERDICTS = ("stable", "batch_variance", "silent_regression", "explained_change", "new", "missing")
FAILURES = ("batch_variance", "silent_regression")
STRICT_FAILURES = FAILURES + ("explained_change", "new", "missing")
REPORT_SCHEMA = "evalgate.report/1"


@dataclass
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

    @property
    def bits_only(self) -> bool:
        return self.kinds == {BITS_ONLY}

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "verdict": self.verdict,
            "location": self.location,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "passes": self.passes,
            "components": self.components,
            "factor": self.factor,
            "bits_only": self.bits_only if self.kinds else None,
            "kinds": sorted(self.kinds),
            "max_delta": self.max_delta,
            "flip": self.flip,
            "across": self.across,
            "prompt": self.prompt.to_dict() if self.prompt else None,
        }

    @classmethod
    def from_dict(cls, data: dict) -> RequestVerdict:
        """A stored verdict (`to_dict`, as `Store.verdicts` and a stored report hold it) back as an object."""
        div = data.get("divergence")
        fields = Divergence.__dataclass_fields__
        return cls(
            key=data["key"], verdict=data["verdict"], location=data.get("location"),
            divergence=Divergence(**{k: v for k, v in div.items() if k in fields}) if div else None,
            passes=data.get("passes"), components=list(data.get("components") or []), factor=data.get("factor"),
            # `kinds` since reports were stored; before, only whether the difference was in logprob bits alone
            kinds=frozenset(data["kinds"] if "kinds" in data else ({BITS_ONLY} if data.get("bits_only") else ())),
            max_delta=data.get("max_delta"),
            flip=data.get("flip"), across=data.get("across"), prompt=PromptChange.from_dict(data.get("prompt")),
        )

    @property
    def difference_class(self) -> str | None:
        """What kind of difference this is, for people: drift (bits only), near_tie or confident; across
        hardware the cross-hardware class, within a run the flip's class."""
        if self.across:
            return self.across
        if self.verdict not in (*FAILURES, "explained_change"):
            return None
        return "drift" if self.bits_only else self.flip


# Rows of a Report (their keys include "pass", a keyword: hence the functional form).
# One comparison of the run (`factor_summary`): what changed between two passes, and which requests differ.
FactorRow = TypedDict("FactorRow", {"factor": "str | None", "comparison": str, "reference_pass": int, "pass": int,
                                    "differing": int, "compared": int, "requests": int, "keys": "list[str]"})
# A hot pass: how many requests the engine served from its prefix cache (`unknown`: it did not say).
CacheHits = TypedDict("CacheHits", {"pass": int, "hit": int, "missed": int, "unknown": int})
# A pass or probe the plan asked for that could not run here, and why (never reported as passed).
NotRun = TypedDict("NotRun", {"pass": str, "reason": str})


class Coverage(TypedDict):
    """The rotating preset: of this run's requests, how many ran alone within the last `window` runs."""

    covered: int
    requests: int
    runs: int
    window: int


@dataclass
class Report:
    """Everything judged about one run: built in one place (gate.judge_records), stored with the run
    (`to_dict`, read back by `from_dict`: gate.stored_report) and rendered by every report from that one
    object. Its sections (`sections`): the run, its identity, its results and the conditions it ran under."""

    kind: str  # baseline | check | diff
    suite_name: str
    run_id: int
    baseline_run_id: int | None
    verdicts: list[RequestVerdict]
    changed_components: list[str]
    batch_invariance: dict[str, Any]  # requested, in_force, reason (the engine fingerprint's)
    strict: bool = False
    promoted: bool = False
    # component -> what changed in it, for people (fingerprint.describe_changes); judged once, rendered anywhere
    fingerprint_changes: dict[str, str] = field(default_factory=dict)
    # lm-eval task metrics, baseline vs current, with the documents that moved (evalgate/judgement/scores.py)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    task_changes: dict[str, str] = field(default_factory=dict)  # lm-eval task -> what changed in its identity
    engine_log: str | None = None  # the engine process's output (vLLM's own lines), for people
    # Per comparison of the run (factor_summary): factor, what changed, requests that differ under it
    factors: list[FactorRow] = field(default_factory=list)
    cache_hits: list[CacheHits] = field(default_factory=list)  # per hot pass
    baseline_pairs: list[dict[str, Any]] = field(default_factory=list)  # PassPair.to_dict(): which baseline pass vs which
    not_run: list[NotRun] = field(default_factory=list)
    # rotating preset: this run's requests that ran alone within the last `window` runs (store.alone_coverage)
    alone_coverage: Coverage | None = None
    policy: GatePolicy = field(default_factory=GatePolicy)  # [gate]: what fails (recorded with the run)
    hardware: AcrossHardware | None = None  # judged against another hardware class's baseline (hardware.py)
    hardware_class: str | None = None  # the run's (gate.judge_and_finish), and for people:
    hardware_label: str | None = None
    # a check's shards merged per hardware class (gate.combine): per class its run, baseline and result
    classes: list[dict[str, Any]] = field(default_factory=list)
    # stable requests not among `verdicts`: a stored report lists only the requests that differ
    stable: int = 0
    # against a baseline: of the requests both runs have, how many rendered prompts are equal (prompts.py)
    prompts: dict[str, int] | None = None
    # the date chat templates rendered with, when one read the calendar: {"date", "baseline_date"} (None: none did)
    template_date: dict[str, Any] | None = None

    @property
    def counts(self) -> dict[str, int]:
        counter = Counter(v.verdict for v in self.verdicts)
        counter["stable"] += self.stable
        return {name: counter.get(name, 0) for name in VERDICTS}

    @property
    def failing(self) -> list[RequestVerdict]:
        """Batch variance and silent regressions that the policy fails on (bits: all; tokens: token flips),
        and with `strict` every other difference too."""
        return [v for v in self.verdicts if (v.verdict in FAILURES and self.policy.fails(set(v.kinds) or {"token"}))
                or (self.strict and v.verdict in STRICT_FAILURES and v.verdict not in FAILURES)]

    @property
    def drift(self) -> list[RequestVerdict]:
        """Differences in logprob bits alone that the policy lets pass (fail_on = "tokens")."""
        return [v for v in self.verdicts if v.verdict in FAILURES and v.bits_only and not self.policy.fails(set(v.kinds))]

    def differences(self) -> dict:
        """Every batch variance and silent regression, split: bits only (with the largest |Δ| and the
        smallest margin at the first divergence) and token flips by class (near tie or confident)."""
        found = [v for v in self.verdicts if v.verdict in FAILURES]
        bits = [v for v in found if v.bits_only]
        margins = [v.divergence.margin for v in bits if v.divergence and v.divergence.margin is not None]
        flips = [v for v in found if v.flip]
        return {
            "fail_on": self.policy.fail_on, "near_tie_margin": self.policy.near_tie_margin,
            "bits_only": len(bits), "drift": len(self.drift),
            "max_delta": max((v.max_delta for v in bits if v.max_delta is not None), default=None),
            "min_margin": min(margins, default=None),
            "token_flips": {"near_tie": sum(v.flip == "near_tie" for v in flips),
                            "confident": sum(v.flip == "confident" for v in flips)},
        }

    @property
    def failing_metrics(self) -> list[dict[str, Any]]:
        """With `[gate] fail_on_metric = "significant_drop"`: the metric rows whose paired test says the metric
        got significantly worse (scores.py, paired.py). By default metrics never fail a run."""
        if self.policy.fail_on_metric != "significant_drop":
            return []
        return [m for m in self.metrics if (m.get("paired") or {}).get("drop")]

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.REGRESSION if self.failing or self.failing_metrics else ExitCode.PASS

    @property
    def status(self) -> str:
        return "regression" if self.failing or self.failing_metrics else "pass"

    def to_dict(self, requests: bool = True) -> dict:
        """The report as JSON (docs/json-report.md); `requests=False`: without the per-request verdicts (the
        run's verdict rows hold them when it is stored)."""
        return {
            "schema": REPORT_SCHEMA,
            "kind": self.kind,
            "suite": self.suite_name,
            "run_id": self.run_id,
            "baseline_run_id": self.baseline_run_id,
            "status": self.status,
            "exit_code": int(self.exit_code),
            "strict": self.strict,
            "promoted": self.promoted,
            "counts": self.counts,
            "changed_components": self.changed_components,
            "batch_invariance": self.batch_invariance,
            **({"requests": [v.to_dict() for v in self.verdicts if v.verdict != "stable"]} if requests else {}),
            "metrics": self.metrics,
            "task_changes": self.task_changes,
            "factors": self.factors,
            "cache_hits": self.cache_hits,
            "baseline_pairs": self.baseline_pairs,
            "not_run": self.not_run,
            "alone_coverage": self.alone_coverage,
            "gate": self.policy.to_dict(),
            "differences": self.differences(),
            "hardware": self.hardware.to_dict() if self.hardware else None,
            "classes": self.classes,
            "fingerprint_changes": self.fingerprint_changes,
            "hardware_class": self.hardware_class,
            "hardware_label": self.hardware_label,
            "prompts": self.prompts,
            "template_date": self.template_date,
            "engine_log": self.engine_log,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Report:
        """A stored report (`to_dict`) read back as it was written: what `evalgate report`, `runs show` and
        the HTML page render."""
        from .hardware import AcrossHardware

        hardware = data.get("hardware")
        return cls(
            kind=data["kind"], suite_name=data["suite"], run_id=data["run_id"], baseline_run_id=data.get("baseline_run_id"),
            verdicts=[RequestVerdict.from_dict(v) for v in data.get("requests") or []],
            changed_components=list(data.get("changed_components") or []),
            batch_invariance=dict(data.get("batch_invariance") or {}), strict=bool(data.get("strict")),
            promoted=bool(data.get("promoted")), fingerprint_changes=dict(data.get("fingerprint_changes") or {}),
            metrics=list(data.get("metrics") or []), task_changes=dict(data.get("task_changes") or {}),
            engine_log=data.get("engine_log"), factors=list(data.get("factors") or []),
            cache_hits=list(data.get("cache_hits") or []), baseline_pairs=list(data.get("baseline_pairs") or []),
            not_run=list(data.get("not_run") or []), alone_coverage=data.get("alone_coverage"),
            policy=GatePolicy.from_dict(data.get("gate")), hardware=AcrossHardware.from_dict(hardware) if hardware else None,
            hardware_class=data.get("hardware_class"), hardware_label=data.get("hardware_label"),
            classes=list(data.get("classes") or []), stable=int((data.get("counts") or {}).get("stable", 0)),
            prompts=data.get("prompts"), template_date=data.get("template_date"),
        )

    def sections(self) -> dict[str, dict[str, Any]]:
        """The report in its four sections, as the HTML page shows them: the run (what was judged, against
        what, under which policy), its identity (what changed since the baseline), its results (verdicts,
        differences, metrics) and the conditions (factors, cache hits, what did not run, other hardware)."""
        return {
            "run": {"kind": self.kind, "suite": self.suite_name, "run_id": self.run_id,
                    "baseline_run_id": self.baseline_run_id, "status": self.status, "exit_code": int(self.exit_code),
                    "strict": self.strict, "promoted": self.promoted, "gate": self.policy.to_dict(),
                    "hardware_class": self.hardware_class, "hardware_label": self.hardware_label},
            "identity": {"changed_components": self.changed_components, "fingerprint_changes": self.fingerprint_changes,
                         "batch_invariance": self.batch_invariance, "task_changes": self.task_changes,
                         "prompts": self.prompts, "template_date": self.template_date},
            "results": {"counts": self.counts, "differences": self.differences(), "metrics": self.metrics,
                        "requests": [v for v in self.verdicts if v.verdict != "stable"]},
            "conditions": {"factors": self.factors, "cache_hits": self.cache_hits, "not_run": self.not_run,
                           "alone_coverage": self.alone_coverage, "baseline_pairs": self.baseline_pairs,
                           "hardware": self.hardware, "classes": self.classes},
        }


def judge(current: RunRecord, baseline: RunRecord | None, *, kind: str = "check", strict: bool = False,
          in_scope=lambda key: True, policy: GatePolicy | None = None) -> Report:
    """`in_scope(key)`: whether a baseline key belongs to this run at all (False for other shards' keys,
    which are then not `missing`). `policy`: what fails (default: the one recorded with the run)."""
    if policy is None:
        policy = GatePolicy.from_dict((current.run.schedule or {}).get("gate"))
    engine = current.fingerprint.get("engine", {}).get("data", {})
    policy = policy.for_dtype(engine.get("dtype"))  # the near-tie margin, by the dtype unless the suite sets it
    changed = fingerprint_delta(baseline.fingerprint, current.fingerprint) if baseline else []
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
    varying: dict[int, list[str]] = {}  # pass index -> keys that differ from that pass's reference
    for key, request in current.requests.items():
        location = request.location
        if key in uniform:
            verdicts.append(RequestVerdict(key, "stable", location))
            continue
        completions = current.outputs.get(key, [])
        disagreement = disagreements[key]
        if disagreement is not None:
            by_pass = {c.pass_index: c for c in completions}
            for d in disagreement.differences:
                varying.setdefault(d.other.index, []).append(key)
            kinds = frozenset(d.kind for d in disagreement.differences)
            delta = max(comparisons.max_delta(by_pass[d.reference.index], by_pass[d.other.index])
                        for d in disagreement.differences)
            flip = next((policy.flip_class(d.kind, d.divergence.margin) for d in disagreement.differences
                         if d.kind == "token"), None)
            verdicts.append(RequestVerdict(
                key, "batch_variance", location, disagreement.divergence, factor=disagreement.factor,
                kinds=kinds, max_delta=delta, flip=flip,
                passes={
                    "reference_pass": disagreement.reference_pass,
                    "reference_concurrency": disagreement.reference_concurrency,
                    "other_pass": disagreement.other_pass,
                    "other_concurrency": disagreement.other_concurrency,
                    "differing_passes": disagreement.differing_passes,
                    "total_passes": len(completions),
                    "factors": disagreement.factors,
                },
            ))
            continue
        if baseline is None:
            verdicts.append(RequestVerdict(key, "stable", location))
            continue
        base_request = baseline.requests.get(key)
        base_outputs = {c.pass_index: c for c in baseline.outputs.get(key, [])}
        if base_request is None or not base_outputs:
            verdicts.append(RequestVerdict(key, "new", location, components=["suite"]))
            continue
        found = []
        for pair, (base, cur) in zip(pairs, _baseline_pairs(current, baseline, key, pairs, present=False)):
            # like with like: the baseline's pass of a condition vs this run's pass of it
            divergence = comparisons.divergence(base, cur) if base is not None and cur is not None else None
            if divergence is not None:
                found.append((pair, divergence, comparisons.max_delta(base, cur)))
        if not found:
            verdicts.append(RequestVerdict(key, "stable", location))
            continue
        pair, divergence, _ = found[0]
        kinds = frozenset(d.kind for _, d, _ in found)
        flip = next((policy.flip_class(d.kind, d.margin) for _, d, _ in found if d.kind == "token"), None)
        explaining = list(changed)
        moved = None
        if base_request.request_hash != request.request_hash:
            explaining.append("suite")  # its own text or sampling changed: its prompt moving follows from that
        else:
            moved = prompt_change(base_request, request)  # the same request: did what the engine saw move?
            if moved is not None:
                explaining.append("prompt")
        verdict = "explained_change" if explaining else "silent_regression"
        verdicts.append(RequestVerdict(key, verdict, location, divergence, components=explaining, prompt=moved,
                                       passes={"baseline_pass": pair.baseline_pass, "pass": pair.current_pass,
                                               "condition": pair.condition},
                                       kinds=kinds, max_delta=max(delta for _, _, delta in found), flip=flip))
    if baseline is not None:
        for key, base_request in baseline.requests.items():
            if key not in current.requests and in_scope(key):
                verdicts.append(RequestVerdict(key, "missing", base_request.location, components=["suite"]))
    return Report(
        kind=kind, suite_name=current.run.suite_name, run_id=current.id,
        baseline_run_id=baseline.id if baseline else None, verdicts=verdicts, changed_components=changed,
        batch_invariance=engine.get("batch_invariance", {}), strict=strict,
        fingerprint_changes=describe_changes(baseline.fingerprint, current.fingerprint,
                                             changed + fingerprint_delta(baseline.fingerprint, current.fingerprint, ("prompt",)))
        if baseline else {},
        factors=factor_summary(passes, varying, current),
        cache_hits=cache_hits(current, passes),
        baseline_pairs=[pair.to_dict() for pair in pairs],
        not_run=list((current.run.schedule or {}).get("not_run") or []),
        policy=policy,
        prompts=prompts_compared(current, baseline) if baseline is not None else None,
        template_date=template_date_of(current, baseline),
    )


def template_date_of(current: RunRecord, baseline: RunRecord | None) -> dict[str, Any] | None:
    """The date the run's chat templates rendered with, beside the baseline's, when a template read it."""
    date = recorded_template_date(current.fingerprint)
    if date is None:
        return None
    return {"date": date, "baseline_date": recorded_template_date(baseline.fingerprint) if baseline else None}


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

    def to_dict(self) -> dict:
        return asdict(self)


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


def factor_summary(passes: list[Pass], varying: dict[int, list[str]], record: RunRecord) -> list[FactorRow]:
    """One entry per comparison the run made: its factor, what changed, how many requests ran in both
    passes (`compared`) and how many of those differ."""
    by_index = {p.index: p for p in passes}
    # the passes each request ran in, counted by their set (mostly one set: every request ran in every pass)
    ran = Counter(frozenset(row[0] for row in rows) for rows in record.digests.values())
    summary = []
    for p in passes:
        if p.reference is None or p.reference not in by_index:
            continue
        keys = varying.get(p.index, [])
        summary.append({"factor": p.factor, "comparison": comparison_label(by_index[p.reference], p),
                        "reference_pass": p.reference, "pass": p.index, "differing": len(keys),
                        "compared": sum(n for ran_in, n in ran.items() if p.index in ran_in and p.reference in ran_in),
                        "requests": len(record.requests), "keys": keys[:20]})
    return summary


def cache_hits(record: RunRecord, passes: list[Pass]) -> list[CacheHits]:
    """For each hot pass: how many requests the engine served from the prefix cache (its count of cached
    prompt tokens), so `hot` is proven, not assumed. `unknown`: the engine did not say."""
    out = []
    for p in passes:
        if p.cache != HOT:
            continue
        counts = [row[2] for rows in record.digests.values() for row in rows if row[0] == p.index]
        out.append({"pass": p.index, "hit": sum(1 for n in counts if n), "missed": sum(1 for n in counts if n == 0),
                    "unknown": sum(1 for n in counts if n is None)})
    return out
