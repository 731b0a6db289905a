"""Verdicts (**contract**, docs/design.md "Verdicts"): one per request, and the run's exit code from them.

- batch_variance: the passes of this run disagree. Always a failure.
- silent_regression: differs from the baseline while every identity component is equal. A failure.
- explained_change: differs from the baseline and some component changed (listed). Not a failure unless
  strict. `suite` explains a request only when that request's own text or sampling changed.
- new / missing: the key is only in this run / only in the baseline. Not failures unless strict.
- stable: every pass identical (ids and logprob bits) and equal to the baseline.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .compare import Divergence, first_divergence, within_run
from .errors import ExitCode
from .fingerprint import delta as fingerprint_delta
from .fingerprint import describe_changes
from .store import RunRecord

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

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "verdict": self.verdict,
            "location": self.location,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "passes": self.passes,
            "components": self.components,
        }


@dataclass
class Report:
    kind: str  # baseline | check
    suite_name: str
    run_id: int
    baseline_run_id: int | None
    verdicts: list[RequestVerdict]
    changed_components: list[str]
    batch_invariance: dict
    strict: bool = False
    promoted: bool = False
    # component -> what changed in it, for people (fingerprint.describe_changes); judged once, rendered anywhere
    fingerprint_changes: dict = field(default_factory=dict)
    # lm-eval task metrics, baseline vs current, with the documents that moved (evalgate/scores.py)
    metrics: list = field(default_factory=list)
    task_changes: dict = field(default_factory=dict)  # lm-eval task -> what changed in its identity
    engine_log: str | None = None  # the engine process's output (vLLM's own lines), for people

    @property
    def counts(self) -> dict[str, int]:
        counter = Counter(v.verdict for v in self.verdicts)
        return {name: counter.get(name, 0) for name in VERDICTS}

    @property
    def failing(self) -> list[RequestVerdict]:
        bad = STRICT_FAILURES if self.strict else FAILURES
        return [v for v in self.verdicts if v.verdict in bad]

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.REGRESSION if self.failing else ExitCode.PASS

    @property
    def status(self) -> str:
        return "regression" if self.failing else "pass"

    def to_dict(self) -> dict:
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
            "requests": [v.to_dict() for v in self.verdicts if v.verdict != "stable"],
            "metrics": self.metrics,
            "task_changes": self.task_changes,
        }


def judge(current: RunRecord, baseline: RunRecord | None, *, kind: str = "check", strict: bool = False,
          in_scope=lambda key: True) -> Report:
    """`in_scope(key)`: whether a baseline key belongs to this run at all (False for other shards' keys,
    which are then not `missing`)."""
    changed = fingerprint_delta(baseline.fingerprint, current.fingerprint) if baseline else []
    verdicts: list[RequestVerdict] = []
    for key, request in current.requests.items():
        completions = current.outputs.get(key, [])
        location = request.location
        disagreement = within_run(completions)
        if disagreement is not None:
            verdicts.append(RequestVerdict(
                key, "batch_variance", location, disagreement.divergence,
                passes={
                    "reference_pass": disagreement.reference_pass,
                    "reference_concurrency": disagreement.reference_concurrency,
                    "other_pass": disagreement.other_pass,
                    "other_concurrency": disagreement.other_concurrency,
                    "differing_passes": disagreement.differing_passes,
                    "total_passes": len(completions),
                },
            ))
            continue
        if baseline is None:
            verdicts.append(RequestVerdict(key, "stable", location))
            continue
        base_request = baseline.requests.get(key)
        base_outputs = baseline.outputs.get(key)
        if base_request is None or not base_outputs:
            verdicts.append(RequestVerdict(key, "new", location, components=["suite"]))
            continue
        divergence = first_divergence(base_outputs[0], completions[0])
        if divergence is None:
            verdicts.append(RequestVerdict(key, "stable", location))
            continue
        explaining = list(changed)
        if base_request.request_hash != request.request_hash:
            explaining.append("suite")
        verdict = "explained_change" if explaining else "silent_regression"
        verdicts.append(RequestVerdict(key, verdict, location, divergence, components=explaining))
    if baseline is not None:
        for key, base_request in baseline.requests.items():
            if key not in current.requests and in_scope(key):
                verdicts.append(RequestVerdict(key, "missing", base_request.location, components=["suite"]))
    engine = current.fingerprint.get("engine", {}).get("data", {})
    return Report(
        kind=kind, suite_name=current.run.suite_name, run_id=current.id,
        baseline_run_id=baseline.id if baseline else None, verdicts=verdicts, changed_components=changed,
        batch_invariance=engine.get("batch_invariance", {}), strict=strict,
        fingerprint_changes=describe_changes(baseline.fingerprint, current.fingerprint, changed) if baseline else {},
    )
