"""Shared CLI plumbing: the console, error-to-exit-code mapping, and store/suite option handling."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import ConfigError, EvalgateError, ExitCode, out_of_memory


def _console(stderr: bool = False) -> Console:
    """Off a terminal (CI logs, pipes) rich would wrap every line at 80 columns, breaking words and table
    cells: there lines are never wrapped and tables get the width they need (COLUMNS still wins)."""
    found = Console(stderr=stderr, highlight=False)
    if found.is_terminal or os.environ.get("COLUMNS"):
        return found
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=OFF_TERMINAL_WIDTH)


OFF_TERMINAL_WIDTH = 200
console = _console()
err_console = _console(stderr=True)


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt()


# typer's own way out of a command (exit, abort, a usage error such as BadParameter raised in a command body):
# never caught as unexpected. Its usage errors derive from click's ClickException, which typer >= 0.29 vendors
# (click is then no dependency of evalgate's): found through BadParameter, whichever typer is installed.
TYPER_EXITS = (typer.Exit, typer.Abort, next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"))


def handled(fn):
    """Render evalgate errors as one clear message and exit with the contract code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        try:
            return fn(*args, **kwargs)
        except (EvalgateError, MemoryError) as caught:
            exc = out_of_memory() if isinstance(caught, MemoryError) else caught
            err_console.print(f"[bold red]error:[/] {escape(exc.message)}")
            if exc.fix:
                err_console.print(f"  [bold]fix:[/] {escape(exc.fix)}")
            show_engine_log(exc)
            raise typer.Exit(int(exc.exit_code))
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]: the run is stored as incomplete and cannot become a baseline")
            raise typer.Exit(int(ExitCode.INFRA))
        except TYPER_EXITS:
            raise
        except Exception as exc:  # never report an unexpected failure as a pass or a regression
            err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
            if os.environ.get("EVALGATE_DEBUG"):
                raise
            err_console.print("  (set EVALGATE_DEBUG=1 for the traceback)")
            raise typer.Exit(int(ExitCode.INFRA))
        finally:
            signal.signal(signal.SIGTERM, previous)  # a library caller's (or a test runner's) own handler

    return wrapper


def print_table(columns: list[str], rows: list[list[str]]) -> None:
    """A table: rich's on a terminal; off one (CI logs, pipes) plain columns two spaces apart, each as wide
    as its widest cell, never wrapped or cut."""
    if console.is_terminal:
        from rich.table import Table

        table = Table()
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
        return
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows)]
    for line in (columns, *rows):
        sys.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() + "\n")


def print_json(value) -> None:
    """JSON for scripts: plain, on stdout, one document."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def database_url_for(db: str | None, suite_path: Path | None) -> str:
    """The URL of the store named by --db, else by the suite file, else the default under ./baselines."""
    from ..configuration.config import DEFAULT_DATABASE, resolve_database_url

    if db:
        return resolve_database_url(db, Path.cwd())
    from ..configuration.suite_file import find_suite

    found = find_suite(suite_path, required=False)
    if found is not None:  # the [suite] table alone: reading runs needs no model, lock or Hub
        from ..configuration.suite import read_suite_header

        return read_suite_header(found).database
    return resolve_database_url(DEFAULT_DATABASE, Path.cwd())


def show_notes(suite) -> None:
    """What the suite file still says the old way, and where it moved (it is read as before)."""
    for note in suite.notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}")


def show_engine_log(exc: BaseException) -> None:
    """After an engine failure: where the engine's own output is, and its last lines."""
    from ..execution.worker import log_tail

    path = getattr(exc, "engine_log", None)
    tail = log_tail(path)
    if tail:
        err_console.print(f"  [bold]engine log[/] {escape(str(path))}, last lines:")
        err_console.print(escape(tail), style="dim", soft_wrap=True)


def open_store_for(db: str | None, suite_path: Path | None):
    """The existing store named by --db, else by the suite file, else the default under ./baselines."""
    from ..store import open_store

    return open_store(database_url_for(db, suite_path), create=False)


VerboseOpt = typer.Option(False, "--verbose", "-v", help="Show the engine's own output (vLLM, torch) live instead of "
                                                          "writing it to the run's engine log")


