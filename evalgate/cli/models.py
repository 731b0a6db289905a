"""`evalgate build-model`: a tiny random Llama for trying evalgate without a model hub."""

from __future__ import annotations

from pathlib import Path

import typer

from ..tinymodel import PRESETS, build_model
from .common import console, handled


@handled
def build(directory: Path = typer.Argument(..., help="Where to write the model (replaced if it exists)"),
          preset: str = typer.Option("tiny", help=f"One of: {', '.join(PRESETS)}"),
          seed: int = typer.Option(0, help="Weight seed: another seed gives other weights")):
    """Build a small random Llama model locally (byte-identical for the same preset and seed)."""
    if preset not in PRESETS:
        raise typer.BadParameter(f"choose one of {', '.join(PRESETS)}", param_hint="--preset")
    build_model(directory, preset, seed)
    console.print(f"built {preset} model (seed {seed}) in {directory}")
