"""`evalgate survey`: what varies on this machine, as a table; the run is stored and never a baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .common import VerboseOpt, console, handled, parse_levels, print_table, progress_bar, show_notes
from .gate import SuiteArg


@handled
def survey(suite_file: Optional[Path] = SuiteArg,
           probes: Optional[str] = typer.Option(None, "--probes", help="Run these probes instead of the schedule's: "
                                                "a preset (vllm) or names, comma-separated (docs/conditions.md)"),
           concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Override the schedule's concurrency "
                                                     "levels, e.g. 1,16"),
           shuffles: Optional[int] = typer.Option(None, "--shuffles", help="Override the number of shuffled-order passes"),
           db: Optional[str] = typer.Option(None, "--db", help="Database URL or SQLite path (overrides the suite's database)"),
           verbose: bool = VerboseOpt):
    """Run the suite's comparisons and print what varies on this machine (and what removes it). The run is
    stored as a survey: it never becomes a baseline and no baseline is read. Exit 0 when it ran."""
    from ..configuration.schedule import with_overrides
    from ..configuration.suite import load_suite, parse_probes
    from ..configuration.suite_file import find_suite
    from ..survey import survey as run_survey

    suite = load_suite(find_suite(suite_file), database=db)
    show_notes(suite)
    schedule = with_overrides(suite.schedule, parse_levels(concurrency), shuffles, where=str(suite.path))
    chosen = None
    if probes is not None:
        names = [name.strip() for name in probes.split(",") if name.strip()]
        chosen = parse_probes(names[0] if len(names) == 1 else names, "--probes", "")
    progress, update = progress_bar()
    with progress:
        report = run_survey(suite, schedule=schedule, probes=chosen, progress=update, show_engine_output=verbose)
    show_survey(report, suite)


def show_survey(report, suite) -> list[str]:
    """Print a survey's table and what removes the variance the suite's policy fails; returns those factors."""
    from ..judgement.factors import is_batch_factor, words
    from ..reports.explain import margin_text, template_date_line
    from ..store import open_store
    from ..survey import failing_factors, how_they_differ, machine_table, remedy_args, setting_lines, token_flips, unremedied

    in_force = bool(report.batch_invariance.in_force)
    console.print(f"machine: {report.hardware_label or 'unknown'}; batch-invariant kernels "
                  + ("in force" if in_force else f"not in force ({report.batch_invariance.reason or 'not requested'})"),
                  soft_wrap=True)
    pinned = template_date_line(report)
    if pinned:
        console.print(escape(pinned), soft_wrap=True)
    rows = machine_table(report)
    print_table(["comparison", "factor", "differing"],
                [[r.comparison, words(r.factor), f"{r.differing}/{r.compared}"] for r in rows])
    if not rows:
        console.print("no comparisons: the schedule has one pass (add concurrency levels, shuffles or probes)")
    flips, bits = how_they_differ(report)
    if flips or bits:
        console.print(f"of the {flips + bits} request(s) that differ: {flips} flip a token, {bits} differ in "
                      f"logprob bits only (fail_on = {json.dumps(report.policy.fail_on)})")
    for flip in token_flips(open_store(suite.database), report):
        kind = {"near_tie": "a near-tie token flip", "confident": "a confident token flip"}.get(flip.flip or "", "a token flip")
        console.print(escape(f"{flip.key}: {kind} at output token {flip.position} (margin {margin_text(flip.margin) or 'unknown'})"),
                      soft_wrap=True)
        for concurrency, text in flip.answers:
            console.print(escape(f"  concurrency {concurrency}: {text.strip()!r}"), soft_wrap=True)
    failing = failing_factors(report)
    if not in_force and (flips or bits):
        console.print("why: without batch-invariant kernels the shape of the batch changes the floating-point "
                      "reduction order", soft_wrap=True)
    elif in_force and report.batch_invariance.kernels and any(is_batch_factor(f) for f in failing):
        # evalgate's CPU kernels can leave one batch effect: the crowd filling a step makes vLLM chunk a long prompt,
        # and where the attention check could not cut queries at fixed positions a chunk keeps its bits only so far
        console.print("why, with evalgate's CPU kernels in force: a batch factor that still differs is most often vLLM "
                      "chunking a long prompt when the requests beside it fill a step's max_num_batched_tokens, past "
                      "the length to which the mode's attention check held chunks to their bits (docs/conditions.md); "
                      "enable_chunked_prefill = false (with max_num_batched_tokens at least max_model_len) keeps the "
                      "concurrency: survey again with it", soft_wrap=True, markup=False)
    if not failing:
        console.print("[green]nothing varies here that the gate fails on[/]")
    else:
        if not report.batch_invariance.requested:
            # what removes batch-shape variance without giving up concurrency: offered before any fallback
            console.print("first: batch_invariant = true in [engine] (batch-invariant kernels: vLLM's on CUDA/ROCm/XPU, "
                          "evalgate's on CPU) keeps the concurrency; survey again with it to see what is left",
                          soft_wrap=True, markup=False)
        args = remedy_args(failing)
        if args:
            console.print(escape("removed by, in [engine]: " + ", ".join(setting_lines(args))
                                 + f" ({', '.join(words(f) for f in failing if f not in unremedied(failing))}); "
                                 "`evalgate cost` prices it"), soft_wrap=True)
        if not flips and report.policy.fail_on == "bits":
            console.print('or, keeping the speed: [gate] fail_on = "tokens" (these differ in logprob bits only: it '
                          "reports them as drift and fails token flips)", soft_wrap=True, markup=False)
        for factor in unremedied(failing):
            console.print(escape(f"{words(factor)}: no engine setting removes it here (see docs/conditions.md)"))
    console.print(f"survey run {report.run_id} is stored (`evalgate report {report.run_id} --suite {suite.path} --html out.html`); "
                  "it is never a baseline", style="dim", soft_wrap=True)
    return failing
