"""`evalgate baseline create` and `evalgate check`: run the suite, render the verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import gate
from ..fingerprint import describe_changes
from ..reports.json_report import write_json
from ..reports.terminal import render_report
from ..store import open_store
from ..suite import find_suite, load_suite
from .common import console, handled, parse_levels, progress_bar

SuiteArg = typer.Argument(None, help="Suite TOML file (default: ./evalgate.toml or [tool.evalgate] in ./pyproject.toml)")
DbOpt = typer.Option(None, "--db", help="Database URL or SQLite path (overrides the suite's database)")
ConcurrencyOpt = typer.Option(None, "--concurrency", help="Override the schedule's concurrency levels, e.g. 1,16")
ShufflesOpt = typer.Option(None, "--shuffles", help="Override the number of shuffled-order passes")
RepeatsOpt = typer.Option(None, "--repeats", help="Override the number of repeats")
JsonOpt = typer.Option(None, "--json-report", help="Also write the report as JSON (docs/json-report.md)")


def _run(kind: str, suite_file, db, concurrency, shuffles, repeats, json_report, **kwargs):
    suite = load_suite(find_suite(suite_file), database=db)
    schedule = gate.resolve_schedule(suite, parse_levels(concurrency), shuffles, repeats)
    progress, update = progress_bar()
    with progress:
        if kind == "baseline":
            report = gate.create_baseline(suite, schedule=schedule, progress=update, **kwargs)
        else:
            report = gate.check(suite, schedule=schedule, progress=update, **kwargs)
    changes = {}
    if report.baseline_run_id is not None:
        store = open_store(suite.database)
        current, baseline = store.load(report.run_id), store.load(report.baseline_run_id)
        changes = describe_changes(baseline.fingerprint, current.fingerprint, report.changed_components)
    render_report(console, report, changes)
    if json_report:
        write_json(report, json_report, {"fingerprint_changes": changes})
    raise typer.Exit(int(report.exit_code))


@handled
def create(suite_file: Optional[Path] = SuiteArg, db: Optional[str] = DbOpt, concurrency: Optional[str] = ConcurrencyOpt,
           shuffles: Optional[int] = ShufflesOpt, repeats: Optional[int] = RepeatsOpt,
           allow_variance: bool = typer.Option(False, "--allow-variance", help="Promote even if passes disagree"),
           json_report: Optional[Path] = JsonOpt):
    """Run the suite at every concurrency/order/repeat and store it as the baseline for this hardware."""
    _run("baseline", suite_file, db, concurrency, shuffles, repeats, json_report, allow_variance=allow_variance)


@handled
def check(suite_file: Optional[Path] = SuiteArg, db: Optional[str] = DbOpt, concurrency: Optional[str] = ConcurrencyOpt,
          shuffles: Optional[int] = ShufflesOpt, repeats: Optional[int] = RepeatsOpt,
          strict: bool = typer.Option(False, "--strict", help="Explained changes, new and missing requests fail too"),
          json_report: Optional[Path] = JsonOpt):
    """Run the suite again; exit 1 on batch variance or a silent regression against the baseline."""
    _run("check", suite_file, db, concurrency, shuffles, repeats, json_report, strict=strict)
