"""`evalgate init`: write a suite, example prompts, the CI workflow and baselines/; then survey the machine
and, where its passes disagree, write the setting that removes it (the demo's remedy) so that the first
`evalgate baseline create` passes as written."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import EvalgateError
from .common import console, err_console, handled, progress_bar


def is_interactive() -> bool:
    """Whether init may ask: both ends of the conversation are a terminal."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _ask(value, question: str, default, interactive: bool):
    """A flag's value, else (on a terminal) the answer to `question`, else the default."""
    if value is not None:
        return value
    return typer.prompt(question, default=default) if interactive else default


@handled
def init(directory: Path = typer.Option(Path("."), "--dir", help="Where to write the project's files"),
         model: Optional[str] = typer.Option(None, "--model", help="A local Hugging Face model directory, or a Hub repo "
                                             "id (org/name: fetched, and pinned in evalgate.lock)"),
         revision: str = typer.Option("main", "--revision", help="With a Hub repo id: the branch, tag or commit to pin"),
         url: Optional[str] = typer.Option(None, "--url", help="An OpenAI-compatible vLLM server instead (the openai kind)"),
         served_model: Optional[str] = typer.Option(None, "--served-model", help="With --url: the model name it serves "
                                                    "(default: the one GET /v1/models lists)"),
         tasks: Optional[str] = typer.Option(None, "--tasks", help="lm-eval tasks to run as requests too, comma-separated"),
         prompts: Optional[Path] = typer.Option(None, "--prompts", help="Your prompts file (JSONL, docs/suite.md) "
                                                "instead of the examples"),
         fail_on: Optional[str] = typer.Option(None, "--fail-on", help="The gate level: bits (any difference fails) "
                                               "or tokens (logprob-bit drift is reported, token flips fail)"),
         preset: Optional[str] = typer.Option(None, "--preset", help="The schedule: full (every request alone and "
                                              "crowded) or rotating (a sample alone each run)"),
         database: Optional[str] = typer.Option(None, "--database", help="Where runs and baselines are stored "
                                                "(default: sqlite:///baselines/evalgate.sqlite beside the suite)"),
         survey: bool = typer.Option(True, "--survey/--no-survey", help="Run the suite's comparisons once and write "
                                     "what removes any variance into the suite"),
         yes: bool = typer.Option(False, "--yes", "-y", help="Take the defaults for what no flag gives; ask nothing"),
         engine_extra: str = typer.Option("", "--engine-extra", hidden=True,
                                          help="More \\[engine] lines (tests: the fake engine)")):
    """Start a project: evalgate.toml, example prompts, .github/workflows/evalgate.yml (this version's action)
    and baselines/. Never overwrites a file. Asks what no flag gives on a terminal."""
    from ..configuration.lock import is_hub_id
    from ..configuration.schedule import FULL
    from ..scaffold import DEFAULT_DATABASE, SUITE_FILE, Scaffold, write_scaffold

    interactive = not yes and is_interactive()
    if model is None and url is None and interactive:
        answer = typer.prompt("model directory, Hub repo id (org/name), or an http(s) URL of a vLLM server")
        url, model = (answer, None) if answer.startswith(("http://", "https://")) else (None, answer)
    if tasks is None and interactive:
        tasks = typer.prompt("lm-eval tasks, comma-separated (empty: none)", default="", show_default=False)
    hub = model if model is not None and is_hub_id(model, Path.cwd()) else None
    scaffold = Scaffold(directory=directory, model=None if model is None or hub else Path(model), hub=hub,
                        revision=revision, url=url, served_model=served_model,
                        tasks=tuple(t.strip() for t in (tasks or "").split(",") if t.strip()), prompts=prompts,
                        fail_on=_ask(fail_on, "gate level (bits or tokens)", "bits", interactive),
                        preset=_ask(preset, "schedule preset (full or rotating)", FULL, interactive),
                        database=_ask(database, "database", DEFAULT_DATABASE, interactive), engine_extra=engine_extra)
    for path in write_scaffold(scaffold):
        console.print(f"wrote {path}{'/' if path.is_dir() else ''}")
    suite_path = directory / SUITE_FILE
    if survey:
        try:
            check_machine(suite_path, interactive)
        except EvalgateError:
            err_console.print(f"the files are written; the survey of {suite_path} failed (below). Fix it and run "
                              f"`evalgate survey {suite_path}`.")
            raise
    else:
        console.print(f"not surveyed: `evalgate survey {suite_path}` shows what varies here before a baseline")
    console.print(f"next: evalgate baseline create {suite_path}   then   evalgate check {suite_path}; commit the "
                  "suite, the prompts, .github/ and baselines/ (docs/ci.md)", soft_wrap=True)


def check_machine(suite_path: Path, interactive: bool) -> None:
    """Survey the new suite; where the gate would fail its passes, write the remedy into the suite (asked on a
    terminal) and survey again to verify it."""
    from ..configuration.suite import load_suite
    from ..configuration.suite_file import add_engine_settings
    from ..survey import remedy_args, setting_lines, survey
    from .survey import show_survey

    def surveyed(title: str) -> list[str]:
        """Survey the suite as it is on disk; the factors whose differences the gate fails."""
        console.rule(title)
        suite = load_suite(suite_path)
        progress, update = progress_bar()
        with progress:
            report = survey(suite, progress=update)
        return show_survey(report, suite)

    failing = surveyed("evalgate survey: what varies on this machine")
    if not failing:
        return
    args = remedy_args(failing)
    if not args:
        console.print("[yellow]no engine setting removes this here[/]: `evalgate baseline create` will not promote "
                      "the run; see docs/conditions.md (fail_on = \"tokens\" passes logprob-bit drift)", soft_wrap=True)
        return
    settings = ", ".join(setting_lines(args))
    if interactive and not typer.confirm(f"write {settings} into {suite_path} [engine]?", default=True):
        console.print("not written: `evalgate baseline create` will refuse to promote a run whose passes disagree")
        return
    add_engine_settings(suite_path, args, "chosen by `evalgate init`: the passes disagreed on this machine without it")
    console.print(f"written into {suite_path}: {settings}")
    if surveyed("evalgate survey again, with the setting"):
        console.print("[yellow]the passes still disagree[/]: see docs/conditions.md for what removes it here", soft_wrap=True)
    else:
        console.print("[green]verified: the passes agree[/]; the suite passes `evalgate baseline create` as written")
