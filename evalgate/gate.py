"""The gate, as a library: create a baseline, check against it, accept a run. The CLI wraps these.

A run's inference happens in a supervised child process (evalgate/execution/worker.py); this process only opens
the database, judges the stored outputs and finishes the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from .collector import collector_paused
from .configuration.policy import GatePolicy
from .configuration.schedule import ROTATING, Schedule, rotating_problem, with_overrides
from .configuration.shard import Shard
from .configuration.suite import Suite
from .configuration.template_date import dated, recorded_template_date
from .errors import ConfigError, EngineError, NoBaselineError
from .execution.request import Progress, RunRequest, Timings
from .execution.rescore import Rescore
from .execution.worker import execute_in_worker
from .fingerprint import component, hardware_component, hardware_label
from .fingerprint import delta as fingerprint_delta
from .judgement.hardware import AcrossHardware, judge_across
from .judgement.scores import compare_scores, task_changes
from .judgement.verdict import Report, judge
from .store import BASELINE_RESCORING, OWN_RESCORING, Run, RunRecord, Store, existing_store, open_store


def suite_database(suite: Suite, store: Store | str | None) -> str:
    """The database URL a run of the suite uses: the store given (a Store or URL), else the suite's."""
    if isinstance(store, Store):
        return store.url
    return store or suite.database


def judge_runs(store: Store, run_id: int, baseline_run_id: int | None, *, kind: str, strict: bool = False,
               in_scope=lambda key: True) -> Report:
    """The whole judgement of a stored run against the baseline run (or none): `judge_records` on both."""
    with collector_paused():
        baseline = store.load(baseline_run_id) if baseline_run_id is not None else None
        return judge_records(store, store.load(run_id), baseline, Judging(kind, strict=strict, in_scope=in_scope))


def judge_records(store: Store, current: RunRecord, baseline: RunRecord | None, judging: Judging) -> Report:
    """The whole judgement, built in one place: the verdicts and beside them the lm-eval metrics, what
    changed in the tasks' identity, the rotating preset's alone coverage and where the engine's own output
    went."""
    report = judge(current, baseline, kind=judging.kind, strict=judging.strict, in_scope=judging.scope(),
                   policy=judging.policy)
    if baseline is not None and baseline.run.hardware_class != current.run.hardware_class:
        report.hardware = judge_across(report, current, baseline, *rescorings(store, current, baseline), report.policy)
    report.metrics = compare_scores(store, current.id, baseline.id if baseline else None,
                                    {v.key: v.verdict for v in report.verdicts}, report.policy.metric_alpha)
    report.task_changes = task_changes(baseline.fingerprint, current.fingerprint) if baseline else {}
    schedule = current.run.schedule or {}
    if schedule.get("preset") == ROTATING:
        report.alone_coverage = store.alone_coverage(current.run, schedule["rotation"], min(schedule["concurrency"]))
    log = current.run.engine_log
    report.engine_log = log if log and os.path.isfile(log) else None
    return report


def rescorings(store: Store, current: RunRecord, baseline: RunRecord) -> tuple[RunRecord | None, RunRecord | None]:
    """The two rescorings of the baseline's tokens (execution/rescore.py): here (the run judged against it
    made one) and on the baseline's own class (recorded with it). None where there is none."""
    def loaded(run_id: int, which: int) -> RunRecord | None:
        record = store.load(run_id, rescoring=which)
        return record if record.digests else None

    # a run being judged has no baseline_run_id yet; a stored one made its rescoring against its own baseline
    here = loaded(current.id, BASELINE_RESCORING) if current.run.baseline_run_id in (None, baseline.id) else None
    return here, loaded(baseline.id, OWN_RESCORING)


def promotes(report: Report, *, allow_variance: bool = False, shard: Shard | None = None) -> bool:
    """The one promotion rule: a baseline run of the whole suite (a shard is part of one: its group's merge
    decides) whose passes agree, or any baseline run with `allow_variance`. A check never promotes."""
    return report.kind == "baseline" and shard is None and (allow_variance or not report.failing)


