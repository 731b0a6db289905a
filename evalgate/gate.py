"""The gate, as a library: create a baseline, check against it, accept a run. The CLI wraps these.

A run's inference happens in a supervised child process (evalgate/execution/worker.py); this process only opens
the database, judges the stored outputs and finishes the run.
"""

from __future__ import annotations

import os

from .collector import collector_paused
from .configuration.schedule import ROTATING, Schedule, rotating_problem, with_overrides
from .configuration.shard import Shard
from .configuration.suite import Suite
from .errors import ConfigError, EngineError, NoBaselineError
from .execution.runner import Progress, Timings
from .execution.worker import execute_in_worker
from .fingerprint import component, hardware_component
from .fingerprint import delta as fingerprint_delta
from .judgement.scores import compare_scores, task_changes
from .judgement.verdict import Report, judge
from .store import Run, RunRecord, Store, existing_store, open_store


def _database(suite: Suite, store: Store | str | None) -> str:
    if isinstance(store, Store):
        return store.url
    return store or suite.database


def judge_runs(store: Store, run_id: int, baseline_run_id: int | None, *, kind: str, strict: bool = False,
               in_scope=lambda key: True) -> Report:
    """The whole judgement of a stored run against the baseline run (or none): `judge_records` on both."""
    with collector_paused():
        baseline = store.load(baseline_run_id) if baseline_run_id is not None else None
        return judge_records(store, store.load(run_id), baseline, kind=kind, strict=strict, in_scope=in_scope)


def judge_records(store: Store, current: RunRecord, baseline: RunRecord | None, *, kind: str, strict: bool = False,
                  in_scope=lambda key: True) -> Report:
    """The whole judgement, built in one place: the verdicts and beside them the lm-eval metrics, what
    changed in the tasks' identity, the rotating preset's alone coverage and where the engine's own output
    went."""
    report = judge(current, baseline, kind=kind, strict=strict, in_scope=in_scope)
    report.metrics = compare_scores(store, current.id, baseline.id if baseline else None,
                                    {v.key: v.verdict for v in report.verdicts})
    report.task_changes = task_changes(baseline.fingerprint, current.fingerprint) if baseline else {}
    schedule = current.run.schedule or {}
    if schedule.get("preset") == ROTATING:
        report.alone_coverage = store.alone_coverage(current.run, schedule["rotation"], min(schedule["concurrency"]))
    log = current.run.engine_log
    report.engine_log = log if log and os.path.isfile(log) else None
    return report


def promotes(report: Report, *, allow_variance: bool = False, shard: Shard | None = None) -> bool:
    """The one promotion rule: a baseline run of the whole suite (a shard is part of one: its group's merge
    decides) whose passes agree, or any baseline run with `allow_variance`. A check never promotes."""
    return report.kind == "baseline" and shard is None and (allow_variance or not report.failing)


def judge_and_finish(store: Store, run_id: int, *, kind: str, baseline_run_id: int | None, strict: bool = False,
                     allow_variance: bool = False, shard: Shard | None = None, timings: Timings | None = None) -> Report:
    """Judge a recorded run and finish it: complete, with its verdict, and the baseline if it `promotes`.
    Anything that fails here leaves the run incomplete, never complete."""
    timings = timings if timings is not None else Timings()
    try:
        with timings.phase("evalgate"), collector_paused():
            current = store.load(run_id)
            baseline = store.load(baseline_run_id) if baseline_run_id is not None else None
            report = judge_records(store, current, baseline, kind=kind, strict=strict,
                                   in_scope=shard.contains if shard else (lambda key: True))
            report.promoted = promotes(report, allow_variance=allow_variance, shard=shard)
        stored = current.run.schedule or {}
        store.finish_run(
            run_id, status="complete", verdict=report.status, exit_code=int(report.exit_code),
            summary=report.counts, verdicts=[v.to_dict() for v in report.verdicts if v.verdict != "stable"],
            schedule={**stored, "timings": dict(timings), "judged": report.judged()},
            baseline_run_id=baseline_run_id,
            promote=report.promoted,
        )
    except BaseException as exc:
        store.mark_incomplete(run_id, "failed", f"{type(exc).__name__}: {exc}")
        raise
    return report


def _execute_and_judge(suite: Suite, url: str, *, kind: str, schedule: Schedule | None, baseline_run_id: int | None,
                       strict: bool, allow_variance: bool, progress: Progress | None, timings: Timings,
                       shard: Shard | None, group: str | None, show_engine_output: bool) -> Report:
    run_id = execute_in_worker(suite, url, kind=kind, schedule=schedule or suite.schedule, timings=timings,
                               progress=progress, labels={"shard_group": group}, shard=shard,
                               show_engine_output=show_engine_output)
    return judge_and_finish(open_store(url), run_id, kind=kind, baseline_run_id=baseline_run_id, strict=strict,
                            allow_variance=allow_variance, shard=shard, timings=timings)


def create_baseline(suite: Suite, store: Store | str | None = None, *, schedule: Schedule | None = None,
                    allow_variance: bool = False, progress: Progress | None = None,
                    timings: Timings | None = None, shard: Shard | None = None, group: str | None = None,
                    show_engine_output: bool = False) -> Report:
    """Run the suite and make it the baseline of this suite on this hardware class, unless its passes
    disagree (batch variance): a baseline must be reproducible. `allow_variance` promotes it anyway,
    with the first pass of each request as the reference. `store`: a Store or URL (default: the suite's).
    With `shard`, only that shard runs and nothing is promoted until `merge` joins the group's shards."""
    url = _database(suite, store)
    existing_store(url)
    return _execute_and_judge(
        suite, url, kind="baseline", schedule=schedule, baseline_run_id=None, strict=False,
        allow_variance=allow_variance, progress=progress, timings=timings if timings is not None else Timings(),
        shard=shard, group=_group(shard, group), show_engine_output=show_engine_output,
    )


