"""The gate, as a library: create a baseline, check against one, merge the shards of a sharded run. The CLI
wraps these.

A run's inference happens in a supervised child process (evalgate/execution/worker.py); this process opens
the database, judges the stored outputs (judgement/judging.py) and finishes the run with its report. Which
baseline judges a check, and accepting or adopting one: baselines.py.
"""

from __future__ import annotations

from collections.abc import Iterator

from .baselines import accept, adopt_run, find_baseline
from .configuration.schedule import Schedule
from .configuration.shard import Shard
from .configuration.suite import Suite
from .configuration.template_date import dated
from .errors import ConfigError, EngineError
from .execution.request import Progress, RunRequest
from .execution.rescore import Rescore
from .execution.resume import run_to_resume
from .execution.worker import execute_in_worker
from .fingerprint import component
from .fingerprint import delta as fingerprint_delta
from .judgement.judging import Judging, combine, compare_runs, judge_and_store, stored_report
from .judgement.report import Report
from .store import Run, RunRecord, Store, existing_store, open_store
from .timings import Timings

__all__ = ["accept", "adopt_run", "check", "compare_runs", "create_baseline", "merge"]


def suite_database(suite: Suite, store: Store | str | None) -> str:
    """The database URL a run of the suite uses: the store given (a Store or URL), else the suite's."""
    if isinstance(store, Store):
        return store.url
    return store or suite.database


def execute_and_judge(request: RunRequest, judging: Judging, baseline_run_id: int | None = None, *,
                      progress: Progress | None = None, timings: Timings | None = None) -> Report:
    """Record the run the request asks for (in the engine's process), then judge and finish it."""
    result = execute_in_worker(request, progress)
    timings = timings if timings is not None else Timings()
    timings.update(result.timings)  # the caller's, if it gave one: judging adds its own time
    return judge_and_store(open_store(request.url), result.run_id, baseline_run_id, judging, timings)


def create_baseline(suite: Suite, store: Store | str | None = None, *, schedule: Schedule | None = None,
                    allow_variance: bool = False, progress: Progress | None = None,
                    timings: Timings | None = None, shard: Shard | None = None, group: str | None = None,
                    show_engine_output: bool = False, resume: bool | int = False) -> Report:
    """Run the suite and make it the baseline of this suite on this hardware class, unless its passes
    disagree (batch variance): a baseline must be reproducible. `allow_variance` promotes it anyway,
    with the first pass of each request as the reference. `store`: a Store or URL (default: the suite's).
    With `shard`, only that shard runs and nothing is promoted until `merge` joins the group's shards.
    `resume`: continue the newest unfinished run of this suite, shard and group (True) or that run (its id),
    keeping what it stored (execution/resume.py); with nothing to resume, a new run."""
    url = suite_database(suite, store)
    found = existing_store(url)
    group = _group(shard, group)
    resumed = _resumed(found, suite, "baseline", shard, group, resume)
    # the calendar a chat template reads: today's unless the suite names a date (a resumed run's: its own)
    suite = dated(suite, found.fingerprint_of(resumed).template_date if resumed else None)
    request = RunRequest(suite, url, "baseline", schedule or suite.schedule, shard=shard,
                         labels={"shard_group": group}, show_engine_output=show_engine_output,
                         rescore=Rescore(own=True), resume=resumed)  # a baseline rescores its own tokens: what lets it judge another class
    judging = Judging("baseline", allow_variance=allow_variance, shard=shard)
    return execute_and_judge(request, judging, progress=progress, timings=timings)


def _group(shard: Shard | None, group: str | None) -> str | None:
    if shard is not None and not group:
        raise ConfigError("--shard needs --group: the label shared by the shard runs to merge",
                          fix="e.g. --group \"$GITHUB_RUN_ID\"")
    return group


def _resumed(store: Store | None, suite: Suite, kind: str, shard: Shard | None, group: str | None,
             resume: bool | int) -> int | None:
    """The run a resume continues (None: a new run). A run id is an int (`True` is the newest unfinished)."""
    if resume is False or resume is None:
        return None
    if store is None:
        if resume is True:
            return None
        raise ConfigError(f"run {resume} does not exist: the database {suite.database} has not been created",
                          fix="see `evalgate runs list`, or run without --resume-run")
    return run_to_resume(store, suite.name, kind, shard=shard, group=group,
                         run_id=None if resume is True else int(resume))


