"""Probes: targeted passes for the places where batch invariance is known to break (vLLM's own
determinism tests, tests/v1/determinism/). `[schedule] probes = [...]`; `probes = "vllm"` is vLLM's
scenarios. One probe is one class in one module of this package (base.py says what a probe holds), named
as its module, with `PROBE = TheClass` at its end: a new module is a new built-in probe, found without
importing the others. This module is the registry and plans the probes' passes.

Third parties add probes through the `evalgate.probes` entry-point group, as engine kinds are added:

    [project.entry-points."evalgate.probes"]
    my-probe = "my_package.probes:MyProbe"
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache

from ..configuration.schedule import Pass
from ..registry import PROBE_PRESETS, PROBES
from .base import COMPANION_PREFIX, PlanContext, Probe, Wave, WaveContext

PRESETS = PROBE_PRESETS
BUILTIN_PROBES = PROBES.builtin  # the name tables live on the ground floor (evalgate/registry.py)


def probe_names() -> tuple[str, ...]:
    return PROBES.names()


@cache
def get_probe(name: str) -> Probe | None:
    """The probe registered as `name` (one instance per process); an unknown name is a ConfigError."""
    return PROBES.load(name)()


def plan_probes(names: tuple[str, ...], context: PlanContext) -> tuple[list[Pass], list[dict]]:
    """The probe passes (appended after the schedule's; those with an engine of their own last) and the
    probes that cannot run, with the reason."""
    added: list[Pass] = []
    not_run: list[dict] = []
    probes = [get_probe(name) for name in names]
    for probe in sorted(probes, key=lambda p: p.engine_args(context) is not None):  # stable: own engines last
        args = probe.engine_args(context)
        if args is not None and not context.starts_engines:
            not_run.append({"pass": f"probe {probe.name}", "reason": "needs an engine with other settings: only the "
                            "in-process `vllm` kind starts one (measure the setting with `evalgate cost`)"})
            continue
        mine: list[Pass] = []

        def add(concurrency: int, reference: int = 0, factor: str | None = None, **condition) -> int:
            index = len(context.passes) + len(added) + len(mine)
            mine.append(Pass(index, concurrency, 0, None, reference=reference, factor=factor or probe.factor,
                             probe=probe.name, salt_of=index, **condition))
            return index

        reason = probe.plan(context, add)
        if reason is not None:
            not_run.append({"pass": f"probe {probe.name}", "reason": reason})
            continue
        if args is not None:
            mine = [replace(p, engine_args=json.dumps(args, sort_keys=True)) for p in mine]
        added += mine
    return added, not_run


__all__ = ["BUILTIN_PROBES", "COMPANION_PREFIX", "PRESETS", "PROBES", "PlanContext", "Probe", "Wave", "WaveContext",
           "get_probe", "plan_probes", "probe_names"]
