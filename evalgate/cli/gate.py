"""`evalgate baseline create` and `evalgate check`: run the suite, render the verdicts. The library is
imported when a command runs, not when the CLI starts (`evalgate --help` stays light)."""

from __future__ import annotations

import functools
import inspect
import socket
import time
import typing
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from ..errors import EvalgateError, ExitCode, out_of_memory
from .common import TYPER_EXITS, VerboseOpt, console, err_console, handled, parse_levels, progress_bar, show_notes, writable_output

SuiteArg = typer.Argument(None, help="Suite TOML file (default: ./evalgate.toml or \\[tool.evalgate] in ./pyproject.toml)")


@dataclass(frozen=True)
class RunOptions:
    """The options `baseline create` and `check` share, declared once (`run_options`)."""

    db: Optional[str] = typer.Option(None, "--db", help="Database URL or SQLite path (overrides the suite's database)")
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Override the schedule's concurrency levels, e.g. 1,16")
    shuffles: Optional[int] = typer.Option(None, "--shuffles", help="Override the number of shuffled-order passes")
    repeats: Optional[int] = typer.Option(None, "--repeats", help="Override the number of repeats")
    json_report: Optional[Path] = typer.Option(None, "--json-report", help="Also write the report as JSON (docs/json-report.md)",
                                               callback=writable_output)
    junit: Optional[Path] = typer.Option(None, "--junit", help="Also write JUnit XML: a testcase per request, an <error> "
                                                               "on exit 3 (docs/ci.md)", callback=writable_output)
    shard: Optional[str] = typer.Option(None, "--shard", help="Run only shard I of N (e.g. 2/4) of the requests; needs --group")
    group: Optional[str] = typer.Option(None, "--group", help="Label shared by the shard runs of one CI run (e.g. $GITHUB_RUN_ID)")
    merge: bool = typer.Option(False, "--merge", help="Merge the complete shard runs of --group into one run and judge it")
    fail_on: Optional[str] = typer.Option(None, "--fail-on", help="Override \\[gate] fail_on: bits (any difference fails) or "
                                                                  "tokens (logprob-bit drift is reported, token flips fail)")
    resume: bool = typer.Option(False, "--resume", help="Continue the newest unfinished run of this suite (and --shard, "
                                "--group) where its process died, keeping its stored waves; none: start a new run")
    resume_run: Optional[int] = typer.Option(None, "--resume-run", metavar="RUN_ID",
                                             help="Continue this unfinished run (see `evalgate runs list`)")
    verbose: bool = VerboseOpt


def run_options(command):
    """Give a command RunOptions' options: Typer reads the signature, so the shared options are added to it
    as parameters, and gathered back into one `options` argument for the command."""
    shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                annotation=typing.get_type_hints(RunOptions)[f.name]) for f in fields(RunOptions)]
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "options"]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        options = RunOptions(**{f.name: kwargs.pop(f.name) for f in fields(RunOptions)})
        return command(*args, **kwargs, options=options)

    wrapper.__signature__ = signature.replace(parameters=own + shared)
    wrapper.__annotations__ = {p.name: p.annotation for p in own + shared}
    return wrapper


def _is_infra(exc: BaseException) -> bool:
    """Whether `handled` turns this into exit 3 (engine/infrastructure, interrupt, anything unexpected)."""
    if isinstance(exc, (*TYPER_EXITS, SystemExit)):
        return False
    if isinstance(exc, EvalgateError):
        return exc.exit_code == ExitCode.INFRA
    return isinstance(exc, (Exception, KeyboardInterrupt))


def _infra_outputs(exc: BaseException, kind: str, suite_name: str, junit, started: float, timestamp: str) -> None:
    """A run that cannot be judged still leaves CI something to show: the JUnit error, the job summary."""
    from ..reports import github
    from ..reports.junit import write_infra_error

    if isinstance(exc, MemoryError):
        exc = out_of_memory()  # as `handled` says it on the terminal
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


