"""`evalgate demo`: the whole journey on a tiny locally built model."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import gate
from ..demo import write_workspace
from ..reports.terminal import render_report
from ..suite import load_suite
from ..tinymodel import build_model
from .common import console, handled, progress_bar

WEAKER_STEPS = 150  # measured: the arithmetic task's exact match falls from about 0.8 to about 0.2


@handled
def demo(directory: Path = typer.Option(Path("evalgate-demo"), "--dir", help="Workspace to create")):
    """Build a tiny model, create a baseline, check it, then swap the weights and check again."""
    import shutil

    console.rule("1. a tiny local model and a suite")
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
    checked = step("3. evalgate check (same everything: expect PASS)", gate.check)
    console.rule("4. new weights at the same path: a checkpoint trained for fewer steps")
    saved = directory / "model.baseline"
    shutil.rmtree(saved, ignore_errors=True)
    shutil.copytree(suite.model, saved)
    build_model(suite.model, "arith", seed=0, steps=WEAKER_STEPS)
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
    console.print(f"try: evalgate check {suite_path}   |   evalgate runs list --suite {suite_path}")
    ok = created.exit_code == 0 and checked.exit_code == 0 and changed.exit_code == 0
    raise typer.Exit(0 if ok else 1)