@dataclass(frozen=True)
class Judging:
    """How a recorded run is judged and finished: as what kind of run, against which baseline run (None:
    none), with which policy switches, over which requests (`in_scope`; default: the shard's, else all)."""

    kind: str
    baseline_run_id: int | None = None
    strict: bool = False
    allow_variance: bool = False
    shard: Shard | None = None
    in_scope: Callable[[str], bool] | None = None
    policy: GatePolicy | None = None  # what fails (None: the policy recorded with the run)

    def scope(self) -> Callable[[str], bool]:
        return self.in_scope or (self.shard.contains if self.shard else (lambda key: True))


def judge_and_finish(store: Store, run_id: int, judging: Judging, timings: Timings | None = None) -> Report:
    """Judge a recorded run and finish it: complete, with its verdict, and the baseline if it `promotes`.
    Anything that fails here leaves the run incomplete, never complete."""
    timings = timings if timings is not None else Timings()
    try:
        with timings.phase("evalgate"), collector_paused():
            current = store.load(run_id)
            baseline = store.load(judging.baseline_run_id) if judging.baseline_run_id is not None else None
            report = judge_records(store, current, baseline, judging)
            report.hardware_class = current.run.hardware_class
            report.hardware_label = hardware_label(current.fingerprint.get("hardware") or {})
            report.promoted = promotes(report, allow_variance=judging.allow_variance, shard=judging.shard)
        stored = {**(current.run.schedule or {}), "gate": report.policy.to_dict()}  # the policy it was judged under
        store.finish_run(
            run_id, status="complete", verdict=report.status, exit_code=int(report.exit_code),
            summary=report.counts, verdicts=[v.to_dict() for v in report.verdicts if v.verdict != "stable"],
            schedule={**stored, "timings": dict(timings), "report": report_record(report)},
            baseline_run_id=judging.baseline_run_id,
            promote=report.promoted,
        )
    except BaseException as exc:
        store.mark_incomplete(run_id, "failed", f"{type(exc).__name__}: {exc}")
        raise
    return report


def report_record(report: Report) -> dict:
    """The report as stored with its run: `to_dict` less the requests, which the run's verdict rows hold
    (the same objects, stored once)."""
    return report.to_dict(requests=False)


def stored_section(run: Run, name: str):
    """One entry of the report stored with a run (runs finished before reports were stored kept the
    conditions alone, as `judged`)."""
    schedule = run.schedule or {}
    return (schedule.get("report") or schedule.get("judged") or {}).get(name)


def stored_report(store: Store, run_id: int) -> Report | None:
    """The report stored with a judged run, read back as it was written (None: the run was never judged:
    it did not finish, or it is a cost or bisect measurement). A run judged before reports were stored is
    judged again once, as then, and its report stored."""
    run = store.get_run(run_id)
    schedule = run.schedule or {}
    if schedule.get("report") is not None:
        return Report.from_dict({**schedule["report"], "requests": store.verdicts(run_id)})
    if run.status != "complete" or run.kind not in ("baseline", "check") or run.verdict is None:
        return None
    with collector_paused():
        current = store.load(run_id)
        baseline = store.load(run.baseline_run_id) if run.baseline_run_id is not None else None
        report = judge_records(store, current, baseline, Judging(run.kind))
    report.hardware_class = run.hardware_class
    report.hardware_label = hardware_label(current.fingerprint.get("hardware") or {})
    report.promoted = store.baseline_for(run.suite_name, run.hardware_class) == run_id
    store.update_schedule(run_id, {**schedule, "report": report_record(report)})
    return report


