"""Passes: how a run exercises batching. Runtime knobs only, never identity.

For each repeat, one pass per concurrency level in the given order; then `shuffles` passes at the highest
concurrency with a seeded random order, so every request also meets other neighbours. A pass is split
into waves of `concurrency` requests that are submitted to the engine together, which is what really
changes batch composition.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .load import Load


@dataclass(frozen=True)
class Schedule:
    """Runtime knobs: never part of identity (that exclusion is what makes a silent regression provable)."""

    concurrency: tuple[int, ...] = (1, 8)
    shuffles: int = 1
    repeats: int = 1
    seed: int = 0
    load: Load | None = None  # [load]: filler traffic for server engines (evalgate/load.py)


@dataclass(frozen=True)
class Pass:
    index: int
    concurrency: int
    repeat: int
    order_seed: int | None  # None: the prompts file's order

    @property
    def label(self) -> str:
        order = "given order" if self.order_seed is None else f"shuffled (seed {self.order_seed})"
        return f"pass {self.index}: concurrency {self.concurrency}, {order}, repeat {self.repeat}"


def plan_passes(schedule: Schedule) -> list[Pass]:
    passes: list[Pass] = []
    for repeat in range(schedule.repeats):
        for concurrency in schedule.concurrency:
            passes.append(Pass(len(passes), concurrency, repeat, None))
    for i in range(schedule.shuffles):
        passes.append(Pass(len(passes), max(schedule.concurrency), 0, schedule.seed + i))
    return passes


def waves(keys: list[str], pass_: Pass) -> list[list[str]]:
    """The request keys of a pass, ordered and split into waves of `concurrency`."""
    order = list(keys)
    if pass_.order_seed is not None:
        random.Random(pass_.order_seed).shuffle(order)
    size = pass_.concurrency
    return [order[i : i + size] for i in range(0, len(order), size)]


def with_overrides(schedule: Schedule, concurrency=None, shuffles=None, repeats=None) -> Schedule:
    return Schedule(
        concurrency=tuple(concurrency) if concurrency else schedule.concurrency,
        shuffles=schedule.shuffles if shuffles is None else shuffles,
        repeats=schedule.repeats if repeats is None else repeats,
        seed=schedule.seed,
        load=schedule.load,
    )
