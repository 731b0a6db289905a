"""The Report (**contract**, docs/json-report.md): everything judged about one run, as one typed, versioned
value. `judging.judge_run` builds it once; it is stored whole with its run (`runs.report`) and every output
format renders it. Every field is a typed value or a list of typed rows, written and read back by one codec
(evalgate/codec.py) from the field's type; each field says its JSON key and its section, so a new section is one
field here and nothing else to keep in step.
"""

from __future__ import annotations

import typing
from collections import Counter
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

from ..codec import from_json, omitted, stored_as, to_json
from ..configuration.policy import GatePolicy
from ..errors import ExitCode
from .hardware import AcrossHardware
from .prompts import PromptCounts
from .scores import MetricRow
from .verdict import FAILURES, STRICT_FAILURES, VERDICTS, CacheHits, FactorRow, PassPair, RequestVerdict

REPORT_SCHEMA = "evalgate.report/1"
SECTIONS = ("run", "identity", "results", "conditions")


@dataclass(frozen=True)
class NotRun:
    """A pass or probe the plan asked for that could not run here, and why (never reported as passed)."""

    pass_: str = stored_as("pass")
    reason: str = ""


@dataclass(frozen=True)
class Coverage:
    """The rotating preset: of this run's requests, how many ran alone within the last `window` runs."""

    covered: int
    requests: int
    runs: int
    window: int


@dataclass(frozen=True)
class BatchInvariance:
    """What the engine recorded of batch invariance (engines/base.py `arrange_batch_invariance`): whether it was
    requested, whether it is in force, why not, and on CPU which of evalgate's kernels (evalgate/kernels). All
    None (`{}` in the JSON): the engine did not say (a run from before it was recorded)."""

    requested: bool | None = omitted()
    in_force: bool | None = omitted()
    reason: str | None = omitted()
    kernels: str | None = omitted()

    @property
    def known(self) -> bool:
        return self.requested is not None


@dataclass(frozen=True)
class TemplateDates:
    """The date the chat templates rendered with, when one read the calendar, beside the baseline's."""

    date: str
    baseline_date: str | None = None


@dataclass(frozen=True)
class Update:
    """What happened to a run after it was judged: "adopted" or "accepted" as its class's baseline, and when."""

    action: str
    at: str


@dataclass(frozen=True)
class ClassRow:
    """A check merged per hardware class (`combine`): one class's run, its baseline, status and counts."""

    hardware_class: str | None
    label: str | None
    run_id: int
    baseline_run_id: int | None
    status: str
    counts: dict[str, int]
    hardware: AcrossHardware | None = None


def _field(section: str, default: Any = None, *, key: str | None = None, factory: Any = None):
    """A report field: its section and its JSON key (default: its name). Its value is written and read back by
    the codec, from the field's type."""
    metadata = {"section": section, "key": key}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@cache
def _types() -> dict[str, Any]:
    return typing.get_type_hints(Report)


