"""`evalgate build-model`: a tiny random Llama for trying evalgate without a model hub."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..tinymodel import PRESETS, TRAIN_STEPS, build_model
from .common import console, handled


@handled
def build(directory: Path = typer.Argument(..., help="Where to write the model (replaced if it exists)"),
          preset: str = typer.Option("tiny", help=f"One of: {', '.join(PRESETS)}"),
          seed: int = typer.Option(0, help="Weight seed: another seed gives other weights"),
          steps: Optional[int] = typer.Option(None, min=1, help="Training steps of a trained preset (arith: default "
                                                                 f"{TRAIN_STEPS['arith']}; fewer gives a weaker checkpoint)")):
    """Build a small Llama model locally (byte-identical for the same preset, seed and steps)."""
    if preset not in PRESETS:
        raise typer.BadParameter(f"choose one of {', '.join(PRESETS)}", param_hint="--preset")
    build_model(directory, preset, seed, steps)
    trained = f", {steps or TRAIN_STEPS[preset]} training steps" if preset in TRAIN_STEPS else ""
    console.print(f"built {preset} model (seed {seed}{trained}) in {directory}")
