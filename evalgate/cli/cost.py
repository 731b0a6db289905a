"""`evalgate cost`: parse the arguments, draw progress, render the table; the work is in evalgate/cost.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from .common import console, err_console, handled, parse_levels, show_notes, writable_output


def _seconds(value: float | None) -> str:
    if value is None:
        return "?"
    value = int(round(value))
    return f"{value // 60}m {value % 60:02d}s" if value >= 60 else f"{value}s"


def _size(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if x is None else fmt.format(x)


class _Progress:
    """The command's `cost.Listener`: a rich bar on a terminal; one line per candidate (with the time left)
    otherwise."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        self.tty = sys.stderr.isatty()
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TextColumn("about {task.fields[eta]} left"), console=err_console, transient=True,
                            disable=not self.tty)
        self.task = self.bar.add_task("starting", total=1.0, eta="?")

    def candidate_started(self, index, count, candidate, eta):
        self.bar.update(self.task, completed=index / count, description=f"[{index + 1}/{count}] {candidate.name}: "
                        "starting the engine", eta=_seconds(eta))
        if not self.tty:
            left = f", about {_seconds(eta)} left" if eta is not None else ""
            err_console.print(f"cost: candidate {index + 1}/{count} `{candidate.name}`{left}")

    def candidate_progress(self, index, count, candidate, done, total, label, eta):
        self.bar.update(self.task, completed=(index + done / max(total, 1)) / count,
                        description=f"[{index + 1}/{count}] {candidate.name}: {label}", eta=_seconds(eta))

    def candidate_finished(self, index, count, result):
        self.bar.update(self.task, completed=(index + 1) / count)
        if not self.tty:
            err_console.print(f"cost: candidate `{result.candidate.name}`: {result.status}"
                              + (f" ({result.reason})" if result.reason else ""))


def _status(r) -> str:
    if r.status == "unavailable":
        return "unavailable on this platform" if (r.reason or "").startswith("unavailable on this platform") \
            else "unavailable"
    return "FAILED" if r.status == "failed" else r.status


def render(report) -> None:
    """The `cost.CostReport` as a table, then the fastest and the fastest invariant candidate."""
    from .. import cost as cost_lib
    from ..judgement.factors import words

    top = report.highest_concurrency
    levels = sorted(set(report.schedule.concurrency))
    from rich.table import Table
    table = Table(title=f"evalgate cost: suite {report.suite_name!r} ({report.platform or 'platform unknown'}), "
                        f"output tokens/s by concurrency", title_justify="left")
    table.add_column("candidate")
    table.add_column("status")
    table.add_column("invariant")
    for c in levels:
        table.add_column(f"tok/s @{c}", justify="right")
    table.add_column(f"latency p50/p90/p99 @{top} (s)", justify="right")
    table.add_column("peak RSS", justify="right")
    table.add_column("engine load", justify="right")
    table.add_column("run", justify="right")
    for r in report.results:
        if r.status == "measured":
            by_factor = ", ".join(f"{words(f)} {n}" for f, n in r.varying.items())
            invariant = ("yes" if r.invariant else f"no: {r.differing_requests}/{r.requests} differ"
                         + (f" ({by_factor})" if by_factor else ""))
        elif r.status == "unavailable":
            invariant = "no (unavailable)"
        else:
            invariant = "n/a"
        lat = next((lv["latency_seconds"] for lv in r.levels if lv["concurrency"] == top), None)
        table.add_row(
            r.candidate.name,
            _status(r),
            invariant,
            *[_num(r.tokens_per_second(c)) for c in levels],
            "/".join(_num(lat[f"p{q}"], "{:.2f}") for q in cost_lib.PERCENTILES) if lat else "n/a",
            _size(r.peak_rss_bytes),
            _num(r.engine_load_seconds, "{:.1f}s"),
            str(r.run_id) if r.run_id is not None else "",
        )
    console.print(table)
    for r in report.results:
        if r.reason:
            console.print(f"  {r.candidate.name}: {r.reason}")
    fast, inv, ratio = report.fastest, report.fastest_invariant, report.cost_ratio
    if fast:
        console.print(f"fastest: [bold]{fast.candidate.name}[/] ({fast.tokens_per_second(top):.1f} output tokens/s "
                      f"at concurrency {top})")
    if inv and ratio is not None:
        slower = f", {1 / ratio:.2f}x slower" if ratio < 1 else ": determinism is free here"
        console.print(f"fastest invariant: [bold]{inv.candidate.name}[/] ({inv.tokens_per_second(top):.1f} output "
                      f"tokens/s): cost ratio {ratio:.3f} of the fastest{slower}")
    elif report.measured:
        console.print("[bold red]no invariant candidate[/] on this suite: every measured configuration's passes differ")
    console.print(f"stored as session {report.session} in {report.database}")


