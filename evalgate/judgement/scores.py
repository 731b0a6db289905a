"""Task metrics beside the token-level verdicts: each lm-eval metric of the baseline and of the current run
side by side, and the documents whose metric value moved, with their requests and those requests' verdicts
(so "exact_match fell by 0.04" comes with "doc 3 changed because request evalgate_arith/3/0/0 regressed")."""

from __future__ import annotations

from ..store import Store


def compare_scores(store: Store, run_id: int, baseline_run_id: int | None, verdicts: dict[str, str]) -> list[dict]:
    """One row per task metric of either run: {task, metric, baseline, current, delta, stderr, moved}; `moved`
    lists the documents whose value differs: {doc_id, baseline, current, requests: [{key, verdict}]}."""
    scores, samples = store.load_scores(run_id)
    base_scores, base_samples = store.load_scores(baseline_run_id) if baseline_run_id is not None else ([], [])
    current = {(s.task, s.metric): s for s in scores}
    before = {(s.task, s.metric): s for s in base_scores}
    per_doc_before = {(s.task, s.metric, s.doc_id): s.value for s in base_samples}
    moved: dict[tuple[str, str], list[dict]] = {}
    if baseline_run_id is not None:
        for s in samples:
            old = per_doc_before.get((s.task, s.metric, s.doc_id))
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
        rows.append({
            "task": task, "metric": metric, "baseline": base, "current": value,
            "delta": value - base if value is not None and base is not None else None,
            "stderr": cur.stderr if cur else None, "moved": moved.get((task, metric), []),
        })
    return rows


def task_changes(baseline_fingerprint: dict, current_fingerprint: dict) -> dict[str, str]:
    """Which lm-eval tasks changed between two runs' `suite` identities, and how (configuration, documents,
    data files, lm-eval version or settings): a changed data file is named even when no request changed because of it."""
    def tasks(fp: dict) -> dict:
        return ((fp.get("suite") or {}).get("data") or {}).get("tasks") or {}

    old, new = tasks(baseline_fingerprint), tasks(current_fingerprint)
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
