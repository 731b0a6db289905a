"""Task metrics beside the token-level verdicts: each lm-eval metric of the baseline and of the current run
side by side, and the documents whose metric value moved, with their requests and those requests' verdicts
(so "exact_match fell by 0.04" comes with "doc 3 changed because request evalgate_arith/3/0/0 regressed"), and
whether the metric really moved: a paired test over the documents both runs scored (paired.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..configuration.policy import DEFAULT_METRIC_ALPHA
from ..fingerprint import RunFingerprint
from ..store import Store
from .paired import PairedTest, higher_is_better, paired_test


@dataclass(frozen=True)
class MetricRow:
    """One lm-eval task metric of a report: baseline vs current, the documents whose value moved
    ({doc_id, baseline, current, requests: [{key, verdict}]}) and the paired test (None: nothing to pair)."""

    task: str
    metric: str
    baseline: float | None
    current: float | None
    delta: float | None
    stderr: float | None = None
    moved: list[dict[str, Any]] = field(default_factory=list)
    paired: PairedTest | None = None


def compare_scores(store: Store, run_id: int, baseline_run_id: int | None, verdicts: dict[str, str],
                   alpha: float = DEFAULT_METRIC_ALPHA) -> list[MetricRow]:
    """One row per task metric of either run; `paired` is the paired test at `alpha` (paired.py; None without a
    baseline or shared documents)."""
    scores, samples = store.load_scores(run_id)
    base_scores, base_samples = store.load_scores(baseline_run_id) if baseline_run_id is not None else ([], [])
    current = {(s.task, s.metric): s for s in scores}
    before = {(s.task, s.metric): s for s in base_scores}
    per_doc_before = {(s.task, s.metric, s.doc_id): s.value for s in base_samples}
    moved: dict[tuple[str, str], list[dict]] = {}
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    if baseline_run_id is not None:
        for s in samples:
            old = per_doc_before.get((s.task, s.metric, s.doc_id))
            if (s.task, s.metric, s.doc_id) in per_doc_before:
                pairs.setdefault((s.task, s.metric), []).append((old, s.value))
            if old != s.value:
                moved.setdefault((s.task, s.metric), []).append({
                    "doc_id": s.doc_id, "baseline": old, "current": s.value,
                    "requests": [{"key": k, "verdict": verdicts.get(k, "stable")} for k in s.request_keys],
                })
    rows = []
    for task, metric in sorted(set(current) | set(before)):
        cur, old = current.get((task, metric)), before.get((task, metric))
        value = cur.value if cur else None
        base = old.value if old else None
        rows.append(MetricRow(
            task, metric, base, value, value - base if value is not None and base is not None else None,
            cur.stderr if cur else None, moved.get((task, metric), []),
            paired_test(pairs[task, metric], alpha, higher_is_better(metric)) if pairs.get((task, metric)) else None))
    return rows


def task_changes(baseline_fingerprint: RunFingerprint, current_fingerprint: RunFingerprint) -> dict[str, str]:
    """Which lm-eval tasks changed between two runs' `suite` identities, and how (configuration, documents,
    data files, lm-eval version or settings): a changed data file is named even when no request changed because of it."""
    old, new = baseline_fingerprint.tasks, current_fingerprint.tasks
    changes: dict[str, str] = {}
    for key in ("lm_eval", "settings"):
        if old.get(key) != new.get(key) and old and new:
            changes[f"({key})"] = f"{old.get(key)!r} -> {new.get(key)!r}"
    old_tasks, new_tasks = old.get("tasks", {}), new.get("tasks", {})
    for name in sorted(set(old_tasks) | set(new_tasks)):
        a, b = old_tasks.get(name), new_tasks.get(name)
        if a == b:
            continue
        if a is None or b is None:
            changes[name] = "added" if a is None else "removed"
            continue
        what = [label for field, label in (("config", "configuration"), ("data", "data files"), ("docs", "documents"),
                                                      ("version", "version"))
                if a.get(field) != b.get(field)]
        if a.get("n_docs") != b.get("n_docs"):
            what.append(f"{a.get('n_docs')} -> {b.get('n_docs')} documents")
        changes[name] = ", ".join(what) or "changed"
    return changes