def execute_and_judge(request: RunRequest, judging: Judging, progress: Progress | None = None,
                      timings: Timings | None = None) -> Report:
    """Record the run the request asks for (in the engine's process), then judge and finish it."""
    result = execute_in_worker(request, progress)
    timings = timings if timings is not None else Timings()
    timings.update(result.timings)  # the caller's, if it gave one: judging adds its own time
    return judge_and_finish(open_store(request.url), result.run_id, judging, timings)


def create_baseline(suite: Suite, store: Store | str | None = None, *, schedule: Schedule | None = None,
                    allow_variance: bool = False, progress: Progress | None = None,
                    timings: Timings | None = None, shard: Shard | None = None, group: str | None = None,
                    show_engine_output: bool = False) -> Report:
    """Run the suite and make it the baseline of this suite on this hardware class, unless its passes
    disagree (batch variance): a baseline must be reproducible. `allow_variance` promotes it anyway,
    with the first pass of each request as the reference. `store`: a Store or URL (default: the suite's).
    With `shard`, only that shard runs and nothing is promoted until `merge` joins the group's shards."""
    url = suite_database(suite, store)
    existing_store(url)
    suite = dated(suite)  # the calendar a chat template reads: today's, unless the suite names a date
    request = RunRequest(suite, url, "baseline", schedule or suite.schedule, shard=shard,
                         labels={"shard_group": _group(shard, group)}, show_engine_output=show_engine_output,
                         rescore=Rescore(own=True))  # a baseline rescores its own tokens: what lets it judge another class
    return execute_and_judge(request, Judging("baseline", allow_variance=allow_variance, shard=shard), progress, timings)


def _group(shard: Shard | None, group: str | None) -> str | None:
    if shard is not None and not group:
        raise ConfigError("--shard needs --group: the label shared by the shard runs to merge",
                          fix="e.g. --group \"$GITHUB_RUN_ID\"")
    return group


@dataclass(frozen=True)
class BaselineChoice:
    """The baseline a check is judged against: this hardware class's, or (`cross`) another class's."""

    run_id: int
    cross: bool = False


def find_baseline(suite: Suite, store: Store | None, url: str, against: str | int | None = None,
                  here: dict | None = None) -> BaselineChoice:
    """This class's baseline; else, unless `[gate] other_hardware = "refuse"`, the nearest other class's
    (`nearest_baseline`); `against`: a baseline run id or a hardware class (a prefix of its hash), named.
    `here`: the hardware component of the run to judge (default: this machine's)."""
    here = here or hardware_component()
    if against is not None and str(against).strip():
        return _named_baseline(suite, store, url, str(against).strip(), here["hash"])
    run_id = store.baseline_for(suite.name, here["hash"]) if store else None
    if run_id is not None:
        return BaselineChoice(run_id)
    others = store.baselines(suite.name) if store else []
    if others and suite.gate.other_hardware != "refuse":
        return BaselineChoice(nearest_baseline(store, others, here), cross=True)
    hint = ""
    if others:
        hint = (f" (baselines exist for {len(others)} other hardware class(es), and [gate] other_hardware = "
                "\"refuse\" keeps a check to its own class)")
    raise NoBaselineError(
        f"no baseline for suite {suite.name!r} on this hardware ({hardware_label(here)}) in {url}{hint}",
        fix=f"evalgate baseline create {suite.path}",
    )


def nearest_baseline(store: Store, baselines: list, here: dict) -> int:
    """Of several classes' baselines, the nearest to this machine: the same platform (architecture, GPU or
    not), then the same GPU capability or CPU instruction-set family, then the same model; the newest first."""
    def kinship(baseline) -> tuple:
        theirs = (store.fingerprint_of(baseline.run_id).get("hardware") or {}).get("data") or {}
        mine = here["data"]
        gpus = [sorted(tuple(g.get("capability") or ()) for g in d.get("gpus") or []) for d in (mine, theirs)]
        return (theirs.get("machine") == mine.get("machine"), bool(gpus[0]) == bool(gpus[1]), gpus[0] == gpus[1],
                theirs.get("isa") == mine.get("isa"), theirs.get("cpu") == mine.get("cpu"), baseline.promoted_at)

    return max(baselines, key=kinship).run_id


