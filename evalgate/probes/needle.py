"""`needle` (factor neighbours): each request alone among `batch` long fillers, at a seeded random position
(vLLM's needle test: long prefills join the request's decode batch).

Settings (`[probes.needle]`): `batch` (default 64) fillers per wave, of `filler_tokens` tokens each (0, the
default: half the engine's max_model_len, at most 2048), always leaving room for the fillers' own generated
tokens. Fillers are companions: never stored or judged.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Iterator

from ..configuration.prompts import Prompt
from ..configuration.remedy import ONE_SEQUENCE
from .base import COMPANION_PREFIX, AddPass, PlanContext, Probe, Wave, WaveContext

MAX_FILLER_TOKENS = 2048
FILLER_TEXT = ("The committee reviewed every chapter of the annual report, compared the figures with last year's "
               "accounts, and wrote a long summary of what had changed and why. ")


class Needle(Probe):
    name = "needle"
    factor = "neighbours"
    words = "neighbours"
    remedy = ONE_SEQUENCE
    batch_factor = True
    settings = {"batch": (int, 64, 1), "filler_tokens": (int, 0, 0)}

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        add(self.option(context.schedule, "batch") + 1)
        return None

    def waves(self, pass_, keys: list[str], context: WaveContext) -> Iterator[Wave]:
        fillers = needle_fillers(context, self.option(context.schedule, "batch"),
                                 self.option(context.schedule, "filler_tokens"))
        rng = random.Random(context.schedule.seed)
        for n, key in enumerate(keys):
            wave = [replace(f, key=f"{f.key}-{n}") for f in fillers]  # own cache salts: the fillers run cold
            at = rng.randrange(len(wave) + 1)
            wave.insert(at, context.prompts[key])
            yield Wave(wave, [i == at for i in range(len(wave))])

    def label(self, reference, other) -> str:
        return f"neighbours: alone→among {other.concurrency - 1} long fillers (needle)"


def filler_tokens(setting: int, max_model_len: int, longest_request: int) -> int:
    """Filler length: as set, else half the context (at most 2048), always leaving room for the fillers'
    own generated tokens."""
    wanted = setting or min(MAX_FILLER_TOKENS, max_model_len // 2)
    return max(1, min(wanted, max_model_len - longest_request - 1))


def needle_unit(engine) -> list[int]:
    """The filler text's token ids: long fillers repeat them (the eviction probe's too)."""
    return engine.encode(FILLER_TEXT) or [1]


def needle_fillers(context: WaveContext, count: int, setting: int) -> list[Prompt]:
    """`count` long filler requests of token ids (deterministic), of `setting` tokens (0: automatic)."""
    engine = context.engine
    longest = max((len(ids) for ids in context.prompt_ids.values()), default=0)
    length = filler_tokens(setting, engine.max_model_len, longest)
    unit = needle_unit(engine)
    fillers = []
    for i in range(count):
        ids = (unit * (length // len(unit) + 2))[i % len(unit):][:length]
        fillers.append(Prompt(f"{COMPANION_PREFIX}filler-{i}", "", max_tokens=8, line=0, prompt_ids=tuple(ids)))
    return fillers


PROBE = Needle  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
