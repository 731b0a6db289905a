"""`evalgate report RUN --html PATH`: a stored run as one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import ConfigError
from .common import console, err_console, handled, open_store_for


def _suite_name(db: str | None, suite: Path | None) -> str | None:
    """The suite whose newest run `--latest` means: --suite's, else the working directory's (find_suite) when
    no --db is given."""
    from ..configuration.suite import read_suite_header
    from ..configuration.suite_file import find_suite

    found = find_suite(suite, required=False) if suite is not None or not db else None
    return read_suite_header(found).name if found is not None else None


@handled
def report(run_id: Optional[int] = typer.Argument(None, help="The run to report (see `evalgate runs list`)"),
           html: Path = typer.Option(..., "--html", help="Write the report to this HTML file"),
           latest: bool = typer.Option(False, "--latest", help="Report the newest run of the suite instead of RUN"),
           db: Optional[str] = typer.Option(None, "--db", help="Database URL or SQLite path"),
           suite: Optional[Path] = typer.Option(None, "--suite", help="Take the database (and, with --latest, the "
                                                                    "suite name) from this suite file"),
           page: int = typer.Option(1, "--page", help="Which page of the differing requests' token diffs "
                                    "(500 a page; the page says how many there are)")):
    """Write a stored run as one self-contained HTML file: verdicts, fingerprint changes, token diffs."""
    from ..atomic import write_text_atomic
    from ..judgement.judging import stored_report
    from ..reports.html import build_html

    store, run_id = chosen_run(run_id, latest, db, suite, "report")
    write_text_atomic(html, build_html(store, run_id, stored_report(store, run_id), page))
    console.print(f"wrote the report of run {run_id} to {html}")


def chosen_run(run_id: int | None, latest: bool, db: str | None, suite: Path | None, command: str):
    """The store and the run a command reports: RUN, or with --latest the suite's newest check or baseline."""
    if latest == (run_id is not None):
        raise ConfigError("give either a run id or --latest", fix=f"evalgate {command} 7 ..., or "
                                                                 f"evalgate {command} --latest --suite suite.toml ...")
    store = open_store_for(db, suite)
    if latest:
        name = _suite_name(db, suite)
        runs = store.runs(name, limit=1, kinds=("baseline", "check"))  # not `evalgate cost` measurement runs
        if not runs:
            raise ConfigError(f"no runs{f' of suite {name!r}' if name else ''} in {store.url}",
                              fix="run `evalgate check` or `evalgate baseline create` first")
        run_id = runs[0].id
    return store, run_id


@handled
def pr_comment(run_id: Optional[int] = typer.Argument(None, help="The run to comment on (see `evalgate runs list`)"),
               latest: bool = typer.Option(False, "--latest", help="The newest run of the suite instead of RUN"),
               db: Optional[str] = typer.Option(None, "--db", help="Database URL or SQLite path"),
               suite: Optional[Path] = typer.Option(None, "--suite", help="Take the database (and, with --latest, the "
                                                                        "suite name) from this suite file"),
               body_file: Optional[Path] = typer.Option(None, "--body-file", help="Also write the comment's Markdown here"),
               artifact: Optional[str] = typer.Option(None, "--artifact", help="The name of the uploaded HTML report "
                                                      "artifact, linked from the comment"),
               dry_run: bool = typer.Option(False, "--dry-run", help="Write the body; post nothing")):
    """Post or update the pull request's one evalgate comment (found by a hidden marker) on GitHub Actions.
    A token that cannot write (a fork PR) is noted in the job summary instead; exit 0 either way."""
    import os

    from ..atomic import write_text_atomic
    from ..judgement.judging import stored_report
    from ..reports import github
    from ..reports.pr_comment import CannotComment, comment_body, environment_token, fallback_note, post_or_update, pull_request, run_url

    store, run_id = chosen_run(run_id, latest, db, suite, "pr-comment")
    found = stored_report(store, run_id)
    if found is None:
        raise ConfigError(f"run {run_id} was never judged: no verdict to comment", fix="comment on a check or baseline run")
    body = comment_body(found, run_link=run_url(os.environ), artifact=artifact)
    if body_file:
        write_text_atomic(body_file, body)
        console.print(f"wrote the comment of run {run_id} to {body_file}")
    pr = pull_request(os.environ)
    if dry_run or pr is None:
        console.print("not posted: " + ("--dry-run" if dry_run else "this is not a pull request's workflow run"))
        return
    token = environment_token()
    try:
        if not token:
            raise CannotComment("no GITHUB_TOKEN in the environment")
        posted = post_or_update(pr, token, body)
    except CannotComment as exc:
        err_console.print(f"[yellow]warning:[/] no PR comment: {exc}; noted in the job summary instead")
        github.append_summary(fallback_note(str(exc)))  # nothing off GitHub Actions (no $GITHUB_STEP_SUMMARY)
        return
    console.print(f"{posted.action} the PR comment {posted.url or posted.comment_id}")