def _named_baseline(suite: Suite, store: Store | None, url: str, against: str, here: str) -> BaselineChoice:
    baselines = store.baselines(suite.name) if store else []
    if against.isdigit():
        found = [b for b in baselines if b.run_id == int(against)]
    else:
        found = [b for b in baselines if b.hardware_class.startswith(against.lower())]
    if len(found) != 1:
        listed = ", ".join(f"run {b.run_id} (class {b.hardware_class[:12]})" for b in baselines) or "none"
        raise ConfigError(f"--against {against}: {'no' if not found else 'more than one'} baseline of suite "
                          f"{suite.name!r} in {url} matches", fix=f"name a baseline run or class; the baselines: {listed}")
    return BaselineChoice(found[0].run_id, cross=found[0].hardware_class != here)


def check(suite: Suite, store: Store | str | None = None, *, schedule: Schedule | None = None,
          strict: bool = False, progress: Progress | None = None, timings: Timings | None = None,
          shard: Shard | None = None, group: str | None = None, show_engine_output: bool = False,
          against: str | int | None = None, adopt: bool = False) -> Report:
    """Run the suite and judge it against the baseline (exit 4 before any inference if there is none).
    With `shard`, only that shard's requests run and are judged; `merge` gives the whole verdict.

    No baseline on this hardware class: judged against the nearest other class's (`against` names one),
    every difference classified (judgement/hardware.py); the check then also rescores the baseline's tokens
    and its own. `adopt`: such a check with no confident flip becomes this class's baseline."""
    url = suite_database(suite, store)
    found = existing_store(url)
    choice = find_baseline(suite, found, url, against)
    suite = dated(suite, recorded_template_date(found.fingerprint_of(choice.run_id)))  # the baseline's calendar
    request = RunRequest(suite, url, "check", schedule or suite.schedule, shard=shard,
                         labels={"shard_group": _group(shard, group)}, show_engine_output=show_engine_output,
                         rescore=Rescore(own=True, of_run=choice.run_id) if choice.cross else None)
    report = execute_and_judge(request, Judging("check", choice.run_id, strict=strict, shard=shard), progress, timings)
    if adopt and report.hardware is not None and shard is None and report.hardware.adoptable and not report.failing:
        adopt_run(open_store(url), report.run_id)
        report.hardware.adopted = True
    return report


def merge(suite: Suite, group: str, *, kind: str = "check", store: Store | str | None = None,
          strict: bool = False, allow_variance: bool = False) -> Report:
    """Join the shard runs of `group` into one run of the whole suite and judge it as one: a check against
    the baseline, or (kind "baseline") a new baseline, under the suite's `[gate]` policy (as the merge command
    gives it: `--fail-on` included), recorded with the merged run. Refuses an incomplete set of shards, and
    shards whose identity differs (a merged verdict over different stacks would mean nothing)."""
    url = suite_database(suite, store)
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
    classes: dict[str, list[RunRecord]] = {}  # a check's shards may run on several hardware classes
    for record in records:
        classes.setdefault(record.run.hardware_class, []).append(record)
    if kind == "baseline" and len(classes) > 1:
        raise ConfigError(f"the baseline shards of group {group!r} ran on {len(classes)} hardware classes: a baseline "
                          "is one class's", fix="run a sharded baseline's jobs on one kind of machine (check shards "
                                                "may mix: each class is judged against its own or the nearest baseline)")
    first = records[0]
    for other in records[1:]:
        differing = [c for c in fingerprint_delta(first.fingerprint, other.fingerprint) if c != "hardware"]
        if differing:
            raise ConfigError(f"shard runs {first.id} and {other.id} of group {group!r} differ in "
                              f"{', '.join(differing)}: their outputs cannot be judged as one run",
                              fix="run every shard of a group with the same model and setup")
    reports = []
    for hardware_class, members in classes.items():
        fingerprint = dict(members[0].fingerprint)
        fingerprint["suite"] = component({"requests": {k: r.request_hash for rec in members
                                                       for k, r in rec.requests.items()}})
        merged_id = store.merge_runs([rec.run for rec in members], fingerprint)
        baseline_run_id = (find_baseline(suite, store, url, here=fingerprint["hardware"]).run_id if kind == "check"
                           else None)
        keys = {key for rec in members for key in rec.requests}
        # judged under the merge's policy (the suite's [gate], or --fail-on), never silently the first shard's
        judging = Judging(kind, baseline_run_id, strict=strict, allow_variance=allow_variance, in_scope=keys.__contains__,
                          policy=suite.gate)
        reports.append(judge_and_finish(store, merged_id, judging))
    return reports[0] if len(reports) == 1 else combine(reports)


