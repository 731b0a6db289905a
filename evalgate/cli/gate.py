"""`evalgate baseline create` and `evalgate check`: run the suite, render the verdicts."""

from __future__ import annotations

import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import click
import typer

from .. import gate
from ..configuration.shard import parse_shard
from ..configuration.suite import find_suite, load_suite, with_fail_on
from ..errors import EvalgateError, ExitCode
from ..reports import github
from ..reports.json_report import write_json
from ..reports.junit import write_infra_error, write_junit
from ..reports.terminal import render_report
from .common import VerboseOpt, console, err_console, handled, parse_levels, progress_bar

SuiteArg = typer.Argument(None, help="Suite TOML file (default: ./evalgate.toml or \\[tool.evalgate] in ./pyproject.toml)")
DbOpt = typer.Option(None, "--db", help="Database URL or SQLite path (overrides the suite's database)")
ConcurrencyOpt = typer.Option(None, "--concurrency", help="Override the schedule's concurrency levels, e.g. 1,16")
ShufflesOpt = typer.Option(None, "--shuffles", help="Override the number of shuffled-order passes")
RepeatsOpt = typer.Option(None, "--repeats", help="Override the number of repeats")
JsonOpt = typer.Option(None, "--json-report", help="Also write the report as JSON (docs/json-report.md)")
ShardOpt = typer.Option(None, "--shard", help="Run only shard I of N (e.g. 2/4) of the requests; needs --group")
GroupOpt = typer.Option(None, "--group", help="Label shared by the shard runs of one CI run (e.g. $GITHUB_RUN_ID)")
MergeOpt = typer.Option(False, "--merge", help="Merge the complete shard runs of --group into one run and judge it")
FailOnOpt = typer.Option(None, "--fail-on", help="Override [gate] fail_on: bits (any difference fails) or tokens "
                                                 "(logprob-bit drift is reported, token flips fail)")
JunitOpt = typer.Option(None, "--junit", help="Also write JUnit XML: a testcase per request, an <error> on exit 3 "
                                              "(docs/ci.md)")


def _is_infra(exc: BaseException) -> bool:
    """Whether `handled` turns this into exit 3 (engine/infrastructure, interrupt, anything unexpected)."""
    if isinstance(exc, (typer.Exit, typer.Abort, click.ClickException, SystemExit)):
        return False
    if isinstance(exc, EvalgateError):
        return exc.exit_code == ExitCode.INFRA
    return isinstance(exc, (Exception, KeyboardInterrupt))


def _infra_outputs(exc: BaseException, kind: str, suite_name: str, junit, started: float, timestamp: str) -> None:
    """A run that cannot be judged still leaves CI something to show: the JUnit error, the job summary."""
    if isinstance(exc, EvalgateError):
        message, error_type = str(exc), type(exc).__name__
    elif isinstance(exc, KeyboardInterrupt):
        message, error_type = "interrupted: the run is stored as incomplete", "Interrupted"
    else:
        message, error_type = f"{type(exc).__name__}: {exc}", type(exc).__name__
    try:
        if junit:
            write_infra_error(junit, message, error_type=error_type, suite_name=suite_name,
                              duration=time.monotonic() - started, timestamp=timestamp)
        github.publish_infra_error(kind, message)
    except Exception as write_error:  # never hide the run's own error behind a report-writing one
        err_console.print(f"[yellow]warning:[/] could not write the CI error report: {write_error}")


def _run(kind: str, suite_file, db, concurrency, shuffles, repeats, json_report, junit=None, *,
         shard=None, group=None, merge=False, verbose=False, fail_on=None, **kwargs):
    started, timestamp = time.monotonic(), datetime.now(timezone.utc).isoformat(timespec="seconds")
    suite = load_suite(find_suite(suite_file), database=db)
    if fail_on is not None:
        suite = with_fail_on(suite, fail_on)
    schedule = gate.resolve_schedule(suite, parse_levels(concurrency), shuffles, repeats)
    if merge and (shard or not group):
        raise typer.BadParameter("--merge needs --group and no --shard", param_hint="--merge")
    try:
        progress, update = progress_bar()
        with progress:
            if merge:
                report = gate.merge(suite, group, kind=kind, **kwargs)
            elif kind == "baseline":
                report = gate.create_baseline(suite, schedule=schedule, progress=update,
                                              shard=parse_shard(shard) if shard else None, group=group,
                                              show_engine_output=verbose, **kwargs)
            else:
                report = gate.check(suite, schedule=schedule, progress=update,
                                    shard=parse_shard(shard) if shard else None, group=group,
                                    show_engine_output=verbose, **kwargs)
        changes = report.fingerprint_changes
    except BaseException as exc:
        if _is_infra(exc):
            _infra_outputs(exc, kind, suite.name, junit, started, timestamp)
        raise
    render_report(console, report, changes)
    if json_report:
        write_json(report, json_report, {"fingerprint_changes": changes})
    if junit:
        write_junit(report, junit, suite_file=suite.path, duration=time.monotonic() - started,
                    fingerprint_changes=changes, timestamp=timestamp, hostname=socket.gethostname())
    try:
        github.publish(report, changes)
    except OSError as exc:  # an unwritable $GITHUB_STEP_SUMMARY must not turn a verdict into exit 3
        err_console.print(f"[yellow]warning:[/] could not append the GitHub job summary: {exc}")
    raise typer.Exit(int(report.exit_code))


@handled
def create(suite_file: Optional[Path] = SuiteArg, db: Optional[str] = DbOpt, concurrency: Optional[str] = ConcurrencyOpt,
           shuffles: Optional[int] = ShufflesOpt, repeats: Optional[int] = RepeatsOpt,
           allow_variance: bool = typer.Option(False, "--allow-variance", help="Promote even if passes disagree"),
           json_report: Optional[Path] = JsonOpt, junit: Optional[Path] = JunitOpt,
           shard: Optional[str] = ShardOpt, group: Optional[str] = GroupOpt, merge: bool = MergeOpt,
           fail_on: Optional[str] = FailOnOpt, verbose: bool = VerboseOpt):
    """Run the suite at every concurrency/order/repeat and store it as the baseline for this hardware."""
    _run("baseline", suite_file, db, concurrency, shuffles, repeats, json_report, junit, shard=shard, group=group,
         merge=merge, verbose=verbose, fail_on=fail_on, allow_variance=allow_variance)


@handled
def check(suite_file: Optional[Path] = SuiteArg, db: Optional[str] = DbOpt, concurrency: Optional[str] = ConcurrencyOpt,
          shuffles: Optional[int] = ShufflesOpt, repeats: Optional[int] = RepeatsOpt,
          strict: bool = typer.Option(False, "--strict", help="Explained changes, new and missing requests fail too"),
          json_report: Optional[Path] = JsonOpt, junit: Optional[Path] = JunitOpt,
          shard: Optional[str] = ShardOpt, group: Optional[str] = GroupOpt, merge: bool = MergeOpt,
          fail_on: Optional[str] = FailOnOpt, verbose: bool = VerboseOpt):
    """Run the suite again; exit 1 on batch variance or a silent regression against the baseline."""
    _run("check", suite_file, db, concurrency, shuffles, repeats, json_report, junit, shard=shard, group=group,
         merge=merge, verbose=verbose, fail_on=fail_on, strict=strict)
