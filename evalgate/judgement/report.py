"""The Report (**contract**, docs/json-report.md): everything judged about one run, as one typed, versioned
value. `judging.judge_run` builds it once; it is stored whole with its run (`runs.report`) and every output
format renders it. It serialises itself from its fields: each field says its JSON key, its section and how its
value is read back, so a new section is one field here and nothing else to keep in step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Callable, TypedDict

from ..configuration.policy import GatePolicy
from ..errors import ExitCode
from .hardware import AcrossHardware
from .scores import MetricRow
from .verdict import FAILURES, STRICT_FAILURES, VERDICTS, CacheHits, FactorRow, RequestVerdict

REPORT_SCHEMA = "evalgate.report/1"
SECTIONS = ("run", "identity", "results", "conditions")

# A pass or probe the plan asked for that could not run here, and why (never reported as passed).
NotRun = TypedDict("NotRun", {"pass": str, "reason": str})


class Coverage(TypedDict):
    """The rotating preset: of this run's requests, how many ran alone within the last `window` runs."""

    covered: int
    requests: int
    runs: int
    window: int


def _field(section: str, default: Any = None, *, key: str | None = None, factory: Callable | None = None,
           load: Callable | None = None, dump: Callable | None = None):
    """A report field: its section, its JSON key (default: its name), and how a stored value is read back
    (`load`) and written (`dump`; default: a value's own `to_dict`, a list's items' own)."""
    metadata = {"section": section, "key": key, "load": load, "dump": dump}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _rows(row_type) -> Callable[[list | None], list]:
    return lambda data: [row_type.from_dict(row) for row in data or []]


def _dumped(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, list):
        return [_dumped(item) for item in value]
    return value


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
    verdicts: list[RequestVerdict] = _field("results", key="requests", factory=list, load=_rows(RequestVerdict))
    changed_components: list[str] = _field("identity", factory=list, load=list)
    batch_invariance: dict[str, Any] = _field("identity", factory=dict, load=dict)  # requested, in_force, reason
    strict: bool = _field("run", False, load=bool)
    promoted: bool = _field("run", False, load=bool)  # became the baseline of its class when judged (or since: `updates`)
    # component -> what changed in it, for people (fingerprint.describe_changes)
    fingerprint_changes: dict[str, str] = _field("identity", factory=dict, load=dict)
    # lm-eval task metrics, baseline vs current, with the documents that moved (scores.py)
    metrics: list[MetricRow] = _field("results", factory=list, load=_rows(MetricRow))
    task_changes: dict[str, str] = _field("identity", factory=dict, load=dict)  # lm-eval task -> what changed
    engine_log: str | None = _field("run")  # the engine process's output (vLLM's own lines), for people
    factors: list[FactorRow] = _field("conditions", factory=list, load=list)  # per comparison of the run's passes
    cache_hits: list[CacheHits] = _field("conditions", factory=list, load=list)  # per hot pass
    baseline_pairs: list[dict[str, Any]] = _field("conditions", factory=list, load=list)  # which baseline pass vs which
    not_run: list[NotRun] = _field("conditions", factory=list, load=list)
    alone_coverage: Coverage | None = _field("conditions")  # the rotating preset (store.alone_coverage)
    policy: GatePolicy = _field("run", key="gate", factory=GatePolicy, load=GatePolicy.from_dict)  # [gate]: what fails
    hardware: AcrossHardware | None = _field("conditions", load=AcrossHardware.from_dict)  # another class's baseline
    classes: list[dict[str, Any]] = _field("conditions", factory=list, load=list)  # a check merged per class (combine)
    hardware_class: str | None = _field("run")
    hardware_label: str | None = _field("run")
    # against a baseline: of the requests both runs have, how many rendered prompts are equal (prompts.py)
    prompts: dict[str, int] | None = _field("identity")
    # the date chat templates rendered with, when one read the calendar: {"date", "baseline_date"}
    template_date: dict[str, Any] | None = _field("identity")
    # what happened to the run since it was judged: [{"action": "adopted" | "accepted", "at": ...}]
    updates: list[dict[str, Any]] = _field("run", factory=list, load=list)
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
            out[meta["key"] or f.name] = (meta["dump"] or _dumped)(value) if value is not None else None
        for values in self.derived().values():
            out.update(values)
        first = ("schema", "kind", "suite", "run_id", "baseline_run_id", "status", "exit_code")  # what people read first
        return {**{key: out[key] for key in first}, **out}

    @classmethod
    def from_dict(cls, data: dict) -> Report:
        """A stored report (`to_dict`) read back as it was written: what `evalgate report`, `runs show` and
        the HTML page render."""
        values: dict[str, Any] = {"stable": int((data.get("counts") or {}).get("stable", 0))}
        for f in fields(cls):
            meta = f.metadata
            key = meta.get("key") or f.name
            if meta.get("section") is None or (key not in data and f.name != "policy"):
                continue  # the field's default; a report stored without a policy has the one of its time
            value = data.get(key)
            values[f.name] = meta["load"](value) if meta["load"] and (value is not None or f.name == "policy") else value
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
                out[section][f.metadata["key"] or f.name] = value.to_dict() if isinstance(value, GatePolicy) else value
        for section, values in self.derived().items():
            out[section].update(values)
        return out