def _run(kind: str, suite_file, options: RunOptions, **kwargs):
    from .. import gate
    from ..configuration.schedule import with_overrides
    from ..configuration.shard import parse_shard
    from ..configuration.suite import load_suite, with_fail_on
    from ..configuration.suite_file import find_suite
    from ..reports import github
    from ..reports.json_report import write_json
    from ..reports.junit import write_junit
    from ..reports.terminal import render_report

    db, concurrency, shuffles, repeats = options.db, options.concurrency, options.shuffles, options.repeats
    json_report, junit, shard, group = options.json_report, options.junit, options.shard, options.group
    merge, verbose, fail_on = options.merge, options.verbose, options.fail_on
    resume = options.resume_run if options.resume_run is not None else options.resume
    started, timestamp = time.monotonic(), datetime.now(timezone.utc).isoformat(timespec="seconds")
    if json_report and junit and json_report.resolve() == junit.resolve():
        raise typer.BadParameter(f"{junit} is the --json-report's path too: one would overwrite the other",
                                 param_hint="--junit")
    suite = load_suite(find_suite(suite_file), database=db)
    show_notes(suite)
    if fail_on is not None:
        suite = with_fail_on(suite, fail_on)
    schedule = with_overrides(suite.schedule, parse_levels(concurrency), shuffles, repeats, where=str(suite.path))
    if merge and (shard or not group):
        raise typer.BadParameter("--merge needs --group and no --shard", param_hint="--merge")
    if merge and resume:
        raise typer.BadParameter("a merge runs nothing to resume: resume the shard that failed", param_hint="--resume")
    try:
        progress, update = progress_bar()
        with progress:
            if merge:
                if kwargs.get("against") or kwargs.get("adopt"):
                    raise typer.BadParameter("--against and --adopt judge one run, not a merge", param_hint="--merge")
                report = gate.merge(suite, group, kind=kind,
                                    **{k: v for k, v in kwargs.items() if k in ("strict", "allow_variance")})
            elif kind == "baseline":
                report = gate.create_baseline(suite, schedule=schedule, progress=update,
                                              shard=parse_shard(shard) if shard else None, group=group,
                                              show_engine_output=verbose, resume=resume, **kwargs)
            else:
                report = gate.check(suite, schedule=schedule, progress=update,
                                    shard=parse_shard(shard) if shard else None, group=group,
                                    show_engine_output=verbose, resume=resume, **kwargs)
    except BaseException as exc:
        if _is_infra(exc):
            _infra_outputs(exc, kind, suite.name, junit, started, timestamp)
            unfinished = getattr(exc, "unfinished_run", None)
            if unfinished is not None:
                err_console.print(f"run {unfinished} keeps the waves it stored: the same command with --resume continues "
                                  "it (docs/usage.md \"Resuming a run\")")
        raise
    render_report(console, report)
    if json_report:
        write_json(report, json_report)
    if junit:
        write_junit(report, junit, suite_file=suite.path, duration=time.monotonic() - started,
                    timestamp=timestamp, hostname=socket.gethostname(), requests=gate.judged_requests(suite, report))
    try:
        github.publish(report)
    except OSError as exc:  # an unwritable $GITHUB_STEP_SUMMARY must not turn a verdict into exit 3
        err_console.print(f"[yellow]warning:[/] could not append the GitHub job summary: {exc}")
    raise typer.Exit(int(report.exit_code))


@handled
@run_options
def create(suite_file: Optional[Path] = SuiteArg,
           allow_variance: bool = typer.Option(False, "--allow-variance", help="Promote even if passes disagree"),
           *, options: RunOptions):
    """Run the suite at every concurrency/order/repeat and store it as the baseline for this hardware."""
    _run("baseline", suite_file, options, allow_variance=allow_variance)


@handled
@run_options
def check(suite_file: Optional[Path] = SuiteArg,
          strict: bool = typer.Option(False, "--strict", help="Explained changes, new and missing requests fail too"),
          against: Optional[str] = typer.Option(None, "--against", help="Judge against this baseline: a run id or a "
                                                "hardware class (a prefix of its hash; see `evalgate baseline list`)"),
          adopt: bool = typer.Option(False, "--adopt", help="A check judged against another hardware class's baseline "
                                     "with no confident flip becomes this class's baseline (with a receipt)"),
          *, options: RunOptions):
    """Run the suite again; exit 1 on batch variance or a silent regression against the baseline. With no
    baseline on this hardware, judged against another class's: drift and near ties pass, confident flips fail."""
    _run("check", suite_file, options, strict=strict, against=against, adopt=adopt)