def parse_levels(value: str | None) -> list[int] | None:
    from ..configuration.schedule import concurrency_levels

    try:
        return concurrency_levels(value)
    except ConfigError:
        raise typer.BadParameter("expected comma-separated positive integers, e.g. 1,8,32", param_hint="--concurrency") from None


def progress_bar():
    """A run's progress on stderr; returns (context manager, callback). On a terminal: a bar for the pass now
    running and one for the whole run, each with its requests done and time remaining. Elsewhere (a CI log):
    plain lines, when a pass starts, at most every LOG_EVERY seconds while it runs, and when it ends."""
    if not sys.stderr.isatty():
        return contextlib.nullcontext(), ProgressLines(err_console.print)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=err_console, transient=True)
    whole = progress.add_task("run", total=None)
    current = progress.add_task("starting", total=None)

    def update(done: int, total: int, label: str, pass_done: int = 0, pass_total: int = 0) -> None:
        if progress.tasks[current].description != label:
            progress.reset(current, total=pass_total or None, description=label)
        progress.update(current, completed=pass_done, total=pass_total or None)
        progress.update(whole, completed=done, total=total or None, description="run")

    return progress, update


LOG_EVERY = 30.0  # seconds between two progress lines of a pass in a CI log


class ProgressLines:
    """A run's progress as plain lines (a CI log): `pass 2 (concurrency 8): 1,000/5,000 requests, 41.7/s, 96 s
    left; run 6,000/20,000`."""

    def __init__(self, print_line, clock=time.monotonic):
        self.print_line, self.clock = print_line, clock
        self.label: str | None = None
        self.started = self.last = 0.0

    def __call__(self, done: int, total: int, label: str, pass_done: int = 0, pass_total: int = 0) -> None:
        now = self.clock()
        if not pass_total:  # a step with no requests of its own (an engine starting): its name, once
            if label != self.label:
                self.label = label
                self.print_line(f"{label} ...", markup=False, highlight=False, soft_wrap=True)
            return
        if label != self.label:
            self.label, self.started, self.last = label, now, now
        elif pass_done < pass_total and now - self.last < LOG_EVERY:
            return
        self.last = now
        elapsed = now - self.started
        rate = pass_done / elapsed if elapsed > 0 and pass_done else None
        left = f", {(pass_total - pass_done) / rate:.0f} s left" if rate and pass_done < pass_total else ""
        speed = f", {rate:.1f}/s" if rate else ""
        self.print_line(f"{label}: {pass_done:,}/{pass_total:,} requests{speed}{left}; run {done:,}/{total:,}",
                        markup=False, highlight=False, soft_wrap=True)


def writable_output(ctx: typer.Context, param: typer.CallbackParam, path: Path | None) -> Path | None:
    """An option's output file, written when the command ends, checked before it starts: a run of minutes must
    not end in a path it cannot write (exit 2 now, instead of exit 3 after the run)."""
    import tempfile

    if path is None or ctx.resilient_parsing:
        return path
    if str(path) == "-":  # not standard output: that carries the report for people
        raise typer.BadParameter("`-`: name a file (standard output carries the report for people), e.g. out/report.json")
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "it is a directory")
        above = next((p for p in path.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise NotADirectoryError(20, f"{above} is a file, not a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"):
            pass
    except OSError as exc:
        raise typer.BadParameter(f"{path}: cannot write there ({exc.strerror or exc})") from None
    return path


JsonOpt = typer.Option(None, "--json-report", help="Also write the result as JSON", callback=writable_output)


def print_trial(step: int, estimate: int, label: str, outcome, seconds: float) -> None:
    """One line per trial on stderr: readable live in a terminal and afterwards in a CI log."""
    from rich.markup import escape

    err_console.print(f"[dim]\\[trial {step}/~{estimate}][/] {escape(label)} -> [bold]{outcome.outcome}[/] ({seconds:.1f} s)")


def finish(result, json_report: Path | None) -> None:
    """Print a bisector's (or fuzz's) result, write its JSON report, exit with its code."""
    for line in result.lines():
        console.print(line, markup=False, soft_wrap=True)
    if json_report:
        from ..atomic import atomic_path

        with atomic_path(json_report) as tmp:
            tmp.write_text(json.dumps(result.to_dict(), indent=2, default=str), encoding="utf-8")
    raise typer.Exit(result.exit_code)
