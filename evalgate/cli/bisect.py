"""`evalgate bisect commits|config|batch|show` and `evalgate repro`: find what changed an output
(evalgate/bisect/, docs/bisect.md). Exit codes: 0 a culprit was found (and reproduced), 1 inconclusive
(bounds reached, the change did not reproduce, only skipped commits left), 2 usage, 3 engine/infrastructure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import JsonOpt, console, finish, handled, open_store_for, print_trial

DbOpt = typer.Option(None, "--db", help="Database URL or SQLite path (default: the suite's, or ./baselines)")
SuiteOpt = typer.Option(None, "--suite", help="Take the database from this suite file")
MaxStepsOpt = typer.Option(64, "--max-steps", help="Stop after this many trials (engine runs)")
MaxSecondsOpt = typer.Option(3600.0, "--max-seconds", help="Start no trial after this many seconds")


def _bounds(max_steps: int, max_seconds: float):
    from ..bisect.session import Bounds

    if max_steps < 1 or max_seconds <= 0:
        raise typer.BadParameter("must be positive", param_hint="--max-steps/--max-seconds")
    return Bounds(max_steps=max_steps, max_seconds=max_seconds)


@handled
def commits(suite: Optional[Path] = typer.Argument(None, help="Suite TOML file, inside the repository to bisect"),
            good: str = typer.Option(..., "--good", help="A revision whose outputs are the reference"),
            bad: str = typer.Option(..., "--bad", help="A later revision whose outputs differ"),
            setup: Optional[str] = typer.Option(None, "--setup", help="Shell command run at each revision before "
                                                "the suite (e.g. reinstall); failing it skips that revision"),
            db: Optional[str] = typer.Option(None, "--db", help="Database for the trials (default: the suite's; "
                                             "it must not be tracked by git)"),
            max_steps: int = MaxStepsOpt, max_seconds: float = MaxSecondsOpt, json_report: Optional[Path] = JsonOpt):
    """Find the first commit between --good and --bad that changes outputs (git bisect run, on only the
    requests that differ). The repository is always left on its original HEAD with no bisect in progress."""
    from ..bisect.commits import bisect_commits
    from ..configuration.suite_file import find_suite

    result = bisect_commits(find_suite(suite), good=good, bad=bad, setup=setup, db=db,
                            bounds=_bounds(max_steps, max_seconds), on_trial=print_trial)
    finish(result, json_report)


@handled
def commit_step(state: Path = typer.Argument(..., help="State file written by `evalgate bisect commits`")):
    """(Internal) one `git bisect run` step: exit 0 good, 1 bad, 125 skip."""
    from ..bisect.commits import step

    raise typer.Exit(step(state))


@handled
def config(run_a: int = typer.Argument(..., help="The reference run"),
           run_b: int = typer.Argument(..., help="The run whose outputs changed"),
           db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt,
           max_steps: int = MaxStepsOpt, max_seconds: float = MaxSecondsOpt, json_report: Optional[Path] = JsonOpt):
    """Find a minimal set of setting differences (env, engine arguments) between two runs that reproduces
    their output change (delta debugging; each trial is a fresh engine on only the differing requests)."""
    from ..bisect.config import bisect_config

    result = bisect_config(open_store_for(db, suite), run_a, run_b, bounds=_bounds(max_steps, max_seconds),
                           on_trial=print_trial)
    finish(result, json_report)


@handled
def batch(run_id: int = typer.Argument(..., help="A run in which the request showed batch variance"),
          key: str = typer.Argument(..., help="The request key"),
          db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt,
          on: str = typer.Option("auto", "--on", help="What counts as a flip: tokens, bits (ids and logprob bits), "
                                 "or auto (tokens if the recorded variance changed a token, else bits)"),
          repro: Optional[Path] = typer.Option(None, "--repro", help="Also write a repro pack of the minimal batch here"),
          max_steps: int = MaxStepsOpt, max_seconds: float = MaxSecondsOpt, json_report: Optional[Path] = JsonOpt):
    """For a request with batch variance: the smallest concurrency at which it flips, and a minimal set of
    co-batched requests that still flips it ("alone -> A, with {x, y} -> B")."""
    from ..bisect.batch import bisect_batch

    if on not in ("auto", "tokens", "bits"):
        raise typer.BadParameter("expected tokens, bits or auto", param_hint="--on")
    result = bisect_batch(open_store_for(db, suite), run_id, key, on=on, repro_dir=repro,
                          bounds=_bounds(max_steps, max_seconds), on_trial=print_trial)
    finish(result, json_report)


@handled
def show(session_id: Optional[int] = typer.Argument(None, help="A bisect id (default: list the recent ones)"),
         db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt,
         json_out: bool = typer.Option(False, "--json", help="Print as JSON")):
    """Read stored bisects and their trials, including interrupted ones."""
    store = open_store_for(db, suite)
    if session_id is None:
        from rich.table import Table

        table = Table()
        for col in ("bisect", "kind", "suite", "status", "trials", "started", "subject"):
            table.add_column(col)
        for row in store.bisects():
            _, trials = store.bisect(row.id)
            table.add_row(str(row.id), row.kind, row.suite_name or "", row.status, str(len(trials)),
                          row.started_at.strftime("%Y-%m-%d %H:%M:%S"), json.dumps(row.subject)[:80])
        console.print(table)
        return
    row, trials = store.bisect(session_id)
    doc = {"bisect": row.id, "kind": row.kind, "suite": row.suite_name, "status": row.status, "subject": row.subject,
           "result": row.result, "error": row.error,
           "trials": [{"step": t.step, "label": t.label, "outcome": t.outcome, "run": t.run_id, "seconds": t.seconds,
                       "config": t.config, "detail": t.detail} for t in trials]}
    if json_out:
        console.print_json(json.dumps(doc, default=str))
        return
    console.print(f"bisect {row.id} ({row.kind}): {row.status}", markup=False)
    console.print(f"subject: {json.dumps(row.subject)}", markup=False)
    from rich.table import Table
    table = Table()
    for col in ("step", "trial", "outcome", "run", "seconds"):
        table.add_column(col)
    for t in trials:
        table.add_row(str(t.step), t.label, t.outcome, str(t.run_id or ""), f"{t.seconds or 0:.1f}")
    console.print(table)
    if row.result:
        console.print(f"result: {json.dumps(row.result, default=str)}", markup=False)
    if row.error:
        console.print(f"error: {row.error}", markup=False)


@handled
def repro(run_id: int = typer.Argument(..., help="The run that holds the divergence"),
          key: str = typer.Argument(..., help="The request key"),
          out: Path = typer.Option(..., "-o", "--out", help="Directory to write the repro pack into"),
          db: Optional[str] = DbOpt, suite: Optional[Path] = SuiteOpt):
    """Write a self-contained repro pack: requests, sampling, engine args, env, fingerprint, expected vs
    observed token ids, and a plain vLLM script (no evalgate import) that reproduces the divergence."""
    from ..bisect.repro import write_repro

    pack = write_repro(open_store_for(db, suite), run_id, key, out)
    for line in pack.lines():
        console.print(line, markup=False, soft_wrap=True)
