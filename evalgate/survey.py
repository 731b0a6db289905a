"""What varies on this machine: `evalgate survey`.

A survey runs the suite's comparisons (its schedule; with `probes`, vLLM's determinism scenarios too),
judges the passes against each other as a baseline run would, and stores the run as kind `survey`, which
can never become a baseline (store/baselines.py refuses it). Its table says, for each comparison, how many
requests differ and how (token flips or logprob bits only); `remedy_args` gives the engine settings that
remove what fails under the suite's `[gate]` policy. `evalgate init` and `evalgate demo` use both.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from .configuration.schedule import FULL, Schedule
from .configuration.suite import Suite
from .execution.request import Progress, RunRequest
from .gate import execute_and_judge, suite_database
from .judgement.factors import remedy_settings
from .judgement.judging import Judging
from .judgement.report import Report
from .store import existing_store
from .timings import Timings

SURVEY_KIND = "survey"



def survey(suite: Suite, store=None, *, schedule: Schedule | None = None, probes: tuple[str, ...] | None = None,
           progress: Progress | None = None, timings: Timings | None = None,
           show_engine_output: bool = False) -> Report:
    """Run every comparison of the suite's schedule (the full preset: a rotating sample is no machine's
    table; `probes` replaces the schedule's), judge the passes against each other, store the run as a
    survey. Nothing is promoted and no baseline is read."""
    url = suite_database(suite, store)
    existing_store(url)
    schedule = schedule or suite.schedule
    schedule = dataclasses.replace(schedule, preset=FULL, probes=schedule.probes if probes is None else probes)
    request = RunRequest(suite, url, SURVEY_KIND, schedule, show_engine_output=show_engine_output)
    return execute_and_judge(request, Judging(SURVEY_KIND), progress=progress, timings=timings)


@dataclass(frozen=True)
class MachineRow:
    """One comparison of a survey: the factor it changed and how many of the requests it compared differ."""

    comparison: str
    factor: str | None
    differing: int
    compared: int


def machine_table(report: Report) -> list[MachineRow]:
    """The survey's table: one row per comparison, in the order the run made them."""
    return [MachineRow(f.comparison, f.factor, f.differing, f.compared or 0) for f in report.factors]


def how_they_differ(report: Report) -> tuple[int, int]:
    """Of the requests whose passes disagree: how many flip a token, how many differ in logprob bits only."""
    varied = [v for v in report.verdicts if v.verdict == "batch_variance"]
    return sum(not v.bits_only for v in varied), sum(bool(v.bits_only) for v in varied)


def failing_factors(report: Report) -> list[str]:
    """The factors whose differences the suite's policy fails, in the order the run compared them: every
    comparison with a difference at `fail_on = "bits"`; at "tokens", those where a request flips a token
    first (a verdict names the first comparison at which its request differs)."""
    if not report.failing:
        return []
    differing = [f.factor for f in report.factors if f.differing]
    if report.policy.fail_on != "bits":
        flipped = {v.factor for v in report.failing}
        differing = [f for f in differing if f in flipped]
    return list(dict.fromkeys(differing))


def remedy_args(factors: list[str]) -> dict:
    """The engine settings that remove the variance under these factors, as each factor's remedy declares
    them (configuration/remedy.py; a factor without a setting adds nothing: `unremedied` names it)."""
    args: dict = {}
    for factor in factors:
        args.update(remedy_settings(factor))
    return args


def unremedied(factors: list[str]) -> list[str]:
    return [f for f in factors if not remedy_settings(f)]


def setting_lines(args: dict) -> list[str]:
    """Engine settings as the suite file writes them (`max_num_seqs = 1`): what is written is what is shown."""
    return [f"{key} = {json.dumps(value)}" for key, value in args.items()]


@dataclass(frozen=True)
class TokenFlip:
    """A request whose passes chose different tokens: where, how close the reference's choice was, and its
    answer in each of the two passes (at their concurrency levels)."""

    key: str
    position: int
    margin: float | None
    flip: str | None  # near_tie or confident (the policy's class)
    answers: tuple[tuple[int, str], tuple[int, str]]  # (concurrency, text) of the reference and the other pass


def token_flips(store, report: Report, limit: int = 5) -> list[TokenFlip]:
    """The first `limit` token flips of a run's batch variance, with both answers read back from the store."""
    flipped = [v for v in report.verdicts if v.verdict == "batch_variance" and not v.bits_only and v.divergence][:limit]
    if not flipped:
        return []
    record = store.load(report.run_id)
    record.prefetch([v.key for v in flipped])  # one query for the flips, not one per request
    outputs, found = record.outputs, []
    for v in flipped:
        text = {c.pass_index: c.text for c in outputs.get(v.key, [])}
        p = v.passes
        found.append(TokenFlip(v.key, v.divergence.position, v.divergence.margin, v.flip,
                               ((p["reference_concurrency"], text.get(p["reference_pass"], "")),
                                (p["other_concurrency"], text.get(p["other_pass"], "")))))
    return found
