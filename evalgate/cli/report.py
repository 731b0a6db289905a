"""`evalgate report RUN --html PATH`: a stored run as one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import ConfigError
from .common import console, handled, open_store_for


def _suite_name(db: str | None, suite: Path | None) -> str | None:
    """The suite whose newest run `--latest` means: --suite's, else ./evalgate.toml's when no --db is given."""
    from ..configuration.suite import load_suite

    if suite is not None:
        return load_suite(suite).name
    if not db and Path("evalgate.toml").is_file():
        return load_suite(Path("evalgate.toml")).name
    return None


@handled
def report(run_id: Optional[int] = typer.Argument(None, help="The run to report (see `evalgate runs list`)"),
           html: Path = typer.Option(..., "--html", help="Write the report to this HTML file"),
           latest: bool = typer.Option(False, "--latest", help="Report the newest run of the suite instead of RUN"),
           db: Optional[str] = typer.Option(None, "--db", help="Database URL or SQLite path"),
           suite: Optional[Path] = typer.Option(None, "--suite", help="Take the database (and, with --latest, the "
                                                                    "suite name) from this suite file")):
    """Write a stored run as one self-contained HTML file: verdicts, fingerprint changes, token diffs."""
    from ..gate import stored_report
    from ..reports.atomic import write_text_atomic
    from ..reports.html import build_html

    if latest == (run_id is not None):
        raise ConfigError("give either a run id or --latest", fix="evalgate report 7 --html out/report.html, or "
                                                                 "evalgate report --latest --suite suite.toml --html ...")
    store = open_store_for(db, suite)
    if latest:
        name = _suite_name(db, suite)
        runs = store.runs(name, limit=1, kinds=("baseline", "check"))  # not `evalgate cost` measurement runs
        if not runs:
            raise ConfigError(f"no runs{f' of suite {name!r}' if name else ''} in {store.url}",
                              fix="run `evalgate check` or `evalgate baseline create` first")
        run_id = runs[0].id
    write_text_atomic(html, build_html(store, run_id, stored_report(store, run_id)))
    console.print(f"wrote the report of run {run_id} to {html}")
