"""The one judging pipeline: `judge_run(current, baseline, judging) -> Report`, built from steps that
return values and never edit one another's: the verdicts (within the run, then against the baseline,
verdict.py), the other hardware class's classes applied once (hardware.py), the lm-eval metrics and their
paired tests (scores.py), then the Report, whole. A stored run is judged a window of requests at a time
(`judge_stored`): a leaderboard-sized run never has every output in memory, and the report keeps the
verdicts that are not stable (the stable ones are counted). Creating a baseline, a check, a merge, a diff, a survey and
a report read back for a run judged before reports were stored all judge through it, and store what it
returns with the run (`judge_and_store`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable

from ..codec import from_json, to_json
from ..collector import collector_paused
from ..configuration.policy import GatePolicy
from ..configuration.schedule import HOT, ROTATING, passes_of
from ..configuration.shard import Shard
from ..errors import ConfigError
from ..fingerprint import delta as fingerprint_delta
from ..fingerprint import describe_changes, hardware_label
from ..store import BASELINE_RESCORING, OWN_RESCORING, RunRecord, Store
from ..timings import Timings
from .adapters import describe_adapters
from .hardware import AcrossHardware, across_hardware, envelope, envelope_deltas, unscored_requests
from .prompts import PromptCounts, prompts_compared
from .report import BatchInvariance, ClassRow, Coverage, NotRun, Report, TemplateDates, Update
from .scores import compare_scores, task_changes
from .verdict import CacheHits, RequestVerdict, cache_hits, factor_summary, judge_requests, matching_passes, passes_ran


@dataclass(frozen=True)
class Judging:
    """How a recorded run is judged: as what kind of run, with which policy switches, over which requests
    (`in_scope`; default: the shard's, else all), and whether its passes may disagree and still promote it."""

    kind: str = "check"
    strict: bool = False
    allow_variance: bool = False
    shard: Shard | None = None
    in_scope: Callable[[str], bool] | None = None
    policy: GatePolicy | None = None  # what fails (None: the policy recorded with the run)

    def scope(self) -> Callable[[str], bool]:
        return self.in_scope or (self.shard.contains if self.shard else (lambda key: True))


WINDOW = 5_000  # requests judged at a time: a stored run is read a window of requests at a time, never whole


@dataclass(frozen=True)
class Window:
    """Some requests of the run being judged (all of them, for a run held whole), with the same requests of
    the baseline and, across hardware, of the two rescorings of its tokens (None where there is none)."""

    current: RunRecord
    baseline: RunRecord | None = None
    here: RunRecord | None = None
    there: RunRecord | None = None


def judge_run(current: RunRecord, baseline: RunRecord | None = None, judging: Judging = Judging(),
              store: Store | None = None) -> Report:
    """The whole judgement of a run held whole (in memory, or loaded whole) against a baseline run (or none).
    With the `store` they are in, the sections that read more of it too: the lm-eval metrics, the rescorings
    across hardware and the rotating preset's coverage."""
    here, there = rescorings(store, current, baseline) if store is not None and across(current, baseline) else (None, None)
    return judge_windows(current, baseline, [Window(current, baseline, here, there)], judging, store)


def judge_stored(store: Store, run_id: int, baseline_run_id: int | None, judging: Judging = Judging()) -> Report:
    """`judge_run` on two stored runs (the baseline: None for none), read `WINDOW` requests at a time."""
    with collector_paused():
        current = store.load(run_id, keys=[])  # the runs' rows and identities; their requests come by window
        baseline = store.load(baseline_run_id, keys=[]) if baseline_run_id is not None else None
        return judge_windows(current, baseline, stored_windows(store, current, baseline), judging, store)


def stored_windows(store: Store, current: RunRecord, baseline: RunRecord | None) -> Iterator[Window]:
    """The run's requests `WINDOW` at a time in their stored order, each window with the same requests of the
    baseline (and across hardware of both rescorings); then the baseline's requests the run lacks."""
    here_from, there_from = rescoring_runs(store, current, baseline) if across(current, baseline) else (None, None)

    def window(keys: list[str]) -> Window:
        def read(record: RunRecord | None, run_id: int | None, which: int | None = None) -> RunRecord | None:
            if record is None or run_id is None:
                return None  # the identity read once (`record`'s): a large suite's lists every request
            return store.load(run_id, only_pass=which, keys=keys, fingerprint=record.fingerprint)

        return Window(read(current, current.id), read(baseline, baseline and baseline.id),
                      read(current, here_from, BASELINE_RESCORING), read(baseline, there_from, OWN_RESCORING))

    yield from (window(keys) for keys in store.request_windows(current.id, WINDOW))
    if baseline is not None:
        yield from (window(keys) for keys in store.request_windows(baseline.id, WINDOW, absent_from=current.id))


@dataclass
class Tally:
    """What the windows of a judgement add up to: the verdicts that are not stable (a stable one is counted),
    and what the report's sections are made of."""

    verdicts: list[RequestVerdict] = field(default_factory=list)
    stable: int = 0
    requests: int = 0
    varying: dict[int, list[str]] = field(default_factory=dict)  # pass index -> the keys that differ in it
    ran: Counter = field(default_factory=Counter)  # verdict.passes_ran
    cache: dict[int, Counter] = field(default_factory=dict)  # hot pass -> hit, missed, unknown
    prompts: Counter = field(default_factory=Counter)  # compared, equal
    hardware: AcrossHardware | None = None
    deltas: list = field(default_factory=list)  # hardware.envelope_deltas of every window with both rescorings
    delta_requests: int = 0  # the requests those cover
    measured: bool = False  # some window had both rescorings: the envelope is measured

    def add(self, window: Window, verdicts: list[RequestVerdict], varying: dict[int, list[str]], passes: list,
            hardware: AcrossHardware | None) -> None:
        self.verdicts += [v for v in verdicts if v.verdict != "stable"]
        self.stable += sum(v.verdict == "stable" for v in verdicts)
        self.requests += len(window.current.requests)
        for index, keys in varying.items():
            self.varying.setdefault(index, []).extend(keys)
        self.ran.update(passes_ran(window.current))
        for hits in cache_hits(window.current, passes):
            self.cache.setdefault(hits.pass_, Counter()).update(hit=hits.hit, missed=hits.missed, unknown=hits.unknown)
        if window.baseline is not None:
            counts = prompts_compared(window.current, window.baseline)
            self.prompts.update(compared=counts.compared, equal=counts.equal)
        if hardware is not None:
            self.hardware = hardware if self.hardware is None else replace(
                self.hardware, counts={c: n + hardware.counts[c] for c, n in self.hardware.counts.items()},
                compared=self.hardware.compared + hardware.compared, flips=self.hardware.flips + hardware.flips)
            if window.here is not None and window.there is not None:
                values, requests = envelope_deltas(window.here, window.there, skip=set(unscored_requests(window.current)))
                self.deltas += [] if values is None else [values]
                self.delta_requests += requests
                self.measured = True

    def across_hardware(self) -> AcrossHardware | None:
        """The cross-hardware section of every window, with its envelope (None: a rescoring is missing)."""
        if self.hardware is None:
            return None
        return replace(self.hardware, envelope=envelope(self.deltas, self.delta_requests) if self.measured else None)


def judge_windows(current: RunRecord, baseline: RunRecord | None, windows: Iterable[Window], judging: Judging,
                  store: Store | None) -> Report:
    """The judgement of a run window by window (`current` and `baseline`: the runs, whatever requests they
    hold): each window's verdicts (verdict.py), across hardware classified (hardware.py), added up (`Tally`),
    then the lm-eval metrics and their paired tests (scores.py), then the Report, whole."""
    policy = judging.policy or GatePolicy.recorded((current.run.schedule or {}).get("gate"))
    engine = current.fingerprint.engine
    policy = policy.for_dtype(engine.get("dtype"))  # the near-tie margin, by the dtype unless the suite sets it
    changed = fingerprint_delta(baseline.fingerprint, current.fingerprint) if baseline else []
    schedule = current.run.schedule or {}
    passes = passes_of(schedule)
    tally = Tally(cache={p.index: Counter() for p in passes if p.cache == HOT})
    for window in windows:
        decided = judge_requests(window.current, window.baseline, policy, changed, judging.scope())
        verdicts, hardware = decided.verdicts, None
        if across(current, baseline):
            verdicts, hardware = across_hardware(verdicts, window.current, window.baseline, window.here, window.there, policy)
        tally.add(window, verdicts, decided.varying, passes, hardware)
    log = current.run.engine_log
    report = Report(
        kind=judging.kind, suite_name=current.run.suite_name, run_id=current.id,
        baseline_run_id=baseline.id if baseline else None, verdicts=tally.verdicts, stable=tally.stable,
        changed_components=changed,
        batch_invariance=from_json(BatchInvariance, engine.get("batch_invariance") or {}), strict=judging.strict,
        fingerprint_changes=fingerprint_changes(baseline, current) if baseline else {},
        metrics=compare_scores(store, current.id, baseline.id if baseline else None,
                               {v.key: v.verdict for v in tally.verdicts}, policy.metric_alpha) if store is not None else [],
        task_changes=task_changes(baseline.fingerprint, current.fingerprint) if baseline else {},
        engine_log=log if log and os.path.isfile(log) else None,
        factors=factor_summary(passes, tally.varying, tally.ran, tally.requests),
        cache_hits=[CacheHits(index, **counts) for index, counts in tally.cache.items()],
        baseline_pairs=matching_passes(passes_of(baseline.run.schedule), passes) if baseline else [],
        not_run=[from_json(NotRun, item) for item in schedule.get("not_run") or []],
        alone_coverage=Coverage(**store.alone_coverage(current.run, schedule["rotation"], min(schedule["concurrency"])))
        if store is not None and schedule.get("preset") == ROTATING else None,
        policy=policy, hardware=tally.across_hardware(), hardware_class=current.run.hardware_class,
        hardware_label=hardware_label(current.fingerprint.hardware),
        prompts=PromptCounts(tally.prompts["compared"], tally.prompts["equal"]) if baseline is not None else None,
        template_date=template_dates(current, baseline))
    return replace(report, promoted=promotes(report, allow_variance=judging.allow_variance, shard=judging.shard))


def across(current: RunRecord, baseline: RunRecord | None) -> bool:
    """Whether the run is judged against another hardware class's baseline."""
    return baseline is not None and baseline.run.hardware_class != current.run.hardware_class


def template_dates(current: RunRecord, baseline: RunRecord | None) -> TemplateDates | None:
    """The date the run's chat templates rendered with, beside the baseline's, when a template read it."""
    date = current.fingerprint.template_date
    if date is None:
        return None
    return TemplateDates(date, baseline.fingerprint.template_date if baseline else None)


def fingerprint_changes(baseline: RunRecord, current: RunRecord) -> dict[str, str]:
    """What changed in each component that differs, for people: the stack's, the rendered prompts', and the
    adapters' (whose changes explain their own requests only)."""
    old, new = baseline.fingerprint, current.fingerprint
    changes = describe_changes(old, new, fingerprint_delta(old, new) + fingerprint_delta(old, new, ("prompt",)))
    adapters = describe_adapters(old, new)
    return {**changes, "adapter": adapters} if adapters else changes


def promotes(report: Report, *, allow_variance: bool = False, shard: Shard | None = None) -> bool:
    """The one promotion rule: a baseline run of the whole suite (a shard is part of one: its group's merge
    decides) whose passes agree, or any baseline run with `allow_variance`. A check never promotes."""
    return report.kind == "baseline" and shard is None and (allow_variance or not report.failing)


def rescoring_runs(store: Store, current: RunRecord, baseline: RunRecord) -> tuple[int | None, int | None]:
    """Which runs hold the two rescorings of the baseline's tokens (execution/rescore.py): here (the run judged
    against it made one) and on the baseline's own class (recorded with it). None where there is none."""
    # a run being judged has no baseline_run_id yet; a stored one made its rescoring against its own baseline
    mine = current.run.baseline_run_id in (None, baseline.id)
    here = current.id if mine and store.has_outputs(current.id, BASELINE_RESCORING) else None
    return here, baseline.id if store.has_outputs(baseline.id, OWN_RESCORING) else None


def rescorings(store: Store, current: RunRecord, baseline: RunRecord) -> tuple[RunRecord | None, RunRecord | None]:
    """The two rescorings of the baseline's tokens (`rescoring_runs`), read whole."""
    here, there = rescoring_runs(store, current, baseline)
    return (store.load(here, only_pass=BASELINE_RESCORING) if here is not None else None,
            store.load(there, only_pass=OWN_RESCORING) if there is not None else None)


def judge_and_store(store: Store, run_id: int, baseline_run_id: int | None, judging: Judging,
                    timings: Timings | None = None) -> Report:
    """Judge a recorded run and finish it: complete, with its report, and the baseline of its class if it
    `promotes`. Anything that fails here leaves the run incomplete, never complete. `timings`: the run's,
    recorded with it, judging's own time (`evalgate`) added."""
    timings = timings if timings is not None else Timings()
    try:
        with timings.phase("evalgate"):
            report = judge_stored(store, run_id, baseline_run_id, judging)
        run = store.get_run(run_id)
        # the policy it was judged under, and where the time went
        schedule = {**(run.schedule or {}), "gate": to_json(report.policy), "timings": dict(timings)}
        store.finish_run(
            run_id, status="complete", verdict=report.status, exit_code=int(report.exit_code), summary=report.counts,
            verdicts=[to_json(v) for v in report.verdicts if v.verdict != "stable"], schedule=schedule,
            report=report.to_dict(requests=False), baseline_run_id=baseline_run_id, promote=report.promoted)
    except BaseException as exc:
        store.mark_incomplete(run_id, "failed", f"{type(exc).__name__}: {exc}")
        raise
    return report


def stored_report(store: Store, run_id: int) -> Report | None:
    """The report stored with a judged run, read back whole (None: the run was never judged: it did not
    finish, or it is a cost or bisect measurement). A run judged before reports were stored is judged again
    once, as then, and its report stored."""
    run = store.get_run(run_id)
    if run.report is not None:
        return Report.from_dict({**run.report, "requests": store.verdicts(run_id)})
    if run.status != "complete" or run.kind not in ("baseline", "check") or run.verdict is None:
        return None
    report = judge_stored(store, run_id, run.baseline_run_id, Judging(run.kind))
    report = replace(report, promoted=store.baseline_for(run.suite_name, run.hardware_class) == run_id)
    store.set_report(run_id, report.to_dict(requests=False))
    return report


def record_update(store: Store, run_id: int, action: str, **changes) -> Report:
    """What happened to a judged run since (adopted, accepted), recorded on its stored report: the action
    and when, with the fields it changes (`changes`)."""
    report = stored_report(store, run_id)
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    report = replace(report, **changes, updates=[*report.updates, Update(action, at)])
    store.set_report(run_id, report.to_dict(requests=False))
    return report


def compare_runs(store: Store, run_a: int, run_b: int) -> Report:
    """Judge run B against run A as if A were the baseline (for `evalgate diff`)."""
    for run_id in (run_a, run_b):
        if not store.has_outputs(run_id):
            raise ConfigError(f"run {run_id} has no outputs to compare",
                              fix="pick runs that got past engine start (see `evalgate runs list`)")
    return judge_stored(store, run_b, run_a, Judging("diff"))


def combine(reports: list[Report]) -> Report:
    """One verdict over a check's shards merged per hardware class: every request's verdict, and per class
    the merged run, the baseline it was judged against (its own class's or another's) and its result."""
    first = reports[0]
    return Report(
        kind=first.kind, suite_name=first.suite_name, run_id=first.run_id, baseline_run_id=first.baseline_run_id,
        verdicts=[v for r in reports for v in r.verdicts], stable=sum(r.stable for r in reports),
        changed_components=sorted({c for r in reports for c in r.changed_components}),
        batch_invariance=first.batch_invariance, strict=first.strict, policy=first.policy,
        fingerprint_changes={k: v for r in reports for k, v in r.fingerprint_changes.items()},
        not_run=[n for r in reports for n in r.not_run], template_date=first.template_date,
        prompts=PromptCounts(sum(r.prompts.compared for r in reports), sum(r.prompts.equal for r in reports))
        if all(r.prompts for r in reports) else None,
        classes=[ClassRow(r.hardware_class, r.hardware_label, r.run_id, r.baseline_run_id, r.status, r.counts, r.hardware)
                 for r in reports])
