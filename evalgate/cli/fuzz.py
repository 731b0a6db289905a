"""`evalgate fuzz` and `evalgate trace`: traffic as evidence (evalgate/bisect/fuzz.py, docs/traffic.md).
Exit codes of fuzz, as `check`'s: 0 nothing found within the budget, 1 found (reproduced or not: the report
says), 2 bad input, 3 engine/infrastructure. (The bisectors' differ: 0 = the culprit found, docs/bisect.md.)"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .common import JsonOpt, console, finish, handled, print_trial, writable_output


@handled
def fuzz(suite: Optional[Path] = typer.Argument(None, help="Suite TOML file (engine.kind = \"vllm\")"),
         budget: str = typer.Option("10m", "--budget", help="Stop searching after this long: 90s, 10m, 1h"),
         max_trials: int = typer.Option(1000, "--max-trials", help="Stop searching after this many trials"),
         shrink_trials: int = typer.Option(200, "--shrink-trials", help="Shrink with at most this many trials"),
         key: Optional[List[str]] = typer.Option(None, "--key", help="Gate only this request (repeatable)"),
         trace: Optional[Path] = typer.Option(None, "--trace", help="Seed trace (default: \\[load] trace, else synthetic)"),
         events: int = typer.Option(8, "--events", help="Events of the synthetic seed trace"),
         seed: int = typer.Option(0, "--seed", help="Seed of the mutations and the seeded words"),
         repro: Optional[Path] = typer.Option(None, "--repro", help="Write the repro pack here (default: "
                                              ".evalgate/fuzz/<id> beside the suite)"),
         db: Optional[str] = typer.Option(None, "--db", help="Database for the trials (default: the suite's)"),
         fail_on: Optional[str] = typer.Option(None, "--fail-on", help="What counts as a change: bits (any token or "
                                               "logprob bit) or tokens (bits-only drift is passed over); default: "
                                               "the suite's \\[gate] fail_on"),
         json_report: Optional[Path] = JsonOpt):
    """Mutate the traffic around the gated requests until an output changes, then shrink it to a repro.

    Exit codes as check's: 0 nothing found, 1 found (with its repro), 2 bad input, 3 engine."""
    from ..bisect.fuzz import fuzz as run_fuzz
    from ..bisect.fuzz import parse_budget
    from ..configuration.suite_file import find_suite

    result = run_fuzz(find_suite(suite), budget=parse_budget(budget), max_trials=max_trials, keys=key or None,
                      trace_path=trace, events=events, seed=seed, repro_dir=repro, database=db,
                      shrink_trials=shrink_trials, fail_on=fail_on, on_trial=print_trial)
    finish(result, json_report)


@handled
def convert(log: Path = typer.Argument(..., help="A log of your traffic: JSONL or CSV with a timestamp, "
                                       "prompt_tokens and output_tokens per request"),
            output: Path = typer.Option(..., "--output", "-o", help="The trace file to write", callback=writable_output)):
    """Turn a log of your own traffic into a trace: lengths and arrival times only, never text."""
    from ..atomic import atomic_path
    from ..configuration.trace import convert_log

    trace = convert_log(log)
    with atomic_path(output) as tmp:
        tmp.write_text(trace.to_jsonl(), encoding="utf-8")
    events = trace.summary()["events"]
    console.print(f"wrote {output}: {events} event{'s' if events != 1 else ''} over {trace.events[-1].offset:g} s",
                  markup=False)


@handled
def check(path: Path = typer.Argument(..., help="A trace file")):
    """Check a trace file: every mistake named by line and field (exit 2)."""
    from ..configuration.trace import load_trace

    trace = load_trace(path)
    summary = trace.summary()
    console.print(f"{path}: {summary['events']} events, {summary['cancels']} cancels, "
                  f"{summary['gated_markers']} gated markers, offsets in {'seconds' if trace.unit == 'at' else 'steps'}",
                  markup=False)
