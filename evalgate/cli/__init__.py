"""The `evalgate` command. This layer only parses arguments and renders results; the work is in the
library modules (gate, store, verdict, ...), one command group per module here."""

from __future__ import annotations

import typer

from . import bisect, cost, demo, fetch, fuzz, gate, history, init, models, report, survey

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits them
                  help="Gate LLM serving determinism: batch variance and silent regressions, token by token.")
baseline_app = typer.Typer(no_args_is_help=True, help="Create, accept, adopt and list baselines.")
runs_app = typer.Typer(no_args_is_help=True, help="Look at stored runs.")
bisect_app = typer.Typer(no_args_is_help=True, help="Find what changed an output: a commit, a setting, a neighbour.")
trace_app = typer.Typer(no_args_is_help=True, help="Traffic traces: convert a log of your traffic, check a trace.")



def _print_version(value: bool) -> None:
    if value:
        from .. import __version__
        from ..scaffold import installed_commit

        commit = installed_commit()
        typer.echo(f"evalgate {__version__}" + (f" (commit {commit[:12]})" if commit else ""))
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print evalgate's version (and the commit it was installed from), then exit")):
    pass


app.add_typer(baseline_app, name="baseline")
app.add_typer(runs_app, name="runs")
app.add_typer(bisect_app, name="bisect")
app.add_typer(trace_app, name="trace")
baseline_app.command("create")(gate.create)
baseline_app.command("accept")(history.baseline_accept)
baseline_app.command("adopt")(history.baseline_adopt)
baseline_app.command("list")(history.baseline_list)
app.command("init")(init.init)
app.command("fetch")(fetch.fetch)
app.command("check")(gate.check)
app.command("survey")(survey.survey)
runs_app.command("list")(history.runs_list)
runs_app.command("show")(history.runs_show)
runs_app.command("history")(history.runs_history)
app.command("diff")(history.diff)
app.command("report")(report.report)
app.command("pr-comment")(report.pr_comment)
app.command("demo")(demo.demo)
app.command("build-model")(models.build)
app.command("build-adapter")(models.adapter)
app.command("cost")(cost.cost)
bisect_app.command("commits")(bisect.commits)
bisect_app.command("config")(bisect.config)
bisect_app.command("batch")(bisect.batch)
bisect_app.command("show")(bisect.show)
bisect_app.command("commit-step", hidden=True)(bisect.commit_step)
app.command("repro")(bisect.repro)
app.command("fuzz")(fuzz.fuzz)
trace_app.command("convert")(fuzz.convert)
trace_app.command("check")(fuzz.check)


def main() -> None:
    app()