def check(suite: Suite, store: Store | str | None = None, *, schedule: Schedule | None = None,
          strict: bool = False, progress: Progress | None = None, timings: Timings | None = None,
          shard: Shard | None = None, group: str | None = None, show_engine_output: bool = False,
          against: str | int | None = None, adopt: bool = False, resume: bool | int = False) -> Report:
    """Run the suite and judge it against the baseline (exit 4 before any inference if there is none).
    With `shard`, only that shard's requests run and are judged; `merge` gives the whole verdict.

    No baseline on this hardware class: judged against the nearest other class's (`against` names one),
    every difference classified (judgement/hardware.py); the check then also rescores the baseline's tokens
    and its own. `adopt`: such a check with no confident flip becomes this class's baseline (recorded on its
    report, which is returned as stored). `resume`: as `create_baseline`'s."""
    url = suite_database(suite, store)
    found = existing_store(url)
    choice = find_baseline(suite, found, url, against)
    suite = dated(suite, found.fingerprint_of(choice.run_id).template_date)  # the baseline's calendar
    group = _group(shard, group)
    request = RunRequest(suite, url, "check", schedule or suite.schedule, shard=shard,
                         labels={"shard_group": group}, show_engine_output=show_engine_output,
                         rescore=Rescore(own=True, of_run=choice.run_id) if choice.cross else None,
                         resume=_resumed(found, suite, "check", shard, group, resume))
    report = execute_and_judge(request, Judging("check", strict=strict, shard=shard), choice.run_id,
                               progress=progress, timings=timings)
    if adopt and report.hardware is not None and shard is None and report.hardware.adoptable and not report.failing:
        adopt_run(open_store(url), report.run_id)
        return stored_report(open_store(url), report.run_id)
    return report


def merge(suite: Suite, group: str, *, kind: str = "check", store: Store | str | None = None,
          strict: bool = False, allow_variance: bool = False) -> Report:
    """Join the shard runs of `group` into one run of the whole suite and judge it as one: a check against
    the baseline, or (kind "baseline") a new baseline, under the suite's `[gate]` policy (as the merge command
    gives it: `--fail-on` included), recorded with the merged run. Refuses an incomplete set of shards, and
    shards whose identity differs (a merged verdict over different stacks would mean nothing)."""
    url = suite_database(suite, store)
    store = open_store(url, create=False)
    # each shard's row and identity, not its outputs: a leaderboard-sized group is judged by windows once merged
    records = [store.load(r.id, keys=[]) for r in _complete_shards(store, suite, group, kind)]
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
    for members in classes.values():
        fingerprint = dict(members[0].fingerprint)
        fingerprint["suite"] = merged_suite_component(members)
        merged_id = store.merge_runs([rec.run for rec in members], fingerprint)
        baseline_run_id = (find_baseline(suite, store, url, here=fingerprint["hardware"]).run_id if kind == "check"
                           else None)
        keys = {key for rec in members for key in rec.fingerprint.request_hashes}
        # judged under the merge's policy (the suite's [gate], or --fail-on), never silently the first shard's
        judging = Judging(kind, strict=strict, allow_variance=allow_variance, in_scope=keys.__contains__,
                          policy=suite.gate)
        reports.append(judge_and_store(store, merged_id, baseline_run_id, judging))
    return reports[0] if len(reports) == 1 else combine(reports)


def _complete_shards(store: Store, suite: Suite, group: str, kind: str) -> list[Run]:
    """The latest run of each shard of `group`, in shard order; an incomplete set is refused, naming why."""
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
    return [latest[f"{i}/{count}"] for i in range(1, count + 1)]


def merged_suite_component(members) -> dict:
    """The `suite` component of shards merged into one run: every shard's request hashes, and its adapters'
    section (which adapter each request ran under, their files), so the merge is judged as the shards were."""
    data: dict = {"requests": {k: h for rec in members for k, h in rec.fingerprint.request_hashes.items()}}
    sections = [rec.fingerprint.adapters for rec in members if rec.fingerprint.adapters]
    if sections:
        data["adapters"] = {part: {k: v for s in sections for k, v in s[part].items()} for part in ("files", "requests")}
    return component(data, members[0].fingerprint.part("suite", "info"))


def judged_requests(suite: Suite, report: Report, store: Store | str | None = None) -> Iterator[tuple[str, str | None]]:
    """Every request the report judged, (key, location) in stored order: its run's, or merged per class each
    class's. What a JUnit file lists: a report lists only the requests that are not stable."""
    store = open_store(suite_database(suite, store))
    for run_id in [row.run_id for row in report.classes] or [report.run_id]:
        yield from store.request_locations(run_id)