def _group(shard: Shard | None, group: str | None) -> str | None:
    if shard is not None and not group:
        raise ConfigError("--shard needs --group: the label shared by the shard runs to merge",
                          fix="e.g. --group \"$GITHUB_RUN_ID\"")
    return group


def find_baseline(suite: Suite, store: Store | None, url: str) -> int:
    hardware = hardware_component()["hash"]
    run_id = store.baseline_for(suite.name, hardware) if store else None
    if run_id is None:
        others = store.baselines(suite.name) if store else []
        hint = (f" (baselines exist for {len(others)} other hardware class(es): a baseline is per hardware)"
                if others else "")
        raise NoBaselineError(
            f"no baseline for suite {suite.name!r} on this hardware in {url}{hint}",
            fix=f"evalgate baseline create {suite.path}",
        )
    return run_id


def check(suite: Suite, store: Store | str | None = None, *, schedule: Schedule | None = None,
          strict: bool = False, progress: Progress | None = None, timings: Timings | None = None,
          shard: Shard | None = None, group: str | None = None, show_engine_output: bool = False) -> Report:
    """Run the suite and judge it against the baseline (exit 4 before any inference if there is none).
    With `shard`, only that shard's requests run and are judged; `merge` gives the whole verdict."""
    url = _database(suite, store)
    baseline_run_id = find_baseline(suite, existing_store(url), url)
    return _execute_and_judge(
        suite, url, kind="check", schedule=schedule, baseline_run_id=baseline_run_id, strict=strict,
        allow_variance=False, progress=progress, timings=timings if timings is not None else Timings(),
        shard=shard, group=_group(shard, group), show_engine_output=show_engine_output,
    )


def merge(suite: Suite, group: str, *, kind: str = "check", store: Store | str | None = None,
          strict: bool = False, allow_variance: bool = False) -> Report:
    """Join the shard runs of `group` into one run of the whole suite and judge it as one: a check against
    the baseline, or (kind "baseline") a new baseline. Refuses an incomplete set of shards, and shards
    whose identity differs (a merged verdict over different stacks would mean nothing)."""
    url = _database(suite, store)
    store = open_store(url, create=False)
    latest: dict[str, Run] = {}
    for run in store.shard_runs(suite.name, group, kind):
        latest[run.shard] = run  # a re-run job replaces its earlier attempt
    if not latest:
        raise ConfigError(f"no {kind} shard runs of suite {suite.name!r} in group {group!r} in {store.url}",
                          fix=f"run `evalgate {'baseline create' if kind == 'baseline' else 'check'} "
                              f"--shard I/N --group {group}` in each job first")
    counts = {int(label.split("/")[1]) for label in latest}
    count = max(counts)
    missing = [f"{i}/{count}" for i in range(1, count + 1) if f"{i}/{count}" not in latest]
    incomplete = [f"{label} (run {r.id}: {r.status})" for label, r in latest.items() if r.status != "complete"]
    if len(counts) > 1 or missing or incomplete:
        raise EngineError(
            f"group {group!r} cannot be merged: " + "; ".join(filter(None, [
                f"shard counts differ ({sorted(counts)})" if len(counts) > 1 else "",
                f"missing shards {', '.join(missing)}" if missing else "",
                f"incomplete shards {', '.join(incomplete)}" if incomplete else ""])),
            fix="re-run the failed or missing shard jobs, then merge again")
    runs = [latest[f"{i}/{count}"] for i in range(1, count + 1)]
    records = [store.load(r.id) for r in runs]
    for other in records[1:]:
        differing = fingerprint_delta(records[0].fingerprint, other.fingerprint)
        if differing:
            raise ConfigError(f"shard runs {runs[0].id} and {other.id} of group {group!r} differ in "
                              f"{', '.join(differing)}: their outputs cannot be judged as one run",
                              fix="run every shard of a group on the same hardware and setup")
    fingerprint = dict(records[0].fingerprint)
    fingerprint["suite"] = component({"requests": {k: r.request_hash for rec in records
                                                   for k, r in rec.requests.items()}})
    merged_id = store.merge_runs(runs, fingerprint)
    baseline_run_id = find_baseline(suite, store, url) if kind == "check" else None
    return judge_and_finish(store, merged_id, kind=kind, baseline_run_id=baseline_run_id, strict=strict,
                            allow_variance=allow_variance)


def accept(store: Store, run_id: int):
    """Promote a complete run to be the baseline of its suite on its hardware class."""
    return store.promote(run_id)


def compare_runs(store: Store, run_a: int, run_b: int) -> Report:
    """Judge run B against run A as if A were the baseline (for `evalgate diff`)."""
    for run_id in (run_a, run_b):
        if not store.has_outputs(run_id):
            raise ConfigError(f"run {run_id} has no outputs to compare",
                              fix="pick runs that got past engine start (see `evalgate runs list`)")
    return judge_runs(store, run_b, run_a, kind="diff")


def resolve_schedule(suite: Suite, concurrency=None, shuffles=None, repeats=None) -> Schedule:
    schedule = with_overrides(suite.schedule, concurrency, shuffles, repeats)
    problem = rotating_problem(schedule) if schedule.preset == ROTATING else None
    if problem:
        setting, why, fix = problem
        raise ConfigError(f"--{setting} {why} (the rotating preset of {suite.path})", fix=fix)
    return schedule