def combine(reports: list[Report]) -> Report:
    """One verdict over a check's shards merged per hardware class: every request's verdict, and per class
    the merged run, the baseline it was judged against (its own class's or another's) and its result."""
    first = reports[0]
    combined = Report(kind=first.kind, suite_name=first.suite_name, run_id=first.run_id,
                      baseline_run_id=first.baseline_run_id, verdicts=[v for r in reports for v in r.verdicts],
                      changed_components=sorted({c for r in reports for c in r.changed_components}),
                      batch_invariance=first.batch_invariance, strict=first.strict, policy=first.policy,
                      fingerprint_changes={k: v for r in reports for k, v in r.fingerprint_changes.items()},
                      not_run=[n for r in reports for n in r.not_run], template_date=first.template_date,
                      prompts={n: sum(r.prompts[n] for r in reports) for n in ("compared", "equal")}
                      if all(r.prompts for r in reports) else None)
    combined.classes = [{"hardware_class": r.hardware_class, "label": r.hardware_label, "run_id": r.run_id,
                         "baseline_run_id": r.baseline_run_id, "status": r.status, "counts": r.counts,
                         "hardware": r.hardware.to_dict() if r.hardware else None} for r in reports]
    return combined


def accept(store: Store, run_id: int):
    """Promote a complete run to be the baseline of its suite on its hardware class."""
    return store.promote(run_id)


def adopt_run(store: Store, run_id: int) -> Run:
    """Make a check judged against another hardware class's baseline, with no confident flip, the baseline
    of its own class, with a receipt: against which run and class, the counts per class, the envelope and
    the tolerances. A check with a confident flip (or any failure) is never adopted."""
    run = store.get_run(run_id)
    judged = stored_section(run, "hardware")
    if run.kind != "check" or run.status != "complete" or not judged:
        raise ConfigError(f"run {run_id} is not a complete check judged against another hardware class's baseline",
                          fix="adopt a cross-hardware check (see `evalgate runs list`); promote a same-class run "
                              "with `evalgate baseline accept`")
    section = AcrossHardware.from_dict(judged)
    if not section.adoptable or run.exit_code != 0:
        why = (f"{section.counts['confident']} confident flip(s) across hardware" if not section.adoptable
               else f"its verdict is {run.verdict}")
        raise ConfigError(f"run {run_id} cannot be adopted: {why}", fix="a baseline must be reproducible and agree "
                          "with the other class up to rounding; look at `evalgate report` for the flips")
    receipt = {"adopted_from": run.baseline_run_id, "from_class": section.baseline_class,
               "from_label": section.baseline_label, "label": section.here_label, "counts": section.counts,
               "compared": section.compared, "envelope": section.envelope,
               "tolerance": section.tolerance.to_dict(), "mode": section.mode,
               "rescored": bool(store.load(run_id, rescoring=OWN_RESCORING).digests)}
    return store.promote(run_id, receipt)


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