@handled
def cost(suite_file: Optional[Path] = typer.Argument(None, help="Suite TOML file (default: ./evalgate.toml or "
                                                                   "\\[tool.evalgate] in ./pyproject.toml)"),
         db: Optional[str] = typer.Option(None, "--db", help="Database URL or SQLite path (overrides the suite's)"),
         json_report: Optional[Path] = typer.Option(None, "--json-report", help="Write the results as JSON "
                                                    "(schema evalgate.cost/1, docs/cost.md) and the plot beside it",
                                                    callback=writable_output),
         plot: Optional[Path] = typer.Option(None, "--plot", help="Write the throughput plot (PNG) here (default with "
                                             "--json-report: the report's name with .png)", callback=writable_output),
         candidate: Optional[List[str]] = typer.Option(None, "--candidate", help="Another candidate, repeatable: "
                                                       "NAME:KEY=VALUE,... (engine args, batch_invariant=true|false, "
                                                       "env.NAME=VALUE)"),
         candidates_file: Optional[Path] = typer.Option(None, "--candidates", help="A TOML file with \\[\\[cost.candidates]] tables"),
         no_defaults: bool = typer.Option(False, "--no-defaults", help="Skip the built-in candidates (batch-invariant, "
                                          "batched, max-num-seqs-1, no-prefix-cache)"),
         concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Override the concurrency levels, e.g. 1,16"),
         shuffles: Optional[int] = typer.Option(None, "--shuffles", help="Override the number of shuffled passes"),
         repeats: Optional[int] = typer.Option(None, "--repeats", help="Override the number of repeats")):
    """Measure the price of determinism: throughput, latency, memory and invariance per engine configuration."""
    from .. import cost as cost_lib
    from ..configuration.schedule import with_overrides
    from ..configuration.suite import load_suite
    from ..configuration.suite_file import find_suite

    suite = load_suite(find_suite(suite_file), database=db)
    show_notes(suite)
    schedule = with_overrides(suite.schedule, parse_levels(concurrency), shuffles, repeats)
    candidates = cost_lib.resolve_candidates(suite, candidate or [], candidates_file, defaults=not no_defaults)
    plot_path = plot or (json_report.with_suffix(".png") if json_report else None)
    if plot_path is not None:
        cost_lib.require_matplotlib()  # before any engine starts
    listener = _Progress()
    with listener.bar:
        report = cost_lib.run_cost(suite, candidates, schedule=schedule, listener=listener)
    if plot_path is not None and report.measured:
        cost_lib.write_plot(report, plot_path)
        report.plot = str(plot_path)
    render(report)
    if json_report:
        cost_lib.write_json(report, json_report)
        console.print(f"wrote {json_report}" + (f" and {plot_path}" if report.plot else ""))
    elif report.plot:
        console.print(f"wrote {plot_path}")
    error = cost_lib.failed_command_error(report)
    if error is not None:
        raise error
    raise typer.Exit(int(report.exit_code))