@dataclass(frozen=True)
class Report:
    """Everything judged about one run. Fields in their four sections (`sections`): the run (what was judged,
    against what, under which policy), its identity (what changed since the baseline), its results (verdicts,
    metrics) and the conditions it ran under (factors, cache hits, what did not run, other hardware)."""

    kind: str = _field("run")  # baseline | check | diff | survey
    suite_name: str = _field("run", key="suite")
    run_id: int = _field("run")
    baseline_run_id: int | None = _field("run")
    # every request's verdict; stored without the stable ones (`stable` counts them)
    verdicts: list[RequestVerdict] = _field("results", key="requests", factory=list)
    changed_components: list[str] = _field("identity", factory=list)
    batch_invariance: BatchInvariance = _field("identity", factory=BatchInvariance)
    strict: bool = _field("run", False)
    promoted: bool = _field("run", False)  # became the baseline of its class when judged (or since: `updates`)
    # component -> what changed in it, for people (fingerprint.describe_changes)
    fingerprint_changes: dict[str, str] = _field("identity", factory=dict)
    # lm-eval task metrics, baseline vs current, with the documents that moved (scores.py)
    metrics: list[MetricRow] = _field("results", factory=list)
    task_changes: dict[str, str] = _field("identity", factory=dict)  # lm-eval task -> what changed
    engine_log: str | None = _field("run")  # the engine process's output (vLLM's own lines), for people
    factors: list[FactorRow] = _field("conditions", factory=list)  # per comparison of the run's passes
    cache_hits: list[CacheHits] = _field("conditions", factory=list)  # per hot pass
    baseline_pairs: list[PassPair] = _field("conditions", factory=list)  # which baseline pass vs which
    not_run: list[NotRun] = _field("conditions", factory=list)
    alone_coverage: Coverage | None = _field("conditions")  # the rotating preset (store.alone_coverage)
    policy: GatePolicy = _field("run", key="gate", factory=GatePolicy)  # [gate]: what fails
    hardware: AcrossHardware | None = _field("conditions")  # another class's baseline
    classes: list[ClassRow] = _field("conditions", factory=list)  # a check merged per class (combine)
    hardware_class: str | None = _field("run")
    hardware_label: str | None = _field("run")
    # against a baseline: of the requests both runs have, how many rendered prompts are equal (prompts.py)
    prompts: PromptCounts | None = _field("identity")
    template_date: TemplateDates | None = _field("identity")
    updates: list[Update] = _field("run", factory=list)  # what happened to the run since it was judged
    stable: int = field(default=0, metadata={"section": None})  # stable requests not among `verdicts` (stored)

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
    def failing_metrics(self) -> list[MetricRow]:
        """With `[gate] fail_on_metric = "significant_drop"`: the metric rows whose paired test says the metric
        got significantly worse (scores.py, paired.py). By default metrics never fail a run."""
        if self.policy.fail_on_metric != "significant_drop":
            return []
        return [m for m in self.metrics if m.paired is not None and m.paired.drop]

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.REGRESSION if self.failing or self.failing_metrics else ExitCode.PASS

    @property
    def status(self) -> str:
        return "regression" if self.failing or self.failing_metrics else "pass"

    def derived(self) -> dict[str, dict[str, Any]]:
        """What follows from the fields, per section: the status and exit code, the counts and differences."""
        return {"run": {"status": self.status, "exit_code": int(self.exit_code)},
                "results": {"counts": self.counts, "differences": self.differences()}}

    def to_dict(self, requests: bool = True) -> dict:
        """The report as JSON (docs/json-report.md), from its fields; `requests=False`: without the
        per-request verdicts (the run's verdict rows hold them when it is stored)."""
        out: dict[str, Any] = {"schema": REPORT_SCHEMA}
        for f in fields(self):
            meta = f.metadata
            if meta["section"] is None or (f.name == "verdicts" and not requests):
                continue
            value = getattr(self, f.name)
            if f.name == "verdicts":
                value = [v for v in value if v.verdict != "stable"]
            out[meta["key"] or f.name] = to_json(value)
        for values in self.derived().values():
            out.update(values)
        first = ("schema", "kind", "suite", "run_id", "baseline_run_id", "status", "exit_code")  # what people read first
        return {**{key: out[key] for key in first}, **out}

    @classmethod
    def from_dict(cls, data: dict) -> Report:
        """A stored report (`to_dict`) read back as it was written: what `evalgate report`, `runs show` and
        the HTML page render."""
        values: dict[str, Any] = {"stable": int((data.get("counts") or {}).get("stable", 0))}
        types = _types()
        for f in fields(cls):
            name = f.metadata.get("key") or f.name
            if f.metadata.get("section") is None or data.get(name) is None:
                continue  # the field's default: a report stored before the field existed
            values[f.name] = from_json(types[f.name], data[name])
        return cls(**values)

    def sections(self) -> dict[str, dict[str, Any]]:
        """The report in its four sections, as the HTML page shows them (the objects, not their JSON)."""
        out: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for f in fields(self):
            section = f.metadata["section"]
            if section is not None:
                value = getattr(self, f.name)
                if f.name == "verdicts":
                    value = [v for v in value if v.verdict != "stable"]
                out[section][f.metadata["key"] or f.name] = value
        for section, values in self.derived().items():
            out[section].update(values)
        return out
